#pragma once
// A bounded channel between two stages: the producing stage's output buffer. Items move in
// chunks so that a hand-off costs one lock for many elements; waiting time is measured for the
// starved/blocked metrics and the fill level is integrated over time for the mean occupancy.
// It is bounded in elements and, when given a byte limit, in bytes too (at least one element is
// always admitted): a buffer the engine sizes holds many small records or a few large batches.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sluice/sample.hpp"

namespace sluice::detail {

inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

inline constexpr std::int64_t kAllIterations = std::numeric_limits<std::int64_t>::max();

struct Item {
  // Barrier: a checkpoint's cut (see engine_checkpoint.cpp); every element before it is in the
  // state its consumer saves when it takes the barrier, none after it.
  enum class Kind : std::uint8_t { Element, EndOfIteration, EndOfStream, Barrier };
  Kind kind = Kind::Element;
  std::uint64_t iteration = 0;  // for EndOfIteration
  Sample sample;

  bool is_element() const { return kind == Kind::Element; }
  static Item element(Sample s) { return {Kind::Element, 0, std::move(s)}; }
  static Item end_of_iteration(std::uint64_t it) { return {Kind::EndOfIteration, it, {}}; }
  static Item end_of_stream() { return {Kind::EndOfStream, 0, {}}; }
  static Item barrier() { return {Kind::Barrier, 0, {}}; }
};

class Channel {
 public:
  // `byte_limit` 0: bounded in elements only.
  Channel(std::size_t capacity, std::uint64_t byte_limit, const std::atomic<bool>& stopping)
      : capacity_(std::max<std::size_t>(1, capacity)), ring_(std::min<std::size_t>(capacity_.load(), kInitialSlots)),
        ring_bytes_(ring_.size()), byte_limit_(byte_limit), stopping_(stopping), created_ns_(now_ns()),
        last_change_ns_(created_ns_) {}

  // Moves every item in, waiting for room as needed; clears `items`. False if the run stops.
  bool push(std::vector<Item>& items) {
    return push(items, [] { return false; });
  }
  // The same, but while it waits for room it gives way when `give_way()` turns true (asked under
  // the channel's lock, after any wake_all()): the items not moved in yet stay in `items`.
  template <class GiveWay> bool push(std::vector<Item>& items, GiveWay give_way) {
    std::size_t next = 0;
    while (next < items.size()) {
      if (full_flag_.load(std::memory_order_relaxed)) spin_while([&] { return full_flag_.load(std::memory_order_relaxed); }, producer_spins_);
      bool wake = false;
      {
        std::unique_lock lock(mutex_);
        bool gave_way = false;
        while (!has_room() && !stopping_.load(std::memory_order_relaxed) && !(gave_way = give_way())) {
          ++producers_waiting_;
          not_full_.wait(lock);
          --producers_waiting_;
        }
        if (stopping_.load(std::memory_order_relaxed)) return false;
        if (gave_way) {
          items.erase(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(next));
          return true;
        }
        account(now_ns());
        while (next < items.size() && has_room()) {
          if (count_ == ring_.size()) grow();
          const std::size_t at = slot(count_);
          ring_bytes_[at] = items[next].sample.nbytes();
          bytes_ += ring_bytes_[at];
          ring_[at] = std::move(items[next++]);
          ++count_;
        }
        publish_level();
        wake = consumers_waiting_ > 0;
      }
      // Notified after unlocking, so the woken consumer does not block on the mutex at once.
      if (wake) not_empty_.notify_one();
    }
    items.clear();
    return true;
  }

  // Moves up to `max` items out, waiting for at least one. A control item (end of iteration or
  // stream) always comes alone, so a consumer sees it between chunks. False if the run stops.
  bool pop(std::vector<Item>& out, std::size_t max) {
    out.clear();
    if (level_.load(std::memory_order_relaxed) == 0) spin_while([&] { return level_.load(std::memory_order_relaxed) == 0; }, consumer_spins_);
    bool wake = false;
    {
      std::unique_lock lock(mutex_);
      while (count_ == 0 && !stopping_.load(std::memory_order_relaxed)) {
        ++consumers_waiting_;
        consumer_waiting_flag_.store(true, std::memory_order_relaxed);
        not_empty_.wait(lock);
        --consumers_waiting_;
        consumer_waiting_flag_.store(consumers_waiting_ > 0, std::memory_order_relaxed);
      }
      if (stopping_.load(std::memory_order_relaxed)) return false;
      account(now_ns());
      if (!ring_[head_].is_element()) {
        take_front(out);
      } else {
        while (count_ > 0 && out.size() < max && ring_[head_].is_element()) take_front(out);
      }
      publish_level();
      wake = producers_waiting_ > 0;
    }
    if (wake) not_full_.notify_one();
    return true;
  }

