#pragma once
// The device code of gpu_feed (kernels.cu), callable from plain C++.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sluice::cuda {

// Zeroes *scratch, then adds the checksum (checksum.hpp) of `bytes` bytes at `data` into it.
cudaError_t launch_checksum(const void* data, std::size_t bytes, std::uint64_t* scratch, cudaStream_t stream);
// Keeps the stream busy for `microseconds` (a simulated training step).
cudaError_t launch_spin(std::uint32_t microseconds, cudaStream_t stream);

}  // namespace sluice::cuda
