#pragma once
// The engine's insides, shared by the files that implement it (see core/README.md): what runs a
// stage (StageRuntime) and the engine's state (Engine::Impl). Not installed; nothing outside
// core/src includes it.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "autotune.hpp"
#include "channel.hpp"
#include "chunk_carrier.hpp"
#include "output_assembly.hpp"
#include "files/remote_access.hpp"
#include "input_places.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/row_origins.hpp"

namespace sluice {

// The field of a checkpoint's read input that names the file of a source's records (ReadInput of
// a source that ReadsRecordsAgain: its elements' references name their file so).
inline constexpr std::string_view kReadAgainFrom = "where";
std::optional<std::string> file_read_again(const checkpoint::ReadInput& input, const std::string& what);

using detail::Channel;
using detail::Outputs;
using detail::Item;
using detail::kAllIterations;
using detail::now_ns;
using detail::chunk_in;
using detail::rows_of;

inline constexpr std::size_t kChunk = 64;
inline constexpr std::uint64_t kChunkWorkNs = 2'000'000;  // most work one chunk of a parallel stage holds
inline constexpr std::uint64_t kFetchRunNs = 200'000;     // most work an interleave fetcher does before handing it on
inline constexpr int kMaxChunksAhead = 4;                  // chunks in flight per worker, ordered output
inline constexpr std::uint64_t kElementMajorNs = 20'000;   // fused groups costlier per element go element by element
// Rows in one chunk an expand hands on: kChunkRows, and up to kChunkRowsMost of rows so small that
// the chunk stays within kChunkBytes (a chunk costs the same to hand on whatever its rows, so
// small rows in chunks of 256 spent a reader's time on hand-overs; large rows stay at 256, as
// before, not holding more memory per chunk than they did). 256 KiB rather than 1 MiB: as fast or
// a little faster where measured (bench/README.md, parquet.py, stop 88), a quarter of the memory.
inline constexpr std::size_t kChunkRows = 256;
inline constexpr std::size_t kChunkRowsMost = 4096;
inline constexpr std::uint64_t kChunkBytes = 256u << 10;
// Per-input stages' read-ahead per input: finished outputs (batches, mostly), as many as fit in
// the bytes (at least one), and no more than the count.
inline constexpr std::size_t kPerInputReadAhead = 64;
inline constexpr std::uint64_t kPerInputReadAheadBytes = 16u << 20;
// Rows a per-input reader asks of its input at once: as many as keep what the stages make of them
// near kPerInputStepBytes (from the most any stage made per row so far), kPerInputFirstRows first.
inline constexpr std::uint64_t kPerInputStepBytes = 4u << 20;
inline constexpr std::size_t kPerInputFirstRows = 16;

// Where an element came from, kept across an operator call that consumes the element, for the
// message should the call throw. The description (a file name) is shared by the elements of one
// input: it is taken again only when it changes, not copied for every element, whose reference
// count, touched by every stage thread for every element, bounced between the cores.
class OriginKeeper {
 public:
  void keep(const Origin& origin) {
    if (origin.where != where_) where_ = origin.where;
    record_ = origin.record;
    byte_offset_ = origin.byte_offset;
  }
  std::string text() const { return Origin{where_, record_, byte_offset_}.text(); }

 private:
  std::shared_ptr<const std::string> where_;
  std::int64_t record_ = -1, byte_offset_ = -1;
};

// Threads carry their stage's id (Linux keeps 15 characters), so that top -H, perf and gdb show
// which stage a busy thread belongs to.
void name_this_thread(const std::string& name);

// A stage's parameters as checkpoints keep them ("name=value" lines), and the first line that
// differs between two such texts, in words (engine_checkpoint.cpp).
std::string params_text(const GraphStage& spec);
std::string first_difference(const std::string& was, const std::string& now);
// Those lines less the parameters a worker's identity fills (engine_elastic.cpp).
std::string params_of_any_worker(const GraphStage& spec, const std::string& text);

struct Counters {
  std::atomic<std::uint64_t> elements_in{0}, elements_out{0}, bytes_in{0}, bytes_out{0};
  std::atomic<std::uint64_t> busy_ns{0}, starved_ns{0}, blocked_ns{0};
  std::atomic<std::uint64_t> errors_skipped{0}, epoch{0};
  std::atomic<std::uint64_t> chunked_elements_out{0}, chunks_out{0};
};

inline void add(std::atomic<std::uint64_t>& counter, std::uint64_t value) { counter.fetch_add(value, std::memory_order_relaxed); }

inline std::uint64_t bytes_of(const std::vector<Item>& items) {
  std::uint64_t n = 0;
  for (const auto& item : items) n += item.sample.nbytes();
  return n;
}

// What went wrong in one chunk of an ordered parallel stage, reported on the chunk's commit turn
// so that reasons and failures come in input order whichever worker met them first.
struct StageRuntime;
struct ChunkIssues {
  std::string failure;
  const StageRuntime* failed_stage = nullptr;
  std::vector<std::pair<StageRuntime*, std::string>> skip_reasons;  // a fused group's members too
};

struct StageRuntime {
  const GraphStage* spec = nullptr;
  // Declared before `op`: the operator's code lives in the library this keeps loaded.
  std::shared_ptr<const RegisteredOperator> registered;
  std::unique_ptr<Operator> op;
  Source* source = nullptr;
  Map* map = nullptr;
  Filter* filter = nullptr;
  Expand* expand = nullptr;
  Aggregate* aggregate = nullptr;
  Sink* sink = nullptr;
  Combine* combine = nullptr;
  // Chunks (sluice/chunk.hpp): the chunked form of a map or an aggregate when the stage takes
  // chunks, and whether it hands chunks on (every reader takes them). See Engine::start().
  ChunkedMap* chunked_map = nullptr;
  ChunkedAggregate* chunked_aggregate = nullptr;
  bool emits_chunks = false;
  // An aggregate whose role is OperatorRole::Repeats (a plugin built for 6.10): its inputs are
  // handed on as they come, chunks whole where its readers take them, its operator not called.
  bool passes_through = false;
  // An aggregate whose outputs stack its inputs (batch), when outputs carry their rows
  // (EngineOptions::rows_of_outputs); and the rows it held when its state was restored.
  StacksItsInputs* stacks = nullptr;
  bool draws_keys = false;  // (EngineOptions::lineage) a random map: its key joins each output's lineage
  std::vector<Origin> restored_rows;

