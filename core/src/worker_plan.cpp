// plan_for_worker: a pipeline written for one process, made the pipeline of one of N workers.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "sluice/core/spec.hpp"

namespace sluice {
namespace {

bool is_shard(const std::string& op) { return op == "shard" || op == "balanced_shard"; }

// The files a file list will list, asked of the source itself (it globs in start()); -1 when it
// cannot tell. A failure here is left to the run, which reports it with the stage named.
std::int64_t files_listed(const GraphStage& source, const Graph& graph) {
  try {
    auto op = source.op->info.create(source.params);
    auto* as_source = dynamic_cast<Source*>(op.get());
    if (!as_source) return -1;
    StageInfo info;
    info.id = source.id;
    info.seed = graph.seed;
    as_source->start(info);
    const std::int64_t n = as_source->expected_elements();
    as_source->finish(false);
    return n;
  } catch (...) {
    return -1;
  }
}

std::string unique_id(const PipelineDocument& doc, const std::string& wanted) {
  std::set<std::string> ids;
  for (const auto& st : doc.spec.stage()) ids.insert(st.id());
  std::string id = wanted;
  for (int k = 2; ids.count(id); ++k) id = fmt::format("{}_{}", wanted, k);
  return id;
}

// Puts a new stage reading `after` in front of everything that read it, and just after it in the
// file's order.
void insert_after(PipelineDocument& doc, const std::string& after, spec::Stage stage) {
  auto& stages = *doc.spec.mutable_stage();
  int at = 0;
  for (int i = 0; i < stages.size(); ++i) {
    for (auto& in : *stages[i].mutable_input())
      if (in == after) in = stage.id();
    if (stages[i].id() == after) at = i + 1;
  }
  stage.add_input(after);
  *stages.Add() = std::move(stage);
  for (int i = stages.size() - 1; i > at; --i) stages.SwapElements(i, i - 1);
  if (doc.stage_locations.size() + 1 == static_cast<std::size_t>(stages.size()))
    doc.stage_locations.insert(doc.stage_locations.begin() + at, {0, 0});
}

// Stages after `from` (up to the sink) that can drop or multiply elements, so that equal counts at
// the shard may still give different numbers of steps.
std::vector<std::string> uneven_after(const Graph& graph, int from) {
  std::vector<std::string> found;
  for (int c = graph.stages[from].sole_consumer(); c >= 0; c = graph.stages[c].sole_consumer()) {
    const auto& st = graph.stages[c];
    const auto kind = st.op->info.kind;
    if (kind == OperatorKind::Filter || kind == OperatorKind::Expand)
      found.push_back(fmt::format("{} '{}'", operator_kind_name(kind), st.id));
    else if (st.error_policy == ErrorPolicyKind::Skip && kind != OperatorKind::Sink)
      found.push_back(fmt::format("'{}' (skips bad elements)", st.id));
  }
  return found;
}

// Every worker writing one path would leave one worker's output and lose the others' (each
// replaces the file when it finishes): with several workers, output paths must hold {worker},
// unless the operator names its outputs by worker itself (it takes the worker_index hint).
void refuse_outputs_shared_by_workers(const PipelineDocument& doc, const Registry& registry, const WorkerIdentity& worker) {
  std::vector<Problem> problems;
  for (int i = 0; i < doc.spec.stage_size(); ++i) {
    const auto& st = doc.spec.stage(i);
    auto op = registry.find(st.op());
    if (!op) continue;  // validation says so
    bool names_by_worker = false;
    for (const auto& p : op->info.params)
      if (p.hint_role == ParamSpec::HintRole::Takes && p.hint == "worker_index") names_by_worker = true;
    if (names_by_worker) continue;
    for (const auto& p : op->info.params) {
      if (p.type != ParamType::OutputPath) continue;
      auto given = st.params().find(p.name);
      const std::string value = given != st.params().end() ? given->second : p.default_value.value_or("");
      if (value.empty() || value.find("{worker}") != std::string::npos) continue;
      Problem problem;
      problem.file = doc.file;
      if (i < static_cast<int>(doc.stage_locations.size())) std::tie(problem.line, problem.column) = doc.stage_locations[i];
      problem.stage = st.id();
      problem.param = p.name;
      problem.message = fmt::format("all {} workers would write {} and replace each other's output; put {{worker}} in it "
                                    "(e.g. --set {}.{}=out-{{worker}}.jsonl)",
                                    worker.count, value, st.id(), p.name);
      problems.push_back(std::move(problem));
    }
  }
  if (!problems.empty()) throw SpecError(problems);
}

}  // namespace

WorkerPlan plan_for_worker(PipelineDocument& doc, const Registry& registry, const WorkerIdentity& worker) {
  WorkerPlan plan;
  doc.worker = worker;
  auto finish = [&] {
    for (const auto& n : plan.notes) doc.worker_notes.push_back(n);
    for (const auto& w : plan.warnings) doc.worker_notes.push_back("warning: " + w);
    return plan;
  };
  const auto& options = doc.spec.options();
  const int n = worker.count;
  if (n <= 1) return finish();
  refuse_outputs_shared_by_workers(doc, registry, worker);
  const auto sharding = options.sharding();
  const auto equal = options.equal_steps();
  const std::string equal_name = equal == spec::pad ? "pad" : "drop";

  if (sharding == spec::off) {
    const auto seed = worker_seed(options.seed(), worker.index);
    doc.spec.mutable_options()->set_seed(seed);
    plan.notes.push_back(fmt::format("sharding: off: every worker reads the whole dataset, this one with seed {} (derived "
                                     "from the pipeline's seed {} and worker index {})",
                                     seed, options.seed(), worker.index));
    return finish();
  }

  // A pipeline that shards itself keeps its shard stages (their unset count and index are the
  // worker's); equal steps turn them into balanced ones.
  bool has_shard = false;
  for (auto& st : *doc.spec.mutable_stage()) {
    if (!is_shard(st.op())) continue;
    has_shard = true;
    auto given = st.params().find("num_shards");
    if (given != st.params().end() && given->second != "-1" && given->second != std::to_string(n))
      plan.warnings.push_back(fmt::format("stage '{}' keeps num_shards {} as written, not this job's {} workers; remove its "
                                          "num_shards and index to shard by worker",
                                          st.id(), given->second, n));
    if (equal != spec::EQUAL_STEPS_UNSET && st.op() == "shard") {
      st.set_op("balanced_shard");
      st.set_parallelism(0);
      (*st.mutable_params())["equal_steps"] = equal_name;
      plan.notes.push_back(fmt::format("stage '{}' is a balanced_shard (equal_steps: {}): every worker gets the same number "
                                       "of elements per epoch",
                                       st.id(), equal_name));
    }
  }
  if (has_shard) {
    if (equal != spec::EQUAL_STEPS_UNSET) {
      Graph graph = build_graph(doc, registry);
      for (int i = 0; i < static_cast<int>(graph.stages.size()); ++i) {
        if (!is_shard(graph.stages[i].op->info.name)) continue;
        auto uneven = uneven_after(graph, i);
        if (!uneven.empty())
          plan.warnings.push_back(fmt::format("equal steps are counted at stage '{}'; {} after it can still give workers "
                                              "different numbers of elements",
                                              graph.stages[i].id, fmt::join(uneven, ", ")));
      }
    }
    return finish();
  }

  if (!registry.find("shard") || !registry.find("balanced_shard"))
    throw SpecError({{doc.file, 0, 0, "", "",
                      fmt::format("{}: sharding needs the 'shard' and 'balanced_shard' operators of the std plugin, which "
                                  "is not loaded; load it, add a shard stage yourself, or set `options {{ sharding: off }}`",
                                  worker.describe())}});

  Graph graph = build_graph(doc, registry);
  // Every source gets its shard (a pipeline mixing several datasets shards each of them).
  auto shard_source = [&](int source) {
    const auto& src = graph.stages[source];
    const int reader = src.sole_consumer();
    const bool file_list = reader >= 0 && graph.stages[reader].op->info.kind == OperatorKind::Expand;
    const std::int64_t files = file_list ? files_listed(src, graph) : -1;

    bool by_file = false;
    std::string why;
    if (sharding == spec::by_file) {
      if (!file_list)
        throw SpecError({{doc.file, 0, 0, src.id, "",
                          fmt::format("options.sharding is by_file, but the source '{}' is not a file list read by an expand "
                                      "stage (a reader); use by_record or automatic",
                                      src.id)}});
      if (equal != spec::EQUAL_STEPS_UNSET)
        throw SpecError({{doc.file, 0, 0, "", "",
                          "options.sharding: by_file cannot give equal steps (files hold different numbers of records, "
                          "which no worker knows before reading them); use by_record or automatic with equal_steps"}});
      by_file = true;
      why = "options.sharding: by_file";
    } else if (sharding == spec::by_record || !file_list) {
      why = sharding == spec::by_record ? "options.sharding: by_record" : fmt::format("'{}' produces the records itself", src.id);
    } else if (equal != spec::EQUAL_STEPS_UNSET) {
      why = fmt::format("equal_steps: {} needs every worker to see every record's position", equal_name);
    } else if (files >= 0 && files < n) {
      why = fmt::format("{} file{} for {} workers", files, files == 1 ? "" : "s", n);
    } else {
      by_file = true;
      why = files >= 0 ? fmt::format("{} files for {} workers", files, n) : "a file list";
    }

    spec::Stage shard;
    shard.set_id(unique_id(doc, "shard_workers"));
    shard.set_op(equal != spec::EQUAL_STEPS_UNSET ? "balanced_shard" : "shard");
    (*shard.mutable_params())["num_shards"] = std::to_string(n);
    (*shard.mutable_params())["index"] = std::to_string(worker.index);
    if (equal != spec::EQUAL_STEPS_UNSET) (*shard.mutable_params())["equal_steps"] = equal_name;
    const std::string after = by_file || !file_list ? src.id : graph.stages[reader].id;
    insert_after(doc, after, shard);
    plan.notes.push_back(fmt::format("sharded by {} ({}): stage '{}' ({}) added after '{}', keeping 1 {} in {}", by_file ? "file" : "record",
                                     why, shard.id(), shard.op(), after, by_file ? "file" : "element", n));
    if (by_file && files >= 0 && files < n)
      plan.warnings.push_back(fmt::format("{} file{} for {} workers sharded by file: {} nothing", files, files == 1 ? "" : "s", n,
                                          files + 1 == n ? fmt::format("worker {} reads", files)
                                                         : fmt::format("workers {} to {} read", files, n - 1)));
    if (!by_file && file_list)
      plan.warnings.push_back(fmt::format("every worker reads all the files of '{}' and keeps 1 record in {}: {} times the reading "
                                          "of one share{}",
                                          src.id, n, n,
                                          equal == spec::EQUAL_STEPS_UNSET
                                              ? "; write at least one file per worker (tfrecord_writer max_records) to shard by file"
                                              : ""));
    if (!by_file && file_list) {
      const auto& rd = graph.stages[reader];
      const bool ordered = rd.interleave_keeps_order(graph.deterministic);
      if (!ordered)
        plan.warnings.push_back(fmt::format("'{}' hands records on in the order they are read (deterministic: false), so a "
                                            "record's position differs between workers and their shards may overlap or miss "
                                            "records; make it deterministic, or shard by file",
                                            rd.id));
    }
    if (equal != spec::EQUAL_STEPS_UNSET) {
      // The shard reads `after`, so the stages after it are those that were after `after`.
      auto uneven = uneven_after(graph, by_file || !file_list ? source : reader);
      if (!uneven.empty())
        plan.warnings.push_back(fmt::format("equal steps are counted at stage '{}'; {} after it can still give workers "
                                            "different numbers of elements",
                                            shard.id(), fmt::join(uneven, ", ")));
    }
  };
  // A source that shards itself (it takes the job's worker count, as random_access splits its
  // index space) is left to do so: a shard after it would read every record on every worker.
  auto shards_itself = [&](int source) {
    for (const auto& p : graph.stages[source].op->info.params)
      if (p.hint_role == ParamSpec::HintRole::Takes && p.hint == "num_workers") return true;
    return false;
  };
  for (int i = 0; i < static_cast<int>(graph.stages.size()); ++i) {
    if (!graph.stages[i].inputs.empty()) continue;
    if (shards_itself(i)) {
      plan.notes.push_back(fmt::format("'{}' ({}) shards itself: the {} workers share its records, none read twice", graph.stages[i].id,
                                       graph.stages[i].op->info.name, n));
      // Equal steps are its own to give, when it takes them (random_access's equal_steps).
      const auto& schema = graph.stages[i].op->info.params;
      if (equal != spec::EQUAL_STEPS_UNSET && std::any_of(schema.begin(), schema.end(), [](const ParamSpec& p) { return p.name == "equal_steps"; })) {
        for (auto& st : *doc.spec.mutable_stage())
          if (st.id() == graph.stages[i].id && !st.params().count("equal_steps")) (*st.mutable_params())["equal_steps"] = equal_name;
        plan.notes.push_back(fmt::format("'{}' gives every worker the same number of records (equal_steps: {})", graph.stages[i].id, equal_name));
        if (auto uneven = uneven_after(graph, i); !uneven.empty())
          plan.warnings.push_back(fmt::format("equal steps are counted at stage '{}'; {} after it can still give workers different numbers of "
                                              "elements",
                                              graph.stages[i].id, fmt::join(uneven, ", ")));
      } else if (equal != spec::EQUAL_STEPS_UNSET) {
        plan.warnings.push_back(fmt::format("'{}' shards itself and takes no equal_steps: its workers' shares may differ by one",
                                            graph.stages[i].id));
      }
      continue;
    }
    shard_source(i);
  }
  return finish();
}

}  // namespace sluice
