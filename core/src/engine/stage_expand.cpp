// Expand stages: tf.data's interleave over cursors, with fetcher threads reading ahead
// (the class is in stage_expand.hpp; its checkpoints in stage_expand_cut.cpp).
#include "stage_expand.hpp"
#include "stage_per_input.hpp"

#include <system_error>

#include "sluice/storage.hpp"

namespace sluice {

void Engine::Impl::run_expand(StageRuntime& st) { ExpandStage(*this, st).run(); }

// Read ahead per input, in items: a few chunks of a block each when they alternate.
// With per-input stages an output is a batch, and each reader thread runs for a long time on
// its own input: a deep read-ahead, bounded in bytes too (a batch of images is large), so that
// readers and the coordinator seldom wait for each other. With 4 batches, two readers on two
// cores woke each other 47,000 times in a run of bench_sequences' files (1 M lines each) and
// took 2.3 s; with 64, 11,000 times and 1.6 s.
Engine::Impl::ExpandStage::ExpandStage(Impl& engine, StageRuntime& st)
    : engine_(engine),
      st_(st),
      cycle_(static_cast<std::size_t>(std::max(1, st.spec->cycle_length))),
      block_(std::max(1, st.spec->block_length)),
      ordered_(st.spec->interleave_keeps_order(engine.graph.deterministic)),
      fetcher_count_(st.workers > 1 ? std::min<int>(st.workers, static_cast<int>(cycle_)) : 0),
      chunks_(st.emits_chunks),
      per_input_(!st.fused.empty()),
      read_ahead_(per_input_ ? std::max(kPerInputReadAhead, static_cast<std::size_t>(2 * block_))
                  : chunks_ && cycle_ > 1 ? 4
                                          : static_cast<std::size_t>(std::max(2, block_))),
      read_ahead_bytes_(per_input_ ? kPerInputReadAheadBytes : std::numeric_limits<std::uint64_t>::max()),
      open_ahead_limit_(per_input_ ? 0 : cycle_),
      damage_(engine, st),
      slots_(cycle_),
      input_from_source_giving_way_(!st.input_stages.empty() && engine.source_gives_way_to_cuts(engine.group_head_of(st.input_stages.front()))),
      mark_(now_ns()),
      waited_at_mark_(st.counters.starved_ns.load() + st.counters.blocked_ns.load()) {}

void Engine::Impl::ExpandStage::run() {
  if (engine_.end_if_ended_before(st_, out_)) return;
  if (st_.restore && !restore()) return;
  start_fetchers();
  if (st_.restore || fill_all()) {
    last_flush_ = now_ns();
    while (step()) {
    }
  }
  finish();
}

bool Engine::Impl::ExpandStage::restore() {
  try {
    for (ExpandSlot* slot : read_positions()) reopen(*slot);
    st_.counters.epoch.store(epoch_, std::memory_order_relaxed);
    st_.exit().output->set_iteration(epoch_);
  } catch (const std::exception& e) {
    engine_.fail(fmt::format("{} could not resume from the checkpoint: {}", engine_.stage_label(st_), e.what()), &st_);
    return false;
  }
  turn_ = turn_for_cut_;
  return true;
}

void Engine::Impl::ExpandStage::start_fetchers() {
  try {
    for (int i = 0; i < fetcher_count_; ++i) fetchers_.emplace_back(&ExpandStage::fetch, this, i);
  } catch (const std::system_error& e) {
    throw Error(fmt::format("could not start reader thread {} of {}: {} (the process may be at its thread limit: lower "
                            "parallelism or cycle_length)",
                            fetchers_.size() + 1, fetcher_count_, e.what()));
  }
}

bool Engine::Impl::ExpandStage::fill_all() {
  for (auto& slot : slots_)
    if (!fill(slot)) return false;
  return true;
}

bool Engine::Impl::ExpandStage::step() {
  if (engine_.stopping.load()) return false;
  if (engine_.cut_requested(st_) || barrier_taken_) {
    turn_for_cut_ = turn_;
    if (!save_for_cut()) return false;
  }
  if (!fill_awaiting()) return false;
  if (barrier_taken_) return true;
  if (std::none_of(slots_.begin(), slots_.end(), [](const ExpandSlot& s) { return static_cast<bool>(s.cursor); })) return no_input_open();
  if (!ordered_ && fetcher_count_ > 0) turn_to_ready_slot();
  ExpandSlot& slot = slots_[turn_];
  if (slot.cursor && !take_block(slot)) return false;
  turn_ = (turn_ + 1) % cycle_;
  return flush_for_waiting_consumer();
}

void Engine::Impl::ExpandStage::finish() {
  account_busy();
  stop_fetchers();
}

// ---- inputs ----

// The operator's cursor for one input; with per-input stages, wrapped to run them too.
std::unique_ptr<ExpandCursor> Engine::Impl::ExpandStage::open_cursor(Sample input, std::uint64_t input_epoch, std::uint64_t input_index,
                                                       const std::string& origin) {
  std::unique_ptr<ExpandCursor> cursor =
      st_.expand->open(std::move(input), ElementContext{&st_.info, st_.first_input_epoch + input_epoch, input_index}, damage_);
  if (cursor && per_input_)
    cursor = std::make_unique<Engine::Impl::PerInputCursor>(engine_, st_, std::move(cursor), st_.first_input_epoch + input_epoch,
                                                            input_index, origin);
  return cursor;
}

void Engine::Impl::ExpandStage::open_ahead() {
  std::size_t position = opened_ahead_.empty() ? next_input_ : opened_ahead_.back().position + 1;
  for (; opened_ahead_.size() < open_ahead_limit_ && position < inputs_.size(); ++position) {
    const Item& item = inputs_[position];
    if (!item.is_element() || st_.input->skipped(epoch_)) return;
    const auto& where = item.sample.shared_origin().where;
    if (!where || !is_remote_uri(*where)) return;
    OpenedAhead ahead;
    ahead.position = position;
    try {  // (index counts every element of the iteration, skipped or not, from next_input_ on)
      ahead.cursor = open_cursor(Sample(item.sample), epoch_, index_ + (position - next_input_), item.sample.origin());
    } catch (const std::exception& e) {
      ahead.failure = e.what();
    }
    opened_ahead_.push_back(std::move(ahead));
  }
}

// The cursor opened ahead for inputs_[position], if there is one (else null and false).
bool Engine::Impl::ExpandStage::take_opened_ahead(std::size_t position, std::unique_ptr<ExpandCursor>& cursor) {
  if (opened_ahead_.empty() || opened_ahead_.front().position != position) return false;
  OpenedAhead ahead = std::move(opened_ahead_.front());
  opened_ahead_.pop_front();
  if (ahead.failure) throw DataError(*ahead.failure);
  cursor = std::move(ahead.cursor);
  return true;
}

// Opens the next input of the current iteration into `slot`; false if the run must stop.
bool Engine::Impl::ExpandStage::fill(ExpandSlot& slot) {
  while (!iteration_closed_) {
    if (barrier_taken_) {  // the cut is being taken: the slot is filled once the run goes on
      slot.awaiting_fill = true;
      return true;
    }
    if (next_input_ == inputs_.size() && !take_more_inputs()) return false;
    const std::size_t position = next_input_++;
    Item& item = inputs_[position];
    if (item.kind == Item::Kind::Barrier) {
      barrier_taken_ = true;
      slot.awaiting_fill = true;
      return true;
    }
    if (!item.is_element()) {
      iteration_closed_ = true;
      input_done_ = item.kind == Item::Kind::EndOfStream;
      return true;
    }
    const std::uint64_t my_index = index_++;
    if (st_.input->skipped(epoch_)) {
      if (!opened_ahead_.empty() && opened_ahead_.front().position == position) opened_ahead_.pop_front();
      continue;
    }
    std::string origin = item.sample.origin();
    try {
      Sample input = item.sample;  // shares its tensors: kept for checkpoints
      std::unique_ptr<ExpandCursor> cursor;
      if (!take_opened_ahead(position, cursor)) cursor = open_cursor(std::move(item.sample), epoch_, my_index, origin);
      open_ahead();
      std::lock_guard lock(mutex_);
      slot = ExpandSlot{};
      slot.cursor = std::move(cursor);
      slot.chunked = chunks_ ? dynamic_cast<ChunkedExpandCursor*>(slot.cursor.get()) : nullptr;
      slot.exhausted = !slot.cursor;
      slot.origin = std::move(origin);
      slot.epoch = epoch_;
      slot.index = my_index;
      slot.input = std::move(input);
      changed_.notify_all();
      return true;
    } catch (const std::exception& e) {
      if (!engine_.element_error(st_, e.what(), st_.first_input_epoch + epoch_, my_index, origin)) return false;
    }
  }
  return true;
}

// The next chunk of the stage's input; false if the run must stop.
bool Engine::Impl::ExpandStage::take_more_inputs() {
  if (!out_.empty() && !engine_.flush(st_, out_)) return false;  // never hold outputs while waiting
  account_busy();
  std::uint64_t t0 = now_ns();
  reading_core_.reset();  // no core held while waiting for inputs
  if (!st_.input->pop(inputs_, kChunk)) return false;
  add(st_.counters.starved_ns, now_ns() - t0);
  next_input_ = 0;
  if (inputs_.front().is_element()) {
    add(st_.counters.elements_in, inputs_.size());
    add(st_.counters.bytes_in, bytes_of(inputs_));
  }
  return true;
}

// Slots a cut left waiting for their input are filled in the order they would have been.
bool Engine::Impl::ExpandStage::fill_awaiting() {
  for (auto& slot : slots_)
    if (slot.awaiting_fill && !slot.cursor) {
      slot.awaiting_fill = false;
      if (!fill(slot)) return false;
    }
  return true;
}

// No slot has an input: every input of this iteration failed to open or was skipped (more are
// taken), or the iteration is over (the next begins) or the input is.
bool Engine::Impl::ExpandStage::no_input_open() {
  if (!iteration_closed_) return fill_all();
  out_.push_back(input_done_ ? Item::end_of_stream() : Item::end_of_iteration(epoch_));
  if (!engine_.flush(st_, out_)) return false;
  if (input_done_) {
    engine_.stage_ended(st_);
    return false;
  }
  ++epoch_;
  index_ = 0;
  emitted_in_epoch_ = 0;
  st_.counters.epoch.store(epoch_, std::memory_order_relaxed);
  iteration_closed_ = false;
  turn_ = 0;
  return fill_all();
}

// An input that fails part-way loses the outputs it had left: the reason says how many it gave
// first, so that one skipped input is not mistaken for one lost record.
bool Engine::Impl::ExpandStage::input_failure(ExpandSlot& slot, const char* what) {
  if (engine_.stopping.load() && !Engine::Impl::handling_out_of_memory()) return false;  // (a per-input stage ended the run, and said why)
  const std::string reason = slot.outputs_read == 0
                                 ? fmt::format("{} (the whole input was dropped; it gave no output)", what)
                                 : fmt::format("{} (the rest of this input was dropped after its first {} outputs)", what,
                                               slot.outputs_read);
  slot.read_failed = true;
  return engine_.element_error(st_, reason.c_str(), st_.first_input_epoch + slot.epoch, slot.index, slot.origin);
}

// ---- outputs ----

// The next output of `slot`: 1 produced, 0 exhausted, -1 the run must stop.
int Engine::Impl::ExpandStage::take(ExpandSlot& slot, Sample& sample) {
  if (!slot.taken.empty()) {  // what the coordinator took from the fetchers in one go
    sample = std::move(slot.taken.front());
    slot.taken.pop_front();
    return 1;
  }
  if (fetcher_count_ == 0) return read_here(slot, sample);
  for (;;) {
    if (reading_alone()) return read_alone(slot, sample);
    if (auto got = take_from_fetchers(slot, sample)) return *got;
    // the tuner left the stage one worker while this waited: the coordinator reads on
  }
}

// The coordinator reads the slot's next output itself.
int Engine::Impl::ExpandStage::read_here(ExpandSlot& slot, Sample& sample) {
  int got = 0;
  try {
    got = read_next(slot, sample) ? 1 : 0;
  } catch (const std::exception& e) {
    got = input_failure(slot, e.what()) ? 0 : -1;
  }
  coordinator_member_ns_ += per_input_ns(slot);
  return got;
}

// The tuner gave the stage one worker: the coordinator reads itself, as an untuned stage with one
// worker does (a hand-off per record costs more than small records do), after what fetchers had
// read ahead. It holds the slot meanwhile, so that a fetcher woken by a new count does not read
// the same input.
int Engine::Impl::ExpandStage::read_alone(ExpandSlot& slot, Sample& sample) {
  if (!slot.owned) {
    std::unique_lock lock(mutex_);
    while (!changed_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy || engine_.stopping.load(); })) {
    }
    if (engine_.stopping.load()) return -1;
    if (!slot.ready.empty()) {
      sample = std::move(slot.ready.front());
      slot.ready.pop_front();
      if (per_input_) slot.ready_bytes -= std::min(slot.ready_bytes, sample.nbytes());
      return 1;
    }
    if (slot.exhausted) return 0;
    slot.busy = slot.owned = true;
  }
  // A core of the budget, held for a run of records rather than taken for each.
  if (!reading_core_) reading_core_.emplace(engine_, st_);
  if (!reading_core_->held()) return -1;
  if (++reads_on_core_ >= kChunk) {
    reading_core_.reset();
    reads_on_core_ = 0;
  }
  const int got = read_here(slot, sample);
  if (got <= 0) {
    release_owned(slot);
    if (got == 0) {
      std::lock_guard lock(mutex_);
      slot.exhausted = true;
    }
  }
  return got;
}