  StageInfo info;
  std::unique_ptr<Outputs> output;  // a buffer per reader; null for sinks
  // What the stage reads, in its inputs' order, and who produces each (a fused member reads
  // nothing itself). `input` is the first: the only one of every kind but combine.
  std::vector<Channel*> inputs;
  std::vector<int> input_stages;
  Channel* input = nullptr;
  int workers = 1;
  bool assembles_in_parallel = false;  // an aggregate deriving from AssemblesInParallel
  std::int64_t demand = 1;                // output iterations wanted (kUnbounded: forever)
  std::int64_t passes_per_iteration = 1;  // aggregates: input iterations per output iteration
  // The pipeline epochs of the first iteration of this stage's input (a source: of its first pass)
  // and of its output; they differ only after a repeat. Operators see these epochs, which are not
  // 0 when the run continues earlier ones (EngineOptions::first_epoch); channels count from 0.
  std::uint64_t first_input_epoch = 0, first_output_epoch = 0;
  bool keeps_reading = false;
  bool started = false;
  std::atomic<std::int64_t> expected_elements{0};  // sources: what the run will read, 0 unknown
  std::atomic<std::uint64_t> pass_position{0};     // sources: read of the current pass
  std::atomic<std::int64_t> pass_elements{0};      //   of these (0: unknown)
  std::atomic<std::uint64_t> pass_epoch{0};        //   in this epoch

  // Fusion: adjacent stateless maps (and a last filter) with the same parallelism run in the
  // workers of the first one, the head, without a channel between them. Each keeps its metrics.
  std::vector<StageRuntime*> fused;    // on the head: the members after it, in order
  StageRuntime* fused_head = nullptr;  // on a member: the head running it
  StageRuntime& exit() { return fused.empty() ? *this : *fused.back(); }
  // Threads the engine starts: an expand stage's one coordinator starts its own fetchers, an
  // aggregate's its assembly threads (workers - 1 of them: the stage's thread assembles too).
  int threads() const { return expand || aggregate ? 1 : workers; }

  // Autotune: `workers` threads are started (the most the stage may get); those whose index is
  // at or above `active_workers` wait until the tuner raises it, and a worker above a lowered
  // count finishes its chunk first. Ordered commits make the count invisible in the output.
  bool tuned_workers = false, tuned_buffer = false;
  std::atomic<int> active_workers{1};
  std::atomic<bool> input_finished{false};  // parked workers leave once the input has ended
  std::mutex park_mutex;
  std::condition_variable park_cv;
  // Worker time available so far (active workers x time), for the busy fractions: guarded by
  // park_mutex.
  std::uint64_t worker_ns_before = 0, active_since_ns = 0;
  int running_workers() const { return tuned_workers ? active_workers.load(std::memory_order_relaxed) : workers; }
  double worker_capacity_ns(std::uint64_t now, std::uint64_t start) {
    if (!tuned_workers) return static_cast<double>(now - start) * workers;
    std::lock_guard lock(park_mutex);
    const std::uint64_t since = active_since_ns ? active_since_ns : start;
    return static_cast<double>(worker_ns_before) + static_cast<double>(now > since ? now - since : 0) * active_workers.load();
  }
  void set_active_workers(int count, std::uint64_t now, std::uint64_t start) {
    {
      std::lock_guard lock(park_mutex);
      const std::uint64_t since = active_since_ns ? active_since_ns : start;
      worker_ns_before += (now > since ? now - since : 0) * static_cast<std::uint64_t>(active_workers.load());
      active_since_ns = now;
      active_workers.store(count);
    }
    park_cv.notify_all();
  }
  void finish_input() {
    {
      std::lock_guard lock(park_mutex);
      input_finished.store(true);
    }
    park_cv.notify_all();
  }

  Counters counters;
  std::mutex reasons_mutex;
  std::vector<std::string> skip_reasons;
  std::map<std::string, std::uint64_t> skip_reason_counts;  // by reason_kind()

