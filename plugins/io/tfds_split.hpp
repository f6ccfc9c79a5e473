#pragma once
// TFDS's split grammar (`tfds.load(..., split=...)`), resolved against a dataset's splits as TFDS
// resolves it: `train`, `train[:4000]`, `train[-1000:]`, `train[25%:75%]` (fractions of a percent
// too), `train[:4shard]`, `train[4shard]`, unions `train[:25%]+test`, `all`; percent boundaries
// rounded to the closest example (halves to even, as Python's round) or, with
// pct1_dropremainder, in whole 1% steps. Only the shard lengths are needed, no shard is read.
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::io {

struct SplitShards {
  std::string name;
  std::vector<std::uint64_t> shard_lengths;  // examples in each shard, in shard order
};

enum class SplitRounding { Closest, Pct1DropRemainder };

// Examples [from, to) of one split, in its order.
struct SplitRange {
  std::string split;
  std::uint64_t from = 0, to = 0;
};

// What to read of one shard: `take` examples after the first `skip`.
struct ShardRead {
  std::string split;
  std::size_t shard = 0;
  std::uint64_t skip = 0, take = 0;
};

// The ranges `spec` selects, in its order; throws ParamError naming the part of `spec` that is
// malformed, the split that does not exist (with those that do) or the slice that exceeds it.
std::vector<SplitRange> resolve_split(const std::string& spec, const std::vector<SplitShards>& splits,
                                      SplitRounding rounding = SplitRounding::Closest);

// The shards a range touches, each with what to skip and take: only these need opening.
std::vector<ShardRead> shard_reads(const SplitRange& range, const SplitShards& split);

}  // namespace sluice::io