// What the fetchers read ahead of `slot`, waiting for it; nothing when the tuner left the stage
// one worker meanwhile (the coordinator then reads itself).
std::optional<int> Engine::Impl::ExpandStage::take_from_fetchers(ExpandSlot& slot, Sample& sample) {
  reading_core_.reset();
  release_all_owned();
  std::unique_lock lock(mutex_);
  if (slot.ready.empty() && !slot.exhausted && !out_.empty()) {
    lock.unlock();
    if (!engine_.flush(st_, out_)) return -1;
    lock.lock();
  }
  std::uint64_t t0 = now_ns();
  while (!changed_.wait_for(lock, std::chrono::milliseconds(50),
                            [&] { return !slot.ready.empty() || slot.exhausted || engine_.stopping.load() || reading_alone(); })) {
  }
  add(st_.counters.starved_ns, now_ns() - t0);
  if (engine_.stopping.load()) return -1;
  if (!slot.ready.empty()) {
    // All of it at once: one lock and one wake-up of the fetchers per run, not per record.
    slot.taken.swap(slot.ready);
    slot.ready_bytes = 0;
    sample = std::move(slot.taken.front());
    slot.taken.pop_front();
    changed_.notify_all();
    return 1;
  }
  if (slot.exhausted) return 0;
  return std::nullopt;
}