  // Shared by the workers of one stage: input order, iteration bookkeeping and ordered commits.
  std::mutex pop_mutex;
  std::uint64_t next_seq = 0;
  std::uint64_t in_iteration = 0, in_index = 0;
  bool input_done = false;
  std::mutex commit_mutex;
  std::condition_variable commit_cv;
  std::uint64_t next_commit = 0;
  int in_flight = 0;  // chunks taken and not yet committed
  // Ordered output: chunks finished before their turn wait here (by sequence number) while their
  // worker goes on with the next one; whoever finishes the chunk in turn commits the run of them.
  struct FinishedChunk {
    std::vector<Item> out;
    ChunkIssues issues;
    bool ok = true;
  };
  std::map<std::uint64_t, FinishedChunk> finished;
  // Recent cost of one element through the stage (or its fused group): sizes chunks, and picks
  // element-major order for expensive fused groups (see process_chunk).
  std::atomic<std::uint64_t> ns_per_element{0};

  // Checkpoints (engine_checkpoint.cpp): the cut this stage saved its state for last, whether it
  // has handed on its end of stream, what a resumed run restores it from, and the elements it
  // read again to get back there (an interleave's open inputs up to where they were).
  std::uint64_t output_fingerprint = 0;  // StageInfo::input_fingerprint of its readers, in part
  std::uint64_t saved_cut = 0;
  std::atomic<bool> ended{false};
  const checkpoint::StageState* restore = nullptr;
  std::atomic<std::uint64_t> reread{0};
  // Field names, types and the smallest and largest size of each dimension of this stage's
  // outputs, from its first outputs and then one per metrics snapshot: the studio's inspector shows them
  // (ragged and padded batches change shape from one to the next). Set by observe_output().
  struct ObservedField {
    std::string name;
    DType dtype = DType::U8;
    Shape min, max;
  };
  std::atomic<bool> sample_output{true};
  // The first outputs are all looked at (a short run's, and the first batches' ranges); then one
  // per snapshot: a relaxed load or two per chunk.
  std::atomic<std::uint32_t> eager_samples{16};
  std::mutex observed_mutex;
  std::vector<ObservedField> observed;
  std::uint64_t observed_outputs = 0;
  void observe_output(const std::vector<Item>& out) {
    if (eager_samples.load(std::memory_order_relaxed) > 0) {
      std::lock_guard lock(observed_mutex);
      for (const auto& item : out) {
        if (!item.is_element()) continue;
        const std::uint32_t left = eager_samples.load(std::memory_order_relaxed);
        if (left == 0) break;
        eager_samples.store(left - 1, std::memory_order_relaxed);  // (under the lock: one writer at a time)
        merge_observed(item.sample);
      }
      return;
    }
    if (!sample_output.load(std::memory_order_relaxed)) return;
    for (const auto& item : out) {
      if (!item.is_element()) continue;
      if (!sample_output.exchange(false)) return;
      std::lock_guard lock(observed_mutex);
      merge_observed(item.sample);
      return;
    }
  }
  void merge_observed(const Sample& sample) {
    if (const Chunk* chunk = detail::chunk_in(sample)) {  // its elements are its rows
      if (chunk->rows() > 0) merge_observed(chunk->row(0));
      return;
    }
    ++observed_outputs;
    for (const auto& f : sample.fields()) {
      auto it = std::find_if(observed.begin(), observed.end(), [&](const ObservedField& o) { return o.name == f.name; });
      if (it == observed.end()) {
        observed.push_back({f.name, f.tensor.dtype(), f.tensor.shape(), f.tensor.shape()});
        continue;
      }
      it->dtype = f.tensor.dtype();
      if (it->min.size() != f.tensor.rank()) {  // another rank: start again from this one
        it->min = it->max = f.tensor.shape();
        continue;
      }
      for (std::size_t d = 0; d < f.tensor.rank(); ++d) {
        it->min[d] = std::min(it->min[d], f.tensor.shape()[d]);
        it->max[d] = std::max(it->max[d], f.tensor.shape()[d]);
      }
    }
  }
  // What the operator reports through StageInfo::counters.
  struct OperatorCounters final : HostStageCounters {
    std::atomic<std::uint64_t> padding{0}, data{0};
    std::function<void(std::uint64_t, const std::vector<std::string>&)> skipped;  // set by the engine
    void add_padding(std::uint64_t padding_values, std::uint64_t data_values) override {
      padding.fetch_add(padding_values, std::memory_order_relaxed);
      data.fetch_add(data_values, std::memory_order_relaxed);
    }
    void add_skipped(std::uint64_t count, const std::vector<std::string>& reasons) override {
      if (skipped) skipped(count, reasons);
    }
    bool lineage = false;  // set by the engine
    bool follows_lineage() const override { return lineage; }
  } operator_counters;
  StageRemoteStorage remote_storage;  // StageInfo::storage: counts this stage's remote requests
  // An interleave's inputs, by the origin their outputs share: a checkpoint names an element a
  // later stage holds by its input and place in it. An entry lasts while an element with that
  // origin does (`where` is not owned here): a reader that gives each record an origin of its own
  // made one entry per record, kept for the run (3 M rows of a CSV held 1.2 GB).
  struct ReadInput {
    std::weak_ptr<const std::string> where;
    Sample input;
    std::uint64_t epoch = 0, index = 0;  // the context it was opened with
  };
  std::mutex read_inputs_mutex;
  std::unordered_map<const std::string*, ReadInput> read_inputs;
  std::size_t read_inputs_after_last_sweep = 0;
  // Registers the input that gives elements of origin `where`, and drops the entries no element
  // refers to any more (each time the map has doubled since the last sweep: amortised O(1)).
  void register_read_input(const std::shared_ptr<const std::string>& where, ReadInput input) {
    std::lock_guard lock(read_inputs_mutex);
    read_inputs[where.get()] = std::move(input);
    if (read_inputs.size() < 2 * read_inputs_after_last_sweep + 64) return;
    std::erase_if(read_inputs, [](const auto& entry) { return entry.second.where.expired(); });
    read_inputs_after_last_sweep = read_inputs.size();
  }
  // A stage that holds elements (an aggregate): the interleave its input comes from through
  // stateless maps only, or the source that reads records again (ReadsRecordsAgain) through
  // them and repeats (-1: none), and those maps in order. Its elements can be read again.
  int reads_from = -1;
  ReadsRecordsAgain* rereads = nullptr;  // reads_from's, when it is such a source
  std::vector<StageRuntime*> maps_since_read;
  // Of those, the maps after a stage that hands on its inputs (`shuffle -> map -> batch`), which
  // saw the places the holder's inputs had, not where they were read: the holder remembers those
  // places, and at a cut the epoch whose places were still the maps' (none dropped one).
  std::size_t maps_after_hand_on = 0;
  std::unique_ptr<InputPlaces> input_places;
  std::optional<std::uint64_t> made_places_hold_in;
  // The stage right after such maps (the holder, or a shuffle before it): an element whose place
  // in its input differs from where it was read went past a map that dropped an element before
  // it, so those maps gave it another index than a reference would give again (a random map's
  // draws): it forgets its read position, and is kept by value.
  bool checks_read_positions = false;
  // After a source that reads again, a source does not know the places the maps see (a repeat
  // between): the first of the maps gives its outputs the place each had there (or, without
  // maps, the stage after them, its inputs their places in its input).
  bool stamps_read_positions = false;