  std::size_t available() const { return level_.load(std::memory_order_relaxed); }

  // ---- a cut's barrier placed by a source (stage_source.cpp), taken in place by an expand ----

  // Puts a cut's barrier right after the first end of iteration waiting here, when there is one:
  // what follows it is of later passes, which the source can make again from their start.
  // Returns whether it did, and that iteration.
  bool put_barrier_after_first_end_of_iteration(std::uint64_t& iteration) {
    {
      std::lock_guard lock(mutex_);
      std::size_t at = 0;
      while (at < count_ && ring_[slot(at)].kind != Item::Kind::EndOfIteration) ++at;
      if (at == count_) return false;
      iteration = ring_[slot(at)].iteration;
      insert(at + 1, Item::barrier());
    }
    not_empty_.notify_all();
    return true;
  }
  // Puts a cut's barrier after everything here, room or not: what the source had not handed over
  // yet stays with it.
  void put_barrier() {
    {
      std::lock_guard lock(mutex_);
      insert(count_, Item::barrier());
    }
    not_empty_.notify_all();
  }
  // Waits for a cut's barrier (or the end of the stream) to be here, copies what comes before it
  // (through the end) into `before`, and takes the barrier out: the items stay where they are and
  // take their room, so that the producer is not let in ahead by a cut. False if the run stops.
  bool copy_through_barrier(std::vector<Item>& before) {
    before.clear();
    std::unique_lock lock(mutex_);
    for (;;) {
      if (stopping_.load(std::memory_order_relaxed)) return false;
      std::size_t at = 0;
      while (at < count_ && ring_[slot(at)].kind != Item::Kind::Barrier && ring_[slot(at)].kind != Item::Kind::EndOfStream) ++at;
      if (at < count_) {
        const bool barrier = ring_[slot(at)].kind == Item::Kind::Barrier;
        for (std::size_t k = 0; k < at + (barrier ? 0 : 1); ++k) before.push_back(ring_[slot(k)]);
        if (barrier) erase(at);
        return true;
      }
      ++consumers_waiting_;
      not_empty_.wait(lock);
      --consumers_waiting_;
    }
  }

  // Puts items its consumer took out ahead of its need (those before a cut's barrier) back at the
  // front, in their order: they wait here again and take room, instead of waiting in the consumer
  // while the producer fills the buffer anew (a cut each training step let a source run ahead
  // without bound). The buffer may hold more than its capacity for a while; the producer waits.
  void give_back(std::vector<Item>& items) {
    if (items.empty()) return;
    {
      std::lock_guard lock(mutex_);
      account(now_ns());
      const std::size_t size = std::max(ring_.size(), count_ + items.size());
      std::vector<Item> ring;
      std::vector<std::uint64_t> bytes;
      ring.reserve(size);
      bytes.reserve(size);
      for (auto& item : items) {
        bytes.push_back(item.sample.nbytes());
        bytes_ += bytes.back();
        ring.push_back(std::move(item));
      }
      for (std::size_t k = 0; k < count_; ++k) {
        ring.push_back(std::move(ring_[slot(k)]));
        bytes.push_back(ring_bytes_[slot(k)]);
      }
      count_ += items.size();
      ring.resize(size);
      bytes.resize(size);
      ring_.swap(ring);
      ring_bytes_.swap(bytes);
      head_ = 0;
      publish_level();
    }
    items.clear();
  }

  // New bounds while the run goes on (the autotuner): a larger buffer lets waiting producers in
  // at once; a smaller one admits nothing until its consumer has taken it below the new bounds.
  void resize(std::size_t capacity, std::uint64_t byte_limit) {
    {
      std::lock_guard lock(mutex_);
      account(now_ns());
      capacity_.store(std::max<std::size_t>(1, capacity), std::memory_order_relaxed);
      byte_limit_.store(byte_limit, std::memory_order_relaxed);
      publish_level();
    }
    not_full_.notify_all();
  }

  // Wakes every waiter (used when the run stops).
  void wake_all() {
    std::lock_guard lock(mutex_);
    not_empty_.notify_all();
    not_full_.notify_all();
  }

