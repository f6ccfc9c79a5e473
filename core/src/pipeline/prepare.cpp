// prepare_pipeline: a pipeline file made the graph a run builds (sluice/core/prepare.hpp).
#include "sluice/core/prepare.hpp"

#include <fmt/format.h>

#include "sluice/core/text.hpp"

namespace sluice {

void prepare_document(PipelineDocument& doc, const PrepareOptions& options) {
  apply_overrides(doc, options.sets);
  if (options.seed) doc.spec.mutable_options()->set_seed(*options.seed);
  if (options.split_distributed) options.split_distributed(doc);
}

namespace {

// What was asked for, else the pipeline's own options.
WorkerRequest worker_request(const PipelineDocument& doc, const WorkerRequest& asked) {
  if (asked.index || asked.count) return asked;
  const auto& options = doc.spec.options();
  if (!options.has_worker_index() && !options.has_num_workers()) return asked;
  WorkerRequest request = asked;
  if (options.has_worker_index()) request.index = options.worker_index();
  if (options.has_num_workers()) request.count = options.num_workers();
  request.given_by = fmt::format("options of {} (worker_index, num_workers)", printable(doc.file));
  return request;
}

}  // namespace

PreparedPipeline prepare_pipeline(PipelineDocument doc, const Registry& registry, const PrepareOptions& options) {
  if (!options.skip_records.empty()) skip_named_records(doc, registry, options.skip_records);
  prepare_document(doc, options);
  if (options.adapt) options.adapt(doc);
  PreparedPipeline out;
  out.worker = detect_worker_identity(process_environment(), worker_request(doc, options.worker));
  out.plan = plan_for_worker(doc, registry, out.worker);
  out.graph = build_graph(doc, registry);
  out.doc = std::move(doc);
  return out;
}

}  // namespace sluice
