#include "sluice/core/spec.hpp"
#include "sluice/storage.hpp"
#include "syntax_error.hpp"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "sluice/core/atomic_file.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/text.hpp"

namespace fs = std::filesystem;

namespace sluice {

std::string Problem::to_string() const {
  std::string s;
  if (!file.empty()) {
    s += file;
    if (line > 0) s += fmt::format(":{}:{}", line, column);
    s += ": ";
  }
  if (!stage.empty()) s += fmt::format("stage '{}': ", printable(stage));
  if (!param.empty()) s += fmt::format("parameter '{}': ", printable(param));
  return s + printable(message);
}

namespace {
// "'a'", "'a' and 'b'", "'a', 'b' and 'c'".
std::string names_in_prose(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k) out += (k == 0 ? "" : k + 1 == names.size() ? " and " : ", ") + names[k];
  return out;
}

std::string join_problems(const std::vector<Problem>& problems) {
  std::string s;
  for (const auto& p : problems) s += (s.empty() ? "" : "\n") + p.to_string();
  return s;
}

// Protobuf's errors, told in the file's words (syntax_error.cpp).
class CollectErrors final : public google::protobuf::io::ErrorCollector {
 public:
  CollectErrors(const std::string& text, std::string file) : text_(text), file_(std::move(file)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    problems.push_back(explain_syntax_error(text_, file_, line + 1, column + 1, message));
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  std::vector<Problem> problems;

 private:
  const std::string& text_;
  std::string file_;
};
}  // namespace

SpecError::SpecError(std::vector<Problem> problems) : Error(join_problems(problems)), problems_(std::move(problems)) {}

PipelineDocument parse_pipeline(const std::string& text, const std::string& file_name) {
  PipelineDocument doc;
  doc.file = file_name;
  auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    if (const std::size_t depth = json_nesting_depth(text); depth > kDeepestJson)
      throw SpecError({{file_name, 0, 0, "", "", fmt::format("invalid JSON pipeline: it nests {} levels of arrays and objects (a pipeline has fewer than {})",
                                                             depth, kDeepestJson)}});
    auto status = google::protobuf::util::JsonStringToMessage(text, &doc.spec);
    if (!status.ok())
      throw SpecError({{file_name, 0, 0, "", "", "invalid JSON pipeline: " + std::string(status.message())}});
    doc.stage_locations.assign(doc.spec.stage_size(), {0, 0});
    return doc;
  }
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors(text, file_name);
  google::protobuf::TextFormat::ParseInfoTree tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &doc.spec)) {
    if (errors.problems.empty()) errors.problems.push_back({file_name, 0, 0, "", "", "cannot parse the pipeline"});
    throw SpecError(errors.problems);
  }
  const auto* stage_field = spec::PipelineSpec::descriptor()->FindFieldByName("stage");
  for (int i = 0; i < doc.spec.stage_size(); ++i) {
    auto loc = tree.GetLocation(stage_field, i);
    doc.stage_locations.emplace_back(loc.line + 1, loc.column + 1);
  }
  return doc;
}

PipelineDocument read_pipeline_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw SpecError({{file.string(), 0, 0, "", "", "cannot open the pipeline file (does it exist and is it readable?)"}});
  std::ostringstream text;
  text << in.rdbuf();
  return parse_pipeline(text.str(), file.string());
}

std::string write_pipeline_file(const spec::PipelineSpec& spec, const fs::path& file, const std::string& original_text) {
  std::string text = original_text.empty() ? pipeline_to_text(spec) : update_pipeline_text(original_text, spec);
  write_file_atomically(file, text);
  return text;
}

std::string resolve_from_pipeline_folder(const std::string& path, const std::string& pipeline_file) {
  if (path.empty() || pipeline_file.empty() || is_remote_uri(path)) return path;  // s3://, gs://, http(s)://: not a file
  const fs::path as_given(path);
  if (as_given.is_absolute()) return path;
  const fs::path folder = fs::path(pipeline_file).parent_path();
  if (folder.empty()) return path;
  return (folder / as_given).lexically_normal().string();
}

namespace {
// Sets a field of the stage's `distribute` from its text; returns why it cannot (empty: done).
std::string set_distribute_field(spec::Stage& stage, const std::string& field, const std::string& value) {
  spec::Distribute& d = *stage.mutable_distribute();
  const auto* descriptor = spec::Distribute::descriptor();
  const auto* f = descriptor->FindFieldByName(field);
  if (!f) {
    std::vector<std::string> names;
    for (int i = 0; i < descriptor->field_count(); ++i) names.push_back(descriptor->field(i)->name());
    return fmt::format("distribute has no field '{}' (it has {})", field, fmt::join(names, ", "));
  }
  const auto* reflection = d.GetReflection();
  switch (f->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_STRING: reflection->SetString(&d, f, value); return {};
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT32: {
      std::uint64_t number = 0;
      auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
      const bool narrow = f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT32;
      if (error != std::errc() || end != value.data() + value.size() || (narrow && number > UINT32_MAX))
        return fmt::format("distribute.{} is a count", field);
      if (narrow) reflection->SetUInt32(&d, f, static_cast<std::uint32_t>(number));
      else reflection->SetUInt64(&d, f, number);
      return {};
    }
    case google::protobuf::FieldDescriptor::CPPTYPE_ENUM: {
      const auto* v = f->enum_type()->FindValueByName(value);
      if (!v) {
        std::vector<std::string> names;
        for (int i = 1; i < f->enum_type()->value_count(); ++i) names.push_back(f->enum_type()->value(i)->name());
        return fmt::format("distribute.{} is one of {}", field, fmt::join(names, ", "));
      }
      reflection->SetEnum(&d, f, v);
      return {};
    }
    default: return fmt::format("distribute.{} cannot be set from the command line", field);
  }
}
}  // namespace

