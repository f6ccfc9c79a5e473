// Map, filter and sink stages: ordered parallel workers over chunks, fused groups of stateless
// maps, autotuned worker counts.
#include "engine_impl.hpp"

namespace sluice {

bool Engine::Impl::wait_until_active(StageRuntime& st, int index) {
  std::unique_lock lock(st.park_mutex);
  while (index >= st.active_workers.load() && !stopping.load() && !st.input_finished.load())
    st.park_cv.wait_for(lock, std::chrono::milliseconds(50));
  return !stopping.load() && !st.input_finished.load();
}

// One worker of a map, filter or sink stage (a fused group of them as one): it takes a chunk of
// the input in order, processes it concurrently with the stage's other workers, and commits its
// outputs in input order (deterministic) or as it finishes. Control items (barriers, ends) wait
// until every earlier chunk is committed.
class Engine::Impl::ParallelStage {
 public:
  ParallelStage(Impl& engine, StageRuntime& st, int worker)
      : engine_(engine), st_(st), worker_(worker), ordered_(st.spec->keeps_order(engine.graph.deterministic) && st.workers > 1) {
    in_.reserve(kChunk);
  }
  void run();

 private:
  enum class Took { Elements, Control, Stop };
  // ---- the steps of run() ----
  bool wait_while_parked();
  Took take_chunk();
  bool process_chunk();
  bool commit(bool ok);

  void wait_for_room_ahead(std::uint64_t& t0);
  std::size_t chunk_size() const;
  bool take_control();
  bool end_sink_iteration();
  bool commit_as_finished(bool ok);
  bool commit_in_order(bool ok);