// The next output of a slot's cursor, or its next chunk of outputs (one sample carrying it);
// false once the input is exhausted. Called by the one thread reading the slot.
bool Engine::Impl::ExpandStage::read_next(ExpandSlot& slot, Sample& sample) {
  if (slot.chunked) {
    Chunk chunk;
    if (!slot.chunked->next_chunk(chunk, chunk_rows(slot))) return false;
    if (chunk.rows() == 0) throw Error("the operator's next_chunk() gave a chunk of no rows");
    const std::uint64_t rows = chunk.rows();
    slot.outputs_read += rows;
    sample = detail::carry(std::move(chunk));
    // The carrier's size is the chunk's bytes, counted once as it was made.
    slot.chunk_row_bytes = std::max<std::uint64_t>({slot.chunk_row_bytes, 1, (sample.nbytes() + rows - 1) / rows});
    return true;
  }
  if (!slot.cursor->next(sample)) return false;
  ++slot.outputs_read;
  return true;
}

// Rows to ask a cursor for: as many as its chunks' rows so far allow (kChunkRows at first) and,
// with several inputs open, up to the end of the block the slot's next row is in (block k of an
// input is its rows [k * block, (k + 1) * block)), so that a chunk short of a block (at the end
// of a read buffer) does not leave every later block cut in two.
std::size_t Engine::Impl::ExpandStage::chunk_rows(const ExpandSlot& slot) const {
  std::size_t rows = kChunkRows;
  const std::uint64_t rows_in_bytes = slot.chunk_row_bytes > 0 ? kChunkBytes / slot.chunk_row_bytes : 0;
  if (rows_in_bytes > kChunkRows) rows = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkRowsMost, rows_in_bytes));
  if (cycle_ == 1) return rows;
  const auto b = static_cast<std::size_t>(block_);
  return std::min(rows, b - slot.outputs_read % b);
}