  // For the recent rates of snapshots: the previous snapshot's counts (devices), and the counts of
  // the snapshots of the last kRecentRateWindowNs (elements and bytes, which a stage handing on
  // chunks hands on many at a time: over one snapshot's interval it would swing to zero and back).
  std::uint64_t previous_ns = 0;
  struct RateSample {
    std::uint64_t ns, elements, bytes;
  };
  std::deque<RateSample> rate_samples;
  std::vector<std::uint64_t> previous_device_bytes;  // feed sinks: per device
  // A sink's delivery ledger (EngineOptions::lineage): the records of each element it consumed.
  std::unique_ptr<DeliveryLedger> ledger;
};

struct Engine::Impl {
  Graph graph;
  EngineOptions options;
  // (EngineOptions::lineage) The record counts of the files readers reached the end of, for the
  // sinks' ledgers (a ledger of no deliveries: it locks itself).
  DeliveryLedger files_read;
  void file_read_to_end(const std::string& where, std::int64_t first, std::int64_t end) { files_read.know_records(where, first, end); }
  // files_read, what the sources that know their records say now (a service's source learns
  // them split by split) and the records the run was told to skip, added to `into`.
  void add_records_known(DeliveryLedger& into) const;
  // Replay (replay.cpp): the stages one output goes through, from the source to the sink.
  struct ReplayChain {
    StageRuntime *source = nullptr, *batch = nullptr, *sink = nullptr;
    std::vector<StageRuntime*> maps_before, maps_after;  // the batch's
  };
  std::string replay_chain(ReplayChain& chain) const;  // why not; empty: it can
  std::optional<ReplayAt> replay_at;
  ReplayChain replaying;  // (Engine::replay found it)
  void replay_step();
  void launch_replay();
  // A sink's ledger as a checkpoint keeps it: with the files' record counts.
  void save_ledger(const StageRuntime& sink, checkpoint::StageState& state) const {
    if (!sink.ledger) return;
    DeliveryLedger saved = *sink.ledger;
    add_records_known(saved);
    saved.save(*state.mutable_ledger());
  }
  std::vector<std::unique_ptr<StageRuntime>> stages;
  std::atomic<bool> stopping{false};
  std::atomic<int> state{static_cast<int>(RunState::Created)};
  std::atomic<int> sinks_done{0};
  int sink_count = 0;

  std::mutex done_mutex;
  std::condition_variable done_cv;
  int live_workers = 0;
  std::once_flag finalized;
  std::vector<std::thread> threads;

  mutable std::mutex error_mutex;
  bool failed = false;
  std::string error;
  std::string failed_stage;  // the stage the error is about, when it is about one

  std::uint64_t start_ns = 0;
  std::atomic<std::uint64_t> end_ns{0};

  std::vector<std::function<void(const metrics::MetricsSnapshot&)>> subscribers;
  std::thread publisher;
  std::mutex publish_mutex;
  std::condition_variable publish_cv;
  bool publisher_quit = false;
  mutable std::mutex snapshot_mutex;
  mutable std::uint64_t sequence = 0;

  // Autotune (graph.autotunes()): the budgets, the tuner's thread and what it decided.
  bool autotune = false;
  double cpu_budget = 0;
  std::string cpu_budget_source, ram_budget_source;
  std::uint64_t ram_budget = 0, buffer_budget = 0;
  std::thread tuner;
  mutable std::mutex tune_mutex;
  std::vector<metrics::AutotuneChange> tune_changes;
  std::uint64_t tune_changes_left_out = 0;
  // The CPU budget at every moment: a worker of a tuned stage holds one of `cores_total` while it
  // computes, so that generous worker counts (a worker is not a core) never add up to more.
  std::mutex cores_mutex;
  std::condition_variable cores_cv;
  int cores_total = 1, cores_in_use = 0;

