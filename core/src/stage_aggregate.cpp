// Aggregate stages (batch, shuffle, take, repeat, cache): one thread takes the inputs in order
// (helpers may assemble the outputs: output_assembly.hpp), iterations mapped to the input's,
// replays.
#include <optional>

#include "engine_impl.hpp"
#include "sluice/core/output_rows.hpp"

namespace sluice {

namespace {

// The outputs of a replay (cache), counted so that a checkpoint taken in the middle of one can
// say how far it got; a resumed run replays that iteration again and drops what it had given.
class ReplayEmitter final : public Emitter {
 public:
  ReplayEmitter(Emitter& out, std::function<bool(std::uint64_t)> cut_hook) : out_(out), cut_hook_(std::move(cut_hook)) {}
  std::uint64_t given = 0, drop = 0;
  bool push(Sample sample) override {
    if (drop > 0) {
      --drop;
      ++given;
      return true;
    }
    if (!cut_hook_(given)) return false;
    ++given;
    return out_.push(std::move(sample));
  }

 private:
  Emitter& out_;
  std::function<bool(std::uint64_t)> cut_hook_;
};

}  // namespace

bool Engine::Impl::CollectingEmitter::settle(bool all) {
  if (!assembly_) return true;
  // A few outputs per thread in flight keep every thread busy; more would only hold memory.
  const std::size_t most_pending = all ? 0 : 2 * static_cast<std::size_t>(st_.workers);
  made_.clear();
  try {
    assembly_->collect(made_, most_pending, impl_.stopping);
  } catch (const std::exception& e) {
    impl_.fail(handling_out_of_memory() ? impl_.out_of_memory_message(st_)
                                        : fmt::format("{} failed assembling an output of epoch {}: {}", impl_.stage_label(st_),
                                                      st_.first_output_epoch + iteration, e.what()),
               &st_);
    return false;
  } catch (...) {
    impl_.fail(fmt::format("{} failed assembling an output of epoch {}: its operator threw something that is not an exception",
                           impl_.stage_label(st_), st_.first_output_epoch + iteration),
               &st_);
    return false;
  }
  // Outputs of an iteration downstream stopped wanting (a take satisfied) go no further.
  const bool keep = !st_.exit().output->skipped(iteration);
  for (auto& sample : made_) {
    attach_rows(sample);
    if (keep && !hand_on(std::move(sample))) return false;
  }
  made_.clear();
  return !impl_.stopping.load(std::memory_order_relaxed);
}

void Engine::Impl::CollectingEmitter::attach_rows(Sample& output) {
  if (!st_.stacks) return;
  const std::size_t rows = std::min<std::size_t>(static_cast<std::size_t>(st_.stacks->inputs_per_output()), pending_rows_.size());
  if (rows == 0) return;
  const std::vector<Origin> stacked(pending_rows_.begin(), pending_rows_.begin() + static_cast<std::ptrdiff_t>(rows));
  pending_rows_.erase(pending_rows_.begin(), pending_rows_.begin() + static_cast<std::ptrdiff_t>(rows));
  const Origin& first = output.shared_origin();
  const Origin with_rows = origin_with_rows(first, stacked);
  output.set_origin(with_rows.where, with_rows.record, with_rows.byte_offset);
  output.set_read_position(with_rows.read_epoch, with_rows.read_index);
}

void Engine::Impl::run_aggregate(StageRuntime& st) {
  Aggregate& op = *st.aggregate;
  std::vector<Item> in, out;
  // Parallelism above 1 (an operator that assembles in parallel): workers - 1 threads assemble
  // outputs, and this one when it is ahead of them. Declared before the emitter, so that its
  // threads are joined after the emitter is gone, on every way out of this function.
  std::optional<detail::OutputAssembly> assembly;
  if (st.workers > 1)
    assembly.emplace(
        st.workers - 1, [name = st.spec->id + "+"] { name_this_thread(name); },
        [&st](std::uint64_t ns) { add(st.counters.busy_ns, ns); });
  CollectingEmitter emitter(*this, st, out, assembly ? &*assembly : nullptr);
  std::uint64_t out_iteration = 0, in_iteration = 0, in_index = 0;
  std::int64_t inputs_in_group = 0;
  bool open = st.demand != 0;
  bool replaying = false;       // the input ended; iterations come from replay()
  std::uint64_t replay_drop = 0;  // a resumed replay: outputs given before the checkpoint
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
    if (!emitter.settle(true)) return false;
    emitter.iteration_ended();
    out.push_back(Item::end_of_iteration(out_iteration));
    if (!flush(st, out)) return false;
    ++out_iteration;
    st.counters.epoch.store(out_iteration, std::memory_order_relaxed);
    open = st.demand == kUnbounded || out_iteration < static_cast<std::uint64_t>(st.demand);
    emitter.iteration = out_iteration;
    return !open || guarded([&] { op.begin_iteration(st.first_output_epoch + out_iteration); }, "at the start");
  };
  // The cut reaches the stage between two inputs, or between two outputs of a replay: what it
  // emitted goes first, then its state, then the barrier.
  auto save_for_cut = [&](std::uint64_t replay_given) {
    if (!emitter.settle(true) || !flush(st, out)) return false;
    const auto positions = [&](StateWriter& w) {
      w.put(out_iteration);
      w.put(in_iteration);
      w.put(in_index);
      w.put(inputs_in_group);
      w.put<std::uint8_t>(open);
      w.put<std::uint8_t>(replaying);
      w.put(replay_given);
    };
    const std::string where = replaying ? fmt::format("replaying epoch {}, {} elements given", st.first_output_epoch + out_iteration, replay_given)
                                        : fmt::format("epoch {}, {} inputs taken", st.first_input_epoch + in_iteration, in_index);
    if (!save_stage(st, positions, where)) return false;
    out.push_back(Item::barrier());
    return flush(st, out);
  };
  if (end_if_ended_before(st, out)) return;
  if (st.restore) {
    auto positions = engine_state_reader(st);
    out_iteration = positions->get<std::uint64_t>();
    in_iteration = positions->get<std::uint64_t>();
    in_index = positions->get<std::uint64_t>();
    inputs_in_group = positions->get<std::int64_t>();
    open = positions->get<std::uint8_t>() != 0;
    replaying = positions->get<std::uint8_t>() != 0;
    replay_drop = positions->get<std::uint64_t>();
    emitter.iteration = out_iteration;
    emitter.held_when_restored(st.restored_rows);
    st.output->set_iteration(out_iteration);
    st.counters.epoch.store(out_iteration, std::memory_order_relaxed);
  } else if (open && !guarded([&] { op.begin_iteration(st.first_output_epoch); }, "at the start")) {
    return;
  }