// Time the per-input stages spent inside reads on this thread: theirs, not the reader's busy time.
std::uint64_t Engine::Impl::ExpandStage::per_input_ns(ExpandSlot& slot) {
  return !per_input_ || !slot.cursor ? 0 : static_cast<Engine::Impl::PerInputCursor&>(*slot.cursor).take_member_ns();
}

// Completion order: the next slot in turn that has something ready.
void Engine::Impl::ExpandStage::turn_to_ready_slot() {
  std::lock_guard lock(mutex_);
  for (std::size_t k = 0; k < cycle_; ++k) {
    auto& s = slots_[(turn_ + k) % cycle_];
    if (s.cursor && (!s.taken.empty() || !s.ready.empty() || s.exhausted)) {
      turn_ = (turn_ + k) % cycle_;
      return;
    }
  }
}

// Hands on up to block_length outputs of the slot in turn; an exhausted slot takes the next input.
bool Engine::Impl::ExpandStage::take_block(ExpandSlot& slot) {
  for (std::size_t taken = 0; taken < static_cast<std::size_t>(block_);) {
    Sample sample;
    const int got = take(slot, sample);
    if (got < 0) return false;
    // Exhausted, or downstream wants no more of this epoch.
    if (got == 0 || st_.exit().output->skipped(slot.epoch)) {
      // A file read to its end tells the delivery ledger which records it holds: as many as its
      // outputs, numbered on to the last (a tfds split may begin inside a shard).
      if (got == 0 && slot.read_where && !slot.read_failed && !per_input_)
        engine_.file_read_to_end(*slot.read_where, std::max<std::int64_t>(0, slot.last_record + 1 - static_cast<std::int64_t>(slot.emitted)),
                                 slot.last_record + 1);
      close(slot);
      return fill(slot);
    }
    Chunk* chunk = chunk_in(sample);
    if (chunk && cycle_ > 1 && taken + chunk->rows() > static_cast<std::size_t>(block_)) {
      const std::size_t want = static_cast<std::size_t>(block_) - taken;
      slot.taken.push_front(detail::carry(chunk->slice(want, chunk->rows())));
      sample = detail::carry(chunk->slice(0, want));
      chunk = chunk_in(sample);
    }
    const std::size_t rows = chunk ? chunk->rows() : 1;
    taken += rows;
    note_output(slot, sample, rows);
    if (!emit(std::move(sample))) return false;
  }
  return true;
}

