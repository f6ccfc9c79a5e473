#pragma once
// Per-pixel kernels shared by the operators and the benchmarks' ideal loops.
#include <cstddef>
#include <cstdint>

namespace sluice::vision {

// dst = src * mul[c] + add[c] for interleaved u8 pixels of `channels` (1 to 4) channels, in one
// pass (OpenCV's convertTo, subtract and multiply take three over the float image).
void normalize_u8(const std::uint8_t* src, float* dst, std::size_t pixels, int channels, const float* mul, const float* add);

// The same, for a destination that will not be read again soon by this core (a row of a batch):
// non-temporal stores skip reading the cold row into the cache before overwriting it. Ends with
// a store fence.
void normalize_u8_to_cold(const std::uint8_t* src, float* dst, std::size_t pixels, int channels, const float* mul, const float* add);

}  // namespace sluice::vision
