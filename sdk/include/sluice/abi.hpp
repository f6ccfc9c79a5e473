#pragma once
#include <cstdint>

namespace sluice {

// The plugin ABI: a host loads a plugin whose major equals its own and whose minor is not newer.
// Raise the minor for additions that old plugins need not know about; raise the major (and reset
// the minor) for any change to an existing type, virtual function or descriptor field.
inline constexpr std::uint32_t kAbiMajor = 4;
// 2.0: cursor-based Expand with DamageReport; 3.0: parameter hints, the keeps_shape
// trait, shared sample origins, Source::expected_elements; 4.0: offered allocators, cancel(),
// feed sinks (Sink::feed, Sink::device_counters), placement (map-and-batch); 4.1: ParamType::OutputPath,
// StageInfo::input_fingerprint (appended; older plugins never read it); 4.2: ParamType::PathList, and
// relative Path, OutputPath and PathList values resolved against the pipeline file's folder.
inline constexpr std::uint32_t kAbiMinor = 2;

}  // namespace sluice
