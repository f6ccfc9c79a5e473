#include "sluice/core/report.hpp"

#include <functional>
#include <map>

#include <fmt/format.h>

namespace sluice {

Bottleneck find_bottleneck(const metrics::MetricsSnapshot& snapshot) {
  std::map<std::string, int> index_of;
  for (int i = 0; i < snapshot.stage_size(); ++i) index_of[snapshot.stage(i).id()] = i;
  // A fused stage has no buffer before it: its group's input buffer is the one that matters.
  std::function<double(const metrics::StageMetrics&)> input_fill = [&](const metrics::StageMetrics& m) {
    if (m.inputs_size() == 0) return 1.0;  // a source is never short of input
    if (!m.fused_with().empty()) return input_fill(snapshot.stage(index_of.at(m.inputs(0))));
    double fill = 0;
    for (const auto& in : m.inputs()) fill = std::max(fill, snapshot.stage(index_of.at(in)).mean_buffer_fill());
    return fill;
  };
  // A member of a fused group hands its output straight to the next member: the group's last
  // buffer is the one it waits on.
  std::function<double(const metrics::StageMetrics&)> output_fill = [&](const metrics::StageMetrics& m) -> double {
    if (m.buffer_capacity()) return m.mean_buffer_fill();
    const std::string& head = m.fused_with().empty() ? m.id() : m.fused_with();
    for (const auto& next : snapshot.stage())
      if (next.fused_with() == head && next.inputs_size() == 1 && next.inputs(0) == m.id()) return output_fill(next);
    return 0.0;  // a sink
  };
  // Among stages whose input is mostly full and output mostly empty, the busiest one limits the
  // pipeline; without such a stage, the busiest overall.
  int best = -1, busiest = -1;
  for (int i = 0; i < snapshot.stage_size(); ++i) {
    const auto& m = snapshot.stage(i);
    if (busiest < 0 || m.busy_fraction() > snapshot.stage(busiest).busy_fraction()) busiest = i;
    if (input_fill(m) >= 0.5 && output_fill(m) <= 0.5 && (best < 0 || m.busy_fraction() > snapshot.stage(best).busy_fraction()))
      best = i;
  }
  // A candidate that is far less busy than the busiest stage is not what limits the run (the
  // hand-offs are): then name the busiest.
  if (best >= 0 && busiest >= 0 && snapshot.stage(best).busy_fraction() < 0.5 * snapshot.stage(busiest).busy_fraction())
    best = -1;
  Bottleneck b;
  b.stage = best >= 0 ? best : busiest;
  if (b.stage < 0 || snapshot.stage(b.stage).busy_fraction() <= 0) return {};
  const auto& m = snapshot.stage(b.stage);
  std::string input = m.inputs_size() == 0 ? "it is a source" : fmt::format("its input buffer is {:.0f}% full", 100 * input_fill(m));
  std::string output = m.kind() == "sink" ? "it is the sink" : fmt::format("its output buffer {:.0f}% full", 100 * output_fill(m));
  b.reason = fmt::format("busy {:.0f}% of the time on {} worker{}; {}, {}", 100 * m.busy_fraction(), m.workers(),
                         m.workers() == 1 ? "" : "s", input, output);
  if (best < 0) b.reason += " (no stage is clearly held up by it: the pipeline is balanced or limited by its consumers)";
  return b;
}

std::string format_report(const metrics::MetricsSnapshot& snapshot) {
  std::string out = fmt::format("Run {} after {:.2f} s\n", snapshot.state(), snapshot.elapsed_s());
  out += fmt::format("{:<16} {:<14} {:>3} {:>12} {:>12} {:>9} {:>6} {:>8} {:>8} {:>6} {:>8}\n", "stage", "op", "wk",
                     "elements", "elements/s", "MB/s", "busy%", "starved%", "blocked%", "fill%", "skipped");
  for (const auto& m : snapshot.stage()) {
    std::string fill = m.buffer_capacity() ? fmt::format("{:.0f}", 100 * m.mean_buffer_fill()) : m.kind() == "sink" ? "-" : "fused";
    out += fmt::format("{:<16} {:<14} {:>3} {:>12} {:>12.0f} {:>9.2f} {:>6.0f} {:>8.0f} {:>8.0f} {:>6} {:>8}\n", m.id(),
                       m.op(), m.workers(), m.elements_out(), m.elements_per_s(), m.bytes_per_s() / 1e6,
                       100 * m.busy_fraction(), 100 * m.starved_fraction(), 100 * m.blocked_fraction(), fill,
                       m.errors_skipped());
  }
  if (!snapshot.bottleneck().empty())
    out += fmt::format("Bottleneck: stage '{}': {}\n", snapshot.bottleneck(), snapshot.bottleneck_reason());
  for (const auto& m : snapshot.stage()) {
    if (m.errors_skipped() == 0) continue;
    out += fmt::format("Skipped in stage '{}': {} element{}\n", m.id(), m.errors_skipped(), m.errors_skipped() == 1 ? "" : "s");
    for (const auto& r : m.skip_reasons()) out += "  - " + r + "\n";
    if (static_cast<std::uint64_t>(m.skip_reasons_size()) < m.errors_skipped())
      out += fmt::format("  ... and {} more\n", m.errors_skipped() - m.skip_reasons_size());
  }
  return out;
}

}  // namespace sluice
