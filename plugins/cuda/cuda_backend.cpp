// The CUDA runtime behind gpu_feed: a copy stream and a compute stream per lane, events without
// timing except the copies' bounds, pinned memory portable to every device. Errors name the call,
// the device and CUDA's reason; a missing driver or device is a clear error suggesting `emulate`,
// never a crash.
#include <cuda_runtime.h>

#include <string>

#include "device_backend.hpp"
#include "kernels.hpp"
#include "sluice/error.hpp"

namespace sluice::cuda {
namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    throw Error(what + " failed: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")");
}

// Makes `ordinal` the calling thread's device for one call and restores the one it had: lanes
// are used from the feed's thread but also from the application's (release, the engine's
// destructor), whose current device is its own business.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    cudaGetDevice(&previous_);
    if (previous_ != ordinal) check(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")");
    else previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

class CudaLane final : public Lane {
 public:
  explicit CudaLane(int ordinal) : ordinal_(ordinal), name_("cuda:" + std::to_string(ordinal)) {
    DeviceScope scope(ordinal_);
    check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), where("cudaStreamCreate"));
    check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), where("cudaStreamCreate"));
  }
  ~CudaLane() override {
    DeviceScope scope(ordinal_);
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(compute_);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(compute_);
  }

  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes) override {
    DeviceScope scope(ordinal_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes ? bytes : 1), where("cudaMalloc of " + std::to_string(bytes) + " bytes"));
    return p;
  }
  void deallocate(void* device) override {
    DeviceScope scope(ordinal_);
    cudaFree(device);
  }
  Event create_event() override {
    DeviceScope scope(ordinal_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), where("cudaEventCreate"));
    return e;
  }
  Event create_timing_event() override {
    DeviceScope scope(ordinal_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), where("cudaEventCreate"));
    return e;
  }
  double elapsed_seconds(Event from, Event to) override {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)), where("cudaEventElapsedTime"));
    return ms / 1e3;
  }
  void destroy_event(Event event) override {
    DeviceScope scope(ordinal_);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }

  void copy_wait(Event event) override {
    check(cudaStreamWaitEvent(copy_, static_cast<cudaEvent_t>(event), 0), where("cudaStreamWaitEvent"));
  }
  void copy_to_device(void* device, const void* host, std::size_t bytes) override {
    DeviceScope scope(ordinal_);
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, copy_), where("cudaMemcpyAsync"));
  }
  void zero(void* device, std::size_t bytes) override {
    DeviceScope scope(ordinal_);
    check(cudaMemsetAsync(device, 0, bytes, copy_), where("cudaMemsetAsync"));
  }
  void copy_record(Event event) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), copy_), where("cudaEventRecord"));
  }

  void compute_wait(Event event) override {
    check(cudaStreamWaitEvent(compute_, static_cast<cudaEvent_t>(event), 0), where("cudaStreamWaitEvent"));
  }
  void checksum(const void* device, std::size_t bytes, void* scratch, std::uint64_t* host_result) override {
    DeviceScope scope(ordinal_);
    check(launch_checksum(device, bytes, static_cast<std::uint64_t*>(scratch), compute_), where("checksum kernel"));
    check(cudaMemcpyAsync(host_result, scratch, sizeof(std::uint64_t), cudaMemcpyDeviceToHost, compute_),
          where("cudaMemcpyAsync of a checksum"));
  }
  void spin(std::uint32_t microseconds) override {
    DeviceScope scope(ordinal_);
    check(launch_spin(microseconds, compute_), where("training-step kernel"));
  }
  void compute_record(Event event) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), compute_), where("cudaEventRecord"));
  }

  void record_on(Event event, void* stream) override {
    if (stream) {
      check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), where("cudaEventRecord"));
      return;
    }
    // No stream: the caller's reads are done. Record on this device's default stream, from the
    // caller's thread, leaving its current device as it was.
    DeviceScope scope(ordinal_);
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), nullptr), where("cudaEventRecord"));
  }
  void synchronize(Event event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), where("cudaEventSynchronize"));
  }
  bool query(Event event) override {
    cudaError_t s = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (s == cudaErrorNotReady) return false;
    check(s, where("cudaEventQuery"));
    return true;
  }
  void* native_event(Event event) override { return event; }
  void synchronize_all() override {
    check(cudaStreamSynchronize(copy_), where("cudaStreamSynchronize"));
    check(cudaStreamSynchronize(compute_), where("cudaStreamSynchronize"));
  }

 private:
  std::string where(const std::string& call) const { return call + " on " + name_; }

  int ordinal_;
  std::string name_;
  cudaStream_t copy_ = nullptr, compute_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int devices) : devices_(devices) {}
  bool emulated() const override { return false; }
  int device_count() const override { return devices_; }
  std::unique_ptr<Lane> open_lane(int ordinal) override {
    if (ordinal < 0 || ordinal >= devices_)
      throw ParamError("CUDA device " + std::to_string(ordinal) + " does not exist: this machine has " + std::to_string(devices_) +
                       " (ordinals 0.." + std::to_string(devices_ - 1) + "; CUDA_VISIBLE_DEVICES may hide others)");
    return std::make_unique<CudaLane>(ordinal);
  }
  std::byte* allocate_pinned(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable), "cudaHostAlloc of " + std::to_string(bytes) + " pinned bytes");
    return static_cast<std::byte*>(p);
  }
  void free_pinned(std::byte* block) override { cudaFreeHost(block); }

 private:
  int devices_;
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0))
    throw Error("no CUDA device found (cudaGetDeviceCount: " + std::string(cudaGetErrorString(status)) +
                "); set `emulate: N` to run the feed on N emulated devices in host memory");
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice || status == cudaErrorInitializationError ||
      status != cudaSuccess)
    throw Error("the CUDA driver is missing or cannot be used (cudaGetDeviceCount: " + std::string(cudaGetErrorString(status)) +
                "); install the NVIDIA driver, or set `emulate: N` to run the feed on N emulated devices in host memory");
  return std::make_shared<CudaBackend>(count);
}

}  // namespace sluice::cuda