void apply_overrides(PipelineDocument& doc, const std::vector<std::string>& overrides) {
  std::vector<Problem> problems;
  std::vector<std::string> ids;
  for (const auto& st : doc.spec.stage()) ids.push_back(st.id());
  for (const auto& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems.push_back({"--set", 0, 0, "", "", fmt::format("'{}' is not STAGE.PARAM=VALUE", text)});
      continue;
    }
    std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    spec::Stage* target = nullptr;
    std::size_t best = 0;
    for (auto& st : *doc.spec.mutable_stage()) {
      const auto& id = st.id();
      if (key.size() > id.size() + 1 && key.compare(0, id.size(), id) == 0 && key[id.size()] == '.' && id.size() >= best) {
        target = &st;
        best = id.size();
      }
    }
    if (!target && key.rfind("distribute.", 0) == 0) {
      // `distribute.FIELD`: the stage the file distributes (the service's address on this cluster).
      for (auto& st : *doc.spec.mutable_stage())
        if (st.has_distribute()) target = &st;
      if (!target) {
        problems.push_back({"--set", 0, 0, "", "", fmt::format("'{}': no stage of the pipeline has `distribute` (write STAGE.distribute.{} to send one to the service)", text, key.substr(11))});
        continue;
      }
      if (auto why = set_distribute_field(*target, key.substr(11), value); !why.empty())
        problems.push_back({"--set", 0, 0, target->id(), key, fmt::format("'{}': {}", text, why)});
      continue;
    }
    if (!target) {
      auto dot = key.find('.');
      std::string stage = key.substr(0, dot);
      problems.push_back({"--set", 0, 0, "", "",
                          dot == std::string::npos
                              ? fmt::format("'{}' is not STAGE.PARAM=VALUE", text)
                              : fmt::format("'{}' names no stage '{}'{}", text, stage, did_you_mean(closest_names(stage, ids)))});
      continue;
    }
    const std::string name = key.substr(best + 1);
    if (name == "parallelism" || name == "output_buffer") {
      // The stage's own fields: a count, or the engine's choice while it runs.
      int number = 0;
      const bool autotune = value == "autotune" || value == "AUTOTUNE" || value == "-1";
      if (!autotune) {
        auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
        if (error != std::errc() || end != value.data() + value.size() || number < 0) {
          problems.push_back({"--set", 0, 0, target->id(), name,
                              fmt::format("'{}': {} is a count of 0 or more, or 'autotune'", text, name)});
          continue;
        }
      }
      if (name == "parallelism") target->set_parallelism(autotune ? -1 : number);
      else target->set_buffer_size(autotune ? -1 : number);
      continue;
    }
    if (name.rfind("distribute.", 0) == 0) {  // where the stage goes: the service's address on this cluster, its token...
      if (auto why = set_distribute_field(*target, name.substr(11), value); !why.empty())
        problems.push_back({"--set", 0, 0, target->id(), name, fmt::format("'{}': {}", text, why)});
      continue;
    }
    (*target->mutable_params())[name] = value;
    doc.set_on_command_line.emplace(target->id(), name);
  }
  if (!problems.empty()) throw SpecError(problems);
}

namespace {

// Bounds on what a file may ask for, so that a typo cannot create 30,000 threads or a table of a
// billion open inputs before the run has read a byte.
constexpr int kMaxParallelism = 1024;
constexpr int kMaxCycleLength = 4096;
constexpr int kMaxBlockLength = 1 << 20;

struct Validation {
  const PipelineDocument& doc;
  const Registry& registry;
  std::vector<Problem> problems;
  Graph graph;

  void problem(int stage_index, std::string param, std::string message) {
    Problem p;
    p.file = doc.file;
    if (stage_index >= 0) {
      p.stage = doc.spec.stage(stage_index).id();
      if (stage_index < static_cast<int>(doc.stage_locations.size()))
        std::tie(p.line, p.column) = doc.stage_locations[stage_index];
    }
    p.param = std::move(param);
    p.message = std::move(message);
    problems.push_back(std::move(p));
  }

  ErrorPolicyKind policy(spec::ErrorPolicy stage_policy) const {
    auto p = stage_policy != spec::ERROR_POLICY_UNSET ? stage_policy : doc.spec.options().error_policy();
    return p == spec::skip ? ErrorPolicyKind::Skip : ErrorPolicyKind::Fail;
  }

  // What run() learns of the stages as it goes, in the file's order.
  std::map<std::string, int> index_of;
  std::vector<std::string> ids;
  std::vector<GraphStage> built;
  std::vector<bool> usable;  // built without a problem
  std::vector<std::vector<int>> consumers;
  std::vector<int> order;  // the flow's order (every stage after its inputs)

