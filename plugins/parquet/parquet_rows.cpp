// Elements as Arrow record batches, for parquet_writer: each field a column, its values copied
// once into one Arrow buffer; tensors of rank 1 and more become lists (of fixed size, or of
// varying length in their first dimension), and fields named "a/b" members of a struct column
// "a" (as Hugging Face stores an image: image {bytes, path}): parquet_reader reads them back as
// the same fields.
#include <arrow/api.h>

#include <algorithm>
#include <cstring>

#include "parquet_format.hpp"
#include "sluice/error.hpp"

namespace sluice::parquet_files {
namespace {

std::shared_ptr<arrow::DataType> arrow_type(DType dtype, const std::string& field) {
  switch (dtype) {
    case DType::U8: return arrow::uint8();
    case DType::I16: return arrow::int16();
    case DType::I32: return arrow::int32();
    case DType::I64: return arrow::int64();
    case DType::F16: return arrow::float16();
    case DType::F32: return arrow::float32();
    case DType::F64: return arrow::float64();
    case DType::Bytes: return arrow::binary();
    case DType::BF16: break;
  }
  throw DataError("parquet_writer: field '" + field + "' holds bfloat16, which Parquet has no type for; cast it to float32 first (cast stage)");
}

// The list type of a tensor of `shape` under the element's own dimension: fixed sizes for the
// inner dimensions, and for the first when `fixed_first`.
std::shared_ptr<arrow::DataType> nested_type(std::shared_ptr<arrow::DataType> value, const Shape& shape, bool fixed_first) {
  for (std::size_t d = shape.size(); d-- > 1;) value = arrow::fixed_size_list(value, static_cast<int32_t>(shape[d]));
  if (shape.empty()) return value;
  return fixed_first ? arrow::fixed_size_list(value, static_cast<int32_t>(shape[0])) : arrow::list(value);
}

std::shared_ptr<arrow::Buffer> allocated(std::int64_t bytes) {
  auto buffer = arrow::AllocateBuffer(bytes);
  if (!buffer.ok()) throw Error("parquet_writer: " + buffer.status().ToString());
  return std::shared_ptr<arrow::Buffer>(std::move(buffer).ValueUnsafe());
}

// All rows' values of one field, one after another, as an Arrow array of the value type.
std::shared_ptr<arrow::Array> flat_values(const std::vector<Sample>& rows, const std::string& name, DType dtype, std::int64_t& total) {
  total = 0;
  for (const auto& row : rows) total += row.at(name).num_elements();
  if (dtype == DType::Bytes) {
    arrow::BinaryBuilder builder;
    for (const auto& row : rows) {
      const Tensor& t = row.at(name);
      for (std::int64_t i = 0; i < t.num_elements(); ++i) {
        const auto s = t.string_at(i);
        if (auto st = builder.Append(s.data(), static_cast<int32_t>(s.size())); !st.ok()) throw Error("parquet_writer: " + st.ToString());
      }
    }
    std::shared_ptr<arrow::Array> out;
    if (auto st = builder.Finish(&out); !st.ok()) throw Error("parquet_writer: " + st.ToString());
    return out;
  }
  const std::size_t width = dtype_size(dtype);
  auto values = allocated(total * static_cast<std::int64_t>(width));
  std::size_t at = 0;
  for (const auto& row : rows) {
    const Tensor& t = row.at(name);
    if (t.nbytes()) std::memcpy(values->mutable_data() + at, t.raw_data(), t.nbytes());
    at += t.nbytes();
  }
  return arrow::MakeArray(arrow::ArrayData::Make(arrow_type(dtype, name), total, {nullptr, values}));
}

std::shared_ptr<arrow::Array> column_of(const std::vector<Sample>& rows, const std::string& name, const std::shared_ptr<arrow::DataType>& type,
                                        std::size_t index) {
  const Tensor& first = rows.front().at(name);
  const bool fixed_first = type->id() == arrow::Type::FIXED_SIZE_LIST && first.rank() > 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Tensor* t = rows[r].find(name);
    if (!t)
      throw DataError("parquet_writer: element " + std::to_string(index + r) + " has no field '" + name + "', which the shard's first element had");
    bool same = t->dtype() == first.dtype() && t->rank() == first.rank();
    for (std::size_t d = fixed_first ? 0 : 1; same && d < t->rank(); ++d) same = t->shape()[d] == first.shape()[d];
    if (!same)
      throw DataError("parquet_writer: field '" + name + "' of element " + std::to_string(index + r) + " is " + dtype_name(t->dtype()) + " " +
                      shape_string(t->shape()) + ", and the shard's first element's was " + dtype_name(first.dtype()) + " " +
                      shape_string(first.shape()) + (fixed_first ? " (lists: fixed; lists: varying lets the first dimension differ)" : ""));
  }
  std::int64_t total = 0;
  std::shared_ptr<arrow::Array> values = flat_values(rows, name, first.dtype(), total);
  for (std::size_t d = first.rank(); d-- > 1;) {
    const std::int64_t size = first.shape()[d];
    values = std::make_shared<arrow::FixedSizeListArray>(arrow::fixed_size_list(values->type(), static_cast<int32_t>(size)),
                                                         size ? values->length() / size : 0, values);
  }
  const auto n = static_cast<std::int64_t>(rows.size());
  if (first.rank() == 0) return values;
  if (fixed_first) return std::make_shared<arrow::FixedSizeListArray>(type, n, values);
  auto offsets = allocated((n + 1) * static_cast<std::int64_t>(sizeof(int32_t)));
  auto* o = reinterpret_cast<int32_t*>(offsets->mutable_data());
  o[0] = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t next = o[r] + rows[static_cast<std::size_t>(r)].at(name).shape()[0];
    if (next > INT32_MAX) throw DataError("parquet_writer: field '" + name + "' holds more than 2^31 list values in one row group; lower row_group_rows");
    o[r + 1] = static_cast<int32_t>(next);
  }
  return std::make_shared<arrow::ListArray>(type, n, offsets, values);
}

