// Source stages: passes over the data, handed downstream in chunks.
#include <limits>

#include "engine_impl.hpp"

namespace sluice {

void Engine::Impl::run_source(StageRuntime& st) {
  std::vector<Item> out;
  out.reserve(kChunk);
  std::uint64_t mark = now_ns();
  std::uint64_t produced = 0, produced_bytes = 0;
  auto handover = [&]() {
    std::uint64_t t = now_ns();
    add(st.counters.busy_ns, t - mark);
    add(st.counters.elements_out, produced);
    add(st.counters.bytes_out, produced_bytes);
    produced = produced_bytes = 0;
    bool ok = flush(st, out);
    mark = now_ns();
    return ok;
  };
  // A resumed run starts where the checkpoint's cut left the source: inside a pass (the operator
  // restored its place in it), or before one.
  std::uint64_t first_pass = 0, resume_index = 0;
  bool resume_inside_pass = false;
  if (end_if_ended_before(st, out)) return;
  if (st.restore) {
    auto positions = engine_state_reader(st);
    // A pass past the last one asked for never was (the place inside a pass is the operator's,
    // which checks it against what it holds).
    first_pass = positions->get_within<std::uint64_t>(
        0, st.demand == kUnbounded ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(st.demand), "the pass");
    resume_index = positions->get<std::uint64_t>();
    resume_inside_pass = positions->get_within<std::uint8_t>(0, 1, "whether it was inside a pass") != 0;
    st.output->set_iteration(first_pass);
    st.counters.epoch.store(first_pass, std::memory_order_relaxed);
  }
  // The cut: what was made before goes first, then the barrier; the source waits until the
  // checkpoint is complete.
  auto pause_for_cut = [&](std::uint64_t pass, std::uint64_t index, bool inside_pass) {
    if (!handover()) return false;
    const auto positions = [&](StateWriter& w) {
      w.put(pass);
      w.put(index);
      w.put<std::uint8_t>(inside_pass);
    };
    const std::string where = inside_pass ? fmt::format("pass {}, before element {}", st.first_output_epoch + pass, index)
                                          : fmt::format("before pass {}", st.first_output_epoch + pass);
    if (!save_stage(st, positions, where)) return false;
    out.push_back(Item::barrier());
    return handover() && wait_for_release(st);
  };
  for (std::uint64_t pass = first_pass; st.demand == kUnbounded || pass < static_cast<std::uint64_t>(st.demand); ++pass) {
    if (stopping.load() || st.output->skip_through() == kAllIterations) break;
    const std::uint64_t epoch = st.first_output_epoch + pass;
    if (!st.output->skipped(pass)) {
      const bool resumed_inside = resume_inside_pass && pass == first_pass;
      if (!resumed_inside && cut_requested(st) && !pause_for_cut(pass, 0, false)) return;
      try {
        if (!resumed_inside) st.source->begin_pass(epoch);
      } catch (const std::exception& e) {
        fail(fmt::format("{} could not begin pass {}: {}", stage_label(st), epoch, e.what()), &st);
        return;
      }
      ElementContext ctx{&st.info, epoch, resumed_inside ? resume_index : 0};
      // Where the pass stands (the studio and the report show it): its size as the operator
      // knows it now (a resumed share differs from a whole one).
      st.pass_elements.store(st.source->expected_elements(), std::memory_order_relaxed);
      st.pass_epoch.store(epoch, std::memory_order_relaxed);
      st.pass_position.store(ctx.index, std::memory_order_relaxed);
      while (!stopping.load(std::memory_order_relaxed) && !st.output->skipped(pass)) {
        if (cut_requested(st) && !pause_for_cut(pass, ctx.index, true)) return;
        Sample sample;
        try {
          if (!st.source->next(sample, ctx)) break;
        } catch (const std::exception& e) {
          if (!element_error(st, e.what(), epoch, ctx.index, sample.origin())) return;
          st.pass_position.store(++ctx.index, std::memory_order_relaxed);
          continue;
        }
        st.pass_position.store(++ctx.index, std::memory_order_relaxed);
        ++produced;
        produced_bytes += sample.nbytes();
        out.push_back(Item::element(std::move(sample)));
        // Hand over full chunks; to a waiting consumer, hand over sooner, but not element by
        // element from a fast source (each hand-off may wake a thread).
        bool due = out.size() >= kChunk ||
                   (st.output->consumer_waiting() && (out.size() >= kChunk / 4 || now_ns() - mark >= 50'000));
        if (due && !handover()) return;
      }
    }
    out.push_back(Item::end_of_iteration(pass));
    if (!handover()) return;
    st.counters.epoch.store(pass + 1, std::memory_order_relaxed);
  }
  out.push_back(Item::end_of_stream());
  if (handover()) stage_ended(st);
}

}  // namespace sluice