// What a cut saves of the slot's last output, and the output's place in the iteration.
void Engine::Impl::ExpandStage::note_output(ExpandSlot& slot, Sample& sample, std::size_t rows) {
  Chunk* chunk = chunk_in(sample);
  slot.emitted += rows;
  const Origin& origin = sample.shared_origin();
  slot.last_record = chunk ? chunk->origin(rows - 1).record : origin.record;
  slot.last_offset = chunk ? chunk->origin(rows - 1).byte_offset : origin.byte_offset;
  slot.last_fingerprint = output_fingerprint(sample, rows - 1);
  if (origin.where && origin.where.get() != slot.registered_where) {
    slot.registered_where = origin.where.get();
    st_.register_read_input(origin.where, {origin.where, slot.input, st_.first_input_epoch + slot.epoch, slot.index});
  }
  if (engine_.options.lineage) {
    detail::stamp_read_epoch(sample, st_.first_input_epoch + slot.epoch);
    if (origin.where && (!slot.read_where || slot.read_where.get() != origin.where.get())) slot.read_where = origin.where;
  }
  if (chunk) {
    chunk->set_read_position(st_.first_output_epoch + epoch_, static_cast<std::int64_t>(emitted_in_epoch_));
    emitted_in_epoch_ += rows;
  } else {
    sample.set_read_position(st_.first_output_epoch + epoch_, static_cast<std::int64_t>(emitted_in_epoch_++));
  }
}

