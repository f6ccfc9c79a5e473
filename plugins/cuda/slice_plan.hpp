#pragma once
// How one global batch is cut into per-device slices (MirroredStrategy's towers): contiguous
// rows, device d's slice before device d+1's, so that concatenating the slices in device order
// gives the batch back.
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::cuda {

enum class RemainderPolicy {
  Drop,    // every device gets floor(B/N) rows; the last B mod N rows are dropped
  Pad,     // every device gets ceil(B/N) rows; rows past the batch are zeros (valid_rows says so)
  Uneven,  // the first B mod N devices get one row more
};

struct SliceRange {
  std::int64_t first = 0;  // row of the global batch
  std::int64_t rows = 0;   // rows of the device tensors
  std::int64_t valid = 0;  // rows taken from the batch (rows - valid are padding)
};

RemainderPolicy parse_remainder_policy(const std::string& name);

// One range per device. Empty when the policy leaves nothing to send (drop, with fewer rows
// than devices): the batch is then skipped on every device, so that devices stay in step.
std::vector<SliceRange> plan_slices(std::int64_t batch_rows, int devices, RemainderPolicy policy);

}  // namespace sluice::cuda
