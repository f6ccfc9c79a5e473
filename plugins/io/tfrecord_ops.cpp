// tfrecord_reader, parse_example, tfrecord_writer, and ArrayRecord's array_record_reader and
// array_record_writer (the same cursor and writer over the other format, array_record.hpp).
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "array_record.hpp"
#include "example_codec.hpp"
#include "io_plugin.hpp"
#include "tfrecord.hpp"
#include "tfrecord_writer.hpp"

namespace fs = std::filesystem;

namespace sluice::io {
namespace {

// The records of one file, TFRecord or ArrayRecord. Hands out one sample per record with nothing
// allocated for it but its field list: the record is a view of the read buffer (or of a decoded
// chunk), the path tensor and origin are shared per file, and the index and offset scalars are
// views of a block holding those of many records. (Records are freed on the consumer's thread:
// every allocation made here per record would cost a contended malloc on both sides.)
// Its chunked form hands out up to max_rows records of one buffer at once: the records as spans
// of that buffer, the path once, index and offset as two columns.
class RecordCursor final : public ExpandCursor, public ChunkedExpandCursor {
 public:
  RecordCursor(std::string path, std::unique_ptr<RecordStream> reader, Allocator& scalars, DamageReport& damage)
      : path_(std::make_shared<const std::string>(std::move(path))),
        path_tensor_(Tensor::from_string(*path_)),
        reader_(std::move(reader)),
        scalars_(scalars),
        damage_(damage) {}
  bool next(Sample& out) override {
    Record r;
    if (!read(r)) return false;
    if (!block_ || used_ == kScalarsPerBlock) {
      block_ = scalars_.allocate(kScalarsPerBlock * 2 * sizeof(std::int64_t));
      used_ = 0;
    }
    const std::size_t at = used_++ * 2 * sizeof(std::int64_t);
    const std::int64_t numbers[2] = {static_cast<std::int64_t>(r.index), static_cast<std::int64_t>(r.file_offset)};
    std::memcpy(block_->data() + at, numbers, sizeof numbers);
    out = Sample();
    out.reserve(4);
    out.set("record", Tensor::bytes_view(std::move(r.buffer), r.offset, r.length));
    out.set("path", path_tensor_);
    out.set("index", Tensor::view(DType::I64, {}, block_, at));
    out.set("offset", Tensor::view(DType::I64, {}, block_, at + sizeof(std::int64_t)));
    out.set_origin(path_, numbers[0], numbers[1]);
    return true;
  }
  bool next_chunk(Chunk& out, std::size_t max_rows) override {
    Record r;
    if (!read(r)) return false;
    const std::shared_ptr<Buffer> buffer = r.buffer;
    Tensor numbers = Tensor::empty(DType::I64, {2, static_cast<std::int64_t>(max_rows)});
    auto* index = numbers.data<std::int64_t>();
    auto* offset = index + max_rows;
    out = Chunk();
    Column& records = out.add("record", Column::Layout::Spans);
    records.buffer = buffer;
    records.spans.reserve(max_rows);
    out.records().reserve(max_rows);
    out.byte_offsets().reserve(max_rows);
    std::size_t rows = 0;
    for (;;) {
      records.spans.push_back({r.offset, r.length});
      index[rows] = static_cast<std::int64_t>(r.index);
      offset[rows] = static_cast<std::int64_t>(r.file_offset);
      out.records().push_back(index[rows]);
      out.byte_offsets().push_back(offset[rows]);
      if (++rows == max_rows || !read(r)) break;
      if (r.buffer != buffer) {  // a new read buffer: that record starts the next chunk
        pending_ = std::move(r);
        break;
      }
    }
    out.set_rows(rows);
    out.add("path", Column::Layout::Constant).tensor = path_tensor_;
    out.add("index", Column::Layout::Rows).tensor = Tensor::view(DType::I64, {static_cast<std::int64_t>(rows)}, numbers.buffer(), 0);
    out.add("offset", Column::Layout::Rows).tensor =
        Tensor::view(DType::I64, {static_cast<std::int64_t>(rows)}, numbers.buffer(), max_rows * sizeof(std::int64_t));
    out.set_where(path_);
    return true;
  }
  bool seek(std::int64_t record, std::int64_t byte_offset) override {
    pending_.reset();
    ended_ = false;
    return record >= 0 && byte_offset >= 0 && reader_->seek(static_cast<std::uint64_t>(record), static_cast<std::uint64_t>(byte_offset));
  }

