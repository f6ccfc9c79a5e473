#pragma once
// An aggregate's outputs assembled on helper threads (AssemblesInParallel, sluice/operator.hpp):
// the stage's thread queues each output in order, as an assembly to run or as an output already
// made; helpers run the assemblies; the stage's thread takes the outputs back in the order they
// were queued. The same data at any number of helpers.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sluice/sample.hpp"

namespace sluice::detail {

class OutputAssembly {
 public:
  // Starts `helpers` threads; each calls `on_start` first (to name itself) and reports the time
  // each assembly took to `add_busy_ns`.
  OutputAssembly(int helpers, std::function<void()> on_start, std::function<void(std::uint64_t)> add_busy_ns);
  // Drops the assemblies no thread has started, lets the running ones finish, joins the helpers.
  ~OutputAssembly();
  OutputAssembly(const OutputAssembly&) = delete;
  OutputAssembly& operator=(const OutputAssembly&) = delete;

  void queue(std::function<Sample()> assemble);
  // Queues an output already made behind those pending; false (and `sample` untouched) when
  // nothing is pending, so the caller hands it on at once.
  bool queue_made(Sample& sample);
  // Appends the pending outputs that are ready, from the front, to `ready`. While more than
  // `most_pending` stay pending it waits, running a queued assembly itself rather than idling.
  // Rethrows what an assembly threw (the outputs before it are in `ready`). Returns early, with
  // what is ready, once `stopping` is set.
  void collect(std::vector<Sample>& ready, std::size_t most_pending, const std::atomic<bool>& stopping);
  // Time collect() spent waiting for the helpers: not the stage's own work (they count theirs).
  std::uint64_t waited_ns() const { return waited_ns_.load(std::memory_order_relaxed); }

 private:
  struct Output {
    std::function<Sample()> assemble;
    Sample made;
    std::exception_ptr error;
    bool done = false;
  };
  void run(Output& output);
  void run_next(std::unique_lock<std::mutex>& lock);
  void helper_loop();
  void close();

  std::function<void()> on_start_;
  std::function<void(std::uint64_t)> add_busy_ns_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Output>> in_order_;  // every output pending, in order
  std::deque<std::shared_ptr<Output>> to_start_;  // the assemblies no thread has started
  bool closing_ = false;
  int idle_helpers_ = 0;  // waiting on work_cv_
  std::atomic<std::uint64_t> waited_ns_{0};
  std::vector<std::thread> helpers_;
};

}  // namespace sluice::detail
