#pragma once
// Assembling elements of different shapes into one: padded to a common shape (padded_batch,
// bucket_by_sequence_length), ragged as values plus row partitions (ragged_batch), or stacked when
// every shape agrees (window). Shared by the sequence operators.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/sdk.hpp"

namespace sluice::std_ops {

// Memory for outputs whose sizes vary from one to the next (a padded batch is as long as its
// longest row): sizes are rounded up to a power of two so that released blocks are reused, as
// batch's pool reuses its fixed-size blocks (fresh pages cost far more than reused ones). Unless
// the stage was offered another allocator (pinned memory), which is then used as it is.
class VaryingSizePool final : public Allocator {
 public:
  std::shared_ptr<Buffer> allocate(std::size_t bytes) override {
    std::size_t rounded = 64;
    while (rounded < bytes) rounded *= 2;
    return pool_.allocate(rounded);
  }
  const char* name() const override { return "pooled-host"; }
  // What a stage allocates from: this pool for host memory, else the offered allocator.
  Allocator* for_stage(const StageInfo& info) {
    return std::string(info.allocator->name()) == "host" ? static_cast<Allocator*>(this) : info.allocator;
  }

 private:
  PooledHostAllocator pool_;
};

// How padded batches are laid out: tf.data's padded_shapes and padding_values, by field name.
struct PaddingRules {
  // FIELD -> its padded shape; -1 in a dimension: the longest of the batch there. Fields not named
  // are padded to the longest of the batch in every dimension.
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::string> values;  // FIELD -> padding value, as written
  std::string default_value = "0";           // for fields not named in `values`
  std::vector<std::string> length_fields;     // add FIELD_length: each row's size in dimension 0
  std::vector<std::string> mask_fields;       // add FIELD_mask: u8 [batch, padded length], 1 where data

  // From the parameters padded_shapes ("tokens:64", "frames:-1x40"), padding_values ("-1",
  // "tokens:0", "label:-1"), lengths and masks. Throws ParamError naming the bad entry.
  static PaddingRules from_params(const Params& p);
  // Whether a row may not fit the rules (fixed shapes, lengths or masks to check), whatever the others.
  bool checks_rows() const { return !shapes.empty() || !length_fields.empty() || !mask_fields.empty(); }
  static std::vector<ParamSpec> param_specs();
};

// `in` as a chunk of one row sharing its tensors (scalars Constant, the others Ragged), with its
// origin: an element pushed alone is held as such a chunk, so that one code path batches both.
std::shared_ptr<const Chunk> chunk_of_element(Sample in);

// The elements an aggregate holds for one output, with their input indices, each checked against
// the first when it comes (so that a refused element is refused alone, by the engine's skip
// policy, and the output can always be assembled): the same fields, each with the same type and
// rank; `same_shapes` asks for equal shapes too (a stack). Numbers and where they came from are
// kept for messages. Checkpoints save each element and its index.
class HeldRows {
 public:
  void add(Sample row, std::uint64_t index) {
    rows_.push_back(std::move(row));
    indices_.push_back(index);
  }
  std::size_t size() const { return rows_.size(); }
  bool empty() const { return rows_.empty(); }
  const std::vector<Sample>& rows() const { return rows_; }
  void clear() {
    rows_.clear();
    indices_.clear();
  }
  void save(StateWriter& w) const;
  void restore(StateReader& r, std::size_t at_most);
  // Throws DataError naming the field and the row it differs from; the rows stay as they were.
  void check(const Sample& in, bool same_shapes) const;

