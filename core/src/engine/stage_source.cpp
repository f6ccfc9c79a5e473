// Source stages: passes over the data, handed downstream in chunks, on the stage's one thread
// (what `parallelism` means for a kind: takes_workers, pipeline/stage_threads.cpp).
#include <limits>

#include "engine_impl.hpp"

namespace sluice {

class Engine::Impl::SourceStage {
 public:
  SourceStage(Impl& engine, StageRuntime& st)
      : engine_(engine), st_(st), gives_way_(engine.source_gives_way_to_cuts(st)),
        cuts_between_passes_(gives_way_ && st.registered->abi_minor >= 9) {
    out_.reserve(kChunk);
  }

  void run() {
    if (engine_.end_if_ended_before(st_, out_)) return;
    restore();
    if (!hand_over_restored()) return;
    for (std::uint64_t pass = first_pass_; more_passes(pass); ++pass) {
      if (engine_.stopping.load() || output_.skip_through() == kAllIterations) break;
      if (!output_.skipped(pass) && !run_pass(pass)) return;
      if (!end_pass(pass)) return;
    }
    finish(passes_begun_);
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
    // Appended (a checkpoint of an earlier version has none): what the source had made and not
    // handed over at the cut, handed over first.
    if (!positions->at_end()) {
      const auto pending = positions->get_within<std::uint64_t>(0, 1u << 20, "the elements made and not handed over");
      for (std::uint64_t k = 0; k < pending; ++k) out_.push_back(Engine::Impl::get_item(*positions));
    }
    restore_members(*positions);
    passes_begun_ = first_pass_;
    output_.set_iteration(first_pass_);
    st_.counters.epoch.store(first_pass_, std::memory_order_relaxed);
  }

  // Where the stages fused into the source stood: appended to its positions by a run that fused
  // them too; by a run that ran them apart (fuse_stages: false, or an earlier Sluice), each in its
  // own state, as a map's stage saves it (its pass, the elements of it it had taken). What a
  // source made holds what its fused stages made of it: a run that fuses another number of stages
  // cannot go on from it.
  void restore_members(CheckpointStateReader& positions) {
    given_.assign(st_.fused.size(), 0);
    if (!positions.at_end()) {
      const auto fused = positions.get<std::uint64_t>();
      if (fused != st_.fused.size())
        throw DataError(fmt::format("the checkpoint was taken with {} stage(s) running on the source's thread, this run has {} "
                                    "(the option fuse_stages differs): resume with the fuse_stages of the run that took it",
                                    fused, st_.fused.size()));
      for (auto& given : given_) given = positions.get<std::uint64_t>();
      if (!positions.at_end()) throw DataError("the checkpoint's positions of this stage run on past what it wrote: it is damaged");
      return;
    }
    for (std::size_t k = 0; k < st_.fused.size(); ++k) {
      StageRuntime& member = *st_.fused[k];
      if (!member.restore || member.restore->ended() || !resume_inside_pass_) continue;
      auto apart = engine_.engine_state_reader(member);
      const auto pass = apart->get<std::uint64_t>();
      const auto taken = apart->get<std::uint64_t>();
      if (pass == first_pass_) given_[k] = taken;
    }
  }

  // What a cut found made and not handed over, handed over first; false when the run stops or
  // the stream had ended there.
  bool hand_over_restored() {
    if (out_.empty()) return true;
    const bool ends = out_.back().kind == Item::Kind::EndOfStream;
    for (const auto& item : out_) produced_ += item.is_element();
    if (!handover({first_pass_, resume_index_, resume_inside_pass_})) return false;
    if (ends) engine_.stage_ended(st_);
    return !ends;
  }

  bool more_passes(std::uint64_t pass) const {
    return st_.demand == kUnbounded || pass < static_cast<std::uint64_t>(st_.demand);
  }

