#include "cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>

namespace sluice::python {
namespace {

// The few driver entry points needed, by their exported names (the _v2 ones are what cuda.h maps
// the plain names to). CUresult is an int; 0 is CUDA_SUCCESS.
struct Driver {
  using DeviceGet = int (*)(int*, int);
  using PrimaryCtxRetain = int (*)(void**, int);
  using PrimaryCtxRelease = int (*)(int);
  using CtxPush = int (*)(void*);
  using CtxPop = int (*)(void**);
  using StreamWaitEvent = int (*)(void*, void*, unsigned);

  DeviceGet device_get = nullptr;
  PrimaryCtxRetain retain = nullptr;
  PrimaryCtxRelease release = nullptr;
  CtxPush push = nullptr;
  CtxPop pop = nullptr;
  StreamWaitEvent stream_wait_event = nullptr;
  std::string error;  // why it could not be loaded

  Driver() {
    void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      const char* reason = ::dlerror();
      error = std::string("cannot open the NVIDIA driver (libcuda.so.1): ") + (reason ? reason : "unknown reason");
      return;
    }
    // Kept open for the life of the process, as the CUDA runtime keeps it.
    bool found = find(library, "cuDeviceGet", device_get) && find(library, "cuDevicePrimaryCtxRetain", retain) &&
                 find(library, "cuDevicePrimaryCtxRelease_v2", release) && find(library, "cuCtxPushCurrent_v2", push) &&
                 find(library, "cuCtxPopCurrent_v2", pop) && find(library, "cuStreamWaitEvent", stream_wait_event);
    if (!found) stream_wait_event = nullptr;
  }

  template <class F>
  bool find(void* library, const char* name, F& out) {
    out = reinterpret_cast<F>(::dlsym(library, name));
    if (!out) error = std::string("the NVIDIA driver has no ") + name;
    return out != nullptr;
  }
};

const Driver& driver() {
  static const Driver loaded;
  return loaded;
}

}  // namespace

bool cuda_stream_wait_event(std::intptr_t stream, void* event, int ordinal, std::string& why) {
  const Driver& d = driver();
  if (!d.stream_wait_event) {
    why = d.error;
    return false;
  }
  int device = 0;
  void* context = nullptr;
  if (int r = d.device_get(&device, ordinal); r != 0) {
    why = "cuDeviceGet(" + std::to_string(ordinal) + ") failed with CUresult " + std::to_string(r);
    return false;
  }
  if (int r = d.retain(&context, device); r != 0) {
    why = "cuDevicePrimaryCtxRetain failed with CUresult " + std::to_string(r);
    return false;
  }
  int result = d.push(context);
  if (result == 0) {
    result = d.stream_wait_event(reinterpret_cast<void*>(stream), event, 0);
    void* popped = nullptr;
    d.pop(&popped);
  }
  d.release(device);
  if (result != 0) why = "cuStreamWaitEvent failed with CUresult " + std::to_string(result);
  return result == 0;
}

}  // namespace sluice::python