  void run() {
    const auto& stages = doc.spec.stage();
    const int n = stages.size();
    if (n == 0) {
      problems.push_back({doc.file, 0, 0, "", "", "the pipeline has no stages; add at least a source and a sink"});
      return;
    }
    index_ids();
    built.resize(n);
    usable.assign(n, false);
    for (int i = 0; i < n; ++i) usable[i] = check_stage(i, built[i], index_of, ids);
    check_wiring();
    if (!order_the_flow()) return;
    check_paths_to_sinks();
    if (!problems.empty()) return;
    refuse_rejoining_branches(stages, built, order);
    if (!problems.empty()) return;
    check_per_input_stages(stages, built);
    if (!problems.empty()) return;
    apply_hints(stages, built);
    refuse_shared_outputs(built);
    construct_every_operator(built);
    if (!problems.empty()) return;
    make_graph();
  }

  void index_ids() {
    const auto& stages = doc.spec.stage();
    for (int i = 0; i < stages.size(); ++i) {
      const auto& id = stages[i].id();
      if (id.empty()) {
        problem(i, "", fmt::format("stage #{} has no id; give it `id: \"...\"`", i + 1));
        continue;
      }
      if (has_control_characters(id))
        problem(i, "", "its id holds control characters (a line break, a terminal escape); use letters, digits, '_', '-' or '.'");
      if (!index_of.emplace(id, i).second) problem(i, "", "another stage already has this id; ids must be unique");
      ids.push_back(id);
    }
  }

  // Wiring: inputs exist and counted (check_stage); a stage read by several stages (a tee) gives
  // each its own buffer of every element.
  void check_wiring() {
    const auto& stages = doc.spec.stage();
    const int n = stages.size();
    consumers.assign(n, {});
    for (int i = 0; i < n; ++i)
      for (int input : built[i].inputs) consumers[input].push_back(i);
    for (int i = 0; i < n; ++i) {
      built[i].consumers = consumers[i];
      if (usable[i] && built[i].op->info.kind == OperatorKind::Sink && !consumers[i].empty())
        problem(consumers[i][0], "", fmt::format("its input '{}' is a sink, which has no output", stages[i].id()));
      for (std::size_t a = 0; a < built[i].inputs.size(); ++a)
        for (std::size_t b = a + 1; b < built[i].inputs.size(); ++b)
          if (built[i].inputs[a] == built[i].inputs[b])
            problem(i, "", fmt::format("it lists input '{}' twice (inputs {} and {}); a stage reads an output once: to pair "
                                       "elements with themselves, use a map",
                                       stages[built[i].inputs[a]].id(), a + 1, b + 1));
    }
  }

  // The flow's order (Kahn's algorithm); false, with the problem told, when stages form a cycle:
  // what is left after removing every stage whose inputs are done.
  bool order_the_flow() {
    const int n = static_cast<int>(built.size());
    std::vector<int> pending(n);
    for (int i = 0; i < n; ++i) pending[i] = static_cast<int>(built[i].inputs.size());
    // The earliest stage in the file among those ready: a file already in flow order keeps it.
    std::set<int> ready;
    for (int i = 0; i < n; ++i)
      if (pending[i] == 0) ready.insert(i);
    while (!ready.empty()) {
      const int s = *ready.begin();
      ready.erase(ready.begin());
      order.push_back(s);
      for (int c : consumers[s])
        if (--pending[c] == 0) ready.insert(c);
    }
    if (static_cast<int>(order.size()) == n) return true;
    report_cycle(pending);
    return false;
  }

  // Stages left over are on a cycle or downstream of one: walk inputs from one of them until a
  // stage repeats; the stages from its first visit on are the cycle itself.
  void report_cycle(const std::vector<int>& pending) {
    const auto& stages = doc.spec.stage();
    const int n = static_cast<int>(built.size());
    int at = -1;
    for (int i = 0; i < n && at < 0; ++i)
      if (pending[i] > 0) at = i;
    std::vector<int> seen_at(n, -1), path;
    while (seen_at[at] < 0) {
      seen_at[at] = static_cast<int>(path.size());
      path.push_back(at);
      for (int input : built[at].inputs)
        if (pending[input] > 0) {
          at = input;
          break;
        }
    }
    // The walk went against the flow: reverse it, and close the loop with its first stage.
    std::vector<std::string> names{"'" + stages[at].id() + "'"};
    for (int k = static_cast<int>(path.size()) - 1; k > seen_at[at]; --k) names.push_back("'" + stages[path[k]].id() + "'");
    names.push_back(names.front());
    problem(at, "", fmt::format("stages {} form a cycle; a pipeline must flow one way from sources to sinks", fmt::join(names, " -> ")));
  }

