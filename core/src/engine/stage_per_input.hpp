#pragma once
// The per-input stage kind (Stage.per_input): the maps, filters and aggregates after an interleave
// that run once per input, on the thread reading that input. Used by the expand stage
// (stage_expand.cpp), which wraps each input's cursor in one; implemented in stage_per_input.cpp.
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine_impl.hpp"

namespace sluice {

// One input of an expand stage with per-input stages (Stage.per_input, stage_per_input.cpp): the
// operator's cursor for that input, its outputs run through those stages on the calling thread
// (each aggregate, and each map or filter that keeps state, an operator of its own for the
// input); its outputs are the last stage's. Element indices are the input's index << 32 plus
// the element's place within the input, the same at any parallelism. Errors go through each
// stage's own policy, named by that stage.
class Engine::Impl::PerInputCursor final : public ExpandCursor {
 public:
  PerInputCursor(Impl& impl, StageRuntime& head, std::unique_ptr<ExpandCursor> inner, std::uint64_t epoch, std::uint64_t input_index,
                 std::string input_origin);
  ~PerInputCursor() override;
  bool next(Sample& out) override;
  // Time spent in the per-input stages since the last call (counted as theirs, not the reader's).
  std::uint64_t take_member_ns() { return std::exchange(member_ns_, 0); }

 private:
  struct Link {
    StageRuntime* st = nullptr;
    std::unique_ptr<Operator> own;  // this input's operator, or null: the stage's (stateless)
    bool started = false;
    Map* map = nullptr;
    Filter* filter = nullptr;
    Aggregate* aggregate = nullptr;
    ChunkedMap* chunked_map = nullptr;
    ChunkedAggregate* chunked_aggregate = nullptr;
    bool hands_chunks_on = false;  // the next link takes this one's chunks as they are
    std::uint64_t taken = 0;  // elements (rows) it took from this input
    bool done = false;        // a take had all it wanted, or a later one had
  };
  static bool accepts_chunks_from(const StageRuntime& producer, const Link& reader);
  bool read_inner(Sample& unit);
  // Returns the most bytes one stage made of `units`.
  std::uint64_t run_from(std::size_t k, std::vector<Sample>& units);
  std::size_t rows_to_read() const;
  void take_element(Link& link, Sample element, std::vector<Sample>& made);
  void take_chunk(Link& link, const Chunk& chunk, std::vector<Sample>& made);
  void end_input();
  void stop_at(Link& link);
  void finish_own(bool complete);
  void handle_error(Link& link, const char* what, std::uint64_t index, const std::string& origin);
  // Returns the bytes of `made`.
  std::uint64_t account(Link& link, std::uint64_t rows_in, std::uint64_t bytes_in, const std::vector<Sample>& made, std::uint64_t spent_ns);

  Impl& impl_;
  StageRuntime& head_;
  std::unique_ptr<ExpandCursor> inner_;
  ChunkedExpandCursor* inner_chunked_ = nullptr;
  std::uint64_t epoch_, base_index_;
  std::vector<Link> links_;
  std::deque<Sample> pending_;
  bool stop_reading_ = false, finished_ = false;
  std::uint64_t member_ns_ = 0;
  // The most bytes a stage made per row read from the input so far (sizes the next read: a
  // chunk of 256 lines, each decoded to an image or padded to a large batch, would otherwise
  // be made all at once); none before the first read.
  std::optional<std::uint64_t> made_per_row_;
};

}  // namespace sluice