  // Busy time is the time between two pops, less what flushing spent waiting downstream and
  // what waiting for the assembly threads took (they count their own).
  auto waited_total = [&] { return st.counters.blocked_ns.load() + (assembly ? assembly->waited_ns() : 0); };
  std::uint64_t mark = now_ns(), waited_at_mark = waited_total();
  auto account_busy = [&](std::uint64_t now) {
    const std::uint64_t waited_now = waited_total();
    std::uint64_t spent = now - mark, waited = waited_now - waited_at_mark;
    add(st.counters.busy_ns, spent > waited ? spent - waited : 0);
    waited_at_mark = waited_now;
  };
  OriginKeeper origin;  // of the element being pushed, for a message
  while (!replaying) {
    std::uint64_t t0 = now_ns();
    account_busy(t0);
    if (!st.input->pop(in, kChunk)) return;
    mark = now_ns();
    add(st.counters.starved_ns, mark - t0);
    if (in.front().kind == Item::Kind::EndOfStream) break;
    if (in.front().kind == Item::Kind::Barrier) {
      if (!save_for_cut(0)) return;
      continue;
    }
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
    add(st.counters.elements_in, st.chunked_aggregate ? rows_of(in) : in.size());
    add(st.counters.bytes_in, bytes_of(in));
    for (auto& item : in) {
      if (Chunk* chunk = st.chunked_aggregate ? chunk_in(item.sample) : nullptr) {
        const std::uint64_t first_index = in_index;
        in_index += chunk->rows();
        if (st.input->skipped(in_iteration) || !open) continue;
        // Rows from `done` on are still to push; a refused row is reported (or ends the run) and
        // the rows after it go on in a new call, as elements after a refused one do.
        Chunk rest = detail::take_chunk(item.sample);
        std::size_t done = 0;
        while (rest.rows() > 0) {
          const ElementContext ctx{&st.info, st.first_input_epoch + in_iteration, first_index + done};
          if (st.stacks)
            for (std::size_t r = 0; r < rest.rows(); ++r) emitter.took(rest.origin(r));
          try {
            if (st.chunked_aggregate->push_chunk(rest, ctx, emitter) == Aggregate::Flow::SkipRestOfIteration)
              skip_input(st, static_cast<std::int64_t>(in_iteration));
            break;
          } catch (const RowError& e) {
            const std::size_t row = std::min(e.row(), rest.rows() - 1);
            emitter.took_back(rest.rows() - row);  // the refused row and those after it, pushed again below
            if (!element_error(st, e.what(), ctx.epoch, ctx.index + row, rest.origin(row).text())) return;
            rest = rest.slice(row + 1, rest.rows());
            done += row + 1;
          } catch (const std::exception&) {
            if (handling_out_of_memory()) {
              fail(out_of_memory_message(st), &st);
              return;
            }
            // Not one row's fault, or an operator that does not say which row: the rows go
            // through the element form one by one, each taken, skipped or named as alone.
            emitter.took_back(rest.rows());
            for (std::size_t r = 0; r < rest.rows(); ++r) {
              const ElementContext row_ctx{&st.info, ctx.epoch, ctx.index + r};
              emitter.took(rest.origin(r));
              try {
                if (op.push(rest.row(r), row_ctx, emitter) == Aggregate::Flow::SkipRestOfIteration) {
                  skip_input(st, static_cast<std::int64_t>(in_iteration));
                  break;
                }
              } catch (const std::exception& e) {
                emitter.took_back(1);
                if (!element_error(st, e.what(), row_ctx.epoch, row_ctx.index, rest.origin(r).text())) return;
              }
            }
            break;
          }
          if (stopping.load(std::memory_order_relaxed)) return;
        }
        if (stopping.load(std::memory_order_relaxed)) return;
        continue;
      }
      ElementContext ctx{&st.info, st.first_input_epoch + in_iteration, in_index++};
      if (st.input->skipped(in_iteration) || !open) continue;
      origin.keep(item.sample.shared_origin());
      emitter.took(item.sample.shared_origin());
      try {
        if (op.push(std::move(item.sample), ctx, emitter) == Aggregate::Flow::SkipRestOfIteration)
          skip_input(st, static_cast<std::int64_t>(in_iteration));
      } catch (const std::exception& e) {
        emitter.took_back(1);
        if (!element_error(st, e.what(), ctx.epoch, ctx.index, origin.text())) return;
      }
      if (stopping.load(std::memory_order_relaxed)) return;
    }
    if (!emitter.settle(false) || !flush(st, out)) return;
  }
  // The input ended: close a partly received group (repeat whose input was cut short), then
  // replay the iterations the input did not provide. No barrier comes from an input that ended:
  // a checkpoint is cut here, between replays or between two outputs of one.
  if (!replaying) {
    replaying = true;
    if (open && (inputs_in_group > 0 || st.passes_per_iteration == kUnbounded) && !close_iteration()) return;
  }
  auto cut_during_replay = [&](std::uint64_t given) {
    if (!cut_requested(st)) return !stopping.load(std::memory_order_relaxed);
    return save_for_cut(given) && wait_for_release(st);
  };
  ReplayEmitter replay_out(emitter, cut_during_replay);
  while (open && !stopping.load() && st.output->skip_through() != kAllIterations) {
    if (cut_requested(st) && !(save_for_cut(0) && wait_for_release(st))) return;
    bool replayed = false;
    replay_out.given = 0;
    replay_out.drop = std::exchange(replay_drop, 0);
    if (!guarded([&] { replayed = op.replay(st.first_output_epoch + out_iteration, replay_out); }, "replaying")) return;
    if (stopping.load()) return;
    if (!replayed || !close_iteration()) break;
  }
  if (!emitter.settle(true)) return;
  account_busy(now_ns());
  out.push_back(Item::end_of_stream());
  if (flush(st, out)) stage_ended(st);
}

}  // namespace sluice
