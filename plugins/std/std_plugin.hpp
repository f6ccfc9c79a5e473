#pragma once
// The standard operators, grouped by file; each file registers its own.
#include <algorithm>
#include <string>

#include "sluice/sdk.hpp"

namespace sluice::std_ops {

void register_sources(Registrar& registrar);     // range, from_list, tensors
void register_elementwise(Registrar& registrar); // identity, prefetch, standardize, filter_random, simulate_work
void register_iteration(Registrar& registrar);   // repeat, take, skip, repeat_each
void register_sharding(Registrar& registrar);    // shard, balanced_shard
void register_shuffle(Registrar& registrar);     // shuffle
void register_batching(Registrar& registrar);    // batch, unbatch
void register_cache(Registrar& registrar);       // cache
void register_sinks(Registrar& registrar);       // null_sink, jsonl_sink
void register_combinators(Registrar& registrar); // zip, concatenate, sample_from_datasets, choose_from_datasets, split
// padded_batch, ragged_batch, bucket_by_sequence_length, window, window_field (and pack_sequences)
void register_sequences(Registrar& registrar);
void register_packing(Registrar& registrar);     // pack_sequences
void register_field_ops(Registrar& registrar);   // select_fields, split_text, stack_fields

// shard's and balanced_shard's count and index: -1 (the default) is this worker's, filled by the
// host from the worker identity; a host that fills nothing gets one shard.
inline ParamSpec shard_count_param() {
  return ParamSpec::make("num_shards", ParamType::Int, "number of shards; -1: the number of workers of the job")
      .def("-1")
      .range(-1, std::nullopt)
      .takes_hint("num_workers");
}
inline ParamSpec shard_index_param() {
  return ParamSpec::make("index", ParamType::Int, "this worker's shard, 0 <= index < num_shards; -1: this worker's index")
      .def("-1")
      .range(-1, std::nullopt)
      .takes_hint("worker_index");
}
inline std::int64_t shard_count(const Params& p) {
  const std::int64_t n = p.get_int("num_shards");
  if (n == 0) throw ParamError("num_shards is 0; use 1 or more, or -1 for the number of workers");
  return n < 0 ? 1 : n;
}
inline std::int64_t shard_index(const Params& p, std::int64_t shards) {
  const std::int64_t index = std::max<std::int64_t>(0, p.get_int("index"));
  if (index >= shards)
    throw ParamError("index " + std::to_string(index) + " must be less than num_shards " + std::to_string(shards));
  return index;
}

}  // namespace sluice::std_ops
