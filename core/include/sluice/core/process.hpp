#pragma once

namespace sluice {

// Process-wide settings for a streaming run, for programs that host the engine (the CLI, the app,
// benchmarks): large buffers (decoded images, batches) are allocated and freed at a steady rate
// on different threads; keeping them in malloc's heap instead of fresh mmap pages avoids a page
// fault per 4 KiB on every element. Call once, early.
void tune_process_for_streaming();

}  // namespace sluice
