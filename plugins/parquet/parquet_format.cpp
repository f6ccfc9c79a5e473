// A Parquet file read through Arrow's Parquet reader, row group by row group, from Sluice's
// storage; and elements written as Arrow record batches (parquet_ops.cpp's writer).
#include "parquet_format.hpp"

#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>

#include "array_record.hpp"  // PositionedFile: local positioned reads, ranged requests for objects
#include "sluice/error.hpp"

namespace sluice::parquet_files {
namespace {

// Sluice's positioned reads as Arrow's random-access file: Arrow reads a file's footer and column
// chunks with ReadAt, from any thread. Errors come back as Arrow's statuses (an exception must
// not cross Arrow's frames), and are DataErrors again once Arrow returns them.
class StoredArrowFile final : public arrow::io::RandomAccessFile {
 public:
  explicit StoredArrowFile(std::unique_ptr<io::PositionedFile> file) : file_(std::move(file)) {}
  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }
  arrow::Result<int64_t> Tell() const override { return position_; }
  arrow::Status Seek(int64_t position) override {
    if (position < 0) return arrow::Status::Invalid("seek to a negative position in ", file_->name());
    position_ = position;
    return arrow::Status::OK();
  }
  arrow::Result<int64_t> GetSize() override { return static_cast<int64_t>(file_->size()); }
  arrow::Result<int64_t> Read(int64_t n, void* out) override {
    ARROW_ASSIGN_OR_RAISE(auto got, ReadAt(position_, n, out));
    position_ += got;
    return got;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> Read(int64_t n) override {
    ARROW_ASSIGN_OR_RAISE(auto buffer, ReadAt(position_, n));
    position_ += buffer->size();
    return buffer;
  }
  arrow::Result<int64_t> ReadAt(int64_t position, int64_t n, void* out) override {
    const auto size = static_cast<int64_t>(file_->size());
    if (position < 0 || n < 0) return arrow::Status::Invalid("a read before the start of ", file_->name());
    const int64_t take = std::max<int64_t>(0, std::min(n, size - position));
    try {
      if (take > 0) file_->read(static_cast<std::uint64_t>(position), static_cast<std::size_t>(take), static_cast<std::byte*>(out));
    } catch (const std::exception& e) {
      return arrow::Status::IOError(e.what());
    }
    return take;
  }
  arrow::Result<std::shared_ptr<arrow::Buffer>> ReadAt(int64_t position, int64_t n) override {
    const int64_t take = std::max<int64_t>(0, std::min(n, static_cast<int64_t>(file_->size()) - position));
    ARROW_ASSIGN_OR_RAISE(auto buffer, arrow::AllocateResizableBuffer(take));
    ARROW_ASSIGN_OR_RAISE(auto got, ReadAt(position, take, buffer->mutable_data()));
    ARROW_RETURN_NOT_OK(buffer->Resize(got));
    return std::shared_ptr<arrow::Buffer>(std::move(buffer));
  }

 private:
  std::unique_ptr<io::PositionedFile> file_;
  int64_t position_ = 0;
  bool closed_ = false;
};

template <class T> T checked(arrow::Result<T> result, const std::string& what) {
  if (!result.ok()) throw DataError(what + ": " + result.status().message());
  return std::move(result).ValueUnsafe();
}
void checked(const arrow::Status& status, const std::string& what) {
  if (!status.ok()) throw DataError(what + ": " + status.message());
}

// Runs `step` of Arrow's reading: what Arrow throws (a ParquetException for a file whose metadata
// it cannot make sense of) is a DataError naming the file and `what`.
template <class Step> auto arrow_step(const std::string& what, Step step) {
  try {
    return step();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(what + ": " + e.what());
  }
}

// The leaf column indices under `field` (all of them, or only under the member path `rest`).
void collect_leaves(const parquet::arrow::SchemaField& field, std::vector<int>& out) {
  if (field.is_leaf()) out.push_back(field.column_index);
  for (const auto& child : field.children) collect_leaves(child, out);
}

}  // namespace

std::vector<ParamSpec> with_column_params(std::vector<ParamSpec> before, const std::vector<ParamSpec>& after) {
  before.push_back(ParamSpec::make("columns", ParamType::StringList, "columns to read (a struct's member as a/b); empty: all").def(""));
  before.push_back(ParamSpec::make("nulls", ParamType::Choice,
                                   "error: a null is refused, naming file, column and row; default: it becomes "
                                   "the field's null_defaults value, else 0, \"\" or an empty list")
                       .def("error")
                       .one_of({"error", "default"}));
  before.push_back(ParamSpec::make("null_defaults", ParamType::StringList, "FIELD=VALUE, for nulls: default").def(""));
  before.insert(before.end(), after.begin(), after.end());
  return before;
}

ReadOptions read_options_of(const Params& p) {
  ReadOptions options;
  options.columns = p.get_string_list("columns");
  options.nulls.fill = p.get_string("nulls") == "default";
  options.nulls.defaults = NullPolicy::parse_defaults(p.get_string_list("null_defaults"));
  if (!options.nulls.fill && !options.nulls.defaults.empty())
    throw ParamError("null_defaults is used only with nulls: default (nulls: error refuses every null)");
  return options;
}

std::shared_ptr<arrow::io::RandomAccessFile> open_arrow_file(const std::string& path, Storage* storage) {
  return std::make_shared<StoredArrowFile>(std::make_unique<io::PositionedFile>(path, storage));
}
std::shared_ptr<arrow::io::RandomAccessFile> arrow_file_in_memory(const std::string& name, const void* data, std::size_t size) {
  return std::make_shared<StoredArrowFile>(std::make_unique<io::PositionedFile>(name, data, size));
}

ParquetFileReader::ParquetFileReader(std::string name, std::shared_ptr<arrow::io::RandomAccessFile> file, const ReadOptions& options)
    : name_(std::move(name)), where_(std::make_shared<const std::string>(name_)), options_(options) {
  arrow_step(name_ + " is not a Parquet file Arrow can read", [&] { open(std::move(file)); });
  leaves_ = leaf_columns();
  arrow_step(name_ + ": its row groups' column chunks", [&] { measure_groups(); });
}

// Each row group's bytes of the columns read, as the metadata gives them (pages uncompressed; a
// size that makes no sense counts as too large to decode whole); whole row groups are decoded
// ahead when every group fits options_.ahead_bytes.
void ParquetFileReader::measure_groups() {
  if (!options_.decode_ahead) return;  // read by place, a group at a time: nothing decoded ahead
  const auto metadata = reader_->parquet_reader()->metadata();
  constexpr auto kTooLarge = std::numeric_limits<std::int64_t>::max();
  for (int g = 0; g < row_groups(); ++g) {
    const auto group = metadata->RowGroup(g);
    std::int64_t bytes = 0;
    for (const int column : leaves_) {
      const std::int64_t size = group->ColumnChunk(column)->total_uncompressed_size();
      bytes = size < 0 || bytes > kTooLarge - size ? kTooLarge : bytes + size;
    }
    group_bytes_.push_back(bytes);
  }
  whole_groups_ = std::all_of(group_bytes_.begin(), group_bytes_.end(), [&](std::int64_t bytes) { return bytes <= options_.ahead_bytes; });
}

void ParquetFileReader::open(std::shared_ptr<arrow::io::RandomAccessFile> file) {
  parquet::ArrowReaderProperties properties;
  properties.set_use_threads(options_.use_threads);
  properties.set_batch_size(options_.batch_rows);
  // Read in order, row groups are decoded on several threads at once: Arrow's pre-buffering, one
  // cache of the file's ranges replaced at each group, is for one group at a time (and off in
  // pyarrow's ParquetFile too). A column chunk is then one positioned read, as it is without it.
  if (options_.decode_ahead) properties.set_pre_buffer(false);
  parquet::arrow::FileReaderBuilder builder;
  checked(builder.Open(std::move(file)), name_ + " is not a Parquet file Arrow can read");
  // Text outside lists is read as the dictionary it was stored as (pyarrow stores text so by
  // default): its rows become spans of the dictionary's bytes, not strings Arrow copies out first.
  const auto* schema = builder.raw_reader()->metadata()->schema();
  for (int c = 0; c < schema->num_columns(); ++c)
    if (schema->Column(c)->physical_type() == ::parquet::Type::BYTE_ARRAY && schema->Column(c)->max_repetition_level() == 0)
      properties.set_read_dictionary(c, true);
  builder.properties(properties);
  reader_ = checked(builder.Build(), "cannot read " + name_);
  const auto metadata = reader_->parquet_reader()->metadata();
  for (int g = 0; g < metadata->num_row_groups(); ++g) {
    const auto group = metadata->RowGroup(g);
    group_first_row_.push_back(rows_);
    // Where the group's first column chunk starts: its dictionary page, else its first data page.
    const auto first_column = group->num_columns() > 0 ? group->ColumnChunk(0) : nullptr;
    group_byte_offset_.push_back(!first_column                          ? 0
                                 : first_column->has_dictionary_page() ? first_column->dictionary_page_offset()
                                                                        : first_column->data_page_offset());
    if (group->num_rows() < 0) throw DataError(name_ + ": row group " + std::to_string(g) + " says it holds a negative number of rows");
    rows_ += group->num_rows();
  }
}

ParquetFileReader::~ParquetFileReader() = default;

std::vector<int> ParquetFileReader::leaf_columns() const {
  const auto& manifest = reader_->manifest();
  std::vector<int> leaves;
  if (options_.columns.empty()) {
    for (const auto& field : manifest.schema_fields) collect_leaves(field, leaves);
    return leaves;
  }
  for (const auto& wanted : options_.columns) {
    // "a/b/c": column a, its member b, b's member c.
    const std::vector<parquet::arrow::SchemaField>* level = &manifest.schema_fields;
    const parquet::arrow::SchemaField* found = nullptr;
    std::string have;
    for (std::size_t begin = 0;;) {
      const std::size_t slash = wanted.find('/', begin);
      const std::string part = wanted.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
      found = nullptr;
      have.clear();
      for (const auto& field : *level) {
        have += (have.empty() ? "" : ", ") + field.field->name();
        if (field.field->name() == part) found = &field;
      }
      if (!found || slash == std::string::npos) break;
      if (found->field->type()->id() != arrow::Type::STRUCT)
        throw ParamError("columns: '" + wanted + "': '" + part + "' of " + name_ + " is not a struct (" + found->field->type()->ToString() + ")");
      level = &found->children;
      begin = slash + 1;
    }
    if (!found) throw ParamError("columns: " + name_ + " has no column '" + wanted + "' (it has: " + have + ")");
    collect_leaves(*found, leaves);
  }
  return leaves;
}

std::vector<std::pair<std::string, std::string>> ParquetFileReader::stored_fields() const {
  std::shared_ptr<arrow::Schema> schema;
  checked(reader_->GetSchema(&schema), "cannot read the schema of " + name_);
  std::vector<std::pair<std::string, std::string>> out;
  const auto wanted = [&](const std::string& name) {
    if (options_.columns.empty()) return true;
    for (const auto& c : options_.columns)
      if (name == c || name.rfind(c + "/", 0) == 0) return true;
    return false;
  };
  const std::function<void(const std::string&, const arrow::DataType&)> add = [&](const std::string& name, const arrow::DataType& type) {
    if (type.id() == arrow::Type::STRUCT) {
      for (const auto& member : type.fields()) add(name + "/" + member->name(), *member->type());
    } else if (wanted(name)) {
      const auto* dictionary = dynamic_cast<const arrow::DictionaryType*>(&type);
      out.emplace_back(name, dictionary ? dictionary->value_type()->ToString() : type.ToString());
    }
  };
  for (const auto& field : schema->fields()) add(field->name(), *field->type());
  return out;
}

int ParquetFileReader::group_of_row(std::int64_t row) const {
  const auto it = std::upper_bound(group_first_row_.begin(), group_first_row_.end(), row);
  return static_cast<int>(it - group_first_row_.begin()) - 1;
}

void ParquetFileReader::start_at(std::int64_t row) {
  drop_fetch();
  batch_.reset();
  converted_ = Chunk();
  converted_pos_ = 0;
  group_ = row >= rows_ ? row_groups() : group_of_row(row);
  next_row_ = std::min(row, rows_);
  cursor_ = BatchCursor{group_};  // (its first row is set where the group is opened)
}

// What is being decoded ahead is waited for and thrown away (a seek, a skipped group).
void ParquetFileReader::drop_fetch() {
  if (ahead_.valid()) ahead_.get();
  drop_decoded();
}
void ParquetFileReader::drop_decoded() {
  for (auto& group : decoding_) group.wait();
  decoding_.clear();
  handed_.reset();
}

// Row group `group` decoded whole on a thread of the file (its columns by Arrow's threads, a
// column each), which shares the Arrow reader with the threads decoding the groups before and
// after. In record batches, not as one table: Arrow grows a table's buffers as it decodes a
// group's lists, copying them again each time.
ParquetFileReader::DecodedGroup ParquetFileReader::decode_group(int group) const {
  DecodedGroup out;
  try {
    const std::string what = name_ + ": row group " + std::to_string(group) + " (rows from " + std::to_string(group_first_row(group)) + ")";
    auto batches = arrow_step(what, [&] { return checked(reader_->GetRecordBatchReader({group}, leaves_), what); });
    for (;;) {
      auto batch = arrow_step(what, [&] { return checked(batches->Next(), what); });
      if (!batch) break;
      out.batches.push_back(std::move(batch));
    }
  } catch (...) {
    out.failure = std::current_exception();
  }
  return out;
}

// Keeps the row groups after the one handed out being decoded: the next always, and after it up
// to kGroupsAhead while their bytes fit options_.ahead_bytes.
void ParquetFileReader::decode_groups_ahead() {
  const int first = group_ + (handed_ ? 1 : 0);
  if (decoding_.empty()) decoding_end_ = first;
  std::int64_t bytes = 0;
  for (int g = first; g < decoding_end_; ++g) bytes += group_bytes_[static_cast<std::size_t>(g)];
  while (decoding_.size() < kGroupsAhead && decoding_end_ < row_groups()) {
    const std::int64_t next = group_bytes_[static_cast<std::size_t>(decoding_end_)];
    if (!decoding_.empty() && bytes + next > options_.ahead_bytes) break;
    decoding_.push_back(std::async(std::launch::async, [this, group = decoding_end_] { return decode_group(group); }));
    bytes += next;
    ++decoding_end_;
  }
}

// The next record batch of the row group being handed out; at its end the next group, decoded
// meanwhile, whose damage is thrown here, after every row before it.
bool ParquetFileReader::next_decoded_batch() {
  for (;;) {
    if (handed_) {
      if (handed_->next < handed_->batches.size()) {
        batch_ = std::move(handed_->batches[handed_->next++]);
        batch_first_row_ = group_next_row_;
        group_next_row_ += batch_->num_rows();
        batch_pos_ = 0;
        return true;
      }
      batch_.reset();
      if (handed_->failure) std::rethrow_exception(std::exchange(handed_->failure, nullptr));
      handed_.reset();
      ++group_;
    }
    batch_.reset();
    if (group_ >= row_groups()) return false;
    decode_groups_ahead();
    handed_ = decoding_.front().get();
    decoding_.pop_front();
    group_next_row_ = group_first_row(group_);
    decode_groups_ahead();
  }
}

// The next record batch from `cursor` on: the groups after it opened as the one before ends.
// Runs on the decoding thread (decode_ahead), which alone uses the Arrow reader meanwhile.
ParquetFileReader::FetchedBatch ParquetFileReader::fetch(BatchCursor cursor) const {
  FetchedBatch out;
  try {
    while (cursor.group < row_groups()) {
      const std::string group = name_ + ": row group " + std::to_string(cursor.group);
      if (!cursor.batches) {
        cursor.batches = arrow_step(group, [&] { return checked(reader_->GetRecordBatchReader({cursor.group}, leaves_), group); });
        cursor.first_row = group_first_row(cursor.group);
      }
      const std::string what = group + " (rows from " + std::to_string(cursor.first_row) + ")";
      out.group = cursor.group;
      out.batch = arrow_step(what, [&] { return checked(cursor.batches->Next(), what); });
      if (out.batch) {
        out.first_row = cursor.first_row;
        cursor.first_row += out.batch->num_rows();
        break;
      }
      cursor.batches.reset();  // the group is read: the next one
      ++cursor.group;
    }
    if (!out.batch) out.group = row_groups();
  } catch (...) {
    out.batch.reset();
    out.group = cursor.group;
    out.failure = std::current_exception();
    cursor.batches.reset();
  }
  out.after = std::move(cursor);
  return out;
}

// The next record batch as batch_ (false at the end of the file), and the one after it asked for.
bool ParquetFileReader::next_batch() {
  if (whole_groups_) return next_decoded_batch();
  FetchedBatch fetched = ahead_.valid() ? ahead_.get() : fetch(std::move(cursor_));
  cursor_ = std::move(fetched.after);
  group_ = fetched.group;
  batch_ = std::move(fetched.batch);
  batch_pos_ = 0;
  if (fetched.failure) std::rethrow_exception(fetched.failure);
  if (!batch_) return false;
  batch_first_row_ = fetched.first_row;
  if (options_.decode_ahead)
    ahead_ = std::async(std::launch::async, [this, cursor = std::move(cursor_)]() mutable { return fetch(std::move(cursor)); });
  return true;
}

bool ParquetFileReader::next_chunk(Chunk& out, std::size_t max_rows) {
  for (;;) {
    if (converted_pos_ < converted_.rows()) {
      const std::size_t take = std::min(max_rows, converted_.rows() - converted_pos_);
      out = converted_.slice(converted_pos_, converted_pos_ + take);
      converted_pos_ += take;
      next_row_ += static_cast<std::int64_t>(take);
      return true;
    }
    if (batch_) {
      // A seek into the group: the rows before the one asked for are passed over.
      if (batch_first_row_ + batch_pos_ < next_row_) batch_pos_ = std::min(batch_->num_rows(), next_row_ - batch_first_row_);
      if (batch_pos_ < batch_->num_rows()) {
        convert_rows(std::min<std::int64_t>(kConvertedRows, batch_->num_rows() - batch_pos_));
        continue;
      }
    }
    if (group_ >= row_groups() || !next_batch()) return false;
  }
}

// Rows [batch_pos_, + rows) of the batch as one chunk, handed out in slices: a chunk's columns,
// buffers and origins are made once for many of the engine's chunks (of 256 rows).
void ParquetFileReader::convert_rows(std::int64_t rows) {
  const std::int64_t first = batch_first_row_ + batch_pos_;
  converted_ = Chunk();
  converted_pos_ = 0;
  convert_batch(name_, *batch_->Slice(batch_pos_, rows), first, options_.nulls, converted_);
  converted_.set_where(where_);
  converted_.records().resize(static_cast<std::size_t>(rows));
  converted_.byte_offsets().assign(static_cast<std::size_t>(rows), group_byte_offset_[static_cast<std::size_t>(group_)]);
  for (std::int64_t r = 0; r < rows; ++r) converted_.records()[static_cast<std::size_t>(r)] = first + r;
  batch_pos_ += rows;
}

void ParquetFileReader::skip_group() {
  if (group_ >= row_groups()) return;
  start_at(group_ + 1 < row_groups() ? group_first_row(group_ + 1) : rows_);
}

}  // namespace sluice::parquet_files
