#include "sluice/core/report.hpp"

#include "sluice/core/text.hpp"

#include <algorithm>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "sluice/core/delivery_ledger.hpp"
#include "sluice/operator.hpp"

namespace sluice {

namespace {
// How a bottleneck's reason says the busiest stage is named without holding anything up.
constexpr const char* kNothingHeldUp = "no stage is clearly held up";

// Whether the stage's operator declares `role` (its snapshot carries the role's name).
bool has_role(const metrics::StageMetrics& m, OperatorRole role) { return m.role() == role_name(role); }
}  // namespace

namespace {
// The mean fill of `producer`'s output buffer that `reader` reads (its own, when it is one of
// several readers).
double reader_fill(const metrics::StageMetrics& producer, const std::string& reader) {
  for (const auto& r : producer.readers())
    if (r.reader() == reader) return r.mean_fill();
  return producer.mean_buffer_fill();
}
}  // namespace

Bottleneck find_bottleneck(const metrics::MetricsSnapshot& snapshot) {
  const int n = snapshot.stage_size();
  std::map<std::string, int> index_of;
  for (int i = 0; i < n; ++i) index_of[snapshot.stage(i).id()] = i;
  // The reader that continues a stage's fused group (the first in order), if any.
  std::vector<int> next_in_group(n, -1);
  for (int j = 0; j < n; ++j) {
    const auto& next = snapshot.stage(j);
    if (next.fused_with().empty() || next.inputs_size() != 1) continue;
    auto it = index_of.find(next.inputs(0));
    if (it == index_of.end()) continue;
    const auto& m = snapshot.stage(it->second);
    const std::string& head = m.fused_with().empty() ? m.id() : m.fused_with();
    if (next.fused_with() == head && next_in_group[it->second] < 0) next_in_group[it->second] = j;
  }
  // Each stage's fills are computed once, walking a fused group (which may be thousands of
  // stages long) without recursion: linear in the pipeline's size.
  //
  // A fused stage has no buffer before it: its group's input buffer is the one that matters.
  // A stage waits on its emptiest input (a combine needs each of them); a reader of a tee reads
  // its own buffer of the producer's output.
  std::vector<double> input_fills(n, -1.0), output_fills(n, -1.0);
  auto input_fill = [&](int i) {
    std::vector<int> walked;
    int at = i;
    while (input_fills[at] < 0) {
      const auto& m = snapshot.stage(at);
      if (m.inputs_size() > 0 && !m.fused_with().empty()) {
        walked.push_back(at);
        at = index_of.at(m.inputs(0));
        continue;
      }
      double fill = 1.0;  // a source is never short of input
      for (const auto& in : m.inputs()) fill = std::min(fill, reader_fill(snapshot.stage(index_of.at(in)), m.id()));
      input_fills[at] = fill;
    }
    for (int w : walked) input_fills[w] = input_fills[at];
    return input_fills[i];
  };
  // A member of a fused group hands its output straight to the next member: the group's last
  // buffer is the one it waits on.
  auto output_fill = [&](int i) {
    std::vector<int> walked;
    int at = i;
    double fill = 0.0;  // a sink
    for (;;) {
      if (output_fills[at] >= 0) {
        fill = output_fills[at];
        break;
      }
      const auto& m = snapshot.stage(at);
      walked.push_back(at);
      if (m.buffer_capacity()) {
        fill = m.mean_buffer_fill();
        break;
      }
      if (next_in_group[at] < 0) break;
      at = next_in_group[at];
    }
    for (int w : walked) output_fills[w] = fill;
    return output_fills[i];
  };
  // Among stages whose input is mostly full and output mostly empty, the busiest one limits the
  // pipeline; without such a stage, the busiest overall.
  int best = -1, busiest = -1;
  for (int i = 0; i < snapshot.stage_size(); ++i) {
    const auto& m = snapshot.stage(i);
    if (busiest < 0 || m.busy_fraction() > snapshot.stage(busiest).busy_fraction()) busiest = i;
    if (input_fill(i) >= 0.5 && output_fill(i) <= 0.5 && (best < 0 || m.busy_fraction() > snapshot.stage(best).busy_fraction()))
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
  std::string input = m.inputs_size() == 0 ? "it is a source" : fmt::format("its input buffer is {:.0f}% full", 100 * input_fill(b.stage));
  std::string output = m.kind() == "sink" ? "it is the sink" : fmt::format("its output buffer {:.0f}% full", 100 * output_fill(b.stage));
  b.reason = fmt::format("busy {:.0f}% of the time on {} worker{}; {}, {}", 100 * m.busy_fraction(), m.workers(),
                         m.workers() == 1 ? "" : "s", input, output);
  if (best < 0) b.reason += std::string(" (") + kNothingHeldUp + " by it: the pipeline is balanced or limited by its consumers)";
  return b;
}

bool bottleneck_holds_up(const metrics::MetricsSnapshot& snapshot) {
  return !snapshot.bottleneck().empty() && snapshot.bottleneck_reason().find(kNothingHeldUp) == std::string::npos;
}

namespace {

std::string indented(const std::string& lines) {
  std::string out;
  for (std::size_t at = 0; at < lines.size();) {
    const std::size_t end = std::min(lines.find('\n', at), lines.size());
    out += "  " + lines.substr(at, end - at) + "\n";
    at = end + 1;
  }
  return out;
}

std::string quoted_list(const std::vector<std::string>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? (i + 1 == ids.size() ? " and " : ", ") : "") + ("'" + ids[i] + "'");
  return s;
}

// The rules that turn one snapshot into suggestions, each a function, in the order they are told.
class Advisor {
 public:
  explicit Advisor(const metrics::MetricsSnapshot& snapshot) : snapshot_(snapshot) {
    for (int i = 0; i < snapshot.stage_size(); ++i) index_of_[snapshot.stage(i).id()] = i;
  }

  std::vector<Suggestion> advise() {
    if (const auto* b = stage(snapshot_.bottleneck())) {
      if (b->has_remote() && b->remote().requests() > 0) remote_latency(*b);
      limiting_stage(*b);
    }
    starving_combines();
    cache_after_deterministic_work();
    swinging_buffers();
    shard_after_work();
    return std::move(out_);
  }

 private:
  const metrics::StageMetrics* stage(const std::string& id) const {
    auto it = index_of_.find(id);
    return it == index_of_.end() ? nullptr : &snapshot_.stage(it->second);
  }
  void advice(std::string text) { out_.push_back({std::move(text), Suggestion::Change::None, {}, {}, 0}); }

  // 0. A stage that waits on remote storage: what hides the latency of its requests.
  void remote_latency(const metrics::StageMetrics& b) {
    const auto& r = b.remote();
    advice(fmt::format("stage '{}' ({}) reads remote storage, {:.1f} ms to the first byte of an answer (p50{}): read more objects at once "
                       "(its `parallelism`, and `interleave.cycle_length` of a reader), keep more ranges in flight per object "
                       "(options.remote.ranges_ahead) or larger ones (options.remote.range_size)",
                       b.id(), b.op(), r.latency_p50_ms(),
                       r.throttles() ? fmt::format("; {} answers throttled it: fewer requests at once would help more", r.throttles()) : ""));
  }

  // 1. The stage that limits throughput: what would make it faster, by what it is.
  void limiting_stage(const metrics::StageMetrics& b) {
    const bool held_up = bottleneck_holds_up(snapshot_);
    // Stages of the Python face (python_map, python_generator, ...) call Python under the GIL.
    const bool runs_python = has_role(b, OperatorRole::CallsPython);
    if (has_role(b, OperatorRole::FeedsPython)) {
      advice(fmt::format("the Python loop reading the batches (stage '{}') is the limit: the pipeline keeps up with it; "
                         "a faster training step, or more of it on the GPU, is where time goes",
                         b.id()));
    } else if (runs_python) {
      advice(fmt::format("'{}' ({}) runs a Python function, which holds the GIL: its workers take turns, so more parallelism "
                         "helps only as far as the function releases the GIL (NumPy on large arrays does); move the work "
                         "into Sluice operators, or vectorise the function",
                         b.id(), b.op()));
    } else if (has_role(b, OperatorRole::ReadsService)) {
      advice(fmt::format("the Sluice service (stage '{}' reads what its workers make) delivers slower than the rest consumes: start more "
                         "workers (sluice worker --dispatcher ...) when those running are busy, or read more splits at once "
                         "(distribute {{ splits_in_flight: N }}, 4 by default) when they are not",
                         b.id()));
    } else if (b.kind() == "source") {
      advice(fmt::format("the source '{}' ({}) produces slower than the rest consumes: read several inputs at once "
                         "(an interleaved reader with parallelism), or make each element cheaper to produce",
                         b.id(), b.op()));
    } else if (b.kind() == "sink") {
      advice(fmt::format("the sink '{}' ({}) is the limit: everything before it keeps up; a faster destination "
                         "(or a sink with parallelism, if it is stateless) would help",
                         b.id(), b.op()));
    } else if (b.per_input() && held_up) {
      per_input_readers(b);
    } else if (b.stateless() && held_up && b.workers_tuned()) {
      // The tuner already gives it what the budget allows.
      const auto& tune = snapshot_.autotune();
      const std::string given = b.workers() >= b.max_workers() ? fmt::format("{} workers, the most it may have", b.workers())
                                                               : fmt::format("{} worker{} of at most {}", b.workers(), b.workers() == 1 ? "" : "s", b.max_workers());
      advice(fmt::format("the autotuner gives stage '{}' {}, within the CPU budget of {:.3g} cores ({}): "
                         "where the machine has more cores, raise `options.autotune.cpu_budget`; otherwise make the stage "
                         "cheaper, for instance decode smaller images, or run more machines",
                         b.id(), given, tune.cpu_budget(), tune.cpu_budget_source()));
    } else if ((b.stateless() || b.assembles_in_parallel()) && held_up) {
      more_workers(b);
    } else if (!b.stateless() && !b.per_input()) {  // (a per-input stage runs on every reader of its interleave)
      advice(fmt::format("'{}' ({}) keeps state and runs on one worker: move expensive work out of it into stateless "
                         "stages before it, which can run in parallel",
                         b.id(), b.op()));
    }
  }

  // Per input, it runs on the interleave's readers: more of them read and batch more inputs at
  // once. Advice only: workers beyond the inputs open at once read nothing, and a suggestion sets
  // one number.
  void per_input_readers(const metrics::StageMetrics& b) {
    const std::string head = b.fused_with();
    const std::int64_t now = std::max<std::uint32_t>(1, b.workers());
    std::string text = fmt::format("raise `parallelism` and `interleave.cycle_length` of stage '{}' (now {} worker{}): "
                                   "per-input stage '{}' ({}) runs on its readers, one input each, and is busy {:.0f}% of the "
                                   "time while its input buffer stays full",
                                   head, b.workers(), b.workers() == 1 ? "" : "s", b.id(), b.op(), 100 * b.busy_fraction());
    if (snapshot_.cores() > 0 && static_cast<std::uint32_t>(now) >= snapshot_.cores())
      text += fmt::format(" (but this machine has {} core{}: beyond that, make the per-input stages cheaper, or run more machines)",
                          snapshot_.cores(), snapshot_.cores() == 1 ? "" : "s");
    advice(std::move(text));
  }

  // A stage that can take more workers: twice as many, up to the machine's cores when it has more
  // than it uses now (applied by the studio and `sluice tune`), with the stages fused with it.
  void more_workers(const metrics::StageMetrics& b) {
    const std::string head = b.fused_with().empty() ? b.id() : b.fused_with();
    std::vector<std::string> group;
    for (const auto& m : snapshot_.stage())
      if (m.id() != b.id() && (m.id() == head || m.fused_with() == head)) group.push_back(m.id());
    std::string text = fmt::format("raise `parallelism` of stage '{}' (now {} worker{}): it is busy {:.0f}% of the time while its "
                                   "input buffer stays full and its output buffer empty",
                                   b.id(), b.workers(), b.workers() == 1 ? "" : "s", 100 * b.busy_fraction());
    if (!b.stateless())
      text += fmt::format("; '{}' keeps state, but its outputs are assembled (padded, copied into one block) on that many "
                          "threads while one takes the inputs in order",
                          b.op());
    if (!group.empty())
      text += fmt::format("; {} run{} fused with it on the same workers: give {} the same parallelism to keep them together",
                          quoted_list(group), group.size() == 1 ? "s" : "", group.size() == 1 ? "it" : "them");
    std::uint32_t busy_workers = 0;
    for (const auto& m : snapshot_.stage())
      if (m.fused_with().empty() && m.busy_fraction() > 0.25) busy_workers += m.workers();
    if (snapshot_.cores() > 0 && busy_workers >= snapshot_.cores())
      text += fmt::format(" (but this machine has {} core{} and its busy stages already use {} workers: beyond that, make "
                          "the stage cheaper, for instance decode smaller images, or run more machines)",
                          snapshot_.cores(), snapshot_.cores() == 1 ? "" : "s", busy_workers);
    const std::int64_t now = std::max<std::uint32_t>(1, b.workers());
    const std::int64_t cores = snapshot_.cores() > now ? snapshot_.cores() : now + 1;
    out_.push_back({text, Suggestion::Change::SetParallelism, b.id(), group, std::min(2 * now, cores)});
  }

  // 2. A combine that waits for one of its inputs: the branch ending there is what to speed up.
  void starving_combines() {
    for (const auto& m : snapshot_.stage()) {
      if (m.kind() != "combine" || m.inputs_size() < 2 || m.starved_fraction() < 0.2) continue;
      const metrics::StageMetrics* starving = nullptr;
      double emptiest = 2.0, others = 0.0;
      for (const auto& in : m.inputs()) {
        const auto* producer = stage(in);
        if (!producer) continue;
        const double fill = reader_fill(*producer, m.id());
        if (fill < emptiest) {
          if (starving) others = std::max(others, emptiest);
          emptiest = fill;
          starving = producer;
        } else {
          others = std::max(others, fill);
        }
      }
      if (!starving || others - emptiest < 0.2) continue;  // no input clearly behind the others
      // The busiest stage of that branch, walking up its first inputs.
      const metrics::StageMetrics* busiest = starving;
      for (const auto* up = starving; up; up = up->inputs_size() ? stage(up->inputs(0)) : nullptr)
        if (up->busy_fraction() > busiest->busy_fraction()) busiest = up;
      advice(fmt::format("the branch ending at '{}' starves '{}' ({}): its buffer into '{}' was {:.0f}% full on average, the "
                         "other inputs' up to {:.0f}%; speed that branch up (its busiest stage is '{}', {}, busy {:.0f}%)",
                         starving->id(), m.id(), m.op(), m.id(), 100 * emptiest, 100 * others, busiest->id(), busiest->op(),
                         100 * busiest->busy_fraction()));
    }
  }

  // 3. A deterministic, expensive stage recomputed every epoch, with no cache after it.
  void cache_after_deterministic_work() {
    std::function<bool(const metrics::StageMetrics&)> cached_after = [&](const metrics::StageMetrics& m) {
      for (const auto& next : snapshot_.stage())
        for (const auto& in : next.inputs())
          if (in == m.id()) return has_role(next, OperatorRole::Caches) || cached_after(next);
      return false;
    };
    for (const auto& m : snapshot_.stage()) {
      if (m.kind() != "map" || m.random() || m.epoch() < 2 || m.mean_element_us() < 50 || cached_after(m)) continue;
      out_.push_back({fmt::format("add a `cache` stage after '{}' ({}): it is deterministic, costs {:.0f} us per element and "
                                 "computed the same output in each of {} epochs",
                                 m.id(), m.op(), m.mean_element_us(), m.epoch()),
                     Suggestion::Change::AddCacheAfter, m.id(), {}, 0});
      break;  // the earliest such stage; a cache there covers the ones before it
    }
  }

  // 4. Buffers that swing between empty and full: the consumer works in bursts.
  void swinging_buffers() {
    for (const auto& m : snapshot_.stage()) {
      // Repeatedly: one long empty spell while a shuffle buffer fills at the start is no swing.
      if (!m.buffer_capacity() || m.buffer_tuned() || m.buffer_empty_fraction() < 0.2 || m.buffer_full_fraction() < 0.2 || m.buffer_swings() < 10) continue;
      // And both sides lost time to it: the producer waiting for room, the consumer for input.
      const metrics::StageMetrics* consumer = nullptr;
      for (const auto& next : snapshot_.stage())
        if (next.inputs_size() == 1 && next.inputs(0) == m.id()) consumer = &next;
      if (!consumer || m.blocked_fraction() < 0.1 || consumer->starved_fraction() < 0.1) continue;
      // On an edge that carries chunks the buffer holds chunks, each many elements.
      const std::string items = m.chunks_out() > 0 ? fmt::format("chunks (of {} elements on average)", m.chunked_elements_out() / m.chunks_out())
                                                   : std::string("elements");
      const std::string now = m.buffer_byte_limit()
                                  ? fmt::format("now up to {} {} or {:.0f} MB, chosen by the engine", m.buffer_capacity(), items,
                                                m.buffer_byte_limit() / 1e6)
                                  : fmt::format("now {}{}", m.buffer_capacity(), m.chunks_out() > 0 ? " " + items : "");
      out_.push_back({fmt::format("grow `buffer_size` of '{}' ({}): its output buffer went between empty and full {} times, "
                                 "empty {:.0f}% and full {:.0f}% of the time, so the stages around it wait in turn",
                                 m.id(), now, m.buffer_swings(), 100 * m.buffer_empty_fraction(), 100 * m.buffer_full_fraction()),
                     Suggestion::Change::SetBufferSize, m.id(), {}, 2 * static_cast<std::int64_t>(m.buffer_capacity())});
    }
  }

  // 5. A shard after work it throws away.
  void shard_after_work() {
    for (const auto& m : snapshot_.stage()) {
      if (!has_role(m, OperatorRole::Shards) || m.elements_in() == 0 || m.elements_out() * 4 > m.elements_in() * 3) continue;
      const metrics::StageMetrics* costly = nullptr;
      for (const auto* up = m.inputs_size() ? stage(m.inputs(0)) : nullptr; up; up = up->inputs_size() ? stage(up->inputs(0)) : nullptr)
        if (up->kind() != "source" && up->mean_element_us() >= 5 && (!costly || up->mean_element_us() > costly->mean_element_us())) costly = up;
      if (!costly) continue;
      advice(fmt::format("move '{}' before '{}': it keeps {:.0f}% of its input, so most of the work of '{}' ({:.0f} us per "
                                "element) is thrown away; shard the file list instead",
                                m.id(), costly->id(), 100.0 * m.elements_out() / m.elements_in(), costly->id(),
                                costly->mean_element_us()));
    }
  }

  const metrics::MetricsSnapshot& snapshot_;
  std::map<std::string, int> index_of_;
  std::vector<Suggestion> out_;
};

}  // namespace

std::vector<Suggestion> suggestions_for(const metrics::MetricsSnapshot& snapshot) { return Advisor(snapshot).advise(); }

std::optional<Suggestion> suggestion_after_failure(const metrics::MetricsSnapshot& snapshot) {
  // The engine's failure message ends with its advice; skipping is offered only where it gave it.
  if (snapshot.failed_stage().empty() || snapshot.error().find("`error_policy: skip`") == std::string::npos) return std::nullopt;
  const std::string& id = snapshot.failed_stage();
  return Suggestion{fmt::format("skip the elements stage '{}' fails on (`error_policy: skip` on '{}'): the run goes on past them, "
                                "and counts them and their reasons in the report",
                                id, id),
                    Suggestion::Change::SkipFailures, id, {}, 0};
}

std::vector<std::string> suggest_changes(const metrics::MetricsSnapshot& snapshot) {
  std::vector<std::string> texts;
  for (auto& s : suggestions_for(snapshot)) texts.push_back(std::move(s.text));
  return texts;
}

std::string format_report(const metrics::MetricsSnapshot& snapshot) {
  std::string out = fmt::format("Run {} after {:.2f} s\n", snapshot.state(), snapshot.elapsed_s());
  if (snapshot.worker().count() > 1) {
    out += fmt::format("Worker {} of {} ({})\n", snapshot.worker().index(), snapshot.worker().count(), printable(snapshot.worker().source()));
    for (const auto& note : snapshot.worker().notes()) out += "  " + printable(note) + "\n";
  }
  std::size_t op_width = 14;  // wide enough for the longest operator name (sample_from_datasets)
  for (const auto& m : snapshot.stage()) op_width = std::max(op_width, m.op().size());
  out += fmt::format("{:<16} {:<{}} {:>3} {:>12} {:>12} {:>9} {:>6} {:>8} {:>8} {:>6} {:>8}\n", "stage", "op", op_width, "wk",
                     "elements", "elements/s", "MB/s", "busy%", "starved%", "blocked%", "fill%", "skipped");
  bool tuned = false;
  for (const auto& m : snapshot.stage()) {
    std::string fill = m.buffer_capacity() ? fmt::format("{:.0f}", 100 * m.mean_buffer_fill()) : m.kind() == "sink" ? "-" : "fused";
    const std::string workers = fmt::format("{}{}", m.workers(), m.workers_tuned() ? "*" : "");
    tuned = tuned || m.workers_tuned();
    out += fmt::format("{:<16} {:<{}} {:>3} {:>12} {:>12.0f} {:>9.2f} {:>6.0f} {:>8.0f} {:>8.0f} {:>6} {:>8}\n", m.id(),
                       m.op(), op_width, workers, m.elements_out(), m.elements_per_s(), m.bytes_per_s() / 1e6,
                       100 * m.busy_fraction(), 100 * m.starved_fraction(), 100 * m.blocked_fraction(), fill,
                       m.errors_skipped());
  }
  if (tuned) out += "* workers chosen by the autotuner (parallelism AUTOTUNE): see Autotune below\n";
  for (const auto& m : snapshot.stage()) {
    if (m.devices_size() == 0) continue;
    // "copying MB/s": the copies' own rate, timed on the device, where the feed times them.
    out += fmt::format("Devices of stage '{}':\n{:<16} {:>10} {:>12} {:>10} {:>14} {:>10} {:>10}\n", m.id(), "device", "slices",
                       "MB copied", "MB/s", "copying MB/s", "ring", "checked");
    for (const auto& d : m.devices())
      out += fmt::format("{:<16} {:>10} {:>12.1f} {:>10.1f} {:>14} {:>10} {:>10}\n", d.name(), d.slices(), d.bytes() / 1e6,
                         d.bytes_per_s() / 1e6, d.copy_seconds() > 0 ? fmt::format("{:.1f}", d.copy_bytes_per_s() / 1e6) : "-",
                         fmt::format("{}/{}", d.ring_level(), d.ring_capacity()),
                         d.checked_slices() ? fmt::format("{}", d.checked_slices()) : "-");
  }
  // A stage read by several stages has a buffer per reader; the table's fill is the fullest's.
  for (const auto& m : snapshot.stage()) {
    if (m.readers_size() < 2) continue;
    std::string per_reader;
    for (const auto& r : m.readers())
      per_reader += fmt::format("{}'{}' {:.0f}%", per_reader.empty() ? "" : ", ", r.reader(), 100 * r.mean_fill());
    out += fmt::format("Buffers of '{}' per reader (mean fill): {}\n", m.id(), per_reader);
  }
  // Stages that read remote storage: what their requests did.
  for (const auto& m : snapshot.stage()) {
    if (!m.has_remote()) continue;
    const auto& r = m.remote();
    out += fmt::format("Remote reads of stage '{}' ({}): {} request{}, {:.1f} MB, {} retr{} ({} throttled), {} failed; latency p50 {:.1f} ms, "
                       "p99 {:.1f} ms\n",
                       m.id(), m.op(), r.requests(), r.requests() == 1 ? "" : "s", r.bytes() / 1e6, r.retries(), r.retries() == 1 ? "y" : "ies",
                       r.throttles(), r.errors(), r.latency_p50_ms(), r.latency_p99_ms());
    if (r.cache_hits())
      out += fmt::format("  and {} object{} ({:.1f} MB) from the remote cache's local copies\n", r.cache_hits(), r.cache_hits() == 1 ? "" : "s",
                         r.cache_bytes() / 1e6);
  }
  // Sources that ended their run inside a pass (stopped at a checkpoint, or a take after them):
  // where they stood, which a resumed run continues from.
  for (const auto& m : snapshot.stage())
    if (m.kind() == "source" && m.pass_elements() > 0 && m.pass_position() < static_cast<std::uint64_t>(m.pass_elements()))
      out += fmt::format("Position of stage '{}' ({}): epoch {}, {} of {} elements read\n", m.id(), m.op(), m.pass_epoch(), m.pass_position(),
                         m.pass_elements());
  // Stages that pad: how much of what they wrote is padding (packing and bucketing lower it).
  for (const auto& m : snapshot.stage()) {
    const std::uint64_t written = m.padding_values() + m.data_values();
    if (written == 0) continue;
    out += fmt::format("Padding of stage '{}' ({}): {:.1f}% of the {} values it wrote ({} padding, {} data)\n", m.id(), m.op(),
                       100.0 * static_cast<double>(m.padding_values()) / static_cast<double>(written), written, m.padding_values(),
                       m.data_values());
  }
  out += format_autotune_summary(snapshot);
  if (const std::string ledger = format_ledger_summary(snapshot); !ledger.empty()) out += "Delivery ledger:\n" + indented(ledger);
  if (!snapshot.bottleneck().empty())
    out += fmt::format("Bottleneck: stage '{}': {}\n", snapshot.bottleneck(), snapshot.bottleneck_reason());
  const auto suggestions = suggest_changes(snapshot);
  if (!suggestions.empty()) {
    out += "What would help:\n";
    for (const auto& s : suggestions) out += "  - " + s + "\n";
  }
  for (const auto& m : snapshot.stage()) {
    if (m.errors_skipped() == 0) continue;
    out += fmt::format("Skipped in stage '{}': {} element{}\n", m.id(), m.errors_skipped(), m.errors_skipped() == 1 ? "" : "s");
    for (const auto& r : m.skip_reasons()) {
      // A reason of several lines (a Python traceback) keeps them, indented under its dash.
      std::string reason = printable(r, /*keep_line_breaks=*/true);
      for (std::size_t at = 0; (at = reason.find('\n', at)) != std::string::npos; at += 5) reason.replace(at, 1, "\n    ");
      out += "  - " + reason + "\n";
    }
    if (static_cast<std::uint64_t>(m.skip_reasons_size()) < m.errors_skipped()) {
      out += fmt::format("  ... and {} more; by kind of reason:\n", m.errors_skipped() - m.skip_reasons_size());
      std::vector<std::pair<std::uint64_t, std::string>> kinds;
      for (const auto& [kind, count] : m.skip_reason_counts()) kinds.emplace_back(count, kind);
      std::sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
      for (const auto& [count, kind] : kinds) out += fmt::format("  {:>8} x {}\n", count, kind);
    }
  }
  return out;
}

namespace {
// "0:03.1": minutes, seconds and tenths since the start.
std::string moment_text(double seconds) {
  const auto tenths = static_cast<long long>(seconds * 10 + 0.5);
  return fmt::format("{}:{:02}.{}", tenths / 600, tenths / 10 % 60, tenths % 10);
}
std::string setting_text(const metrics::AutotuneChange& c, std::int64_t value) {
  if (c.what() == "workers") return fmt::format("{} worker{}", value, value == 1 ? "" : "s");
  return fmt::format("{} elements", value);
}
}  // namespace

std::string format_autotune_change(const metrics::AutotuneChange& c) {
  std::string text = fmt::format("{} autotune: '{}' {} {} -> {}", moment_text(c.at_s()), c.stage(), c.what() == "workers" ? "workers" : "buffer",
                                 c.from(), c.to());
  if (c.what() == "buffer" && c.byte_limit() > 0) text += " (at most " + byte_size_text(c.byte_limit()) + ")";
  return text + ": " + c.reason();
}

std::string format_ledger_summary(const metrics::MetricsSnapshot& snapshot) {
  if (snapshot.ledger_size() == 0) return {};
  std::vector<EpochVerdict> verdicts;
  for (const auto& l : snapshot.ledger()) {
    EpochVerdict v;
    v.epoch = l.epoch();
    v.records = l.records();
    v.deliveries = l.deliveries();
    if (l.has_expected()) v.expected = l.expected();
    v.twice = l.twice();
    v.missing = l.missing();
    v.skipped_as_asked = l.skipped_as_asked();
    v.under_way = l.under_way();
    v.digest = l.digest();
    v.unnamed = l.unnamed();
    verdicts.push_back(std::move(v));
  }
  return format_verdicts(verdicts, snapshot.state() == "finished");
}

std::string format_autotune_summary(const metrics::MetricsSnapshot& snapshot) {
  if (!snapshot.has_autotune()) return {};
  const auto& a = snapshot.autotune();
  std::string out = fmt::format("Autotune: budget {:.3g} cores ({}) and {} of memory ({}), buffers at most {} together\n",
                                a.cpu_budget(), a.cpu_budget_source(), byte_size_text(a.ram_budget()), a.ram_budget_source(),
                                byte_size_text(a.buffer_budget()));
  // Per stage and setting, in pipeline order: the first and last change.
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& m : snapshot.stage()) {
    if (m.workers_tuned() && m.fused_with().empty()) keys.emplace_back(m.id(), "workers");  // a fused group's head speaks for it
    if (m.buffer_tuned()) keys.emplace_back(m.id(), "buffer");
  }
  for (const auto& [id, what] : keys) {
    const metrics::AutotuneChange *first = nullptr, *last = nullptr;
    int count = 0;
    for (const auto& c : a.changes())
      if (c.stage() == id && c.what() == what) {
        if (!first) first = &c;
        last = &c;
        ++count;
      }
    if (!first) {
      std::string now;
      for (const auto& m : snapshot.stage())
        if (m.id() == id) now = what == "workers" ? fmt::format("{} worker{}", m.workers(), m.workers() == 1 ? "" : "s")
                                                  : fmt::format("{} elements", m.buffer_capacity());
      out += fmt::format("  {}: kept {} (nothing called for a change)\n", id, now);
    } else if (count == 1) {
      out += fmt::format("  {}: {} -> {} at {} because {}\n", id, setting_text(*first, first->from()), setting_text(*first, first->to()),
                         moment_text(first->at_s()), first->reason());
    } else {
      out += fmt::format("  {}: {} -> {} in {} changes, the last at {} ({} -> {}) because {}\n", id, setting_text(*first, first->from()),
                         setting_text(*last, last->to()), count, moment_text(last->at_s()), last->from(), last->to(), last->reason());
    }
  }
  if (a.changes_left_out() > 0)
    out += fmt::format("  ({} later changes are not kept in the metrics)\n", a.changes_left_out());
  return out;
}

