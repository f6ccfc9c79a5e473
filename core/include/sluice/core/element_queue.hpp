#pragma once
// A bounded queue of elements from a pipeline's sink to the application that takes them (Python's
// iterator, a service worker's stream): the sink blocks while it is full; the taker waits with a
// timeout, so that it can look at other things (a signal, the engine's end) between tries.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sluice/operator.hpp"
#include "sluice/sample.hpp"

namespace sluice {

class ElementQueue {
 public:
  explicit ElementQueue(std::size_t capacity) : capacity_(capacity) {}
  // False when the taker went away (cancel()).
  bool push(Sample sample) {
    std::unique_lock lock(mutex_);
    room_.wait(lock, [&] { return items_.size() < capacity_ || cancelled_; });
    if (cancelled_) return false;
    items_.push_back(std::move(sample));
    ready_.notify_one();
    return true;
  }
  // No more elements will come (what is queued can still be taken).
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    ready_.notify_all();
  }
  void cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    room_.notify_all();
    ready_.notify_all();
  }
  enum class Pop { Item, Closed, TimedOut };
  Pop pop(Sample& out, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !items_.empty() || closed_ || cancelled_; })) return Pop::TimedOut;
    if (items_.empty()) return Pop::Closed;
    out = std::move(items_.front());
    items_.pop_front();
    room_.notify_one();
    return Pop::Item;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_, room_;
  std::deque<Sample> items_;
  std::size_t capacity_;
  bool closed_ = false, cancelled_ = false;
};

// Queues by name, so that a pipeline (text) can say which one its sink fills: the application
// registers a queue under a handle, puts the handle in the sink's `queue` parameter, and forgets
// it once the run is over.
namespace detail {
inline std::mutex& element_queues_mutex() {
  static std::mutex mutex;
  return mutex;
}
inline std::map<std::string, std::shared_ptr<ElementQueue>>& element_queues() {
  static auto* queues = new std::map<std::string, std::shared_ptr<ElementQueue>>;
  return *queues;
}
}  // namespace detail

inline void register_element_queue(const std::string& handle, std::shared_ptr<ElementQueue> queue) {
  std::lock_guard lock(detail::element_queues_mutex());
  detail::element_queues()[handle] = std::move(queue);
}
inline void forget_element_queue(const std::string& handle) {
  std::lock_guard lock(detail::element_queues_mutex());
  detail::element_queues().erase(handle);
}

// A sink (a host operator) that hands each element to the queue its `queue` parameter names, and
// closes it when the run ends; a handle no queue has drops the elements.
class QueueSink final : public Sink {
 public:
  explicit QueueSink(const Params& p) {
    std::lock_guard lock(detail::element_queues_mutex());
    if (auto it = detail::element_queues().find(p.get_string("queue")); it != detail::element_queues().end()) queue_ = it->second;
  }
  void consume(Sample in, const ElementContext&) override {
    if (queue_) queue_->push(std::move(in));
  }
  void finish(bool) override {
    if (queue_) queue_->close();
  }
  void cancel() override {
    if (queue_) queue_->cancel();
  }

 private:
  std::shared_ptr<ElementQueue> queue_;
};

}  // namespace sluice