  // Every stage must reach a sink. A break is told once, at the stage where the data stops (no
  // stage reads it), naming the stages whose data flows only there: one missing connection is
  // one problem, not one per stage before it. Linear in the pipeline's size.
  void check_paths_to_sinks() {
    const auto& stages = doc.spec.stage();
    const int n = static_cast<int>(built.size());
    std::vector<bool> reaches_sink(n, false);
    std::vector<int> dead_end(n, -1);  // where a stage's data stops, following its first reader
    for (auto k = order.rbegin(); k != order.rend(); ++k) {
      const int i = *k;
      // A stage that could not be built (an unknown operator, told already) is given the benefit
      // of the doubt: nothing before it is blamed for where it leads.
      reaches_sink[i] = !usable[i] || !built[i].op || built[i].op->info.kind == OperatorKind::Sink;
      for (int reader : built[i].consumers) reaches_sink[i] = reaches_sink[i] || reaches_sink[reader];
      dead_end[i] = built[i].consumers.empty() ? i : dead_end[built[i].consumers.front()];
    }
    std::map<int, std::vector<std::string>> flowing_only_into;
    for (int i : order)
      if (usable[i] && !reaches_sink[i] && dead_end[i] != i) flowing_only_into[dead_end[i]].push_back("'" + stages[i].id() + "'");
    for (int i = 0; i < n; ++i) {
      if (!usable[i] || reaches_sink[i] || !built[i].consumers.empty()) continue;
      std::string message = "no path to a sink: no stage reads its output; add a sink (null_sink, jsonl_sink, ...) with `input: \"" +
                            stages[i].id() + "\"`";
      if (auto before = flowing_only_into.find(i); before != flowing_only_into.end())
        message += fmt::format(" (what {} give{} ends here too)", names_in_prose(before->second), before->second.size() == 1 ? "s" : "");
      problem(i, "", message);
    }
  }

  // The stages renumbered into the flow's order, with the pipeline's options.
  void make_graph() {
    const int n = static_cast<int>(built.size());
    std::vector<int> position(n);
    for (int k = 0; k < n; ++k) position[order[k]] = k;
    for (int k = 0; k < n; ++k) {
      GraphStage st = std::move(built[order[k]]);
      for (auto& in : st.inputs) in = position[in];
      for (auto& c : st.consumers) c = position[c];
      graph.stages.push_back(std::move(st));
    }
    graph.seed = doc.spec.options().seed();
    graph.deterministic = !doc.spec.options().has_deterministic() || doc.spec.options().deterministic();
    graph.fuse = !doc.spec.options().has_fuse_stages() || doc.spec.options().fuse_stages();
    check_autotune_options(graph);
    check_remote_options(graph);
    check_remote_cache_options(graph);
    graph.file = doc.file;
    graph.worker = doc.worker.value_or(WorkerIdentity{});
    graph.worker_notes = doc.worker_notes;
  }

  void check_autotune_options(Graph& graph) {
    if (!doc.spec.options().has_autotune()) return;
    const auto& tune = doc.spec.options().autotune();
    graph.autotune_budgets_given = true;
    if (tune.cpu_budget() < 0 || tune.cpu_budget() > kMaxParallelism)
      problem(-1, "", fmt::format("options.autotune.cpu_budget {} is not a number of cores; use 0 (what this process may use) "
                                  "or a positive number such as 4 or 1.5", tune.cpu_budget()));
    else
      graph.cpu_budget = tune.cpu_budget();
    if (!tune.ram_budget().empty()) {
      auto bytes = parse_byte_size(tune.ram_budget());
      if (!bytes || *bytes == 0)
        problem(-1, "", fmt::format("options.autotune.ram_budget '{}' is not a size; write it as \"4GiB\", \"512MiB\" or a "
                                    "number of bytes (empty: half of the memory this process may use)", tune.ram_budget()));
      else
        graph.ram_budget = *bytes;
    }
  }

  void check_remote_cache_options(Graph& graph) {
    if (!doc.spec.options().has_remote_cache()) return;
    const auto& cache = doc.spec.options().remote_cache();
    graph.remote.cache_dir = cache.dir();
    if (!cache.max_bytes().empty()) {
      auto bytes = parse_byte_size(cache.max_bytes());
      if (!bytes || *bytes == 0)
        problem(-1, "", fmt::format("options.remote_cache.max_bytes '{}' is not a size; write it as \"200GiB\"", cache.max_bytes()));
      else graph.remote.cache_max_bytes = *bytes;
    }
  }

