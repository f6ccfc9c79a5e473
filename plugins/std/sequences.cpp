// Variable-length data: padded_batch, ragged_batch, bucket_by_sequence_length, window,
// window_field, pack_sequences.
#include <algorithm>
#include <cstring>
#include <deque>
#include <type_traits>
#include <utility>

#include "sequence_layout.hpp"
#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

ParamSpec batch_size_param() { return ParamSpec::make("batch_size", ParamType::Int, "elements per batch").range(1, 1e9); }
ParamSpec drop_remainder_param(const char* what) {
  return ParamSpec::make("drop_remainder", ParamType::Bool, what).def("false");
}

// Batches of batch_size rows held until the batch is full (or the iteration ends), by reference
// (a chunk's rows without an element made of each); the subclass checks each row before it holds
// it (so that a refused element is refused alone) and says how the rows become one output. The
// assembly may run on another thread (the stage's parallelism): it gets the rows, and reads only
// parameters and what start() set.
class HeldRowBatch : public Aggregate, public AssemblesInParallel, public HoldsOnlyElements, public StacksItsInputs, public ChunkedAggregate {
 public:
  explicit HeldRowBatch(const Params& p)
      : batch_size_(static_cast<std::size_t>(p.get_int("batch_size"))), drop_remainder_(p.get_bool("drop_remainder")) {}
  void start(const StageInfo& info) override {
    allocator_ = pool_.for_stage(info);
    counters_ = info.counters;
  }
  void begin_iteration(std::uint64_t) override { rows_.clear(); }
  std::uint64_t inputs_per_output() const override { return batch_size_; }
  Flow push(Sample in, const ElementContext& ctx, Emitter& out) override {
    take(chunk_of_element(std::move(in)), 0, ctx.index, out);
    return Flow::Continue;
  }
  // Each row as push() would take it, but for the rows after the first that need no check of
  // their own (rows_checked_alone() false once the first is taken): those are held as runs, up to
  // each batch's end, without a call a row.
  Flow push_chunk(const Chunk& in, const ElementContext& first, Emitter& out) override {
    const auto chunk = std::make_shared<const Chunk>(in);
    for (std::size_t r = 0; r < in.rows();) {
      if (r > 0 && !rows_checked_alone()) {
        r += hold_rows(chunk, r, in.rows() - r, first.index + r, out);
        continue;
      }
      try {
        take(chunk, r, first.index + r, out);
      } catch (const DataError& e) {
        throw RowError(r, e.what());
      }
      ++r;
    }
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    if (!rows_.empty() && !drop_remainder_) emit(out);
    rows_.clear();
  }
  void save_state(StateWriter& w) const override {
    rows_.save(w);
    w.describe(std::to_string(rows_.size()) + " of " + std::to_string(batch_size_) + " rows gathered");
  }
  void restore_state(StateReader& r) override { rows_.restore(r, batch_size_ - 1); }

 protected:
  virtual Sample assemble(const std::vector<HeldRun>& rows) const = 0;
  // Row `r` of `chunk` joins the batch, checked first (a DataError refuses it alone), by hold().
  virtual void take(const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index, Emitter& out) = 0;
  // Whether, after a chunk's first row, each row of it must still be taken (checked) alone.
  virtual bool rows_checked_alone() const = 0;
  // Holds a row already checked; a full batch goes out.
  void hold(const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index, Emitter& out) {
    hold_rows(chunk, r, 1, index, out);
  }
  const HeldRefs& rows() const { return rows_; }
  Allocator& allocator() const { return *allocator_; }
  StageCounters* counters() const { return counters_; }

 private:
  // Holds rows [first, first + count) already checked, as many as the batch has room for, and
  // returns how many; a full batch goes out.
  std::size_t hold_rows(const std::shared_ptr<const Chunk>& chunk, std::size_t first, std::size_t count, std::uint64_t index, Emitter& out) {
    const std::size_t n = std::min(count, batch_size_ - rows_.size());
    rows_.add_rows(chunk, first, n, index);
    if (rows_.size() == batch_size_) emit(out);
    return n;
  }
  void emit(Emitter& out) {
    push_assembled(out, [this, rows = rows_.take_all()] { return assemble(rows); });
  }
  std::size_t batch_size_;
  bool drop_remainder_;
  VaryingSizePool pool_;
  Allocator* allocator_ = &HostAllocator::instance();
  StageCounters* counters_ = nullptr;
  HeldRefs rows_;
};