 private:
  std::vector<Sample> rows_;
  std::vector<std::uint64_t> indices_;
};

// Rows [first, first + count) of a chunk an aggregate holds without making an element of each,
// sharing the chunk; the first row's input index is `index`, the others' follow it.
struct HeldRun {
  std::shared_ptr<const Chunk> chunk;
  std::size_t first = 0, count = 0;
  std::uint64_t index = 0;
};

// Calls take(chunk, row, index) for each row of `in` in order, as the element form is pushed
// each element, with `in` shared for the rows it holds on to. A row's DataError is thrown as its
// RowError: the rows before it are taken, and the host goes on after it.
template <class Take>
void take_rows(const Chunk& in, const ElementContext& first, Take&& take) {
  const auto shared = std::make_shared<const Chunk>(in);
  for (std::size_t r = 0; r < in.rows(); ++r) {
    try {
      take(shared, r, first.index + r);
    } catch (const DataError& e) {
      throw RowError(r, e.what());
    }
  }
}

// The rows an aggregate holds by reference for one output (padded_batch, ragged_batch,
// bucket_by_sequence_length), as runs: a row that follows the last run in its chunk lengthens it
// (its input index then follows the run's too), without a reference of its own. Checkpoints save each row as an element
// and its index, as HeldRows does.
class HeldRefs {
 public:
  void add(const std::shared_ptr<const Chunk>& chunk, std::size_t row, std::uint64_t index) { add_rows(chunk, row, 1, index); }
  void add_rows(const std::shared_ptr<const Chunk>& chunk, std::size_t first, std::size_t count, std::uint64_t index) {
    rows_ += count;
    if (!runs_.empty()) {
      HeldRun& last = runs_.back();
      if (last.chunk == chunk && last.first + last.count == first) {
        last.count += count;
        return;
      }
    }
    runs_.push_back({chunk, first, count, index});
  }
  std::size_t size() const { return rows_; }
  bool empty() const { return rows_ == 0; }
  const std::vector<HeldRun>& runs() const { return runs_; }
  // The first row held (not empty()): what the rows that come are checked against.
  const Chunk& first_chunk() const { return *runs_.front().chunk; }
  std::size_t first_row() const { return runs_.front().first; }
  void clear() {
    runs_.clear();
    rows_ = 0;
  }
  // The runs, for an output assembled elsewhere (push_assembled); none are held after.
  std::vector<HeldRun> take_all() {
    rows_ = 0;
    return std::exchange(runs_, {});
  }
  void save(StateWriter& w) const;
  void restore(StateReader& r, std::size_t at_most);
  // Throws DataError (the element form's message) when row `r` of `in` cannot join the rows held:
  // the same fields, each with the same type and rank. The rows stay as they were.
  void check(const Chunk& in, std::size_t r) const;

 private:
  std::vector<HeldRun> runs_;
  std::size_t rows_ = 0;
};

// The origin of row `row` of `chunk`, as the element form's sample of it has it.
void share_origin(Sample& out, const Chunk& chunk, std::size_t row);
// `out` (the stack of `rows`, its origin the first's) names every row's record (lineage), for an
// aggregate whose outputs do not stack its inputs in order, where the host cannot name them.
void name_rows(Sample& out, const std::vector<HeldRun>& rows);

// Checks that every dimension of row `r`'s fields fits the rules' fixed padded shapes (with
// `dim0_limit`, when set, for dimension 0 of the fields it applies to). Throws DataError.
void check_fits(const Chunk& in, std::size_t r, const PaddingRules& rules, std::optional<std::int64_t> dim0_limit,
                const std::vector<std::string>& dim0_fields);


// One output of the runs' rows, each field padded to its rule's shape (and `dim0`, when set,
// for dimension 0 of `dim0_fields`), with the length and mask fields the rules ask for. The
// output's origin is its first row's. The values written as padding and as data go to
// `counters` when there are any.
Sample pad_and_stack(const std::vector<HeldRun>& rows, const PaddingRules& rules, Allocator& allocator, StageCounters* counters,
                     std::optional<std::int64_t> dim0 = std::nullopt, const std::vector<std::string>& dim0_fields = {});

// Rows of equal shapes stacked along a new first dimension (tensors, every field, or one).
Tensor stack_tensors(const std::vector<const Tensor*>& rows, Allocator& allocator);
Tensor stack_field(const std::vector<const Sample*>& rows, const std::string& name, Allocator& allocator);
Sample stack(const std::vector<const Sample*>& rows, Allocator& allocator);

// How a ragged batch names where each row starts: FIELD_row_lengths [batch] or FIELD_row_splits
// [batch + 1] (tf.RaggedTensor's row_splits; PyTorch's nested tensors take offsets).
enum class RowPartition { Lengths, Splits };
// Fields named in `ragged` (every field of rank >= 1 when empty) become their rows' values
// concatenated along dimension 0 plus a row partition field; the others are stacked (the rows
// were checked to agree: the same fields, types and ranks, equal shapes where stacked). The
// output's origin is its first row's.
Sample ragged_stack(const std::vector<HeldRun>& rows, const std::vector<std::string>& ragged, RowPartition partition,
                    Allocator& allocator, StageCounters* counters);
bool is_ragged_field(const std::vector<std::string>& ragged, const Column& c);

}  // namespace sluice::std_ops
