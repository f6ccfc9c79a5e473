#pragma once
// Parquet files through Arrow C++'s own Parquet reader and writer (never a hand-written one):
// a file opened through Sluice's storage (local, s3://, gs://, http(s)://, or bytes in memory),
// read row group by row group into chunks whose columns are Sluice tensors (parquet_columns.cpp
// converts them, viewing Arrow's memory where the types agree), and chunks' rows written back as
// Arrow record batches.
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/chunk.hpp"
#include "sluice/params.hpp"
#include "sluice/sample.hpp"
#include "sluice/storage.hpp"

namespace arrow {
class Array;
class RecordBatch;
class RecordBatchReader;
class Schema;
namespace io {
class RandomAccessFile;
}
}  // namespace arrow
namespace parquet::arrow {
class FileReader;
}

namespace sluice::parquet_files {

// What a null becomes: by default a null is refused, naming the file, column and row; with
// `fill`, it becomes the field's default (`defaults`, "field=value"), else zero, "" or an empty list.
struct NullPolicy {
  bool fill = false;
  std::map<std::string, std::string> defaults;
  // "label=-1, text=unknown" (commas inside a value are not supported); a ParamError names a bad entry.
  static std::map<std::string, std::string> parse_defaults(const std::vector<std::string>& entries);
};

struct ReadOptions {
  std::vector<std::string> columns;  // top-level columns or struct members ("image/bytes"); empty: all
  NullPolicy nulls;
  bool use_threads = true;           // Arrow decodes a row group's columns in parallel (pyarrow's default)
  std::int64_t batch_rows = 65536;   // rows Arrow decodes at once
  // A file read in order (not one read a row group at a time, by place) is decoded ahead on
  // threads of the file while the rows before are handed out: whole row groups, the next ones as
  // many as fit in `ahead_bytes` (at most kGroupsAhead), when every group's columns take no more
  // (their pages uncompressed, as the file's metadata gives them); else the next record batch.
  bool decode_ahead = false;
  std::int64_t ahead_bytes = std::int64_t{256} << 20;
};

// The parameters every Parquet reading operator takes (columns, nulls, null_defaults), between
// its own `before` and `after`; and the options they give (a ParamError for defaults without
// nulls: default).
std::vector<ParamSpec> with_column_params(std::vector<ParamSpec> before, const std::vector<ParamSpec>& after);
ReadOptions read_options_of(const Params& p);

// `path` through `storage` when it is a remote URI, else the local file; a DataError names it
// when it cannot be opened.
std::shared_ptr<arrow::io::RandomAccessFile> open_arrow_file(const std::string& path, Storage* storage);
// Bytes in memory named `name` (tests and fuzzing); they must outlive the file.
std::shared_ptr<arrow::io::RandomAccessFile> arrow_file_in_memory(const std::string& name, const void* data, std::size_t size);

// Converts the columns of `batch` (rows [0, rows) of it) into `out`'s columns: one per leaf field,
// structs flattened as "a/b". `first_row` is the file's row number of the batch's row 0 (errors
// name it). Throws DataError for a null the policy refuses or a type Sluice has no tensor for.
void convert_batch(const std::string& file, const arrow::RecordBatch& batch, std::int64_t first_row, const NullPolicy& nulls, Chunk& out);

// One Parquet file read in order from any row: its row groups are the unit it reads and seeks
// by. Damage Arrow finds (a bad page, a truncated file) is a DataError naming the file and row group.
class ParquetFileReader {
 public:
  ParquetFileReader(std::string name, std::shared_ptr<arrow::io::RandomAccessFile> file, const ReadOptions& options);
  ~ParquetFileReader();
  const std::string& name() const { return name_; }
  std::int64_t rows() const { return rows_; }
  int row_groups() const { return static_cast<int>(group_first_row_.size()); }
  // The row group holding row `row` (< rows()), and the byte its first column chunk starts at.
  int group_of_row(std::int64_t row) const;
  std::int64_t group_first_row(int group) const { return group_first_row_[static_cast<std::size_t>(group)]; }
  // The fields read (a column's name, a struct's member as "a/b") and their Arrow types as Arrow
  // names them ("string", "list<element: int32>"; text read as a dictionary named as its values).
  std::vector<std::pair<std::string, std::string>> stored_fields() const;
  std::int64_t group_byte_offset(int group) const { return group_byte_offset_[static_cast<std::size_t>(group)]; }
  // The next read starts at row `row` (rows(): nothing left).
  void start_at(std::int64_t row);
  // Up to `max_rows` next rows (not past the end of their row group), true; false at the end.
  // Each row's record is its row number in the file and its byte offset its row group's.
  bool next_chunk(Chunk& out, std::size_t max_rows);
  // The row group being read was damaged: go on at the next one.
  void skip_group();
  // The row group the next row comes from (row_groups() at the end).
  int current_group() const { return group_; }