// tf.data's padded_batch: batches of elements whose fields differ in size, each field padded to
// the longest of its batch or to a given shape, with per-field padding values. Rows are held by
// reference (a chunk's rows without an element made of each) until their batch is full.
class PaddedBatch final : public HeldRowBatch {
 public:
  static OperatorInfo describe() {
    std::vector<ParamSpec> params{batch_size_param(), drop_remainder_param("drop the short last batch of each iteration")};
    for (auto& spec : PaddingRules::param_specs()) params.push_back(std::move(spec));
    return {"padded_batch",
            OperatorKind::Aggregate,
            "Stacks batch_size consecutive elements, padding each field to the longest of the batch or to padded_shapes "
            "(parallelism: threads assembling the batches)",
            std::move(params),
            {.saves_state = true},
            {}};
  }
  explicit PaddedBatch(const Params& p) : HeldRowBatch(p), rules_(PaddingRules::from_params(p)) {}

 private:
  void take(const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index, Emitter& out) override {
    // A chunk's rows share their columns' types and ranks, what check() compares: its first row
    // stands for the rest (after it, the rows held are of this chunk or were compared with it).
    if (r == 0) rows().check(*chunk, r);
    check_fits(*chunk, r, rules_, std::nullopt, {});
    hold(chunk, r, index, out);
  }
  // A row of a chunk may be longer than padded_shapes allows, whatever its first row.
  bool rows_checked_alone() const override { return rules_.checks_rows(); }
  Sample assemble(const std::vector<HeldRun>& rows) const override { return pad_and_stack(rows, rules_, allocator(), counters()); }
  PaddingRules rules_;
};

// tf.data's ragged_batch (dense_to_ragged_batch): nothing is padded; a variable-length field
// becomes its rows' values, concatenated, and where each row starts. Rows are held by reference
// (a chunk's rows without an element made of each), as padded_batch's are.
class RaggedBatch final : public HeldRowBatch {
 public:
  static OperatorInfo describe() {
    return {"ragged_batch",
            OperatorKind::Aggregate,
            "Batches elements whose fields differ in length as values plus FIELD_row_lengths (or FIELD_row_splits), "
            "without padding (parallelism: threads assembling the batches)",
            {batch_size_param(), drop_remainder_param("drop the short last batch of each iteration"),
             ParamSpec::make("fields", ParamType::StringList,
                             "the variable-length fields; empty: every field that is not a scalar (others are stacked)")
                 .def(""),
             ParamSpec::make("row_partition", ParamType::Choice,
                             "row_lengths: FIELD_row_lengths [batch]; row_splits: FIELD_row_splits [batch+1], the offsets "
                             "tf.RaggedTensor and torch.nested take")
                 .def("row_lengths")
                 .one_of({"row_lengths", "row_splits"})},
            {.saves_state = true},
            {}};
  }
  explicit RaggedBatch(const Params& p)
      : HeldRowBatch(p),
        fields_(p.get_string_list("fields")),
        partition_(p.get_string("row_partition") == "row_splits" ? RowPartition::Splits : RowPartition::Lengths) {}

