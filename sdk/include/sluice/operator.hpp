#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/buffer.hpp"
#include "sluice/feed.hpp"
#include "sluice/params.hpp"
#include "sluice/rng.hpp"
#include "sluice/sample.hpp"
#include "sluice/state.hpp"
#include "sluice/storage.hpp"

namespace sluice {

/// "Forever" for repeat counts and iteration demands.
inline constexpr std::int64_t kUnbounded = -1;

/// Combine (ABI 5.0): several inputs, one output (zip, concatenate, weighted mixing).
enum class OperatorKind { Source, Map, Filter, Expand, Aggregate, Sink, Combine };

inline const char* operator_kind_name(OperatorKind k) {
  switch (k) {
    case OperatorKind::Source: return "source";
    case OperatorKind::Map: return "map";
    case OperatorKind::Filter: return "filter";
    case OperatorKind::Expand: return "expand";
    case OperatorKind::Aggregate: return "aggregate";
    case OperatorKind::Sink: return "sink";
    case OperatorKind::Combine: return "combine";
  }
  return "?";
}

/// (6.8) What an operator is to the host, where the host itself does something with it: a worker's
/// plan adds a shard, the service cuts a split with a skip and a take, the report counts batches,
/// `sluice bench` takes caches and prefetches away. At most one per operator; most have none.
enum class OperatorRole : std::uint8_t {
  None = 0,
  Batches,       ///< combines consecutive elements into one (the progress line counts its outputs)
  Caches,        ///< replays its input's first iteration; a `path` parameter left empty keeps it in memory
  Prefetches,    ///< only buffers elements
  Shards,        ///< keeps element index + k * num_shards (params num_shards, index)
  ShardsEvenly,  ///< a shard that gives every shard the same count (params num_shards, index, equal_steps)
  Skips,         ///< drops the first `count` elements
  Takes,         ///< keeps the first `count` elements
  CallsPython,   ///< runs Python code, holding the GIL while it does
  FeedsPython,   ///< the sink Python's iterator reads
  ReadsService,  ///< reads the elements the Sluice service's workers make
  /// (6.10) an aggregate that hands on each input unchanged as it comes, and only asks its input
  /// for more passes (input_passes): the host passes its inputs through, a chunk whole, without
  /// calling push()
  Repeats,
};
inline constexpr std::uint8_t kLastOperatorRole = static_cast<std::uint8_t>(OperatorRole::Repeats);

/// The role's name in reports, metrics and `sluice plugins` ("" for None).
inline const char* role_name(OperatorRole role) {
  switch (role) {
    case OperatorRole::None: return "";
    case OperatorRole::Batches: return "batches";
    case OperatorRole::Caches: return "caches";
    case OperatorRole::Prefetches: return "prefetches";
    case OperatorRole::Shards: return "shards";
    case OperatorRole::ShardsEvenly: return "shards evenly";
    case OperatorRole::Skips: return "skips";
    case OperatorRole::Takes: return "takes";
    case OperatorRole::CallsPython: return "calls Python";
    case OperatorRole::FeedsPython: return "feeds Python";
    case OperatorRole::ReadsService: return "reads the service";
    case OperatorRole::Repeats: return "repeats";
  }
  return "";
}

struct OperatorTraits {
  /// Thread-safe and without state between elements: the engine may run several workers.
  bool stateless = false;
  /// Draws random numbers: it gets a per-element generator keyed by (seed, stage, epoch, index).
  bool random = false;
  /// Every output element has the shapes of the input it came from (flips, colour changes,
  /// normalisation, shuffling, repeating): size hints of later stages pass through it.
  bool keeps_shape = false;
  /// (6.0) Implements save_state() and restore_state(): a run through it can be checkpointed and
  /// resumed. Sources, aggregates, combines and maps or filters that are not stateless must say
  /// so, or `--checkpoint` refuses the pipeline naming the stage; expands and sinks need not (the
  /// host re-opens an expand's inputs where they were; a sink's state is outside the data).
  bool saves_state = false;
  /// (6.8) What the operator is to the host, for the few things the host does with particular
  /// operators (see OperatorRole): the host reads roles, never names.
  OperatorRole role = OperatorRole::None;
};
// A plugin built for 6.7 or older lays OperatorInfo out as this SDK does: `role` lies in what was
// the padding after the traits' four flags (the host reads it only from plugins built for 6.8).
static_assert(sizeof(OperatorTraits) <= 8 && alignof(OperatorTraits) == 1, "OperatorTraits must stay within the 8 bytes before OperatorInfo::create");

/// Offered by a stage that assembles its input into larger blocks (batch) to the map right before
/// it (tf.data's map-and-batch fusion): the map builds an element's field directly in the row the
/// block would copy it into, so nothing is copied. Only in deterministic runs, where an element's
/// index is its position; an element that lands elsewhere (one before it was dropped) is copied.
class Placement {
 public:
  virtual ~Placement() = default;
  /// A tensor of `dtype` and `shape` in the row that element `index` of input iteration `epoch`
  /// goes to, or an invalid tensor: build it elsewhere. Thread-safe.
  virtual Tensor place(std::uint64_t epoch, std::uint64_t index, const std::string& field, DType dtype, const Shape& shape) = 0;
};

/// (6.1) What an operator adds to its stage's metrics beyond elements and bytes. Thread-safe.
class StageCounters {
 public:
  virtual ~StageCounters() = default;
  /// Values (tensor elements) of the outputs just made that are padding, and that are data.
  /// Stages that pad to a common shape (padded_batch, bucket_by_sequence_length, pack_sequences)
  /// report both; the run report and the studio show the share of padding.
  virtual void add_padding(std::uint64_t padding_values, std::uint64_t data_values) = 0;
};

/// What the engine tells a stage about itself when it starts.
struct StageInfo {
  std::string id;
  std::uint64_t seed = 0;
  std::uint64_t stage_hash = 0;
  Allocator* allocator = &HostAllocator::instance();
  Placement* placement = nullptr;  ///< where the consumer would like outputs built (see Placement)
  /// (ABI 4.1) Identifies what produces this stage's input: the operators, parameters and, where
  /// they draw random numbers, seed and stage ids of every stage before it. A stage that keeps
  /// data across runs (a file cache) stores it and refuses data made by another pipeline.
  std::uint64_t input_fingerprint = 0;
  /// (5.0) The ids of the stages this one reads, in order (a combine checks its parameters against
  /// their number in start()).
  std::vector<std::string> input_ids;
  /// (6.1) The stage's own metrics; null when an operator is run outside an engine (a test).
  StageCounters* counters = nullptr;
  /// (6.6) Remote storage for s3://, gs:// and http(s):// paths (storage.hpp); null when an
  /// operator is run outside an engine, where a remote path is refused.
  Storage* storage = nullptr;
};

/// Where an element stands: `epoch` is the iteration of the stage's input it belongs to (a stage
/// after a repeat sees a single long iteration), `index` its position within that iteration.
/// Epochs are the pipeline's, not the run's: a run that continues earlier ones (Python's next
/// iter()) starts above 0, so an operator that means "the run's first iteration" counts its own.
struct ElementContext {
  const StageInfo* stage = nullptr;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;

