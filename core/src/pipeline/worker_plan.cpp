// plan_for_worker: a pipeline written for one process, made the pipeline of one of N workers.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "sluice/core/spec.hpp"

namespace sluice {
namespace {

bool is_shard(const Registry& registry, const std::string& op) {
  return registry.has_role(op, OperatorRole::Shards) || registry.has_role(op, OperatorRole::ShardsEvenly);
}

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

// How one worker of N reads the pipeline: as written, with its own seed, or with a shard of
// every source's records (or files) added, or left to sources that shard themselves.
class WorkerPlanner {
 public:
  WorkerPlanner(PipelineDocument& doc, const Registry& registry, const WorkerIdentity& worker)
      : doc_(doc),
        registry_(registry),
        worker_(worker),
        n_(worker.count),
        sharding_(doc.spec.options().sharding()),
        equal_(doc.spec.options().equal_steps()),
        equal_name_(equal_ == spec::pad ? "pad" : "drop") {}

  WorkerPlan plan() {
    doc_.worker = worker_;
    if (n_ <= 1) return finish();
    refuse_outputs_shared_by_workers(doc_, registry_, worker_);
    if (sharding_ == spec::off) {
      seed_unsharded();
      return finish();
    }
    if (adapt_own_shards()) return finish();
    require_shard_operators();
    const Graph graph = build_graph(doc_, registry_);
    // Every source gets its shard (a pipeline mixing several datasets shards each of them).
    for (int i = 0; i < static_cast<int>(graph.stages.size()); ++i) {
      if (!graph.stages[i].inputs.empty()) continue;
      if (shards_itself(graph, i)) let_it_shard_itself(graph, i);
      else shard_source(graph, i);
    }
    return finish();
  }

 private:
  bool equal_steps() const { return equal_ != spec::EQUAL_STEPS_UNSET; }

  WorkerPlan finish() {
    for (const auto& n : plan_.notes) doc_.worker_notes.push_back(n);
    for (const auto& w : plan_.warnings) doc_.worker_notes.push_back("warning: " + w);
    return plan_;
  }

  void seed_unsharded() {
    const auto seed = worker_seed(doc_.spec.options().seed(), worker_.index);
    plan_.notes.push_back(fmt::format("sharding: off: every worker reads the whole dataset, this one with seed {} (derived "
                                      "from the pipeline's seed {} and worker index {})",
                                      seed, doc_.spec.options().seed(), worker_.index));
    doc_.spec.mutable_options()->set_seed(seed);
  }

  // A pipeline that shards itself keeps its shard stages (their unset count and index are the
  // worker's); equal steps turn them into balanced ones. False when it has none.
  bool adapt_own_shards() {
    bool has_shard = false;
    for (auto& st : *doc_.spec.mutable_stage()) {
      if (!is_shard(registry_, st.op())) continue;
      has_shard = true;
      auto given = st.params().find("num_shards");
      if (given != st.params().end() && given->second != "-1" && given->second != std::to_string(n_))
        plan_.warnings.push_back(fmt::format("stage '{}' keeps num_shards {} as written, not this job's {} workers; remove its "
                                             "num_shards and index to shard by worker",
                                             st.id(), given->second, n_));
      if (equal_steps() && registry_.has_role(st.op(), OperatorRole::Shards)) {
        st.set_op(shard_operator(OperatorRole::ShardsEvenly));
        st.set_parallelism(0);
        (*st.mutable_params())["equal_steps"] = equal_name_;
        plan_.notes.push_back(fmt::format("stage '{}' is a balanced_shard (equal_steps: {}): every worker gets the same number "
                                          "of elements per epoch",
                                          st.id(), equal_name_));
      }
    }
    if (has_shard && equal_steps()) {
      const Graph graph = build_graph(doc_, registry_);
      for (int i = 0; i < static_cast<int>(graph.stages.size()); ++i)
        if (is_shard(registry_, graph.stages[i].op->info.name)) warn_uneven(graph, i, graph.stages[i].id);
    }
    return has_shard;
  }

  // The operator that shards with `role`.
  std::string shard_operator(OperatorRole role) const {
    require_shard_operators();
    return registry_.with_role(role)->info.name;
  }

  void require_shard_operators() const {
    if (!registry_.with_role(OperatorRole::Shards) || !registry_.with_role(OperatorRole::ShardsEvenly))
      throw SpecError({{doc_.file, 0, 0, "", "",
                        fmt::format("{}: sharding needs the 'shard' and 'balanced_shard' operators of the std plugin, which "
                                    "is not loaded; load it, add a shard stage yourself, or set `options {{ sharding: off }}`",
                                    worker_.describe())}});
  }

  // Equal steps counted at `counted_at` (the stage `from` or a shard reading it) can still differ
  // when stages after `from` drop or multiply elements.
  void warn_uneven(const Graph& graph, int from, const std::string& counted_at) {
    if (auto uneven = uneven_after(graph, from); !uneven.empty())
      plan_.warnings.push_back(fmt::format("equal steps are counted at stage '{}'; {} after it can still give workers "
                                           "different numbers of elements",
                                           counted_at, fmt::join(uneven, ", ")));
  }

  // A source that shards itself (it takes the job's worker count, as random_access splits its
  // index space) is left to do so: a shard after it would read every record on every worker.
  static bool shards_itself(const Graph& graph, int source) {
    for (const auto& p : graph.stages[source].op->info.params)
      if (p.hint_role == ParamSpec::HintRole::Takes && p.hint == "num_workers") return true;
    return false;
  }

