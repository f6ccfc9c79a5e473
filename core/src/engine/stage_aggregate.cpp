// Aggregate stages (batch, shuffle, take, repeat, cache): one thread takes the inputs in order
// (helpers may assemble the outputs: output_assembly.hpp), iterations mapped to the input's,
// replays.
#include <optional>
#include <utility>

#include "engine_impl.hpp"
#include "sluice/core/lineage.hpp"

namespace sluice {

namespace {

// The outputs of a replay (cache), counted so that a checkpoint taken in the middle of one can
// say how far it got; a resumed run replays that iteration again and drops what it had given.
class ReplayEmitter final : public Emitter {
 public:
  ReplayEmitter(Emitter& out, std::function<bool(std::uint64_t)> cut_hook) : out_(out), cut_hook_(std::move(cut_hook)) {}
  std::uint64_t given = 0, drop = 0;
  bool push(Sample sample) override {
    if (drop > 0) {
      --drop;
      ++given;
      return true;
    }
    if (!cut_hook_(given)) return false;
    ++given;
    return out_.push(std::move(sample));
  }

 private:
  Emitter& out_;
  std::function<bool(std::uint64_t)> cut_hook_;
};

}  // namespace

bool Engine::Impl::CollectingEmitter::settle(bool all) {
  if (!assembly_) return true;
  // A few outputs per thread in flight keep every thread busy; more would only hold memory.
  const std::size_t most_pending = all ? 0 : 2 * static_cast<std::size_t>(st_.workers);
  made_.clear();
  try {
    assembly_->collect(made_, most_pending, impl_.stopping);
  } catch (const std::exception& e) {
    impl_.fail(handling_out_of_memory() ? impl_.out_of_memory_message(st_)
                                        : fmt::format("{} failed assembling an output of epoch {}: {}", impl_.stage_label(st_),
                                                      st_.first_output_epoch + iteration, e.what()),
               &st_);
    return false;
  } catch (...) {
    impl_.fail(fmt::format("{} failed assembling an output of epoch {}: its operator threw something that is not an exception",
                           impl_.stage_label(st_), st_.first_output_epoch + iteration),
               &st_);
    return false;
  }
  // Outputs of an iteration downstream stopped wanting (a take satisfied) go no further.
  const bool keep = !st_.exit().output->skipped(iteration);
  for (auto& sample : made_) {
    attach_rows(sample);
    if (keep && !hand_on(std::move(sample))) return false;
  }
  made_.clear();
  return !impl_.stopping.load(std::memory_order_relaxed);
}

void Engine::Impl::CollectingEmitter::attach_rows(Sample& output) {
  if (!st_.stacks) return;
  const std::size_t rows = std::min<std::size_t>(static_cast<std::size_t>(st_.stacks->inputs_per_output()), pending_rows_.size());
  if (rows == 0) return;
  std::vector<Origin> stacked = pending_rows_.take_front(rows);
  const Origin& first = output.shared_origin();
  const Origin with_rows = origin_of_rows(first, std::move(stacked));
  output.set_origin(with_rows.where, with_rows.record, with_rows.byte_offset);
  output.set_read_position(with_rows.read_epoch, with_rows.read_index);
}

// An aggregate stage: one thread takes the inputs in order and pushes them to the operator;
// iterations map to the input's through passes_per_iteration, and iterations the input does not
// provide are replayed (cache). With parallelism above 1 (an operator that assembles in
// parallel), workers - 1 threads assemble outputs, and this one when it is ahead of them.
class Engine::Impl::AggregateStage {
 public:
  AggregateStage(Impl& engine, StageRuntime& st);
  void run();

 private:
  // ---- the phases of run() ----
  void restore();
  bool begin();
  bool take_inputs();   // until the input ends; false when the run stops
  bool input_ended();
  bool replay();        // the iterations the input did not provide
  void finish();

  // ---- inputs ----
  bool end_of_input_iteration();
  bool push_items();
  bool pass_items_through();
  void check_read_positions();
  void remember_input_places();
  bool push_element(Item& item);
  bool push_chunk(Sample& carrier, std::uint64_t first_index);
  bool push_rows_one_by_one(const Chunk& rest, const ElementContext& ctx);