  // True while the consumer waits for data: a producer then hands over what it has at once.
  bool consumer_waiting() const { return consumer_waiting_flag_.load(std::memory_order_relaxed); }

  std::size_t level() const { return level_.load(std::memory_order_relaxed); }
  std::size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }
  std::uint64_t level_bytes() const { return bytes_level_.load(std::memory_order_relaxed); }
  std::uint64_t byte_limit() const { return byte_limit_.load(std::memory_order_relaxed); }

  // Time-weighted mean fill since the channel was made; the fill is the larger of level over
  // capacity and bytes over the byte limit.
  double mean_fill() {
    std::lock_guard lock(mutex_);
    std::uint64_t now = now_ns();
    account(now);
    double elapsed = static_cast<double>(now - created_ns_);
    return elapsed > 0 ? fill_integral_ / elapsed : 0.0;
  }

  std::uint64_t swings() {
    std::lock_guard lock(mutex_);
    return swings_;
  }
  // Fractions of the time since the channel was made that it was empty, and full.
  std::pair<double, double> empty_and_full_fractions() {
    std::lock_guard lock(mutex_);
    std::uint64_t now = now_ns();
    account(now);
    const double elapsed = static_cast<double>(now - created_ns_);
    if (elapsed <= 0) return {0.0, 0.0};
    return {static_cast<double>(empty_ns_) / elapsed, static_cast<double>(full_ns_) / elapsed};
  }

  // Time empty and time full since the channel was made, and swings: the autotuner's window is
  // the difference between two readings.
  struct Extremes {
    std::uint64_t empty_ns = 0, full_ns = 0, swings = 0;
  };
  Extremes extremes() {
    std::lock_guard lock(mutex_);
    account(now_ns());
    return {empty_ns_, full_ns_, swings_};
  }

  // The consumer's request: nothing more of iterations <= this value is wanted.
  std::atomic<std::int64_t> skip_through{-1};

  bool skipped(std::uint64_t iteration) const {
    return static_cast<std::int64_t>(iteration) <= skip_through.load(std::memory_order_relaxed);
  }
  void request_skip(std::int64_t iteration) {
    std::int64_t cur = skip_through.load();
    while (cur < iteration && !skip_through.compare_exchange_weak(cur, iteration)) {
    }
  }