 private:
  // Where the next record batch comes from: its row group, that group's Arrow reader (none before
  // the group is opened), and the file's row number of the batch's first row.
  struct BatchCursor {
    int group = 0;
    std::unique_ptr<arrow::RecordBatchReader> batches;
    std::int64_t first_row = 0;
  };
  // A record batch read from `group` (none: the file is read to its end), or the damage Arrow
  // found there, thrown where its rows are needed; and where the next one comes from.
  struct FetchedBatch {
    std::shared_ptr<arrow::RecordBatch> batch;
    int group = 0;
    std::int64_t first_row = 0;
    std::exception_ptr failure;
    BatchCursor after;
  };
  // A row group decoded whole (decode_ahead, groups that fit ahead_bytes) as its record batches,
  // up to the damage Arrow found in it, thrown where the rows after the last batch are needed.
  struct DecodedGroup {
    std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
    std::exception_ptr failure;
    std::size_t next = 0;  // the next batch handed out
  };
  void open(std::shared_ptr<arrow::io::RandomAccessFile> file);
  void measure_groups();
  FetchedBatch fetch(BatchCursor cursor) const;
  bool next_batch();
  void drop_fetch();
  DecodedGroup decode_group(int group) const;
  bool next_decoded_batch();
  void decode_groups_ahead();
  void drop_decoded();
  void convert_rows(std::int64_t rows);
  std::vector<int> leaf_columns() const;

  static constexpr std::int64_t kConvertedRows = 8192;
  static constexpr std::size_t kGroupsAhead = 2;

  std::string name_;
  std::shared_ptr<const std::string> where_;
  ReadOptions options_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::vector<int> leaves_;
  std::vector<std::int64_t> group_first_row_, group_byte_offset_;
  std::vector<std::int64_t> group_bytes_;  // the columns read, their pages uncompressed
  bool whole_groups_ = false;             // decode_ahead by row groups (all fit ahead_bytes)
  std::int64_t rows_ = 0;
  int group_ = 0;               // the row group of batch_ (row_groups() at the end)
  std::int64_t next_row_ = 0;  // the file's row number of the next row handed out
  BatchCursor cursor_;         // where the next batch comes from, while no fetch is in flight
  std::shared_ptr<arrow::RecordBatch> batch_;
  std::int64_t batch_first_row_ = 0, batch_pos_ = 0;
  Chunk converted_;  // rows of the batch converted, handed out from converted_pos_
  std::size_t converted_pos_ = 0;
  std::optional<DecodedGroup> handed_;  // (whole_groups_) group_'s batches, being handed out
  std::int64_t group_next_row_ = 0;      // the file's row of the next of them
  int decoding_end_ = 0;                 // decoding_ holds groups up to it
  // The futures last: they use the members above.
  std::future<FetchedBatch> ahead_;  // (decode_ahead, not whole_groups_) the next batch
  std::deque<std::future<DecodedGroup>> decoding_;  // (whole_groups_) the groups after group_'s batches
};

// The Arrow schema of elements like `first` (its fields in order; a bytes scalar is binary, other
// scalars their type, 1-D and deeper tensors lists of fixed size when `fixed_shapes`, else lists).
std::shared_ptr<arrow::Schema> schema_of(const Sample& first, bool fixed_shapes);
// Rows as one record batch of `schema`; a row whose fields do not fit it is a DataError naming
// the field, the element (first_index is rows[0]'s number in the shard) and what differs.
std::shared_ptr<arrow::RecordBatch> batch_of(const std::vector<Sample>& rows, const std::shared_ptr<arrow::Schema>& schema, std::size_t first_index);

}  // namespace sluice::parquet_files
