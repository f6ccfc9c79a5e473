#pragma once
// The standard operators, grouped by file; each file registers its own.
#include "sluice/sdk.hpp"

namespace sluice::std_ops {

void register_sources(Registrar& registrar);     // range, from_list, tensors
void register_elementwise(Registrar& registrar); // identity, prefetch, shard, filter_random, simulate_work
void register_iteration(Registrar& registrar);   // repeat, take, skip
void register_shuffle(Registrar& registrar);     // shuffle
void register_batching(Registrar& registrar);    // batch, unbatch
void register_cache(Registrar& registrar);       // cache
void register_sinks(Registrar& registrar);       // null_sink, jsonl_sink

}  // namespace sluice::std_ops