 private:
  std::size_t slot(std::size_t offset) const {
    std::size_t i = head_ + offset;
    return i >= ring_.size() ? i - ring_.size() : i;
  }
  void take_front(std::vector<Item>& out) {
    out.push_back(std::move(ring_[head_]));
    bytes_ -= ring_bytes_[head_];
    head_ = slot(1);
    --count_;
  }
  // The ring starts small and doubles up to the capacity as elements arrive: a buffer_size of
  // millions costs memory only when that many elements are really held.
  static constexpr std::size_t kInitialSlots = 64;
  void grow() { reshape(std::min(capacity(), ring_.size() * 2)); }
  void reshape(std::size_t size) {
    std::vector<Item> ring(size);
    std::vector<std::uint64_t> bytes(size);
    for (std::size_t k = 0; k < count_; ++k) {
      ring[k] = std::move(ring_[slot(k)]);
      bytes[k] = ring_bytes_[slot(k)];
    }
    ring_.swap(ring);
    ring_bytes_.swap(bytes);
    head_ = 0;
  }
  // An item put at `offset` from the head (those after it move back one), room or not; and one
  // taken out from there. Under mutex_.
  void insert(std::size_t offset, Item item) {
    account(now_ns());
    if (count_ == ring_.size()) reshape(std::max<std::size_t>(2 * ring_.size(), count_ + 1));
    for (std::size_t k = count_; k > offset; --k) {
      ring_[slot(k)] = std::move(ring_[slot(k - 1)]);
      ring_bytes_[slot(k)] = ring_bytes_[slot(k - 1)];
    }
    ring_bytes_[slot(offset)] = item.sample.nbytes();
    bytes_ += ring_bytes_[slot(offset)];
    ring_[slot(offset)] = std::move(item);
    ++count_;
    publish_level();
  }
  void erase(std::size_t offset) {
    account(now_ns());
    bytes_ -= ring_bytes_[slot(offset)];
    for (std::size_t k = offset; k + 1 < count_; ++k) {
      ring_[slot(k)] = std::move(ring_[slot(k + 1)]);
      ring_bytes_[slot(k)] = ring_bytes_[slot(k + 1)];
    }
    --count_;
    ring_[slot(count_)] = Item{};
    publish_level();
  }
  bool has_room() const {
    const std::uint64_t limit = byte_limit();
    return count_ < capacity() && (limit == 0 || count_ == 0 || bytes_ < limit);
  }
  double fill() const {
    double f = std::min(1.0, static_cast<double>(count_) / static_cast<double>(capacity()));
    if (const std::uint64_t limit = byte_limit(); limit > 0)
      f = std::max(f, std::min(1.0, static_cast<double>(bytes_) / static_cast<double>(limit)));
    return f;
  }
  void publish_level() {
    level_.store(count_, std::memory_order_relaxed);
    bytes_level_.store(bytes_, std::memory_order_relaxed);
    full_flag_.store(!has_room(), std::memory_order_relaxed);
    note_extremes();
  }
  // A short wait without sleeping: a hand-off that comes within a few scheduler slices costs no
  // futex sleep and wake-up. Yielding leaves the core to the threads that do the work. Adaptive,
  // as glibc's adaptive mutexes: a spin that ended in a sleep anyway halves the next one, one that
  // saw the condition end doubles it. A consumer that waits most of the time (a batching stage
  // starved by its mappers) otherwise yielded 16 times per chunk, each a context switch on a busy
  // machine: 100,000 switches a second in bench_sequences.
  template <class Condition> void spin_while(Condition condition, std::atomic<int>& budget) const {
    const int spins = budget.load(std::memory_order_relaxed);
    for (int i = 0; i < spins; ++i) {
      if (!condition() || stopping_.load(std::memory_order_relaxed)) {
        budget.store(std::min(kMaxSpins, spins * 2 + 1), std::memory_order_relaxed);
        return;
      }
      std::this_thread::yield();
    }
    if (condition()) budget.store(std::max(1, spins / 2), std::memory_order_relaxed);  // at least one try: a budget of 0 could never grow again
  }
  static constexpr int kMaxSpins = 16;
  // Counts swings: full after having been empty, or empty after having been full.
  void note_extremes() {
    const int extreme = count_ == 0 ? -1 : !has_room() ? 1 : 0;
    if (extreme != 0 && extreme != last_extreme_) {
      if (last_extreme_ != 0) ++swings_;
      last_extreme_ = extreme;
    }
  }
  void account(std::uint64_t now) {
    const std::uint64_t dt = now - last_change_ns_;
    fill_integral_ += fill() * static_cast<double>(dt);
    if (count_ == 0) empty_ns_ += dt;
    if (!has_room()) full_ns_ += dt;
    last_change_ns_ = now;
  }

  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::atomic<std::size_t> capacity_;  // written under mutex_; read anywhere
  std::vector<Item> ring_;
  std::vector<std::uint64_t> ring_bytes_;  // each slot's element size, as counted when it came in
  std::size_t head_ = 0, count_ = 0;
  std::uint64_t bytes_ = 0;
  std::atomic<std::uint64_t> byte_limit_;  // written under mutex_; read anywhere
  std::atomic<bool> full_flag_{false};
  std::atomic<std::uint64_t> bytes_level_{0};
  int consumers_waiting_ = 0, producers_waiting_ = 0;
  std::atomic<bool> consumer_waiting_flag_{false};
  std::atomic<std::size_t> level_{0};
  std::atomic<int> producer_spins_{kMaxSpins}, consumer_spins_{kMaxSpins};  // see spin_while
  const std::atomic<bool>& stopping_;
  std::uint64_t created_ns_, last_change_ns_;
  double fill_integral_ = 0;
  std::uint64_t empty_ns_ = 0, full_ns_ = 0;
  int last_extreme_ = 0;  // -1 empty, 1 full, 0 neither yet
  std::uint64_t swings_ = 0;
};

// A stage's output: a channel per reader. With several readers (a tee) every reader gets every
// element in order through its own bounded buffer; the producer waits for the fullest, so the
// slowest reader sets the pace and memory stays bounded. A reader that wants no more of an
// iteration (a take downstream) or fewer iterations than the others gets only what it still
// wants, and the producer stops early only once no reader wants more.
class Outputs {
 public:
  Outputs(std::size_t readers, std::size_t capacity, std::uint64_t byte_limit, const std::atomic<bool>& stopping)
      : wanted_(readers, -1) {
    for (std::size_t k = 0; k < readers; ++k) channels_.push_back(std::make_unique<Channel>(capacity, byte_limit, stopping));
  }

