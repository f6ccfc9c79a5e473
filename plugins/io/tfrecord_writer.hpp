#pragma once
// tfrecord_writer: tf.Examples into shards written under temporary names and published whole
// once the run completes. tfds_writer (tfds_ops.cpp) writes its shards through it, and
// array_record_writer (tfrecord_ops.cpp) and parquet_writer (plugins/parquet) are the same writer
// laying its shards out through an encoder (ShardEncoder).
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "array_record.hpp"
#include "byte_source.hpp"
#include "example_codec.hpp"
#include "sluice/sdk.hpp"
#include "tfrecord.hpp"

namespace sluice::io {

// A shard's bytes in a layout other than TFRecord's framing (ArrayRecord's chunks, Parquet's row
// groups): elements in, the file's bytes out as they become ready.
class ShardEncoder {
 public:
  virtual ~ShardEncoder() = default;
  // Adds one element; returns about how many bytes it adds to the shard.
  virtual std::uint64_t add(const Sample& element) = 0;
  // The bytes ready to be written; the shard writes them and clears the string.
  virtual std::string& ready() = 0;
  // Everything held, then the file's closing bytes (footer), into ready().
  virtual void finish() = 0;
  // Whether a checkpoint can leave the shard open (what is held goes to ready() by flush(), and
  // saved() is the encoder's state to restore); if not, a checkpoint ends the shard.
  virtual bool continues_after_checkpoint() const = 0;
  virtual void flush() {}
  virtual std::string saved() const { return {}; }
  virtual void restore(const std::string& /*saved*/) {}
};
using ShardEncoderFactory = std::function<std::unique_ptr<ShardEncoder>()>;

// ArrayRecord's chunks, footer and postscript; each record the bytes `record_of` gives an element.
class ArrayRecordShardEncoder final : public ShardEncoder {
 public:
  ArrayRecordShardEncoder(const ArrayRecordWriterOptions& options, std::function<std::string(const Sample&)> record_of)
      : encoder_(options), record_of_(std::move(record_of)) {}
  std::uint64_t add(const Sample& element) override {
    const std::string record = record_of_(element);
    encoder_.add(record.data(), record.size());
    return record.size();
  }
  std::string& ready() override { return encoder_.ready(); }
  void finish() override { encoder_.finish(); }
  bool continues_after_checkpoint() const override { return true; }
  void flush() override { encoder_.flush(); }
  std::string saved() const override { return encoder_.saved(); }
  void restore(const std::string& saved) override { encoder_.restore(saved); }

