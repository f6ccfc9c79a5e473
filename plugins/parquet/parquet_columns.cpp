// Arrow's arrays as chunk columns: numbers as views of Arrow's own buffers where Sluice has the
// same type (copied into the nearest wider one where it has not: int8, uint16/32/64, bool),
// strings and binary as spans of Arrow's value buffer, lists of varying length as ragged
// columns, lists of fixed length as tensors, structs flattened as "a/b".
#include <arrow/api.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "parquet_format.hpp"
#include "sluice/error.hpp"

namespace sluice::parquet_files {
namespace {

// Arrow's buffer as a Sluice buffer that keeps it alive.
std::shared_ptr<Buffer> shared_buffer(const std::shared_ptr<arrow::Buffer>& b) {
  static std::byte nothing[1];
  auto* data = b && b->size() > 0 ? const_cast<std::byte*>(reinterpret_cast<const std::byte*>(b->data())) : nothing;
  return std::make_shared<Buffer>(data, b ? static_cast<std::size_t>(b->size()) : 0, [keep = b](std::byte*, std::size_t) {});
}

// The Sluice type a fixed-width Arrow type is viewed as, when their bytes agree.
std::optional<DType> viewed_type(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::UINT8: return DType::U8;
    case arrow::Type::INT16: return DType::I16;
    case arrow::Type::INT32:
    case arrow::Type::DATE32:
    case arrow::Type::TIME32: return DType::I32;
    case arrow::Type::INT64:
    case arrow::Type::DATE64:
    case arrow::Type::TIMESTAMP:
    case arrow::Type::TIME64:
    case arrow::Type::DURATION: return DType::I64;
    case arrow::Type::HALF_FLOAT: return DType::F16;
    case arrow::Type::FLOAT: return DType::F32;
    case arrow::Type::DOUBLE: return DType::F64;
    default: return std::nullopt;
  }
}
// The wider Sluice type the other numbers are copied into.
std::optional<DType> copied_type(arrow::Type::type id) {
  switch (id) {
    case arrow::Type::BOOL: return DType::U8;
    case arrow::Type::INT8: return DType::I16;
    case arrow::Type::UINT16: return DType::I32;
    case arrow::Type::UINT32:
    case arrow::Type::UINT64: return DType::I64;
    default: return std::nullopt;
  }
}
bool holds_bytes(arrow::Type::type id) {
  return id == arrow::Type::STRING || id == arrow::Type::BINARY || id == arrow::Type::LARGE_STRING || id == arrow::Type::LARGE_BINARY ||
         id == arrow::Type::FIXED_SIZE_BINARY || id == arrow::Type::STRING_VIEW || id == arrow::Type::BINARY_VIEW;
}

// One column being converted: where it is, for errors, and what its nulls become.
struct ColumnContext {
  const std::string& file;
  std::string column;
  std::int64_t first_row;
  const NullPolicy& nulls;

  // The fill value of this column's nulls, or a DataError naming where the null is.
  const std::string* null_at(const std::string& where) const {
    if (!nulls.fill)
      throw DataError(file + ": column '" + column + "' holds a null " + where +
                      "; read it with nulls: default (a default per field with null_defaults), or leave the column out with columns:");
    auto it = nulls.defaults.find(column);
    return it == nulls.defaults.end() ? nullptr : &it->second;
  }
  std::string row_text(std::int64_t row) const { return "at row " + std::to_string(first_row + row); }
};

std::string view_of(const arrow::Array& a, std::int64_t i) {
  switch (a.type_id()) {
    case arrow::Type::STRING:
    case arrow::Type::BINARY: return std::string(static_cast<const arrow::BinaryArray&>(a).GetView(i));
    case arrow::Type::LARGE_STRING:
    case arrow::Type::LARGE_BINARY: return std::string(static_cast<const arrow::LargeBinaryArray&>(a).GetView(i));
    case arrow::Type::FIXED_SIZE_BINARY: return std::string(static_cast<const arrow::FixedSizeBinaryArray&>(a).GetView(i));
    case arrow::Type::STRING_VIEW:
    case arrow::Type::BINARY_VIEW: return std::string(static_cast<const arrow::BinaryViewArray&>(a).GetView(i));
    default: throw Error("parquet: not a binary array");
  }
}

template <class T> T number_from(const std::string& text, const ColumnContext& ctx) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return static_cast<T>(v);
  } catch (const std::exception&) {
  }
  throw ParamError("null_defaults: '" + ctx.column + "=" + text + "' is not a number, and column '" + ctx.column + "' of " + ctx.file +
                   " holds numbers");
}

