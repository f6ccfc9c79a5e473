// Combine stages (zip, concatenate, sample_from_datasets, ...): one worker; the operator pulls from
// its inputs in its own order, and each output iteration reads one iteration of every input.
#include "engine_impl.hpp"

namespace sluice {

void Engine::Impl::run_combine(StageRuntime& st) {
  std::vector<Item> out;
  CollectingEmitter emitter(*this, st, out);
  struct InputState {
    std::vector<Item> items;
    std::size_t position = 0;
    bool iteration_ended = false, stream_ended = false;
  };
  std::vector<InputState> state(st.inputs.size());
  std::vector<std::string> names;
  for (int producer : st.input_stages) names.push_back(stages[static_cast<std::size_t>(producer)]->spec->id);

  // The operator's view of the inputs. Waiting for one input hands over what the stage made so
  // far first, so that nothing is held back while it waits.
  class Inputs final : public CombineInputs {
   public:
    Inputs(Impl& impl, StageRuntime& st, std::vector<InputState>& state, const std::vector<std::string>& names,
           std::vector<Item>& out)
        : impl_(impl), st_(st), state_(state), names_(names), out_(out) {}
    std::size_t size() const override { return state_.size(); }
    const std::string& name(std::size_t k) const override { return names_.at(k); }
    bool next(std::size_t k, Sample& sample) override {
      InputState& in = state_.at(k);
      while (in.position == in.items.size()) {
        if (in.iteration_ended || stopped) return false;
        if (!out_.empty() && !impl_.flush(st_, out_)) return stop();
        const std::uint64_t t0 = now_ns();
        if (!st_.inputs[k]->pop(in.items, kChunk)) return stop();
        add(st_.counters.starved_ns, now_ns() - t0);
        in.position = 0;
        if (!in.items.front().is_element()) {
          in.iteration_ended = true;
          in.stream_ended = in.items.front().kind == Item::Kind::EndOfStream;
          in.items.clear();
          return false;
        }
        add(st_.counters.elements_in, in.items.size());
        add(st_.counters.bytes_in, bytes_of(in.items));
      }
      sample = std::move(in.items[in.position++].sample);
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
  } inputs(*this, st, state, names, out);

  // Busy time: the time in the operator less what it waited for inputs or for room downstream.
  auto waited = [&] { return st.counters.starved_ns.load() + st.counters.blocked_ns.load(); };
  std::uint64_t iteration = 0;
  for (;;) {
    bool all_ended = true;
    for (const auto& in : state) all_ended &= in.stream_ended;
    if (all_ended || stopping.load() || (st.demand != kUnbounded && iteration >= static_cast<std::uint64_t>(st.demand))) break;
    emitter.iteration = iteration;
    const std::uint64_t epoch = st.first_output_epoch + iteration;
    if (!st.output->skipped(iteration)) {
      const std::uint64_t t0 = now_ns(), waited0 = waited();
      try {
        st.combine->combine(inputs, ElementContext{&st.info, epoch, 0}, emitter);
      } catch (const std::bad_alloc&) {
        fail(out_of_memory_message(st), &st);
        return;
      } catch (const std::exception& e) {
        fail(fmt::format("{} failed in epoch {}: {}", stage_label(st), epoch, e.what()), &st);
        return;
      }
      const std::uint64_t spent = now_ns() - t0, idle = waited() - waited0;
      add(st.counters.busy_ns, spent > idle ? spent - idle : 0);
    }
    if (inputs.stopped || stopping.load()) return;
    // What the operator left of an input's iteration is not wanted: upstream is told to stop
    // making it, and what is already on its way is read and dropped up to the end of iteration.
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
    st.counters.epoch.store(iteration, std::memory_order_relaxed);
    for (auto& in : state) in.iteration_ended = in.stream_ended;
  }
  if (stopping.load()) return;
  // Every input ends its stream after the iterations asked of it.
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
  flush(st, out);
}

}  // namespace sluice
