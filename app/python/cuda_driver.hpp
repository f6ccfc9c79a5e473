#pragma once
#include <cstdint>
#include <string>

namespace sluice::python {

// Makes a consumer's CUDA stream wait for an event (a feed slice's copies, FeedSlice::ready_event)
// through the NVIDIA driver, opened the first time it is needed: the module links no CUDA, and
// the handles the gpu_feed plugin's runtime made are the driver's. `stream` is a DLPack stream
// value (1 the legacy default stream, 2 the per-thread one, else a cudaStream_t); the sentinels
// mean the streams of device `ordinal`'s primary context, which is made current for the call.
// False, with the reason in `why`, when the driver or the call failed: wait on the host then.
bool cuda_stream_wait_event(std::intptr_t stream, void* event, int ordinal, std::string& why);

}  // namespace sluice::python
