#pragma once
// One way from a pipeline file to the graph a run builds, for every face (the CLI, Python, the
// studio): overrides (`--set`), the seed, the stages a `distribute` sends to the service split off,
// this process's place among the job's workers and its share of the data, then validation into the
// graph. A face differs only in what it passes here.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sluice/core/spec.hpp"
#include "sluice/core/workers.hpp"

namespace sluice {

struct PrepareOptions {
  std::vector<std::string> sets;  // STAGE.PARAM=VALUE overrides (apply_overrides)
  std::optional<std::uint64_t> seed;
  // This process's place among the job's workers as asked for; where nothing is asked, the
  // pipeline's own options (worker_index, num_workers), then the launcher's environment.
  WorkerRequest worker;
  // Splits off the stages a `distribute` sends to the Sluice service (service::split_at_service,
  // which only faces linking the service have); none: such stages run here.
  std::function<void(PipelineDocument&)> split_distributed;
  // What the face changes before the worker's plan is made (Python's iterator in place of the sink).
  std::function<void(PipelineDocument&)> adapt;
  // Records to skip (skip_named_records), "RECORD SOURCE" per line; empty: none.
  std::string skip_records;
};

struct PreparedPipeline {
  PipelineDocument doc;  // as it runs
  WorkerIdentity worker;
  WorkerPlan plan;       // how the pipeline was made this worker's (notes, warnings)
  Graph graph;
};

// Overrides, seed and the service's split, applied to `doc`. Throws SpecError.
void prepare_document(PipelineDocument& doc, const PrepareOptions& options);

// prepare_document, then the worker's identity and plan, then the graph. Throws SpecError (file,
// stage and parameter named) or WorkerIdentityError.
PreparedPipeline prepare_pipeline(PipelineDocument doc, const Registry& registry, const PrepareOptions& options);

// Replay by running (where Engine::replay cannot): the pipeline made to hand its sink only output
// `step` of its first epoch, with a skip and a take before the sink; the epoch is made again up to
// there. Throws Error when the pipeline has no one sink.
void select_step(PipelineDocument& doc, const Registry& registry, std::uint64_t step);

// Skipping a named set of records on the next run (the records lineage named): the host's
// drop_records filter (core/src/pipeline/record_skipping.cpp) placed before the first stage that
// batches, else before the sink, so that every other element comes in the order, and with the
// random draws, it would have had. `records`: "RECORD SOURCE" per line (a record's index in its
// file or object, and the file or object as lineage names it). Throws Error naming the line
// that does not read, or a pipeline with nowhere to place it.
void skip_named_records(PipelineDocument& doc, const Registry& registry, const std::string& records);
std::map<std::string, std::set<std::int64_t>> parse_named_records(const std::string& lines, const std::string& what);

}  // namespace sluice
