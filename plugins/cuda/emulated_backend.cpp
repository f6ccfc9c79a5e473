// Emulated devices: "device memory" is host memory and each stream is a thread that runs its
// work in order, with events that behave as CUDA's do (record captures the work enqueued so far;
// a wait waits for it). The feed's ring, ordering and release logic thus meets the same
// asynchrony on a machine without a GPU.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "checksum.hpp"
#include "device_backend.hpp"
#include "sluice/error.hpp"

namespace sluice::cuda {
namespace {

struct EmulatedEvent {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // records made so far
  std::uint64_t completed = 0;  // the last record whose work is done
  std::chrono::steady_clock::time_point reached;  // when the stream reached the last completed record

  // A new record: its generation, which completes once the work before it is done.
  std::uint64_t record() {
    std::lock_guard lock(mutex);
    return ++recorded;
  }
  std::uint64_t last_recorded() {
    std::lock_guard lock(mutex);
    return recorded;
  }
  void complete(std::uint64_t generation) {
    std::lock_guard lock(mutex);
    if (generation > completed) {
      completed = generation;
      reached = std::chrono::steady_clock::now();
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

// Runs enqueued work in order on its own thread.
class EmulatedStream {
 public:
  explicit EmulatedStream() : thread_([this] { run(); }) {}
  ~EmulatedStream() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      work_.push_back(std::move(work));
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return work_.empty() && !running_; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !work_.empty(); });
      if (work_.empty()) return;  // quit, and everything enqueued is done
      auto work = std::move(work_.front());
      work_.pop_front();
      running_ = true;
      lock.unlock();
      work();
      lock.lock();
      running_ = false;
      if (work_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> work_;
  bool running_ = false, quit_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

class EmulatedLane final : public Lane {
 public:
  explicit EmulatedLane(int ordinal) : name_("emulated:" + std::to_string(ordinal)) {}
  ~EmulatedLane() override { synchronize_all(); }

  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes) override { return ::operator new(bytes ? bytes : 1, std::align_val_t{256}); }
  void deallocate(void* device) override { ::operator delete(device, std::align_val_t{256}); }
  Event create_event() override { return new EmulatedEvent; }
  Event create_timing_event() override { return new EmulatedEvent; }  // every emulated event keeps its time
  void destroy_event(Event event) override { delete static_cast<EmulatedEvent*>(event); }
  double elapsed_seconds(Event from, Event to) override {
    auto reached = [](Event event) {
      auto* e = static_cast<EmulatedEvent*>(event);
      std::lock_guard lock(e->mutex);
      return e->reached;
    };
    return std::chrono::duration<double>(reached(to) - reached(from)).count();
  }

  void copy_wait(Event event) override { wait_on(copy_, event); }
  void copy_to_device(void* device, const void* host, std::size_t bytes) override {
    copy_.enqueue([=] { std::memcpy(device, host, bytes); });
  }
  void zero(void* device, std::size_t bytes) override {
    copy_.enqueue([=] { std::memset(device, 0, bytes); });
  }
  void copy_record(Event event) override { record(copy_, event); }

  void compute_wait(Event event) override { wait_on(compute_, event); }
  void checksum(const void* device, std::size_t bytes, void*, std::uint64_t* host_result) override {
    compute_.enqueue([=] { *host_result = host_checksum(device, bytes, bytes); });
  }
  void spin(std::uint32_t microseconds) override {
    compute_.enqueue([=] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(microseconds);
      while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_until(until);
    });
  }
  void compute_record(Event event) override { record(compute_, event); }

  void record_on(Event event, void*) override {
    auto* e = static_cast<EmulatedEvent*>(event);
    e->complete(e->record());
  }
  void synchronize(Event event) override {
    auto* e = static_cast<EmulatedEvent*>(event);
    e->wait_for(e->last_recorded());
  }
  bool query(Event event) override {
    auto* e = static_cast<EmulatedEvent*>(event);
    std::lock_guard lock(e->mutex);
    return e->completed >= e->recorded;
  }
  void* native_event(Event) override { return nullptr; }
  void synchronize_all() override {
    copy_.drain();
    compute_.drain();
  }

 private:
  static void record(EmulatedStream& stream, Event event) {
    auto* e = static_cast<EmulatedEvent*>(event);
    stream.enqueue([e, generation = e->record()] { e->complete(generation); });
  }
  static void wait_on(EmulatedStream& stream, Event event) {
    auto* e = static_cast<EmulatedEvent*>(event);
    stream.enqueue([e, generation = e->last_recorded()] { e->wait_for(generation); });
  }

  std::string name_;
  EmulatedStream copy_, compute_;
};

class EmulatedBackend final : public Backend {
 public:
  explicit EmulatedBackend(int devices) : devices_(devices) {}
  bool emulated() const override { return true; }
  int device_count() const override { return devices_; }
  std::unique_ptr<Lane> open_lane(int ordinal) override {
    if (ordinal < 0 || ordinal >= devices_)
      throw ParamError("device " + std::to_string(ordinal) + " does not exist: `emulate` made " + std::to_string(devices_) +
                       " emulated devices (0.." + std::to_string(devices_ - 1) + ")");
    return std::make_unique<EmulatedLane>(ordinal);
  }
  std::byte* allocate_pinned(std::size_t bytes) override {
    return static_cast<std::byte*>(::operator new(bytes ? bytes : 1, std::align_val_t{64}));
  }
  void free_pinned(std::byte* block) override { ::operator delete(block, std::align_val_t{64}); }

 private:
  int devices_;
};

}  // namespace

std::shared_ptr<Backend> make_emulated_backend(int devices) { return std::make_shared<EmulatedBackend>(devices); }

}  // namespace sluice::cuda
