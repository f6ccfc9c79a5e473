// Source stages: passes over the data, handed downstream in chunks, on the stage's one thread
// (what `parallelism` means for a kind: takes_workers, pipeline/stage_threads.cpp).
#include <limits>

#include "engine_impl.hpp"

namespace sluice {

class Engine::Impl::SourceStage {
 public:
  SourceStage(Impl& engine, StageRuntime& st) : engine_(engine), st_(st) { out_.reserve(kChunk); }

  void run() {
    if (engine_.end_if_ended_before(st_, out_)) return;
    restore();
    for (std::uint64_t pass = first_pass_; more_passes(pass); ++pass) {
      if (engine_.stopping.load() || st_.output->skip_through() == kAllIterations) break;
      if (!st_.output->skipped(pass) && !run_pass(pass)) return;
      if (!end_pass(pass)) return;
    }
    finish();
  }

 private:
  // ---- the phases of run() ----

  // A resumed run starts where the checkpoint's cut left the source: inside a pass (the operator
  // restored its place in it), or before one.
  void restore() {
    if (!st_.restore) return;
    auto positions = engine_.engine_state_reader(st_);
    // A pass past the last one asked for never was (the place inside a pass is the operator's,
    // which checks it against what it holds).
    first_pass_ = positions->get_within<std::uint64_t>(
        0, st_.demand == kUnbounded ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(st_.demand), "the pass");
    resume_index_ = positions->get<std::uint64_t>();
    resume_inside_pass_ = positions->get_within<std::uint8_t>(0, 1, "whether it was inside a pass") != 0;
    st_.output->set_iteration(first_pass_);
    st_.counters.epoch.store(first_pass_, std::memory_order_relaxed);
  }

  bool more_passes(std::uint64_t pass) const {
    return st_.demand == kUnbounded || pass < static_cast<std::uint64_t>(st_.demand);
  }

  // One pass, element by element; false when the run stops or fails.
  bool run_pass(std::uint64_t pass) {
    const std::uint64_t epoch = st_.first_output_epoch + pass;
    const bool resumed_inside = resume_inside_pass_ && pass == first_pass_;
    if (!resumed_inside && engine_.cut_requested(st_) && !pause_for_cut(pass, 0, false)) return false;
    try {
      if (!resumed_inside) st_.source->begin_pass(epoch);
    } catch (const std::exception& e) {
      engine_.fail(fmt::format("{} could not begin pass {}: {}", engine_.stage_label(st_), epoch, e.what()), &st_);
      return false;
    }
    ElementContext ctx{&st_.info, epoch, resumed_inside ? resume_index_ : 0};
    // Where the pass stands (the studio and the report show it): its size as the operator knows it
    // now (a resumed share differs from a whole one).
    st_.pass_elements.store(st_.source->expected_elements(), std::memory_order_relaxed);
    st_.pass_epoch.store(epoch, std::memory_order_relaxed);
    st_.pass_position.store(ctx.index, std::memory_order_relaxed);
    while (!engine_.stopping.load(std::memory_order_relaxed) && !st_.output->skipped(pass)) {
      if (engine_.cut_requested(st_) && !pause_for_cut(pass, ctx.index, true)) return false;
      bool ended = false;
      if (!next_element(ctx, ended)) return false;
      if (ended) break;
    }
    return true;
  }

  // The operator's next element of the pass into the output; `ended` at the pass's end. False when
  // the run stops or fails.
  bool next_element(ElementContext& ctx, bool& ended) {
    Sample sample;
    try {
      if (!st_.source->next(sample, ctx)) {
        ended = true;
        return true;
      }
    } catch (const std::exception& e) {
      if (!engine_.element_error(st_, e.what(), ctx.epoch, ctx.index, sample.origin())) return false;
      st_.pass_position.store(++ctx.index, std::memory_order_relaxed);
      return true;
    }
    st_.pass_position.store(++ctx.index, std::memory_order_relaxed);
    ++produced_;
    produced_bytes_ += sample.nbytes();
    out_.push_back(Item::element(std::move(sample)));
    // Hand over full chunks; to a waiting consumer, hand over sooner, but not element by element
    // from a fast source (each hand-off may wake a thread).
    const bool due = out_.size() >= kChunk ||
                     (st_.output->consumer_waiting() && (out_.size() >= kChunk / 4 || now_ns() - mark_ >= 50'000));
    return !due || handover();
  }

  bool end_pass(std::uint64_t pass) {
    out_.push_back(Item::end_of_iteration(pass));
    if (!handover()) return false;
    st_.counters.epoch.store(pass + 1, std::memory_order_relaxed);
    return true;
  }

  void finish() {
    out_.push_back(Item::end_of_stream());
    if (handover()) engine_.stage_ended(st_);
  }

  // ---- hand-offs and cuts ----

  bool handover() {
    const std::uint64_t t = now_ns();
    add(st_.counters.busy_ns, t - mark_);
    add(st_.counters.elements_out, produced_);
    add(st_.counters.bytes_out, produced_bytes_);
    produced_ = produced_bytes_ = 0;
    const bool ok = engine_.flush(st_, out_);
    mark_ = now_ns();
    return ok;
  }

  // The cut: what was made before goes first, then the barrier; the source waits until the
  // checkpoint is complete.
  bool pause_for_cut(std::uint64_t pass, std::uint64_t index, bool inside_pass) {
    if (!handover()) return false;
    const auto positions = [&](StateWriter& w) {
      w.put(pass);
      w.put(index);
      w.put<std::uint8_t>(inside_pass);
    };
    const std::string where = inside_pass ? fmt::format("pass {}, before element {}", st_.first_output_epoch + pass, index)
                                          : fmt::format("before pass {}", st_.first_output_epoch + pass);
    if (!engine_.save_stage(st_, positions, where)) return false;
    out_.push_back(Item::barrier());
    return handover() && engine_.wait_for_release(st_);
  }

  Impl& engine_;
  StageRuntime& st_;
  std::vector<Item> out_;
  std::uint64_t mark_ = now_ns();                 // since when the stage's time counts as busy
  std::uint64_t produced_ = 0, produced_bytes_ = 0;  // since the last hand-off
  std::uint64_t first_pass_ = 0, resume_index_ = 0;  // where a resumed run starts
  bool resume_inside_pass_ = false;
};

void Engine::Impl::run_source(StageRuntime& st) { SourceStage(*this, st).run(); }

}  // namespace sluice