  // One pass, element by element; false when the run stops or fails.
  bool run_pass(std::uint64_t pass) {
    const std::uint64_t epoch = st_.first_output_epoch + pass;
    const bool resumed_inside = resume_inside_pass_ && pass == first_pass_;
    passes_begun_ = pass + 1;
    if (!resumed_inside) std::fill(given_.begin(), given_.end(), 0);
    if (!resumed_inside && engine_.cut_requested(st_) && !pause_for_cut({pass, 0, false})) return false;
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
    while (!engine_.stopping.load(std::memory_order_relaxed) && !output_.skipped(pass)) {
      if (engine_.cut_requested(st_) && !pause_for_cut({pass, ctx.index, true})) return false;
      bool ended = false;
      if (!next_element(pass, ctx, ended)) return false;
      if (ended) break;
    }
    return true;
  }

  // The operator's next element of the pass into the output; `ended` at the pass's end. False when
  // the run stops or fails.
  bool next_element(std::uint64_t pass, ElementContext& ctx, bool& ended) {
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
    if (engine_.options.lineage) detail::stamp_read_epoch(sample, ctx.epoch);
    ++produced_;
    produced_bytes_ += sample.nbytes();
    Item item = Item::element(std::move(sample));
    bool kept = true;
    if (!st_.fused.empty() && !run_members(item, ctx.epoch, kept)) return false;
    if (kept) out_.push_back(std::move(item));
    // Hand over full chunks; to a waiting consumer, hand over sooner, but not element by element
    // from a fast source (each hand-off may wake a thread).
    const bool due = out_.size() >= kChunk ||
                     (output_.consumer_waiting() && (out_.size() >= kChunk / 4 || now_ns() - mark_ >= 50'000));
    return !due || handover({pass, ctx.index, true});
  }

  bool end_pass(std::uint64_t pass) {
    out_.push_back(Item::end_of_iteration(pass));
    if (!handover({pass + 1, 0, false})) return false;
    st_.counters.epoch.store(pass + 1, std::memory_order_relaxed);
    for (StageRuntime* member : st_.fused) member->counters.epoch.store(pass + 1, std::memory_order_relaxed);
    return true;
  }

  // The stages fused into the source (fuse_into_sources(), engine.cpp) on one of its elements, as
  // their own stage would run them: each sees the elements of the pass that reached it, counted
  // from 0. False when the run must stop; `kept` false when a filter dropped it (or an element
  // error was skipped).
  bool run_members(Item& item, std::uint64_t epoch, bool& kept) {
    OriginKeeper origin;
    std::uint64_t t = now_ns();
    for (std::size_t k = 0; k < st_.fused.size(); ++k) {
      StageRuntime* member = st_.fused[k];
      add(member->counters.elements_in, 1);
      add(member->counters.bytes_in, item.sample.nbytes());
      const bool ok = engine_.apply(*member, item, ElementContext{&member->info, epoch, given_[k]++}, kept, nullptr, origin);
      const std::uint64_t t2 = now_ns();
      add(member->counters.busy_ns, t2 - t);
      t = t2;
      if (!ok) return false;
      if (!kept) return true;
      add(member->counters.elements_out, 1);
      add(member->counters.bytes_out, item.sample.nbytes());
    }
    return true;
  }

  void finish(std::uint64_t passes) {
    out_.push_back(Item::end_of_stream());
    if (handover({passes, 0, false})) engine_.stage_ended(st_);
  }

  // ---- hand-offs and cuts ----

  // Where the source stands for a cut: before `pass` or inside it, before its element `index`.
  struct Place {
    std::uint64_t pass = 0, index = 0;
    bool inside_pass = false;
  };

  // Hands out_ over. A source that gives way to cuts takes one asked while it waits for room
  // there, with what is left of out_ kept in its state (at `place`, after those), then goes on.
  bool handover(Place place) {
    const std::uint64_t t = now_ns();
    add(st_.counters.busy_ns, t - mark_);
    add(st_.counters.elements_out, produced_);
    add(st_.counters.bytes_out, produced_bytes_);
    produced_ = produced_bytes_ = 0;
    bool ok = true;
    if (!gives_way_) {
      ok = engine_.flush(st_, out_);
    } else {
      StageRuntime& st = st_;
      Impl& engine = engine_;
      for (;;) {
        ok = engine_.flush(st_, out_, [&] { return engine.cut_requested(st); });
        if (!ok || out_.empty()) break;
        if (!(ok = pause_for_cut(place))) break;
      }
    }
    mark_ = now_ns();
    return ok;
  }

  // The cut, after which the source waits until the checkpoint is complete. A source that gives
  // way to cuts puts its barrier into its buffer as it is: after the first end of a pass waiting
  // there (the source is saved as before the next pass: what follows is made again on resume),
  // or after all of it, with what the source has not handed over kept by value. Either way the
  // state holds at most a pass or a buffer of its elements however far ahead the source ran,
  // and nothing lets it in past its buffer's bounds. Otherwise what was made goes first, then
  // the barrier.
  bool pause_for_cut(Place place) {
    const std::vector<Item>* pending = nullptr;
    std::vector<std::uint64_t> given = given_;
    if (!gives_way_) {
      if (!handover(place)) return false;
    } else if (std::uint64_t ended = 0; cuts_between_passes_ && output_.reader(0).put_barrier_after_first_end_of_iteration(ended)) {
      place = {ended + 1, 0, false};
      std::fill(given.begin(), given.end(), 0);
    } else {
      output_.reader(0).put_barrier();
      pending = &out_;
    }
    const auto positions = [&](StateWriter& w) {
      w.put(place.pass);
      w.put(place.index);
      w.put<std::uint8_t>(place.inside_pass);
      if ((!pending || pending->empty()) && st_.fused.empty()) return;
      w.put<std::uint64_t>(pending ? pending->size() : 0);
      if (pending)
        for (const auto& item : *pending) Engine::Impl::put_item(w, item);
      if (st_.fused.empty()) return;
      w.put<std::uint64_t>(given.size());
      for (const auto count : given) w.put(count);
    };
    // Each fused stage's own state as its stage apart saves it, so that a run that does not fuse
    // it finds its place there (and is then refused for the source's, above).
    const std::function<void(StateWriter&, std::size_t)> member_positions = [&](StateWriter& w, std::size_t k) {
      w.put(place.pass);
      w.put(given[k - 1]);
    };
    std::string where = place.inside_pass ? fmt::format("pass {}, before element {}", st_.first_output_epoch + place.pass, place.index)
                                          : fmt::format("before pass {}", st_.first_output_epoch + place.pass);
    if (pending && !pending->empty()) where += fmt::format("; {} made and not yet handed over (kept)", pending->size());
    if (!engine_.save_stage(st_, positions, where, 0, nullptr, &member_positions)) return false;
    if (!gives_way_) {
      out_.push_back(Item::barrier());
      if (!handover(place)) return false;
    }
    return engine_.wait_for_release(st_);
  }

  Impl& engine_;
  StageRuntime& st_;
  std::vector<Item> out_;
  std::uint64_t mark_ = now_ns();                 // since when the stage's time counts as busy
  std::uint64_t produced_ = 0, produced_bytes_ = 0;  // since the last hand-off
  std::uint64_t first_pass_ = 0, resume_index_ = 0;  // where a resumed run starts
  bool resume_inside_pass_ = false;
  std::uint64_t passes_begun_ = 0;  // (the place of the end of the stream)
  std::vector<std::uint64_t> given_ = std::vector<std::uint64_t>(st_.fused.size());  // elements of the pass each fused stage was given
  Outputs& output_ = *st_.exit().output;
  // The source's buffer has one reader, which takes cuts from it as it is (stage_expand_cut.cpp);
  // and passes from their start can stand for what follows the first end of a pass there: its
  // begin_pass() begins the pass it names whatever state it had (SDK 6.9).
  const bool gives_way_, cuts_between_passes_;
};

void Engine::Impl::run_source(StageRuntime& st) { SourceStage(*this, st).run(); }

}  // namespace sluice
