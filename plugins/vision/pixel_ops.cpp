#include "pixel_ops.hpp"

namespace sluice::vision {

void normalize_u8(const std::uint8_t* __restrict src, float* __restrict dst, std::size_t pixels, int channels, const float* mul,
                  const float* add) {
  // 24 values hold a whole number of pixels for 1 to 4 channels and of SIMD lanes: the inner loop
  // has constant coefficients per position and vectorises.
  constexpr std::size_t kPeriod = 24;
  float m[kPeriod], a[kPeriod];
  for (std::size_t k = 0; k < kPeriod; ++k) {
    m[k] = mul[k % static_cast<std::size_t>(channels)];
    a[k] = add[k % static_cast<std::size_t>(channels)];
  }
  const std::size_t n = pixels * static_cast<std::size_t>(channels);
  std::size_t i = 0;
  for (; i + kPeriod <= n; i += kPeriod)
    for (std::size_t k = 0; k < kPeriod; ++k) dst[i + k] = static_cast<float>(src[i + k]) * m[k] + a[k];
  for (std::size_t k = 0; i < n; ++i, ++k) dst[i] = static_cast<float>(src[i]) * m[k] + a[k];
}

}  // namespace sluice::vision