  Impl& engine_;
  StageRuntime& st_;
  const int worker_;
  const bool ordered_;
  std::vector<Item> in_, out_;
  ChunkIssues issues_;
  // The chunk taken: its place among the stage's chunks, its iteration and first element's index.
  std::uint64_t seq_ = 0, epoch_ = 0, base_index_ = 0;
};

void Engine::Impl::run_stateless(StageRuntime& st, int index) { ParallelStage(*this, st, index).run(); }

void Engine::Impl::ParallelStage::run() {
  for (;;) {
    if (!wait_while_parked()) return;
    const Took took = take_chunk();
    if (took == Took::Stop) return;
    if (took == Took::Control) continue;
    const bool ok = process_chunk();
    if (!commit(ok) || engine_.stopping.load()) return;
  }
}

// A tuned stage's worker above the active count waits; false when it should leave.
bool Engine::Impl::ParallelStage::wait_while_parked() {
  return !st_.tuned_workers || worker_ < st_.active_workers.load(std::memory_order_relaxed) || engine_.wait_until_active(st_, worker_);
}

// The next chunk of the input, under the stage's pop lock: elements (their place noted), or a
// control item handled here.
Engine::Impl::ParallelStage::Took Engine::Impl::ParallelStage::take_chunk() {
  std::uint64_t t0 = now_ns();
  {
    std::lock_guard pop_lock(st_.pop_mutex);
    if (st_.input_done) return Took::Stop;
    if (ordered_) wait_for_room_ahead(t0);
    if (engine_.stopping.load()) return Took::Stop;
    if (!st_.input->pop(in_, chunk_size())) return Took::Stop;
    add(st_.counters.starved_ns, now_ns() - t0);
    if (!in_.front().is_element()) return take_control() ? Took::Control : Took::Stop;
    seq_ = st_.next_seq++;
    epoch_ = st_.in_iteration;
    base_index_ = st_.in_index;
    const std::uint64_t rows = st_.chunked_map ? rows_of(in_) : in_.size();
    st_.in_index += rows;
    std::lock_guard lock(st_.commit_mutex);
    ++st_.in_flight;
  }
  add(st_.counters.elements_in, st_.chunked_map ? rows_of(in_) : in_.size());
  add(st_.counters.bytes_in, bytes_of(in_));
  return Took::Elements;
}

// Workers run ahead of the oldest unfinished chunk by a bounded amount (memory).
void Engine::Impl::ParallelStage::wait_for_room_ahead(std::uint64_t& t0) {
  std::unique_lock lock(st_.commit_mutex);
  std::uint64_t w0 = now_ns();
  st_.commit_cv.wait(lock, [&] { return st_.in_flight < kMaxChunksAhead * st_.running_workers() || engine_.stopping.load(); });
  add(st_.counters.blocked_ns, now_ns() - w0);
  t0 = now_ns();
}

// A fair share of what is waiting, and no more than a few milliseconds of work, so that at the
// end of the input no worker is left alone with a long chunk. Before the cost is known, one
// element: a Python map taking a second each took a chunk of 64 at once, and the first output
// (and a stop at exit) waited for all of them.
std::size_t Engine::Impl::ParallelStage::chunk_size() const {
  const std::size_t share = std::max<std::size_t>(1, st_.input->available() / static_cast<std::size_t>(st_.running_workers()));
  const std::uint64_t cost = st_.ns_per_element.load(std::memory_order_relaxed);
  const std::size_t by_time = cost > 0 ? static_cast<std::size_t>(std::max<std::uint64_t>(1, kChunkWorkNs / cost)) : 1;
  return std::min({kChunk, share, by_time});
}

// A barrier, an iteration's end or the stream's, once every chunk before it is committed; false
// when this worker is to leave.
bool Engine::Impl::ParallelStage::take_control() {
  {
    std::unique_lock lock(st_.commit_mutex);
    std::uint64_t w0 = now_ns();
    st_.commit_cv.wait(lock, [&] { return st_.in_flight == 0 || engine_.stopping.load(); });
    add(st_.counters.blocked_ns, now_ns() - w0);
  }
  if (engine_.stopping.load()) return false;
  Item control = std::move(in_.front());
  in_.clear();
  if (control.kind == Item::Kind::Barrier) {
    // Every chunk before the barrier is committed: the stage stands between two elements.
    const auto positions = [&](StateWriter& w) {
      w.put(st_.in_iteration);
      w.put(st_.in_index);
    };
    if (!engine_.save_stage(st_, positions, fmt::format("epoch {}, before element {}", st_.first_input_epoch + st_.in_iteration, st_.in_index)))
      return false;
  }
  if (control.kind == Item::Kind::EndOfStream) {
    st_.input_done = true;
    if (st_.tuned_workers) st_.finish_input();
  }
  if (control.kind == Item::Kind::EndOfIteration && !end_sink_iteration()) return false;
  if (!st_.sink) {
    out_.push_back(std::move(control));
    if (!engine_.flush(st_, out_)) return false;
  } else if (st_.input_done) {
    engine_.sinks_done.fetch_add(1);
  }
  if (st_.input_done) {
    engine_.stage_ended(st_);
    return false;
  }
  return true;
}

bool Engine::Impl::ParallelStage::end_sink_iteration() {
  if (st_.sink) {
    try {
      st_.sink->end_iteration(st_.first_input_epoch + st_.in_iteration);
    } catch (const std::exception& e) {
      engine_.fail(fmt::format("{} failed at the end of epoch {}: {}", engine_.stage_label(st_), st_.first_input_epoch + st_.in_iteration,
                               e.what()),
                   &st_);
      return false;
    }
  }
  ++st_.in_iteration;
  st_.in_index = 0;
  st_.counters.epoch.store(st_.in_iteration, std::memory_order_relaxed);
  for (auto* member : st_.fused) member->counters.epoch.store(st_.in_iteration, std::memory_order_relaxed);
  return true;
}

// The chunk through the stage (or its fused group), holding a core of the budget; false when the
// run must stop.
bool Engine::Impl::ParallelStage::process_chunk() {
  bool ok = true;
  issues_ = ChunkIssues{};
  if (!st_.input->skipped(epoch_)) {
    CoreHold core(engine_, st_);
    ChunkIssues* deferred = ordered_ ? &issues_ : nullptr;
    ok = core.held() && (st_.chunked_map ? engine_.process_chunked_map(st_, in_, out_, st_.first_input_epoch + epoch_, base_index_, deferred)
                                         : engine_.process_chunk(st_, in_, out_, st_.first_input_epoch + epoch_, base_index_, deferred));
  }
  in_.clear();
  return ok;
}

bool Engine::Impl::ParallelStage::commit(bool ok) {
  const std::uint64_t t2 = now_ns();
  ok = ordered_ ? commit_in_order(ok) : commit_as_finished(ok);
  add(st_.exit().counters.blocked_ns, now_ns() - t2);
  return ok;
}

bool Engine::Impl::ParallelStage::commit_as_finished(bool ok) {
  if (ok && !st_.sink && !out_.empty()) {
    st_.exit().observe_output(out_);
    ok = st_.exit().output->push(out_);
  }
  out_.clear();
  std::lock_guard lock(st_.commit_mutex);
  --st_.in_flight;
  st_.commit_cv.notify_all();
  return ok;
}

bool Engine::Impl::ParallelStage::commit_in_order(bool ok) {
  std::unique_lock lock(st_.commit_mutex);
  st_.finished.emplace(seq_, StageRuntime::FinishedChunk{std::move(out_), std::move(issues_), ok});
  out_ = {};
  // Taking the chunk in turn out of `finished` makes this thread its only committer.
  for (auto it = st_.finished.find(st_.next_commit); it != st_.finished.end(); it = st_.finished.find(st_.next_commit)) {
    StageRuntime::FinishedChunk chunk = std::move(it->second);
    st_.finished.erase(it);
    lock.unlock();
    engine_.report_issues(chunk.issues);
    if (chunk.ok && !st_.sink) st_.exit().observe_output(chunk.out);
    bool pushed = !chunk.ok || st_.sink || chunk.out.empty() || st_.exit().output->push(chunk.out);
    lock.lock();
    ++st_.next_commit;
    --st_.in_flight;
    st_.commit_cv.notify_all();
    if (!chunk.ok || !pushed) return false;
  }
  return true;
}

bool Engine::Impl::apply(StageRuntime& st, Item& item, const ElementContext& ctx, bool& kept, ChunkIssues* deferred_failure,
                         OriginKeeper& origin) {
  origin.keep(item.sample.shared_origin());  // the operator may consume the sample
  try {
    if (st.map) {
      item.sample = st.map->map(std::move(item.sample), ctx);
      if (st.stamps_read_positions) item.sample.set_read_position(ctx.epoch, static_cast<std::int64_t>(ctx.index));
      if (st.draws_keys) detail::stamp_draw_key(item.sample, st.spec->id, ctx.epoch, ctx.index);
    } else if (st.filter) {
      kept = st.filter->keep(item.sample, ctx);
    } else if (st.sink) {
      if (st.ledger) {
        const Origin delivered = item.sample.shared_origin();
        st.sink->consume(std::move(item.sample), ctx);
        st.ledger->deliver(delivered);
      } else {
        st.sink->consume(std::move(item.sample), ctx);
      }
    }
    return true;
  } catch (const std::exception& e) {
    kept = false;
    return element_error(st, e.what(), ctx.epoch, ctx.index, origin.text(), deferred_failure);
  }
}

bool Engine::Impl::process_chunk(StageRuntime& st, std::vector<Item>& in, std::vector<Item>& out, std::uint64_t epoch, std::uint64_t base_index, ChunkIssues* deferred_failure) {
  std::vector<StageRuntime*> members{&st};
  members.insert(members.end(), st.fused.begin(), st.fused.end());
  struct Tally {
    std::uint64_t in = 0, in_bytes = 0, out = 0, out_bytes = 0, busy = 0;
  };
  std::vector<Tally> tally(members.size());
  bool ok = true;
  OriginKeeper origin;
  const std::uint64_t start = now_ns();
  if (members.size() > 1 && st.ns_per_element.load(std::memory_order_relaxed) > kElementMajorNs) {
    for (std::size_t i = 0; i < in.size() && ok; ++i) {
      Item& item = in[i];
      ElementContext ctx{nullptr, epoch, base_index + i};
      bool kept = true;
      std::uint64_t t = now_ns();
      for (std::size_t m = 0; m < members.size() && kept && ok; ++m) {
        if (m > 0) {
          ++tally[m].in;
          tally[m].in_bytes += item.sample.nbytes();
        }
        ctx.stage = &members[m]->info;
        ok = apply(*members[m], item, ctx, kept, deferred_failure, origin);
        if (kept) {
          ++tally[m].out;
          tally[m].out_bytes += item.sample.nbytes();
        }
        std::uint64_t t2 = now_ns();
        tally[m].busy += t2 - t;
        t = t2;
      }
      if (kept && ok) out.push_back(std::move(item));
      if (stopping.load(std::memory_order_relaxed)) ok = false;
    }
  } else {
    std::vector<std::uint64_t> positions(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) positions[i] = base_index + i;
    for (std::size_t m = 0; m < members.size() && ok; ++m) {
      if (m > 0) {
        in.swap(out);
        out.clear();
        tally[m].in = in.size();
        tally[m].in_bytes = bytes_of(in);
      }
      const std::uint64_t t0 = now_ns();
      ElementContext ctx{&members[m]->info, epoch, 0};
      std::size_t kept_count = 0;
      for (std::size_t i = 0; i < in.size() && ok; ++i) {
        ctx.index = positions[i];
        bool kept = true;
        const std::size_t sink_bytes = members[m]->sink ? in[i].sample.nbytes() : 0;
        ok = apply(*members[m], in[i], ctx, kept, deferred_failure, origin);
        if (kept && ok) {
          ++tally[m].out;
          tally[m].out_bytes += sink_bytes;
          if (!members[m]->sink) {
            tally[m].out_bytes += in[i].sample.nbytes();
            positions[kept_count++] = positions[i];
            out.push_back(std::move(in[i]));
          }
        }
        if (stopping.load(std::memory_order_relaxed)) ok = false;
      }
      positions.resize(kept_count);
      tally[m].busy = now_ns() - t0;
    }
  }
  for (std::size_t m = 0; m < members.size(); ++m) {
    auto& c = members[m]->counters;
    if (m > 0) {
      add(c.elements_in, tally[m].in);
      add(c.bytes_in, tally[m].in_bytes);
    }
    add(c.elements_out, tally[m].out);
    add(c.bytes_out, tally[m].out_bytes);
    add(c.busy_ns, tally[m].busy);
  }
  if (!in.empty()) {
    const std::uint64_t per_element = (now_ns() - start) / in.size();
    st.ns_per_element.store(per_element, std::memory_order_relaxed);
  }
  return ok;
}

bool Engine::Impl::process_chunked_map(StageRuntime& st, std::vector<Item>& in, std::vector<Item>& out, std::uint64_t epoch,
                                       std::uint64_t base_index, ChunkIssues* deferred_failure) {
  const std::uint64_t start = now_ns();
  std::uint64_t position = base_index, rows_out = 0, bytes_out = 0;
  std::size_t rows_in = 0;
  bool ok = true;
  OriginKeeper origin;
  for (std::size_t i = 0; i < in.size() && ok; ++i) {
    Item& item = in[i];
    Chunk* chunk = chunk_in(item.sample);
    if (!chunk) {  // an element, from a producer that hands on no chunks
      ElementContext ctx{&st.info, epoch, position++};
      bool kept = true;
      ++rows_in;
      ok = apply(st, item, ctx, kept, deferred_failure, origin);
      if (kept && ok) {
        ++rows_out;
        bytes_out += item.sample.nbytes();
        out.push_back(std::move(item));
      }
      continue;
    }
    const std::size_t rows = chunk->rows();
    rows_in += rows;
    const ElementContext first{&st.info, epoch, position};
    position += rows;
    ChunkRowIssues issues(*this, st, *chunk, epoch, first.index, deferred_failure);
    try {
      Chunk result = st.chunked_map->map_chunk(*chunk, first, issues);
      item.sample = Sample();  // the input's memory goes back now, not with the chunk of items
      if (st.stamps_read_positions && result.rows() == rows) result.set_read_position(epoch, static_cast<std::int64_t>(first.index));
      else if (st.stamps_read_positions) result.forget_read_positions();  // (rows left out: kept by value)
      rows_out += result.rows();
      bytes_out += result.nbytes();
      if (st.emits_chunks && result.rows() > 0) {
        add(st.counters.chunks_out, 1);
        add(st.counters.chunked_elements_out, result.rows());
      }
      detail::hand_on(std::move(result), st.emits_chunks, out);
    } catch (const RowError& e) {
      ok = issues.refused || (element_error(st, e.what(), epoch, first.index + e.row(), chunk->origin(e.row()).text(), deferred_failure), false);
    } catch (const std::exception&) {
      if (handling_out_of_memory()) {
        fail_or_defer(st, out_of_memory_message(st), deferred_failure);
        ok = false;
        continue;
      }
      // Not one row's fault, or an operator that does not say which row: the chunk's rows go
      // through the element form one by one, so that each is kept, skipped or named as alone.
      for (std::size_t r = 0; r < rows && ok; ++r) {
        Item row = Item::element(chunk->row(r));
        bool kept = true;
        ok = apply(st, row, ElementContext{&st.info, epoch, first.index + r}, kept, deferred_failure, origin);
        if (kept && ok) {
          ++rows_out;
          bytes_out += row.sample.nbytes();
          out.push_back(std::move(row));
        }
      }
    }
    if (stopping.load(std::memory_order_relaxed)) ok = false;
  }
  add(st.counters.elements_out, rows_out);
  add(st.counters.bytes_out, bytes_out);
  const std::uint64_t spent = now_ns() - start;
  add(st.counters.busy_ns, spent);
  if (rows_in > 0) st.ns_per_element.store(spent / in.size(), std::memory_order_relaxed);  // per item: sizes the next pop
  return ok;
}

}  // namespace sluice