  Rng rng() const { return Rng(stage->seed, stage->stage_hash, epoch, index); }
  Allocator& allocator() const { return *stage->allocator; }
  /// A new tensor for the output field `field`: in its place in the consumer's block when the
  /// consumer offered one (no copy later), else from the stage's allocator. `in_place`, when
  /// given, tells which: a row in the consumer's block is cold for this core (worth writing with
  /// non-temporal stores), a new tensor is about to be read by the next stage.
  Tensor output_tensor(const std::string& field, DType dtype, Shape shape, bool* in_place = nullptr) const {
    if (in_place) *in_place = false;
    if (stage->placement) {
      Tensor placed = stage->placement->place(epoch, index, field, dtype, shape);
      if (placed.valid()) {
        if (in_place) *in_place = true;
        return placed;
      }
    }
    return Tensor::empty(dtype, std::move(shape), *stage->allocator);
  }
};

/// Receives the outputs of an expand or aggregate operator. push() returns false once nothing
/// more of the current iteration is wanted (a take downstream is satisfied, or the run stops):
/// the operator should return promptly.
class Emitter {
 public:
  virtual ~Emitter() = default;
  virtual bool push(Sample sample) = 0;
};

/// Constructors validate parameters only and must be cheap (the host builds one with default
/// parameters when it loads a plugin, to check it); resources are acquired in start().
class Operator {
 public:
  virtual ~Operator() = default;
  virtual void start(const StageInfo&) {}
  /// Called once after the last element; `complete` is false when the run stopped early or failed
  /// (a sink then leaves no output that looks complete).
  virtual void finish(bool /*complete*/) {}
  /// Output buffer (in elements) this stage wants when the pipeline file sets none; 0: the
  /// engine's default. prefetch uses it.
  virtual std::size_t preferred_buffer() const { return 0; }
  /// Memory this stage wants its input assembled in (pinned host memory for a GPU feed), asked
  /// after start(). The engine hands it upstream, through stages that keep shapes, to the stage
  /// that builds the elements (a batch), in StageInfo::allocator. Must outlive the run's buffers.
  virtual Allocator* offered_allocator() { return nullptr; }
  /// Rows this stage would like the map before it to build its outputs in (see Placement), asked
  /// after start(); the engine hands it on in deterministic runs.
  virtual Placement* offered_placement() { return nullptr; }
  /// Called from any thread once the run is asked to stop: a stage blocked inside one of its own
  /// calls (a sink waiting for room on a device) must return from it promptly.
  virtual void cancel() {}

