// An expand stage's cuts: what it saves of its slots for a checkpoint, and a resumed run's
// slots opened again where they were, each checked to hold the output the checkpoint says.
#include <cstring>

#include "stage_expand.hpp"

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

}  // namespace

// An output, or row `row` of a chunk of them (a reader's records handed on together).
std::uint64_t output_fingerprint(const Sample& sample, std::size_t row) {
  Fingerprint print;
  if (const Chunk* chunk = chunk_in(sample)) {
    for (const auto& column : chunk->columns()) print.field(column.name, column.row(row));
  } else {
    for (const auto& field : sample.fields()) print.field(field.name, field.tensor);
  }
  return print.value();
}


// ---- checkpoints ----
// The cut: take the input up to the barrier (what comes before it is this stage's to keep: inputs
// not opened yet), then save the slots (each input, and how many outputs it gave), the inputs
// waiting and the interleave's turn; the outputs read ahead are not saved (a resumed run reads
// them again). From a source that gives way to cuts (stage_source.cpp) the inputs before the
// barrier are copied where they wait, and only the barrier is taken out: taking them would let
// the source refill its buffer past its bounds at every cut, and a pipeline cut each training
// step (Python's state_dict()) would run its source ahead, and grow its states, without bound.
bool Engine::Impl::ExpandStage::take_input_through_barrier() {
  for (std::size_t k = next_input_; k < inputs_.size(); ++k)
    if (inputs_[k].kind == Item::Kind::EndOfStream) return true;  // no barrier comes after the end
  if (input_done_) return true;
  if (input_from_source_giving_way_) return st_.input->copy_through_barrier(waiting_in_input_);
  std::vector<Item> more;
  for (;;) {
    if (!st_.input->pop(more, kChunk)) return false;
    if (more.front().kind == Item::Kind::Barrier) return true;
    const bool ended = more.front().kind == Item::Kind::EndOfStream;
    if (more.front().is_element()) {
      add(st_.counters.elements_in, more.size());
      add(st_.counters.bytes_in, bytes_of(more));
    }
    for (auto& item : more) inputs_.push_back(std::move(item));
    if (ended) return true;
  }
}

bool Engine::Impl::ExpandStage::save_for_cut() {
  if (!barrier_taken_ && !take_input_through_barrier()) return false;
  barrier_taken_ = false;
  if (!engine_.flush(st_, out_)) return false;
  std::uint64_t to_seek = 0;
  for (const auto& slot : slots_) to_seek += slot.cursor && slot.emitted > 0;
  const std::string where = fmt::format("epoch {}, {} inputs opened, {} open", st_.first_input_epoch + epoch_, index_, to_seek);
  if (!engine_.save_stage(st_, [this](StateWriter& w) { write_positions(w); }, where, to_seek)) return false;
  waiting_in_input_.clear();
  give_back_inputs_not_needed_yet();
  out_.push_back(Item::barrier());
  return engine_.flush(st_, out_) && engine_.wait_for_release(st_);
}

// The inputs the cut took ahead (saved now, in order) go back to the input buffer, where they
// take room again: kept here, they would let the producer fill the buffer anew after every cut.
// Those a cursor was opened ahead for stay.
void Engine::Impl::ExpandStage::give_back_inputs_not_needed_yet() {
  if (input_from_source_giving_way_) return;  // none were taken
  const std::size_t keep = opened_ahead_.empty() ? next_input_ : std::max(next_input_, opened_ahead_.back().position + 1);
  if (keep >= inputs_.size()) return;
  std::vector<Item> back(std::make_move_iterator(inputs_.begin() + static_cast<std::ptrdiff_t>(keep)), std::make_move_iterator(inputs_.end()));
  inputs_.resize(keep);
  std::uint64_t elements = 0;  // counted in again when taken again
  for (const auto& item : back) elements += item.is_element();
  st_.counters.elements_in.fetch_sub(elements, std::memory_order_relaxed);
  st_.counters.bytes_in.fetch_sub(bytes_of(back), std::memory_order_relaxed);
  st_.input->give_back(back);
}

void Engine::Impl::ExpandStage::write_positions(StateWriter& w) {
  w.put(epoch_);
  w.put(index_);
  w.put(emitted_in_epoch_);
  w.put<std::uint64_t>(turn_for_cut_);
  w.put<std::uint8_t>(iteration_closed_);
  w.put<std::uint8_t>(input_done_);
  w.put<std::uint64_t>(inputs_.size() - next_input_ + waiting_in_input_.size());
  for (std::size_t k = next_input_; k < inputs_.size(); ++k) Engine::Impl::put_item(w, inputs_[k]);
  for (const auto& item : waiting_in_input_) Engine::Impl::put_item(w, item);
  for (auto& slot : slots_) {
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
  for (auto& slot : slots_)
    if (slot.cursor) w.put(slot.last_fingerprint);
}

// A resumed run's positions, as write_positions() saved them; returns the slots that were open.
std::vector<ExpandSlot*> Engine::Impl::ExpandStage::read_positions() {
  auto positions = engine_.engine_state_reader(st_);
  epoch_ = positions->get<std::uint64_t>();
  index_ = positions->get<std::uint64_t>();
  emitted_in_epoch_ = positions->get<std::uint64_t>();
  turn_for_cut_ = positions->get<std::uint64_t>();
  if (turn_for_cut_ >= cycle_) throw DataError("the checkpoint's interleave turn is out of range: it is damaged");
  iteration_closed_ = positions->get<std::uint8_t>() != 0;
  input_done_ = positions->get<std::uint8_t>() != 0;
  const auto waiting = positions->get<std::uint64_t>();
  inputs_.clear();
  next_input_ = 0;
  opened_ahead_.clear();
  for (std::uint64_t k = 0; k < waiting; ++k) inputs_.push_back(Engine::Impl::get_item(*positions));
  std::vector<ExpandSlot*> open_slots;
  for (auto& slot : slots_) {
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
  return open_slots;
}

// A resumed run opens the input a slot read again and goes on after the outputs it had given, by
// seeking when the operator can and by reading them again when not (counted).
void Engine::Impl::ExpandStage::reopen(ExpandSlot& slot) {
  slot.cursor = open_cursor(Sample(slot.input), slot.epoch, slot.index, slot.origin);
  if (!slot.cursor) throw Error(fmt::format("input {} opened to nothing on resume, and gave {} outputs before", slot.origin, slot.emitted));
  slot.chunked = chunks_ ? dynamic_cast<ChunkedExpandCursor*>(slot.cursor.get()) : nullptr;
  if (slot.emitted == 0) return;
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
    add(st_.reread, 1);
    slot.outputs_read = slot.emitted;
    return;
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
  add(st_.reread, slot.emitted);
  slot.outputs_read = slot.emitted;
}

}  // namespace sluice
