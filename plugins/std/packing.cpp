// pack_sequences: short sequences packed into rows of a fixed token budget.
#include <algorithm>
#include <cstring>
#include <deque>

#include "sequence_layout.hpp"
#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// First-fit packing, the way Grain and the large-model trainers feed sequences without padding:
// up to open_rows rows of `length` tokens are open at once; each sequence goes into the first
// open row with room for it, else a new row opens (the oldest row leaves when open_rows are
// open). Each row carries FIELD for every packed field, padded with 0 after its last sequence,
// plus segment ids (1, 2, ... per sequence in the row, 0 on padding) and positions (0, 1, ...
// within each sequence), which attention masks and position embeddings are built from.
// Deterministic: rows depend on the input order only.
class PackSequences final : public Aggregate, public ChunkedAggregate {
 public:
  static OperatorInfo describe() {
    return {"pack_sequences",
            OperatorKind::Aggregate,
            "Packs variable-length sequences first-fit into rows of `length` tokens, with segment ids and positions",
            {ParamSpec::make("fields", ParamType::StringList,
                             "the sequence fields to pack (equal lengths within an element); the element may hold no others"),
             ParamSpec::make("length", ParamType::Int, "tokens per packed row").range(1, 1e9),
             ParamSpec::make("open_rows", ParamType::Int, "rows open for first-fit at once; more packs tighter").def("8").range(1, 1e5),
             ParamSpec::make("too_long", ParamType::Choice,
                             "a sequence longer than length: split into pieces of length (no token lost), truncate it, or fail")
                 .def("split")
                 .one_of({"split", "truncate", "fail"}),
             ParamSpec::make("segment_field", ParamType::String, "name of the segment ids field (int32)").def("segment_ids"),
             ParamSpec::make("position_field", ParamType::String, "name of the positions field (int32)").def("positions")},
            {.saves_state = true},
            {}};
  }
  explicit PackSequences(const Params& p)
      : fields_(p.get_string_list("fields")),
        length_(p.get_int("length")),
        open_rows_(static_cast<std::size_t>(p.get_int("open_rows"))),
        fail_too_long_(p.get_string("too_long") == "fail"),
        truncate_too_long_(p.get_string("too_long") == "truncate"),
        segment_field_(p.get_string("segment_field")),
        position_field_(p.get_string("position_field")) {
    if (fields_.empty()) throw ParamError("fields is empty; name the sequence fields to pack");
    for (const auto& f : fields_)
      if (f == segment_field_ || f == position_field_)
        throw ParamError("field '" + f + "' is packed and also names the segment ids or positions; rename one");
  }
  void start(const StageInfo& info) override {
    allocator_ = pool_.for_stage(info);
    counters_ = info.counters;
  }
  void begin_iteration(std::uint64_t) override { rows_.clear(); }

  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    const auto chunk = chunk_of_element(std::move(in));
    const std::vector<const Column*> columns = check(*chunk);
    pack_row(*chunk, columns, 0, out);
    return Flow::Continue;
  }
  // What is refused for every row alike (a field's type or shape) is thrown before any row is
  // taken, as a DataError: the host then pushes the rows one by one and each is named.
  Flow push_chunk(const Chunk& in, const ElementContext&, Emitter& out) override {
    const std::vector<const Column*> columns = check(in);
    for (std::size_t r = 0; r < in.rows(); ++r) {
      try {
        pack_row(in, columns, r, out);
      } catch (const DataError& e) {
        throw RowError(r, e.what());
      }
    }
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    for (auto& row : rows_)
      if (!emit(row, out)) break;
    rows_.clear();
  }
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(rows_.size());
    for (const auto& row : rows_) {
      w.put(row.used);
      w.put(row.segments);
      // Built here from several sequences: kept by value, not as a reference to its first record.
      Sample built = row.sample;
      const Origin& origin = row.sample.shared_origin();
      built.set_origin(origin.where, origin.record, origin.byte_offset);
      w.put_element(built);
    }
    w.describe(std::to_string(rows_.size()) + " rows open");
  }
  void restore_state(StateReader& r) override {
    rows_.clear();
    const auto n = r.get<std::uint64_t>();
    if (n > open_rows_) throw DataError("the saved state holds " + std::to_string(n) + " open rows, more than open_rows");
    for (std::uint64_t k = 0; k < n; ++k) {
      Row row;
      row.used = r.get_within<std::int64_t>(0, length_, "an open row's tokens");
      row.segments = r.get_within<std::int32_t>(0, static_cast<std::int32_t>(std::min<std::int64_t>(length_, 1 << 30)), "an open row's sequences");
      row.sample = r.get_element();
      // A saved row is a copy the host made; later sequences are written into it.
      for (auto& f : row.sample.fields()) f.tensor = own_copy(f.tensor);
      rows_.push_back(std::move(row));
    }
  }

 private:
  struct Row {
    Sample sample;
    std::int64_t used = 0;     // tokens placed
    std::int32_t segments = 0; // sequences placed
  };

  // The packed fields' columns, in the order of fields_; throws DataError when the rows' fields
  // cannot be packed with the others (the same for every row of a chunk). Nothing is changed.
  std::vector<const Column*> check(const Chunk& in) const {
    for (const auto& c : in.columns())
      if (std::find(fields_.begin(), fields_.end(), c.name) == fields_.end())
        throw DataError("the element has a field '" + c.name +
                        "' that is not packed; list it in fields, or remove it before this stage (select_fields)");
    std::vector<const Column*> columns;
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      const std::string& name = fields_[f];
      const Column& c = in.at(name);
      if (c.row_rank() == 0 || c.dtype() == DType::Bytes)
        throw DataError("field '" + name + "' is " + dtype_name(c.dtype()) + shape_string(c.row_shape(0)) +
                        ": packing takes numeric sequences (token ids, features per step)");
      if (!row_blocks_.empty() && (row_blocks_[f].dtype != c.dtype() || step_of(row_blocks_[f].shape) != step_of(c.row_shape(0))))
        throw DataError("field '" + name + "' has steps of " + dtype_name(c.dtype()) + shape_string(step_of(c.row_shape(0))) + " here and " +
                        dtype_name(row_blocks_[f].dtype) + shape_string(step_of(row_blocks_[f].shape)) + " before");
      columns.push_back(&c);
    }
    return columns;
  }
  // A sequence's shape less its length: what each of its steps is.
  static Shape step_of(const Shape& row) { return Shape(row.begin() + 1, row.end()); }

  // Packs row `r`: throws DataError, having taken nothing of it, when its fields differ in length
  // or it is too long to pack.
  void pack_row(const Chunk& in, const std::vector<const Column*>& columns, std::size_t r, Emitter& out) {
    const std::int64_t tokens = columns.front()->row_length(r);
    for (std::size_t f = 1; f < columns.size(); ++f)
      if (columns[f]->row_length(r) != tokens)
        throw DataError("field '" + fields_[f] + "' has " + std::to_string(columns[f]->row_length(r)) + " steps and '" + fields_.front() +
                        "' " + std::to_string(tokens) + ": packed fields must be equally long within an element");
    if (tokens > length_ && fail_too_long_)
      throw DataError("a sequence of " + std::to_string(tokens) + " tokens is longer than a packed row (length " +
                      std::to_string(length_) + "); raise length, or set too_long: split or truncate");
    if (row_blocks_.empty()) lay_out_rows(columns);  // the first row taken: every later one has its steps
    const std::int64_t kept = truncate_too_long_ ? std::min(tokens, length_) : tokens;
    // An empty sequence has no token to place: it takes no segment.
    for (std::int64_t from = 0; from < kept; from += length_) place(in, columns, r, from, std::min(length_, kept - from), out);
  }

  // Tokens [from, from + count) of row `r` into the first open row with room.
  void place(const Chunk& in, const std::vector<const Column*>& columns, std::size_t r, std::int64_t from, std::int64_t count,
             Emitter& out) {
    Row* row = nullptr;
    for (auto& open : rows_)
      if (length_ - open.used >= count) {
        row = &open;
        break;
      }
    if (!row) {
      if (rows_.size() == open_rows_) {
        emit(rows_.front(), out);
        rows_.pop_front();
      }
      rows_.push_back(new_row());
      row = &rows_.back();
    }
    for (std::size_t f = 0; f < columns.size(); ++f) {
      const Column& src = *columns[f];
      Tensor& dst = *row->sample.find(fields_[f]);
      const std::size_t step_bytes = static_cast<std::size_t>(src.step_elements()) * dtype_size(src.dtype());
      if (count) std::memcpy(dst.raw_data() + static_cast<std::size_t>(row->used) * step_bytes,
                             src.row_data(r) + static_cast<std::size_t>(from) * step_bytes,
                             static_cast<std::size_t>(count) * step_bytes);
    }
    ++row->segments;
    auto* segments = row->sample.find(segment_field_)->data<std::int32_t>();
    auto* positions = row->sample.find(position_field_)->data<std::int32_t>();
    for (std::int64_t j = 0; j < count; ++j) {
      segments[row->used + j] = row->segments;
      positions[row->used + j] = static_cast<std::int32_t>(j);
    }
    row->used += count;
    if (!row->sample.has_origin()) share_origin(row->sample, in, r);
  }
  bool emit(Row& row, Emitter& out) {
    if (counters_) {
      std::uint64_t step_values = 0;  // values per token, over the packed fields
      for (const auto& name : fields_) step_values += static_cast<std::uint64_t>(row.sample.find(name)->num_elements() / length_);
      counters_->add_padding(static_cast<std::uint64_t>(length_ - row.used) * step_values, static_cast<std::uint64_t>(row.used) * step_values);
    }
    return out.push(std::move(row.sample));
  }
  // The packed rows' layout, from the first row's fields (their types and steps; check() holds
  // every later row to them). Worked out once: a row then costs its tensors' shapes and nothing
  // else (a packed row is a few hundred bytes, and each allocation per row was a tenth of this
  // stage's time).
  void lay_out_rows(const std::vector<const Column*>& columns) {
    for (const Column* c : columns) {
      Shape shape = c->row_shape(0);
      shape[0] = length_;
      row_blocks_.push_back({c->name, c->dtype(), std::move(shape)});
    }
    row_blocks_.push_back({segment_field_, DType::I32, Shape{length_}});
    row_blocks_.push_back({position_field_, DType::I32, Shape{length_}});
    for (const auto& b : row_blocks_) row_bytes_ += aligned(static_cast<std::size_t>(shape_elements(b.shape)) * dtype_size(b.dtype));
  }
  // A new row, zeroed. Its fields' blocks are carved one after another from a shared slab: one
  // allocation for many rows, not one per field of each (a row lives only until the batch after
  // this stage copies it; the slab, until its last row has gone).
  Row new_row() {
    Row row;
    row.sample.reserve(row_blocks_.size());
    if (!slab_ || slab_used_ + row_bytes_ > slab_->size()) {
      slab_ = allocator_->allocate(std::max(kSlabBytes, row_bytes_));
      slab_used_ = 0;
    }
    std::memset(slab_->data() + slab_used_, 0, row_bytes_);
    for (const auto& b : row_blocks_) {
      Tensor block = Tensor::view(b.dtype, b.shape, slab_, slab_used_);
      slab_used_ += aligned(block.nbytes());
      row.sample.set(b.name, std::move(block));
    }
    return row;
  }
  static std::size_t aligned(std::size_t bytes) { return (bytes + 63) & ~std::size_t{63}; }
  Tensor own_copy(const Tensor& t) const {
    if (t.dtype() == DType::Bytes) throw DataError("the saved packed row holds a bytes field");
    Tensor copy = Tensor::empty(t.dtype(), t.shape(), *allocator_);
    if (t.nbytes()) std::memcpy(copy.raw_data(), t.raw_data(), t.nbytes());
    return copy;
  }

  std::vector<std::string> fields_;
  std::int64_t length_;
  std::size_t open_rows_;
  bool fail_too_long_, truncate_too_long_;  // else split
  std::string segment_field_, position_field_;
  VaryingSizePool pool_;
  Allocator* allocator_ = &HostAllocator::instance();
  StageCounters* counters_ = nullptr;
  std::deque<Row> rows_;  // open rows, oldest first
  static constexpr std::size_t kSlabBytes = 1 << 16;
  std::shared_ptr<Buffer> slab_;  // where new rows are carved
  std::size_t slab_used_ = 0;
  // A packed row's tensors, in order (the packed fields as in fields_, then segment ids and
  // positions), from the first row taken; none before. And the bytes of slab one row takes.
  struct RowBlock {
    std::string name;
    DType dtype;
    Shape shape;
  };
  std::vector<RowBlock> row_blocks_;
  std::size_t row_bytes_ = 0;
};

}  // namespace

void register_packing(Registrar& registrar) { registrar.add<PackSequences>(); }

}  // namespace sluice::std_ops