  void check_remote_options(Graph& graph) {
    if (!doc.spec.options().has_remote()) return;
    const auto& remote = doc.spec.options().remote();
    auto& out = graph.remote;
    if (remote.has_max_attempts()) {
      if (remote.max_attempts() < 1 || remote.max_attempts() > 100)
        problem(-1, "", fmt::format("options.remote.max_attempts {} is not between 1 (no retry) and 100", remote.max_attempts()));
      else
        out.max_attempts = remote.max_attempts();
    }
    if (!remote.deadline().empty()) {
      auto seconds = parse_duration_seconds(remote.deadline());
      if (!seconds) problem(-1, "", fmt::format("options.remote.deadline '{}' is not a duration; write it as \"30s\", \"5m\" or \"1h\"", remote.deadline()));
      else out.deadline_seconds = *seconds;
    }
    if (!remote.range_size().empty()) {
      auto bytes = parse_byte_size(remote.range_size());
      if (!bytes || *bytes < 4096 || *bytes > (std::uint64_t{1} << 30))
        problem(-1, "", fmt::format("options.remote.range_size '{}' is not a size between 4KiB and 1GiB; write it as \"8MiB\"", remote.range_size()));
      else out.range_bytes = *bytes;
    }
    if (!remote.part_size().empty()) {
      auto bytes = parse_byte_size(remote.part_size());
      if (!bytes || *bytes < (std::uint64_t{5} << 20) || *bytes > (std::uint64_t{5} << 30))
        problem(-1, "", fmt::format("options.remote.part_size '{}' is not a size between 5MiB and 5GiB (S3's bounds for a part); write it "
                                    "as \"8MiB\"", remote.part_size()));
      else out.part_bytes = *bytes;
    }
    if (remote.has_ranges_ahead()) {
      if (remote.ranges_ahead() < 0 || remote.ranges_ahead() > 64)
        problem(-1, "", fmt::format("options.remote.ranges_ahead {} is not between 0 and 64", remote.ranges_ahead()));
      else out.ranges_ahead = remote.ranges_ahead();
    }
    if (!remote.endpoint_url().empty() && remote.endpoint_url().rfind("http://", 0) != 0 && remote.endpoint_url().rfind("https://", 0) != 0)
      problem(-1, "", fmt::format("options.remote.endpoint_url '{}' is not an http:// or https:// URL", remote.endpoint_url()));
    out.endpoint_url = remote.endpoint_url();
    out.region = remote.region();
    out.profile = remote.profile();
    out.anonymous = remote.anonymous();
  }

  // The readers of one stage get its elements in step, each through a bounded buffer: branches of
  // it that meet again downstream could wait on each other forever (a concatenate reads all of one
  // branch while the other's buffer, full, holds the shared stage). Refused, with the way out.
  void refuse_rejoining_branches(const google::protobuf::RepeatedPtrField<spec::Stage>& stages,
                                 const std::vector<GraphStage>& built, const std::vector<int>& order) {
    const int n = static_cast<int>(built.size());
    for (int s = 0; s < n; ++s) {
      if (built[s].consumers.size() < 2) continue;
      // Which branch (index among s's consumers) reaches each stage first, in topological order.
      std::vector<int> branch(n, -1);
      for (std::size_t b = 0; b < built[s].consumers.size(); ++b) branch[built[s].consumers[b]] = static_cast<int>(b);
      for (int at : order) {
        if (branch[at] < 0) continue;
        for (int c : built[at].consumers) {
          if (branch[c] >= 0 && branch[c] != branch[at]) {
            problem(c, "", fmt::format("it reads stage '{}' through two branches (from '{}' and from '{}'); the readers of a "
                                       "stage get its elements in step, so branches that meet again could wait on each "
                                       "other forever: give one branch a source of its own (a copy of the stages up to "
                                       "'{}')",
                                       stages[s].id(), stages[built[s].consumers[branch[c]]].id(),
                                       stages[built[s].consumers[branch[at]]].id(), stages[s].id()));
            return;
          }
          branch[c] = branch[at];
        }
      }
    }
  }

  // A per-input stage runs inside the interleave it reads (directly or through other per-input
  // stages), once per input, on that interleave's readers: it must be that stage's only reader,
  // and it has no workers and, but for the last of the chain, no buffer of its own.
  void check_per_input_stages(const google::protobuf::RepeatedPtrField<spec::Stage>& stages, std::vector<GraphStage>& built) {
    const int n = static_cast<int>(built.size());
    for (int i = 0; i < n; ++i) {
      if (!built[i].per_input) continue;
      const auto& info = built[i].op->info;
      if (info.kind != OperatorKind::Map && info.kind != OperatorKind::Filter && info.kind != OperatorKind::Aggregate) {
        problem(i, "", fmt::format("'{}' is a {}; per_input applies to maps, filters and aggregates that read an interleave "
                                   "(an expand stage such as text_lines); remove `per_input`",
                                   info.name, operator_kind_name(info.kind)));
        continue;
      }
      const int input = built[i].inputs.front();
      const bool after_expand = built[input].op->info.kind == OperatorKind::Expand;
      if (!after_expand && !built[input].per_input) {
        problem(i, "", fmt::format("per_input runs a stage once per input of the interleave before it, but its input '{}' is a "
                                   "{}, not an expand stage (such as text_lines or tfrecord_reader) or another per-input stage; "
                                   "remove `per_input`, or move the stage right after the interleave",
                                   stages[input].id(), operator_kind_name(built[input].op->info.kind)));
        continue;
      }
      if (built[input].consumers.size() != 1) {
        problem(i, "", fmt::format("its input '{}' is read by {} stages; a per-input stage runs inside the stage it reads and "
                                   "must be its only reader (give the other readers a copy of the stages before)",
                                   stages[input].id(), built[input].consumers.size()));
        continue;
      }
      int head = input;
      while (built[head].per_input) head = built[head].inputs.front();
      if (stages[i].parallelism() != 0 && stages[i].parallelism() != 1)
        problem(i, "", fmt::format("a per-input stage runs on the readers of the interleave '{}'; set `parallelism` there (it "
                                   "reads that many inputs at once, each through this stage) and remove it here",
                                   stages[head].id()));
      const bool last = built[i].consumers.size() != 1 || !built[built[i].consumers.front()].per_input;
      if (!last && stages[i].buffer_size() != 0)
        problem(i, "", fmt::format("hands its outputs straight to per-input stage '{}' without a buffer; set `buffer_size` on "
                                   "the last per-input stage, whose output is buffered",
                                   stages[built[i].consumers.front()].id()));
      if (after_expand && stages[input].buffer_size() != 0)
        problem(input, "", fmt::format("hands its outputs straight to per-input stage '{}' without a buffer; set `buffer_size` "
                                       "on the last per-input stage, whose output is buffered",
                                       stages[i].id()));
    }
  }

