#pragma once
// The expand stage kind (tf.data's interleave): one class, run by the stage's coordinator thread.
// stage_expand.cpp reads inputs and hands outputs on; stage_expand_cut.cpp saves and restores its
// positions for checkpoints.
#include <deque>
#include <limits>
#include <optional>

#include "engine_impl.hpp"

namespace sluice {

// What tells one output (or row `row` of a chunk of them) from another at little cost, whatever
// its size; a resumed slot checks the output it finds where its last one was (never 0).
std::uint64_t output_fingerprint(const Sample& sample, std::size_t row = 0);

// One input open in the interleave's cycle, and what was read of it ahead.
struct ExpandSlot {
  std::unique_ptr<ExpandCursor> cursor;
  // The cursor's chunked form, when the stage hands chunks on; null otherwise.
  ChunkedExpandCursor* chunked = nullptr;
  std::deque<Sample> ready;  // read ahead by fetchers (a chunk is one of them)
  std::uint64_t ready_bytes = 0;  // of `ready`, counted with per-input stages only
  std::deque<Sample> taken;  // moved out of `ready` by the coordinator, which alone uses it
  bool exhausted = false;
  bool busy = false;  // a fetcher is inside cursor->next()
  std::string origin;
  std::uint64_t epoch = 0, index = 0;
  // Outputs its cursor gave so far; written only by the thread calling the cursor (one at a time).
  std::uint64_t outputs_read = 0;
  // The largest bytes per row of the chunks its input gave (0: none yet), for the size of the
  // next; written only by the thread calling the cursor. A new input starts a new slot (fill()):
  // its first chunk is of kChunkRows, whatever the rows of the input before it.
  std::uint64_t chunk_row_bytes = 0;
  // A tuned stage reading on its coordinator holds its slots (busy) until it hands them back to
  // fetchers: no lock and no wake-up per record. Written by the coordinator only.
  bool owned = false;
  // For checkpoints: the input it reads (to open it again), the outputs the coordinator handed
  // on and the origin of the last one (a cursor that can seek goes straight after it), and
  // whether a cut came while the slot waited for its next input.
  Sample input;
  std::uint64_t emitted = 0;
  std::int64_t last_record = -1, last_offset = -1;
  std::uint64_t last_fingerprint = 0;  // of the last output handed on (0: a chunk, or not known)
  bool awaiting_fill = false;
  const std::string* registered_where = nullptr;  // in StageRuntime::read_inputs
  // (EngineOptions::lineage) The file it reads, once it gave a record; whether reading it failed
  // (its end was then not reached, whatever its last record).
  std::shared_ptr<const std::string> read_where;
  bool read_failed = false;
};

// Remote inputs are opened ahead of their turn, up to a cycle of them (tf.data's
// prefetch_input_elements): opening one starts its first request, so the next objects' first
// bytes are on their way while the open ones are read, and a store's time to first byte is not
// paid once per object per slot. Only elements of this iteration that were already taken from
// the input, in order; a local file's open costs nothing worth hiding.
struct OpenedAhead {
  std::size_t position = 0;  // in `inputs_`
  std::unique_ptr<ExpandCursor> cursor;
  std::optional<std::string> failure;  // open() threw: reported when its turn comes, as then
};

// An expand stage, with tf.data's interleave: up to cycle_length inputs are open at once, and
// block_length outputs are taken from each in turn; an exhausted input's slot takes the next
// input. With parallelism > 1, fetcher threads read ahead from the open inputs (at most one per
// open input); the output order stays the sequential one unless the stage asks for completion
// order. The thread that runs it (the coordinator) takes inputs, hands outputs on and takes cuts.
class Engine::Impl::ExpandStage {
 public:
  ExpandStage(Impl& engine, StageRuntime& st);
  ExpandStage(const ExpandStage&) = delete;
  ExpandStage& operator=(const ExpandStage&) = delete;
  // However the stage leaves (an exception included), its fetchers are told and joined.
  ~ExpandStage() { stop_fetchers(); }

  void run();

 private:
  // ---- the phases of run() ----
  bool restore();         // a resumed run's slots, opened again where they were
  void start_fetchers();  // the reading-ahead threads
  bool fill_all();        // every slot given its next input
  bool step();            // one turn of the interleave; false when the stage is done
  void finish();

