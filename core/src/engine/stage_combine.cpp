// Combine stages (zip, concatenate, sample_from_datasets, ...): one worker; the operator pulls from
// its inputs in its own order, output by output, and each output iteration reads one iteration of
// every input.
#include "engine_impl.hpp"

namespace sluice {

// An operator's state kept aside at the start of every output (plain bytes, elements shared, not
// encoded): a checkpoint's barrier may reach an input while the operator waits for it in the
// middle of an output, and the cut then is where that output began.
class StateSnapshot final : public StateWriter {
 public:
  // Kept in buffers reused from one output to the next: no allocation per output once warm.
  void put_bytes(const void* data, std::size_t size) override {
    bytes_.append(static_cast<const char*>(data), size);
    ends_.push_back({bytes_.size(), elements_.size()});
  }
  void put_element(const Sample& element) override {
    elements_.push_back(element);
    ends_.push_back({bytes_.size(), elements_.size()});
  }
  void describe(std::string text) override { words_ = std::move(text); }
  void clear() {
    bytes_.clear();
    elements_.clear();
    ends_.clear();
    words_.clear();
  }
  void replay(StateWriter& into) const {
    std::size_t at = 0, element = 0;
    for (const auto& [bytes_end, elements_end] : ends_) {
      if (elements_end > element) into.put_element(elements_[element++]);
      else into.put_bytes(bytes_.data() + at, bytes_end - at);
      at = bytes_end;
    }
    if (!words_.empty()) into.describe(words_);
  }

 private:
  std::string bytes_;
  std::vector<Sample> elements_;
  std::vector<std::pair<std::size_t, std::size_t>> ends_;  // after each call: bytes and elements so far
  std::string words_;
};

// What the stage holds of one input.
struct CombineInput {
  std::deque<Item> waiting;      // taken from the channel, not yet given to the operator
  std::vector<Item> given;       // taken by the operator during the current output (ends too)
  bool iteration_ended = false, stream_ended = false;
  bool ended_at_output_start = false, stream_ended_at_output_start = false;
  bool at_barrier = false;       // its barrier for the cut being taken has been taken
};

// A combine stage: one worker calling the operator output by output; the operator reads the
// inputs through this class (its CombineInputs), and each output iteration reads one iteration of
// every input.
class Engine::Impl::CombineStage final : private CombineInputs {
 public:
  CombineStage(Impl& engine, StageRuntime& st);
  void run();

 private:
  // Where the stage is: the operator making the iteration's outputs, then dropping what it left
  // of its inputs' iterations, then (after the last iteration) reading its inputs to their ends.
  enum Phase : std::uint8_t { Outputs = 0, Dropping = 1, Ending = 2 };

  // ---- the phases of run() ----
  bool restore();
  bool wants_another_iteration() const;
  bool run_iteration();
  bool make_outputs();
  bool drop_rest_of_iteration();
  bool end_iteration();
  void read_inputs_to_their_ends();

  // ---- the operator's view of the inputs (CombineInputs) ----
  std::size_t size() const override { return state_.size(); }
  const std::string& name(std::size_t k) const override { return names_.at(k); }
  bool next(std::size_t k, Sample& sample) override;
  bool take(std::size_t k);
  bool stop() {
    stopped_ = true;
    return false;
  }

  // ---- calls of the operator, and cuts ----
  template <class Call>
  bool guarded(Call&& call);
  bool keep_state_aside();
  bool save_for_cut();
  void write_positions(StateWriter& w) const;
  std::uint64_t waited() const { return st_.counters.starved_ns.load() + st_.counters.blocked_ns.load(); }