namespace {
std::string duration_text(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  if (total >= 3600) return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
  return fmt::format("{}:{:02}", total / 60, total % 60);
}
std::string count_text(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e4) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}
}  // namespace

std::string format_progress(const metrics::MetricsSnapshot& snapshot) {
  if (snapshot.stage_size() == 0) return "";
  // Elements: what reaches the batch stage (or the sink when there is none); rates are recent.
  const metrics::StageMetrics* sink = &snapshot.stage(snapshot.stage_size() - 1);
  for (const auto& m : snapshot.stage())
    if (m.kind() == "sink") sink = &m;
  const metrics::StageMetrics* batch = nullptr;
  for (const auto& m : snapshot.stage())
    if (has_role(m, OperatorRole::Batches)) batch = &m;
  std::string line = fmt::format("{} {}", duration_text(snapshot.elapsed_s()), snapshot.state());
  if (snapshot.worker().count() > 1) line = fmt::format("[worker {}/{}] {}", snapshot.worker().index(), snapshot.worker().count(), line);
  if (batch) {
    double rate = 0;
    for (const auto& m : snapshot.stage())
      for (const auto& in : batch->inputs())
        if (m.id() == in) rate = m.recent_elements_per_s();
    line += fmt::format(" | {} elements, {} batches | {} elements/s", count_text(batch->elements_in()),
                        count_text(batch->elements_out()), count_text(rate));
  } else {
    double rate = 0;
    for (const auto& m : snapshot.stage())
      for (const auto& in : sink->inputs())
        if (m.id() == in) rate = m.recent_elements_per_s();
    line += fmt::format(" | {} elements | {} elements/s", count_text(sink->elements_in()), count_text(rate));
  }
  line += fmt::format(" | epoch {}", sink->epoch());
  // How far the run is, when its sources know their size: what their consumers have taken of
  // it (the slowest decides). Once all is taken but the run goes on, nothing is shown.
  double done = -1;
  for (const auto& source : snapshot.stage()) {
    if (source.kind() != "source" || source.expected_elements() <= 0) continue;
    double taken = static_cast<double>(source.elements_out());
    for (const auto& m : snapshot.stage())
      if (m.inputs_size() == 1 && m.inputs(0) == source.id()) taken = static_cast<double>(m.elements_in());
    const double fraction = std::min(1.0, taken / static_cast<double>(source.expected_elements()));
    done = done < 0 ? fraction : std::min(done, fraction);
  }
  if (done > 0 && done < 1 && snapshot.state() == "running") {
    line += fmt::format(" | {:.0f}%", 100 * done);
    if (snapshot.elapsed_s() > 1) line += " | ETA " + duration_text(snapshot.elapsed_s() * (1 - done) / done);
  }
  if (!snapshot.bottleneck().empty()) line += " | bottleneck: " + snapshot.bottleneck();
  return line;
}

}  // namespace sluice
