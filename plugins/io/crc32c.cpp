#include "crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace sluice::io {
namespace {

// Slicing-by-8 tables for the portable path.
struct Tables {
  std::uint32_t t[8][256];
  Tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

std::uint32_t crc32c_portable(const unsigned char* p, std::size_t n, std::uint32_t crc) {
  static const Tables tables;
  const auto& t = tables.t;
  crc = ~crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^ t[4][(word >> 24) & 0xff] ^
          t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^ t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

// Shifting a CRC register past n zero bytes is multiplication by x^(8n) modulo the polynomial
// (bit-reflected: bit 31 is x^0). It lets three independent lanes run at once and be joined.
constexpr std::uint32_t kPoly = 0x82f63b78u;

std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) {
  std::uint32_t m = 1u << 31, product = 0;
  for (;;) {
    if (a & m) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial.
std::uint32_t shift_operator(std::size_t bytes) {
  std::uint32_t power = 1u << 30;  // x^1
  std::uint32_t result = 1u << 31;  // x^0
  for (std::size_t bits = bytes * 8; bits; bits >>= 1) {
    if (bits & 1) result = multiply_mod_p(power, result);
    power = multiply_mod_p(power, power);
  }
  return result;
}

// Multiplication by a fixed x^(8n) as four table look-ups (multiplication is linear in the
// register, so it splits by byte).
struct ShiftTable {
  std::uint32_t t[4][256];
  explicit ShiftTable(std::size_t bytes) {
    const std::uint32_t op = shift_operator(bytes);
    for (int k = 0; k < 4; ++k)
      for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = multiply_mod_p(op, b << (8 * k));
  }
  std::uint32_t apply(std::uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

#if defined(__x86_64__)
// The crc32 instruction has a latency of three cycles and a throughput of one: three lanes keep
// it busy.
template <std::size_t kLane>
__attribute__((target("sse4.2"))) void three_lanes(std::uint64_t& c, const unsigned char*& p, std::size_t& n) {
  static const ShiftTable shift(kLane);
  while (n >= 3 * kLane) {
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      std::uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kLane + i, 8);
      std::memcpy(&w2, p + 2 * kLane + i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = shift.apply(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1);
    c = shift.apply(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c2);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
}

__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const unsigned char* p, std::size_t n, std::uint32_t crc) {
  std::uint64_t c = ~crc;
  three_lanes<4096>(c, p, n);
  three_lanes<256>(c, p, n);
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#else
const bool kHaveSse42 = false;
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_sse42(p, size, crc);
#endif
  return crc32c_portable(p, size, crc);
}

bool crc32c_uses_sse42() { return kHaveSse42; }

// Exposed for the test that checks both paths agree.
std::uint32_t crc32c_portable_for_test(const void* data, std::size_t size) {
  return crc32c_portable(static_cast<const unsigned char*>(data), size, 0);
}

}  // namespace sluice::io
