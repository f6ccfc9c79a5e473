#pragma once
// `sluice bench`: steady-state throughput of a pipeline, and the ablation table that shows what
// each feature (parallelism, interleave, cache, prefetch) brings, as the tf.data performance
// guide's notebook does by hand.
#include <string>
#include <vector>

#include "metrics.pb.h"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace sluice {

struct BenchOptions {
  double warmup_s = 1.0;   // not measured: buffers fill, caches warm, threads settle
  double measure_s = 5.0;  // measured: per-stage rates over this window
};

struct BenchResult {
  double seconds = 0;            // length of the measured window
  bool finished_early = false;   // the pipeline ended before the window did: the whole run was measured
  std::string counted_stage;     // whose input is "the pipeline's" elements (the batch stage, else the sink)
  double elements_per_s = 0;     // into counted_stage
  metrics::MetricsSnapshot first, last;  // the window's ends
  std::vector<std::pair<std::string, double>> stage_rates;  // elements out per second, per stage
};

// Runs the pipeline for warm-up plus measurement, then stops it. Throws Error when it fails.
BenchResult run_bench(Graph graph, const BenchOptions& options);

struct AblationRow {
  std::string variant;  // "as written", "parallelism 1", "no interleave", "no cache", "no prefetch"
  std::string feature;  // what the variant takes away; empty for "as written"
  std::string change;   // what was changed, or why the row is empty
  bool applicable = false;
  double elements_per_s = 0;
  double speedup = 0;   // as written / this variant: what the feature brings
};

// The variants of a pipeline without each feature (rows whose feature the pipeline does not use
// say so and are not run).
std::vector<AblationRow> run_ablation(const PipelineDocument& doc, const Registry& registry, const BenchOptions& options);

std::string format_bench(const BenchResult& result);
std::string format_ablation(const std::vector<AblationRow>& rows);

}  // namespace sluice