  // Holds a core of the budget for a tuned stage's work (nothing for other stages).
  class CoreHold {
   public:
    CoreHold(Impl& impl, const StageRuntime& st) : impl_(impl), counted_(st.tuned_workers) {
      if (!counted_) return;
      std::unique_lock lock(impl_.cores_mutex);
      while (impl_.cores_in_use >= impl_.cores_total && !impl_.stopping.load())
        impl_.cores_cv.wait_for(lock, std::chrono::milliseconds(50));
      held_ = !impl_.stopping.load();
      if (held_) ++impl_.cores_in_use;
    }
    ~CoreHold() {
      if (!counted_ || !held_) return;
      {
        std::lock_guard lock(impl_.cores_mutex);
        --impl_.cores_in_use;
      }
      impl_.cores_cv.notify_one();
    }
    CoreHold(const CoreHold&) = delete;
    CoreHold& operator=(const CoreHold&) = delete;
    bool held() const { return held_ || !counted_; }

   private:
    Impl& impl_;
    bool counted_, held_ = false;
  };
  void set_cores_for_tuned(int count);

  // ---- control ----

  void request_stop();

  void fail(const std::string& message, const StageRuntime* at = nullptr);
  bool stopped_remote_work(const StageRuntime* at) const;

  std::string stage_label(const StageRuntime& st) const;

  // Handles an exception thrown by an operator for one element. Returns true to go on.
  // With `deferred`, the reason or failure is stored there instead (see ChunkIssues).
  // Called inside a catch block. Running out of memory is no element's fault: it ends the run
  // under any policy, blamed on the stage that asked, with no advice to skip elements.
  bool element_error(StageRuntime& st, const char* what, std::uint64_t epoch, std::uint64_t index, const std::string& origin, ChunkIssues* deferred = nullptr);
  // What the failure message of an element suggests: the skip policy, or, for an element that
  // does not fit the parameters before any has passed (SchemaMismatch), fixing them.
  std::string failure_advice(const StageRuntime& st) const;

  // Ends the run blaming `st` now, or, with `deferred`, when its chunk is committed in order.
  void fail_or_defer(StageRuntime& st, std::string message, ChunkIssues* deferred);

  // Inside a catch: whether the exception being handled is a `Kind` (a ParamError: a parameter
  // that does not fit the data; a SchemaMismatch; std::bad_alloc: out of memory).
  template <class Kind>
  static bool current_exception_is() {
    if (!std::current_exception()) return false;
    try {
      std::rethrow_exception(std::current_exception());
    } catch (const Kind&) {
      return true;
    } catch (...) {
    }
    return false;
  }
  static bool handling_out_of_memory() { return current_exception_is<std::bad_alloc>(); }
  std::string largest_holder() const;  // for out_of_memory_message
  std::string out_of_memory_message(const StageRuntime& st) const;

  void keep_skip_reason(StageRuntime& st, std::string reason);

  void report_issues(ChunkIssues& issues);

  // The consumer `st` wants nothing more of its input iterations <= `iteration`; tell every stage
  // upstream at once, so a source stops producing what would only be thrown away.
  // With `only_input`, only that input of a combine stage (the rest of an iteration it left unread).
  void skip_input(StageRuntime& st, std::int64_t iteration, int only_input = -1);
  // One of `producer`'s readers skipped more: send upstream what no reader wants any more.
  void skip_upstream_of(StageRuntime& producer);

  // Hands `out` to the stage's output channel (its group's, when fused); the wait counts as blocked.
  bool flush(StageRuntime& st, std::vector<Item>& out);
  // The same for a source that gives way to cuts: what `give_way()` kept out stays in `out`.
  template <class GiveWay> bool flush(StageRuntime& st, std::vector<Item>& out, GiveWay give_way) {
    if (out.empty()) return !stopping.load(std::memory_order_relaxed);
    StageRuntime& exit = st.exit();
    exit.observe_output(out);
    const std::uint64_t t0 = now_ns();
    const bool ok = exit.output->reader(0).push(out, give_way);
    add(exit.counters.blocked_ns, now_ns() - t0);
    return ok;
  }
  StageRuntime& group_head_of(int stage) const {
    StageRuntime& st = *stages[static_cast<std::size_t>(stage)];
    return st.fused_head ? *st.fused_head : st;
  }
  // A source (with the stages fused into it) whose one reader is an expand (a file list and its
  // reader) puts a cut's barrier into its buffer as it stands, rather than after what it has made,
  // and the expand takes the cut from there without emptying the buffer (stage_source.cpp,
  // stage_expand_cut.cpp). Other readers take a source's barrier after what it made, as does a
  // job of another number of workers the place a random_access source saved.
  bool source_gives_way_to_cuts(StageRuntime& st) const {
    if (!st.source || !st.exit().output || st.exit().output->readers() != 1) return false;
    if (dynamic_cast<ResumesOnOtherWorkers*>(st.op.get())) return false;
    const int reader = st.exit().spec->sole_consumer();
    return reader >= 0 && stages[static_cast<std::size_t>(reader)]->expand && !stages[static_cast<std::size_t>(reader)]->spec->per_input;
  }

