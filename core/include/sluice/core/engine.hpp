#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "checkpoint.pb.h"
#include "metrics.pb.h"
#include "sluice/core/delivery_ledger.hpp"
#include "sluice/core/spec.hpp"

namespace sluice {

// A stage whose operator refused to start (a pattern matching no file, an output it cannot
// write): the message names it, stage() gives its id.
class StageStartError : public Error {
 public:
  StageStartError(std::string message, std::string stage) : Error(std::move(message)), stage_(std::move(stage)) {}
  const std::string& stage() const { return stage_; }

 private:
  std::string stage_;
};

// A failure of a stage itself, no element's (a host operator whose remote end failed: the
// service's dispatcher refusing, a consumer of a coordinated job gone): the run ends whatever the
// error policy, and the message, which says what to do, is given as it is. Skipping would only ask
// the stage again.
class StageFailure : public Error {
 public:
  using Error::Error;
};

// What a host operator (core's own, not a plugin's) finds behind StageInfo::counters beyond
// StageCounters: elements skipped elsewhere on its behalf (on the service's workers, under the
// job's skip policy), counted and their reasons kept as the stage's own, so that the run's report
// shows them; and whether the run follows lineage (EngineOptions::lineage), so that a source
// whose elements are made elsewhere (the service's) has their records sent with them.
class HostStageCounters : public StageCounters {
 public:
  virtual void add_skipped(std::uint64_t count, const std::vector<std::string>& reasons) = 0;
  virtual bool follows_lineage() const = 0;
};

struct EngineOptions {
  // How often snapshots are published to subscribers.
  std::chrono::milliseconds snapshot_interval{200};
  // Output buffer of a stage whose file and operator name none: up to this many elements (several
  // hand-off chunks, so that producer and consumer overlap) and this many bytes (a few large
  // batches), whichever comes first. An explicit buffer_size counts elements only.
  std::size_t default_buffer = 256;
  std::uint64_t default_buffer_bytes = 128ull << 20;
  // Skip reasons kept per stage for the report.
  std::size_t kept_skip_reasons = 10;
  // The epoch this run's output starts at: a run that continues earlier runs of the same pipeline
  // (Python's next iter()) starts at the next epoch, with that epoch's shuffles and random draws.
  // Upstream of a repeat(k) the epochs scale by k, as they would in one run of k·n passes.
  std::uint64_t first_epoch = 0;
  // Continue from this checkpoint (Engine::checkpoint) as if the run it came from had never
  // stopped. The engine refuses, naming what differs, one taken of another pipeline or seed; an
  // operator refuses its own state when its inputs changed (another file list). `first_epoch`
  // comes from the checkpoint.
  std::shared_ptr<const checkpoint::Checkpoint> resume_from;
  // Or continue the checkpoint a job of another number of workers took: the file of each of them,
  // in worker order (this run being worker `worker_index` of `worker_count`). Only a pipeline
  // whose one source splits one order among the workers by position (random_access) can: what no
  // worker had delivered is split anew; stages holding other state are refused, by name.
  std::vector<std::shared_ptr<const checkpoint::Checkpoint>> resume_workers;
  std::int64_t worker_count = 1, worker_index = 0;
  // The outputs of stacking aggregates (batch, padded_batch) carry the origins of their rows
  // (sluice/origin_rows.hpp), in a pipeline a job of another number of workers could resume:
  // Python's iterator keeps them for its states.
  bool rows_of_outputs = false;
  // Lineage (sluice/core/lineage.hpp): every output carries its rows' records, each stamped with
  // the epoch it was read in. Off, nothing is stamped (it costs a look-up per element).
  bool lineage = false;
  // Stages whose operators offer the chunked form (sluice/chunk.hpp) pass many elements per call
  // where every stage of an edge can. Off: every stage goes element by element (the outputs are
  // the same; tests and benchmarks compare the two).
  bool chunks = true;
};

// Replay: one output of a run, its step of an epoch (counted from 0 in the epoch, at the input of
// the sink), made again (Engine::replay).
struct ReplayAt {
  std::uint64_t epoch = 0, step = 0;
};

enum class RunState { Created, Running, Finished, Stopped, Failed };
const char* run_state_name(RunState state);

struct RunResult {
  RunState state = RunState::Created;
  std::string error;  // when Failed: names the stage, the element and its origin
  std::string failed_stage;  // when Failed because of one stage: its id
  // Stopped at a checkpoint (Engine::checkpoint with then_stop): the sinks kept their outputs,
  // which hold exactly the data before the checkpoint.
  bool stopped_at_checkpoint = false;
};

// Runs a validated graph: worker threads per stage, bounded channels between stages (a stage's
// buffer), ordered parallel workers for stateless stages, epochs, per-stage error policy and
// metrics. The engine never calls into a GUI: observers poll snapshot() or subscribe.
class Engine {
 public:
  // Creates every stage's operator; throws Error naming the stage and plugin library on failure.
  explicit Engine(Graph graph, EngineOptions options = {});
  ~Engine();  // stops and joins
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts every operator (sinks open their files) and the workers. Throws Error naming the stage
  // whose start failed; nothing is left running then.
  void start();
  // Asks every worker to stop; returns at once. Safe from any thread, repeatedly.
  void stop();
  // Waits until the run finished, failed or stopped, joins every thread, finishes the operators.
  RunResult wait();
  // True once the workers are done (wait() then returns at once).
  bool wait_for(std::chrono::milliseconds timeout);
  RunState state() const;

