// Aggregate stages (batch, shuffle, take, repeat, cache): one worker, iterations mapped to the
// input's, replays.
#include "engine_impl.hpp"

namespace sluice {

void Engine::Impl::run_aggregate(StageRuntime& st) {
  Aggregate& op = *st.aggregate;
  std::vector<Item> in, out;
  CollectingEmitter emitter(*this, st, out);
  std::uint64_t out_iteration = 0, in_iteration = 0, in_index = 0;
  std::int64_t inputs_in_group = 0;
  bool open = st.demand != 0;
  auto guarded = [&](auto&& call, const char* what) {
    try {
      call();
      return true;
    } catch (const std::exception& e) {
      fail(fmt::format("{} failed {} of epoch {}: {}", stage_label(st), what, st.first_output_epoch + out_iteration, e.what()), &st);
      return false;
    }
  };
  auto close_iteration = [&]() {
    if (!guarded([&] { op.end_iteration(st.first_output_epoch + out_iteration, emitter); }, "at the end")) return false;
    out.push_back(Item::end_of_iteration(out_iteration));
    if (!flush(st, out)) return false;
    ++out_iteration;
    st.counters.epoch.store(out_iteration, std::memory_order_relaxed);
    open = st.demand == kUnbounded || out_iteration < static_cast<std::uint64_t>(st.demand);
    emitter.iteration = out_iteration;
    return !open || guarded([&] { op.begin_iteration(st.first_output_epoch + out_iteration); }, "at the start");
  };
  if (open && !guarded([&] { op.begin_iteration(st.first_output_epoch); }, "at the start")) return;

  // Busy time is the time between two pops, less what flushing spent waiting downstream.
  std::uint64_t mark = now_ns(), blocked_at_mark = st.counters.blocked_ns.load();
  auto account_busy = [&](std::uint64_t now) {
    std::uint64_t blocked = st.counters.blocked_ns.load();
    std::uint64_t spent = now - mark, waited = blocked - blocked_at_mark;
    add(st.counters.busy_ns, spent > waited ? spent - waited : 0);
    blocked_at_mark = blocked;
  };
  for (;;) {
    std::uint64_t t0 = now_ns();
    account_busy(t0);
    if (!st.input->pop(in, kChunk)) return;
    mark = now_ns();
    add(st.counters.starved_ns, mark - t0);
    if (in.front().kind == Item::Kind::EndOfStream) break;
    if (in.front().kind == Item::Kind::EndOfIteration) {
      // Repeating forever over a pass that yielded nothing would spin without end: as in
      // tf.data, an empty pass ends the repetition.
      if (in_index == 0 && st.passes_per_iteration == kUnbounded) skip_input(st, kAllIterations);
      ++in_iteration;
      in_index = 0;
      ++inputs_in_group;
      if (open && st.passes_per_iteration > 0 && inputs_in_group == st.passes_per_iteration) {
        inputs_in_group = 0;
        if (!close_iteration()) return;
      }
      continue;
    }
    add(st.counters.elements_in, in.size());
    add(st.counters.bytes_in, bytes_of(in));
    for (auto& item : in) {
      ElementContext ctx{&st.info, st.first_input_epoch + in_iteration, in_index++};
      if (st.input->skipped(in_iteration) || !open) continue;
      const Origin origin = item.sample.shared_origin();
      try {
        if (op.push(std::move(item.sample), ctx, emitter) == Aggregate::Flow::SkipRestOfIteration)
          skip_input(st, static_cast<std::int64_t>(in_iteration));
      } catch (const std::exception& e) {
        if (!element_error(st, e.what(), ctx.epoch, ctx.index, origin.text())) return;
      }
      if (stopping.load(std::memory_order_relaxed)) return;
    }
    if (!flush(st, out)) return;
  }
  // The input ended: close a partly received group (repeat whose input was cut short), then
  // replay the iterations the input did not provide.
  if (open && (inputs_in_group > 0 || st.passes_per_iteration == kUnbounded) && !close_iteration()) return;
  while (open && !stopping.load() && st.output->skip_through() != kAllIterations) {
    bool replayed = false;
    if (!guarded([&] { replayed = op.replay(st.first_output_epoch + out_iteration, emitter); }, "replaying")) return;
    if (!replayed || !close_iteration()) break;
  }
  account_busy(now_ns());
  out.push_back(Item::end_of_stream());
  flush(st, out);
}

}  // namespace sluice