  /// (6.0) Checkpoints, for operators whose traits say saves_state. save_state() writes what the
  /// operator needs to go on exactly as it would have: positions, counters, and the elements it
  /// holds (through put_element(), so that the host can keep small references to them rather
  /// than their bytes). It is called on the stage's thread between two calls the operator gets
  /// (never inside one), after start(). restore_state() is called instead of the calls that led
  /// there, right after start() of a fresh operator with the same parameters, and reads the same
  /// values in the same order; it throws Error when the state cannot be used (naming what
  /// differs: another input file list, a different parameter).
  /// Random draws keyed by ElementContext need no saving: the host restores the contexts.
  virtual void save_state(StateWriter&) const { throw Error("this operator cannot save its state"); }
  virtual void restore_state(StateReader&) { throw Error("this operator cannot restore a saved state"); }
};

class Source : public Operator {
 public:
  /// A pass is one iteration over the data; repeats downstream ask for several. `pass` is the
  /// pipeline epoch of the pass (see ElementContext), not a count from 0 within the run. (6.9) It
  /// begins that pass whatever state restore_state() put back, which may be of a later pass: a
  /// cut finds a source ahead of what its buffer holds, and the host resumes it before the pass
  /// that follows the first end of a pass waiting there. Never count passes yourself.
  virtual void begin_pass(std::uint64_t pass) = 0;
  /// Fills `out` and returns true, or returns false at the end of the pass.
  virtual bool next(Sample& out, const ElementContext& ctx) = 0;
  /// Elements in one pass when known once started (progress and ETA), -1 when not.
  virtual std::int64_t expected_elements() const { return -1; }
  /// (6.0) A source's saved state is taken between two next() calls of a pass: restore_state()
  /// puts it back inside that pass, and the host calls next() without begin_pass() for it.

};

/// 1 -> 1
class Map : public Operator {
 public:
  virtual Sample map(Sample in, const ElementContext& ctx) = 0;
};

/// 1 -> 0 or 1
class Filter : public Operator {
 public:
  virtual bool keep(const Sample& in, const ElementContext& ctx) = 0;
};

/// Reports damage inside one input that the operator can step over (a record whose CRC fails in a
/// file that is otherwise readable). Returns true under the stage's skip policy: the damage is
/// counted and its reason kept, and the operator goes on. Returns false under the fail policy:
/// the operator should then throw a DataError with the same reason. Thread-safe.
class DamageReport {
 public:
  virtual ~DamageReport() = default;
  virtual bool skip_damaged(const std::string& reason) = 0;
};

/// The outputs of one input of an expand operator, produced one at a time so that the engine can
/// interleave several inputs (tf.data's interleave: cycle_length, block_length, parallelism).
/// One cursor is used by one thread at a time.
class ExpandCursor {
 public:
  virtual ~ExpandCursor() = default;
  /// Fills `out` and returns true, or returns false once this input is exhausted.
  virtual bool next(Sample& out) = 0;
  /// (6.0) Checkpoints: positions the cursor so that its next output is the one whose origin named
  /// `record` and `byte_offset` (an output it gave before, or will give); false if it cannot, and
  /// nothing moved (the host then reads from the start). A resumed run seeks to the outputs a
  /// checkpoint names instead of reading every output before them.
  virtual bool seek(std::int64_t /*record*/, std::int64_t /*byte_offset*/) { return false; }
};

/// 1 -> N (a file path into its records)
class Expand : public Operator {
 public:
  /// `damage` outlives the cursor.
  virtual std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) = 0;
};