 private:
  void take(const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index, Emitter& out) override {
    if (r == 0) {
      rows().check(*chunk, r);
      check_fields(*chunk);
    }
    check_shapes(*chunk, r);
    hold(chunk, r, index, out);
  }
  // After a chunk's first row only its stacked fields held as ragged columns can differ.
  bool rows_checked_alone() const override { return !varying_stacked_.empty(); }
  // The fields named are there and have a length.
  void check_fields(const Chunk& in) const {
    for (const auto& name : fields_) {
      const Column* c = in.find(name);
      if (!c) throw DataError("fields names '" + name + "', which this element has not");
      if (c->row_rank() == 0) throw DataError("field '" + name + "' is a scalar: it has no length to batch ragged");
    }
  }
  // Row `r`'s shapes against the batch's first row: a stacked field's whole, a ragged one's past
  // dimension 0. A chunk's rows differ only in dimension 0 of its ragged columns, so after the
  // chunk's first row only the stacked fields held as ragged columns are compared.
  void check_shapes(const Chunk& in, std::size_t r) {
    if (r == 0) {
      varying_stacked_.clear();
      for (const Column& c : in.columns())
        if (c.layout == Column::Layout::Ragged && !is_ragged_field(fields_, c)) varying_stacked_.push_back(&c);
    }
    if (rows().empty()) return;
    const auto compare = [&](const Column& c, bool ragged) {
      const Shape have = c.row_shape(r), want = rows().first_chunk().at(c.name).row_shape(rows().first_row());
      if (!std::equal(have.begin() + (ragged ? 1 : 0), have.end(), want.begin() + (ragged ? 1 : 0), want.end()))
        throw DataError("field '" + c.name + "' is " + shape_string(have) + " here and " + shape_string(want) +
                        " in the batch's first row: " +
                        (ragged ? "only the first dimension may differ in a ragged batch"
                                : "it is stacked (not listed in fields), so its shape must not change"));
    };
    if (r == 0) {
      for (const Column& c : in.columns()) compare(c, is_ragged_field(fields_, c));
    } else {
      for (const Column* c : varying_stacked_) compare(*c, false);
    }
  }
  Sample assemble(const std::vector<HeldRun>& rows) const override {
    return ragged_stack(rows, fields_, partition_, allocator(), counters());
  }
  std::vector<std::string> fields_;
  RowPartition partition_;
  std::vector<const Column*> varying_stacked_;  // the chunk being taken's stacked fields whose rows' shapes differ
};