 private:
  ArrayRecordEncoder encoder_;
  std::function<std::string(const Sample&)> record_of_;
};

// One shard being written under an exclusive temporary name: TFRecord, plain or through a deflate
// stream for gzip and zlib, or another layout through its encoder. Its final name is given once
// the number of shards is known.
class ShardFile {
 public:
  ShardFile(const std::string& placeholder, Compression compression, Storage* storage, std::unique_ptr<ShardEncoder> encoder = nullptr)
      : file_(placeholder, storage), compression_(compression), encoder_(std::move(encoder)) {
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
  // One element through the shard's encoder; returns about how many bytes it added.
  std::uint64_t write_element(const Sample& element) {
    const std::uint64_t added = encoder_->add(element);
    write_encoded_bytes();
    return added;
  }
  // One record, framed as TFRecord frames it; returns the bytes it added to the shard.
  std::uint64_t write_record(const std::string& record) {
    framed_.clear();
    append_record(framed_, record.data(), record.size());
    write(framed_);
    return framed_.size();
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
    if (encoder_ && !encoder_finished_) {
      encoder_->finish();
      write_encoded_bytes();
      encoder_finished_ = true;
    }
    if (deflating_) {
      drain(Z_FINISH);
      deflateEnd(&z_);
      deflating_ = false;
    }
    file_.finish_writing();
  }
  void publish_as(const std::string& path) { file_.publish_as(path); }
  void discard() { file_.abandon(/*keep=*/true); }  // an interrupted shard stays visibly .partial
  // A compressed TFRecord shard, or one whose encoder cannot continue after a checkpoint, is
  // never open at one (see TFRecordWriter::save_state).
  bool ends_at_checkpoint() const { return deflating_ || (encoder_ && !encoder_->continues_after_checkpoint()); }
  // For checkpoints. An ArrayRecord shard ends its group of records there, and its chunks so far are saved.
  SavedOutput checkpoint_state() {
    if (encoder_ && !encoder_finished_) {
      encoder_->flush();
      write_encoded_bytes();
    }
    return file_.checkpoint_state();
  }
  std::string encoder_state() const { return encoder_ ? encoder_->saved() : std::string(); }
  void continue_from(const SavedOutput& saved, const std::string& encoder_state = {}) {
    file_.continue_from(saved);
    if (encoder_) encoder_->restore(encoder_state);
  }
  void adopt_finished(const SavedOutput& saved) {
    file_.adopt_finished(saved);
    encoder_finished_ = true;
  }

 private:
  void write_encoded_bytes() {
    file_.write(encoder_->ready());
    encoder_->ready().clear();
  }
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
  std::unique_ptr<ShardEncoder> encoder_;
  bool encoder_finished_ = false;
  std::string framed_;
};

// Writes tf.Examples into shards PREFIX-00000-of-000NN.tfrecord, rotated by size or count. Each
// shard is written under a temporary name; all are renamed once the run completed (the total is
// only known then). tensorflow_datasets' names (PREFIX.tfrecord-00000-of-000NN) are tfds_writer's.
class TFRecordWriter : public Sink {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"tfrecord_writer",
            OperatorKind::Sink,
            "Writes elements as tf.train.Example records into shards PREFIX-00000-of-000NN.tfrecord",
            {ParamSpec::make("prefix", ParamType::OutputPath, "path prefix of the shards (folder/name)"),
             ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes (about 100 MB advised)")
                 .def("100000000")
                 .range(1, std::nullopt),
             ParamSpec::make("max_records", ParamType::Int, "start a new shard past this many records; 0: no limit").def("0").range(0, std::nullopt),
             ParamSpec::make("compression", ParamType::Choice, "shard compression").def("none").one_of({"none", "gzip", "zlib"})},
            {.saves_state = true},
            {}};
    return with_shard_naming(std::move(info));
  }
  // How several processes' shards are named: the parameters tfrecord_writer and array_record_writer
  // share, after their own.
  static OperatorInfo with_shard_naming(OperatorInfo info) {
    info.params.insert(info.params.end(), {ParamSpec::make("naming", ParamType::Choice,
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
                .takes_hint("num_workers")});
    return info;
  }
  enum class Naming { OfTotal, Worker, Tfds };
  // Shards named as tensorflow_datasets names them, uncompressed: PREFIX.tfrecord-00000-of-000NN.
  TFRecordWriter(std::string prefix, std::uint64_t max_bytes, std::uint64_t max_records)
      : prefix_(std::move(prefix)), max_bytes_(max_bytes), max_records_(max_records), compression_(Compression::None),
        naming_(Naming::Tfds), by_worker_(false), worker_(0) {}
  explicit TFRecordWriter(const Params& p) : TFRecordWriter(p, parse_compression(p.get_string("compression")), nullptr, ".tfrecord") {}
  // The same shards in another layout (array_record_writer, parquet_writer): each shard's bytes
  // made by an encoder from `encoder`, its files named with `extension`.
  TFRecordWriter(const Params& p, Compression compression, ShardEncoderFactory encoder, std::string extension)
      : prefix_(p.get_string("prefix")),
        max_bytes_(static_cast<std::uint64_t>(p.get_int("max_bytes"))),
        max_records_(static_cast<std::uint64_t>(p.get_int("max_records"))),
        compression_(compression),
        naming_(p.get_string("naming") == "worker" ? Naming::Worker : Naming::OfTotal),
        by_worker_(naming_ == Naming::Worker),
        worker_(p.get_int("worker")),
        encoder_(std::move(encoder)),
        extension_(std::move(extension)) {
    if (prefix_.empty()) throw ParamError("prefix must not be empty");
    // Several workers numbering "-of-N" shards each would replace each other's, and a run's
    // clean-up removes the shards it did not write: the other workers'.
    if (!by_worker_ && p.get_int("workers") > 1)
      throw ParamError(std::to_string(p.get_int("workers")) + " workers would each write PREFIX-00000-of-000NN and replace " +
                       "each other's shards; set naming to worker (PREFIX-worker-W-00000 per worker)");
  }
  void start(const StageInfo& info) override {
    if (worker_ < 0) worker_ = 0;  // a host that does not fill worker hints runs one process
    storage_ = info.storage;
    if (is_remote_uri(prefix_)) return;  // a bucket has no folders to make
    auto folder = std::filesystem::path(prefix_).parent_path();
    std::error_code ec;
    if (!folder.empty()) std::filesystem::create_directories(folder, ec);
    if (ec) throw Error("cannot create folder " + folder.string() + " for prefix " + prefix_ + ": " + ec.message());
  }
  void consume(Sample in, const ElementContext&) override {
    if (!shard_ || shard_closed_) open_shard();
    shard_bytes_ += encoder_ ? shard_->write_element(in) : shard_->write_record(encode_example(in));
    ++shard_records_;
    shard_lengths_.back() = shard_records_;
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
      names.insert(std::filesystem::path(final_name).filename().string());
    }
    if (!is_remote_uri(prefix_)) remove_stale_shards(names);  // objects of a bucket are never deleted
  }
  // A resumed run goes on with the interrupted run's shards: the finished ones are published at
  // the end with the rest, the open one continues after the records written before the
  // checkpoint, so that resuming with the same prefix gives the uninterrupted run's shards. A
  // compressed shard cannot be continued mid-stream: a checkpoint ends it, and the next record
  // starts a new shard.
  void save_state(StateWriter& w) const override { const_cast<TFRecordWriter*>(this)->save_shards(w); }
  void restore_state(StateReader& r) override {
    const std::string prefix = r.get_string();
    std::vector<std::uint64_t> lengths;
    if (naming_ == Naming::Tfds) {
      lengths.resize(r.get_within<std::uint64_t>(0, 1u << 24, "the number of shards"));
      for (auto& n : lengths) n = r.get<std::uint64_t>();
    }
    const auto shard_count = r.get<std::uint64_t>();
    std::vector<SavedOutput> saved;
    for (std::uint64_t i = 0; i < shard_count; ++i) saved.push_back(SavedOutput::load(r));
    const bool open = r.get<std::uint8_t>() != 0;
    const auto bytes = r.get<std::uint64_t>(), records = r.get<std::uint64_t>();
    const std::string encoder_state = encoder_ ? r.get_string() : std::string();
    if (prefix != absolute_path(prefix_)) return;  // another prefix (--set): this run writes its own shards there
    // A run that stopped at the checkpoint published its shards: they are taken back by identity.
    const bool remote = is_remote_uri(prefix_);
    const std::vector<std::string> published = remote ? std::vector<std::string>{} : shards_of_this_prefix();
    if (!remote) remove_shards_begun_after(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      if (remote) {
        // A run that stopped at this checkpoint uploaded shard i of saved.size() under its final name.
        SavedOutput uploaded = saved[i];
        uploaded.target = prefix_ + shard_name(i, saved.size());
        reclaim_partial(uploaded, {}, storage_);
      } else {
        reclaim_partial(saved[i], published);
      }
      open_shard();
      if (open && i + 1 == saved.size()) {
        shard_->continue_from(saved[i], encoder_state);
        shard_bytes_ = bytes;
        shard_records_ = records;
      } else {
        shard_->adopt_finished(saved[i]);
        shard_closed_ = true;
      }
      if (i < lengths.size()) shard_lengths_.back() = lengths[i];
    }
  }

