// Combine stages (zip, concatenate, sample_from_datasets, ...): one worker; the operator pulls from
// its inputs in its own order, output by output, and each output iteration reads one iteration of
// every input.
#include "engine_impl.hpp"

namespace sluice {

namespace {

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

}  // namespace

void Engine::Impl::run_combine(StageRuntime& st) {
  std::vector<Item> out;
  CollectingEmitter emitter(*this, st, out);
  struct InputState {
    std::deque<Item> waiting;      // taken from the channel, not yet given to the operator
    std::vector<Item> given;       // taken by the operator during the current output (ends too)
    bool iteration_ended = false, stream_ended = false;
    bool ended_at_output_start = false, stream_ended_at_output_start = false;
    bool at_barrier = false;       // its barrier for the cut being taken has been taken
  };
  std::vector<InputState> state(st.inputs.size());
  std::vector<std::string> names;
  for (int producer : st.input_stages) names.push_back(stages[static_cast<std::size_t>(producer)]->spec->id);
  std::uint64_t iteration = 0;
  bool iteration_begun = false;
  // Where the stage is: the operator making the iteration's outputs, then dropping what it left
  // of its inputs' iterations, then (after the last iteration) reading its inputs to their ends.
  enum Phase : std::uint8_t { Outputs = 0, Dropping = 1, Ending = 2 };
  Phase phase = Outputs;
  StateSnapshot snapshot;
  const bool saves = st.spec->op->info.traits.saves_state;

  // The cut: every input taken up to its barrier (what comes before is this stage's to keep), the
  // operator's state as the current output began, the elements it was given since put back.
  std::function<bool()> save_for_cut;

  // The operator's view of the inputs. Waiting for one input hands over what the stage made so
  // far first, so that nothing is held back while it waits.
  class Inputs final : public CombineInputs {
   public:
    Inputs(Impl& impl, StageRuntime& st, std::vector<InputState>& state, const std::vector<std::string>& names,
           std::vector<Item>& out, std::function<bool()>& save_for_cut)
        : impl_(impl), st_(st), state_(state), names_(names), out_(out), save_for_cut_(save_for_cut) {}
    std::size_t size() const override { return state_.size(); }
    const std::string& name(std::size_t k) const override { return names_.at(k); }
    bool next(std::size_t k, Sample& sample) override {
      InputState& in = state_.at(k);
      for (;;) {
        if (in.iteration_ended || stopped) return false;
        if (in.waiting.empty()) {
          if (!out_.empty() && !impl_.flush(st_, out_)) return stop();
          if (!take(k)) return stop();
          continue;
        }
        Item item = std::move(in.waiting.front());
        in.waiting.pop_front();
        if (item.kind == Item::Kind::Barrier) {
          in.at_barrier = true;
          if (!save_for_cut_()) return stop();  // in the middle of an output: cut where it began
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
    bool take(std::size_t k) {
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
    bool stopped = false;

   private:
    bool stop() {
      stopped = true;
      return false;
    }
    Impl& impl_;
    StageRuntime& st_;
    std::vector<InputState>& state_;
    const std::vector<std::string>& names_;
    std::vector<Item>& out_;
    std::function<bool()>& save_for_cut_;
  } inputs(*this, st, state, names, out, save_for_cut);

  save_for_cut = [&]() -> bool {
    // Every input up to its barrier (or its end): a barrier found is dropped, as the cut is this.
    for (std::size_t k = 0; k < state.size(); ++k) {
      InputState& in = state[k];
      for (;;) {
        auto barrier = std::find_if(in.waiting.begin(), in.waiting.end(), [](const Item& i) { return i.kind == Item::Kind::Barrier; });
        if (barrier != in.waiting.end()) {
          in.waiting.erase(barrier);
          break;
        }
        if (in.at_barrier || in.stream_ended ||
            std::any_of(in.waiting.begin(), in.waiting.end(), [](const Item& i) { return i.kind == Item::Kind::EndOfStream; }))
          break;
        if (!inputs.take(k)) return false;
      }
      in.at_barrier = false;
    }
    if (!flush(st, out)) return false;
    const auto positions = [&](StateWriter& w) {
      w.put(iteration);
      w.put<std::uint8_t>(iteration_begun);
      w.put<std::uint8_t>(phase);
      for (const auto& in : state) {
        w.put<std::uint8_t>(in.ended_at_output_start);
        w.put<std::uint8_t>(in.stream_ended_at_output_start);
        w.put<std::uint64_t>(in.given.size() + in.waiting.size());
        for (const auto& item : in.given) put_item(w, item);
        for (const auto& item : in.waiting) put_item(w, item);
      }
    };
    const std::string where = fmt::format("epoch {}{}", st.first_output_epoch + iteration,
                                          phase == Outputs ? "" : phase == Dropping ? ", dropping what is left of its inputs" : ", reading its inputs to their ends");
    const std::function<void(StateWriter&)> operator_state = [&](StateWriter& w) { snapshot.replay(w); };
    if (!save_stage(st, positions, where, 0, saves ? &operator_state : nullptr)) return false;
    out.push_back(Item::barrier());
    // What it holds of its inputs would make outputs after the cut: it waits until the run goes on.
    return flush(st, out) && wait_for_release(st);
  };

  if (end_if_ended_before(st, out)) return;
  if (st.restore) {
    try {
      auto positions = engine_state_reader(st);
      iteration = positions->get<std::uint64_t>();
      iteration_begun = positions->get<std::uint8_t>() != 0;
      const auto saved_phase = positions->get<std::uint8_t>();
      if (saved_phase > Ending) throw DataError("the checkpoint names an unknown phase: it is damaged");
      phase = static_cast<Phase>(saved_phase);
      for (auto& in : state) {
        in.iteration_ended = positions->get<std::uint8_t>() != 0;
        in.stream_ended = positions->get<std::uint8_t>() != 0;
        const auto count = positions->get<std::uint64_t>();
        for (std::uint64_t i = 0; i < count; ++i) in.waiting.push_back(get_item(*positions));
      }
    } catch (const std::exception& e) {
      fail(fmt::format("{} could not resume from the checkpoint: {}", stage_label(st), e.what()), &st);
      return;
    }
    st.output->set_iteration(iteration);
    st.counters.epoch.store(iteration, std::memory_order_relaxed);
  }

  // Busy time: the time in the operator less what it waited for inputs or for room downstream.
  auto waited = [&] { return st.counters.starved_ns.load() + st.counters.blocked_ns.load(); };
  auto guarded = [&](auto&& call) {
    try {
      call();
      return true;
    } catch (const std::bad_alloc&) {
      fail(out_of_memory_message(st), &st);
    } catch (const std::exception& e) {
      fail(fmt::format("{} failed in epoch {}: {}", stage_label(st), st.first_output_epoch + iteration, e.what()), &st);
    }
    return false;
  };
  auto guarded_save = [&](StateWriter& w) { return guarded([&] { st.combine->save_state(w); }); };
  // Between two calls of the operator (dropping or ending): its state now, for a cut.
  auto keep_state_aside = [&] {
    for (auto& in : state) {
      in.given.clear();
      in.ended_at_output_start = in.iteration_ended;
      in.stream_ended_at_output_start = in.stream_ended;
    }
    snapshot.clear();
    return !saves || guarded_save(snapshot);
  };
  for (; phase != Ending;) {
    bool all_ended = true;
    for (const auto& in : state) all_ended &= in.stream_ended;
    if (all_ended || stopping.load() || (st.demand != kUnbounded && iteration >= static_cast<std::uint64_t>(st.demand))) break;
    emitter.iteration = iteration;
    const ElementContext context{&st.info, st.first_output_epoch + iteration, 0};
    if (phase == Outputs && !st.output->skipped(iteration)) {
      if (!iteration_begun && !guarded([&] { st.combine->begin_iteration(context); })) return;
      iteration_begun = true;
      const std::uint64_t t0 = now_ns(), waited0 = waited();
      for (;;) {
        // Between two outputs: a cut asked for is taken here; and the operator's state is kept
        // aside, for a cut that reaches it in the middle of the next one.
        for (auto& in : state) {
          in.given.clear();
          in.ended_at_output_start = in.iteration_ended;
          in.stream_ended_at_output_start = in.stream_ended;
        }
        snapshot.clear();
        if (saves && !guarded_save(snapshot)) return;
        if (cut_requested(st) && !save_for_cut()) return;
        Sample sample;
        bool got = false;
        if (!guarded([&] { got = st.combine->next(inputs, sample); })) return;
        if (inputs.stopped || stopping.load()) return;
        if (!got || !emitter.push(std::move(sample))) break;
      }
      const std::uint64_t spent = now_ns() - t0, idle = waited() - waited0;
      add(st.counters.busy_ns, spent > idle ? spent - idle : 0);
    }
    if (inputs.stopped || stopping.load()) return;
    // What the operator left of an input's iteration is not wanted: upstream is told to stop
    // making it, and what is already on its way is read and dropped up to the end of iteration.
    phase = Dropping;
    if (!keep_state_aside()) return;
    for (std::size_t k = 0; k < state.size(); ++k) {
      if (state[k].iteration_ended) continue;
      skip_input(st, static_cast<std::int64_t>(iteration), static_cast<int>(k));
      Sample dropped;
      while (inputs.next(k, dropped)) {
      }
      if (inputs.stopped) return;
    }
    out.push_back(Item::end_of_iteration(iteration));
    if (!flush(st, out)) return;
    ++iteration;
    iteration_begun = false;
    phase = Outputs;
    st.counters.epoch.store(iteration, std::memory_order_relaxed);
    for (auto& in : state) in.iteration_ended = in.stream_ended;
  }
  if (stopping.load()) return;
  // Every input ends its stream after the iterations asked of it.
  phase = Ending;
  if (!keep_state_aside()) return;
  for (std::size_t k = 0; k < state.size(); ++k) {
    while (!state[k].stream_ended) {
      Sample dropped;
      state[k].iteration_ended = false;
      while (inputs.next(k, dropped)) {
      }
      if (inputs.stopped) return;
    }
  }
  out.push_back(Item::end_of_stream());
  if (flush(st, out)) stage_ended(st);
}

}  // namespace sluice
