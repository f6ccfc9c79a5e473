#include "output_assembly.hpp"

#include <chrono>

#include "channel.hpp"  // now_ns()

namespace sluice::detail {

OutputAssembly::OutputAssembly(int helpers, std::function<void()> on_start, std::function<void(std::uint64_t)> add_busy_ns)
    : on_start_(std::move(on_start)), add_busy_ns_(std::move(add_busy_ns)) {
  try {
    for (int k = 0; k < helpers; ++k) helpers_.emplace_back([this] { helper_loop(); });
  } catch (...) {
    close();  // the ones started
    throw;
  }
}

OutputAssembly::~OutputAssembly() { close(); }

void OutputAssembly::close() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
    to_start_.clear();
  }
  work_cv_.notify_all();
  for (auto& t : helpers_)
    if (t.joinable()) t.join();
  helpers_.clear();
}

void OutputAssembly::queue(std::function<Sample()> assemble) {
  auto output = std::make_shared<Output>();
  output->assemble = std::move(assemble);
  {
    std::lock_guard lock(mutex_);
    in_order_.push_back(output);
    to_start_.push_back(std::move(output));
    // A helper already at work finds it when it is done: waking is a system call, as long as a
    // small batch's whole assembly.
    if (idle_helpers_ == 0) return;
  }
  work_cv_.notify_one();
}

bool OutputAssembly::queue_made(Sample& sample) {
  std::lock_guard lock(mutex_);
  if (in_order_.empty()) return false;
  auto output = std::make_shared<Output>();
  output->made = std::move(sample);
  output->done = true;
  in_order_.push_back(std::move(output));
  return true;
}

// Outside the lock: the assembly is the long part.
void OutputAssembly::run(Output& output) {
  const std::uint64_t t0 = now_ns();
  try {
    output.made = output.assemble();
  } catch (...) {
    output.error = std::current_exception();
  }
  if (add_busy_ns_) add_busy_ns_(now_ns() - t0);
}

// Takes the oldest assembly no thread has started and runs it outside the lock. Holding `lock`
// on entry (with to_start_ not empty) and on return.
void OutputAssembly::run_next(std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<Output> output = std::move(to_start_.front());
  to_start_.pop_front();
  lock.unlock();
  run(*output);
  lock.lock();
  output->done = true;
  // The stage's thread holds the last reference, so what the assembly captured (rows it
  // allocated) is freed there: frees of one thread's memory on another contend for malloc's
  // arena lock.
  output.reset();
}

void OutputAssembly::helper_loop() {
  if (on_start_) on_start_();
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_helpers_;
    work_cv_.wait(lock, [&] { return closing_ || !to_start_.empty(); });
    --idle_helpers_;
    if (closing_) return;
    run_next(lock);
    done_cv_.notify_all();
  }
}

void OutputAssembly::collect(std::vector<Sample>& ready, std::size_t most_pending, const std::atomic<bool>& stopping) {
  std::unique_lock lock(mutex_);
  for (;;) {
    while (!in_order_.empty() && in_order_.front()->done) {
      std::shared_ptr<Output> output = std::move(in_order_.front());
      in_order_.pop_front();
      if (output->error) std::rethrow_exception(output->error);
      ready.push_back(std::move(output->made));
    }
    if (in_order_.size() <= most_pending || stopping.load(std::memory_order_relaxed)) return;
    if (!to_start_.empty()) {  // behind: this thread assembles too, the oldest first
      run_next(lock);
      continue;
    }
    const std::uint64_t t0 = now_ns();
    done_cv_.wait_for(lock, std::chrono::milliseconds(50));
    waited_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  }
}

}  // namespace sluice::detail
