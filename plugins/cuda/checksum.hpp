#pragma once
// The slice checksum of `consume: checksum`, computed the same way on the host and on the
// device: the sum, modulo 2^64, of a 64-bit mix of every 8-byte little-endian word with its
// index. Summing makes it parallel on the device; mixing in the index makes it notice bytes
// that moved, not only bytes that changed. A last partial word is zero-padded.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SLUICE_HOST_DEVICE __host__ __device__
#else
#define SLUICE_HOST_DEVICE
#endif

namespace sluice::cuda {

SLUICE_HOST_DEVICE inline std::uint64_t checksum_mix(std::uint64_t word, std::uint64_t index) {
  std::uint64_t z = word ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The checksum of `valid` bytes of `data` followed by `total - valid` zero bytes (a padded
// slice), exactly as the device computes it over `total` bytes.
inline std::uint64_t host_checksum(const void* data, std::size_t valid, std::size_t total) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::uint64_t sum = 0;
  const std::size_t words = (total + 7) / 8, full = valid / 8;
  for (std::size_t i = 0; i < full; ++i) {
    std::uint64_t w;
    std::memcpy(&w, bytes + i * 8, 8);
    sum += checksum_mix(w, i);
  }
  for (std::size_t i = full; i < words; ++i) {
    unsigned char part[8] = {};
    for (std::size_t b = 0; b < 8 && i * 8 + b < valid; ++b) part[b] = bytes[i * 8 + b];
    std::uint64_t w;
    std::memcpy(&w, part, 8);
    sum += checksum_mix(w, i);
  }
  return sum;
}

}  // namespace sluice::cuda
