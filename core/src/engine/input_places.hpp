// The places a stage's recent inputs had in its input, found by where each was read.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/sample.hpp"

namespace sluice {

// A stage that holds elements after maps after a shuffle (`shuffle -> map -> batch`): a reference
// to a held element names where it was read, which gives the maps before the shuffle their
// places again, and the place it had after the shuffle, which the maps after it saw (their input
// places are the holder's while none of them dropped an element). This remembers the latter for
// the last `capacity` inputs, by their read positions (each names one element of the run): a held
// element older than that is kept by value.
class InputPlaces {
 public:
  struct Place {
    std::uint64_t epoch = 0, index = 0;
  };
  explicit InputPlaces(std::size_t capacity = 1 << 16) : ring_(capacity) {}

  void remember(const Origin& read, std::uint64_t epoch, std::uint64_t index) {
    if (read.read_index < 0) return;
    const Key key{read.read_epoch, read.read_index};
    Slot& slot = ring_[next_++ % ring_.size()];
    if (slot.used) {
      auto old = places_.find(slot.key);
      if (old != places_.end() && old->second.index == slot.index && old->second.epoch == slot.epoch) places_.erase(old);
    }
    slot = Slot{key, epoch, index, true};
    places_[key] = Place{epoch, index};
  }
  std::optional<Place> find(const Origin& read) const {
    if (read.read_index < 0) return std::nullopt;
    auto it = places_.find(Key{read.read_epoch, read.read_index});
    if (it == places_.end()) return std::nullopt;
    return it->second;
  }

 private:
  struct Key {
    std::uint64_t epoch;
    std::int64_t index;
    bool operator==(const Key& o) const { return epoch == o.epoch && index == o.index; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const { return std::hash<std::uint64_t>()(k.epoch * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(k.index)); }
  };
  struct Slot {
    Key key{0, -1};
    std::uint64_t epoch = 0, index = 0;
    bool used = false;
  };
  std::vector<Slot> ring_;
  std::size_t next_ = 0;
  std::unordered_map<Key, Place, KeyHash> places_;
};

}  // namespace sluice
