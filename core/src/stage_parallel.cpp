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

void Engine::Impl::run_stateless(StageRuntime& st, int index) {
  const bool ordered = st.spec->keeps_order(graph.deterministic) && st.workers > 1;
  std::vector<Item> in, out;
  in.reserve(kChunk);
  for (;;) {
    if (st.tuned_workers && index >= st.active_workers.load(std::memory_order_relaxed) && !wait_until_active(st, index)) return;
    std::uint64_t seq = 0, epoch = 0, base_index = 0;
    std::uint64_t t0 = now_ns();
    {
      std::lock_guard pop_lock(st.pop_mutex);
      if (st.input_done) return;
      if (ordered) {
        // Workers run ahead of the oldest unfinished chunk by a bounded amount (memory).
        std::unique_lock lock(st.commit_mutex);
        std::uint64_t w0 = now_ns();
        st.commit_cv.wait(lock, [&] { return st.in_flight < kMaxChunksAhead * st.running_workers() || stopping.load(); });
        add(st.counters.blocked_ns, now_ns() - w0);
        t0 = now_ns();
      }
      if (stopping.load()) return;
      // A fair share of what is waiting, and no more than a few milliseconds of work, so that
      // at the end of the input no worker is left alone with a long chunk. Before the cost is
      // known, one element: a Python map taking a second each took a chunk of 64 at once, and
      // the first output (and a stop at exit) waited for all of them.
      const std::size_t share = std::max<std::size_t>(1, st.input->available() / static_cast<std::size_t>(st.running_workers()));
      const std::uint64_t cost = st.ns_per_element.load(std::memory_order_relaxed);
      const std::size_t by_time = cost > 0 ? static_cast<std::size_t>(std::max<std::uint64_t>(1, kChunkWorkNs / cost)) : 1;
      if (!st.input->pop(in, std::min({kChunk, share, by_time}))) return;
      add(st.counters.starved_ns, now_ns() - t0);
      if (!in.front().is_element()) {
        {
          std::unique_lock lock(st.commit_mutex);
          std::uint64_t w0 = now_ns();
          st.commit_cv.wait(lock, [&] { return st.in_flight == 0 || stopping.load(); });
          add(st.counters.blocked_ns, now_ns() - w0);
        }
        if (stopping.load()) return;
        Item control = std::move(in.front());
        if (control.kind == Item::Kind::Barrier) {
          // Every chunk before the barrier is committed: the stage stands between two elements.
          const auto positions = [&](StateWriter& w) {
            w.put(st.in_iteration);
            w.put(st.in_index);
          };
          if (!save_stage(st, positions, fmt::format("epoch {}, before element {}", st.first_input_epoch + st.in_iteration, st.in_index)))
            return;
        }
        if (control.kind == Item::Kind::EndOfStream) {
          st.input_done = true;
          if (st.tuned_workers) st.finish_input();
        }
        if (control.kind == Item::Kind::EndOfIteration) {
          if (st.sink) {
            try {
              st.sink->end_iteration(st.first_input_epoch + st.in_iteration);
            } catch (const std::exception& e) {
              fail(fmt::format("{} failed at the end of epoch {}: {}", stage_label(st), st.first_input_epoch + st.in_iteration,
                               e.what()), &st);
              return;
            }
          }
          ++st.in_iteration;
          st.in_index = 0;
          st.counters.epoch.store(st.in_iteration, std::memory_order_relaxed);
          for (auto* member : st.fused) member->counters.epoch.store(st.in_iteration, std::memory_order_relaxed);
        }
        if (!st.sink) {
          out.push_back(std::move(control));
          if (!flush(st, out)) return;
        } else if (st.input_done) {
          sinks_done.fetch_add(1);
        }
        if (st.input_done) {
          stage_ended(st);
          return;
        }
        continue;
      }
      seq = st.next_seq++;
      epoch = st.in_iteration;
      base_index = st.in_index;
      const std::uint64_t rows = st.chunked_map ? rows_of(in) : in.size();
      st.in_index += rows;
      std::lock_guard lock(st.commit_mutex);
      ++st.in_flight;
    }
    add(st.counters.elements_in, st.chunked_map ? rows_of(in) : in.size());
    add(st.counters.bytes_in, bytes_of(in));

    bool ok = true;
    ChunkIssues issues;
    if (!st.input->skipped(epoch)) {
      CoreHold core(*this, st);
      ok = core.held() && (st.chunked_map ? process_chunked_map(st, in, out, st.first_input_epoch + epoch, base_index, ordered ? &issues : nullptr)
                                          : process_chunk(st, in, out, st.first_input_epoch + epoch, base_index, ordered ? &issues : nullptr));
    }
    in.clear();
    std::uint64_t t2 = now_ns();

    if (!ordered) {
      if (ok && !st.sink && !out.empty()) {
        st.exit().observe_output(out);
        ok = st.exit().output->push(out);
      }
      out.clear();
      {
        std::lock_guard lock(st.commit_mutex);
        --st.in_flight;
        st.commit_cv.notify_all();
      }
    } else {
      std::unique_lock lock(st.commit_mutex);
      st.finished.emplace(seq, StageRuntime::FinishedChunk{std::move(out), std::move(issues), ok});
      out = {};
      // Taking the chunk in turn out of `finished` makes this thread its only committer.
      for (auto it = st.finished.find(st.next_commit); it != st.finished.end(); it = st.finished.find(st.next_commit)) {
        StageRuntime::FinishedChunk chunk = std::move(it->second);
        st.finished.erase(it);
        lock.unlock();
        report_issues(chunk.issues);
        if (chunk.ok && !st.sink) st.exit().observe_output(chunk.out);
        bool pushed = !chunk.ok || st.sink || chunk.out.empty() || st.exit().output->push(chunk.out);
        lock.lock();
        ++st.next_commit;
        --st.in_flight;
        st.commit_cv.notify_all();
        if (!chunk.ok || !pushed) {
          ok = false;
          break;
        }
      }
    }
    add(st.exit().counters.blocked_ns, now_ns() - t2);
    if (!ok || stopping.load()) return;
  }
}

bool Engine::Impl::apply(StageRuntime& st, Item& item, const ElementContext& ctx, bool& kept, ChunkIssues* deferred_failure,
                         OriginKeeper& origin) {
  origin.keep(item.sample.shared_origin());  // the operator may consume the sample
  try {
    if (st.map) {
      item.sample = st.map->map(std::move(item.sample), ctx);
    } else if (st.filter) {
      kept = st.filter->keep(item.sample, ctx);
    } else if (st.sink) {
      st.sink->consume(std::move(item.sample), ctx);
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
