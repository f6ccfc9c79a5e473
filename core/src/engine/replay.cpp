// Replay (EngineOptions::replay): one output of a run made again directly, in a time that does not
// grow with its step: the source begins the pass at the step's first element (StartsAnywhere),
// and each element goes through the maps with the contexts the run gave it, so every random draw
// is the run's. Only a chain of maps and one batch after such a source can: a stage that holds,
// drops or reorders elements (a shuffle buffer, a filter, an interleave) makes each output depend
// on all before it; those are replayed by running the epoch to the step (spec.hpp's
// select_step()).
#include <fmt/format.h>

#include "engine_impl.hpp"
#include "sluice/core/lineage.hpp"

namespace sluice {
namespace {

struct Collecting final : Emitter {
  std::vector<Sample> outputs;
  bool push(Sample sample) override {
    outputs.push_back(std::move(sample));
    return true;
  }
};

// Whether a stage passes its inputs on unchanged (prefetch), which replay may step over.
bool only_buffers(const StageRuntime& st) { return st.aggregate && st.spec->op->info.traits.role == OperatorRole::Prefetches; }

// Each element through `maps` in order, elements shared among threads.
template <class Context>
void map_in_parallel(const std::vector<StageRuntime*>& maps, std::vector<Sample>& elements, Context&& context) {
  int threads = 1;
  for (const StageRuntime* map : maps) threads = std::max(threads, map->workers);
  threads = std::min<int>(threads, static_cast<int>(elements.size()));
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < elements.size();) {
      try {
        for (StageRuntime* map : maps) {
          const ElementContext ctx = context(*map, i);
          elements[i] = map->map->map(std::move(elements[i]), ctx);
          if (map->draws_keys) detail::stamp_draw_key(elements[i], map->spec->id, ctx.epoch, ctx.index);
        }
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next.store(elements.size());
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

std::string Engine::Impl::replay_chain(ReplayChain& chain) const {
  int sinks = 0;
  const StageRuntime* sink = nullptr;
  for (const auto& st : stages)
    if (st->sink) {
      ++sinks;
      sink = st.get();
    }
  if (sinks != 1 || !sink) return fmt::format("the pipeline ends in {} sinks; replay makes the output of one", sinks);
  chain = ReplayChain{};
  chain.sink = const_cast<StageRuntime*>(sink);
  bool after_batch = true;  // walking up from the sink: maps are after the batch until it is met
  for (const StageRuntime* st = sink; !st->source;) {
    if (st->spec->inputs.size() != 1) return fmt::format("stage '{}' ({}) combines several inputs", st->spec->id, st->spec->op->info.name);
    st = stages[static_cast<std::size_t>(st->spec->inputs[0])].get();
    const std::string named = fmt::format("stage '{}' ({})", st->spec->id, st->spec->op->info.name);
    if (st->spec->per_input) return named + " runs per input of an interleave";
    if (st->source) {
      chain.source = const_cast<StageRuntime*>(st);
    } else if (st->map) {
      (after_batch ? chain.maps_after : chain.maps_before).insert((after_batch ? chain.maps_after : chain.maps_before).begin(),
                                                                   const_cast<StageRuntime*>(st));
    } else if (only_buffers(*st)) {
      continue;
    } else if (st->aggregate && dynamic_cast<StacksItsInputs*>(st->op.get()) && after_batch) {
      chain.batch = const_cast<StageRuntime*>(st);
      after_batch = false;
    } else {
      return named + (st->filter ? " drops elements" : st->expand ? " reads its inputs' elements in turn"
                                                     : " holds, repeats or reorders elements") +
             ": each output depends on all before it";
    }
  }
  if (!dynamic_cast<StartsAnywhere*>(chain.source->op.get()))
    return fmt::format("its source '{}' ({}) reads in order: an element's place is known only by reading what comes before it",
                       chain.source->spec->id, chain.source->spec->op->info.name);
  return {};
}

void Engine::Impl::replay_step() {
  ReplayChain& chain = replaying;
  const ReplayAt at = *replay_at;
  if (at.epoch < options.first_epoch) throw Error(fmt::format("epoch {} is before this run's first, {}", at.epoch, options.first_epoch));
  const std::uint64_t rows = chain.batch ? dynamic_cast<StacksItsInputs*>(chain.batch->op.get())->inputs_per_output() : 1;
  const std::uint64_t first = at.step * rows;
  dynamic_cast<StartsAnywhere*>(chain.source->op.get())->begin_pass_at(at.epoch, first);
  // What the maps build goes back to replay, not into a batch's rows (Placement).
  for (StageRuntime* map : chain.maps_before) map->info.placement = nullptr;
  auto context = [&](StageRuntime& st, std::uint64_t index) { return ElementContext{&st.info, at.epoch, index}; };
  // The step's elements, read in order, then through the maps on as many threads as the widest
  // of them runs (each element is independent of the others: any thread, the same result).
  std::vector<Sample> elements;
  for (std::uint64_t i = 0; i < rows; ++i) {
    Sample element;
    if (!chain.source->source->next(element, context(*chain.source, first + i))) break;
    if (options.lineage) detail::stamp_read_epoch(element, at.epoch);
    elements.push_back(std::move(element));
  }
  map_in_parallel(chain.maps_before, elements, [&](StageRuntime& map, std::size_t i) { return context(map, first + i); });
  Collecting made;
  std::vector<Origin> stacked;
  if (chain.batch) chain.batch->aggregate->begin_iteration(at.epoch);
  for (std::size_t i = 0; i < elements.size() && made.outputs.empty(); ++i) {
    if (!chain.batch) {
      made.outputs.push_back(std::move(elements[i]));
      break;
    }
    stacked.push_back(elements[i].shared_origin());
    chain.batch->aggregate->push(std::move(elements[i]), context(*chain.batch, first + i), made);
  }
  if (chain.batch && made.outputs.empty()) chain.batch->aggregate->end_iteration(at.epoch, made);  // the epoch's last, short batch
  if (made.outputs.empty())
    throw Error(fmt::format("epoch {} has no step {}: its outputs end before (a step counts from 0 in its epoch)", at.epoch, at.step));
  Sample output = std::move(made.outputs.front());
  if (chain.batch) {  // its rows, as the run's batch named them
    const Origin head = output.shared_origin();
    const Origin named = origin_of_rows(head, stacked);
    output.set_origin(named.where, named.record, named.byte_offset);
  }
  for (StageRuntime* map : chain.maps_after) output = map->map->map(std::move(output), context(*map, at.step));
  chain.sink->sink->consume(std::move(output), context(*chain.sink, at.step));
  add(chain.sink->counters.elements_in, 1);
}

void Engine::Impl::launch_replay() {
  start_ns = now_ns();
  state.store(static_cast<int>(RunState::Running));
  {
    std::lock_guard lock(done_mutex);
    live_workers = 1;
  }
  threads.emplace_back([this] {
    try {
      replay_step();
      sinks_done.store(sink_count);
    } catch (const std::exception& e) {
      fail(fmt::format("replaying step {} of epoch {}: {}", replay_at->step, replay_at->epoch, e.what()));
    }
    std::lock_guard lock(done_mutex);
    live_workers = 0;
    end_ns.store(now_ns());
    done_cv.notify_all();
  });
}

}  // namespace sluice