  // ---- outputs and cuts ----
  template <class Call>
  bool guarded(Call&& call, const char* what);
  bool close_iteration();
  bool save_for_cut(std::uint64_t replay_given);
  bool cut_during_replay(std::uint64_t given);
  std::uint64_t waited_total() const { return st_.counters.blocked_ns.load() + (assembly_ ? assembly_->waited_ns() : 0); }
  void account_busy(std::uint64_t now);

  Impl& engine_;
  StageRuntime& st_;
  Aggregate& op_;
  std::vector<Item> in_, out_;
  // Declared before the emitter, so that its threads are joined after the emitter is gone.
  std::optional<detail::OutputAssembly> assembly_;
  CollectingEmitter emitter_;
  std::uint64_t out_iteration_ = 0, in_iteration_ = 0, in_index_ = 0;
  std::int64_t inputs_in_group_ = 0;
  bool open_;
  bool replaying_ = false;        // the input ended; iterations come from replay()
  std::uint64_t replay_drop_ = 0;  // a resumed replay: outputs given before the checkpoint
  // Busy time is the time between two pops, less what flushing spent waiting downstream and
  // what waiting for the assembly threads took (they count their own).
  std::uint64_t mark_ = 0, waited_at_mark_ = 0;
  OriginKeeper origin_;  // of the element being pushed, for a message
};

void Engine::Impl::run_aggregate(StageRuntime& st) { AggregateStage(*this, st).run(); }

namespace {
// Starts the assembly threads of a stage with parallelism above 1, in `assembly`; null otherwise.
detail::OutputAssembly* start_assembly(std::optional<detail::OutputAssembly>& assembly, StageRuntime& st) {
  if (st.workers <= 1) return nullptr;
  assembly.emplace(
      st.workers - 1, [name = st.spec->id + "+"] { name_this_thread(name); }, [&st](std::uint64_t ns) { add(st.counters.busy_ns, ns); });
  return &*assembly;
}
}  // namespace

Engine::Impl::AggregateStage::AggregateStage(Impl& engine, StageRuntime& st)
    : engine_(engine),
      st_(st),
      op_(*st.aggregate),
      emitter_(engine, st, out_, start_assembly(assembly_, st)),
      open_(st.demand != 0) {}

void Engine::Impl::AggregateStage::run() {
  if (engine_.end_if_ended_before(st_, out_)) return;
  if (st_.restore) restore();
  else if (!begin()) return;
  mark_ = now_ns();
  waited_at_mark_ = waited_total();
  if (!replaying_ && !(take_inputs() && input_ended())) return;
  if (replay()) finish();
}

void Engine::Impl::AggregateStage::restore() {
  auto positions = engine_.engine_state_reader(st_);
  out_iteration_ = positions->get<std::uint64_t>();
  in_iteration_ = positions->get<std::uint64_t>();
  in_index_ = positions->get<std::uint64_t>();
  inputs_in_group_ = positions->get<std::int64_t>();
  open_ = positions->get<std::uint8_t>() != 0;
  replaying_ = positions->get<std::uint8_t>() != 0;
  replay_drop_ = positions->get<std::uint64_t>();
  emitter_.iteration = out_iteration_;
  emitter_.held_when_restored(st_.restored_rows);
  st_.output->set_iteration(out_iteration_);
  st_.counters.epoch.store(out_iteration_, std::memory_order_relaxed);
}

bool Engine::Impl::AggregateStage::begin() {
  return !open_ || guarded([&] { op_.begin_iteration(st_.first_output_epoch); }, "at the start");
}

bool Engine::Impl::AggregateStage::take_inputs() {
  for (;;) {
    std::uint64_t t0 = now_ns();
    account_busy(t0);
    if (!st_.input->pop(in_, kChunk)) return false;
    mark_ = now_ns();
    add(st_.counters.starved_ns, mark_ - t0);
    switch (in_.front().kind) {
      case Item::Kind::EndOfStream:
        return true;
      case Item::Kind::Barrier:
        if (!save_for_cut(0)) return false;
        continue;
      case Item::Kind::EndOfIteration:
        if (!end_of_input_iteration()) return false;
        continue;
      default:
        if (!push_items() || !emitter_.settle(false) || !engine_.flush(st_, out_)) return false;
    }
  }
}

// The input ended: close a partly received group (repeat whose input was cut short); the
// iterations the input did not provide are replayed next. No barrier comes from an input that
// ended: a checkpoint is cut between replays or between two outputs of one.
bool Engine::Impl::AggregateStage::input_ended() {
  replaying_ = true;
  return !(open_ && (inputs_in_group_ > 0 || st_.passes_per_iteration == kUnbounded) && !close_iteration());
}

bool Engine::Impl::AggregateStage::replay() {
  ReplayEmitter replay_out(emitter_, [this](std::uint64_t given) { return cut_during_replay(given); });
  while (open_ && !engine_.stopping.load() && st_.output->skip_through() != kAllIterations) {
    if (engine_.cut_requested(st_) && !(save_for_cut(0) && engine_.wait_for_release(st_))) return false;
    bool replayed = false;
    replay_out.given = 0;
    replay_out.drop = std::exchange(replay_drop_, 0);
    if (!guarded([&] { replayed = op_.replay(st_.first_output_epoch + out_iteration_, replay_out); }, "replaying")) return false;
    if (engine_.stopping.load()) return false;
    if (!replayed || !close_iteration()) break;
  }
  return true;
}

void Engine::Impl::AggregateStage::finish() {
  if (!emitter_.settle(true)) return;
  account_busy(now_ns());
  out_.push_back(Item::end_of_stream());
  if (engine_.flush(st_, out_)) engine_.stage_ended(st_);
}

bool Engine::Impl::AggregateStage::end_of_input_iteration() {
  // Repeating forever over a pass that yielded nothing would spin without end: as in tf.data, an
  // empty pass ends the repetition.
  if (in_index_ == 0 && st_.passes_per_iteration == kUnbounded) engine_.skip_input(st_, kAllIterations);
  ++in_iteration_;
  in_index_ = 0;
  ++inputs_in_group_;
  if (open_ && st_.passes_per_iteration > 0 && inputs_in_group_ == st_.passes_per_iteration) {
    inputs_in_group_ = 0;
    return close_iteration();
  }
  return true;
}

// A chunk of input elements (or of chunks, for an operator that takes them) to the operator.
bool Engine::Impl::AggregateStage::push_items() {
  add(st_.counters.elements_in, st_.chunked_aggregate || st_.passes_through ? rows_of(in_) : in_.size());
  add(st_.counters.bytes_in, bytes_of(in_));
  if (st_.passes_through) return pass_items_through();
  if (st_.checks_read_positions || st_.stamps_read_positions) check_read_positions();
  if (st_.input_places) remember_input_places();
  for (auto& item : in_) {
    if (Chunk* chunk = st_.chunked_aggregate ? chunk_in(item.sample) : nullptr) {
      const std::uint64_t first_index = in_index_;
      in_index_ += chunk->rows();
      if (st_.input->skipped(in_iteration_) || !open_) continue;
      if (!push_chunk(item.sample, first_index)) return false;
    } else if (!push_element(item)) {
      return false;
    }
    if (engine_.stopping.load(std::memory_order_relaxed)) return false;
  }
  return true;
}

// (StageRuntime::checks_read_positions) Each input, element or chunk, at its place in the input's
// iteration (in_index_ on), compared with where it was read; one that is not there forgets it.
// (stamps_read_positions) Or, right after a source that reads again, given it.
void Engine::Impl::AggregateStage::check_read_positions() {
  const std::uint64_t epoch = st_.first_input_epoch + in_iteration_;
  std::uint64_t index = in_index_;
  auto shifted = [&](std::uint64_t read_epoch, std::int64_t read_index, std::uint64_t at) {
    return read_index >= 0 && (read_epoch != epoch || static_cast<std::uint64_t>(read_index) != at);
  };
  for (auto& item : in_) {
    if (Chunk* chunk = st_.chunked_aggregate ? chunk_in(item.sample) : nullptr) {
      const std::size_t rows = chunk->rows();
      for (std::size_t r = 0; r < rows; ++r)
        if (st_.stamps_read_positions || shifted(chunk->read_epoch(), chunk->read_index_of(r), index + r)) {
          Chunk forgetting = *chunk;  // (a copy: another reader of the stage before may be reading the same carrier)
          forgetting.forget_read_positions();
          item.sample = detail::carry(std::move(forgetting));
          break;
        }
      index += rows;
    } else {
      if (st_.stamps_read_positions) item.sample.set_read_position(epoch, static_cast<std::int64_t>(index));
      else if (const Origin& o = item.sample.shared_origin(); shifted(o.read_epoch, o.read_index, index)) item.sample.set_read_position(epoch, -1);
      ++index;
    }
  }
}

// (StageRuntime::input_places) Each input's place, by where it was read.
void Engine::Impl::AggregateStage::remember_input_places() {
  const std::uint64_t epoch = st_.first_input_epoch + in_iteration_;
  std::uint64_t index = in_index_;
  for (auto& item : in_) {
    if (Chunk* chunk = st_.chunked_aggregate ? chunk_in(item.sample) : nullptr) {
      for (std::size_t r = 0; r < chunk->rows(); ++r) st_.input_places->remember(chunk->origin(r), epoch, index++);
    } else {
      st_.input_places->remember(item.sample.shared_origin(), epoch, index++);
    }
  }
}

// A repeat (OperatorRole::Repeats): each input handed on as it came, what the operator's push()
// would do, without calling it. Its input is in chunks only where its readers take them
// (choose_chunks): a chunk goes on whole.
bool Engine::Impl::AggregateStage::pass_items_through() {
  for (auto& item : in_) {
    const std::size_t rows = rows_of(item.sample);
    in_index_ += rows;
    if (st_.input->skipped(in_iteration_) || !open_) continue;
    if (!emitter_.pass_on(std::move(item.sample), rows)) return false;
  }
  return true;
}

bool Engine::Impl::AggregateStage::push_element(Item& item) {
  ElementContext ctx{&st_.info, st_.first_input_epoch + in_iteration_, in_index_++};
  if (st_.input->skipped(in_iteration_) || !open_) return true;
  origin_.keep(item.sample.shared_origin());
  emitter_.took(item.sample.shared_origin());
  try {
    if (op_.push(std::move(item.sample), ctx, emitter_) == Aggregate::Flow::SkipRestOfIteration)
      engine_.skip_input(st_, static_cast<std::int64_t>(in_iteration_));
  } catch (const std::exception& e) {
    emitter_.took_back(1);
    if (!engine_.element_error(st_, e.what(), ctx.epoch, ctx.index, origin_.text())) return false;
  }
  return true;
}

// Rows from `done` on are still to push; a refused row is reported (or ends the run) and the rows
// after it go on in a new call, as elements after a refused one do.
bool Engine::Impl::AggregateStage::push_chunk(Sample& carrier, std::uint64_t first_index) {
  // The carrier's chunk is read in place (another reader of the stage may read it too; nothing
  // writes it), and sliced only past a refused row.
  const Sample held = std::exchange(carrier, Sample());
  const Chunk* in = detail::chunk_in(held);
  Chunk after_refused;
  std::size_t done = 0;
  while (in->rows() > 0) {
    const Chunk& rest = *in;
    const ElementContext ctx{&st_.info, st_.first_input_epoch + in_iteration_, first_index + done};
    emitter_.took(rest);
    try {
      if (st_.chunked_aggregate->push_chunk(rest, ctx, emitter_) == Aggregate::Flow::SkipRestOfIteration)
        engine_.skip_input(st_, static_cast<std::int64_t>(in_iteration_));
      return true;
    } catch (const RowError& e) {
      const std::size_t row = std::min(e.row(), rest.rows() - 1);
      emitter_.took_back(rest.rows() - row);  // the refused row and those after it, pushed again below
      if (!engine_.element_error(st_, e.what(), ctx.epoch, ctx.index + row, rest.origin(row).text())) return false;
      after_refused = rest.slice(row + 1, rest.rows());
      in = &after_refused;
      done += row + 1;
    } catch (const std::exception&) {
      if (handling_out_of_memory()) {
        engine_.fail(engine_.out_of_memory_message(st_), &st_);
        return false;
      }
      emitter_.took_back(rest.rows());
      return push_rows_one_by_one(rest, ctx);
    }
    if (engine_.stopping.load(std::memory_order_relaxed)) return false;
  }
  return true;
}

// Not one row's fault, or an operator that does not say which row: the rows go through the
// element form one by one, each taken, skipped or named as alone.
bool Engine::Impl::AggregateStage::push_rows_one_by_one(const Chunk& rest, const ElementContext& ctx) {
  for (std::size_t r = 0; r < rest.rows(); ++r) {
    const ElementContext row_ctx{&st_.info, ctx.epoch, ctx.index + r};
    emitter_.took(rest.origin(r));
    try {
      if (op_.push(rest.row(r), row_ctx, emitter_) == Aggregate::Flow::SkipRestOfIteration) {
        engine_.skip_input(st_, static_cast<std::int64_t>(in_iteration_));
        return true;
      }
    } catch (const std::exception& e) {
      emitter_.took_back(1);
      if (!engine_.element_error(st_, e.what(), row_ctx.epoch, row_ctx.index, rest.origin(r).text())) return false;
    }
  }
  return true;
}

template <class Call>
bool Engine::Impl::AggregateStage::guarded(Call&& call, const char* what) {
  try {
    call();
    return true;
  } catch (const std::exception& e) {
    engine_.fail(fmt::format("{} failed {} of epoch {}: {}", engine_.stage_label(st_), what, st_.first_output_epoch + out_iteration_, e.what()),
                 &st_);
    return false;
  }
}

bool Engine::Impl::AggregateStage::close_iteration() {
  if (!guarded([&] { op_.end_iteration(st_.first_output_epoch + out_iteration_, emitter_); }, "at the end")) return false;
  if (!emitter_.settle(true)) return false;
  emitter_.iteration_ended();
  out_.push_back(Item::end_of_iteration(out_iteration_));
  if (!engine_.flush(st_, out_)) return false;
  ++out_iteration_;
  st_.counters.epoch.store(out_iteration_, std::memory_order_relaxed);
  open_ = st_.demand == kUnbounded || out_iteration_ < static_cast<std::uint64_t>(st_.demand);
  emitter_.iteration = out_iteration_;
  return !open_ || guarded([&] { op_.begin_iteration(st_.first_output_epoch + out_iteration_); }, "at the start");
}

// The cut reaches the stage between two inputs, or between two outputs of a replay: what it
// emitted goes first, then its state, then the barrier.
bool Engine::Impl::AggregateStage::save_for_cut(std::uint64_t replay_given) {
  if (!emitter_.settle(true) || !engine_.flush(st_, out_)) return false;
  const auto positions = [&](StateWriter& w) {
    w.put(out_iteration_);
    w.put(in_iteration_);
    w.put(in_index_);
    w.put(inputs_in_group_);
    w.put<std::uint8_t>(open_);
    w.put<std::uint8_t>(replaying_);
    w.put(replay_given);
  };
  const std::string where = replaying_ ? fmt::format("replaying epoch {}, {} elements given", st_.first_output_epoch + out_iteration_, replay_given)
                                       : fmt::format("epoch {}, {} inputs taken", st_.first_input_epoch + in_iteration_, in_index_);
  if (st_.input_places) {
    const std::uint64_t epoch = st_.first_input_epoch + in_iteration_;
    st_.made_places_hold_in = engine_.made_places_hold_at_cut(st_, epoch, in_index_) ? std::optional(epoch) : std::nullopt;
  }
  if (!engine_.save_stage(st_, positions, where)) return false;
  out_.push_back(Item::barrier());
  return engine_.flush(st_, out_);
}

bool Engine::Impl::AggregateStage::cut_during_replay(std::uint64_t given) {
  if (!engine_.cut_requested(st_)) return !engine_.stopping.load(std::memory_order_relaxed);
  return save_for_cut(given) && engine_.wait_for_release(st_);
}

void Engine::Impl::AggregateStage::account_busy(std::uint64_t now) {
  const std::uint64_t waited_now = waited_total();
  std::uint64_t spent = now - mark_, waited = waited_now - waited_at_mark_;
  add(st_.counters.busy_ns, spent > waited ? spent - waited : 0);
  waited_at_mark_ = waited_now;
}

}  // namespace sluice
