// `sluice replay`: one step of a run made again, exactly as the run made it, written where the
// pipeline's sink was. Directly when the pipeline can (Engine::replay: a source that starts
// anywhere, maps, one batch), else by running its epoch to the step (select_step).
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "cli.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/prepare.hpp"
#include "sluice/core/text.hpp"

namespace sluice_cli {
namespace {

// The pipeline's one sink replaced by a jsonl_sink writing `out`.
void write_to(sluice::PipelineDocument& doc, const sluice::Registry& registry, const std::string& out) {
  int sinks = 0;
  for (auto& st : *doc.spec.mutable_stage()) {
    const auto op = registry.find(st.op());
    if (!op || op->info.kind != sluice::OperatorKind::Sink) continue;
    ++sinks;
    st.set_op("jsonl_sink");
    st.clear_params();
    st.clear_parallelism();
    (*st.mutable_params())["path"] = std::filesystem::absolute(out).string();
  }
  if (sinks != 1)
    throw sluice::Error(fmt::format("{} ends in {} sinks; a step is one sink's input: keep the one to replay", doc.file, sinks));
}

std::uint64_t sink_inputs(const sluice::Engine& engine) {
  const auto snapshot = engine.snapshot();
  for (const auto& stage : snapshot.stage())
    if (stage.kind() == "sink") return stage.elements_in();
  return 0;
}

}  // namespace

int cmd_replay(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets,
               std::optional<std::uint64_t> seed, const WorkerArgs& worker_args, const ReplayRequest& request) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  try {
    auto to_out = [&](sluice::PipelineDocument& doc) { write_to(doc, registry, request.out); };
    auto graph = load_graph(registry, file, sets, seed, worker_args, nullptr, to_out);
    if (!graph) return kExitBadInput;
    sluice::EngineOptions options;
    options.first_epoch = request.epoch;
    options.worker_count = graph->worker.count;
    options.worker_index = graph->worker.index;
    const auto t0 = std::chrono::steady_clock::now();
    auto engine = std::make_unique<sluice::Engine>(sluice::Graph(*graph), options);
    const std::string why = engine->why_not_replayed_directly();
    if (why.empty()) {
      engine->replay({request.epoch, request.step});
    } else {
      fmt::print(stderr, "note: {}: step {} is made by running epoch {} to it\n", sluice::printable(why), request.step, request.epoch);
      graph = load_graph(registry, file, sets, seed, worker_args, nullptr, [&](sluice::PipelineDocument& doc) {
        to_out(doc);
        sluice::select_step(doc, registry, request.step);
      });
      if (!graph) return kExitBadInput;
      engine = std::make_unique<sluice::Engine>(std::move(*graph), options);
      engine->start();
    }
    const auto result = engine->wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (result.state == sluice::RunState::Failed) {
      fmt::print(stderr, "error: {}\n", sluice::printable(result.error, true));
      return kExitRunFailed;
    }
    if (sink_inputs(*engine) == 0) {
      std::error_code ec;
      std::filesystem::remove(request.out, ec);
      fmt::print(stderr, "error: epoch {} has no step {}: its outputs end before (a step counts from 0 in its epoch)\n", request.epoch,
                 request.step);
      return kExitRunFailed;
    }
    fmt::print(stderr, "step {} of epoch {} written to {} ({} in {:.3f} s)\n", request.step, request.epoch, request.out,
               why.empty() ? "made directly" : fmt::format("after the {} outputs before it", request.step), seconds);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

}  // namespace sluice_cli