// Copies values [begin, begin + n) of a numeric array into `to` (n values of type T), nulls
// replaced by the policy's value.
template <class T, class ArrowArray> void copy_numbers(const ArrowArray& a, std::int64_t begin, std::int64_t n, T* to, const ColumnContext& ctx,
                                                        const std::function<std::string(std::int64_t)>& where) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (a.IsNull(begin + i)) {
      const std::string* fill = ctx.null_at(where(begin + i));
      to[i] = fill ? number_from<T>(*fill, ctx) : T{};
      continue;
    }
    const auto v = a.Value(begin + i);
    if constexpr (std::is_same_v<ArrowArray, arrow::UInt64Array>)
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw DataError(ctx.file + ": column '" + ctx.column + "' holds " + std::to_string(v) + " " + where(begin + i) +
                        ", past int64, the widest integer Sluice holds; leave the column out with columns:");
    to[i] = static_cast<T>(v);
  }
}

// Values [begin, begin + n) of a fixed-width array as a tensor of `shape` (n elements): a view of
// Arrow's buffer when the types agree and no value is null, else a copy.
Tensor numbers(const arrow::Array& a, std::int64_t begin, std::int64_t n, Shape shape, const ColumnContext& ctx,
               const std::function<std::string(std::int64_t)>& where) {
  const auto id = a.type_id();
  const bool nulls = a.null_count() > 0 && arrow::internal::CountSetBits(a.null_bitmap_data(), a.offset() + begin, n) != n;
  if (auto dtype = viewed_type(id); dtype && !nulls)
    return Tensor::view(*dtype, std::move(shape), shared_buffer(a.data()->buffers[1]),
                        static_cast<std::size_t>(a.offset() + begin) * dtype_size(*dtype));
  const auto dtype = viewed_type(id) ? viewed_type(id) : copied_type(id);
  if (!dtype) throw Error("parquet: numbers() of a type without a tensor");
  Tensor t = Tensor::empty(*dtype, std::move(shape));
  switch (id) {
    case arrow::Type::BOOL: {
      auto& b = static_cast<const arrow::BooleanArray&>(a);
      auto* to = t.data<std::uint8_t>();
      for (std::int64_t i = 0; i < n; ++i) {
        const std::string* fill = b.IsNull(begin + i) ? ctx.null_at(where(begin + i)) : nullptr;
        to[i] = b.IsNull(begin + i) ? (fill ? number_from<std::uint8_t>(*fill, ctx) : 0) : b.Value(begin + i);
      }
      break;
    }
    case arrow::Type::INT8: copy_numbers(static_cast<const arrow::Int8Array&>(a), begin, n, t.data<std::int16_t>(), ctx, where); break;
    case arrow::Type::UINT8: copy_numbers(static_cast<const arrow::UInt8Array&>(a), begin, n, t.data<std::uint8_t>(), ctx, where); break;
    case arrow::Type::INT16: copy_numbers(static_cast<const arrow::Int16Array&>(a), begin, n, t.data<std::int16_t>(), ctx, where); break;
    case arrow::Type::UINT16: copy_numbers(static_cast<const arrow::UInt16Array&>(a), begin, n, t.data<std::int32_t>(), ctx, where); break;
    case arrow::Type::INT32:
    case arrow::Type::DATE32:
    case arrow::Type::TIME32: copy_numbers(static_cast<const arrow::Int32Array&>(a), begin, n, t.data<std::int32_t>(), ctx, where); break;
    case arrow::Type::UINT32: copy_numbers(static_cast<const arrow::UInt32Array&>(a), begin, n, t.data<std::int64_t>(), ctx, where); break;
    case arrow::Type::UINT64: copy_numbers(static_cast<const arrow::UInt64Array&>(a), begin, n, t.data<std::int64_t>(), ctx, where); break;
    case arrow::Type::FLOAT: copy_numbers(static_cast<const arrow::FloatArray&>(a), begin, n, t.data<float>(), ctx, where); break;
    case arrow::Type::DOUBLE: copy_numbers(static_cast<const arrow::DoubleArray&>(a), begin, n, t.data<double>(), ctx, where); break;
    case arrow::Type::HALF_FLOAT: {  // the raw 16 bits; a null's default is written as zero bits unless it is 0
      auto& h = static_cast<const arrow::HalfFloatArray&>(a);
      auto* to = reinterpret_cast<std::uint16_t*>(t.raw_data());
      for (std::int64_t i = 0; i < n; ++i) {
        if (h.IsNull(begin + i)) ctx.null_at(where(begin + i));
        to[i] = h.IsNull(begin + i) ? 0 : h.Value(begin + i);
      }
      break;
    }
    default:  // 64-bit times and dates, durations
      copy_numbers(static_cast<const arrow::Int64Array&>(a), begin, n, t.data<std::int64_t>(), ctx, where);
  }
  return t;
}