/// N -> M with state across elements (batch, shuffle, take, repeat, cache). One worker calls it;
/// (6.4) one that also derives from AssemblesInParallel may have its outputs assembled by more.
class Aggregate : public Operator {
 public:
  enum class Flow { Continue, SkipRestOfIteration };

  /// Passes over its input needed to produce `iterations` output iterations (kUnbounded allowed).
  /// repeat(k) needs k per iteration; a cache that holds the data already needs none.
  virtual std::int64_t input_passes(std::int64_t iterations) const { return iterations; }
  /// True for a cache: when downstream wants no more of the first iteration, keep reading the
  /// input anyway (without emitting) so that the next iterations can be replayed.
  virtual bool keeps_reading_when_skipped() const { return false; }

  virtual void begin_iteration(std::uint64_t /*epoch*/) {}
  virtual Flow push(Sample in, const ElementContext& ctx, Emitter& out) = 0;
  /// (6.0) With saves_state, save_state() may also be called while the stage replays (between two
  /// pushes of replay()): a replay must not change what save_state() writes. A restored run
  /// calls replay() again for that iteration and drops the outputs given before the checkpoint.
  /// The input iteration(s) making up this output iteration ended: flush what is held.
  virtual void end_iteration(std::uint64_t /*epoch*/, Emitter& /*out*/) {}
  /// Produce an output iteration the input did not provide (input_passes asked for fewer passes
  /// than iterations). Return false if it cannot.
  virtual bool replay(std::uint64_t /*epoch*/, Emitter& /*out*/) { return false; }
};

/// (6.4) An aggregate whose outputs can be assembled off its thread (padding, copying rows into
/// one block: most of a batching stage's work) derives from this too, and hands each output to
/// push_assembled(). Its stage then accepts `parallelism` above 1 (tf.data's
/// batch(num_parallel_calls)): the stage's thread still takes every input in order and decides
/// which rows make each output; that many threads assemble the outputs, which leave in the order
/// they were pushed, so the data is the same at any parallelism. The host finds this class with
/// dynamic_cast when it loads the plugin.
class AssemblesInParallel {
 public:
  virtual ~AssemblesInParallel() = default;
};

/// (6.5) An aggregate whose every output is one of its inputs, unchanged, as its stage received it
/// (origin included): it only holds and reorders them, as shuffle does. A checkpoint then names
/// the elements a stage after it holds (a batch being gathered) by where they were read, as it
/// names the aggregate's own, instead of keeping their bytes. Found with dynamic_cast.
class HandsOnItsInputs {
 public:
  virtual ~HandsOnItsInputs() = default;
};

/// (6.7) A source whose order is one all the workers of a job share, split among them by position
/// (random_access): a checkpoint its N workers took may be resumed by M. Found with dynamic_cast.
class ResumesOnOtherWorkers {
 public:
  virtual ~ResumesOnOtherWorkers() = default;
  /// A record read before the cut that had not reached the sinks (a later stage held it):
  /// where it was read and its record there (Sample's origin).
  struct Held {
    std::string where;
    std::int64_t record = -1;
  };
  /// Called instead of restore_state(), after start(), on the copy of worker `worker` of
  /// `workers` (its own parameters): `saved[w]` reads what worker w of the N that took the
  /// checkpoint saved (nullptr: its source had ended, its whole share delivered), `held` the
  /// records they had read that no sink had taken, `taken` the records they read after their cut
  /// that a sink took all the same (a Python loop's outputs between its state's cut and the call
  /// that took it: delivered, not to be given again). This copy then gives its share of every
  /// record of the pass that no worker delivered, and shards later passes `workers` ways.
  /// Throws Error naming what differs (another file list, workers in different passes).
  virtual void restore_on_other_workers(const std::vector<StateReader*>& saved, const std::vector<Held>& held, const std::vector<Held>& taken,
                                        std::int64_t workers, std::int64_t worker) = 0;
};