// The columns of an Arrow field of the schema: a leaf is the element field of its path ("a/b"),
// a struct its members.
std::shared_ptr<arrow::Array> array_of(const std::vector<Sample>& rows, const arrow::Field& field, const std::string& path, std::size_t index) {
  if (field.type()->id() != arrow::Type::STRUCT || rows.front().find(path)) return column_of(rows, path, field.type(), index);
  arrow::ArrayVector members;
  for (const auto& member : field.type()->fields()) members.push_back(array_of(rows, *member, path + "/" + member->name(), index));
  // With the schema's own member fields (not null): Arrow's writer takes the array's type as the schema's.
  auto made = arrow::StructArray::Make(members, field.type()->fields());
  if (!made.ok()) throw Error("parquet_writer: " + made.status().ToString());
  return *made;
}

// Adds `type` as the field at `path` (its parts split at '/') under `fields`, making the structs
// on the way; members keep the order of the element's fields.
void place_field(arrow::FieldVector& fields, std::string_view path, const std::shared_ptr<arrow::DataType>& type, const std::string& whole) {
  const std::size_t slash = path.find('/');
  const std::string head(path.substr(0, slash));
  auto it = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f->name() == head; });
  if (slash == std::string_view::npos || head.empty() || slash + 1 == path.size()) {
    if (it != fields.end())
      throw DataError("parquet_writer: field '" + whole + "' is also a struct of fields named '" + whole + "/...'; rename one of them");
    fields.push_back(arrow::field(std::string(path), type, /*nullable=*/false));
    return;
  }
  arrow::FieldVector members;
  if (it != fields.end()) {
    if ((*it)->type()->id() != arrow::Type::STRUCT || (*it)->metadata())
      throw DataError("parquet_writer: field '" + head + "' is also a struct of fields named '" + head + "/...'; rename one of them");
    members = (*it)->type()->fields();
  }
  place_field(members, path.substr(slash + 1), type, whole);
  auto field = arrow::field(head, arrow::struct_(members), /*nullable=*/false);
  if (it != fields.end()) *it = field;
  else fields.push_back(field);
}

}  // namespace

std::shared_ptr<arrow::Schema> schema_of(const Sample& first, bool fixed_shapes) {
  arrow::FieldVector fields;
  for (const auto& f : first.fields())
    place_field(fields, f.name, nested_type(arrow_type(f.tensor.dtype(), f.name), f.tensor.shape(), fixed_shapes), f.name);
  return arrow::schema(std::move(fields));
}

std::shared_ptr<arrow::RecordBatch> batch_of(const std::vector<Sample>& rows, const std::shared_ptr<arrow::Schema>& schema, std::size_t first_index) {
  arrow::ArrayVector columns;
  for (const auto& field : schema->fields()) columns.push_back(array_of(rows, *field, field->name(), first_index));
  return arrow::RecordBatch::Make(schema, static_cast<std::int64_t>(rows.size()), std::move(columns));
}

}  // namespace sluice::parquet_files