// Strings [begin, begin + n) of a binary array as a bytes tensor of `shape` (a copy).
Tensor strings(const arrow::Array& a, std::int64_t begin, std::int64_t n, Shape shape, const ColumnContext& ctx,
               const std::function<std::string(std::int64_t)>& where) {
  std::vector<std::string> held(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (a.IsNull(begin + i)) {
      const std::string* fill = ctx.null_at(where(begin + i));
      if (fill) held[static_cast<std::size_t>(i)] = *fill;
    } else {
      held[static_cast<std::size_t>(i)] = view_of(a, begin + i);
    }
  }
  std::vector<std::string_view> views(held.begin(), held.end());
  return Tensor::from_strings(views, std::move(shape));
}

// The values under nested lists of fixed size, from element `begin` for `n` elements of `a`:
// the innermost array, its range, and the sizes of the levels passed (appended to `dims`).
struct Innermost {
  const arrow::Array* values;
  std::int64_t begin, n;
};
Innermost descend_fixed_lists(const arrow::Array& a, std::int64_t begin, std::int64_t n, Shape& dims, const ColumnContext& ctx,
                              const std::function<std::string(std::int64_t)>& where) {
  const arrow::Array* at = &a;
  while (at->type_id() == arrow::Type::FIXED_SIZE_LIST) {
    auto& list = static_cast<const arrow::FixedSizeListArray&>(*at);
    for (std::int64_t i = 0; list.null_count() > 0 && i < n; ++i)
      if (list.IsNull(begin + i)) ctx.null_at(where(begin + i));  // a null list of fixed size: its values (zeros) stand in
    const std::int64_t size = list.value_length();
    dims.push_back(size);
    begin = list.value_offset(begin);
    n *= size;
    at = list.values().get();
  }
  return {at, begin, n};
}

Tensor leaf_values(const arrow::Array& leaf, std::int64_t begin, std::int64_t n, Shape shape, const ColumnContext& ctx,
                   const std::function<std::string(std::int64_t)>& where) {
  if (holds_bytes(leaf.type_id())) return strings(leaf, begin, n, std::move(shape), ctx, where);
  if (viewed_type(leaf.type_id()) || copied_type(leaf.type_id())) return numbers(leaf, begin, n, std::move(shape), ctx, where);
  throw DataError(ctx.file + ": column '" + ctx.column + "' holds " + leaf.type()->ToString() +
                  " values, which Sluice has no tensor type for; leave it out with columns:");
}

// Each row of a list array as a span of its values, past the first row's (read from Arrow's
// offsets directly: this runs once a row of every list column).
template <class List>
void list_spans(const List& list, std::int64_t rows, const ColumnContext& ctx, std::vector<Column::Span>& spans) {
  const auto* offsets = list.raw_value_offsets();
  const std::int64_t first = rows > 0 ? offsets[0] : 0;
  const bool any_null = list.null_count() > 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool null = any_null && list.IsNull(r);
    if (null) ctx.null_at(ctx.row_text(r));  // a null list becomes an empty one
    const std::int64_t begin = offsets[r], end = null ? begin : offsets[r + 1];
    spans[static_cast<std::size_t>(r)] = {static_cast<std::uint64_t>(begin - first), static_cast<std::uint64_t>(end - begin)};
  }
}

