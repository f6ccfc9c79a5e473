#pragma once
/// (6.2) Chunks: many consecutive elements handed from operator to operator in one call, held
/// column by column. Small records (a 49-byte tf.Example) cost the engine more per element than
/// their own work does; a reader, a parser and a batch that pass chunks pay that cost once per
/// chunk. An operator offers the chunked form *besides* its element form by also deriving from
/// ChunkedExpandCursor, ChunkedMap or ChunkedAggregate; the engine uses it where every stage of an
/// edge can, and splits chunks into elements wherever a stage cannot, so element-wise operators
/// (every plugin built before 6.2) keep working unchanged. Outputs are the same byte for byte
/// either way: row r of a chunk is exactly the element the element form would have made.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/operator.hpp"
#include "sluice/sample.hpp"

namespace sluice {

/// One field of the elements of a chunk, for all its rows.
struct Column {
  enum class Layout : std::uint8_t {
    Rows,      ///< `tensor` is [rows, element shape...]; a bytes column is [rows] with offsets
    Constant,  ///< every row holds `tensor` itself (a file's path, shared by its records)
    Spans,     ///< scalar bytes rows viewing `spans` of `buffer` (records inside one read buffer)
    /// (6.3) rows of different lengths: `tensor` is every row's values one after the other along
    /// dimension 0 ([total, step...]), and row r is `tensor` rows [spans[r].offset, + spans[r].length)
    /// (a line's tokens; one row's shape is [length, step...]). Hosts hand Ragged columns only to
    /// operators built against 6.3 or later.
    Ragged,
  };
  struct Span {
    std::uint64_t offset = 0, length = 0;
  };
  std::string name;
  Layout layout = Layout::Rows;
  Tensor tensor;
  std::shared_ptr<Buffer> buffer;
  std::vector<Span> spans;

  /// The type of the column's values: bytes for Spans (whose `tensor` holds nothing), else the tensor's.
  DType dtype() const { return layout == Layout::Spans ? DType::Bytes : tensor.dtype(); }
  /// Row `r` as the element form would hold it.
  Tensor row(std::size_t r) const {
    switch (layout) {
      case Layout::Constant: return tensor;
      case Layout::Spans: return Tensor::bytes_view(buffer, static_cast<std::size_t>(spans[r].offset), static_cast<std::size_t>(spans[r].length));
      case Layout::Ragged: {
        const auto begin = static_cast<std::int64_t>(spans[r].offset);
        return tensor.slice(begin, begin + static_cast<std::int64_t>(spans[r].length));
      }
      case Layout::Rows: break;
    }
    return tensor.row(static_cast<std::int64_t>(r));
  }

