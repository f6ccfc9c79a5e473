// AUTOTUNE against hand-tuning, in one run on the same machine: three pipelines of different
// shapes, each run with every worker count of a grid (the baselines) and with parallelism -1 and
// buffer_size -1. The grid's best point and AUTOTUNE are then run in alternation, three times
// each, and compared by medians: AUTOTUNE's steady-state rate (from 10 s after its start) against
// the best point's, when AUTOTUNE first ran at 95% of it over a 1-second window (its slowest
// round), and the process's peak resident memory during the AUTOTUNE runs against the budget.
//  1. images: read_file -> decode_image -> resize 224 -> batch 32 (CPU-heavy decode);
//  2. tfrecords: an interleaved tfrecord_reader -> parse_example -> batch 256 (reading, light map);
//  3. two heavy stages: simulate_work 300 us then 100 us of CPU per element.
// Usage: bench_autotune TFRECORD_GLOB JPEG_GLOB (scripts/demo.sh makes build/sample_data)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "sluice/core/bench.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/resources.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/core/text.hpp"

namespace {

constexpr double kSettleLimitS = 10;   // AUTOTUNE must reach 95% of the best within this
constexpr double kAutotuneRunS = 14;   // its steady state is measured from kSettleLimitS on
constexpr const char* kRamBudget = "1GiB";
constexpr int kRounds = 3;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

struct Shape {
  std::string name;
  std::vector<std::string> tuned;  // the stages whose workers the grid sets
  // The pipeline with these worker counts (-1 everywhere: AUTOTUNE, buffers too).
  std::function<std::string(const std::vector<int>&)> text;
};

std::string options_line(const std::vector<int>& workers) {
  const bool autotune = workers.front() < 0;
  return autotune ? fmt::format("options {{ seed: 7 autotune {{ ram_budget: \"{}\" }} }}\n", kRamBudget) : "options { seed: 7 }\n";
}
std::string buffer(const std::vector<int>& workers) { return workers.front() < 0 ? " buffer_size: -1" : ""; }

struct Trace {
  std::vector<std::pair<double, double>> points;  // (seconds, elements into the counted stage)
  std::uint64_t peak_resident = 0;
  bool peak_measured = false;
};

// Runs the AUTOTUNE variant for kAutotuneRunS, sampling the counted stage's input 10 times a second.
Trace trace_autotune(const sluice::Registry& registry, const std::string& text, const std::string& counted) {
  Trace trace;
  trace.peak_measured = sluice::reset_peak_resident_bytes();
  sluice::EngineOptions options;
  options.snapshot_interval = std::chrono::milliseconds(100);
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench_autotune"), registry), options);
  std::mutex mutex;
  engine.subscribe([&](const sluice::metrics::MetricsSnapshot& s) {
    for (const auto& m : s.stage())
      if (m.id() == counted) {
        std::lock_guard lock(mutex);
        trace.points.emplace_back(s.elapsed_s(), static_cast<double>(m.elements_in()));
      }
  });
  engine.start();
  engine.wait_for(std::chrono::milliseconds(static_cast<int>(kAutotuneRunS * 1000)));
  engine.stop();
  const auto result = engine.wait();
  if (result.state == sluice::RunState::Failed) throw sluice::Error(result.error);
  trace.peak_resident = sluice::peak_resident_bytes();
  return trace;
}

// Elements per second into the counted stage between two moments of the trace.
double rate_between(const Trace& t, double from_s, double to_s) {
  const std::pair<double, double>* a = nullptr;
  const std::pair<double, double>* b = nullptr;
  for (const auto& p : t.points) {
    if (!a && p.first >= from_s) a = &p;
    if (p.first <= to_s) b = &p;
  }
  if (!a || !b || b->first <= a->first) return 0;
  return (b->second - a->second) / (b->first - a->first);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: bench_autotune TFRECORD_GLOB JPEG_GLOB (scripts/demo.sh makes build/sample_data)\n");
    return 2;
  }
  sluice::tune_process_for_streaming();
  const std::string tfrecords = argv[1], jpegs = argv[2];
  sluice::Registry registry;
  registry.load_search_path();
  const auto cores = sluice::usable_cores();
  const std::vector<int> grid = {1, 2, 4};

