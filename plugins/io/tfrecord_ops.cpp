// tfrecord_reader, parse_example, tfrecord_writer.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "example_codec.hpp"
#include "io_plugin.hpp"
#include "tfrecord.hpp"

namespace fs = std::filesystem;

namespace sluice::io {
namespace {

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

  // Hands out one sample per record with nothing allocated for it but its field list: the record
  // is a view of the read buffer (or the mapped file), the path tensor and origin are shared per
  // file, and the index and offset scalars are views of a block holding those of many records.
  // (Records are freed on the consumer's thread: every allocation made here per record would
  // cost a contended malloc on both sides.)
  // Its chunked form hands out up to max_rows records of one read buffer at once: the records as
  // spans of that buffer, the path once, index and offset as two columns.
  class Cursor final : public ExpandCursor, public ChunkedExpandCursor {
   public:
    Cursor(std::string path, std::unique_ptr<ByteSource> source, RecordReaderOptions options, Allocator& scalars,
           DamageReport& damage)
        : path_(std::make_shared<const std::string>(std::move(path))),
          path_tensor_(Tensor::from_string(*path_)),
          reader_(std::move(source), *path_, options),
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
      return record >= 0 && byte_offset >= 0 && reader_.seek(static_cast<std::uint64_t>(record), static_cast<std::uint64_t>(byte_offset));
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
      ended_ = !reader_.next(r, &damage_);
      return !ended_;
    }