  // ---- checkpoints (engine_checkpoint.cpp) ----
  // A checkpoint is a cut: sources (and stages producing on their own: an interleave, a replaying
  // cache) stop at an element boundary, save where they are and hand on a barrier; every other
  // stage saves its state when the barrier reaches it, after everything before it. When every
  // stage has saved (or ended), the run goes on, or stops there.
  struct Cut {
    std::uint64_t generation = 0;
    std::vector<std::optional<checkpoint::StageState>> states;
    bool complete = false;
    bool then_stop = false;  // the run stops at this cut: nothing may go on past it
  };
  std::mutex cut_mutex;
  std::condition_variable cut_cv;
  std::unique_ptr<Cut> cut;                        // guarded by cut_mutex
  std::atomic<std::uint64_t> cut_wanted{0};        // the generation being taken; 0: none
  std::atomic<std::uint64_t> cut_released{0};      // the last generation the run went on after
  std::uint64_t cut_generations = 0;
  std::atomic<bool> stopped_at_checkpoint{false};
  std::uint64_t checkpoints_taken = 0;
  std::shared_ptr<const checkpoint::Checkpoint> resume;  // what this run continues
  // A checkpoint of another number of workers this run continues (engine_elastic.cpp): their
  // files, the source that splits what they left, and the records they held (given back to it).
  std::vector<std::shared_ptr<const checkpoint::Checkpoint>> resume_workers;
  StageRuntime* resharded_source = nullptr;
  checkpoint::StageState resharded_source_positions;
  std::vector<ResumesOnOtherWorkers::Held> held_at_cut;
  std::vector<ResumesOnOtherWorkers::Held> taken_after_cut;  // Python states': read after the cut, delivered

  bool cut_requested(const StageRuntime& st) const {
    const std::uint64_t wanted = cut_wanted.load(std::memory_order_relaxed);
    return wanted != 0 && st.saved_cut != wanted;
  }
  // Saves `st` (and the members of its fused group) for the cut being taken: `engine` writes the
  // engine's positions, then the operator writes its own. False when the run must stop.
  // `operator_state`, when given, writes the operator's state in its place (a combine's, kept aside
  // as its current output began). `member_positions`, when given, writes the positions of member
  // k (from 1) of the fused group in place of `engine`'s.
  bool save_stage(StageRuntime& st, const std::function<void(StateWriter&)>& engine, std::string summary, std::uint64_t open_inputs_to_seek = 0,
                  const std::function<void(StateWriter&)>* operator_state = nullptr,
                  const std::function<void(StateWriter&, std::size_t)>* member_positions = nullptr);
  // A stage that saved for a cut the run stops at waits here; false when the run stops.
  bool wait_for_release(const StageRuntime& st);
  // `st` handed on its end of stream: it has nothing to save in any later cut.
  void stage_ended(StageRuntime& st);
  void complete_cut_if_ready_locked();
  // Engine::start()'s phases (engine.cpp), in order.
  // Starts every operator, downstream first (memory a stage offers reaches the stages before it); a
  // failure finishes those started and throws StageStartError naming the stage.
  void start_operators();
  // A resumed run: every operator takes back the state it saved; throws Error naming the stage.
  void restore_states();
  // Each stage's passes and epochs; what each reader of a stage wants of it.
  std::vector<std::vector<std::int64_t>> plan_iterations();
  // Per-input stages join the group of the interleave they read.
  void group_per_input_stages();
  // Stateless maps fused with the stateless stage that reads them.
  void fuse_stages();
  void fuse_into_sources();
  // Every stage's output buffer (one per reader) and each reader's inputs.
  std::size_t inputs_an_interleave_wants_ahead(int i) const;
  void make_buffers(const std::vector<std::vector<std::int64_t>>& wanted_by_reader);
  // Which stages take and hand on chunks.
  void choose_chunks();
  // A resumed run's ordered parallel stages go on from their saved positions.
  void restore_ordered_positions();
  bool keeps_ordered_positions(const StageRuntime& st) const;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> position_before(const StageRuntime& st) const;
  // The workers of every stage, the tuner and the metrics publisher: the run begins.
  void launch_workers();
  // Matches the graph against `resume` and hands every stage its saved state; throws Error
  // naming what differs.
  void attach_resume_state();
  // Restores the operator of `st` from its saved state (after start()); throws Error.
  void restore_operator(StageRuntime& st);
  // Matches the graph against the checkpoint of another number of workers (resume_workers), which
  // only a pipeline whose one source splits its order by position and whose other stages hold
  // nothing but elements can continue; throws Error naming the stage that cannot.
  void attach_resume_on_other_workers();
  // Why no job of another number of workers could continue a checkpoint of this pipeline, naming
  // the stage (empty: one could; `split_source` is then its source).
  std::string why_not_on_other_workers(StageRuntime** split_source, const std::string& job, const std::string& resume_as_taken) const;
  // Hands the source what the workers had read, and publishes the outputs they were writing that
  // fall to this worker (after start()).
  void restore_on_other_workers();
  void gather_held_at_cut(const std::vector<std::shared_ptr<const checkpoint::Checkpoint>>& job, std::vector<ResumesOnOtherWorkers::Held>& held,
                          std::vector<ResumesOnOtherWorkers::Held>& taken) const;
  void split_source_of(const std::vector<std::shared_ptr<const checkpoint::Checkpoint>>& job, Operator& source, std::int64_t workers,
                       std::int64_t worker);
  std::optional<std::string> source_state_of(const checkpoint::Checkpoint& c, std::size_t workers, std::size_t worker);
  void publish_outputs_of_earlier_workers();
  // Which interleave each aggregate's elements can be read again from (StageRuntime::reads_from).
  void find_read_paths();
  std::vector<StageRuntime*> stateless_maps_before(int& at) const;
  bool hands_on_its_inputs(int at) const;
  bool made_places_hold_at_cut(const StageRuntime& holder, std::uint64_t epoch, std::uint64_t index);
  // Describes an element `holder` holds as a reference when it can be read again.
  bool refer_to(StageRuntime& holder, const Sample& element, checkpoint::StageState& state,
                std::unordered_map<const std::string*, std::uint32_t>& inputs, checkpoint::Element& out);
  // Reads again every element `st`'s saved state names by reference, in file order.
  std::vector<Sample> read_referenced(StageRuntime& st);
  void read_again(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out, std::vector<std::string>& names);
  void read_from_inputs(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out, std::vector<std::string>& names);
  const checkpoint::ReadInput& checked_read_input(const StageRuntime& st, int number) const;
  void make_again(StageRuntime& st, const std::vector<int>& refs, std::vector<Sample>& out, const std::vector<std::string>& names);
  // A stage the checkpoint's run had ended: it hands on its end of stream at once. True if so.
  bool end_if_ended_before(StageRuntime& st, std::vector<Item>& out);
  // Items a stage held (an interleave's inputs waiting, a combine's), saved and read back.
  static void put_item(StateWriter& w, const Item& item);
  static Item get_item(StateReader& r);
  // Reads the engine's positions a stage saved (the same order `engine` wrote them).
  std::unique_ptr<CheckpointStateReader> engine_state_reader(const StageRuntime& st) const;

