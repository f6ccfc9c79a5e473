#include "slice_plan.hpp"

#include <algorithm>

#include "sluice/error.hpp"

namespace sluice::cuda {

RemainderPolicy parse_remainder_policy(const std::string& name) {
  if (name == "drop") return RemainderPolicy::Drop;
  if (name == "pad") return RemainderPolicy::Pad;
  if (name == "uneven") return RemainderPolicy::Uneven;
  throw ParamError("split: '" + name + "' is not a remainder policy (drop, pad or uneven)");
}

std::vector<SliceRange> plan_slices(std::int64_t batch_rows, int devices, RemainderPolicy policy) {
  std::vector<SliceRange> out;
  if (devices <= 0 || batch_rows < 0) return out;
  const std::int64_t n = devices, base = batch_rows / n, extra = batch_rows % n;
  switch (policy) {
    case RemainderPolicy::Drop:
      if (base == 0) return out;
      for (std::int64_t d = 0; d < n; ++d) out.push_back({d * base, base, base});
      break;
    case RemainderPolicy::Pad: {
      const std::int64_t per = base + (extra ? 1 : 0);
      for (std::int64_t d = 0; d < n; ++d) {
        const std::int64_t first = d * per;
        const std::int64_t valid = first >= batch_rows ? 0 : std::min(per, batch_rows - first);
        out.push_back({std::min(first, batch_rows), per, valid});
      }
      break;
    }
    case RemainderPolicy::Uneven: {
      std::int64_t first = 0;
      for (std::int64_t d = 0; d < n; ++d) {
        const std::int64_t rows = base + (d < extra ? 1 : 0);
        out.push_back({first, rows, rows});
        first += rows;
      }
      break;
    }
  }
  return out;
}

}  // namespace sluice::cuda