  Impl& engine_;
  StageRuntime& st_;
  std::vector<Item> out_;
  CollectingEmitter emitter_;
  std::vector<CombineInput> state_;
  std::vector<std::string> names_;
  std::uint64_t iteration_ = 0;
  bool iteration_begun_ = false;
  Phase phase_ = Outputs;
  bool stopped_ = false;  // an input's wait ended the run
  StateSnapshot snapshot_;
  const bool saves_;
};

void Engine::Impl::run_combine(StageRuntime& st) { CombineStage(*this, st).run(); }

Engine::Impl::CombineStage::CombineStage(Impl& engine, StageRuntime& st)
    : engine_(engine), st_(st), emitter_(engine, st, out_), state_(st.inputs.size()), saves_(st.spec->op->info.traits.saves_state) {
  for (int producer : st.input_stages) names_.push_back(engine.stages[static_cast<std::size_t>(producer)]->spec->id);
}

void Engine::Impl::CombineStage::run() {
  if (engine_.end_if_ended_before(st_, out_)) return;
  if (st_.restore && !restore()) return;
  while (phase_ != Ending && wants_another_iteration())
    if (!run_iteration()) return;
  if (engine_.stopping.load()) return;
  read_inputs_to_their_ends();
}

bool Engine::Impl::CombineStage::restore() {
  try {
    auto positions = engine_.engine_state_reader(st_);
    iteration_ = positions->get<std::uint64_t>();
    iteration_begun_ = positions->get<std::uint8_t>() != 0;
    const auto saved_phase = positions->get<std::uint8_t>();
    if (saved_phase > Ending) throw DataError("the checkpoint names an unknown phase: it is damaged");
    phase_ = static_cast<Phase>(saved_phase);
    for (auto& in : state_) {
      in.iteration_ended = positions->get<std::uint8_t>() != 0;
      in.stream_ended = positions->get<std::uint8_t>() != 0;
      const auto count = positions->get<std::uint64_t>();
      for (std::uint64_t i = 0; i < count; ++i) in.waiting.push_back(get_item(*positions));
    }
  } catch (const std::exception& e) {
    engine_.fail(fmt::format("{} could not resume from the checkpoint: {}", engine_.stage_label(st_), e.what()), &st_);
    return false;
  }
  st_.output->set_iteration(iteration_);
  st_.counters.epoch.store(iteration_, std::memory_order_relaxed);
  return true;
}

bool Engine::Impl::CombineStage::wants_another_iteration() const {
  const bool all_ended = std::all_of(state_.begin(), state_.end(), [](const CombineInput& in) { return in.stream_ended; });
  return !all_ended && !engine_.stopping.load() && (st_.demand == kUnbounded || iteration_ < static_cast<std::uint64_t>(st_.demand));
}

// One output iteration; false when the run stops.
bool Engine::Impl::CombineStage::run_iteration() {
  emitter_.iteration = iteration_;
  if (phase_ == Outputs && !st_.output->skipped(iteration_) && !make_outputs()) return false;
  if (stopped_ || engine_.stopping.load()) return false;
  return drop_rest_of_iteration() && end_iteration();
}

// The operator's outputs of this iteration, one call each.
bool Engine::Impl::CombineStage::make_outputs() {
  const ElementContext context{&st_.info, st_.first_output_epoch + iteration_, 0};
  if (!iteration_begun_ && !guarded([&] { st_.combine->begin_iteration(context); })) return false;
  iteration_begun_ = true;
  // Busy time: the time in the operator less what it waited for inputs or for room downstream.
  const std::uint64_t t0 = now_ns(), waited0 = waited();
  for (;;) {
    // Between two outputs: a cut asked for is taken here; and the operator's state is kept
    // aside, for a cut that reaches it in the middle of the next one.
    if (!keep_state_aside()) return false;
    if (engine_.cut_requested(st_) && !save_for_cut()) return false;
    Sample sample;
    bool got = false;
    if (!guarded([&] { got = st_.combine->next(*this, sample); })) return false;
    if (stopped_ || engine_.stopping.load()) return false;
    if (!got || !emitter_.push(std::move(sample))) break;
  }
  const std::uint64_t spent = now_ns() - t0, idle = waited() - waited0;
  add(st_.counters.busy_ns, spent > idle ? spent - idle : 0);
  return true;
}

// What the operator left of an input's iteration is not wanted: upstream is told to stop making
// it, and what is already on its way is read and dropped up to the end of iteration.
bool Engine::Impl::CombineStage::drop_rest_of_iteration() {
  phase_ = Dropping;
  if (!keep_state_aside()) return false;
  for (std::size_t k = 0; k < state_.size(); ++k) {
    if (state_[k].iteration_ended) continue;
    engine_.skip_input(st_, static_cast<std::int64_t>(iteration_), static_cast<int>(k));
    Sample dropped;
    while (next(k, dropped)) {
    }
    if (stopped_) return false;
  }
  return true;
}

bool Engine::Impl::CombineStage::end_iteration() {
  out_.push_back(Item::end_of_iteration(iteration_));
  if (!engine_.flush(st_, out_)) return false;
  ++iteration_;
  iteration_begun_ = false;
  phase_ = Outputs;
  st_.counters.epoch.store(iteration_, std::memory_order_relaxed);
  for (auto& in : state_) in.iteration_ended = in.stream_ended;
  return true;
}

// Every input ends its stream after the iterations asked of it.
void Engine::Impl::CombineStage::read_inputs_to_their_ends() {
  phase_ = Ending;
  if (!keep_state_aside()) return;
  for (std::size_t k = 0; k < state_.size(); ++k) {
    while (!state_[k].stream_ended) {
      Sample dropped;
      state_[k].iteration_ended = false;
      while (next(k, dropped)) {
      }
      if (stopped_) return;
    }
  }
  out_.push_back(Item::end_of_stream());
  if (engine_.flush(st_, out_)) engine_.stage_ended(st_);
}

// Waiting for one input hands over what the stage made so far first, so that nothing is held
// back while it waits.
bool Engine::Impl::CombineStage::next(std::size_t k, Sample& sample) {
  CombineInput& in = state_.at(k);
  for (;;) {
    if (in.iteration_ended || stopped_) return false;
    if (in.waiting.empty()) {
      if (!out_.empty() && !engine_.flush(st_, out_)) return stop();
      if (!take(k)) return stop();
      continue;
    }
    Item item = std::move(in.waiting.front());
    in.waiting.pop_front();
    if (item.kind == Item::Kind::Barrier) {
      in.at_barrier = true;
      if (!save_for_cut()) return stop();  // in the middle of an output: cut where it began
      continue;
    }
    in.given.push_back(item);
    if (!item.is_element()) {
      in.iteration_ended = true;
      in.stream_ended = item.kind == Item::Kind::EndOfStream;
      return false;
    }
    sample = std::move(item.sample);
    return true;
  }
}

// Moves the next chunk of input k's channel to its waiting items; false if the run stops.
bool Engine::Impl::CombineStage::take(std::size_t k) {
  std::vector<Item> items;
  const std::uint64_t t0 = now_ns();
  if (!st_.inputs[k]->pop(items, kChunk)) return false;
  add(st_.counters.starved_ns, now_ns() - t0);
  if (items.front().is_element()) {
    add(st_.counters.elements_in, items.size());
    add(st_.counters.bytes_in, bytes_of(items));
  }
  for (auto& item : items) state_[k].waiting.push_back(std::move(item));
  return true;
}

template <class Call>
bool Engine::Impl::CombineStage::guarded(Call&& call) {
  try {
    call();
    return true;
  } catch (const std::bad_alloc&) {
    engine_.fail(engine_.out_of_memory_message(st_), &st_);
  } catch (const std::exception& e) {
    engine_.fail(fmt::format("{} failed in epoch {}: {}", engine_.stage_label(st_), st_.first_output_epoch + iteration_, e.what()), &st_);
  }
  return false;
}

// Between two calls of the operator: its state now, for a cut.
bool Engine::Impl::CombineStage::keep_state_aside() {
  for (auto& in : state_) {
    in.given.clear();
    in.ended_at_output_start = in.iteration_ended;
    in.stream_ended_at_output_start = in.stream_ended;
  }
  snapshot_.clear();
  return !saves_ || guarded([&] { st_.combine->save_state(snapshot_); });
}

// The cut: every input taken up to its barrier (what comes before is this stage's to keep), the
// operator's state as the current output began, the elements it was given since put back.
bool Engine::Impl::CombineStage::save_for_cut() {
  // Every input up to its barrier (or its end): a barrier found is dropped, as the cut is this.
  for (std::size_t k = 0; k < state_.size(); ++k) {
    CombineInput& in = state_[k];
    for (;;) {
      auto barrier = std::find_if(in.waiting.begin(), in.waiting.end(), [](const Item& i) { return i.kind == Item::Kind::Barrier; });
      if (barrier != in.waiting.end()) {
        in.waiting.erase(barrier);
        break;
      }
      if (in.at_barrier || in.stream_ended ||
          std::any_of(in.waiting.begin(), in.waiting.end(), [](const Item& i) { return i.kind == Item::Kind::EndOfStream; }))
        break;
      if (!take(k)) return false;
    }
    in.at_barrier = false;
  }
  if (!engine_.flush(st_, out_)) return false;
  const std::string where = fmt::format("epoch {}{}", st_.first_output_epoch + iteration_,
                                        phase_ == Outputs    ? ""
                                        : phase_ == Dropping ? ", dropping what is left of its inputs"
                                                             : ", reading its inputs to their ends");
  const std::function<void(StateWriter&)> operator_state = [&](StateWriter& w) { snapshot_.replay(w); };
  if (!engine_.save_stage(st_, [this](StateWriter& w) { write_positions(w); }, where, 0, saves_ ? &operator_state : nullptr))
    return false;
  out_.push_back(Item::barrier());
  // What it holds of its inputs makes outputs after the cut (a cut the run stops at holds it here).
  return engine_.flush(st_, out_) && engine_.wait_for_release(st_);
}

void Engine::Impl::CombineStage::write_positions(StateWriter& w) const {
  w.put(iteration_);
  w.put<std::uint8_t>(iteration_begun_);
  w.put<std::uint8_t>(phase_);
  for (const auto& in : state_) {
    w.put<std::uint8_t>(in.ended_at_output_start);
    w.put<std::uint8_t>(in.stream_ended_at_output_start);
    w.put<std::uint64_t>(in.given.size() + in.waiting.size());
    for (const auto& item : in.given) put_item(w, item);
    for (const auto& item : in.waiting) put_item(w, item);
  }
}

}  // namespace sluice