  // ---- the stage loops (stage_source.cpp, stage_parallel.cpp, stage_expand.cpp,
  // stage_combine.cpp, stage_aggregate.cpp) ----

  // Collects a stage's outputs into `out` (flushed to its output a chunk at a time). With an
  // OutputAssembly (an aggregate with assembly threads), outputs queue there in order and reach
  // `out` when settle() finds them made.
  class CollectingEmitter final : public Emitter, public ParallelAssembly {
   public:
    CollectingEmitter(Impl& impl, StageRuntime& st, std::vector<Item>& out, detail::OutputAssembly* assembly = nullptr)
        : impl_(impl), st_(st), out_(out), assembly_(assembly) {}
    std::uint64_t iteration = 0;
    bool push(Sample sample) override {
      if (!wanted()) return false;
      if (assembly_ && assembly_->queue_made(sample)) return settle(false);
      attach_rows(sample);
      return hand_on(std::move(sample));
    }
    bool push_assembled(std::function<Sample()> assemble) override {
      if (!wanted()) return false;
      if (!assembly_) {
        Sample made = assemble();
        attach_rows(made);
        return hand_on(std::move(made));
      }
      assembly_->queue(std::move(assemble));
      return settle(false);
    }
    // Hands on the queued outputs that are made, in order: with `all`, every one (waiting for
    // them); else as many as leave at most a few per assembly thread pending. False when the run
    // stops (an assembly that threw fails it, naming the stage).
    bool settle(bool all);

    // A stacking aggregate's rows (StageRuntime::stacks): the inputs it took that no output
    // stacked yet, in order. Its next output stacks the first inputs_per_output() of them (the
    // last of an iteration, those left); an input it refused is taken back.
    void took(const Origin& origin) {
      if (st_.stacks) pending_rows_.push_back(origin);
    }
    void took(const Chunk& rows) {
      if (st_.stacks) pending_rows_.append(rows, 0, rows.rows());
    }
    void took_back(std::size_t inputs) {
      if (st_.stacks) pending_rows_.drop_back(inputs);
    }
    void held_when_restored(const std::vector<Origin>& restored) {
      if (st_.stacks) pending_rows_.push_front(restored);
    }
    void iteration_ended() { pending_rows_.clear(); }  // a remainder dropped (drop_remainder)
    // An input handed on as it is, `rows` elements (a chunk's rows) counted; dropped, as push()
    // drops it, in an iteration downstream stopped wanting. False when the run stops.
    bool pass_on(Sample sample, std::size_t rows) {
      if (impl_.stopping.load(std::memory_order_relaxed)) return false;
      if (rows == 0 || st_.exit().output->skipped(iteration)) return true;
      if (chunk_in(sample)) {
        add(st_.counters.chunks_out, 1);
        add(st_.counters.chunked_elements_out, rows);
      }
      add(st_.counters.elements_out, rows - 1);  // and hand_on()'s one
      return hand_on(std::move(sample));
    }

   private:
    bool wanted() const { return !impl_.stopping.load(std::memory_order_relaxed) && !st_.exit().output->skipped(iteration); }
    bool hand_on(Sample sample) {
      add(st_.counters.elements_out, 1);
      add(st_.counters.bytes_out, sample.nbytes());
      out_.push_back(Item::element(std::move(sample)));
      if (out_.size() >= kChunk) return impl_.flush(st_, out_);
      return true;
    }
    void attach_rows(Sample& output);
    Impl& impl_;
    StageRuntime& st_;
    std::vector<Item>& out_;
    detail::OutputAssembly* assembly_;
    std::vector<Sample> made_;
    RowOrigins pending_rows_;  // (as numbers: a batch of 65,536 rows keeps no 65,536 copies of a file's name)
  };

