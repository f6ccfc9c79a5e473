#include "sluice/core/process.hpp"

#include <malloc.h>

namespace sluice {

void tune_process_for_streaming() {
  // Blocks up to 64 MiB come from the heap (a batch of 64 224x224x3 floats is 38 MiB), and the
  // heap keeps up to 256 MiB of freed memory for reuse rather than giving it back at once.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace sluice
