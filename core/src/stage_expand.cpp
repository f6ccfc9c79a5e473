// Expand stages: tf.data's interleave over cursors, with fetcher threads reading ahead.
#include "engine_impl.hpp"

#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <system_error>

#include "sluice/storage.hpp"

namespace sluice {
namespace {

// What tells one output from another at little cost, whatever its size: each field's name and size
// and its first and last 64 bytes (FNV-1a). A resumed slot checks that the output it finds where
// the checkpoint says its last one was is that output (a byte offset changed by hand, a file
// replaced, would otherwise go on from a wrong place without a word).
class Fingerprint {
 public:
  void field(const std::string& name, const Tensor& tensor) {
    feed(name.data(), name.size());
    const std::size_t size = tensor.nbytes(), head = std::min<std::size_t>(size, 64), tail = std::min<std::size_t>(size - head, 64);
    feed(&size, sizeof size);
    feed(tensor.raw_data(), head);
    feed(tensor.raw_data() + (size - tail), tail);
  }
  std::uint64_t value() const { return hash_ | 1; }  // never 0: 0 means "not known"

 private:
  // Eight bytes at a time (it runs for every output a reader hands on).
  void feed(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= size; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i, 8);
      mix(word);
    }
    std::uint64_t rest = size;
    for (; i < size; ++i) rest = (rest << 8) | bytes[i];
    mix(rest);
  }
  void mix(std::uint64_t word) {
    hash_ = (hash_ ^ word) * 0x9e3779b97f4a7c15ull;
    hash_ ^= hash_ >> 29;
  }
  std::uint64_t hash_ = 1469598103934665603ull;
};

// An output, or row `row` of a chunk of them (a reader's records handed on together).
std::uint64_t output_fingerprint(const Sample& sample, std::size_t row = 0) {
  Fingerprint print;
  if (const Chunk* chunk = chunk_in(sample)) {
    for (const auto& column : chunk->columns()) print.field(column.name, column.row(row));
  } else {
    for (const auto& field : sample.fields()) print.field(field.name, field.tensor);
  }
  return print.value();
}

}  // namespace