bool Engine::Impl::ExpandStage::emit(Sample sample) {
  if (const Chunk* chunk = chunk_in(sample); chunk && !per_input_) {
    add(st_.counters.chunks_out, 1);
    add(st_.counters.chunked_elements_out, chunk->rows());
  }
  if (!per_input_) {
    add(st_.counters.elements_out, rows_of(sample));
    add(st_.counters.bytes_out, sample.nbytes());
  }
  if (out_.empty()) out_bytes_ = 0;  // (flushed elsewhere too)
  if (per_input_) out_bytes_ += sample.nbytes();
  out_.push_back(Item::element(std::move(sample)));
  // Per input an output is a batch: as many bytes wait here as one input reads ahead, at most.
  if (out_.size() < kChunk && out_bytes_ < read_ahead_bytes_) return true;
  // Busy time is counted chunk by chunk, not only when new inputs are taken (one input file
  // may give records for seconds): the metrics and the autotuner see it as it happens.
  account_busy();
  reading_core_.reset();  // no core held while waiting downstream
  return engine_.flush(st_, out_);
}

// A waiting consumer gets what there is soon, but not record by record (each hand-off may wake a
// thread).
bool Engine::Impl::ExpandStage::flush_for_waiting_consumer() {
  if (out_.empty() || !st_.exit().output->consumer_waiting() || (out_.size() < kChunk / 4 && now_ns() - last_flush_ < 50'000))
    return true;
  const bool ok = engine_.flush(st_, out_);
  last_flush_ = now_ns();
  return ok;
}

void Engine::Impl::ExpandStage::close(ExpandSlot& slot) {
  release_owned(slot);
  std::unique_lock lock(mutex_);
  while (!changed_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy; })) {
  }
  slot.chunked = nullptr;
  slot.cursor.reset();
  slot.ready.clear();
  slot.ready_bytes = 0;
  slot.taken.clear();
  slot.exhausted = false;
  slot.read_where.reset();
  slot.read_failed = false;
}

// ---- fetchers ----

// A tuned stage given one worker reads on its coordinator, its fetchers parked.
bool Engine::Impl::ExpandStage::reading_alone() const { return st_.tuned_workers && st_.active_workers.load(std::memory_order_relaxed) <= 1; }

// A fetcher reads a run of records from one input (up to what the slot may hold ahead, and no more
// than kFetchRunNs of work, so that an input of slow records still hands them on soon) and hands
// the run over under one lock with one wake-up: a lock and a broadcast per record cost more than a
// small record does.
void Engine::Impl::ExpandStage::fetch(int fetcher) {
  name_this_thread(st_.spec->id + "+");
  std::vector<Sample> run;
  std::unique_lock lock(mutex_);
  for (;;) {
    ExpandSlot* work = wait_for_work(lock, fetcher);
    if (!work) return;
    work->busy = true;
    const std::size_t room = read_ahead_ - work->ready.size();
    // Bytes it may still read ahead (per input; the coordinator may take some meanwhile).
    const std::uint64_t room_bytes = read_ahead_bytes_ - work->ready_bytes;
    std::uint64_t run_bytes = 0;
    lock.unlock();
    const int got = read_run(*work, run, room, room_bytes, run_bytes);
    lock.lock();
    work->busy = false;
    for (auto& sample : run) work->ready.push_back(std::move(sample));
    work->ready_bytes += run_bytes;
    run.clear();
    if (got != 1) work->exhausted = true;
    changed_.notify_all();
  }
}

