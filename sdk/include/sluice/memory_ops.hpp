#pragma once
/// Copies for assembling large outputs (a batch of images is tens of MB: more than any cache).
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace sluice {

/// Copies `bytes` into memory that will not be read again soon by this core (a row of a batch
/// bound for another thread or a device). Large copies use non-temporal stores: they skip
/// reading the cold destination into the cache before overwriting it, which costs a third of
/// the memory traffic of a plain memcpy. Ends with a store fence, so the bytes are visible to
/// whichever thread is handed the result next.
inline void copy_to_cold(void* dst, const void* src, std::size_t bytes) {
#if defined(__x86_64__) || defined(_M_X64)
  constexpr std::size_t kStreamingFrom = 256 * 1024;  ///< below this, the destination fits a cache
  if (bytes < kStreamingFrom) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace sluice