  // Two stages writing one path would leave one file holding parts of both, or one's output
  // silently replaced by the other's.
  void refuse_shared_outputs(const std::vector<GraphStage>& built) {
    std::map<std::string, std::pair<int, std::string>> writer_of;
    for (int i = 0; i < static_cast<int>(built.size()); ++i) {
      for (const auto& p : built[i].op->info.params) {
        if (p.type != ParamType::OutputPath) continue;
        const auto& value = built[i].params.get_string(p.name);
        if (value.empty()) continue;
        std::error_code ec;
        std::string key = fs::weakly_canonical(fs::absolute(value, ec), ec).lexically_normal().string();
        if (ec || key.empty()) key = value;
        auto [it, inserted] = writer_of.emplace(key, std::make_pair(i, p.name));
        if (!inserted)
          problem(i, p.name, fmt::format("writes {}, which stage '{}' ({}) writes too; give each output its own path", value,
                                         built[it->second.first].id, it->second.second));
      }
    }
  }

  // Parameters can be valid one by one and refused together (a shard index not below the count,
  // mean and std of different lengths): constructors check them, so validation builds every
  // operator once and reports what it refuses, with the stage named and no run started.
  void construct_every_operator(const std::vector<GraphStage>& built) {
    for (int i = 0; i < static_cast<int>(built.size()); ++i) {
      try {
        auto op = built[i].op->info.create(built[i].params);
        if (!op) problem(i, "", fmt::format("operator '{}' created nothing (a bug in its plugin)", built[i].op->info.name));
        if (op && built[i].op->info.kind == OperatorKind::Aggregate && built[i].parallelism > 1 &&
            !takes_workers(built[i].op->info, op.get()))
          problem(i, "", fmt::format("'{}' keeps state between elements and runs on one worker, and it assembles its outputs "
                                     "there too; set parallelism to 1",
                                     built[i].op->info.name));
        // A per-input aggregate starts again with every input: one that reads its input more than
        // once per iteration (repeat) or replays it (cache) has no meaning there.
        if (auto* aggregate = dynamic_cast<Aggregate*>(op.get()); aggregate && built[i].per_input &&
            (aggregate->input_passes(1) != 1 || aggregate->keeps_reading_when_skipped()))
          problem(i, "", fmt::format("'{}' reads its input {} per iteration; per input it has nothing to repeat or replay: "
                                     "remove `per_input`, or put it after the interleave's output",
                                     built[i].op->info.name, aggregate->keeps_reading_when_skipped() ? "and keeps it to replay" : "several times"));
      } catch (const std::exception& e) {
        problem(i, "", fmt::format("'{}' refuses these parameters: {}", built[i].op->info.name, e.what()));
      } catch (...) {
        problem(i, "", fmt::format("'{}' refuses these parameters (its constructor threw something that is not an exception)",
                                   built[i].op->info.name));
      }
    }
  }

  // Parameters that take a hint and were not given get it from the first later stage offering
  // it, looking through stages that keep shapes (see ParamSpec::hint).
  void apply_hints(const google::protobuf::RepeatedPtrField<spec::Stage>& stages, std::vector<GraphStage>& built) {
    for (std::size_t i = 0; i < built.size(); ++i) {
      for (const auto& p : built[i].op->info.params) {
        if (p.hint_role != ParamSpec::HintRole::Takes || stages[static_cast<int>(i)].params().count(p.name)) continue;
        for (int c = built[i].sole_consumer(); c >= 0; c = built[c].sole_consumer()) {
          const ParamSpec* offer = nullptr;
          for (const auto& q : built[c].op->info.params)
            if (q.hint_role == ParamSpec::HintRole::Offers && q.hint == p.hint && q.type == p.type) offer = &q;
          if (offer) {
            built[i].params.set(p.name, built[c].params.values().at(offer->name));
            built[i].notes.push_back(fmt::format("{} = {}, from stage '{}' ({})", p.name,
                                                 format_param(built[c].params.values().at(offer->name)), built[c].id,
                                                 offer->name));
            break;
          }
          if (!built[c].op->info.traits.keeps_shape) break;
        }
      }
    }
  }

  // Paths written in the file are relative to its folder, as in build and compose files: the
  // bundled pipelines then run from any directory.
  // {worker} and {num_workers} are this worker's, in paths given either way.
  void resolve_paths(Params& params, const ParamSpec& spec, bool relative_to_file) const {
    const WorkerIdentity worker = doc.worker.value_or(WorkerIdentity{});
    auto resolve = [&](const std::string& path) {
      std::string p = substitute_worker_fields(path, worker);
      return relative_to_file ? resolve_from_pipeline_folder(p, doc.file) : p;
    };
    if (spec.type == ParamType::Path || spec.type == ParamType::OutputPath) {
      params.set(spec.name, resolve(params.get_string(spec.name)));
    } else if (spec.type == ParamType::PathList) {
      auto paths = params.get_string_list(spec.name);
      for (auto& p : paths) p = resolve(p);
      params.set(spec.name, paths);
    }
  }

