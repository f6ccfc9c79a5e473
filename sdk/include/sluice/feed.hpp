#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sluice/tensor.hpp"

namespace sluice {

/// The training loop's side of a feed sink (gpu_feed): it hands out each global batch as one
/// slice per logical device, already on its way into device memory. A slice stays valid until
/// it is released; slots of a device's ring are reused only after that, so the loop decides how
/// far the feed may run ahead (the ring's depth).

/// One field of a slice, in device memory (host memory under emulation).
struct DeviceTensor {
  std::string name;
  DType dtype = DType::U8;
  Shape shape;  ///< [rows, ...]: the slice's rows, padding included
  void* data = nullptr;
  std::size_t nbytes = 0;
};

struct FeedSlice {
  std::uint64_t batch = 0;   ///< index of the global batch in the run, from 0
  int device = 0;            ///< logical device, 0 .. Feed::devices() - 1
  int ordinal = 0;           ///< the CUDA device (or emulated device) behind it
  std::int64_t first_row = 0;   ///< of the global batch
  std::int64_t rows = 0;        ///< rows in the tensors
  std::int64_t valid_rows = 0;  ///< rows that hold data; under `split: pad` the rest are zeros
  std::vector<DeviceTensor> fields;
  /// A cudaEvent_t recorded after the slice's copies: make the training stream wait on it
  /// (cudaStreamWaitEvent) before reading the tensors. Null under emulation: use wait_ready().
  void* ready_event = nullptr;
  std::uint64_t ticket = 0;  ///< identifies the slot for release()
};

enum class FeedStatus {
  Ready,     ///< `out` holds the next slice of the device
  End,       ///< the pipeline finished and every slice of this device was handed out
  Stopped,   ///< the run stopped or failed (Engine::wait() tells why)
  TimedOut,  ///< nothing arrived within the timeout; ask again
};

/// What the feed allocated, for proving that a steady state allocates nothing.
struct FeedAllocations {
  std::uint64_t pinned_fresh = 0;    ///< pinned host blocks allocated
  std::uint64_t pinned_reused = 0;   ///< pinned host blocks handed out again from the pool
  std::uint64_t device_buffers = 0;  ///< device buffers allocated (or grown) for ring slots
  std::uint64_t staged_batches = 0;  ///< batches that arrived outside pinned memory and were copied once more
};

/// The copies to one device whose work is done: their bytes and the device time they took.
struct DeviceCopyTime {
  std::uint64_t bytes = 0;
  double seconds = 0;
};

/// (6.12) A feed sink that times its copies on each device (CUDA events recorded before and after
/// each slice's copies, on the copy stream), in device_counters()' order. Bytes over seconds is
/// the rate of the copies themselves, whatever the host's threads did meanwhile. Found with
/// dynamic_cast; read from the metrics thread while the sink runs.
class TimesDeviceCopies {
 public:
  virtual ~TimesDeviceCopies() = default;
  virtual std::vector<DeviceCopyTime> device_copy_times() const = 0;
};

/// Thread-safe: one thread per device may call next() and release() concurrently.
class Feed {
 public:
  virtual ~Feed() = default;
  virtual int devices() const = 0;
  virtual bool emulated() const = 0;
  /// Waits up to `timeout` for the next slice of logical device `device`, in batch order.
  virtual FeedStatus next(int device, FeedSlice& out, std::chrono::milliseconds timeout) = 0;
  /// Blocks the calling thread until the slice's copies are complete (the host-side alternative to
  /// waiting on ready_event on a stream).
  virtual void wait_ready(const FeedSlice& slice) = 0;
  /// Gives the slice's slot back, in any order. `stream` (a cudaStream_t, or null) is where the
  /// loop enqueued the work that reads the slice: the slot is overwritten only after that work.
  virtual void release(const FeedSlice& slice, void* stream = nullptr) = 0;
  virtual FeedAllocations allocations() const = 0;
};

/// Per-device counters a feed sink publishes with its stage's metrics (read from the metrics
/// thread while the sink runs: implementations make them safe to read concurrently).
struct DeviceCounters {
  std::string name;  ///< "cuda:0", "emulated:1"
  std::uint64_t bytes = 0;   ///< copied to the device so far
  std::uint64_t slices = 0;  ///< slices handed to the device so far
  std::uint64_t checked = 0; ///< slices whose device checksum matched the host's (consume: checksum)
  std::uint32_t ring_level = 0;     ///< slots holding a slice not yet released
  std::uint32_t ring_capacity = 0;  ///< depth
};

}  // namespace sluice
