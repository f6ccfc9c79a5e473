#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice::io {

// CRC-32C (Castagnoli), with the SSE4.2 instruction where the CPU has it.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

// TFRecord's masked form of a CRC: rotated right by 15 bits plus a constant.
inline std::uint32_t mask_crc(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Whether the SSE4.2 path is in use (for benchmarks and logs).
bool crc32c_uses_sse42();

}  // namespace sluice::io