void Engine::Impl::run_expand(StageRuntime& st) {
  const std::size_t cycle = static_cast<std::size_t>(std::max(1, st.spec->cycle_length));
  const int block = std::max(1, st.spec->block_length);
  const bool ordered = st.spec->interleave_keeps_order(graph.deterministic);
  const int fetcher_count = st.workers > 1 ? std::min<int>(st.workers, static_cast<int>(cycle)) : 0;
  // A tuned stage given one worker reads on its coordinator, its fetchers parked.
  auto reading_alone = [&] { return st.tuned_workers && st.active_workers.load(std::memory_order_relaxed) <= 1; };
  std::optional<CoreHold> reading_core;  // the coordinator's core of the budget while it reads
  std::size_t reads_on_core = 0;
  // Chunks of a cursor's outputs go on when every reader takes them. With several inputs open,
  // block_length outputs of each alternate: a chunk is at most a block, and one that runs past the
  // block's end is cut there (its rest starts that input's next turn).
  const bool chunks = st.emits_chunks;
  // Rows to ask a cursor for: with several inputs open, up to the end of the block the slot's
  // next row is in (block k of an input is its rows [k * block, (k + 1) * block)), so that a
  // chunk short of a block (at the end of a read buffer) does not leave every later block cut in two.
  auto chunk_rows = [&](const ExpandSlot& slot) {
    if (cycle == 1) return kChunkRows;
    const auto b = static_cast<std::size_t>(block);
    return std::min(kChunkRows, b - slot.outputs_read % b);
  };
  // Read ahead per input, in items: a few chunks of a block each when they alternate.
  // With per-input stages an output is a batch, and each reader thread runs for a long time on
  // its own input: a deep read-ahead, bounded in bytes too (a batch of images is large), so that
  // readers and the coordinator seldom wait for each other. With 4 batches, two readers on two
  // cores woke each other 47,000 times in a run of bench_sequences' files (1 M lines each) and
  // took 2.3 s; with 64, 11,000 times and 1.6 s.
  const bool per_input = !st.fused.empty();
  const std::size_t read_ahead = per_input ? std::max(kPerInputReadAhead, static_cast<std::size_t>(2 * block))
                                 : chunks && cycle > 1 ? 4
                                                       : static_cast<std::size_t>(std::max(2, block));
  const std::uint64_t read_ahead_bytes = per_input ? kPerInputReadAheadBytes : std::numeric_limits<std::uint64_t>::max();
  // The next output of a slot's cursor, or its next chunk of outputs (one sample carrying it);
  // false once the input is exhausted. Called by the one thread reading the slot.
  // Time the per-input stages spent inside reads on this thread: theirs, not the reader's busy time.
  // (With per-input stages every open slot's cursor is a PerInputCursor.)
  auto per_input_ns = [&](ExpandSlot& slot) -> std::uint64_t {
    return st.fused.empty() || !slot.cursor ? 0 : static_cast<PerInputCursor&>(*slot.cursor).take_member_ns();
  };
  std::uint64_t coordinator_member_ns = 0;  // on the coordinator's own reads, since account_busy()
  auto read_next = [&](ExpandSlot& slot, Sample& sample) {
    if (slot.chunked) {
      Chunk chunk;
      if (!slot.chunked->next_chunk(chunk, chunk_rows(slot))) return false;
      if (chunk.rows() == 0) throw Error("the operator's next_chunk() gave a chunk of no rows");
      slot.outputs_read += chunk.rows();
      sample = detail::carry(std::move(chunk));
      return true;
    }
    if (!slot.cursor->next(sample)) return false;
    ++slot.outputs_read;
    return true;
  };
  StageDamage damage(*this, st);
  std::vector<ExpandSlot> slots(cycle);
  std::mutex mutex;  // guards slots' ready/exhausted/busy/cursor when fetchers run
  std::condition_variable changed;
  auto release_owned = [&](ExpandSlot& slot) {
    if (!slot.owned) return;
    {
      std::lock_guard lock(mutex);
      slot.busy = slot.owned = false;
    }
    changed.notify_all();
  };
  auto release_all_owned = [&] {
    for (auto& slot : slots) release_owned(slot);
  };
  bool quit = false;
  std::vector<Item> inputs, out;
  std::uint64_t out_bytes = 0;  // of the outputs in `out`, counted with per-input stages only
  std::size_t next_input = 0;
  std::uint64_t epoch = 0, index = 0;
  bool iteration_closed = false, input_done = false;
  bool barrier_taken = false;  // fill() took the cut's barrier from the input
  std::uint64_t turn_for_cut = 0;  // the interleave's turn, saved and restored
  std::uint64_t emitted_in_epoch = 0;  // outputs handed on in this iteration
  // The coordinator's busy time: its time less what it spent waiting (fetchers add their own).
  std::uint64_t mark = now_ns(), waited_at_mark = st.counters.starved_ns.load() + st.counters.blocked_ns.load();
  auto account_busy = [&]() {
    std::uint64_t now = now_ns(), waited = st.counters.starved_ns.load() + st.counters.blocked_ns.load();
    std::uint64_t spent = now - mark, idle = waited - waited_at_mark + std::exchange(coordinator_member_ns, 0);
    add(st.counters.busy_ns, spent > idle ? spent - idle : 0);
    mark = now;
    waited_at_mark = waited;
  };

  auto stop_fetchers = [&](std::vector<std::thread>& fetchers) {
    {
      std::lock_guard lock(mutex);
      quit = true;
    }
    changed.notify_all();
    for (auto& t : fetchers)
      if (t.joinable()) t.join();
  };
  // An input that fails part-way loses the outputs it had left: the reason says how many it gave
  // first, so that one skipped input is not mistaken for one lost record.
  auto input_failure = [&](ExpandSlot& slot, const char* what) {
    if (stopping.load() && !handling_out_of_memory()) return false;  // (a per-input stage ended the run, and said why)
    const std::string reason = slot.outputs_read == 0
                                   ? fmt::format("{} (the whole input was dropped; it gave no output)", what)
                                   : fmt::format("{} (the rest of this input was dropped after its first {} outputs)", what,
                                                 slot.outputs_read);
    return element_error(st, reason.c_str(), st.first_input_epoch + slot.epoch, slot.index, slot.origin);
  };
  // The operator's cursor for one input; with per-input stages, wrapped to run them too.
  auto open_cursor = [&](Sample input, std::uint64_t input_epoch, std::uint64_t input_index, const std::string& origin) {
    std::unique_ptr<ExpandCursor> cursor =
        st.expand->open(std::move(input), ElementContext{&st.info, st.first_input_epoch + input_epoch, input_index}, damage);
    if (cursor && !st.fused.empty())
      cursor = std::make_unique<PerInputCursor>(*this, st, std::move(cursor), st.first_input_epoch + input_epoch, input_index, origin);
    return cursor;
  };
  // Remote inputs are opened ahead of their turn, up to a cycle of them (tf.data's
  // prefetch_input_elements): opening one starts its first request, so the next objects' first
  // bytes are on their way while the open ones are read, and a store's time to first byte is not
  // paid once per object per slot. Only elements of this iteration that were already taken from
  // the input, in order; a local file's open costs nothing worth hiding.
  struct OpenedAhead {
    std::size_t position = 0;  // in `inputs`
    std::unique_ptr<ExpandCursor> cursor;
    std::optional<std::string> failure;  // open() threw: reported when its turn comes, as then
  };
  std::deque<OpenedAhead> opened_ahead;
  const std::size_t open_ahead_limit = st.fused.empty() ? cycle : 0;
  auto open_ahead = [&] {
    std::size_t position = opened_ahead.empty() ? next_input : opened_ahead.back().position + 1;
    for (; opened_ahead.size() < open_ahead_limit && position < inputs.size(); ++position) {
      const Item& item = inputs[position];
      if (!item.is_element() || st.input->skipped(epoch)) return;
      const auto& where = item.sample.shared_origin().where;
      if (!where || !is_remote_uri(*where)) return;
      OpenedAhead ahead;
      ahead.position = position;
      try {  // (index counts every element of the iteration, skipped or not, from next_input on)
        ahead.cursor = open_cursor(Sample(item.sample), epoch, index + (position - next_input), item.sample.origin());
      } catch (const std::exception& e) {
        ahead.failure = e.what();
      }
      opened_ahead.push_back(std::move(ahead));
    }
  };
  // The cursor opened ahead for inputs[position], if there is one (else null and false).
  auto take_opened_ahead = [&](std::size_t position, std::unique_ptr<ExpandCursor>& cursor) {
    if (opened_ahead.empty() || opened_ahead.front().position != position) return false;
    OpenedAhead ahead = std::move(opened_ahead.front());
    opened_ahead.pop_front();
    if (ahead.failure) throw DataError(*ahead.failure);
    cursor = std::move(ahead.cursor);
    return true;
  };
  // Opens the next input of the current iteration into `slot`; false if the run must stop.
  auto fill = [&](ExpandSlot& slot) -> bool {
    while (!iteration_closed) {
      if (barrier_taken) {  // the cut is being taken: the slot is filled once the run goes on
        slot.awaiting_fill = true;
        return true;
      }
      if (next_input == inputs.size()) {
        if (!out.empty() && !flush(st, out)) return false;  // never hold outputs while waiting
        account_busy();
        std::uint64_t t0 = now_ns();
        reading_core.reset();  // no core held while waiting for inputs
        if (!st.input->pop(inputs, kChunk)) return false;
        add(st.counters.starved_ns, now_ns() - t0);
        next_input = 0;
        if (inputs.front().is_element()) {
          add(st.counters.elements_in, inputs.size());
          add(st.counters.bytes_in, bytes_of(inputs));
        }
      }
      const std::size_t position = next_input++;
      Item& item = inputs[position];
      if (item.kind == Item::Kind::Barrier) {
        barrier_taken = true;
        slot.awaiting_fill = true;
        return true;
      }
      if (!item.is_element()) {
        iteration_closed = true;
        input_done = item.kind == Item::Kind::EndOfStream;
        return true;
      }
      const std::uint64_t my_index = index++;
      if (st.input->skipped(epoch)) {
        if (!opened_ahead.empty() && opened_ahead.front().position == position) opened_ahead.pop_front();
        continue;
      }
      std::string origin = item.sample.origin();
      try {
        Sample input = item.sample;  // shares its tensors: kept for checkpoints
        std::unique_ptr<ExpandCursor> cursor;
        if (!take_opened_ahead(position, cursor)) cursor = open_cursor(std::move(item.sample), epoch, my_index, origin);
        open_ahead();
        std::lock_guard lock(mutex);
        slot = ExpandSlot{};
        slot.cursor = std::move(cursor);
        slot.chunked = chunks ? dynamic_cast<ChunkedExpandCursor*>(slot.cursor.get()) : nullptr;
        slot.exhausted = !slot.cursor;
        slot.origin = std::move(origin);
        slot.epoch = epoch;
        slot.index = my_index;
        slot.input = std::move(input);
        changed.notify_all();
        return true;
      } catch (const std::exception& e) {
        if (!element_error(st, e.what(), st.first_input_epoch + epoch, my_index, origin)) return false;
      }
    }
    return true;
  };
  // The next output of `slot`: 1 produced, 0 exhausted, -1 the run must stop.
  auto take = [&](ExpandSlot& slot, Sample& sample) -> int {
    if (!slot.taken.empty()) {  // what the coordinator took from the fetchers in one go
      sample = std::move(slot.taken.front());
      slot.taken.pop_front();
      return 1;
    }
    for (;;) {
      if (fetcher_count == 0) {
        int got = 0;
        try {
          got = read_next(slot, sample) ? 1 : 0;
        } catch (const std::exception& e) {
          got = input_failure(slot, e.what()) ? 0 : -1;
        }
        coordinator_member_ns += per_input_ns(slot);
        return got;
      }
      if (reading_alone()) {
        // The tuner gave the stage one worker: the coordinator reads itself, as an untuned stage
        // with one worker does (a hand-off per record costs more than small records do), after
        // what fetchers had read ahead. It holds the slot meanwhile, so that a fetcher woken by a
        // new count does not read the same input.
        if (!slot.owned) {
          std::unique_lock lock(mutex);
          while (!changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy || stopping.load(); })) {
          }
          if (stopping.load()) return -1;
          if (!slot.ready.empty()) {
            sample = std::move(slot.ready.front());
            slot.ready.pop_front();
            if (per_input) slot.ready_bytes -= std::min(slot.ready_bytes, sample.nbytes());
            return 1;
          }
          if (slot.exhausted) return 0;
          slot.busy = slot.owned = true;
        }
        // A core of the budget, held for a run of records rather than taken for each.
        if (!reading_core) reading_core.emplace(*this, st);
        if (!reading_core->held()) return -1;
        if (++reads_on_core >= kChunk) {
          reading_core.reset();
          reads_on_core = 0;
        }
        int got = 0;
        try {
          got = read_next(slot, sample) ? 1 : 0;
        } catch (const std::exception& e) {
          got = input_failure(slot, e.what()) ? 0 : -1;
        }
        coordinator_member_ns += per_input_ns(slot);
        if (got <= 0) {
          release_owned(slot);
          if (got == 0) {
            std::lock_guard lock(mutex);
            slot.exhausted = true;
          }
        }
        return got;
      }
      reading_core.reset();
      release_all_owned();
      std::unique_lock lock(mutex);
      if (slot.ready.empty() && !slot.exhausted && !out.empty()) {
        lock.unlock();
        if (!flush(st, out)) return -1;
        lock.lock();
      }
      std::uint64_t t0 = now_ns();
      while (!changed.wait_for(lock, std::chrono::milliseconds(50),
                               [&] { return !slot.ready.empty() || slot.exhausted || stopping.load() || reading_alone(); })) {
      }
      add(st.counters.starved_ns, now_ns() - t0);
      if (stopping.load()) return -1;
      if (!slot.ready.empty()) {
        // All of it at once: one lock and one wake-up of the fetchers per run, not per record.
        slot.taken.swap(slot.ready);
        slot.ready_bytes = 0;
        sample = std::move(slot.taken.front());
        slot.taken.pop_front();
        changed.notify_all();
        return 1;
      }
      if (slot.exhausted) return 0;
    }  // the tuner left the stage one worker while this waited: the coordinator reads on
  };
  // A fetcher reads a run of records from one input (up to what the slot may hold ahead, and
  // no more than kFetchRunNs of work, so that an input of slow records still hands them on
  // soon) and hands the run over under one lock with one wake-up: a lock and a broadcast per
  // record cost more than a small record does.
  auto fetch_loop = [&](int fetcher) {
    name_this_thread(st.spec->id + "+");
    std::vector<Sample> run;
    std::unique_lock lock(mutex);
    for (;;) {
      ExpandSlot* work = nullptr;
      auto pick = [&] {
        if (quit || stopping.load()) return true;
        if (st.tuned_workers && (reading_alone() || fetcher >= st.active_workers.load(std::memory_order_relaxed))) return false;  // parked
        for (auto& s : slots)
          if (s.cursor && !s.busy && !s.exhausted && s.ready.size() < read_ahead && s.ready_bytes < read_ahead_bytes)
            return (work = &s), true;
        return false;
      };
      while (!changed.wait_for(lock, std::chrono::milliseconds(50), pick)) {
      }
      if (!work) return;
      work->busy = true;
      const std::size_t room = read_ahead - work->ready.size();
      // Bytes it may still read ahead (per input; the coordinator may take some meanwhile).
      const std::uint64_t room_bytes = read_ahead_bytes - work->ready_bytes;
      std::uint64_t run_bytes = 0;
      lock.unlock();
      int got = 1;
      bool reading = false;  // inside next(): the record it was filling is not one
      {
        CoreHold core(*this, st);
        const std::uint64_t t0 = now_ns();
        std::uint64_t t = t0, member_ns = 0;
        try {
          if (!core.held()) got = -1;
          while (got == 1 && run.size() < room && run_bytes < room_bytes && t - t0 < kFetchRunNs) {
            run.emplace_back();
            reading = true;
            const bool more = read_next(*work, run.back());
            member_ns += per_input_ns(*work);
            reading = false;
            if (!more) {
              run.pop_back();
              got = 0;
              break;
            }
            if (per_input) run_bytes += run.back().nbytes();
            t = now_ns();
          }
        } catch (const std::exception& e) {
          if (reading) run.pop_back();
          got = input_failure(*work, e.what()) ? 0 : -1;
          t = now_ns();
        }
        member_ns += per_input_ns(*work);  // (a read that threw)
        add(st.counters.busy_ns, t - t0 > member_ns ? t - t0 - member_ns : 0);
      }
      lock.lock();
      work->busy = false;
      for (auto& sample : run) work->ready.push_back(std::move(sample));
      work->ready_bytes += run_bytes;
      run.clear();
      if (got != 1) work->exhausted = true;
      changed.notify_all();
    }
  };
  // ---- checkpoints ----
  // The cut: take the input up to the barrier (what comes before it is this stage's to keep:
  // inputs not opened yet), then save the slots (each input, and how many outputs it gave), the
  // inputs waiting and the interleave's turn; the outputs read ahead are not saved (a resumed run
  // reads them again).
  auto take_input_through_barrier = [&]() {
    for (std::size_t k = next_input; k < inputs.size(); ++k)
      if (inputs[k].kind == Item::Kind::EndOfStream) return true;  // no barrier comes after the end
    if (input_done) return true;
    std::vector<Item> more;
    for (;;) {
      if (!st.input->pop(more, kChunk)) return false;
      if (more.front().kind == Item::Kind::Barrier) return true;
      const bool ended = more.front().kind == Item::Kind::EndOfStream;
      if (more.front().is_element()) {
        add(st.counters.elements_in, more.size());
        add(st.counters.bytes_in, bytes_of(more));
      }
      for (auto& item : more) inputs.push_back(std::move(item));
      if (ended) return true;
    }
  };
  auto save_for_cut = [&]() {
    if (!barrier_taken && !take_input_through_barrier()) return false;
    barrier_taken = false;
    if (!flush(st, out)) return false;
    const auto positions = [&](StateWriter& w) {
      w.put(epoch);
      w.put(index);
      w.put(emitted_in_epoch);
      w.put<std::uint64_t>(turn_for_cut);
      w.put<std::uint8_t>(iteration_closed);
      w.put<std::uint8_t>(input_done);
      w.put<std::uint64_t>(inputs.size() - next_input);
      for (std::size_t k = next_input; k < inputs.size(); ++k) put_item(w, inputs[k]);
      for (auto& slot : slots) {
        const std::uint8_t slot_state = slot.cursor ? 1 : slot.awaiting_fill ? 2 : 0;
        w.put(slot_state);
        if (slot_state != 1) continue;
        w.put_element(slot.input);
        w.put_string(slot.origin);
        w.put(slot.epoch);
        w.put(slot.index);
        w.put(slot.emitted);
        w.put(slot.last_record);
        w.put(slot.last_offset);
      }
      // Appended (a checkpoint without them, of an earlier version, still resumes): what each
      // open slot's last output was, checked when it is found again.
      for (auto& slot : slots)
        if (slot.cursor) w.put(slot.last_fingerprint);
    };
    std::uint64_t to_seek = 0;
    for (const auto& slot : slots) to_seek += slot.cursor && slot.emitted > 0;
    const std::string where = fmt::format("epoch {}, {} inputs opened, {} open", st.first_input_epoch + epoch, index, to_seek);
    if (!save_stage(st, positions, where, to_seek)) return false;
    out.push_back(Item::barrier());
    return flush(st, out) && wait_for_release(st);
  };
  // A resumed run opens the inputs the slots read again and goes on after the outputs they had
  // given, by seeking when the operator can and by reading them again when not (counted).
  auto restore_slots = [&]() {
    auto positions = engine_state_reader(st);
    epoch = positions->get<std::uint64_t>();
    index = positions->get<std::uint64_t>();
    emitted_in_epoch = positions->get<std::uint64_t>();
    turn_for_cut = positions->get<std::uint64_t>();
    if (turn_for_cut >= cycle) throw DataError("the checkpoint's interleave turn is out of range: it is damaged");
    iteration_closed = positions->get<std::uint8_t>() != 0;
    input_done = positions->get<std::uint8_t>() != 0;
    const auto waiting = positions->get<std::uint64_t>();
    inputs.clear();
    next_input = 0;
    opened_ahead.clear();
    for (std::uint64_t k = 0; k < waiting; ++k) inputs.push_back(get_item(*positions));
    std::vector<ExpandSlot*> open_slots;
    for (auto& slot : slots) {
      const auto slot_state = positions->get<std::uint8_t>();
      slot.awaiting_fill = slot_state == 2;
      if (slot_state != 1) continue;
      slot.input = positions->get_element();
      slot.origin = positions->get_string();
      slot.epoch = positions->get<std::uint64_t>();
      slot.index = positions->get<std::uint64_t>();
      slot.emitted = positions->get<std::uint64_t>();
      slot.last_record = positions->get<std::int64_t>();
      slot.last_offset = positions->get<std::int64_t>();
      open_slots.push_back(&slot);
    }
    const bool fingerprinted = !positions->at_end();
    for (ExpandSlot* slot : open_slots) slot->last_fingerprint = fingerprinted ? positions->get<std::uint64_t>() : 0;
    if (!positions->at_end()) throw DataError("the checkpoint's positions of this stage run on past what it wrote: it is damaged");
    for (ExpandSlot* open_slot : open_slots) {
      ExpandSlot& slot = *open_slot;
      slot.cursor = open_cursor(Sample(slot.input), slot.epoch, slot.index, slot.origin);
      if (!slot.cursor) throw Error(fmt::format("input {} opened to nothing on resume, and gave {} outputs before", slot.origin, slot.emitted));
      slot.chunked = chunks ? dynamic_cast<ChunkedExpandCursor*>(slot.cursor.get()) : nullptr;
      if (slot.emitted == 0) continue;
      // Seek to the last output given, read it again and check it is the one: the next is new.
      // (A chunk found again holds the last output first: a reader's chunk after a seek begins there.)
      auto is_the_last = [&](const Sample& found, std::size_t row) {
        const Chunk* chunk = chunk_in(found);
        return slot.last_fingerprint == 0 || (chunk && row >= chunk->rows()) || output_fingerprint(found, row) == slot.last_fingerprint;
      };
      if (slot.last_offset >= 0 && slot.cursor->seek(slot.last_record, slot.last_offset)) {
        Sample last;
        if (!slot.cursor->next(last) || last.shared_origin().record != slot.last_record || !is_the_last(last, 0))
          throw DataError(fmt::format("input {} does not have its output {} at byte {} as the checkpoint says (the checkpoint was "
                                      "changed, or the file since it was written): resume from a checkpoint of these files",
                                      slot.origin, slot.last_record, slot.last_offset));
        add(st.reread, 1);
        slot.outputs_read = slot.emitted;
        continue;
      }
      for (std::uint64_t k = 0; k < slot.emitted; ++k) {
        Sample skipped;
        if (!slot.cursor->next(skipped))
          throw DataError(fmt::format("input {} gave {} outputs before the checkpoint and only {} now: it changed", slot.origin, slot.emitted, k));
        if (k + 1 == slot.emitted && !is_the_last(skipped, chunk_in(skipped) ? std::numeric_limits<std::size_t>::max() : 0))
          throw DataError(fmt::format("input {}'s output {} is not the one the checkpoint says it gave last (the checkpoint was changed, "
                                      "or the file since it was written): resume from a checkpoint of these files",
                                      slot.origin, slot.emitted));
      }
      add(st.reread, slot.emitted);
      slot.outputs_read = slot.emitted;
    }
    st.counters.epoch.store(epoch, std::memory_order_relaxed);
    st.exit().output->set_iteration(epoch);
  };
  if (end_if_ended_before(st, out)) return;
  if (st.restore) {
    try {
      restore_slots();
    } catch (const std::exception& e) {
      fail(fmt::format("{} could not resume from the checkpoint: {}", stage_label(st), e.what()), &st);
      return;
    }
  }

  std::vector<std::thread> fetchers;
  // However this function leaves (an exception included), its fetchers are told and joined.
  struct JoinFetchers {
    std::function<void()> join;
    ~JoinFetchers() { join(); }
  } join_fetchers{[&] { stop_fetchers(fetchers); }};
  try {
    for (int i = 0; i < fetcher_count; ++i) fetchers.emplace_back(fetch_loop, i);
  } catch (const std::system_error& e) {
    throw Error(fmt::format("could not start reader thread {} of {}: {} (the process may be at its thread limit: lower "
                            "parallelism or cycle_length)",
                            fetchers.size() + 1, fetcher_count, e.what()));
  }

  // With per-input stages, what leaves is the last one's output, counted by PerInputCursor (which
  // counts this stage's own as it reads).
  const bool counts_output = st.fused.empty();
  auto emit = [&](Sample sample) {
    if (const Chunk* chunk = chunk_in(sample); chunk && counts_output) {
      add(st.counters.chunks_out, 1);
      add(st.counters.chunked_elements_out, chunk->rows());
    }
    if (counts_output) {
      add(st.counters.elements_out, rows_of(sample));
      add(st.counters.bytes_out, sample.nbytes());
    }
    if (out.empty()) out_bytes = 0;  // (flushed elsewhere too)
    if (per_input) out_bytes += sample.nbytes();
    out.push_back(Item::element(std::move(sample)));
    // Per input an output is a batch: as many bytes wait here as one input reads ahead, at most.
    if (out.size() < kChunk && out_bytes < read_ahead_bytes) return true;
    // Busy time is counted chunk by chunk, not only when new inputs are taken (one input file
    // may give records for seconds): the metrics and the autotuner see it as it happens.
    account_busy();
    reading_core.reset();  // no core held while waiting downstream
    return flush(st, out);
  };
  auto close = [&](ExpandSlot& slot) {
    release_owned(slot);
    std::unique_lock lock(mutex);
    while (!changed.wait_for(lock, std::chrono::milliseconds(50), [&] { return !slot.busy; })) {
    }
    slot.chunked = nullptr;
    slot.cursor.reset();
    slot.ready.clear();
    slot.ready_bytes = 0;
    slot.taken.clear();
    slot.exhausted = false;
  };
  bool ok = true;
  std::size_t turn = turn_for_cut;
  if (!st.restore)
    for (auto& slot : slots)
      if (!(ok = fill(slot))) break;
  std::uint64_t last_flush = now_ns();
  while (ok && !stopping.load()) {
    if (cut_requested(st) || barrier_taken) {
      turn_for_cut = turn;
      if (!(ok = save_for_cut())) break;
    }
    // Slots a cut left waiting for their input are filled in the order they would have been.
    for (auto& slot : slots)
      if (slot.awaiting_fill && !slot.cursor) {
        slot.awaiting_fill = false;
        if (!(ok = fill(slot))) break;
      }
    if (!ok) break;
    if (barrier_taken) continue;
    bool any_open = false;
    for (auto& slot : slots) any_open |= static_cast<bool>(slot.cursor);
    if (!any_open) {
      if (!iteration_closed) {  // every input of this iteration failed to open, or was skipped
        for (auto& slot : slots)
          if (!(ok = fill(slot))) break;
        continue;
      }
      out.push_back(input_done ? Item::end_of_stream() : Item::end_of_iteration(epoch));
      if (!(ok = flush(st, out)) || input_done) {
        if (ok) stage_ended(st);
        break;
      }
      ++epoch;
      index = 0;
      emitted_in_epoch = 0;
      st.counters.epoch.store(epoch, std::memory_order_relaxed);
      iteration_closed = false;
      for (auto& slot : slots)
        if (!(ok = fill(slot))) break;
      turn = 0;
      continue;
    }
    if (!ordered && fetcher_count > 0) {
      // Completion order: the next slot in turn that has something ready.
      std::lock_guard lock(mutex);
      for (std::size_t k = 0; k < cycle; ++k) {
        auto& s = slots[(turn + k) % cycle];
        if (s.cursor && (!s.taken.empty() || !s.ready.empty() || s.exhausted)) {
          turn = (turn + k) % cycle;
          break;
        }
      }
    }
    ExpandSlot& slot = slots[turn];
    if (slot.cursor) {
      for (std::size_t taken = 0; taken < static_cast<std::size_t>(block);) {
        Sample sample;
        int got = take(slot, sample);
        if (got < 0) {
          ok = false;
          break;
        }
        if (got == 0) {
          close(slot);
          ok = fill(slot);
          break;
        }
        if (st.exit().output->skipped(slot.epoch)) {  // downstream wants no more of this epoch
          close(slot);
          ok = fill(slot);
          break;
        }
        Chunk* chunk = chunk_in(sample);
        if (chunk && cycle > 1 && taken + chunk->rows() > static_cast<std::size_t>(block)) {
          const std::size_t want = static_cast<std::size_t>(block) - taken;
          slot.taken.push_front(detail::carry(chunk->slice(want, chunk->rows())));
          sample = detail::carry(chunk->slice(0, want));
          chunk = chunk_in(sample);
        }
        const std::size_t rows = chunk ? chunk->rows() : 1;
        taken += rows;
        slot.emitted += rows;
        const Origin& origin = sample.shared_origin();
        slot.last_record = chunk ? chunk->origin(rows - 1).record : origin.record;
        slot.last_offset = chunk ? chunk->origin(rows - 1).byte_offset : origin.byte_offset;
        slot.last_fingerprint = output_fingerprint(sample, rows - 1);
        if (origin.where && origin.where.get() != slot.registered_where) {
          slot.registered_where = origin.where.get();
          st.register_read_input(origin.where, {origin.where, slot.input, st.first_input_epoch + slot.epoch, slot.index});
        }
        if (chunk) {
          chunk->set_read_position(st.first_output_epoch + epoch, static_cast<std::int64_t>(emitted_in_epoch));
          emitted_in_epoch += rows;
        } else {
          sample.set_read_position(st.first_output_epoch + epoch, static_cast<std::int64_t>(emitted_in_epoch++));
        }
        if (!(ok = emit(std::move(sample)))) break;
      }
    }
    turn = (turn + 1) % cycle;
    // A waiting consumer gets what there is soon, but not record by record (each hand-off may
    // wake a thread).
    if (ok && !out.empty() && st.exit().output->consumer_waiting() &&
        (out.size() >= kChunk / 4 || now_ns() - last_flush >= 50'000)) {
      ok = flush(st, out);
      last_flush = now_ns();
    }
  }
  account_busy();
  stop_fetchers(fetchers);
}

}  // namespace sluice
