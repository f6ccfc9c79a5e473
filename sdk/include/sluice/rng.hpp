#pragma once
#include <cstdint>
#include <string_view>

namespace sluice {

/// FNV-1a: a hash that is the same on every machine and every run (std::hash is not).
inline std::uint64_t stable_hash(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Counter-based generator (Philox4x32-10). Its stream is a pure function of
/// (seed, stage, epoch, element index), so a random operator gives the same result for an element
/// whichever worker thread handles it, in whatever order: determinism at any parallelism.
class Rng {
 public:
  Rng(std::uint64_t seed, std::uint64_t stage_hash, std::uint64_t epoch, std::uint64_t index) {
    std::uint64_t key = mix64(seed ^ mix64(stage_hash));
    key_[0] = static_cast<std::uint32_t>(key);
    key_[1] = static_cast<std::uint32_t>(key >> 32);
    counter_[1] = static_cast<std::uint32_t>(epoch);
    counter_[2] = static_cast<std::uint32_t>(index);
    counter_[3] = static_cast<std::uint32_t>(index >> 32);
  }

  std::uint32_t next_u32() {
    if (available_ == 0) refill();
    return block_[4 - available_--];
  }
  std::uint64_t next_u64() {
    std::uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  bool bernoulli(double p) { return uniform() < p; }
  /// Uniform in [0, n) without modulo bias (Lemire's method).
  std::uint64_t below(std::uint64_t n) {
    if (n <= 1) return 0;
    for (;;) {
      std::uint64_t x = next_u64();
      unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
      auto low = static_cast<std::uint64_t>(m);
      if (low >= n || low >= (0 - n) % n) return static_cast<std::uint64_t>(m >> 64);
    }
  }

 private:
  void refill() {
    std::uint32_t c[4] = {counter_[0], counter_[1], counter_[2], counter_[3]};
    std::uint32_t k0 = key_[0], k1 = key_[1];
    for (int round = 0; round < 10; ++round) {
      std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c[0];
      std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c[2];
      std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k0;
      std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k1;
      c[0] = n0;
      c[1] = static_cast<std::uint32_t>(p1);
      c[2] = n2;
      c[3] = static_cast<std::uint32_t>(p0);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int i = 0; i < 4; ++i) block_[i] = c[i];
    ++counter_[0];
    available_ = 4;
  }

  std::uint32_t key_[2] = {0, 0};
  std::uint32_t counter_[4] = {0, 0, 0, 0};
  std::uint32_t block_[4] = {0, 0, 0, 0};
  int available_ = 0;
};

}  // namespace sluice