// tf.data's bucket_by_sequence_length: elements go to the bucket of their length (bucket i holds
// lengths in [boundaries[i-1], boundaries[i])), each bucket is padded-batched with its own batch
// size as soon as it is full; at the end of an iteration the buckets left are emitted in bucket
// order. Deterministic: the output depends on the input order only.
class BucketBySequenceLength final : public Aggregate, public ChunkedAggregate, public AssemblesInParallel {
 public:
  static OperatorInfo describe() {
    std::vector<ParamSpec> params{
        ParamSpec::make("length_field", ParamType::String,
                        "field whose length (its size in dimension 0; or its value, for an integer scalar) picks the bucket"),
        ParamSpec::make("boundaries", ParamType::IntList, "upper length boundaries of the buckets, increasing").range(1, std::nullopt),
        ParamSpec::make("batch_sizes", ParamType::IntList, "batch size of each bucket: one more than boundaries").range(1, 1e9),
        ParamSpec::make("pad_to_bucket_boundary", ParamType::Bool,
                        "pad the length field (and fields given -1 in padded_shapes' first dimension) to the bucket's "
                        "boundary minus 1, not to the longest of the batch; lengths must stay below the last boundary")
            .def("false"),
        drop_remainder_param("drop each bucket's short batch at the end of an iteration")};
    for (auto& spec : PaddingRules::param_specs()) params.push_back(std::move(spec));
    return {"bucket_by_sequence_length",
            OperatorKind::Aggregate,
            "Groups elements of similar length into padded batches, a batch size per length bucket (parallelism: "
            "threads assembling the batches)",
            std::move(params),
            {.saves_state = true},
            {}};
  }
  explicit BucketBySequenceLength(const Params& p)
      : length_field_(p.get_string("length_field")),
        boundaries_(p.get_int_list("boundaries")),
        pad_to_boundary_(p.get_bool("pad_to_bucket_boundary")),
        drop_remainder_(p.get_bool("drop_remainder")),
        rules_(PaddingRules::from_params(p)) {
    for (auto size : p.get_int_list("batch_sizes")) batch_sizes_.push_back(static_cast<std::size_t>(size));
    if (boundaries_.empty()) throw ParamError("boundaries is empty; give at least one length boundary");
    for (std::size_t k = 1; k < boundaries_.size(); ++k)
      if (boundaries_[k] <= boundaries_[k - 1])
        throw ParamError("boundaries must increase: " + std::to_string(boundaries_[k]) + " follows " + std::to_string(boundaries_[k - 1]));
    if (batch_sizes_.size() != boundaries_.size() + 1)
      throw ParamError("batch_sizes has " + std::to_string(batch_sizes_.size()) + " sizes; " + std::to_string(boundaries_.size()) +
                       " boundaries make " + std::to_string(boundaries_.size() + 1) + " buckets, one size each");
    dim0_fields_.push_back(length_field_);
    for (const auto& [field, shape] : rules_.shapes)
      if (!shape.empty() && shape[0] < 0 && field != length_field_) dim0_fields_.push_back(field);
    buckets_.resize(batch_sizes_.size());
  }
  void start(const StageInfo& info) override {
    allocator_ = pool_.for_stage(info);
    counters_ = info.counters;
  }
  void begin_iteration(std::uint64_t) override {
    for (auto& b : buckets_) b.clear();
  }
  Flow push(Sample in, const ElementContext& ctx, Emitter& out) override {
    take(chunk_of_element(std::move(in)), 0, ctx.index, out);
    return Flow::Continue;
  }
  Flow push_chunk(const Chunk& in, const ElementContext& first, Emitter& out) override {
    take_rows(in, first, [&](const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index) { take(chunk, r, index, out); });
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (!buckets_[b].empty() && !drop_remainder_) emit(b, out);
    for (auto& b : buckets_) b.clear();
  }
  void save_state(StateWriter& w) const override {
    std::size_t held = 0;
    for (const auto& b : buckets_) {
      b.save(w);
      held += b.size();
    }
    w.describe(std::to_string(held) + " elements waiting in " + std::to_string(buckets_.size()) + " buckets");
  }
  void restore_state(StateReader& r) override {
    for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].restore(r, batch_sizes_[b] - 1);
  }

 private:
  // Row `r` of `chunk` goes to the bucket of its length (checked first: a refused row is refused alone).
  void take(const std::shared_ptr<const Chunk>& chunk, std::size_t r, std::uint64_t index, Emitter& out) {
    const std::int64_t length = length_of(*chunk, r);
    const std::size_t bucket = static_cast<std::size_t>(std::upper_bound(boundaries_.begin(), boundaries_.end(), length) - boundaries_.begin());
    if (pad_to_boundary_ && bucket == boundaries_.size())
      throw DataError("length " + std::to_string(length) + " of field '" + length_field_ + "' is not below the last boundary " +
                      std::to_string(boundaries_.back()) +
                      ", which pad_to_bucket_boundary needs; add a boundary above it or filter long elements first");
    auto& rows = buckets_[bucket];
    rows.check(*chunk, r);
    check_fits(*chunk, r, rules_, pad_limit(bucket), dim0_fields_);
    rows.add(chunk, r, index);
    if (rows.size() == batch_sizes_[bucket]) emit(bucket, out);
  }
  std::int64_t length_of(const Chunk& in, std::size_t r) const {
    const Column& c = in.at(length_field_);
    if (c.row_rank() > 0) return c.row_length(r);
    switch (c.dtype()) {
      case DType::I64: {
        std::int64_t v;
        std::memcpy(&v, c.row_data(r), sizeof v);
        return v;
      }
      case DType::I32: {
        std::int32_t v;
        std::memcpy(&v, c.row_data(r), sizeof v);
        return v;
      }
      default:
        throw DataError("length_field '" + length_field_ + "' is a " + dtype_name(c.dtype()) +
                        " scalar; give a sequence field (its length is used) or an integer length");
    }
  }
  std::optional<std::int64_t> pad_limit(std::size_t bucket) const {
    if (!pad_to_boundary_) return std::nullopt;
    return boundaries_[bucket] - 1;
  }
  // The bucket's rows leave with their assembly, which may run on another thread (parallelism).
  void emit(std::size_t bucket, Emitter& out) {
    push_assembled(out, [this, bucket, rows = buckets_[bucket].take_all()] {
      Sample batch = pad_and_stack(rows, rules_, *allocator_, counters_, pad_limit(bucket), dim0_fields_);
      name_rows(batch, rows);
      return batch;
    });
  }
  std::string length_field_;
  std::vector<std::int64_t> boundaries_;
  std::vector<std::size_t> batch_sizes_;
  bool pad_to_boundary_, drop_remainder_;
  PaddingRules rules_;
  std::vector<std::string> dim0_fields_;
  VaryingSizePool pool_;
  Allocator* allocator_ = &HostAllocator::instance();
  StageCounters* counters_ = nullptr;
  std::vector<HeldRefs> buckets_;
};