  void let_it_shard_itself(const Graph& graph, int source) {
    const auto& src = graph.stages[source];
    plan_.notes.push_back(fmt::format("'{}' ({}) shards itself: the {} workers share its records, none read twice", src.id,
                                      src.op->info.name, n_));
    if (!equal_steps()) return;
    // Equal steps are its own to give, when it takes them (random_access's equal_steps).
    const auto& schema = src.op->info.params;
    if (std::none_of(schema.begin(), schema.end(), [](const ParamSpec& p) { return p.name == "equal_steps"; })) {
      plan_.warnings.push_back(fmt::format("'{}' shards itself and takes no equal_steps: its workers' shares may differ by one", src.id));
      return;
    }
    for (auto& st : *doc_.spec.mutable_stage())
      if (st.id() == src.id && !st.params().count("equal_steps")) (*st.mutable_params())["equal_steps"] = equal_name_;
    plan_.notes.push_back(fmt::format("'{}' gives every worker the same number of records (equal_steps: {})", src.id, equal_name_));
    warn_uneven(graph, source, src.id);
  }

  // Whether a source read by a reader is sharded by file (else by record), and why.
  bool by_file(const GraphStage& src, bool file_list, std::int64_t files, std::string& why) const {
    if (sharding_ == spec::by_file) {
      if (!file_list)
        throw SpecError({{doc_.file, 0, 0, src.id, "",
                          fmt::format("options.sharding is by_file, but the source '{}' is not a file list read by an expand "
                                      "stage (a reader); use by_record or automatic",
                                      src.id)}});
      if (equal_steps())
        throw SpecError({{doc_.file, 0, 0, "", "",
                          "options.sharding: by_file cannot give equal steps (files hold different numbers of records, "
                          "which no worker knows before reading them); use by_record or automatic with equal_steps"}});
      why = "options.sharding: by_file";
      return true;
    }
    if (sharding_ == spec::by_record || !file_list) {
      why = sharding_ == spec::by_record ? "options.sharding: by_record" : fmt::format("'{}' produces the records itself", src.id);
      return false;
    }
    if (equal_steps()) {
      why = fmt::format("equal_steps: {} needs every worker to see every record's position", equal_name_);
      return false;
    }
    if (files >= 0 && files < n_) {
      why = fmt::format("{} file{} for {} workers", files, files == 1 ? "" : "s", n_);
      return false;
    }
    why = files >= 0 ? fmt::format("{} files for {} workers", files, n_) : "a file list";
    return true;
  }

  void shard_source(const Graph& graph, int source) {
    const auto& src = graph.stages[source];
    const int reader = src.sole_consumer();
    const bool file_list = reader >= 0 && graph.stages[reader].op->info.kind == OperatorKind::Expand;
    const std::int64_t files = file_list ? files_listed(src, graph) : -1;
    std::string why;
    const bool whole_files = by_file(src, file_list, files, why);

    spec::Stage shard;
    shard.set_id(unique_id(doc_, "shard_workers"));
    shard.set_op(shard_operator(equal_steps() ? OperatorRole::ShardsEvenly : OperatorRole::Shards));
    (*shard.mutable_params())["num_shards"] = std::to_string(n_);
    (*shard.mutable_params())["index"] = std::to_string(worker_.index);
    if (equal_steps()) (*shard.mutable_params())["equal_steps"] = equal_name_;
    const std::string after = whole_files || !file_list ? src.id : graph.stages[reader].id;
    insert_after(doc_, after, shard);
    plan_.notes.push_back(fmt::format("sharded by {} ({}): stage '{}' ({}) added after '{}', keeping 1 {} in {}",
                                      whole_files ? "file" : "record", why, shard.id(), shard.op(), after,
                                      whole_files ? "file" : "element", n_));
    if (whole_files && files >= 0 && files < n_)
      plan_.warnings.push_back(fmt::format("{} file{} for {} workers sharded by file: {} nothing", files, files == 1 ? "" : "s", n_,
                                           files + 1 == n_ ? fmt::format("worker {} reads", files)
                                                           : fmt::format("workers {} to {} read", files, n_ - 1)));
    if (!whole_files && file_list) warn_record_sharding_of_files(src, graph.stages[reader], graph);
    // The shard reads `after`, so the stages after it are those that were after `after`.
    if (equal_steps()) warn_uneven(graph, whole_files || !file_list ? source : reader, shard.id());
  }

  void warn_record_sharding_of_files(const GraphStage& src, const GraphStage& reader, const Graph& graph) {
    plan_.warnings.push_back(fmt::format("every worker reads all the files of '{}' and keeps 1 record in {}: {} times the reading "
                                         "of one share{}",
                                         src.id, n_, n_,
                                         !equal_steps() ? "; write at least one file per worker (tfrecord_writer max_records) to shard by file"
                                                        : ""));
    if (!reader.interleave_keeps_order(graph.deterministic))
      plan_.warnings.push_back(fmt::format("'{}' hands records on in the order they are read (deterministic: false), so a "
                                           "record's position differs between workers and their shards may overlap or miss "
                                           "records; make it deterministic, or shard by file",
                                           reader.id));
  }

  PipelineDocument& doc_;
  const Registry& registry_;
  const WorkerIdentity& worker_;
  const int n_;
  const spec::Sharding sharding_;
  const spec::EqualSteps equal_;
  const std::string equal_name_;
  WorkerPlan plan_;
};

}  // namespace

WorkerPlan plan_for_worker(PipelineDocument& doc, const Registry& registry, const WorkerIdentity& worker) {
  return WorkerPlanner(doc, registry, worker).plan();
}

}  // namespace sluice