  // Source stages: passes over the data on one thread (stage_source.cpp).
  class SourceStage;
  void run_source(StageRuntime& st);

  // A tuned stage's worker above the active count waits here; false when it should leave (the
  // run stops, or the stage's input ended).
  bool wait_until_active(StageRuntime& st, int index);

  // Map, filter, expand and sink stages: one or more workers take chunks of the input in order,
  // process them concurrently and commit their outputs in input order (deterministic) or as they
  // finish. Control items wait until every earlier chunk is committed.
  class ParallelStage;
  void run_stateless(StageRuntime& st, int index);

  // Runs one element through one stage: a map replaces the sample, a filter may drop it (`kept`
  // false), a sink consumes it. False when the run must stop (fail policy).
  bool apply(StageRuntime& st, Item& item, const ElementContext& ctx, bool& kept, ChunkIssues* deferred_failure, OriginKeeper& origin);

  // Runs one chunk through the stage, or through every member of its fused group. In a group,
  // every member sees the element's index at the group's input: maps keep positions, and a filter
  // can only be the last member. Cheap elements go stage by stage over the whole chunk (one clock
  // reading per stage and chunk); expensive ones (decoded images) go element by element through
  // all members, so that each stays in cache from one stage to the next.
  bool process_chunk(StageRuntime& st, std::vector<Item>& in, std::vector<Item>& out, std::uint64_t epoch, std::uint64_t base_index, ChunkIssues* deferred_failure);
  // The same for a stage that takes chunks (chunked_map, never fused): a chunk in one call, its
  // failing rows reported one by one; elements (from a producer that makes no chunks) one by one.
  bool process_chunked_map(StageRuntime& st, std::vector<Item>& in, std::vector<Item>& out, std::uint64_t epoch, std::uint64_t base_index, ChunkIssues* deferred_failure);

  // The failing rows of one chunked map call, through the stage's policy as elements are, each
  // named by its own origin (`input` is alive through the call: map_chunk takes it by reference).
  // With `deferred`, reasons and a failure wait for the chunk's commit (see ChunkIssues).
  struct ChunkRowIssues final : RowIssues {
    Impl& engine;
    StageRuntime& stage;
    const Chunk& input;
    std::uint64_t epoch, first_index;
    ChunkIssues* deferred;
    bool refused = false;  // a row ended the run: it is reported already
    ChunkRowIssues(Impl& e, StageRuntime& s, const Chunk& in, std::uint64_t ep, std::uint64_t first, ChunkIssues* d = nullptr)
        : engine(e), stage(s), input(in), epoch(ep), first_index(first), deferred(d) {}
    bool skip_row(std::size_t row, const std::string& reason) override {
      if (refused) return false;
      refused = !engine.element_error(stage, reason.c_str(), epoch, first_index + row, input.origin(row).text(), deferred);
      return !refused;
    }
  };

  // What an expand stage's operator reports of damage inside one input, under the stage's policy.
  class StageDamage final : public DamageReport {
   public:
    StageDamage(Impl& impl, StageRuntime& st) : impl_(impl), st_(st) {}
    bool skip_damaged(const std::string& reason) override {
      if (st_.spec->error_policy != ErrorPolicyKind::Skip) return false;
      add(st_.counters.errors_skipped, 1);
      impl_.keep_skip_reason(st_, reason);
      return true;
    }

   private:
    Impl& impl_;
    StageRuntime& st_;
  };

  // One input of an expand stage with per-input stages, run through them (stage_per_input.hpp).
  class PerInputCursor;

  // Expand stages (tf.data's interleave), stage_expand.hpp.
  class ExpandStage;
  void run_expand(StageRuntime& st);

  // Combine stages: one worker calling the operator output by output, each output iteration
  // reading one iteration of every input (stage_combine.cpp).
  class CombineStage;
  void run_combine(StageRuntime& st);

  // Stateful transforms: one worker; iterations map to the input's through passes_per_iteration,
  // and iterations the input does not provide are replayed (cache).
  class AggregateStage;
  void run_aggregate(StageRuntime& st);

  void worker(StageRuntime& st, int index);

  // After the last worker: join, finish every operator (sinks commit their files only when the
  // run completed), settle the state, publish the final snapshot.
  void finalize();

  // ---- metrics (engine_metrics.cpp) ----

  metrics::MetricsSnapshot make_snapshot() const;
  void put_run(metrics::MetricsSnapshot& snap, double elapsed_ns) const;
  void put_stage(StageRuntime& st, metrics::StageMetrics* m, std::uint64_t now, double elapsed_ns) const;
  void put_autotune(metrics::MetricsSnapshot& snap) const;
  void put_ledger(metrics::MetricsSnapshot& snap) const;

  void publish(const metrics::MetricsSnapshot& snap);

  // ---- autotune (engine_tuner.cpp) ----

  // The budgets (the pipeline's, else what the process may use) and the most workers each tuned
  // stage may get: every core of the budget, and for an expand stage no more than its open inputs.
  void set_autotune_budgets();

  static constexpr auto kTuneWindow = std::chrono::milliseconds(250);
  static constexpr std::size_t kKeptTuneChanges = 500;

  // Every window: what each stage (a fused group as one) did, the tuner's plan, applied at once.
  void run_tuner();

  void apply_tune_change(StageRuntime& runner, const detail::TuneChange& change, std::uint64_t now);

  void run_publisher();
};

}  // namespace sluice