  /// (6.3) Row `r`'s shape, rank, size in dimension 0 and values, read without making a tensor
  /// (what an operator walking many rows wants: row() costs a tensor per call).
  std::size_t row_rank() const {
    switch (layout) {
      case Layout::Constant: return tensor.rank();
      case Layout::Spans: return 0;
      case Layout::Ragged: return tensor.rank();
      case Layout::Rows: break;
    }
    return tensor.rank() - 1;
  }
  /// Size of row `r` in dimension 0 (row_rank() >= 1).
  std::int64_t row_length(std::size_t r) const {
    switch (layout) {
      case Layout::Constant: return tensor.shape()[0];
      case Layout::Spans: return 1;
      case Layout::Ragged: return static_cast<std::int64_t>(spans[r].length);
      case Layout::Rows: break;
    }
    return tensor.shape()[1];
  }
  Shape row_shape(std::size_t r) const {
    switch (layout) {
      case Layout::Constant: return tensor.shape();
      case Layout::Spans: return {};
      case Layout::Ragged: {
        Shape s = tensor.shape();
        s[0] = static_cast<std::int64_t>(spans[r].length);
        return s;
      }
      case Layout::Rows: break;
    }
    return Shape(tensor.shape().begin() + 1, tensor.shape().end());
  }
  /// Values in one step of dimension 0 of a row (1 for rank 1): the product of the dimensions after it.
  std::int64_t step_elements() const {
    const Shape& s = tensor.shape();
    std::size_t skip = layout == Layout::Rows ? 2 : 1;
    std::int64_t n = 1;
    for (std::size_t d = skip; d < s.size(); ++d) n *= s[d];
    return n;
  }
  std::int64_t row_elements(std::size_t r) const {
    switch (layout) {
      case Layout::Constant: return tensor.num_elements();
      case Layout::Spans: return 1;
      case Layout::Ragged: return static_cast<std::int64_t>(spans[r].length) * step_elements();
      case Layout::Rows: break;
    }
    return tensor.shape()[0] > 0 ? tensor.num_elements() / tensor.shape()[0] : 0;
  }
  /// The first value of row `r` of a numeric column (its values follow, row-major).
  const std::byte* row_data(std::size_t r) const {
    const std::size_t value = dtype_size(tensor.dtype());
    switch (layout) {
      case Layout::Constant: return tensor.raw_data();
      case Layout::Spans: return nullptr;
      case Layout::Ragged: return tensor.raw_data() + static_cast<std::size_t>(spans[r].offset) * static_cast<std::size_t>(step_elements()) * value;
      case Layout::Rows: break;
    }
    return tensor.raw_data() + r * static_cast<std::size_t>(row_elements(r)) * value;
  }
  /// Value `k` (row-major) of row `r` of a bytes column.
  std::string_view row_string(std::size_t r, std::int64_t k) const {
    switch (layout) {
      case Layout::Constant: return tensor.string_at(k);
      case Layout::Spans: return string_at(r);
      case Layout::Ragged: return tensor.string_at(static_cast<std::int64_t>(spans[r].offset) * step_elements() + k);
      case Layout::Rows: break;
    }
    return tensor.string_at(static_cast<std::int64_t>(r) * row_elements(r) + k);
  }
  /// Row `r` of a bytes column as text, without making a tensor.
  std::string_view string_at(std::size_t r) const {
    switch (layout) {
      case Layout::Constant: return tensor.string_at(0);
      case Layout::Spans:
        return {reinterpret_cast<const char*>(buffer->data()) + spans[r].offset, static_cast<std::size_t>(spans[r].length)};
      case Layout::Ragged: return row_string(r, 0);
      case Layout::Rows: break;
    }
    return tensor.string_at(static_cast<std::int64_t>(r));
  }
  std::size_t nbytes() const {
    if (layout == Layout::Constant || layout == Layout::Rows || (layout == Layout::Ragged && tensor.dtype() == DType::Bytes))
      return tensor.nbytes();
    std::size_t n = 0;
    for (const auto& s : spans) n += s.length;
    return layout == Layout::Spans ? n : n * static_cast<std::size_t>(step_elements()) * dtype_size(tensor.dtype());
  }
};

/// Consecutive elements of one stage's output (rows), with their fields as columns in the order
/// the element form would have set them, and where each row came from.
class Chunk {
 public:
  std::size_t rows() const { return rows_; }
  void set_rows(std::size_t rows) { rows_ = rows; }

  std::vector<Column>& columns() { return columns_; }
  const std::vector<Column>& columns() const { return columns_; }
  Column& add(std::string name, Column::Layout layout) {
    columns_.push_back(Column{std::move(name), layout, {}, {}, {}});
    return columns_.back();
  }
  const Column* find(std::string_view name) const {
    for (const auto& c : columns_)
      if (c.name == name) return &c;
    return nullptr;
  }
  const Column& at(std::string_view name) const {
    if (const Column* c = find(name)) return *c;
    std::string have;
    for (const auto& c : columns_) have += (have.empty() ? "" : ", ") + c.name;
    throw DataError("element has no field '" + std::string(name) + "' (fields: " + (have.empty() ? "none" : have) + ")");
  }

