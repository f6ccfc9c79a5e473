#pragma once
// What gpu_feed needs from a device, behind one interface with two implementations: CUDA
// (cuda_backend.cpp) and host emulation (emulated_backend.cpp). The feed's splitting, ring,
// ordering and release code is the same for both; only the copies differ.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sluice::cuda {

// An event as CUDA defines it: record() captures the work enqueued so far on a stream; waiting
// on it waits for that work. An event never recorded counts as complete.
using Event = void*;

// One logical device: a copy stream (host to device) and a compute stream (the headless
// consumers: checksum, simulated training step). Several lanes may share one device.
// Called from one thread at a time, except synchronize() and query().
class Lane {
 public:
  virtual ~Lane() = default;
  virtual std::string name() const = 0;
  virtual void* allocate(std::size_t bytes) = 0;  // device memory
  virtual void deallocate(void* device) = 0;
  virtual Event create_event() = 0;
  // An event that also keeps when its stream reached it, for elapsed_seconds() (CUDA's timing
  // events: slower to wait on than create_event()'s, so only the copies' bounds use them).
  virtual Event create_timing_event() = 0;
  virtual void destroy_event(Event event) = 0;
  // Seconds between two completed timing events recorded on one stream: device time, free of
  // the host's scheduling (the copies' own duration, not when the feed's thread saw them end).
  virtual double elapsed_seconds(Event from, Event to) = 0;

  // Copy stream.
  virtual void copy_wait(Event event) = 0;  // later copies wait for the event's work
  virtual void copy_to_device(void* device, const void* pinned_host, std::size_t bytes) = 0;
  virtual void zero(void* device, std::size_t bytes) = 0;
  virtual void copy_record(Event event) = 0;

  // Compute stream. checksum() leaves the checksum (checksum.hpp) of `bytes` device bytes in
  // *host_result (pinned) once the stream gets there; `scratch` is 8 bytes of device memory.
  virtual void compute_wait(Event event) = 0;
  virtual void checksum(const void* device, std::size_t bytes, void* scratch, std::uint64_t* host_result) = 0;
  virtual void spin(std::uint32_t microseconds) = 0;
  virtual void compute_record(Event event) = 0;

  // Records the event on an application stream (a cudaStream_t); null: complete at once.
  virtual void record_on(Event event, void* stream) = 0;

  virtual void synchronize(Event event) = 0;  // blocks until the event's work is done
  virtual bool query(Event event) = 0;        // true when the event's work is done
  virtual void* native_event(Event event) = 0;  // the cudaEvent_t, or null under emulation
  virtual void synchronize_all() = 0;           // both streams drained
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual bool emulated() const = 0;
  virtual int device_count() const = 0;
  virtual std::unique_ptr<Lane> open_lane(int ordinal) = 0;
  // Page-locked host memory that every device can copy from.
  virtual std::byte* allocate_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(std::byte* block) = 0;
};

// `devices` emulated devices: host memory, and a thread per stream that runs its work in order.
std::shared_ptr<Backend> make_emulated_backend(int devices);
// The CUDA runtime. Throws Error naming what is missing (no driver, no device, a build without
// CUDA) and suggesting `emulate`.
std::shared_ptr<Backend> make_cuda_backend();

}  // namespace sluice::cuda