  std::size_t readers() const { return channels_.size(); }
  Channel& reader(std::size_t k) { return *channels_[k]; }
  const Channel& reader(std::size_t k) const { return *channels_[k]; }
  // Iterations reader `k` reads (-1: all of them); later ones are kept from it.
  void set_wanted_iterations(std::size_t k, std::int64_t iterations) { wanted_[k] = iterations; }

  // Moves every item to every reader that wants it; clears `items`. False if the run stops.
  bool push(std::vector<Item>& items) {
    if (channels_.size() == 1) return channels_.front()->push(items);
    std::vector<Item> copy;
    std::uint64_t iteration = iteration_;
    for (std::size_t k = 0; k < channels_.size(); ++k) {
      copy.clear();
      iteration = iteration_;
      // Whether reader k wants this iteration changes only at an end of iteration: asked then,
      // not for every element.
      bool wants_iteration = wants(k, iteration);
      bool wants_elements = wants_iteration && !channels_[k]->skipped(iteration);
      for (const auto& item : items) {
        if (item.kind == Item::Kind::EndOfStream || item.kind == Item::Kind::Barrier || (item.is_element() ? wants_elements : wants_iteration)) copy.push_back(item);
        if (item.kind == Item::Kind::EndOfIteration) {
          iteration = item.iteration + 1;
          wants_iteration = wants(k, iteration);
          wants_elements = wants_iteration && !channels_[k]->skipped(iteration);
        }
      }
      if (!copy.empty() && !channels_[k]->push(copy)) return false;
    }
    iteration_ = iteration;
    items.clear();
    return true;
  }

  // A run resumed from a checkpoint: the producer's next element belongs to `iteration`.
  void set_iteration(std::uint64_t iteration) { iteration_ = iteration; }

  // Nothing more of iterations <= this is wanted by any reader (kAllIterations: nothing at all).
  std::int64_t skip_through() const {
    std::int64_t through = kAllIterations;
    for (std::size_t k = 0; k < channels_.size(); ++k) {
      std::int64_t reader_through = channels_[k]->skip_through.load(std::memory_order_relaxed);
      if (wanted_[k] >= 0 && reader_through >= wanted_[k] - 1) reader_through = kAllIterations;
      through = std::min(through, reader_through);
    }
    return through;
  }
  // No reader wants iteration `iteration`.
  bool skipped(std::uint64_t iteration) const {
    for (std::size_t k = 0; k < channels_.size(); ++k)
      if (wants(k, iteration) && !channels_[k]->skipped(iteration)) return false;
    return true;
  }
  bool consumer_waiting() const {
    for (const auto& c : channels_)
      if (c->consumer_waiting()) return true;
    return false;
  }
  void resize(std::size_t capacity, std::uint64_t byte_limit) {
    for (auto& c : channels_) c->resize(capacity, byte_limit);
  }
  void wake_all() {
    for (auto& c : channels_) c->wake_all();
  }
  std::size_t capacity() const { return channels_.front()->capacity(); }
  std::uint64_t byte_limit() const { return channels_.front()->byte_limit(); }
  // The reader whose buffer is fullest now: the one holding the producer back.
  Channel& fullest() {
    Channel* best = channels_.front().get();
    for (auto& c : channels_)
      if (c->level() > best->level() || (c->level() == best->level() && c->level_bytes() > best->level_bytes())) best = c.get();
    return *best;
  }
  // Per window for the autotuner: the most time any reader's buffer was empty or full.
  Channel::Extremes extremes() {
    Channel::Extremes e;
    for (auto& c : channels_) {
      const auto x = c->extremes();
      e.empty_ns = std::max(e.empty_ns, x.empty_ns);
      e.full_ns = std::max(e.full_ns, x.full_ns);
      e.swings = std::max(e.swings, x.swings);
    }
    return e;
  }

 private:
  // Reader k reads iteration `iteration` at all (it may still skip part of it).
  bool wants(std::size_t k, std::uint64_t iteration) const {
    return wanted_[k] < 0 || static_cast<std::int64_t>(iteration) < wanted_[k];
  }

  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::int64_t> wanted_;
  std::uint64_t iteration_ = 0;  // of the next element pushed (producer side; one pusher at a time)
};

}  // namespace sluice::detail
