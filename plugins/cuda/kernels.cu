#include <algorithm>

#include "checksum.hpp"
#include "kernels.hpp"

namespace sluice::cuda {
namespace {

// Grid-stride over 8-byte words (slot fields start 256-byte aligned), one atomic add per block.
__global__ void checksum_kernel(const unsigned char* data, std::size_t bytes, unsigned long long* result) {
  const std::size_t words = (bytes + 7) / 8, full = bytes / 8;
  const auto* whole = reinterpret_cast<const std::uint64_t*>(data);
  std::uint64_t sum = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint64_t w = 0;
    if (i < full) {
      w = whole[i];
    } else {
      for (std::size_t b = 0; b < 8 && i * 8 + b < bytes; ++b) w |= static_cast<std::uint64_t>(data[i * 8 + b]) << (8 * b);
    }
    sum += checksum_mix(w, i);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ std::uint64_t warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) atomicAdd(result, static_cast<unsigned long long>(sum));
  }
}

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  std::uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

cudaError_t launch_checksum(const void* data, std::size_t bytes, std::uint64_t* scratch, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(scratch, 0, sizeof(std::uint64_t), stream);
  if (status != cudaSuccess || bytes == 0) return status;
  constexpr int kThreads = 256;
  const std::size_t words = (bytes + 7) / 8;
  const int blocks = static_cast<int>(std::min<std::size_t>((words + kThreads - 1) / kThreads, 1024));
  checksum_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const unsigned char*>(data), bytes,
                                                   reinterpret_cast<unsigned long long*>(scratch));
  return cudaGetLastError();
}

cudaError_t launch_spin(std::uint32_t microseconds, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<std::uint64_t>(microseconds) * 1000);
  return cudaGetLastError();
}

}  // namespace sluice::cuda
