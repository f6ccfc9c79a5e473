// `sluice replay`: one step of a run made again, exactly as the run made it, written where the
// pipeline's sink was. Directly when the pipeline can (Engine::replay: a source that starts
// anywhere, maps, one batch), else by running its epoch to the step (select_step). And `sluice
// lineage`: the records that step is made of, the same way.
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include <unistd.h>

#include "cli.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/element_queue.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/lineage.hpp"
#include "sluice/core/prepare.hpp"
#include "sluice/core/text.hpp"

namespace sluice_cli {
namespace {

// The pipeline's one sink replaced by operator `op` with `params`.
void replace_sink(sluice::PipelineDocument& doc, const sluice::Registry& registry, const std::string& op,
                  const std::map<std::string, std::string>& params) {
  int sinks = 0;
  for (auto& st : *doc.spec.mutable_stage()) {
    const auto registered = registry.find(st.op());
    if (!registered || registered->info.kind != sluice::OperatorKind::Sink) continue;
    ++sinks;
    st.set_op(op);
    st.clear_params();
    st.clear_parallelism();
    for (const auto& [name, value] : params) (*st.mutable_params())[name] = value;
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


// The engine making step `request.step` of epoch `request.epoch` with the pipeline's sink
// replaced as `sink` says: directly when it can, else by running the epoch to it (`why` then says
// why). Null where the pipeline does not load (its problems printed).
std::unique_ptr<sluice::Engine> start_step(const sluice::Registry& registry, const std::string& file, const std::vector<std::string>& sets,
                                           std::optional<std::uint64_t> seed, const WorkerArgs& worker_args,
                                           const std::function<void(sluice::PipelineDocument&)>& sink, const ReplayRequest& request,
                                           bool lineage, std::string& why) {
  auto graph = load_graph(registry, file, sets, seed, worker_args, nullptr, sink);
  if (!graph) return nullptr;
  sluice::EngineOptions options;
  options.first_epoch = request.epoch;
  options.worker_count = graph->worker.count;
  options.worker_index = graph->worker.index;
  options.lineage = lineage;
  auto engine = std::make_unique<sluice::Engine>(sluice::Graph(*graph), options);
  why = engine->why_not_replayed_directly();
  if (why.empty()) {
    engine->replay({request.epoch, request.step});
    return engine;
  }
  fmt::print(stderr, "note: {}: step {} is made by running epoch {} to it\n", sluice::printable(why), request.step, request.epoch);
  graph = load_graph(registry, file, sets, seed, worker_args, nullptr, [&](sluice::PipelineDocument& doc) {
    sink(doc);
    sluice::select_step(doc, registry, request.step);
  });
  if (!graph) return nullptr;
  engine = std::make_unique<sluice::Engine>(std::move(*graph), options);
  engine->start();
  return engine;
}

int no_such_step(const ReplayRequest& request) {
  fmt::print(stderr, "error: epoch {} has no step {}: its outputs end before (a step counts from 0 in its epoch)\n", request.epoch,
             request.step);
  return kExitRunFailed;
}

// A checkpoint (file or folder) names its pipeline file and seed: a step of its run.
void from_checkpoint(std::string& file, std::optional<std::uint64_t>& seed) {
  std::filesystem::path path = file;
  if (std::filesystem::is_directory(path)) {
    path /= "checkpoint.sluice";
    if (!std::filesystem::is_regular_file(path))
      throw sluice::Error(fmt::format("no checkpoint at {} (give a pipeline file, or the folder --checkpoint wrote to)", path.string()));
  }
  if (!std::filesystem::is_regular_file(path) || path.extension() == ".txtpb") return;
  sluice::checkpoint::Checkpoint checkpoint;
  try {
    checkpoint = sluice::read_checkpoint(path);
  } catch (const std::exception&) {
    return;  // (not a checkpoint: read as a pipeline file, whose problems are then named)
  }
  if (checkpoint.pipeline_file().empty()) throw sluice::Error(fmt::format("{} does not name its pipeline file (a Python state?): give the pipeline file", path.string()));
  file = checkpoint.pipeline_file();
  if (!seed) seed = checkpoint.seed();
  fmt::print(stderr, "note: the run of checkpoint {}: {} (seed {})\n", path.string(), file, *seed);
}

// One record of a step's lineage, as `sluice lineage` prints it.
void print_record(const sluice::RecordLineage& record, std::size_t row, bool json, bool part) {
  const std::string source = record.where ? *record.where : std::string();
  if (!json) {
    if (record.record >= 0 && !source.empty()) fmt::print("{} {}\n", record.record, source);
    return;
  }
  std::string keys;
  for (const auto& key : record.keys) keys += fmt::format("{}{}: [{}, {}]", keys.empty() ? "" : ", ", json_string(*key.stage), key.epoch, key.index);
  fmt::print("{{\"row\": {}, \"source\": {}, \"record\": {}, \"byte_offset\": {}, \"epoch\": {}, \"keys\": {{{}}}{}}}\n", row,
             json_string(source), record.record, record.byte_offset, record.epoch ? std::to_string(*record.epoch) : "null", keys,
             part ? ", \"part\": true" : "");
}

}  // namespace

int cmd_replay(const CommonOptions& common, std::string file, const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
               const WorkerArgs& worker_args, const ReplayRequest& request) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  try {
    from_checkpoint(file, seed);
    const auto t0 = std::chrono::steady_clock::now();
    std::string why;
    auto engine = start_step(registry, file, sets, seed, worker_args, [&](sluice::PipelineDocument& doc) {
      replace_sink(doc, registry, "jsonl_sink", {{"path", std::filesystem::absolute(request.out).string()}});
    },
                             request, false, why);
    if (!engine) return kExitBadInput;
    const auto result = engine->wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (result.state == sluice::RunState::Failed) {
      fmt::print(stderr, "error: {}\n", sluice::printable(result.error, true));
      return kExitRunFailed;
    }
    if (sink_inputs(*engine) == 0) {
      std::error_code ec;
      std::filesystem::remove(request.out, ec);
      return no_such_step(request);
    }
    fmt::print(stderr, "step {} of epoch {} written to {} ({} in {:.3f} s)\n", request.step, request.epoch, request.out,
               why.empty() ? "made directly" : fmt::format("after the {} outputs before it", request.step), seconds);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

int cmd_lineage(const CommonOptions& common, std::string file, const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
                const WorkerArgs& worker_args, const ReplayRequest& request, bool json) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  // The step's element reaches this process through a queue in place of the sink.
  static const char* const kCapture = "lineage_capture";
  sluice::OperatorInfo capture;
  capture.name = kCapture;
  capture.kind = sluice::OperatorKind::Sink;
  capture.summary = "Hands the step `sluice lineage` asked for to it";
  capture.params = {sluice::ParamSpec::make("queue", sluice::ParamType::String, "the queue").def("")};
  capture.create = [](const sluice::Params& p) { return std::make_unique<sluice::QueueSink>(p); };
  registry.add_host_operator(std::move(capture), "cli");
  const std::string handle = fmt::format("lineage:{}", ::getpid());
  auto queue = std::make_shared<sluice::ElementQueue>(4);
  sluice::register_element_queue(handle, queue);
  try {
    from_checkpoint(file, seed);
    std::string why;
    auto engine = start_step(
        registry, file, sets, seed, worker_args, [&](sluice::PipelineDocument& doc) { replace_sink(doc, registry, kCapture, {{"queue", handle}}); },
        request, true, why);
    if (!engine) return kExitBadInput;
    std::optional<sluice::Sample> step;
    for (bool ended = false;;) {  // (to the queue's close: the sink finished, or the engine's end)
      sluice::Sample got;
      const auto popped = queue->pop(got, std::chrono::milliseconds(ended ? 0 : 50));
      if (popped == sluice::ElementQueue::Pop::Item && !step) step = std::move(got);
      if (popped == sluice::ElementQueue::Pop::Closed || (popped == sluice::ElementQueue::Pop::TimedOut && ended)) break;
      if (popped == sluice::ElementQueue::Pop::TimedOut) ended = engine->wait_for(std::chrono::milliseconds(0));
    }
    const auto result = engine->wait();
    sluice::forget_element_queue(handle);
    if (result.state == sluice::RunState::Failed) {
      fmt::print(stderr, "error: {}\n", sluice::printable(result.error, true));
      return kExitRunFailed;
    }
    if (!step) return no_such_step(request);
    const auto rows = sluice::lineage_of(step->shared_origin());
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (const auto& record : rows[r].parts) print_record(record, r, json, rows[r].zipped);
    fmt::print(stderr, "step {} of epoch {}: {} row(s){}\n", request.step, request.epoch, rows.size(),
               why.empty() ? ", made directly" : fmt::format(", after the {} outputs before it", request.step));
    return 0;
  } catch (const std::exception& e) {
    sluice::forget_element_queue(handle);
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

}  // namespace sluice_cli