    static constexpr std::size_t kScalarsPerBlock = 512;
    std::shared_ptr<const std::string> path_;
    Tensor path_tensor_;
    RecordReader reader_;
    Allocator& scalars_;
    std::shared_ptr<Buffer> block_;
    std::size_t used_ = 0;
    DamageReport& damage_;
    std::optional<Record> pending_;
    bool ended_ = false;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext&, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    return std::make_unique<Cursor>(path, open_file(path, compression_), options_, pool_, damage);
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

// One shard being written under an exclusive temporary name: plain, or through a deflate stream
// for gzip and zlib. Its final name is given once the number of shards is known.
class ShardFile {
 public:
  ShardFile(const std::string& placeholder, Compression compression) : file_(placeholder), compression_(compression) {
    if (compression_ != Compression::None) {
      int bits = compression_ == Compression::Gzip ? 15 + 16 : 15;
      if (deflateInit2(&z_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        throw Error("zlib initialisation failed");
      deflating_ = true;
    }
  }
  ~ShardFile() {
    if (deflating_) deflateEnd(&z_);
  }
  void write(const std::string& bytes) {
    if (!deflating_) {
      file_.write(bytes);
      return;
    }
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z_.avail_in = static_cast<uInt>(bytes.size());
    drain(Z_NO_FLUSH);
  }
  void close() {
    if (deflating_) {
      drain(Z_FINISH);
      deflateEnd(&z_);
      deflating_ = false;
    }
    file_.finish_writing();
  }
  void publish_as(const std::string& path) { file_.publish_as(path); }
  void discard() { file_.abandon(/*keep=*/true); }  // an interrupted shard stays visibly .partial
  bool compressed() const { return deflating_; }
  // For checkpoints (a compressed shard is never open at one, see TFRecordWriter::save_state).
  SavedOutput checkpoint_state() { return file_.checkpoint_state(); }
  void continue_from(const SavedOutput& saved) { file_.continue_from(saved); }
  void adopt_finished(const SavedOutput& saved) { file_.adopt_finished(saved); }

 private:
  void drain(int flush) {
    char out[1 << 16];
    do {
      z_.next_out = reinterpret_cast<Bytef*>(out);
      z_.avail_out = sizeof out;
      int rc = deflate(&z_, flush);
      if (rc == Z_STREAM_ERROR) throw Error("compressing " + file_.writing_path() + " failed");
      file_.write(out, sizeof out - z_.avail_out);
      if (flush == Z_FINISH && rc == Z_STREAM_END) break;
    } while (z_.avail_out == 0 || (flush == Z_FINISH));
  }
  AtomicOutputFile file_;
  Compression compression_;
  z_stream z_{};
  bool deflating_ = false;
};

// Writes tf.Examples into shards PREFIX-00000-of-000NN.tfrecord, rotated by size or count. Each
// shard is written under a temporary name; all are renamed once the run completed (the total is
// only known then).
class TFRecordWriter final : public Sink {
 public:
  static OperatorInfo describe() {
    return {"tfrecord_writer",
            OperatorKind::Sink,
            "Writes elements as tf.train.Example records into shards PREFIX-00000-of-000NN.tfrecord",
            {ParamSpec::make("prefix", ParamType::OutputPath, "path prefix of the shards (folder/name)"),
             ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes (about 100 MB advised)")
                 .def("100000000")
                 .range(1, std::nullopt),
             ParamSpec::make("max_records", ParamType::Int, "start a new shard past this many records; 0: no limit").def("0").range(0, std::nullopt),
             ParamSpec::make("compression", ParamType::Choice, "shard compression").def("none").one_of({"none", "gzip", "zlib"}),
             ParamSpec::make("naming", ParamType::Choice,
                             "of_total: PREFIX-00000-of-000NN; worker: PREFIX-worker-W-00000, for several processes writing "
                             "beside each other")
                 .def("of_total")
                 .one_of({"of_total", "worker"}),
             ParamSpec::make("worker", ParamType::Int, "worker index for naming=worker; -1: this process's (--worker-index, Slurm, MPI, torchrun, ...)")
                 .def("-1")
                 .range(-1, std::nullopt)
                 .takes_hint("worker_index"),
             ParamSpec::make("workers", ParamType::Int, "processes writing beside each other; -1: the job's workers")
                 .def("-1")
                 .range(-1, std::nullopt)
                 .takes_hint("num_workers")},
            {.saves_state = true},
            {}};
  }
  explicit TFRecordWriter(const Params& p)
      : prefix_(p.get_string("prefix")),
        max_bytes_(static_cast<std::uint64_t>(p.get_int("max_bytes"))),
        max_records_(static_cast<std::uint64_t>(p.get_int("max_records"))),
        compression_(parse_compression(p.get_string("compression"))),
        by_worker_(p.get_string("naming") == "worker"),
        worker_(p.get_int("worker")) {
    if (prefix_.empty()) throw ParamError("prefix must not be empty");
    // Several workers numbering "-of-N" shards each would replace each other's, and a run's
    // clean-up removes the shards it did not write: the other workers'.
    if (!by_worker_ && p.get_int("workers") > 1)
      throw ParamError(std::to_string(p.get_int("workers")) + " workers would each write PREFIX-00000-of-000NN and replace " +
                       "each other's shards; set naming to worker (PREFIX-worker-W-00000 per worker)");
  }
  void start(const StageInfo&) override {
    if (worker_ < 0) worker_ = 0;  // a host that does not fill worker hints runs one process
    auto folder = fs::path(prefix_).parent_path();
    std::error_code ec;
    if (!folder.empty()) fs::create_directories(folder, ec);
    if (ec) throw Error("cannot create folder " + folder.string() + " for prefix " + prefix_ + ": " + ec.message());
  }
  void consume(Sample in, const ElementContext&) override {
    if (!shard_ || shard_closed_) open_shard();
    framed_.clear();
    std::string example = encode_example(in);
    append_record(framed_, example.data(), example.size());
    shard_->write(framed_);
    shard_bytes_ += framed_.size();
    ++shard_records_;
    if (shard_bytes_ >= max_bytes_ || (max_records_ && shard_records_ >= max_records_)) {
      shard_->close();
      shard_closed_ = true;
    }
  }
  void finish(bool complete) override {
    if (!complete) {  // the .partial shards stay, visibly incomplete
      for (auto& shard : shards_) shard->discard();
      return;
    }
    if (shard_ && !shard_closed_) shard_->close();
    const std::size_t total = shards_.size();
    std::set<std::string> names;
    for (std::size_t i = 0; i < total; ++i) {
      std::string final_name = prefix_ + shard_name(i, total);
      shards_[i]->publish_as(final_name);
      names.insert(fs::path(final_name).filename().string());
    }
    remove_stale_shards(names);
  }
  // A resumed run goes on with the interrupted run's shards: the finished ones are published at
  // the end with the rest, the open one continues after the records written before the
  // checkpoint, so that resuming with the same prefix gives the uninterrupted run's shards. A
  // compressed shard cannot be continued mid-stream: a checkpoint ends it, and the next record
  // starts a new shard.
  void save_state(StateWriter& w) const override { const_cast<TFRecordWriter*>(this)->save_shards(w); }
  void restore_state(StateReader& r) override {
    const std::string prefix = r.get_string();
    const auto shard_count = r.get<std::uint64_t>();
    std::vector<SavedOutput> saved;
    for (std::uint64_t i = 0; i < shard_count; ++i) saved.push_back(SavedOutput::load(r));
    const bool open = r.get<std::uint8_t>() != 0;
    const auto bytes = r.get<std::uint64_t>(), records = r.get<std::uint64_t>();
    if (prefix != absolute_path(prefix_)) return;  // another prefix (--set): this run writes its own shards there
    // A run that stopped at the checkpoint published its shards: they are taken back by identity.
    const std::vector<std::string> published = shards_of_this_prefix();
    remove_shards_begun_after(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      reclaim_partial(saved[i], published);
      open_shard();
      if (open && i + 1 == saved.size()) {
        shard_->continue_from(saved[i]);
        shard_bytes_ = bytes;
        shard_records_ = records;
      } else {
        shard_->adopt_finished(saved[i]);
        shard_closed_ = true;
      }
    }
  }

 private:
  void save_shards(StateWriter& w) {
    const bool open = shard_ && !shard_closed_;
    if (open && shard_->compressed()) {
      shard_->close();
      shard_closed_ = true;
    }
    w.put_string(absolute_path(prefix_));
    w.put<std::uint64_t>(shards_.size());
    for (auto& shard : shards_) shard->checkpoint_state().save(w);
    const bool still_open = shard_ && !shard_closed_;
    w.put<std::uint8_t>(still_open ? 1 : 0);
    w.put<std::uint64_t>(still_open ? shard_bytes_ : 0);
    w.put<std::uint64_t>(still_open ? shard_records_ : 0);
    w.describe(std::to_string(shards_.size()) + " shard(s) of " + prefix_ + " written up to the checkpoint");
  }
  fs::path prefix_folder() const {
    const fs::path folder = fs::path(prefix_).parent_path();
    return folder.empty() ? fs::path(".") : folder;
  }
  // A run cut off after the checkpoint may have begun shards past the ones it knew of: their
  // partial files (PREFIX-NNNNN.partial-XXXXXX, numbered `first` or more) hold records the resumed
  // run writes again, and go.
  void remove_shards_begun_after(std::size_t first) const {
    const fs::path prefix(prefix_);
    const fs::path folder = prefix_folder();
    std::string stem = prefix.filename().string() + "-";
    if (by_worker_) stem += "worker-" + std::to_string(worker_) + "-";
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const std::size_t dot = name.find(".partial-", stem.size());
      if (name.compare(0, stem.size(), stem) != 0 || dot != stem.size() + 5 || name.size() != dot + 9 + 6) continue;
      const std::string number = name.substr(stem.size(), 5);
      if (!std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
      if (std::stoul(number) >= first) doomed.push_back(it->path());
    }
    for (const auto& path : doomed) fs::remove(path, ec);
  }
  // The files of this folder named PREFIX...tfrecord[.gz|.zz]: where published shards may be.
  std::vector<std::string> shards_of_this_prefix() const {
    const fs::path prefix(prefix_);
    const fs::path folder = prefix_folder();
    const std::string stem = prefix.filename().string(), tail = ".tfrecord" + suffix();
    std::vector<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > stem.size() + tail.size() && name.compare(0, stem.size(), stem) == 0 &&
          name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
        out.push_back(it->path().string());
    }
    return out;
  }
  std::string shard_name(std::size_t index, std::size_t total) const {
    char name[64];
    if (by_worker_) std::snprintf(name, sizeof name, "-worker-%lld-%05zu.tfrecord", static_cast<long long>(worker_), index);
    else std::snprintf(name, sizeof name, "-%05zu-of-%05zu.tfrecord", index, total);
    return name + suffix();
  }
  // A run replaces the set of shards of its prefix: shards of an earlier run of this prefix that
  // this run did not rewrite (another -of-N count, a worker's higher numbers) would otherwise stay
  // beside the new set, and a glob would read both; a set written with another compression too
  // (`train-*` reads .gz beside plain shards). Only names of exactly this writer's form go.
  void remove_stale_shards(const std::set<std::string>& kept) const {
    const fs::path prefix(prefix_);
    const fs::path folder = prefix_folder();
    const std::string stem = prefix.filename().string();
    const std::string worker_part = "-worker-" + std::to_string(worker_) + "-";
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (kept.count(name) || name.compare(0, stem.size(), stem) != 0 || !it->is_regular_file()) continue;
      std::string rest = name.substr(stem.size());
      bool has_a_shard_tail = false;
      for (const std::string tail : {".tfrecord", ".tfrecord.gz", ".tfrecord.zz"})
        if (rest.size() > tail.size() && rest.compare(rest.size() - tail.size(), tail.size(), tail) == 0) {
          rest.resize(rest.size() - tail.size());
          has_a_shard_tail = true;
          break;
        }
      if (!has_a_shard_tail) continue;
      auto digits = [&](std::size_t at, std::size_t n) {
        if (at + n > rest.size()) return false;
        for (std::size_t k = at; k < at + n; ++k)
          if (rest[k] < '0' || rest[k] > '9') return false;
        return true;
      };
      bool ours = false;
      if (by_worker_) ours = rest.size() == worker_part.size() + 5 && rest.compare(0, worker_part.size(), worker_part) == 0 && digits(worker_part.size(), 5);
      else ours = rest.size() == 15 && rest[0] == '-' && digits(1, 5) && rest.compare(6, 4, "-of-") == 0 && digits(10, 5);
      if (ours) fs::remove(it->path(), ec);
    }
  }
  std::string suffix() const {
    return compression_ == Compression::Gzip ? ".gz" : compression_ == Compression::Zlib ? ".zz" : "";
  }
  void open_shard() {
    // The worker's number is in the temporary name too, so that a worker killed mid-run is seen
    // by its own .partial files.
    char name[64];
    if (by_worker_) std::snprintf(name, sizeof name, "-worker-%lld-%05zu", static_cast<long long>(worker_), shards_.size());
    else std::snprintf(name, sizeof name, "-%05zu", shards_.size());
    shards_.push_back(std::make_unique<ShardFile>(prefix_ + name, compression_));
    shard_ = shards_.back().get();
    shard_closed_ = false;
    shard_bytes_ = shard_records_ = 0;
  }

  std::string prefix_;
  std::uint64_t max_bytes_, max_records_;
  Compression compression_;
  bool by_worker_;
  std::int64_t worker_;
  std::vector<std::unique_ptr<ShardFile>> shards_;
  ShardFile* shard_ = nullptr;
  bool shard_closed_ = false;
  std::uint64_t shard_bytes_ = 0, shard_records_ = 0;
  std::string framed_;
};

}  // namespace

void register_tfrecord(Registrar& registrar) {
  registrar.add<TFRecordReader>();
  registrar.add<ParseExample>();
  registrar.add<TFRecordWriter>();
}

}  // namespace sluice::io