  // The sources repeat without end: every run is stopped after its window.
  const std::vector<Shape> shapes = {
      {"images", {"decode", "resize"},
       [&](const std::vector<int>& w) {
         return options_line(w) +
                fmt::format("stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
                            "stage {{ id: \"again\" op: \"repeat\" input: \"files\" }}\n"
                            "stage {{ id: \"read\" op: \"read_file\" input: \"again\" }}\n"
                            "stage {{ id: \"decode\" op: \"decode_image\" input: \"read\" parallelism: {} }}\n"
                            "stage {{ id: \"resize\" op: \"resize\" input: \"decode\" parallelism: {}{} params {{ key: \"height\" value: \"224\" }} "
                            "params {{ key: \"width\" value: \"224\" }} params {{ key: \"mode\" value: \"crop\" }} }}\n"
                            "stage {{ id: \"batch\" op: \"batch\" input: \"resize\" params {{ key: \"batch_size\" value: \"32\" }} }}\n"
                            "stage {{ id: \"out\" op: \"null_sink\" input: \"batch\" }}\n",
                            jpegs, w[0], w[1], buffer(w));
       }},
      {"tfrecords", {"read", "parse"},
       [&](const std::vector<int>& w) {
         return options_line(w) +
                fmt::format("stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
                            "stage {{ id: \"again\" op: \"repeat\" input: \"files\" }}\n"
                            "stage {{ id: \"read\" op: \"tfrecord_reader\" input: \"again\" parallelism: {} interleave {{ cycle_length: 4 }} }}\n"
                            "stage {{ id: \"parse\" op: \"parse_example\" input: \"read\" parallelism: {}{} "
                            "params {{ key: \"features\" value: \"image:bytes, label:int64\" }} }}\n"
                            "stage {{ id: \"batch\" op: \"batch\" input: \"parse\" params {{ key: \"batch_size\" value: \"256\" }} }}\n"
                            "stage {{ id: \"out\" op: \"null_sink\" input: \"batch\" }}\n",
                            tfrecords, w[0], w[1], buffer(w));
       }},
      {"two heavy stages", {"heavy", "light"},
       [&](const std::vector<int>& w) {
         return options_line(w) +
                fmt::format("stage {{ id: \"src\" op: \"range\" params {{ key: \"count\" value: \"100000\" }} }}\n"
                            "stage {{ id: \"again\" op: \"repeat\" input: \"src\" }}\n"
                            "stage {{ id: \"heavy\" op: \"simulate_work\" input: \"again\" parallelism: {} params {{ key: \"us\" value: \"300\" }} }}\n"
                            "stage {{ id: \"light\" op: \"simulate_work\" input: \"heavy\" parallelism: {}{} params {{ key: \"us\" value: \"100\" }} }}\n"
                            "stage {{ id: \"batch\" op: \"batch\" input: \"light\" params {{ key: \"batch_size\" value: \"16\" }} }}\n"
                            "stage {{ id: \"out\" op: \"null_sink\" input: \"batch\" }}\n",
                            w[0], w[1], buffer(w));
       }},
  };