  // ---- inputs ----
  std::unique_ptr<ExpandCursor> open_cursor(Sample input, std::uint64_t input_epoch, std::uint64_t input_index, const std::string& origin);
  void open_ahead();
  bool take_opened_ahead(std::size_t position, std::unique_ptr<ExpandCursor>& cursor);
  bool fill(ExpandSlot& slot);
  bool take_more_inputs();
  bool fill_awaiting();
  bool no_input_open();
  bool input_failure(ExpandSlot& slot, const char* what);

  // ---- outputs ----
  int take(ExpandSlot& slot, Sample& sample);
  int read_here(ExpandSlot& slot, Sample& sample);
  int read_alone(ExpandSlot& slot, Sample& sample);
  std::optional<int> take_from_fetchers(ExpandSlot& slot, Sample& sample);
  bool read_next(ExpandSlot& slot, Sample& sample);
  std::size_t chunk_rows(const ExpandSlot& slot) const;
  std::uint64_t per_input_ns(ExpandSlot& slot);
  void turn_to_ready_slot();
  bool take_block(ExpandSlot& slot);
  void note_output(ExpandSlot& slot, Sample& sample, std::size_t rows);
  bool emit(Sample sample);
  bool flush_for_waiting_consumer();
  void close(ExpandSlot& slot);

  // ---- fetchers ----
  bool reading_alone() const;
  void fetch(int fetcher);
  ExpandSlot* wait_for_work(std::unique_lock<std::mutex>& lock, int fetcher);
  int read_run(ExpandSlot& work, std::vector<Sample>& run, std::size_t room, std::uint64_t room_bytes, std::uint64_t& run_bytes);
  void release_owned(ExpandSlot& slot);
  void release_all_owned();
  void stop_fetchers();
  void account_busy();

  // ---- checkpoints ----
  bool take_input_through_barrier();
  bool save_for_cut();
  void give_back_inputs_not_needed_yet();
  void write_positions(StateWriter& w);
  std::vector<ExpandSlot*> read_positions();
  void reopen(ExpandSlot& slot);

  Impl& engine_;
  StageRuntime& st_;
  const std::size_t cycle_;
  const int block_;
  const bool ordered_;
  const int fetcher_count_;
  // Chunks of a cursor's outputs go on when every reader takes them. With several inputs open,
  // block_length outputs of each alternate: a chunk is at most a block, and one that runs past the
  // block's end is cut there (its rest starts that input's next turn).
  const bool chunks_;
  // The stage runs per-input stages (its cursors are PerInputCursors). Then what leaves is the
  // last one's output, counted by PerInputCursor (which counts this stage's own as it reads).
  const bool per_input_;
  const std::size_t read_ahead_;
  const std::uint64_t read_ahead_bytes_;
  const std::size_t open_ahead_limit_;
  StageDamage damage_;

  std::vector<ExpandSlot> slots_;
  std::mutex mutex_;  // guards slots' ready/exhausted/busy/cursor when fetchers run
  std::condition_variable changed_;
  bool quit_ = false;
  std::vector<std::thread> fetchers_;
  std::optional<CoreHold> reading_core_;  // the coordinator's core of the budget while it reads
  std::size_t reads_on_core_ = 0;

  std::vector<Item> inputs_, out_;
  std::uint64_t out_bytes_ = 0;  // of the outputs in `out_`, counted with per-input stages only
  std::size_t next_input_ = 0;
  std::deque<OpenedAhead> opened_ahead_;
  std::uint64_t epoch_ = 0, index_ = 0;
  bool iteration_closed_ = false, input_done_ = false;
  bool barrier_taken_ = false;  // fill() took the cut's barrier from the input
  // The input's producer is a source that gives way to cuts: a cut's inputs before the barrier
  // are copied where they wait (into waiting_in_input_, until saved).
  const bool input_from_source_giving_way_;
  std::vector<Item> waiting_in_input_;
  std::size_t turn_ = 0;
  std::uint64_t turn_for_cut_ = 0;  // the interleave's turn, saved and restored
  std::uint64_t emitted_in_epoch_ = 0;  // outputs handed on in this iteration
  std::uint64_t last_flush_ = 0;

  // The coordinator's busy time: its time less what it spent waiting (fetchers add their own),
  // and less the per-input stages' time inside its own reads since account_busy().
  std::uint64_t mark_ = 0, waited_at_mark_ = 0;
  std::uint64_t coordinator_member_ns_ = 0;
};


}  // namespace sluice
