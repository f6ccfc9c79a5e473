// Built instead of cuda_backend.cpp when CMake found no CUDA toolkit: emulation still works.
#include "device_backend.hpp"
#include "sluice/error.hpp"

namespace sluice::cuda {

std::shared_ptr<Backend> make_cuda_backend() {
  throw Error("this build of the cuda plugin has no CUDA support (no CUDA toolkit was found when it was configured); "
              "rebuild where nvcc is on PATH, or set `emulate: N` to run the feed on N emulated devices in host memory");
}

}  // namespace sluice::cuda