  // Records in each shard written so far, in shard order.
  const std::vector<std::uint64_t>& shard_lengths() const { return shard_lengths_; }
  // The name shard `index` of `total` is published under (the prefix, then this).
  std::string shard_name(std::size_t index, std::size_t total) const {
    char name[64];
    if (naming_ == Naming::Tfds) std::snprintf(name, sizeof name, "%s-%05zu-of-%05zu", extension(), index, total);
    else if (by_worker_) std::snprintf(name, sizeof name, "-worker-%lld-%05zu%s", static_cast<long long>(worker_), index, extension());
    else std::snprintf(name, sizeof name, "-%05zu-of-%05zu%s", index, total, extension());
    return name + suffix();
  }
  const char* extension() const { return extension_.c_str(); }

 private:
  void save_shards(StateWriter& w) {
    const bool open = shard_ && !shard_closed_;
    if (open && shard_->ends_at_checkpoint()) {
      shard_->close();
      shard_closed_ = true;
    }
    w.put_string(absolute_path(prefix_));
    if (naming_ == Naming::Tfds) {
      w.put<std::uint64_t>(shard_lengths_.size());
      for (auto n : shard_lengths_) w.put(n);
    }
    w.put<std::uint64_t>(shards_.size());
    for (auto& shard : shards_) shard->checkpoint_state().save(w);
    const bool still_open = shard_ && !shard_closed_;
    w.put<std::uint8_t>(still_open ? 1 : 0);
    w.put<std::uint64_t>(still_open ? shard_bytes_ : 0);
    w.put<std::uint64_t>(still_open ? shard_records_ : 0);
    if (encoder_) w.put_string(still_open ? shard_->encoder_state() : std::string());
    w.describe(std::to_string(shards_.size()) + " shard(s) of " + prefix_ + " written up to the checkpoint");
  }
  std::filesystem::path prefix_folder() const {
    const std::filesystem::path folder = std::filesystem::path(prefix_).parent_path();
    return folder.empty() ? std::filesystem::path(".") : folder;
  }
  // A run cut off after the checkpoint may have begun shards past the ones it knew of: their
  // partial files (PREFIX-NNNNN.partial-XXXXXX, numbered `first` or more) hold records the resumed
  // run writes again, and go.
  void remove_shards_begun_after(std::size_t first) const {
    const std::filesystem::path prefix(prefix_);
    const std::filesystem::path folder = prefix_folder();
    std::string stem = prefix.filename().string() + "-";
    if (by_worker_) stem += "worker-" + std::to_string(worker_) + "-";
    std::error_code ec;
    std::vector<std::filesystem::path> doomed;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const std::size_t dot = name.find(".partial-", stem.size());
      if (name.compare(0, stem.size(), stem) != 0 || dot != stem.size() + 5 || name.size() != dot + 9 + 6) continue;
      const std::string number = name.substr(stem.size(), 5);
      if (!std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
      if (std::stoul(number) >= first) doomed.push_back(it->path());
    }
    for (const auto& path : doomed) std::filesystem::remove(path, ec);
  }
  // The files of this folder named PREFIX...tfrecord[.gz|.zz] (.array_record): where published shards may be.
  std::vector<std::string> shards_of_this_prefix() const {
    const std::filesystem::path prefix(prefix_);
    const std::filesystem::path folder = prefix_folder();
    const std::string stem = prefix.filename().string(), tail = extension() + suffix();
    std::vector<std::string> out;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const bool ours = naming_ == Naming::Tfds
                            ? name.compare(0, stem.size() + tail.size() + 1, stem + tail + "-") == 0
                            : name.size() > stem.size() + tail.size() && name.compare(0, stem.size(), stem) == 0 &&
                                  name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
      if (ours) out.push_back(it->path().string());
    }
    return out;
  }
  // A run replaces the set of shards of its prefix: shards of an earlier run of this prefix that
  // this run did not rewrite (another -of-N count, a worker's higher numbers) would otherwise stay
  // beside the new set, and a glob would read both; a set written with another compression too
  // (`train-*` reads .gz beside plain shards). Only names of exactly this writer's form go.
  void remove_stale_shards(const std::set<std::string>& kept) const {
    const std::filesystem::path prefix(prefix_);
    const std::filesystem::path folder = prefix_folder();
    const std::string stem = prefix.filename().string();
    const std::string worker_part = "-worker-" + std::to_string(worker_) + "-";
    std::error_code ec;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (kept.count(name) || name.compare(0, stem.size(), stem) != 0 || !it->is_regular_file()) continue;
      std::string rest = name.substr(stem.size());
      if (naming_ == Naming::Tfds) {  // .tfrecord-NNNNN-of-NNNNN
        const std::string head = extension() + std::string("-");
        const std::size_t at = head.size();
        const bool tfds_shard = rest.size() == at + 15 && rest.compare(0, at, head) == 0 && rest.compare(at + 5, 4, "-of-") == 0 &&
                                std::all_of(rest.begin() + at, rest.begin() + at + 5, ::isdigit) &&
                                std::all_of(rest.begin() + at + 9, rest.end(), ::isdigit);
        if (tfds_shard) std::filesystem::remove(it->path(), ec);
        continue;
      }
      bool has_a_shard_tail = false;
      const std::string extension = this->extension();
      for (const std::string& tail : {extension, extension + ".gz", extension + ".zz"})
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
      if (ours) std::filesystem::remove(it->path(), ec);
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
    shards_.push_back(std::make_unique<ShardFile>(prefix_ + name, compression_, storage_, encoder_ ? encoder_() : nullptr));
    shard_lengths_.push_back(0);
    shard_ = shards_.back().get();
    shard_closed_ = false;
    shard_bytes_ = shard_records_ = 0;
  }

  std::string prefix_;
  std::uint64_t max_bytes_, max_records_;
  Compression compression_;
  Naming naming_;
  bool by_worker_;
  std::int64_t worker_;
  std::vector<std::unique_ptr<ShardFile>> shards_;
  ShardFile* shard_ = nullptr;
  Storage* storage_ = nullptr;
  bool shard_closed_ = false;
  std::uint64_t shard_bytes_ = 0, shard_records_ = 0;
  std::vector<std::uint64_t> shard_lengths_;
  ShardEncoderFactory encoder_;
  std::string extension_ = ".tfrecord";
};

}  // namespace sluice::io
