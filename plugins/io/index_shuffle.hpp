#pragma once
// A permutation of [0, n) that is computed, not stored: position p of an epoch's order is
// permute(p), from the key alone, in constant time and memory, whatever n is (a global shuffle
// of a billion records holds no table). A balanced Feistel network over the smallest even
// number of bits that holds n is a bijection of [0, 2^bits); walking the cycle (applying it
// again while the value is n or more) makes it one of [0, n), as format-preserving encryption
// does. 2^bits < 4n, so a walk takes under four steps on average.
#include <cstdint>

#include "sluice/rng.hpp"

namespace sluice::io {

class IndexShuffle {
 public:
  IndexShuffle(std::uint64_t n, std::uint64_t key) : n_(n) {
    int bits = 2;
    while (bits < 64 && (std::uint64_t{1} << bits) < n) bits += 2;
    half_ = bits / 2;
    mask_ = (std::uint64_t{1} << half_) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = mix64(key + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(r + 1));
  }
  std::uint64_t size() const { return n_; }
  // The element at position `p` (< size()) of the order.
  std::uint64_t operator()(std::uint64_t p) const {
    std::uint64_t x = p;
    do x = encrypt(x);
    while (x >= n_);
    return x;
  }
  // The position of element `x` (< size()) in the order: the inverse, walking the cycle back.
  std::uint64_t position_of(std::uint64_t x) const {
    do x = decrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 6;
  std::uint64_t encrypt(std::uint64_t x) const {
    std::uint64_t left = x >> half_, right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      const std::uint64_t next = left ^ (mix64(right ^ keys_[r]) & mask_);
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }
  std::uint64_t decrypt(std::uint64_t x) const {
    std::uint64_t left = x >> half_, right = x & mask_;
    for (int r = kRounds - 1; r >= 0; --r) {
      const std::uint64_t previous = right ^ (mix64(left ^ keys_[r]) & mask_);
      right = left;
      left = previous;
    }
    return (left << half_) | right;
  }
  std::uint64_t n_;
  int half_ = 1;
  std::uint64_t mask_ = 1;
  std::uint64_t keys_[kRounds] = {};
};

}  // namespace sluice::io