/// (6.11) A source that can read any element it gave again from its origin alone (the file and
/// the record and byte offset there: random_access, through the files' indexes). A checkpoint then
/// names the elements later stages hold (a batch being gathered, through maps) by that origin
/// instead of keeping their bytes, and a resumed run reads them again here. Found with
/// dynamic_cast.
class ReadsRecordsAgain {
 public:
  virtual ~ReadsRecordsAgain() = default;
  /// The element given with origin (`where`, `record`, `byte_offset`), as next() gave it, after
  /// start() and restore_state() (its state untouched). Throws DataError naming the file where
  /// it cannot be read so any more (the file changed since, or is not one of this source's).
  virtual Sample read_again(const std::string& where, std::int64_t record, std::int64_t byte_offset) = 0;
};

/// (6.13) A source that can begin a pass at any of its elements without reading those before
/// (random_access: an element's place is arithmetic). Replay then makes one step of a run again
/// in a time that does not grow with the step. Found with dynamic_cast.
class StartsAnywhere {
 public:
  virtual ~StartsAnywhere() = default;
  /// As begin_pass(pass) followed by `index` calls to next() whose elements are dropped: the
  /// next next() gives the pass's element `index` (counted in this source's share of it).
  virtual void begin_pass_at(std::uint64_t pass, std::uint64_t index) = 0;
};

/// (6.13) A source that knows the records each of its files gives an epoch (random_access, from
/// their indexes): the delivery ledger counts what an epoch should deliver from them, files no
/// worker reached included. Asked after start(), each time the ledger is taken (a cut, the run's
/// end): a source may learn more as it goes (the service's source: the files its workers read to
/// their end). Found with dynamic_cast.
class KnowsItsRecords {
 public:
  struct FileRecords {
    std::string where;  ///< as the origins of its records name it
    std::int64_t first = 0, end = 0;  ///< records [first, end) of it
  };
  virtual ~KnowsItsRecords() = default;
  virtual std::vector<FileRecords> records_per_file() const = 0;
};

/// (6.14) A source whose records a caller can read by their place in its files' order, choosing
/// which and when (the Python module's data sources, shaped as Grain's ArrayRecordDataSource and
/// Hugging Face's datasets: random_access, parquet_rows). Used after start(), from one thread at a
/// time, outside passes: a reader's state is untouched. Found with dynamic_cast.
class ReadsByPosition {
 public:
  /// A field of the records as the files store it: its name, and its type as the format names it
  /// (Arrow's "string", "binary", "list<element: int32>"; "bytes" for a record's raw bytes).
  struct StoredField {
    std::string name;
    std::string type;
  };
  virtual ~ReadsByPosition() = default;
  /// Every file's records together: places 0 .. records() - 1, file after file.
  virtual std::uint64_t records() const = 0;
  /// The records at these places, in the order asked, each as next() gives it. Throws DataError
  /// naming the place (past records()) or the file and record that cannot be read.
  virtual std::vector<Sample> read_positions(const std::vector<std::uint64_t>& positions) = 0;
  /// The records' fields as stored, where the format says more than the tensors do (text apart
  /// from bytes); empty when it does not.
  virtual std::vector<StoredField> stored_fields() const { return {}; }
};

/// (6.7) An aggregate whose every output stacks, in order, the next inputs it took: one batch of
/// inputs_per_output() of them, the last of an iteration the ones left (batch, padded_batch,
/// ragged_batch). The host then knows which records each output holds, row by row (a Python
/// state on another number of workers names the records the loop took after the cut). Found
/// with dynamic_cast.
class StacksItsInputs {
 public:
  virtual ~StacksItsInputs() = default;
  virtual std::uint64_t inputs_per_output() const = 0;
};

