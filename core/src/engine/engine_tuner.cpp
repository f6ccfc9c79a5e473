// The autotuner's thread: budgets, a reading of every stage each window, the planner's changes
// applied (autotune.cpp decides them).
#include "engine_impl.hpp"

#include <cmath>

#include "sluice/core/resources.hpp"

namespace sluice {

void Engine::Impl::set_autotune_budgets() {
  autotune = true;
  if (graph.cpu_budget > 0) {
    cpu_budget = graph.cpu_budget;
    cpu_budget_source = "options.autotune.cpu_budget";
  } else {
    const UsableCores cores = usable_cores();
    cpu_budget = cores.cores;
    cpu_budget_source = cores.why;
  }
  if (graph.ram_budget > 0) {
    ram_budget = graph.ram_budget;
    ram_budget_source = "options.autotune.ram_budget";
  } else {
    const UsableMemory memory = usable_memory();
    ram_budget = memory.bytes / 2;
    ram_budget_source = "half of " + memory.why;
  }
  // The buffers hold at most half of it together; the rest is for the elements in the workers'
  // hands, the operators' own state (shuffle buffers, batches being filled) and the pools.
  buffer_budget = ram_budget / 2;
  cores_total = std::max(1, static_cast<int>(std::floor(cpu_budget)));
  const int most = std::clamp(static_cast<int>(std::ceil(cpu_budget)), 1, 1024);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto& st = *stages[i];
    if (!graph.stages[i].autotune_workers || st.source || st.aggregate) continue;
    st.tuned_workers = true;
    st.workers = st.expand ? std::min(most, std::max(1, graph.stages[i].cycle_length)) : most;
    st.active_workers.store(1);
  }
}

void Engine::Impl::run_tuner() {
  name_this_thread("autotune");
  detail::Autotuner planner({cpu_budget, buffer_budget});
  std::vector<StageRuntime*> runners;
  for (auto& st : stages)
    if (!st->fused_head) runners.push_back(st.get());
  struct Reading {
    std::uint64_t busy_ns = 0, elements_out = 0, bytes_out = 0;
    Channel::Extremes extremes;
  };
  auto read = [&](StageRuntime& runner) {
    Reading r;
    r.busy_ns = runner.counters.busy_ns.load();
    for (auto* member : runner.fused) r.busy_ns += member->counters.busy_ns.load();
    StageRuntime& exit = runner.exit();
    r.elements_out = exit.counters.elements_out.load();
    r.bytes_out = exit.counters.bytes_out.load();
    if (exit.output) r.extremes = exit.output->extremes();
    return r;
  };
  std::vector<Reading> previous;
  for (auto* runner : runners) previous.push_back(read(*runner));
  std::vector<std::uint64_t> element_bytes(runners.size(), 0);
  // What reaches the pipeline's end, for checking that a change helped.
  StageRuntime& last = *stages.back();
  std::uint64_t previous_reached = last.counters.elements_in.load();
  std::uint64_t previous_ns = now_ns();
  std::unique_lock lock(publish_mutex);
  while (!publisher_quit) {
    publish_cv.wait_for(lock, kTuneWindow, [&] { return publisher_quit; });
    if (publisher_quit || stopping.load()) break;
    lock.unlock();
    const std::uint64_t now = now_ns();
    const double window_ns = static_cast<double>(now - previous_ns);
    std::vector<detail::TunedStage> view;
    for (std::size_t i = 0; i < runners.size(); ++i) {
      StageRuntime& runner = *runners[i];
      StageRuntime& exit = runner.exit();
      const Reading r = read(runner);
      const Reading& before = previous[i];
      detail::TunedStage t;
      t.id = runner.spec->id;
      t.tunes_workers = runner.tuned_workers;
      t.workers = runner.running_workers();
      t.max_workers = runner.workers;
      t.busy_cores = static_cast<double>(r.busy_ns - before.busy_ns) / window_ns;
      if (exit.output) {
        t.has_buffer = true;
        t.tunes_buffer = exit.tuned_buffer;
        t.capacity = exit.output->capacity();
        t.byte_limit = exit.output->byte_limit();
        t.empty_fraction = static_cast<double>(r.extremes.empty_ns - before.extremes.empty_ns) / window_ns;
        t.full_fraction = static_cast<double>(r.extremes.full_ns - before.extremes.full_ns) / window_ns;
        t.swings = r.extremes.swings - before.extremes.swings;
        if (r.elements_out > before.elements_out)
          element_bytes[i] = (r.bytes_out - before.bytes_out) / (r.elements_out - before.elements_out);
        t.mean_element_bytes = element_bytes[i];
      }
      previous[i] = r;
      view.push_back(std::move(t));
    }
    const std::uint64_t reached = last.counters.elements_in.load();
    const double output_rate = static_cast<double>(reached - previous_reached) / (window_ns / 1e9);
    previous_reached = reached;
    previous_ns = now;
    for (const auto& change : planner.plan(view, output_rate)) apply_tune_change(*runners[static_cast<std::size_t>(change.stage)], change, now);
    set_cores_for_tuned(planner.cores_for_tuned());
    lock.lock();
  }
}

void Engine::Impl::apply_tune_change(StageRuntime& runner, const detail::TuneChange& change, std::uint64_t now) {
  if (change.buffer) runner.exit().output->resize(static_cast<std::size_t>(change.to), change.byte_limit);
  else runner.set_active_workers(static_cast<int>(change.to), now, start_ns);
  metrics::AutotuneChange record;
  record.set_at_s(static_cast<double>(now - start_ns) / 1e9);
  record.set_stage(change.buffer ? runner.exit().spec->id : runner.spec->id);
  record.set_what(change.buffer ? "buffer" : "workers");
  record.set_from(change.from);
  record.set_to(change.to);
  record.set_byte_limit(change.byte_limit);
  record.set_reason(change.reason);
  std::lock_guard lock(tune_mutex);
  if (tune_changes.size() < kKeptTuneChanges) tune_changes.push_back(std::move(record));
  else ++tune_changes_left_out;
}

}  // namespace sluice