// A column of lists of varying length: its rows' values one after another, each row a span.
void ragged_column(const arrow::Array& a, std::int64_t rows, const ColumnContext& ctx, Chunk& out) {
  auto offsets_of = [&](std::int64_t i) -> std::int64_t {
    if (a.type_id() == arrow::Type::LIST) return static_cast<const arrow::ListArray&>(a).value_offset(i);
    return static_cast<const arrow::LargeListArray&>(a).value_offset(i);
  };
  const auto& values = a.type_id() == arrow::Type::LIST ? static_cast<const arrow::ListArray&>(a).values()
                                                        : static_cast<const arrow::LargeListArray&>(a).values();
  Column& column = out.add(ctx.column, Column::Layout::Ragged);
  column.spans.resize(static_cast<std::size_t>(rows));
  if (a.type_id() == arrow::Type::LIST)
    list_spans(static_cast<const arrow::ListArray&>(a), rows, ctx, column.spans);
  else
    list_spans(static_cast<const arrow::LargeListArray&>(a), rows, ctx, column.spans);
  const std::int64_t first = rows > 0 ? offsets_of(0) : 0;
  const std::int64_t total = rows > 0 ? offsets_of(rows) - first : 0;
  auto row_of_value = [&](std::int64_t value) {
    std::int64_t lo = 0, hi = rows;
    while (hi - lo > 1) (offsets_of((lo + hi) / 2) <= value ? lo : hi) = (lo + hi) / 2;
    return "inside the list " + ctx.row_text(lo);
  };
  Shape dims{total};
  const Innermost inner = descend_fixed_lists(*values, first, total, dims, ctx, row_of_value);
  column.tensor = leaf_values(*inner.values, inner.begin, inner.n, dims, ctx, row_of_value);
}

// A column of strings or binary: spans of Arrow's value buffer (nulls: empty, or a copy holding
// their default).
void binary_column(const arrow::Array& a, std::int64_t rows, const ColumnContext& ctx, Chunk& out) {
  const auto id = a.type_id();
  bool filled = false;
  for (std::int64_t r = 0; a.null_count() > 0 && r < rows; ++r)
    if (a.IsNull(r)) filled = filled || ctx.null_at(ctx.row_text(r)) != nullptr;
  if (filled || id == arrow::Type::STRING_VIEW || id == arrow::Type::BINARY_VIEW) {
    out.add(ctx.column, Column::Layout::Rows).tensor =
        strings(a, 0, rows, {rows}, ctx, [&](std::int64_t r) { return ctx.row_text(r); });
    return;
  }
  Column& column = out.add(ctx.column, Column::Layout::Spans);
  column.buffer = shared_buffer(a.data()->buffers[id == arrow::Type::FIXED_SIZE_BINARY ? 1 : 2]);
  column.spans.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t begin = 0, length = 0;
    if (id == arrow::Type::FIXED_SIZE_BINARY) {
      length = static_cast<const arrow::FixedSizeBinaryArray&>(a).byte_width();
      begin = (a.offset() + r) * length;
    } else if (id == arrow::Type::STRING || id == arrow::Type::BINARY) {
      auto& b = static_cast<const arrow::BinaryArray&>(a);
      begin = b.value_offset(r), length = b.value_length(r);
    } else {
      auto& b = static_cast<const arrow::LargeBinaryArray&>(a);
      begin = b.value_offset(r), length = b.value_length(r);
    }
    if (a.IsNull(r)) length = 0;
    column.spans[static_cast<std::size_t>(r)] = {static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(length)};
  }
}

