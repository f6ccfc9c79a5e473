#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sluice/core/registry.hpp"
#include "sluice/core/workers.hpp"
#include "sluice/error.hpp"
#include "sluice/params.hpp"
#include "pipeline.pb.h"

namespace sluice {

// One thing wrong with a pipeline, located as precisely as known.
struct Problem {
  std::string file;
  int line = 0;  // 1-based; 0 when unknown
  int column = 0;
  std::string stage;  // stage id, when the problem is in a stage
  std::string param;  // parameter name, when the problem is in a parameter
  std::string message;

  std::string to_string() const;
};

// Thrown when a pipeline cannot be read or is invalid; carries every problem found.
class SpecError : public Error {
 public:
  explicit SpecError(std::vector<Problem> problems);
  const std::vector<Problem>& problems() const { return problems_; }

 private:
  std::vector<Problem> problems_;
};

// A pipeline file as read: the message, where it came from, and where each stage starts in it.
struct PipelineDocument {
  spec::PipelineSpec spec;
  std::string file;
  std::vector<std::pair<int, int>> stage_locations;  // (line, column), 1-based, per stage
  // (stage id, parameter) given on the command line: their relative paths are relative to the
  // current directory; those written in the file, to the file's folder.
  std::set<std::pair<std::string, std::string>> set_on_command_line;
  // Which worker runs it (plan_for_worker sets it): fills {worker} and {num_workers} in path
  // parameters and the parameters that take the `worker_index` or `num_workers` hint (shard,
  // tfrecord_writer) when they are not given. Unset: a single process, worker 0 of 1.
  std::optional<WorkerIdentity> worker;
  std::vector<std::string> worker_notes;  // how the pipeline was made this worker's
};

// A path as the pipeline file means it: a relative one is taken from the folder of `pipeline_file`
// (unchanged when that is empty or has no folder part, i.e. the current directory).
std::string resolve_from_pipeline_folder(const std::string& path, const std::string& pipeline_file);

// Reads protobuf text format, or JSON when the file starts with '{'. Throws SpecError with the
// line and column of a syntax error.
PipelineDocument read_pipeline_file(const std::filesystem::path& file);
PipelineDocument parse_pipeline(const std::string& text, const std::string& file_name);

// The file's text form: the options on one line, then one line per stage. Writing is atomic
// (temporary file, then rename).
std::string pipeline_to_text(const spec::PipelineSpec& spec);
// `original` (a pipeline file's text) edited to read as `updated`, changing only what differs:
// comments, blank lines, spacing, field order and the lines of unchanged stages stay as written,
// and a changed parameter changes only its value. A JSON original gives JSON; an empty or
// unparsable one gives pipeline_to_text(updated).
std::string update_pipeline_text(const std::string& original, const spec::PipelineSpec& updated);
// Writes `spec` to `file`, as an edit of `original_text` (the file's text when it was read) when
// one is given; returns the text written.
std::string write_pipeline_file(const spec::PipelineSpec& spec, const std::filesystem::path& file,
                                const std::string& original_text = {});

// Applies `STAGE.PARAM=VALUE` overrides (the same text a params entry holds). Two names set the
// stage's own fields instead of a parameter: `STAGE.parallelism` and `STAGE.output_buffer` (its
// buffer_size), each a number or `autotune`. Throws SpecError naming an unknown stage or a
// malformed override.
void apply_overrides(PipelineDocument& doc, const std::vector<std::string>& overrides);

enum class ErrorPolicyKind { Fail, Skip };

struct GraphStage {
  std::string id;
  std::shared_ptr<const RegisteredOperator> op;
  Params params;
  std::vector<int> inputs;     // indices into Graph::stages, in the order the file lists them
  std::vector<int> consumers;  // the stages reading this one's output, each through its own buffer
  // The one stage reading this output, or -1 (a sink, or an output read by several stages).
  int sole_consumer() const { return consumers.size() == 1 ? consumers.front() : -1; }
  int parallelism = 1;
  int buffer_size = 0;  // 0: engine chooses
  bool autotune_workers = false;  // parallelism -1: the engine sets the workers while it runs
  bool autotune_buffer = false;   // buffer_size -1: the engine sizes the buffer while it runs
  ErrorPolicyKind error_policy = ErrorPolicyKind::Fail;
  int cycle_length = 1;  // expand stages: interleave
  int block_length = 1;
  std::optional<bool> interleave_deterministic;
  std::optional<bool> deterministic;  // the stage's own (StageSpec.deterministic); unset: the pipeline's
  // Whether the stage's parallel workers hand outputs on in input order.
  bool keeps_order(bool pipeline_deterministic) const { return deterministic.value_or(pipeline_deterministic); }
  // Whether an interleave takes its inputs' outputs in turn: its own setting, else the stage's.
  bool interleave_keeps_order(bool pipeline_deterministic) const {
    return interleave_deterministic.value_or(keeps_order(pipeline_deterministic));
  }
  // Runs once per input of the expand stage it reads (directly or through other per-input
  // stages), on that stage's readers (StageSpec.per_input).
  bool per_input = false;
  // Parameters set from hints of later stages, as "NAME = VALUE, from stage 'ID' (PARAM)".
  std::vector<std::string> notes;
};

// options.remote: how s3://, gs:// and http(s):// paths are read (core/modules/remote/README.md).
struct RemoteOptions {
  int max_attempts = 10;
  double deadline_seconds = 300;
  std::uint64_t range_bytes = 8u << 20;
  int ranges_ahead = 2;
  std::uint64_t part_bytes = 8u << 20;
  std::string endpoint_url, region, profile;
  bool anonymous = false;
  std::string cache_dir;  // options.remote_cache: "" for none
  std::uint64_t cache_max_bytes = std::uint64_t{100} << 30;
};

// A validated pipeline: stages in topological order (inputs before consumers).
struct Graph {
  std::vector<GraphStage> stages;
  std::uint64_t seed = 0;
  bool deterministic = true;
  bool fuse = true;
  std::string file;
  // Budgets of the autotuner (options.autotune): 0 leaves them to the engine (what the process
  // may use: its CPU affinity and cgroup quota; half of the memory its cgroup or machine allows).
  double cpu_budget = 0;
  std::uint64_t ram_budget = 0;
  bool autotune_budgets_given = false;
  bool autotunes() const;  // a stage autotunes, or budgets were given
  RemoteOptions remote;
  WorkerIdentity worker;
  std::vector<std::string> worker_notes;
};


// Every problem of the pipeline against the registry (empty when it can run).
std::vector<Problem> validate_pipeline(const PipelineDocument& doc, const Registry& registry);
// Validates and builds the graph; throws SpecError with every problem.
Graph build_graph(const PipelineDocument& doc, const Registry& registry);

// What `parallelism` means for a stage, decided here for every kind and used by validation, the
// engine, the studio and Python. Whether a stage of operator `info` takes workers (more than one
// thread when asked): maps, filters and sinks when stateless, expands (inputs read at once),
// aggregates when they assemble their outputs in parallel (AssemblesInParallel: `made`, the
// operator built; null before it is, when an aggregate counts as taking them); sources and
// combines never.
bool takes_workers(const OperatorInfo& info, const Operator* made);
// The same for an operator not built yet, built here from `params` (text values); nothing when
// that depends on parameters that do not build yet (an aggregate's, a shuffle's missing size).
std::optional<bool> takes_workers(const RegisteredOperator& op, const std::vector<std::pair<std::string, std::string>>& params);
// The threads a stage of operator `info` (built: `made`) runs on when it asks for `parallelism`.
int stage_threads(const OperatorInfo& info, const Operator& made, int parallelism);

// What plan_for_worker did, for the user: notes (where the shard went) and warnings (each worker
// reads everything; shards that may overlap; steps that may still differ).
struct WorkerPlan {
  std::vector<std::string> notes;
  std::vector<std::string> warnings;
};

// Makes `doc` the pipeline of `worker`: with several workers and `options.sharding` not off, a
// pipeline with no shard stage gets one (by file right after a file list that has at least as
// many files as workers, by record after its reader otherwise; `equal_steps` shards by record
// with a stage that evens the counts out); with sharding off, the seed becomes the worker's own.
// Records the identity in `doc` (see PipelineDocument::worker). Throws SpecError for a pipeline
// that cannot be split as asked.
WorkerPlan plan_for_worker(PipelineDocument& doc, const Registry& registry, const WorkerIdentity& worker);

}  // namespace sluice
