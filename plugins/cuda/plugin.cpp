#include "gpu_feed.hpp"

SLUICE_PLUGIN("cuda", "1.0.0", "Feeds batches to GPUs: per-device slices, pinned staging, streams and rings (or emulated devices)") {
  sluice::cuda::register_gpu_feed(registrar);
}
