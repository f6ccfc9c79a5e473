// Per-input stages (Stage.per_input): the maps, filters and aggregates after an interleave that run
// once per input, on the thread reading that input, as tf.data's
// interleave(lambda f: TextLineDataset(f).map(...).padded_batch(...)) does. The expand stage opens
// each input as usual and wraps the operator's cursor in a PerInputCursor, whose outputs are those
// of the last per-input stage: the interleave's readers read, map and batch one input each, in one
// cache, and only finished outputs (batches) cross threads.
#include "stage_per_input.hpp"

#include <algorithm>
#include <utility>

namespace sluice {

namespace {

// Thrown through the expand stage once a per-input stage has ended the run (the failure, naming
// that stage, is reported already).
class RunEndedInside final : public Error {
 public:
  using Error::Error;
};

// Collects what an aggregate pushes during one call.
class Collect final : public Emitter {
 public:
  explicit Collect(const std::atomic<bool>& stopping) : stopping_(stopping) {}
  std::vector<Sample> made;
  bool push(Sample sample) override {
    made.push_back(std::move(sample));
    return !stopping_.load(std::memory_order_relaxed);
  }

 private:
  const std::atomic<bool>& stopping_;
};

}  // namespace

Engine::Impl::PerInputCursor::PerInputCursor(Impl& impl, StageRuntime& head, std::unique_ptr<ExpandCursor> inner, std::uint64_t epoch,
                                             std::uint64_t input_index, std::string input_origin)
    : impl_(impl), head_(head), inner_(std::move(inner)), epoch_(epoch), base_index_(input_index << 32) {
  links_.reserve(head.fused.size());
  for (StageRuntime* member : head.fused) {
    Link link;
    link.st = member;
    Operator* op = member->op.get();
    // An aggregate (and a map or filter that keeps state) starts afresh with every input: its own
    // operator, started like the stage's; stateless ones are shared by every reader.
    if (member->aggregate || !member->spec->op->info.traits.stateless) {
      try {
        link.own = member->spec->op->info.create(member->spec->params);
        if (!link.own) throw Error("its operator created nothing");
        link.own->start(member->info);
        link.started = true;
      } catch (const std::exception& e) {
        finish_own(false);
        throw Error(fmt::format("{} could not start for input {}: {}", impl.stage_label(*member), input_origin, e.what()));
      }
      op = link.own.get();
    }
    link.map = member->map ? dynamic_cast<Map*>(op) : nullptr;
    link.filter = member->filter ? dynamic_cast<Filter*>(op) : nullptr;
    link.aggregate = member->aggregate ? dynamic_cast<Aggregate*>(op) : nullptr;
    if (impl.options.chunks) {
      if (auto* chunked = link.map ? dynamic_cast<ChunkedMap*>(op) : nullptr; chunked && chunked->maps_chunks()) link.chunked_map = chunked;
      if (link.aggregate) link.chunked_aggregate = dynamic_cast<ChunkedAggregate*>(op);
    }
    links_.push_back(std::move(link));
    member->counters.epoch.store(head.counters.epoch.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  for (std::size_t k = 0; k < links_.size(); ++k) {
    if (links_[k].aggregate) links_[k].aggregate->begin_iteration(epoch_);
    links_[k].hands_chunks_on = k + 1 < links_.size() && accepts_chunks_from(*links_[k].st, links_[k + 1]);
  }
  // Chunks go from one operator to the next where both take them; a producer built for 6.3 or
  // later may make Ragged columns, which only readers built for 6.3 know.
  if (!links_.empty() && impl.options.chunks && accepts_chunks_from(head_, links_.front()))
    inner_chunked_ = dynamic_cast<ChunkedExpandCursor*>(inner_.get());
}

Engine::Impl::PerInputCursor::~PerInputCursor() { finish_own(false); }

bool Engine::Impl::PerInputCursor::accepts_chunks_from(const StageRuntime& producer, const Link& reader) {
  return (reader.chunked_map || reader.chunked_aggregate) && (producer.registered->abi_minor < 3 || reader.st->registered->abi_minor >= 3);
}

void Engine::Impl::PerInputCursor::finish_own(bool complete) {
  for (auto& link : links_) {
    if (!link.started) continue;
    link.started = false;
    try {
      link.own->finish(complete);
    } catch (...) {
      if (complete) throw;
    }
  }
}

bool Engine::Impl::PerInputCursor::next(Sample& out) {
  while (pending_.empty()) {
    if (finished_) return false;
    // A filter dropping most of a long input may read it a long while before its next output:
    // a stop is seen at every read, not at the next output.
    if (impl_.stopping.load(std::memory_order_relaxed)) throw RunEndedInside("the run is stopping");
    std::vector<Sample> units(1);
    if (!stop_reading_ && read_inner(units.front())) {
      const std::uint64_t rows = rows_of(units.front());  // at least 1 (read_inner refuses empty chunks)
      const std::uint64_t made = run_from(0, units);
      made_per_row_ = std::max(made_per_row_.value_or(0), (made + rows - 1) / rows);
      continue;
    }
    end_input();
  }
  out = std::move(pending_.front());
  pending_.pop_front();
  return true;
}

std::size_t Engine::Impl::PerInputCursor::rows_to_read() const {
  if (!made_per_row_) return kPerInputFirstRows;
  if (*made_per_row_ == 0) return kChunkRows;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(kPerInputStepBytes / *made_per_row_, 1, kChunkRows));
}

bool Engine::Impl::PerInputCursor::read_inner(Sample& unit) {
  if (inner_chunked_) {
    Chunk chunk;
    if (!inner_chunked_->next_chunk(chunk, rows_to_read())) return false;
    if (chunk.rows() == 0) throw Error("the operator's next_chunk() gave a chunk of no rows");
    add(head_.counters.elements_out, chunk.rows());
    add(head_.counters.bytes_out, chunk.nbytes());
    unit = detail::carry(std::move(chunk));
    return true;
  }
  if (!inner_->next(unit)) return false;
  add(head_.counters.elements_out, 1);
  add(head_.counters.bytes_out, unit.nbytes());
  return true;
}

// The input ended (or a take had all it wanted): what each aggregate holds leaves, in order,
// through the stages after it.
void Engine::Impl::PerInputCursor::end_input() {
  for (std::size_t k = 0; k < links_.size(); ++k) {
    Link& link = links_[k];
    if (!link.aggregate || link.done) continue;
    Collect collect(impl_.stopping);
    const std::uint64_t t0 = now_ns();
    try {
      link.aggregate->end_iteration(epoch_, collect);
    } catch (const std::exception& e) {
      handle_error(link, e.what(), base_index_ + link.taken, "the end of its input");
    }
    account(link, 0, 0, collect.made, now_ns() - t0);
    if (!collect.made.empty()) run_from(k + 1, collect.made);
  }
  finish_own(true);
  finished_ = true;
}

void Engine::Impl::PerInputCursor::handle_error(Link& link, const char* what, std::uint64_t index, const std::string& origin) {
  if (impl_.stopping.load(std::memory_order_relaxed) && !impl_.handling_out_of_memory())
    throw RunEndedInside("the run is stopping");
  if (!impl_.element_error(*link.st, what, epoch_, index, origin))
    throw RunEndedInside(fmt::format("{} ended the run (see its message)", impl_.stage_label(*link.st)));
}

std::uint64_t Engine::Impl::PerInputCursor::account(Link& link, std::uint64_t rows_in, std::uint64_t bytes_in,
                                                    const std::vector<Sample>& made, std::uint64_t spent_ns) {
  std::uint64_t rows_out = 0, bytes_out = 0;
  for (const auto& sample : made) {
    rows_out += rows_of(sample);
    bytes_out += sample.nbytes();
  }
  auto& c = link.st->counters;
  if (rows_in) add(c.elements_in, rows_in);
  if (bytes_in) add(c.bytes_in, bytes_in);
  if (rows_out) add(c.elements_out, rows_out);
  if (bytes_out) add(c.bytes_out, bytes_out);
  add(c.busy_ns, spent_ns);
  member_ns_ += spent_ns;
  return bytes_out;
}

// Runs `units` (elements, or chunks carried as one sample) through links k, k + 1, ...: each
// link takes all of them before the next (one clock reading per link and call); what the last
// link makes is the cursor's output, as elements.
std::uint64_t Engine::Impl::PerInputCursor::run_from(std::size_t k, std::vector<Sample>& units) {
  std::uint64_t most_made = 0;
  for (; k < links_.size() && !units.empty(); ++k) {
    Link& link = links_[k];
    std::vector<Sample> made;
    std::uint64_t rows_in = 0, bytes_in = 0;
    const std::uint64_t t0 = now_ns();
    for (auto& unit : units) {
      if (link.done) break;
      rows_in += rows_of(unit);
      bytes_in += unit.nbytes();
      if (Chunk* chunk = chunk_in(unit)) {
        if (link.chunked_map || link.chunked_aggregate) {
          take_chunk(link, *chunk, made);
          continue;
        }
        for (std::size_t r = 0; r < chunk->rows() && !link.done; ++r) take_element(link, chunk->row(r), made);
        continue;
      }
      take_element(link, std::move(unit), made);
    }
    most_made = std::max(most_made, account(link, rows_in, bytes_in, made, now_ns() - t0));
    units.swap(made);
  }
  for (auto& unit : units) {
    if (Chunk* chunk = chunk_in(unit)) {
      for (std::size_t r = 0; r < chunk->rows(); ++r) pending_.push_back(chunk->row(r));
      continue;
    }
    pending_.push_back(std::move(unit));
  }
  return most_made;
}

void Engine::Impl::PerInputCursor::take_element(Link& link, Sample element, std::vector<Sample>& made) {
  const ElementContext ctx{&link.st->info, epoch_, base_index_ + link.taken++};
  OriginKeeper origin;
  origin.keep(element.shared_origin());  // the operator may consume the sample
  try {
    if (link.map) {
      made.push_back(link.map->map(std::move(element), ctx));
    } else if (link.filter) {
      if (link.filter->keep(element, ctx)) made.push_back(std::move(element));
    } else {
      Collect collect(impl_.stopping);
      const auto flow = link.aggregate->push(std::move(element), ctx, collect);
      for (auto& sample : collect.made) made.push_back(std::move(sample));
      if (flow == Aggregate::Flow::SkipRestOfIteration) stop_at(link);
    }
  } catch (const std::exception& e) {
    handle_error(link, e.what(), ctx.index, origin.text());
  }
}

void Engine::Impl::PerInputCursor::take_chunk(Link& link, const Chunk& chunk, std::vector<Sample>& made) {
  const std::uint64_t first_index = base_index_ + link.taken;
  link.taken += chunk.rows();
  if (link.chunked_map) {
    ChunkRowIssues issues(impl_, *link.st, chunk, epoch_, first_index);
    const ElementContext first{&link.st->info, epoch_, first_index};
    try {
      Chunk result = link.chunked_map->map_chunk(chunk, first, issues);
      if (result.rows() == 0) return;
      if (link.hands_chunks_on) {
        made.push_back(detail::carry(std::move(result)));
        return;
      }
      for (std::size_t r = 0; r < result.rows(); ++r) made.push_back(result.row(r));
      return;
    } catch (const RowError& e) {
      if (issues.refused) throw RunEndedInside(fmt::format("{} ended the run (see its message)", impl_.stage_label(*link.st)));
      handle_error(link, e.what(), first_index + e.row(), chunk.origin(std::min(e.row(), chunk.rows() - 1)).text());
      return;
    } catch (const std::exception&) {
      if (impl_.handling_out_of_memory()) throw;
    }
    // Not one row's fault, or an operator that does not say which row: the rows go through the
    // element form one by one, so that each is kept, skipped or named as alone.
    link.taken = first_index - base_index_;
    for (std::size_t r = 0; r < chunk.rows(); ++r) take_element(link, chunk.row(r), made);
    return;
  }
  Chunk rest = chunk;
  std::uint64_t index = first_index;
  while (rest.rows() > 0 && !link.done) {
    Collect collect(impl_.stopping);
    const ElementContext ctx{&link.st->info, epoch_, index};
    try {
      const auto flow = link.chunked_aggregate->push_chunk(rest, ctx, collect);
      for (auto& sample : collect.made) made.push_back(std::move(sample));
      if (flow == Aggregate::Flow::SkipRestOfIteration) stop_at(link);
      return;
    } catch (const RowError& e) {
      for (auto& sample : collect.made) made.push_back(std::move(sample));
      const std::size_t row = std::min(e.row(), rest.rows() - 1);
      handle_error(link, e.what(), index + row, rest.origin(row).text());
      rest = rest.slice(row + 1, rest.rows());
      index += row + 1;
    } catch (const std::exception&) {
      if (impl_.handling_out_of_memory()) throw;
      // The operator is as it was before the call: its rows go one by one.
      link.taken = index - base_index_;
      for (std::size_t r = 0; r < rest.rows() && !link.done; ++r) take_element(link, rest.row(r), made);
      return;
    }
  }
}

// An aggregate had all it wants of this input (a take): nothing before it is read any more.
void Engine::Impl::PerInputCursor::stop_at(Link& link) {
  link.done = true;
  stop_reading_ = true;
  for (auto& earlier : links_) {
    if (&earlier == &link) break;
    earlier.done = true;
  }
}

}  // namespace sluice
