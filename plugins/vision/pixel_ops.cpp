#include "pixel_ops.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace sluice::vision {
namespace {
// 24 values hold a whole number of pixels for 1 to 4 channels and of SIMD lanes: the inner loop
// has constant coefficients per position and vectorises.
constexpr std::size_t kPeriod = 24;

void expand_coefficients(int channels, const float* mul, const float* add, float* m, float* a) {
  for (std::size_t k = 0; k < kPeriod; ++k) {
    m[k] = mul[k % static_cast<std::size_t>(channels)];
    a[k] = add[k % static_cast<std::size_t>(channels)];
  }
}
}  // namespace

void normalize_u8(const std::uint8_t* __restrict src, float* __restrict dst, std::size_t pixels, int channels, const float* mul,
                  const float* add) {
  float m[kPeriod], a[kPeriod];
  expand_coefficients(channels, mul, add, m, a);
  const std::size_t n = pixels * static_cast<std::size_t>(channels);
  std::size_t i = 0;
  for (; i + kPeriod <= n; i += kPeriod)
    for (std::size_t k = 0; k < kPeriod; ++k) dst[i + k] = static_cast<float>(src[i + k]) * m[k] + a[k];
  for (std::size_t k = 0; i < n; ++i, ++k) dst[i] = static_cast<float>(src[i]) * m[k] + a[k];
}

void normalize_u8_to_cold(const std::uint8_t* __restrict src, float* __restrict dst, std::size_t pixels, int channels, const float* mul,
                          const float* add) {
#if defined(__x86_64__) || defined(_M_X64)
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0) {
    normalize_u8(src, dst, pixels, channels, mul, add);
    return;
  }
  float m[kPeriod], a[kPeriod];
  expand_coefficients(channels, mul, add, m, a);
  constexpr std::size_t kLanes = 4;
  __m128 mv[kPeriod / kLanes], av[kPeriod / kLanes];
  for (std::size_t v = 0; v < kPeriod / kLanes; ++v) {
    mv[v] = _mm_loadu_ps(m + v * kLanes);
    av[v] = _mm_loadu_ps(a + v * kLanes);
  }
  const __m128i zero = _mm_setzero_si128();
  const std::size_t n = pixels * static_cast<std::size_t>(channels);
  std::size_t i = 0;
  for (; i + kPeriod <= n; i += kPeriod) {
    for (std::size_t v = 0; v < kPeriod / kLanes; ++v) {
      std::int32_t four;
      std::memcpy(&four, src + i + v * kLanes, sizeof four);
      const __m128i words = _mm_unpacklo_epi8(_mm_cvtsi32_si128(four), zero);
      const __m128 values = _mm_cvtepi32_ps(_mm_unpacklo_epi16(words, zero));
      _mm_stream_ps(dst + i + v * kLanes, _mm_add_ps(_mm_mul_ps(values, mv[v]), av[v]));
    }
  }
  for (std::size_t k = 0; i < n; ++i, ++k) dst[i] = static_cast<float>(src[i]) * m[k] + a[k];
  _mm_sfence();
#else
  normalize_u8(src, dst, pixels, channels, mul, add);
#endif
}

}  // namespace sluice::vision
