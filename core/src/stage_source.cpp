// Source stages: passes over the data, handed downstream in chunks.
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
  for (std::uint64_t pass = 0; st.demand == kUnbounded || pass < static_cast<std::uint64_t>(st.demand); ++pass) {
    if (stopping.load() || st.output->skip_through() == kAllIterations) break;
    const std::uint64_t epoch = st.first_output_epoch + pass;
    if (!st.output->skipped(pass)) {
      try {
        st.source->begin_pass(epoch);
      } catch (const std::exception& e) {
        fail(fmt::format("{} could not begin pass {}: {}", stage_label(st), epoch, e.what()), &st);
        return;
      }
      ElementContext ctx{&st.info, epoch, 0};
      while (!stopping.load(std::memory_order_relaxed) && !st.output->skipped(pass)) {
        Sample sample;
        try {
          if (!st.source->next(sample, ctx)) break;
        } catch (const std::exception& e) {
          if (!element_error(st, e.what(), epoch, ctx.index, sample.origin())) return;
          ++ctx.index;
          continue;
        }
        ++ctx.index;
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
  handover();
}

}  // namespace sluice