/// (6.7) An aggregate whose saved state is the elements it holds and what goes with them (a batch
/// being gathered, a shuffle buffer): a checkpoint resumed on another number of workers gives
/// those elements back to the source that read them and starts this stage empty. Found with
/// dynamic_cast; any other stage that saves state refuses such a resume.
class HoldsOnlyElements {
 public:
  virtual ~HoldsOnlyElements() = default;
};

/// (6.4) What a host's emitter also offers when its stage has assembly threads (see
/// AssemblesInParallel); use push_assembled(), which works with any emitter.
class ParallelAssembly {
 public:
  virtual ~ParallelAssembly() = default;
  /// As Emitter::push(assemble()), but `assemble` may run later on another thread, at the same
  /// time as the operator's next calls and other assemblies: it must own what it reads (the rows,
  /// captured by value) or read only what no call changes (parameters), and it may throw (the run
  /// then fails naming the stage). Every output is handed on before the operator's state is saved
  /// and before its end_iteration() output, so checkpoints and iterations see them in order.
  virtual bool push_assembled(std::function<Sample()> assemble) = 0;
};

/// Hands `assemble` to the stage's assembly threads where it has some, else runs it now.
inline bool push_assembled(Emitter& out, std::function<Sample()> assemble) {
  if (auto* parallel = dynamic_cast<ParallelAssembly*>(&out)) return parallel->push_assembled(std::move(assemble));
  return out.push(assemble());
}

/// (5.0) The inputs of a combine stage, in the order the pipeline file lists them (`input: "a"
/// input: "b"`). Used by the stage's one thread only.
class CombineInputs {
 public:
  virtual ~CombineInputs() = default;
  virtual std::size_t size() const = 0;
  /// The next element of input `k` in the current iteration: true with `out` filled; false once
  /// that input's iteration has ended (every later call for it returns false too) or the run stops.
  virtual bool next(std::size_t k, Sample& out) = 0;
  /// The id of the stage input `k` reads, for messages ("input 'b' (stage 'eval')").
  virtual const std::string& name(std::size_t k) const = 0;
};

/// (5.0) Several inputs -> one output, with one worker. Each output iteration reads one iteration
/// of every input: what an input still holds when the iteration ends is thrown away, and its
/// producer is told that nothing more of that iteration is wanted (zip ends with its shortest
/// input). A repeat before an input repeats that input; a repeat after the stage repeats them all.
/// (6.0) Output by output, so that a checkpoint can come between two: the operator keeps where it
/// is in members (the input it reads, how many outputs it gave), which save_state() writes.
class Combine : public Operator {
 public:
  /// Output iteration `iteration.epoch` starts: every input is at the start of its iteration.
  virtual void begin_iteration(const ElementContext& /*iteration*/) {}
  /// The iteration's next output: pull from `inputs` in the operator's order and return true with
  /// `out` filled, or false once the iteration is over (not called again until the next begins).
  /// An operator that draws random numbers keys its n-th output's draws with
  /// ElementContext{iteration.stage, iteration.epoch, n}.rng(), the same at any parallelism.
  virtual bool next(CombineInputs& inputs, Sample& out) = 0;
};

class Sink : public Operator {
 public:
  virtual void consume(Sample in, const ElementContext& ctx) = 0;
  virtual void end_iteration(std::uint64_t /*epoch*/) {}
  /// A sink that hands its data to the application (gpu_feed) returns its consumer side here;
  /// Engine::feed(stage id) finds it. Valid until the engine is destroyed.
  virtual Feed* feed() { return nullptr; }
  /// Per-device counters for the metrics (read from the metrics thread while the sink runs).
  virtual std::vector<DeviceCounters> device_counters() const { return {}; }
};

/// Everything the host knows about an operator without running it.
struct OperatorInfo {
  std::string name;
  OperatorKind kind = OperatorKind::Map;
  std::string summary;
  std::vector<ParamSpec> params;
  OperatorTraits traits;
  std::function<std::unique_ptr<Operator>(const Params&)> create;
  /// (5.0) Combine operators: how many inputs a stage may list; kAnyNumberOfInputs for no limit.
  /// Other kinds take one input (sources none) and leave these as they are.
  int min_inputs = 1;
  int max_inputs = 1;
};

inline constexpr int kAnyNumberOfInputs = -1;

}  // namespace sluice