// Dictionary-encoded strings (pandas' categoricals, and every text column Arrow is asked to keep
// as the dictionary it was stored as): spans into the dictionary's value buffer, nothing copied.
void dictionary_column(const arrow::Array& a, std::int64_t rows, const ColumnContext& ctx, Chunk& out) {
  auto& dict = static_cast<const arrow::DictionaryArray&>(a);
  const auto& words = dict.dictionary();
  const auto id = words->type_id();
  if (id != arrow::Type::STRING && id != arrow::Type::BINARY && id != arrow::Type::LARGE_STRING && id != arrow::Type::LARGE_BINARY)
    throw DataError(ctx.file + ": column '" + ctx.column + "' is dictionary-encoded " + words->type()->ToString() +
                    " values; Sluice reads dictionaries of strings only: leave it out with columns:");
  const bool large = id == arrow::Type::LARGE_STRING || id == arrow::Type::LARGE_BINARY;
  auto word = [&](std::int64_t index, std::int64_t& begin, std::int64_t& length) {
    if (large) {
      auto& b = static_cast<const arrow::LargeBinaryArray&>(*words);
      begin = b.value_offset(index), length = b.value_length(index);
    } else {
      auto& b = static_cast<const arrow::BinaryArray&>(*words);
      begin = b.value_offset(index), length = b.value_length(index);
    }
  };
  bool filled = false;
  for (std::int64_t r = 0; dict.null_count() > 0 && r < rows; ++r)
    if (dict.IsNull(r)) filled = ctx.null_at(ctx.row_text(r)) != nullptr || filled;
  if (filled) {  // a default to hold: a copy
    // (A dictionary of empty strings may have no value buffer at all.)
    const auto& bytes = words->data()->buffers[2];
    const char* base = bytes ? reinterpret_cast<const char*>(bytes->data()) : "";
    std::vector<std::string_view> views(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t begin = 0, length = 0;
      if (!dict.IsNull(r)) word(dict.GetValueIndex(r), begin, length);
      views[static_cast<std::size_t>(r)] = dict.IsNull(r) ? std::string_view(*ctx.null_at(ctx.row_text(r)))
                                                          : std::string_view(base + begin, static_cast<std::size_t>(length));
    }
    out.add(ctx.column, Column::Layout::Rows).tensor = Tensor::from_strings(views, {rows});
    return;
  }
  Column& column = out.add(ctx.column, Column::Layout::Spans);
  column.buffer = shared_buffer(words->data()->buffers[2]);
  column.spans.resize(static_cast<std::size_t>(rows));
  if (dict.null_count() == 0 && !large && dict.indices()->type_id() == arrow::Type::INT32) {
    // What Arrow decodes Parquet's dictionaries into: indices and offsets read directly.
    const std::int32_t* index = static_cast<const arrow::Int32Array&>(*dict.indices()).raw_values();
    const std::int32_t* offsets = static_cast<const arrow::BinaryArray&>(*words).raw_value_offsets();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int32_t begin = offsets[index[r]];
      column.spans[static_cast<std::size_t>(r)] = {static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(offsets[index[r] + 1] - begin)};
    }
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t begin = 0, length = 0;
    if (!dict.IsNull(r)) word(dict.GetValueIndex(r), begin, length);
    column.spans[static_cast<std::size_t>(r)] = {static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(length)};
  }
}

void convert_array(const std::shared_ptr<arrow::Array>& a, std::int64_t rows, const ColumnContext& ctx, Chunk& out) {
  const auto id = a->type_id();
  auto at_row = [&](std::int64_t r) { return ctx.row_text(r); };
  if (id == arrow::Type::STRUCT) {
    auto& s = static_cast<const arrow::StructArray&>(*a);
    for (int i = 0; i < s.num_fields(); ++i) {
      auto child = s.GetFlattenedField(i);  // the struct's own nulls become its members'
      if (!child.ok()) throw DataError(ctx.file + ": column '" + ctx.column + "': " + child.status().ToString());
      convert_array(*child, rows, ColumnContext{ctx.file, ctx.column + "/" + s.struct_type()->field(i)->name(), ctx.first_row, ctx.nulls}, out);
    }
  } else if (id == arrow::Type::LIST || id == arrow::Type::LARGE_LIST) {
    ragged_column(*a, rows, ctx, out);
  } else if (id == arrow::Type::DICTIONARY) {
    dictionary_column(*a, rows, ctx, out);
  } else if (holds_bytes(id)) {
    binary_column(*a, rows, ctx, out);
  } else {
    Shape dims{rows};
    const Innermost inner = descend_fixed_lists(*a, 0, rows, dims, ctx, at_row);
    out.add(ctx.column, Column::Layout::Rows).tensor = leaf_values(*inner.values, inner.begin, inner.n, dims, ctx, at_row);
  }
}

}  // namespace

std::map<std::string, std::string> NullPolicy::parse_defaults(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> out;
  for (const auto& entry : entries) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ParamError("null_defaults: '" + entry + "' is not FIELD=VALUE (for example label=-1)");
    out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
}

void convert_batch(const std::string& file, const arrow::RecordBatch& batch, std::int64_t first_row, const NullPolicy& nulls, Chunk& out) {
  for (int i = 0; i < batch.num_columns(); ++i)
    convert_array(batch.column(i), batch.num_rows(), ColumnContext{file, batch.schema()->field(i)->name(), first_row, nulls}, out);
  out.set_rows(static_cast<std::size_t>(batch.num_rows()));
}

}  // namespace sluice::parquet_files
