#pragma once
// What the `sluice` command's subcommands share: exit codes, the interrupt flags, loading the
// plugins, and reading a pipeline as this worker's.
#include <csignal>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/service/service.hpp"

namespace sluice_cli {

constexpr int kExitRunFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInterrupted = 130;
// Stopped at a checkpoint on SIGTERM or SIGUSR1 (`--checkpoint`): the run can be resumed. 75 is
// sysexits' EX_TEMPFAIL, "try again later", which is what a preempted job should be.
constexpr int kExitCheckpointed = 75;

// Set by the signal handlers (main.cpp): a Ctrl-C, and a checkpoint asked for by SIGTERM/SIGUSR1.
extern volatile std::sig_atomic_t g_interrupted;
extern volatile std::sig_atomic_t g_checkpoint_and_stop;
void install_interrupt_handler(bool checkpoint_on_term);

struct CommonOptions {
  std::vector<std::string> plugin_dirs;
  bool no_registry_cache = false;
};

// --worker-index and --num-workers.
struct WorkerArgs {
  std::optional<int> index;
  std::optional<int> count;
};

// The search path and --plugin-dir; with `warn`, refused libraries are named on stderr (problems
// with the registry cache always are).
void load_plugins(sluice::Registry& registry, const CommonOptions& common, bool warn);

// Reads, overrides, makes it this worker's pipeline (see sluice::plan_for_worker) and validates;
// prints every problem and returns nullopt when invalid. `as_run`, when given, receives the
// pipeline as it will run: overrides, seed and the worker's shard applied.
std::optional<sluice::Graph> load_graph(const sluice::Registry& registry, const std::string& file,
                                        const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
                                        const WorkerArgs& worker_args, sluice::spec::PipelineSpec* as_run = nullptr,
                                        std::function<void(sluice::PipelineDocument&)> adapt = {}, const std::string& skip_records = {});

struct RunOptions {
  bool quiet = false;
  std::optional<double> progress_every;  // seconds; default 0.5 on a terminal, 10 otherwise
  std::string metrics_log;
  std::string metrics_addr;
  bool explain_autotune = false;
  std::string checkpoint_dir;    // --checkpoint
  std::string checkpoint_every;  // "N" batches (elements reaching the sinks) or "Ns" / "Nm" seconds
  std::string resume;            // --resume DIR or FILE
  bool timings = false;          // --timings: what the start cost, by phase
  std::string remote_cache;      // --remote-cache DIR: options.remote_cache.dir
  std::string ledger;            // --ledger FILE: follow lineage, write the delivery ledger at the end
  std::string skip_records;      // --skip-records FILE: "RECORD SOURCE" lines (sluice lineage's), dropped before the first batch
  bool report = true;            // the per-stage report at the end (commands built on a run say what they did instead)
};

// `sluice run` (run.cpp).
int cmd_run(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets,
            std::optional<std::uint64_t> seed, const WorkerArgs& worker_args, const RunOptions& options);

// `sluice replay` (replay.cpp): one step of a run made again, written to a JSON-lines file.
struct ReplayRequest {
  std::uint64_t step = 0, epoch = 0;
  std::string out;
};
// `sluice replay` (replay.cpp): step N made again and written to a file; of a pipeline file, or of
// a checkpoint's run (its pipeline file and seed).
int cmd_replay(const CommonOptions& common, std::string file, const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
               const WorkerArgs& worker_args, const ReplayRequest& request);
// A JSON string of `s` (main.cpp).
std::string json_string(std::string_view s);
// `sluice lineage` (replay.cpp): the records step N is made of, "RECORD SOURCE" per line (what
// --skip-records reads), or JSON lines; of a pipeline file, or of a checkpoint's run.
int cmd_lineage(const CommonOptions& common, std::string file, const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
                const WorkerArgs& worker_args, const ReplayRequest& request, bool json);

// `sluice index` (index.cpp): index files of TFRecord files, for random_access.
struct IndexRequest {
  std::vector<std::string> files;
  std::string index_dir;         // empty: FILE.idx beside each file
  std::string format = "sluice";  // or "dali"
  bool rebuild = false;
  int parallelism = 2;
  bool quiet = false;
};
int cmd_index(const CommonOptions& common, const IndexRequest& request);

// The service's part of the command. `sluice` is built without it: gRPC and the 45 libraries it
// brings cost 14 ms of every start. Its service_handoff.cpp continues each command that needs the
// service in libexec/sluice-service, the same command built with it (service.cpp), by exec: the
// same process, arguments, descriptors and signals.
//
// The command line as main() received it (what a hand-over passes on). libexec/sluice-service
// takes kHandedOver out of its environment, which a hand-over sets: a command that would hand over
// again is not built with the service, and says so rather than start itself without end.
void remember_command_line(int argc, char** argv);
constexpr const char* kHandedOver = "SLUICE_HANDED_OVER";
// `service_source`, the source that reads a job from the service's workers.
void add_service_operators(sluice::Registry& registry);
// PrepareOptions::split_distributed: a `distribute` stage and those before it become the job the
// service runs (where the service is not linked: a pipeline with one, or with a stage whose
// operator reads the service, continues in the command that has it).
void split_at_service(const sluice::Registry& registry, sluice::PipelineDocument& doc);

// The service's processes (service.cpp): each serves until SIGINT or SIGTERM, then exits 0.
struct DispatcherRequest {
  sluice::service::DispatcherOptions options;
  std::string metrics_addr;  // --metrics-addr: serve /metrics
};
int cmd_dispatcher(const DispatcherRequest& request);
struct WorkerRequest {
  sluice::service::WorkerOptions options;
  std::string metrics_addr;     // --metrics-addr: serve /metrics
  bool unix_socket = false;     // --unix-socket
};
int cmd_worker(const CommonOptions& common, WorkerRequest request);
// `sluice service workers`: what the dispatcher knows of its workers.
int cmd_service_workers(const std::string& dispatcher, const sluice::service::Security& security);

}  // namespace sluice_cli