// The slot fetcher `fetcher` reads next, once there is one; null when it is to leave.
ExpandSlot* Engine::Impl::ExpandStage::wait_for_work(std::unique_lock<std::mutex>& lock, int fetcher) {
  ExpandSlot* work = nullptr;
  auto pick = [&] {
    if (quit_ || engine_.stopping.load()) return true;
    if (st_.tuned_workers && (reading_alone() || fetcher >= st_.active_workers.load(std::memory_order_relaxed))) return false;  // parked
    for (auto& s : slots_)
      if (s.cursor && !s.busy && !s.exhausted && s.ready.size() < read_ahead_ && s.ready_bytes < read_ahead_bytes_)
        return (work = &s), true;
    return false;
  };
  while (!changed_.wait_for(lock, std::chrono::milliseconds(50), pick)) {
  }
  return work;
}

// One run of reads on a fetcher, holding a core of the budget: 1 the input has more, 0 it is
// exhausted (or failed, and was dropped), -1 the run must stop.
int Engine::Impl::ExpandStage::read_run(ExpandSlot& work, std::vector<Sample>& run, std::size_t room, std::uint64_t room_bytes,
                          std::uint64_t& run_bytes) {
  int got = 1;
  bool reading = false;  // inside next(): the record it was filling is not one
  CoreHold core(engine_, st_);
  const std::uint64_t t0 = now_ns();
  std::uint64_t t = t0, member_ns = 0;
  try {
    if (!core.held()) got = -1;
    while (got == 1 && run.size() < room && run_bytes < room_bytes && t - t0 < kFetchRunNs) {
      run.emplace_back();
      reading = true;
      const bool more = read_next(work, run.back());
      member_ns += per_input_ns(work);
      reading = false;
      if (!more) {
        run.pop_back();
        got = 0;
        break;
      }
      if (per_input_) run_bytes += run.back().nbytes();
      t = now_ns();
    }
  } catch (const std::exception& e) {
    if (reading) run.pop_back();
    got = input_failure(work, e.what()) ? 0 : -1;
    t = now_ns();
  }
  member_ns += per_input_ns(work);  // (a read that threw)
  add(st_.counters.busy_ns, t - t0 > member_ns ? t - t0 - member_ns : 0);
  return got;
}

void Engine::Impl::ExpandStage::release_owned(ExpandSlot& slot) {
  if (!slot.owned) return;
  {
    std::lock_guard lock(mutex_);
    slot.busy = slot.owned = false;
  }
  changed_.notify_all();
}

void Engine::Impl::ExpandStage::release_all_owned() {
  for (auto& slot : slots_) release_owned(slot);
}

void Engine::Impl::ExpandStage::stop_fetchers() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
  }
  changed_.notify_all();
  for (auto& t : fetchers_)
    if (t.joinable()) t.join();
}

// The coordinator's busy time since the last call: its time less what it spent waiting, and less
// the per-input stages' time inside its own reads.
void Engine::Impl::ExpandStage::account_busy() {
  std::uint64_t now = now_ns(), waited = st_.counters.starved_ns.load() + st_.counters.blocked_ns.load();
  std::uint64_t spent = now - mark_, idle = waited - waited_at_mark_ + std::exchange(coordinator_member_ns_, 0);
  add(st_.counters.busy_ns, spent > idle ? spent - idle : 0);
  mark_ = now;
  waited_at_mark_ = waited;
}

}  // namespace sluice