 private:
  // The record a chunk left for the next call, else the reader's next. Once the reader said
  // the end, it is not asked again (a chunk that ended there is handed out first, and the
  // reader would report trailing damage a second time).
  bool read(Record& r) {
    if (pending_) {
      r = std::move(*pending_);
      pending_.reset();
      return true;
    }
    if (ended_) return false;
    ended_ = !reader_->next(r, &damage_);
    return !ended_;
  }

  static constexpr std::size_t kScalarsPerBlock = 512;
  std::shared_ptr<const std::string> path_;
  Tensor path_tensor_;
  std::unique_ptr<RecordStream> reader_;
  Allocator& scalars_;
  std::shared_ptr<Buffer> block_;
  std::size_t used_ = 0;
  DamageReport& damage_;
  std::optional<Record> pending_;
  bool ended_ = false;
};

class TFRecordReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"tfrecord_reader",
            OperatorKind::Expand,
            "Reads the TFRecord file named by 'path' into records ('record' bytes, 'path', 'index', 'offset'), CRCs checked",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("compression", ParamType::Choice, "auto detects gzip and zlib from the first bytes")
                 .def("auto")
                 .one_of({"auto", "none", "gzip", "zlib"}),
             ParamSpec::make("verify_crc", ParamType::Bool, "check the masked CRC-32C of every length and record").def("true"),
             ParamSpec::make("buffer_bytes", ParamType::Int, "size of each sequential read").def("4194304").range(4096, 1 << 30)},
            {.stateless = true},
            {}};
  }
  explicit TFRecordReader(const Params& p)
      : field_(p.get_string("field")), compression_(parse_compression(p.get_string("compression"))) {
    options_.verify_crc = p.get_bool("verify_crc");
    options_.chunk_bytes = static_cast<std::size_t>(p.get_int("buffer_bytes"));
    options_.allocator = &pool_;  // read buffers are reused once their records are gone
  }

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    auto reader = std::make_unique<RecordReader>(open_file(path, compression_, ctx.stage ? ctx.stage->storage : nullptr), path, options_);
    return std::make_unique<RecordCursor>(path, std::move(reader), pool_, damage);
  }

 private:
  std::string field_;
  Compression compression_;
  PooledHostAllocator pool_;
  RecordReaderOptions options_;
};

// Its chunked form parses a chunk's records into one column per feature (see
// ExampleParser::parse_rows), when every feature has a fixed shape.
class ParseExample final : public Map, public ChunkedMap {
 public:
  static OperatorInfo describe() {
    return {"parse_example",
            OperatorKind::Map,
            "Parses a tf.train.Example (or SequenceExample) into typed fields named after its features",
            {ParamSpec::make("features", ParamType::String,
                             "NAME:DTYPE[SHAPE]=DEFAULT entries, comma-separated; DTYPE bytes|int64|float; [] for variable length"),
             ParamSpec::make("sequence_features", ParamType::String, "feature lists of a SequenceExample, same syntax (per frame)").def(""),
             ParamSpec::make("field", ParamType::String, "field holding the serialized record").def("record"),
             ParamSpec::make("keep", ParamType::StringList, "input fields to carry over (e.g. path)").def("")},
            {.stateless = true},
            {}};
  }
  explicit ParseExample(const Params& p)
      : parser_(parse_feature_spec(p.get_string("features")), parse_feature_spec(p.get_string("sequence_features"))),
        field_(p.get_string("field")),
        keep_(p.get_string_list("keep")) {}
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& record = in.at(field_);
    if (record.dtype() != DType::Bytes || record.num_elements() != 1)
      throw DataError("field '" + field_ + "' is not a single serialized record");
    Sample out;
    auto view = record.string_at(0);
    parser_.parse(record.buffer(), record.byte_offset() + record.string_offset(0), view.size(), out);
    for (const auto& name : keep_) out.set(name, in.at(name));
    out.share_origin(in);
    return out;
  }

  bool maps_chunks() const override { return parser_.columnar(); }
  Chunk map_chunk(const Chunk& in, const ElementContext&, RowIssues& issues) override {
    const Column& records = in.at(field_);
    const bool scalar_bytes = records.layout == Column::Layout::Spans ||
                              (records.tensor.dtype() == DType::Bytes &&
                               (records.layout == Column::Layout::Constant ? records.tensor.rank() == 0 : records.tensor.rank() == 1));
    // Anything else is refused per element, by map(): the host runs the rows through it.
    if (!scalar_bytes) throw Error("field '" + field_ + "' is not a column of single records");
    Chunk out;
    std::vector<std::size_t> kept;
    parser_.parse_rows(records, in.rows(), out, kept, issues);
    out.set_rows(kept.size());
    const bool all = kept.size() == in.rows();
    for (const auto& name : keep_) {
      const Column& column = in.at(name);
      Column carried = all ? column : gather_rows(column, kept);
      bool replaced = false;  // as Sample::set: a kept field named like a feature takes its place
      for (auto& existing : out.columns())
        if (existing.name == name) {
          existing = std::move(carried);
          replaced = true;
          break;
        }
      if (!replaced) out.columns().push_back(std::move(carried));
    }
    if (all) out.share_origins(in, 0, in.rows());
    else out.gather_origins(in, kept);
    return out;
  }

 private:
  ExampleParser parser_;
  std::string field_;
  std::vector<std::string> keep_;
};

class ArrayRecordReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"array_record_reader",
            OperatorKind::Expand,
            "Reads the ArrayRecord file named by 'path' (Grain's and TFDS's format) into records ('record' bytes, 'path', 'index', "
            "'offset': the byte of the record's chunk), every chunk's hashes checked; uncompressed, zstd, brotli and snappy chunks",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("verify_hashes", ParamType::Bool, "check the HighwayHash of every chunk's data (its header's always is)").def("true"),
             ParamSpec::make("buffer_bytes", ParamType::Int,
                             "consecutive chunks read at once, up to this many bytes (a larger chunk alone); the next run is read and decoded "
                             "ahead, on a thread of the file's own")
                 .def("4194304")
                 .range(4096, 1 << 30)},
            {.stateless = true},
            {}};
  }
  explicit ArrayRecordReader(const Params& p)
      : field_(p.get_string("field")), verify_(p.get_bool("verify_hashes")), span_bytes_(static_cast<std::size_t>(p.get_int("buffer_bytes"))) {}

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    auto reader = std::make_unique<ArrayRecordStream>(path, ctx.stage ? ctx.stage->storage : nullptr, verify_, span_bytes_, &pool_);
    return std::make_unique<RecordCursor>(std::move(path), std::move(reader), pool_, damage);
  }

 private:
  std::string field_;
  bool verify_;
  std::size_t span_bytes_;
  PooledHostAllocator pool_;
};

// tfrecord_writer's shards, rotation, naming and resumption, laid out as ArrayRecord.
class ArrayRecordWriterOp final : public TFRecordWriter {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"array_record_writer",
            OperatorKind::Sink,
            "Writes elements as ArrayRecord shards PREFIX-00000-of-000NN.array_record (readable by the array-record package, Grain "
            "and TFDS): each record the bytes of 'field', or with field \"\" the element as a tf.train.Example",
            {ParamSpec::make("prefix", ParamType::OutputPath, "path prefix of the shards (folder/name)"),
             ParamSpec::make("field", ParamType::String, "field holding each record's bytes; \"\": the whole element as a tf.train.Example").def("record"),
             ParamSpec::make("options", ParamType::String,
                             "as the array-record package takes them: group_size:N (records per chunk), uncompressed, zstd[:LEVEL], "
                             "brotli[:LEVEL] or snappy; empty: its defaults, group_size:1,zstd:3")
                 .def(""),
             ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes of records").def("100000000").range(1, std::nullopt),
             ParamSpec::make("max_records", ParamType::Int, "start a new shard past this many records; 0: no limit").def("0").range(0, std::nullopt)},
            {.saves_state = true},
            {}};
    return with_shard_naming(std::move(info));
  }
  explicit ArrayRecordWriterOp(const Params& p)
      : TFRecordWriter(p, Compression::None, encoder_factory(parse_array_record_options(p.get_string("options")), p.get_string("field")),
                       ".array_record") {}

 private:
  // Each record the bytes of `field` (one string), or where it names none the element as a tf.Example.
  static ShardEncoderFactory encoder_factory(ArrayRecordWriterOptions options, std::string field) {
    auto record_of = [field](const Sample& in) {
      if (field.empty()) return encode_example(in);
      const Tensor& value = in.at(field);
      if (value.dtype() != DType::Bytes || value.num_elements() != 1)
        throw DataError("array_record_writer: field '" + field + "' is not one string of bytes (its records are written as they are); "
                        "set field to \"\" to write each element as a tf.Example");
      return std::string(value.string_at(0));
    };
    return [options, record_of] { return std::make_unique<ArrayRecordShardEncoder>(options, record_of); };
  }
};

}  // namespace

void register_tfrecord(Registrar& registrar) {
  registrar.add<TFRecordReader>();
  registrar.add<ParseExample>();
  registrar.add<TFRecordWriter>();
  registrar.add<ArrayRecordReader>();
  registrar.add<ArrayRecordWriterOp>();
}

}  // namespace sluice::io
