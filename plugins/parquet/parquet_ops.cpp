// parquet_reader and parquet_writer: Parquet files read row by row (or a chunk of rows at once)
// through Arrow's reader, and elements written as Parquet shards through tfrecord_writer's
// shard writer (naming, rotation, publishing whole, resuming) with a Parquet encoder.
#include <arrow/api.h>
#include <arrow/io/interfaces.h>
#include <parquet/arrow/writer.h>
#include <parquet/exception.h>
#include <parquet/properties.h>

#include "parquet_format.hpp"
#include "sluice/sdk.hpp"
#include "tfrecord_writer.hpp"

namespace sluice::parquet_files {
namespace {

// The rows of one file. Damage Arrow reports inside a row group (a bad page) is named by file
// and row group; under `skip` the rest of that group is left out and the next one read.
class ParquetCursor final : public ExpandCursor, public ChunkedExpandCursor {
 public:
  ParquetCursor(std::unique_ptr<ParquetFileReader> reader, DamageReport& damage) : reader_(std::move(reader)), damage_(damage) {}
  bool next(Sample& out) override {
    if (row_ == held_.rows()) {
      if (!read(held_, kRowsHeld)) return false;
      row_ = 0;
    }
    out = held_.row(row_++);
    return true;
  }
  bool next_chunk(Chunk& out, std::size_t max_rows) override {
    if (row_ < held_.rows()) {  // rows an element-wise call left
      out = held_.slice(row_, std::min(held_.rows(), row_ + max_rows));
      row_ += out.rows();
      return true;
    }
    return read(out, max_rows);
  }
  bool seek(std::int64_t record, std::int64_t /*byte_offset: the record's row group's, found again from the record*/) override {
    if (record < 0 || record > reader_->rows()) return false;
    reader_->start_at(record);
    held_ = Chunk();
    row_ = 0;
    return true;
  }

 private:
  bool read(Chunk& out, std::size_t max_rows) {
    for (;;) {
      try {
        return reader_->next_chunk(out, max_rows);
      } catch (const DataError& e) {
        const int group = reader_->current_group();
        if (!damage_.skip_damaged(std::string(e.what()) + "; the rest of row group " + std::to_string(group) + " skipped")) throw;
        reader_->skip_group();
      }
    }
  }

  static constexpr std::size_t kRowsHeld = 256;
  std::unique_ptr<ParquetFileReader> reader_;
  DamageReport& damage_;
  Chunk held_;
  std::size_t row_ = 0;
};

class ParquetReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"parquet_reader",
            OperatorKind::Expand,
            "Reads the Parquet file named by 'path' through Arrow C++ into one element per row, a field per column (structs as "
            "'a/b', lists of fixed size as tensors, of varying length as 1-D tensors of their own length)",
            with_column_params({ParamSpec::make("field", ParamType::String, "field holding the path").def("path")},
                               {ParamSpec::make("use_threads", ParamType::Bool, "Arrow decodes a row group's columns in parallel (pyarrow's default)")
                                    .def("true"),
                                ParamSpec::make("batch_rows", ParamType::Int, "rows Arrow decodes at once").def("65536").range(1, 1 << 24),
                                ParamSpec::make("decode_ahead_bytes", ParamType::Int,
                                                "most bytes of the next row groups decoded whole while this one's rows go on (their "
                                                "columns' pages uncompressed, as the file's metadata says); a file with a larger "
                                                "group is decoded a record batch ahead")
                                    .def("268435456")
                                    .range(0, 1099511627776.0)}),
            {.stateless = true},
            {}};
  }
  explicit ParquetReader(const Params& p) : field_(p.get_string("field")), options_(read_options_of(p)) {
    options_.use_threads = p.get_bool("use_threads");
    options_.batch_rows = p.get_int("batch_rows");
    options_.decode_ahead = true;  // read in order: what comes next decoded while this one's rows go on
    options_.ahead_bytes = p.get_int("decode_ahead_bytes");
  }
  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    auto file = open_arrow_file(path, ctx.stage ? ctx.stage->storage : nullptr);
    return std::make_unique<ParquetCursor>(std::make_unique<ParquetFileReader>(path, std::move(file), options_), damage);
  }

 private:
  std::string field_;
  ReadOptions options_;
};

// Arrow's writer writes into a string the shard writer drains into its file.
class StringOutput final : public arrow::io::OutputStream {
 public:
  explicit StringOutput(std::string& out) : out_(out) {}
  arrow::Status Close() override {
    closed_ = true;
    return arrow::Status::OK();
  }
  bool closed() const override { return closed_; }
  arrow::Result<int64_t> Tell() const override { return position_; }
  arrow::Status Write(const void* data, int64_t n) override {
    out_.append(static_cast<const char*>(data), static_cast<std::size_t>(n));
    position_ += n;
    return arrow::Status::OK();
  }

 private:
  std::string& out_;
  int64_t position_ = 0;
  bool closed_ = false;
};

struct WriterSettings {
  ::parquet::Compression::type compression;
  std::int64_t group_rows;
  std::uint64_t group_bytes;
  bool fixed_lists;
};