  // Parameters taking the `worker_index` or `num_workers` hint (a shard's index and count, a
  // writer's worker number), not given or given as -1, are this worker's.
  void fill_worker_params(GraphStage& out, const spec::Stage& st) const {
    const WorkerIdentity worker = doc.worker.value_or(WorkerIdentity{});
    for (const auto& p : out.op->info.params) {
      if (p.hint_role != ParamSpec::HintRole::Takes || p.type != ParamType::Int) continue;
      if (p.hint != "worker_index" && p.hint != "num_workers") continue;
      auto given = st.params().find(p.name);
      if (given != st.params().end() && given->second != "-1") continue;
      const int value = p.hint == "worker_index" ? worker.index : worker.count;
      out.params.set(p.name, static_cast<std::int64_t>(value));
      if (worker.count > 1) out.notes.push_back(fmt::format("{} = {}, from the worker identity ({})", p.name, value, worker.describe()));
    }
  }

  // One stage on its own: its inputs named, its settings in range, its operator known and fitting
  // where it stands, its parameters valid. False when it cannot be built.
  bool check_stage(int i, GraphStage& out, const std::map<std::string, int>& index_of, const std::vector<std::string>& ids) {
    const auto& st = doc.spec.stage(i);
    out.id = st.id();
    bool ok = check_inputs(i, out, index_of, ids);
    check_settings(i, st, out);
    if (st.op().empty()) {
      problem(i, "", "has no operator; set `op: \"...\"` (see `sluice plugins`)");
      return false;
    }
    out.op = registry.find(st.op());
    if (!out.op && registry.left_out_with(st.op())) {
      problem(i, "", fmt::format("operator '{}' is not in this build: {}", st.op(), registry.left_out_with(st.op())->note));
      return false;
    }
    if (!out.op) {
      problem(i, "", fmt::format("unknown operator '{}'{}; `sluice plugins` lists the operators loaded; one of a plugin "
                                 "library elsewhere loads with --plugin-dir DIR, SLUICE_PLUGIN_PATH=DIR or, in Python, "
                                 "sluice.data.load_plugins(DIR)",
                                 st.op(), did_you_mean(registry.closest(st.op()))));
      return false;
    }
    check_inputs_taken(i, st, out.op->info);
    check_settings_fit(i, st, out, out.op->info);
    ok = check_params(i, st, out, out.op->info) && ok;
    if (ok) fill_worker_params(out, st);
    return ok;
  }

  bool check_inputs(int i, GraphStage& out, const std::map<std::string, int>& index_of, const std::vector<std::string>& ids) {
    bool ok = true;
    for (const auto& in : doc.spec.stage(i).input()) {
      auto it = index_of.find(in);
      if (it == index_of.end()) {
        problem(i, "", fmt::format("input '{}' names no stage{}", in, did_you_mean(closest_names(in, ids))));
        ok = false;
      } else if (it->second == i) {
        problem(i, "", "a stage cannot read its own output (cycle)");
        ok = false;
      } else {
        out.inputs.push_back(it->second);
      }
    }
    return ok;
  }

  // parallelism, buffer_size, interleave and policies, whatever the operator.
  void check_settings(int i, const spec::Stage& st, GraphStage& out) {
    if (st.parallelism() < -1)
      problem(i, "", fmt::format("parallelism {} is negative; use 1 or more, or -1 to let the engine choose (autotune)", st.parallelism()));
    if (st.parallelism() > kMaxParallelism)
      problem(i, "", fmt::format("parallelism {} is more than the {} workers a stage may have; machines have far fewer cores",
                                 st.parallelism(), kMaxParallelism));
    if (st.buffer_size() < -1)
      problem(i, "", fmt::format("buffer_size {} is negative; use 0 (sized by the engine), -1 (tuned while it runs) or more",
                                 st.buffer_size()));
    out.autotune_workers = st.parallelism() == -1;
    out.autotune_buffer = st.buffer_size() == -1;
    out.parallelism = std::max(1, st.parallelism());
    out.buffer_size = std::max(0, st.buffer_size());
    out.per_input = st.per_input();
    if (st.has_deterministic()) out.deterministic = st.deterministic();
    out.error_policy = policy(st.error_policy());
    if (!st.has_interleave()) return;
    const auto& il = st.interleave();
    if (il.cycle_length() < 0) problem(i, "", fmt::format("interleave cycle_length {} is negative", il.cycle_length()));
    if (il.block_length() < 0) problem(i, "", fmt::format("interleave block_length {} is negative", il.block_length()));
    if (il.cycle_length() > kMaxCycleLength)
      problem(i, "", fmt::format("interleave cycle_length {} is more than the {} inputs a stage may keep open", il.cycle_length(),
                                 kMaxCycleLength));
    if (il.block_length() > kMaxBlockLength)
      problem(i, "", fmt::format("interleave block_length {} is more than {}", il.block_length(), kMaxBlockLength));
    out.cycle_length = std::max(1, il.cycle_length());
    out.block_length = std::max(1, il.block_length());
    if (il.has_deterministic()) out.interleave_deterministic = il.deterministic();
  }