// tf.data's window followed by a batch of each window: window k holds the elements at positions
// k*shift + j*stride (j < size) of the iteration, stacked along a new first dimension. Without
// drop_remainder the windows that start before the end come out short (as tf.data's). With a
// key_field, windows never span two keys: a run of consecutive elements with one key (the rows
// of one sensor's file) is windowed on its own, as if it were an iteration (tf.data's
// group_by_window over consecutive elements).
class Window final : public Aggregate, public AssemblesInParallel {
 public:
  static OperatorInfo describe() {
    return {"window",
            OperatorKind::Aggregate,
            "Stacks windows of consecutive elements: size elements, shift apart, stride between members (parallelism: "
            "threads stacking the windows)",
            {ParamSpec::make("size", ParamType::Int, "elements per window").range(1, 1e9),
             ParamSpec::make("shift", ParamType::Int, "elements between the starts of two windows; 0: size").def("0").range(0, 1e9),
             ParamSpec::make("stride", ParamType::Int, "step between the elements of a window").def("1").range(1, 1e9),
             drop_remainder_param("drop the short windows at the end of each iteration (or key run)"),
             ParamSpec::make("key_field", ParamType::String,
                             "an integer or text scalar field; windows only hold consecutive elements with equal keys (empty: none)")
                 .def("")},
            {.saves_state = true},
            {}};
  }
  explicit Window(const Params& p)
      : size_(p.get_int("size")),
        shift_(p.get_int("shift") == 0 ? size_ : p.get_int("shift")),
        stride_(p.get_int("stride")),
        drop_remainder_(p.get_bool("drop_remainder")),
        key_field_(p.get_string("key_field")) {}
  void start(const StageInfo& info) override {
    allocator_ = pool_.for_stage(info);
    counters_ = info.counters;
  }
  void begin_iteration(std::uint64_t) override { reset(); }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    first_.check(in, true);
    if (!key_field_.empty()) {
      std::string key = key_of(in);
      if (key != key_) {  // a new run of keys: what the last run holds ends like an iteration
        end_run(out);
        key_ = std::move(key);
      }
    }
    if (first_.empty()) first_.add(in, 0);
    const std::int64_t position = seen_++;
    if (position < next_start_) return Flow::Continue;  // between two windows (shift > size * stride)
    if (held_.empty()) base_ = position;
    held_.push_back(std::move(in));
    while (next_start_ + (size_ - 1) * stride_ == position) {
      emit(size_, out);
      advance();
    }
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    end_run(out);
    reset();
  }
  void save_state(StateWriter& w) const override {
    w.put_string(key_);
    w.put(seen_);
    w.put(next_start_);
    w.put(base_);
    w.put<std::uint64_t>(held_.size());
    for (const auto& s : held_) w.put_element(s);
    first_.save(w);
    w.describe(std::to_string(held_.size()) + " elements held for the next window");
  }
  void restore_state(StateReader& r) override {
    reset();
    key_ = r.get_string();
    seen_ = r.get<std::int64_t>();
    next_start_ = r.get<std::int64_t>();
    base_ = r.get<std::int64_t>();
    const auto held = r.get<std::uint64_t>();
    if (held > static_cast<std::uint64_t>(size_ * stride_)) throw DataError("the saved window holds too many elements");
    for (std::uint64_t k = 0; k < held; ++k) held_.push_back(r.get_element());
    first_.restore(r, 1);
  }

 private:
  // The window's members (sharing their tensors) leave with its assembly, which may run on
  // another thread (the stage's parallelism).
  void emit(std::int64_t members, Emitter& out) {
    std::vector<Sample> window;
    window.reserve(static_cast<std::size_t>(members));
    for (std::int64_t j = 0; j < members; ++j) window.push_back(held_[static_cast<std::size_t>(next_start_ + j * stride_ - base_)]);
    push_assembled(out, [this, window = std::move(window)] {
      std::vector<const Sample*> rows;
      rows.reserve(window.size());
      for (const auto& member : window) rows.push_back(&member);
      return stack(rows, *allocator_);
    });
  }
  void advance() {
    next_start_ += shift_;
    while (!held_.empty() && base_ < next_start_) {
      held_.pop_front();
      ++base_;
    }
  }
  void reset() {
    held_.clear();
    first_.clear();
    key_.clear();
    seen_ = next_start_ = base_ = 0;
  }
  // The short windows of the run that ends (unless drop_remainder), then a fresh start.
  void end_run(Emitter& out) {
    while (!drop_remainder_ && next_start_ < seen_) {
      emit((seen_ - 1 - next_start_) / stride_ + 1, out);
      advance();
    }
    held_.clear();
    seen_ = next_start_ = base_ = 0;
  }
  std::string key_of(const Sample& in) const {
    const Tensor& t = in.at(key_field_);
    if (t.num_elements() != 1) throw DataError("key_field '" + key_field_ + "' is " + shape_string(t.shape()) + ", not one value");
    switch (t.dtype()) {
      case DType::Bytes: return "s" + std::string(t.string_at(0));
      case DType::I64: return "i" + std::to_string(t.item<std::int64_t>());
      case DType::I32: return "i" + std::to_string(t.item<std::int32_t>());
      default: throw DataError("key_field '" + key_field_ + "' is " + dtype_name(t.dtype()) + "; give an int64, int32 or text key");
    }
  }
  std::int64_t size_, shift_, stride_;
  bool drop_remainder_;
  std::string key_field_;
  std::string key_;  // the key of the run being windowed
  VaryingSizePool pool_;
  Allocator* allocator_ = &HostAllocator::instance();
  StageCounters* counters_ = nullptr;
  std::deque<Sample> held_;  // the elements from position base_ on
  HeldRows first_;           // the iteration's first element: every other must have its shapes
  std::int64_t seen_ = 0, next_start_ = 0, base_ = 0;
};