  /// Origins: one description shared by every row (a file), and per row its record index and
  /// byte offset there (left empty when the rows have none), and the read position of row 0 (set
  /// by the host; row r is at read_index + r).
  void set_where(std::shared_ptr<const std::string> where) { where_ = std::move(where); }
  const std::shared_ptr<const std::string>& where() const { return where_; }
  std::vector<std::int64_t>& records() { return records_; }
  std::vector<std::int64_t>& byte_offsets() { return byte_offsets_; }
  const std::vector<std::int64_t>& records() const { return records_; }
  const std::vector<std::int64_t>& byte_offsets() const { return byte_offsets_; }
  void set_read_position(std::uint64_t epoch, std::int64_t index) {
    read_epoch_ = epoch;
    read_index_ = index;
  }
  /// No row has a read position any more (the host's: rows it cannot name by where they were read).
  void forget_read_positions() {
    read_index_ = -1;
    read_indices_.clear();
  }
  Origin origin(std::size_t r) const {
    Origin o{where_, r < records_.size() ? records_[r] : -1, r < byte_offsets_.size() ? byte_offsets_[r] : -1};
    o.read_epoch = read_epoch();
    o.read_index = read_index_of(r);
    return o;
  }
  /// Row `r`'s read position, as origin(r) gives it (-1, and epoch 0, when the rows have none).
  std::int64_t read_index_of(std::size_t r) const {
    if (!read_indices_.empty()) return read_indices_[r];
    return read_index_ < 0 ? -1 : read_index_ + static_cast<std::int64_t>(r);
  }
  std::uint64_t read_epoch() const { return read_index_ >= 0 || !read_indices_.empty() ? read_epoch_ : 0; }
  /// Copies the origins of rows [begin, end) of `from` (row k here is row begin + k there).
  void share_origins(const Chunk& from, std::size_t begin, std::size_t end) {
    where_ = from.where_;
    auto part = [&](const std::vector<std::int64_t>& v, std::vector<std::int64_t>& into) {
      into.assign(v.begin() + static_cast<std::ptrdiff_t>(std::min(begin, v.size())), v.begin() + static_cast<std::ptrdiff_t>(std::min(end, v.size())));
    };
    part(from.records_, records_);
    part(from.byte_offsets_, byte_offsets_);
    part(from.read_indices_, read_indices_);
    read_epoch_ = from.read_epoch_;
    read_index_ = from.read_index_ < 0 ? -1 : from.read_index_ + static_cast<std::int64_t>(begin);
  }
  /// Copies the origins of the listed rows of `from`, in that order (the rows a map kept).
  void gather_origins(const Chunk& from, const std::vector<std::size_t>& rows) {
    where_ = from.where_;
    auto pick = [&](const std::vector<std::int64_t>& v, std::vector<std::int64_t>& into) {
      into.clear();
      if (v.empty()) return;
      into.reserve(rows.size());
      for (auto r : rows) into.push_back(v[r]);
    };
    pick(from.records_, records_);
    pick(from.byte_offsets_, byte_offsets_);
    read_epoch_ = from.read_epoch_;
    read_index_ = -1;
    read_indices_.clear();
    if (from.read_index_ >= 0 || !from.read_indices_.empty())
      for (auto r : rows) read_indices_.push_back(from.origin(r).read_index);
  }

  /// Rows [begin, end), sharing the columns' memory.
  Chunk slice(std::size_t begin, std::size_t end) const {
    if (begin > end || end > rows_) throw Error("Chunk::slice: rows outside the chunk");
    Chunk part;
    part.rows_ = end - begin;
    part.share_origins(*this, begin, end);
    for (const auto& c : columns_) {
      Column& to = part.add(c.name, c.layout);
      switch (c.layout) {
        case Column::Layout::Constant: to.tensor = c.tensor; break;
        case Column::Layout::Spans:
        case Column::Layout::Ragged:
          to.buffer = c.buffer;
          to.tensor = c.tensor;
          to.spans.assign(c.spans.begin() + static_cast<std::ptrdiff_t>(begin), c.spans.begin() + static_cast<std::ptrdiff_t>(end));
          break;
        case Column::Layout::Rows:
          to.tensor = c.tensor.slice(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end));
          break;
      }
    }
    return part;
  }

  /// Row `r` as the element form would have made it.
  Sample row(std::size_t r) const {
    Sample s;
    s.reserve(columns_.size());
    for (const auto& c : columns_) s.set(c.name, c.row(r));
    const Origin o = origin(r);
    if (o.where) s.set_origin(o.where, o.record, o.byte_offset);
    if (o.read_index >= 0) s.set_read_position(o.read_epoch, o.read_index);
    return s;
  }
  std::size_t nbytes() const {
    std::size_t n = 0;
    for (const auto& c : columns_) n += c.nbytes();
    return n;
  }

 private:
  std::size_t rows_ = 0;
  std::vector<Column> columns_;
  std::shared_ptr<const std::string> where_;
  std::vector<std::int64_t> records_, byte_offsets_;
  std::uint64_t read_epoch_ = 0;
  std::int64_t read_index_ = -1;
  std::vector<std::int64_t> read_indices_;  // per row, once rows were left out; else read_index_ + r
};