  // A fresh snapshot of every stage's counters (thread-safe, any time).
  metrics::MetricsSnapshot snapshot() const;
  // Called on the engine's metrics thread every snapshot_interval, and once at the end.
  // Register before start().
  void subscribe(std::function<void(const metrics::MetricsSnapshot&)> callback);

  const Graph& graph() const;

  // Why this pipeline cannot be checkpointed (a stage whose operator cannot save its state, a run
  // that is not deterministic), one line per stage; empty when it can.
  std::vector<std::string> checkpoint_refusals() const;
  // Why a checkpoint of this pipeline could not be resumed by a job of another number of workers
  // (naming the stage); empty when it could (one random_access source, stages that hold only
  // elements).
  std::string why_not_on_other_workers() const;
  // Takes a checkpoint while the pipeline runs: sources pause at their next element, what they
  // made before reaches the sinks, every stage saves where it stands, and the run goes on (or,
  // with `then_stop`, stops there; its sinks keep their outputs). Blocks until then. nullopt when
  // the run ended or stopped first. Throws Error when the pipeline cannot be checkpointed or the
  // run is not running. One at a time; from any thread but a stage's.
  std::optional<checkpoint::Checkpoint> checkpoint(bool then_stop = false);
  // A state of the run where it begins: the pipeline's identity (seed, stages, parameters) and no
  // positions. Resumed from (EngineOptions::resume_from), it is checked like a checkpoint and the
  // run starts at its first epoch from the beginning (Python's state before the run's first cut).
  checkpoint::Checkpoint start_state() const;
  // The consumer side of a feed sink (gpu_feed) for the training loop; valid until the engine is
  // destroyed. Throws Error when the stage does not exist or is not a feed sink.
  Feed* feed(const std::string& stage_id) const;
  // Why this pipeline cannot make one step again directly (the stage that holds, drops or reorders
  // elements, or a source that reads in order); empty when it can: a source that starts anywhere
  // (random_access), maps, one batch, maps, one sink.
  std::string why_not_replayed_directly() const;
  // Instead of start(): makes step `at` directly, as the run gave it (the same records, the same
  // random draws), and hands it to the sink; the run then finishes as any (wait()). The time does
  // not grow with the step. Throws Error when it cannot (why_not_replayed_directly()).
  void replay(ReplayAt at);
  // (EngineOptions::lineage) What the sinks were delivered, all together, and the record counts of
  // the files read to their end; with `deliveries` false, those counts only (for a ledger kept
  // elsewhere: Python's, of what its loop took). Carried through checkpoints, a resumed run's
  // includes the run before it. Empty without lineage.
  DeliveryLedger delivery_ledger(bool deliveries = true) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
