#include "sluice/core/bench.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "sluice/core/engine.hpp"
#include "sluice/error.hpp"

namespace sluice {

namespace {

const metrics::StageMetrics* counted_stage(const metrics::MetricsSnapshot& s) {
  const metrics::StageMetrics* batch = nullptr;
  const metrics::StageMetrics* sink = nullptr;
  for (const auto& m : s.stage()) {
    if (m.role() == role_name(OperatorRole::Batches) && !batch) batch = &m;
    if (m.kind() == "sink") sink = &m;
  }
  return batch ? batch : sink ? sink : (s.stage_size() ? &s.stage(s.stage_size() - 1) : nullptr);
}

// Waits up to `seconds` for the run to end; true if it ended.
bool run_for(Engine& engine, double seconds) {
  return engine.wait_for(std::chrono::milliseconds(static_cast<long long>(seconds * 1000)));
}

// Removes every stage of `op`, connecting its consumers to its input.
int remove_stages(spec::PipelineSpec& spec, const Registry& registry, OperatorRole role) {
  int removed = 0;
  for (int i = spec.stage_size() - 1; i >= 0; --i) {
    const auto& st = spec.stage(i);
    if (!registry.has_role(st.op(), role) || st.input_size() != 1) continue;
    const std::string id = st.id(), input = st.input(0);
    for (auto& other : *spec.mutable_stage())
      for (auto& in : *other.mutable_input())
        if (in == id) in = input;
    spec.mutable_stage()->DeleteSubrange(i, 1);
    ++removed;
  }
  return removed;
}

// Several workers, set or left to the autotuner (parallelism -1, tf.data's AUTOTUNE).
bool runs_in_parallel(const spec::Stage& st) { return st.parallelism() > 1 || st.parallelism() == -1; }

}  // namespace

BenchResult run_bench(Graph graph, const BenchOptions& options) {
  Engine engine(std::move(graph));
  engine.start();
  BenchResult r;
  if (!run_for(engine, options.warmup_s)) {
    r.first = engine.snapshot();
    r.finished_early = run_for(engine, options.measure_s);
  } else {
    r.finished_early = true;
  }
  engine.stop();
  auto result = engine.wait();
  if (result.state == RunState::Failed) throw Error(result.error);
  r.last = engine.snapshot();
  if (r.finished_early) r.first = metrics::MetricsSnapshot();  // measure the whole run
  r.seconds = r.last.elapsed_s() - r.first.elapsed_s();
  auto out_of = [](const metrics::MetricsSnapshot& s, const std::string& id, bool in) -> double {
    for (const auto& m : s.stage())
      if (m.id() == id) return static_cast<double>(in ? m.elements_in() : m.elements_out());
    return 0;
  };
  if (r.seconds <= 0) return r;
  for (const auto& m : r.last.stage())
    r.stage_rates.emplace_back(m.id(), (out_of(r.last, m.id(), false) - out_of(r.first, m.id(), false)) / r.seconds);
  if (const auto* c = counted_stage(r.last)) {
    r.counted_stage = c->id();
    r.elements_per_s = (out_of(r.last, c->id(), true) - out_of(r.first, c->id(), true)) / r.seconds;
  }
  return r;
}

std::vector<AblationRow> run_ablation(const PipelineDocument& doc, const Registry& registry, const BenchOptions& options) {
  struct Variant {
    std::string name, feature;
    std::function<std::string(spec::PipelineSpec&)> apply;  // what it changed; empty: nothing to change
  };
  const std::vector<Variant> variants = {
      {"as written", "", [](spec::PipelineSpec&) { return std::string("-"); }},
      {"parallelism 1", "parallelism",
       [](spec::PipelineSpec& s) {
         std::vector<std::string> changed;
         for (auto& st : *s.mutable_stage())
           if (runs_in_parallel(st)) {
             changed.push_back(fmt::format("{} ({})", st.id(), st.parallelism() == -1 ? "AUTOTUNE" : std::to_string(st.parallelism())));
             st.set_parallelism(1);
           }
         return changed.empty() ? std::string() : "parallelism 1 on " + fmt::format("{}", fmt::join(changed, ", "));
       }},
      {"no interleave", "interleave",
       [](spec::PipelineSpec& s) {
         std::vector<std::string> changed;
         for (auto& st : *s.mutable_stage())
           if (st.has_interleave() && (st.interleave().cycle_length() > 1 || runs_in_parallel(st))) {
             changed.push_back(st.id());
             st.clear_interleave();
             st.set_parallelism(1);
           }
         return changed.empty() ? std::string() : "one input at a time in " + fmt::format("{}", fmt::join(changed, ", "));
       }},
      {"no cache", "caching",
       [&](spec::PipelineSpec& s) {
         int n = remove_stages(s, registry, OperatorRole::Caches);
         return n ? fmt::format("{} cache stage{} removed", n, n == 1 ? "" : "s") : std::string();
       }},
      {"no prefetch", "prefetching",
       [&](spec::PipelineSpec& s) {
         int n = remove_stages(s, registry, OperatorRole::Prefetches);
         return n ? fmt::format("{} prefetch stage{} removed", n, n == 1 ? "" : "s") : std::string();
       }},
  };
  std::vector<AblationRow> rows;
  for (const auto& v : variants) {
    AblationRow row;
    row.variant = v.name;
    row.feature = v.feature;
    PipelineDocument variant = doc;
    row.change = v.apply(variant.spec);
    if (row.change.empty()) {
      row.change = "the pipeline does not use " + v.feature;
      rows.push_back(row);
      continue;
    }
    row.applicable = true;
    auto result = run_bench(build_graph(variant, registry), options);
    row.elements_per_s = result.elements_per_s;
    rows.push_back(row);
  }
  const double base = rows.front().elements_per_s;
  for (auto& row : rows)
    if (row.applicable && row.elements_per_s > 0) row.speedup = base / row.elements_per_s;
  return rows;
}

std::string format_bench(const BenchResult& r) {
  std::string out = r.finished_early
                        ? fmt::format("The pipeline finished after {:.2f} s, before the measuring window ended: rates are over the whole run.\n",
                                      r.seconds)
                        : fmt::format("Steady state over {:.2f} s, after the warm-up:\n", r.seconds);
  out += fmt::format("{:<16} {:>14}\n", "stage", "elements/s");
  for (const auto& [id, rate] : r.stage_rates) out += fmt::format("{:<16} {:>14.1f}\n", id, rate);
  if (!r.counted_stage.empty())
    out += fmt::format("Pipeline: {:.1f} elements/s (into stage '{}')\n", r.elements_per_s, r.counted_stage);
  if (!r.last.bottleneck().empty()) out += fmt::format("Bottleneck: stage '{}': {}\n", r.last.bottleneck(), r.last.bottleneck_reason());
  return out;
}

std::string format_ablation(const std::vector<AblationRow>& rows) {
  std::string out = fmt::format("{:<16} {:>14} {:>10}  {}\n", "variant", "elements/s", "speed-up", "what changed");
  for (const auto& row : rows) {
    if (!row.applicable) {
      out += fmt::format("{:<16} {:>14} {:>10}  {}\n", row.variant, "-", "-", row.change);
      continue;
    }
    std::string speedup = row.feature.empty() ? "" : fmt::format("{:.2f}x", row.speedup);
    out += fmt::format("{:<16} {:>14.1f} {:>10}  {}\n", row.variant, row.elements_per_s, speedup, row.change);
  }
  out += "speed-up: elements/s as written divided by elements/s without the feature, i.e. what the feature brings.\n";
  return out;
}

}  // namespace sluice