  // As many inputs as the operator's kind takes.
  void check_inputs_taken(int i, const spec::Stage& st, const OperatorInfo& info) {
    const bool is_source = info.kind == OperatorKind::Source;
    if (is_source && st.input_size() > 0)
      problem(i, "", fmt::format("'{}' is a source and takes no input; remove its `input`", info.name));
    if (info.kind == OperatorKind::Combine) {
      const bool any = info.max_inputs == kAnyNumberOfInputs;
      if (st.input_size() < info.min_inputs || (!any && st.input_size() > info.max_inputs))
        problem(i, "", fmt::format("'{}' takes {} inputs, got {}{}", info.name,
                                   any ? fmt::format("{} or more", info.min_inputs)
                                   : info.min_inputs == info.max_inputs ? std::to_string(info.min_inputs)
                                                                        : fmt::format("{} to {}", info.min_inputs, info.max_inputs),
                                   st.input_size(),
                                   st.input_size() < info.min_inputs ? "; list each with `input: \"STAGE\"`, in order" : ""));
    } else if (!is_source && st.input_size() != 1) {
      problem(i, "", st.input_size() == 0
                         ? fmt::format("'{}' is a {} and needs an input; add `input: \"STAGE\"`", info.name,
                                       operator_kind_name(info.kind))
                         : fmt::format("'{}' takes one input, got {}", info.name, st.input_size()));
    }
  }

  // The settings the operator's kind and traits allow: interleave for expands only, workers for
  // stateless stages (an aggregate's assembly threads are checked on the operator built from these
  // parameters, construct_every_operator), a tuned buffer where there is an output.
  void check_settings_fit(int i, const spec::Stage& st, const GraphStage& out, const OperatorInfo& info) {
    if (st.has_interleave() && info.kind != OperatorKind::Expand)
      problem(i, "", fmt::format("'{}' is a {}; interleave applies to expand operators only", info.name,
                                 operator_kind_name(info.kind)));
    // (An aggregate's is known once it is built: construct_every_operator.)
    if (out.parallelism > 1 && !takes_workers(info, nullptr))
      problem(i, "", fmt::format("'{}' keeps state between elements and runs on one worker; set parallelism to 1",
                                 info.name));
    if (out.autotune_workers && info.kind == OperatorKind::Aggregate)
      problem(i, "", fmt::format("'{}' is an aggregate: the engine does not tune the threads that assemble its outputs; give "
                                 "their number (`parallelism: 4`, where the operator assembles in parallel) or remove "
                                 "`parallelism: -1`", info.name));
    else if (out.autotune_workers && !takes_workers(info, nullptr))
      problem(i, "", fmt::format("'{}' keeps state between elements and runs on one worker: there is no parallelism to "
                                 "tune; remove `parallelism: -1`", info.name));
    if (out.autotune_buffer && info.kind == OperatorKind::Sink)
      problem(i, "", fmt::format("'{}' is a sink and has no output buffer; remove `buffer_size: -1`", info.name));
  }

  // Parameters: every given one known and valid, every required one given.
  bool check_params(int i, const spec::Stage& st, GraphStage& out, const OperatorInfo& info) {
    bool ok = true;
    std::vector<std::string> names;
    for (const auto& p : info.params) names.push_back(p.name);
    for (const auto& [name, value] : st.params()) {
      const ParamSpec* spec = nullptr;
      for (const auto& p : info.params)
        if (p.name == name) spec = &p;
      if (!spec) {
        problem(i, name, fmt::format("'{}' has no such parameter{}; it has: {}", info.name,
                                     did_you_mean(closest_names(name, names)), names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
        ok = false;
        continue;
      }
      try {
        out.params.set(name, parse_param(*spec, value));
        resolve_paths(out.params, *spec, !doc.set_on_command_line.count({st.id(), name}));
      } catch (const ParamError& e) {
        problem(i, name, e.what());
        ok = false;
      }
    }
    for (const auto& p : info.params) {
      if (st.params().count(p.name)) continue;
      if (p.required()) {
        problem(i, p.name, fmt::format("is required by '{}': {} ({})", info.name, p.doc, describe_param_constraints(p)));
        ok = false;
      } else {
        out.params.set(p.name, parse_param(p, *p.default_value));
      }
    }
    return ok;
  }
};

}  // namespace

std::vector<Problem> validate_pipeline(const PipelineDocument& doc, const Registry& registry) {
  Validation v{doc, registry, {}, {}};
  v.run();
  return v.problems;
}

Graph build_graph(const PipelineDocument& doc, const Registry& registry) {
  Validation v{doc, registry, {}, {}};
  v.run();
  if (!v.problems.empty()) throw SpecError(v.problems);
  return std::move(v.graph);
}

bool Graph::autotunes() const {
  if (autotune_budgets_given) return true;
  for (const auto& st : stages)
    if (st.autotune_workers || st.autotune_buffer) return true;
  return false;
}

}  // namespace sluice