// Windows over one field of each element (a whole recording of sensor readings, [T, D]), each
// window an element with the field's rows k*shift + j*stride and the element's other fields.
// With stride 1 a window is a view of the input: nothing is copied.
class WindowField final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"window_field",
            OperatorKind::Expand,
            "Splits a field along its first dimension into windows (size rows, shift apart), one element each",
            {ParamSpec::make("field", ParamType::String, "the field to window (rows along dimension 0)"),
             ParamSpec::make("size", ParamType::Int, "rows per window").range(1, 1e9),
             ParamSpec::make("shift", ParamType::Int, "rows between the starts of two windows; 0: size").def("0").range(0, 1e9),
             ParamSpec::make("stride", ParamType::Int, "step between the rows of a window").def("1").range(1, 1e9),
             drop_remainder_param("drop the short windows at the end of each element")},
            {.stateless = true},
            {}};
  }
  explicit WindowField(const Params& p)
      : field_(p.get_string("field")),
        size_(p.get_int("size")),
        shift_(p.get_int("shift") == 0 ? size_ : p.get_int("shift")),
        stride_(p.get_int("stride")),
        drop_remainder_(p.get_bool("drop_remainder")) {}

  class Windows final : public ExpandCursor {
   public:
    Windows(Sample in, const WindowField& op) : in_(std::move(in)), op_(op), data_(in_.at(op.field_)) {
      if (data_.rank() == 0) throw DataError("cannot window field '" + op.field_ + "': it is a scalar");
      rows_ = data_.shape()[0];
    }
    bool next(Sample& out) override {
      const std::int64_t start = next_window_ * op_.shift_;
      if (start >= rows_) return false;
      const std::int64_t members = std::min(op_.size_, (rows_ - 1 - start) / op_.stride_ + 1);
      if (members < op_.size_ && op_.drop_remainder_) return false;
      ++next_window_;
      out = Sample();
      for (const auto& f : in_.fields()) {
        if (f.name != op_.field_) {
          out.set(f.name, f.tensor);
        } else if (op_.stride_ == 1 || members == 1) {
          out.set(f.name, data_.slice(start, start + members));
        } else {
          std::vector<Tensor> rows;
          std::vector<const Tensor*> pointers;
          rows.reserve(static_cast<std::size_t>(members));
          for (std::int64_t j = 0; j < members; ++j) {
            rows.push_back(data_.row(start + j * op_.stride_));
            pointers.push_back(&rows.back());
          }
          out.set(f.name, stack_tensors(pointers, HostAllocator::instance()));
        }
      }
      out.share_origin(in_);
      return true;
    }

   private:
    Sample in_;
    const WindowField& op_;
    Tensor data_;
    std::int64_t rows_ = 0, next_window_ = 0;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext&, DamageReport&) override {
    return std::make_unique<Windows>(std::move(in), *this);
  }

 private:
  std::string field_;
  std::int64_t size_, shift_, stride_;
  bool drop_remainder_;
};

}  // namespace

void register_sequences(Registrar& registrar) {
  registrar.add<PaddedBatch>();
  registrar.add<RaggedBatch>();
  registrar.add<BucketBySequenceLength>();
  registrar.add<Window>();
  registrar.add<WindowField>();
  register_packing(registrar);
}

}  // namespace sluice::std_ops