/// The listed rows of `column`, in that order (a Constant column stays as it is).
inline Column gather_rows(const Column& column, const std::vector<std::size_t>& rows) {
  Column out{column.name, column.layout, {}, {}, {}};
  switch (column.layout) {
    case Column::Layout::Constant: out.tensor = column.tensor; break;
    case Column::Layout::Spans:
    case Column::Layout::Ragged:
      out.buffer = column.buffer;
      out.tensor = column.tensor;
      out.spans.reserve(rows.size());
      for (auto r : rows) out.spans.push_back(column.spans[r]);
      break;
    case Column::Layout::Rows: {
      Shape shape = column.tensor.shape();
      shape[0] = static_cast<std::int64_t>(rows.size());
      if (column.tensor.dtype() == DType::Bytes) {
        std::vector<std::string_view> views;
        const std::int64_t per_row = column.tensor.shape()[0] > 0 ? column.tensor.num_elements() / column.tensor.shape()[0] : 0;
        for (auto r : rows)
          for (std::int64_t k = 0; k < per_row; ++k) views.push_back(column.tensor.string_at(static_cast<std::int64_t>(r) * per_row + k));
        out.tensor = Tensor::from_strings(views, shape);
      } else {
        out.tensor = Tensor::empty(column.tensor.dtype(), shape);
        const std::size_t row_bytes = column.tensor.shape()[0] > 0 ? column.tensor.nbytes() / static_cast<std::size_t>(column.tensor.shape()[0]) : 0;
        for (std::size_t k = 0; k < rows.size(); ++k)
          std::memcpy(out.tensor.raw_data() + k * row_bytes, column.tensor.raw_data() + rows[k] * row_bytes, row_bytes);
      }
      break;
    }
  }
  return out;
}

/// Thrown by a chunked call for one row: what the element form would have thrown for that element.
/// The engine names the row's origin and index, as it does for an element.
class RowError : public DataError {
 public:
  RowError(std::size_t row, const std::string& reason) : DataError(reason), row_(row) {}
  std::size_t row() const { return row_; }

 private:
  std::size_t row_;
};

/// Rows of a chunked call that fail, one at a time, under the stage's error policy.
class RowIssues {
 public:
  virtual ~RowIssues() = default;
  /// Row `row` of the input failed for `reason`. True under the skip policy: the row is counted and
  /// reported by its origin, and the operator leaves it out and goes on. False: the operator throws
  /// RowError(row, reason) at once.
  virtual bool skip_row(std::size_t row, const std::string& reason) = 0;
};

/// An ExpandCursor (same object) that can also hand out its next outputs as one chunk.
class ChunkedExpandCursor {
 public:
  virtual ~ChunkedExpandCursor() = default;
  /// Fills `out` with at least one and at most `max_rows` next outputs (row r is what next() would
  /// have given), true; false once the input is exhausted. Damage is reported as next() does.
  virtual bool next_chunk(Chunk& out, std::size_t max_rows) = 0;
};

/// A Map (same object) that can also map a whole chunk in one call.
class ChunkedMap {
 public:
  virtual ~ChunkedMap() = default;
  /// Whether this operator, with its parameters, takes chunks (a parser may only for some specs).
  virtual bool maps_chunks() const { return true; }
  /// The outputs of the rows of `in`, in order, row for row what map() would give (rows that fail
  /// go to `issues`, see RowIssues). `first` is the context of row 0: row r has index first.index
  /// + r, and draws, if any, with ElementContext{first.stage, first.epoch, first.index + r}.rng().
  /// Set the output's origins from the input's (Chunk::share_origins, leaving out dropped rows).
  virtual Chunk map_chunk(const Chunk& in, const ElementContext& first, RowIssues& issues) = 0;
};

/// An Aggregate (same object) that can also take a whole chunk in one call.
class ChunkedAggregate {
 public:
  virtual ~ChunkedAggregate() = default;
  /// Pushes the rows of `in` in order, as push() of each would (same outputs, same state); `first`
  /// is the context of row 0. A row the element form would refuse is thrown as RowError(row, ...)
  /// before anything of it is taken; the rows before it are taken (the host pushes the rows after
  /// it in a new call). Any other exception must leave the operator as it was before the call: the
  /// host then pushes the rows one by one with push().
  virtual Aggregate::Flow push_chunk(const Chunk& in, const ElementContext& first, Emitter& out) = 0;
};

}  // namespace sluice