// One Parquet shard: elements held until a row group is full, then written as one. A shard
// cannot be continued after a checkpoint (its footer comes last): a checkpoint ends it.
class ParquetShardEncoder final : public io::ShardEncoder {
 public:
  explicit ParquetShardEncoder(const WriterSettings& settings) : settings_(settings) {}
  std::uint64_t add(const Sample& element) override {
    held_.push_back(element);
    held_bytes_ += element.nbytes();
    if (held_.size() >= static_cast<std::size_t>(settings_.group_rows) || held_bytes_ >= settings_.group_bytes) write_group();
    return element.nbytes();
  }
  std::string& ready() override { return ready_; }
  void finish() override {
    write_group();
    if (writer_) check(writer_->Close());
  }
  bool continues_after_checkpoint() const override { return false; }

 private:
  void write_group() {
    if (held_.empty()) return;
    if (!writer_) open_writer();
    auto batch = batch_of(held_, schema_, written_);
    check(batch->Validate());  // arrays that disagree with the schema would be written wrongly, not refused
    auto table = check(arrow::Table::FromRecordBatches({batch}));
    check(writer_->WriteTable(*table, batch->num_rows()));
    written_ += held_.size();
    held_.clear();
    held_bytes_ = 0;
  }
  void open_writer() {
    schema_ = schema_of(held_.front(), settings_.fixed_lists);
    auto properties = ::parquet::WriterProperties::Builder()
                          .compression(settings_.compression)
                          ->max_row_group_length(std::numeric_limits<int64_t>::max())
                          ->build();
    // The Arrow schema is stored too, as pyarrow stores it: float16 and unsigned types read back as written.
    auto arrow_properties = ::parquet::ArrowWriterProperties::Builder().store_schema()->build();
    writer_ = check(::parquet::arrow::FileWriter::Open(*schema_, arrow::default_memory_pool(), std::make_shared<StringOutput>(ready_),
                                                       properties, arrow_properties));
  }
  static void check(const arrow::Status& status) {
    if (!status.ok()) throw DataError("parquet_writer: " + status.ToString());
  }
  template <class T> static T check(arrow::Result<T> result) {
    check(result.status());
    return std::move(result).ValueUnsafe();
  }

  WriterSettings settings_;
  std::vector<Sample> held_;
  std::uint64_t held_bytes_ = 0;
  std::size_t written_ = 0;
  std::shared_ptr<arrow::Schema> schema_;
  // Before the writer: an unfinished writer (a run cut off) writes its footer into it as it goes.
  std::string ready_;
  std::unique_ptr<::parquet::arrow::FileWriter> writer_;
};

::parquet::Compression::type compression_named(const std::string& name) {
  if (name == "none") return ::parquet::Compression::UNCOMPRESSED;
  if (name == "zstd") return ::parquet::Compression::ZSTD;
  if (name == "gzip") return ::parquet::Compression::GZIP;
  if (name == "brotli") return ::parquet::Compression::BROTLI;
  if (name == "lz4") return ::parquet::Compression::LZ4;
  return ::parquet::Compression::SNAPPY;
}

class ParquetWriter final : public io::TFRecordWriter {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"parquet_writer",
                      OperatorKind::Sink,
                      "Writes elements as Parquet shards PREFIX-00000-of-000NN.parquet through Arrow C++ (readable by pyarrow, pandas, "
                      "Hugging Face datasets, Spark): a column per field, tensors as lists",
                      {ParamSpec::make("prefix", ParamType::OutputPath, "path prefix of the shards (folder/name)"),
                       ParamSpec::make("compression", ParamType::Choice, "of the column chunks (pyarrow's default: snappy)")
                           .def("snappy")
                           .one_of({"snappy", "zstd", "gzip", "brotli", "lz4", "none"}),
                       ParamSpec::make("row_group_rows", ParamType::Int, "rows per row group (pyarrow's default, 1048576)")
                           .def("1048576")
                           .range(1, std::nullopt),
                       ParamSpec::make("row_group_bytes", ParamType::Int, "or fewer: a row group ends past this many bytes of elements")
                           .def("134217728")
                           .range(1, std::nullopt),
                       ParamSpec::make("lists", ParamType::Choice,
                                       "tensors of rank 1 and more: varying (lists; the first dimension may differ between elements) or "
                                       "fixed (lists of fixed size; every element's shape the same)")
                           .def("varying")
                           .one_of({"varying", "fixed"}),
                       ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes of elements").def("100000000").range(1, std::nullopt),
                       ParamSpec::make("max_records", ParamType::Int, "start a new shard past this many elements; 0: no limit").def("0").range(0, std::nullopt)},
                      {.saves_state = true},
                      {}};
    return with_shard_naming(std::move(info));
  }
  explicit ParquetWriter(const Params& p) : TFRecordWriter(p, io::Compression::None, encoder_factory(settings(p)), ".parquet") {}

 private:
  static WriterSettings settings(const Params& p) {
    return {compression_named(p.get_string("compression")), p.get_int("row_group_rows"), static_cast<std::uint64_t>(p.get_int("row_group_bytes")),
            p.get_string("lists") == "fixed"};
  }
  static io::ShardEncoderFactory encoder_factory(WriterSettings settings) {
    return [settings] { return std::make_unique<ParquetShardEncoder>(settings); };
  }
};

}  // namespace

void register_parquet(Registrar& registrar) {
  registrar.add<ParquetReader>();
  registrar.add<ParquetWriter>();
}

}  // namespace sluice::parquet_files