  fmt::print("AUTOTUNE against a grid of hand-set worker counts ({} each), on {:.3g} cores ({}); RAM budget {}\n", "1, 2, 4",
             cores.cores, cores.why, kRamBudget);
  sluice::BenchOptions window;
  window.warmup_s = 2;
  window.measure_s = 3;
  bool all_met = true;
  std::string summary;
  for (const auto& shape : shapes) {
    fmt::print("\n{}: grid ({} s warm-up, {} s measured each)\n", shape.name, window.warmup_s, window.measure_s);
    double best = 0;
    std::string best_at;
    std::vector<int> best_workers;
    for (int a : grid)
      for (int b : grid) {
        const auto result = sluice::run_bench(sluice::build_graph(sluice::parse_pipeline(shape.text({a, b}), "grid"), registry), window);
        const std::string at = fmt::format("{}={} {}={}", shape.tuned[0], a, shape.tuned[1], b);
        fmt::print("  {:<28} {:>10.0f} elements/s\n", at, result.elements_per_s);
        if (result.elements_per_s > best) {
          best = result.elements_per_s;
          best_at = at;
          best_workers = {a, b};
        }
      }
    // The best of nine noisy measurements is biased upwards, and this shared machine drifts by
    // more than the target's 5%: AUTOTUNE and the best point are measured in alternation,
    // kRounds times each, and compared by their medians.
    std::vector<double> tuned_rates, best_rates;
    std::vector<Trace> traces;
    for (int round = 0; round < kRounds; ++round) {
      traces.push_back(trace_autotune(registry, shape.text({-1, -1}), "batch"));
      tuned_rates.push_back(rate_between(traces.back(), kSettleLimitS, kAutotuneRunS));
      best_rates.push_back(
          sluice::run_bench(sluice::build_graph(sluice::parse_pipeline(shape.text(best_workers), "grid"), registry), window).elements_per_s);
      fmt::print("  round {}: AUTOTUNE {:>10.0f} elements/s, {} {:>10.0f} elements/s\n", round + 1, tuned_rates.back(), best_at,
                 best_rates.back());
    }
    const double steady = median(tuned_rates);
    best = median(best_rates);
    // When AUTOTUNE first ran at 95% of that (over the previous second), in its slowest round.
    double reached = 0;
    for (const auto& trace : traces) {
      double at = -1;
      for (const auto& p : trace.points)
        if (p.first >= 1 && rate_between(trace, p.first - 1, p.first) >= 0.95 * best) {
          at = p.first;
          break;
        }
      reached = at < 0 || reached < 0 ? -1 : std::max(reached, at);
    }
    std::uint64_t peak = 0;
    bool peak_measured = true;
    for (const auto& trace : traces) {
      peak = std::max(peak, trace.peak_resident);
      peak_measured = peak_measured && trace.peak_measured;
    }
    const std::uint64_t budget = *sluice::parse_byte_size(kRamBudget);
    const bool met = best > 0 && steady >= 0.95 * best && reached >= 0 && reached <= kSettleLimitS && (!peak_measured || peak <= budget);
    all_met = all_met && met;
    fmt::print("  {:<28} {:>10.0f} elements/s (median) from {:.0f} s on: {:.0f}% of {}'s median {:.0f}; 95% of it at {}; peak RSS {}\n",
               "AUTOTUNE", steady, kSettleLimitS, best > 0 ? 100 * steady / best : 0.0, best_at, best,
               reached >= 0 ? fmt::format("{:.1f} s", reached) : std::string("never"),
               peak_measured ? sluice::byte_size_text(peak) : std::string("not measured"));
    summary += fmt::format("| {:<17} | {:<24} | {:>9.0f} | {:>9.0f} | {:>5.0f}% | {:>9} | {:>10} |\n", shape.name, best_at, best, steady,
                           best > 0 ? 100 * steady / best : 0.0, reached >= 0 ? fmt::format("{:.1f} s", reached) : "never",
                           peak_measured ? sluice::byte_size_text(peak) : "-");
  }
  fmt::print("\n| pipeline          | best grid point          | best el/s | AUTOTUNE  | share  | 95% at    | peak RSS   |\n"
             "|-------------------|--------------------------|-----------|-----------|--------|-----------|------------|\n{}",
             summary);
  fmt::print("targets (95% of the best within {:.0f} s, peak RSS within {}): {}\n", kSettleLimitS, kRamBudget, all_met ? "met" : "NOT met");
  return 0;
}
