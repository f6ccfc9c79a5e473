// tfds (the shards a split expression selects in a prepared tensorflow_datasets directory) and
// tfds_reader (one shard's examples, parsed by the dataset's features.json).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "example_codec.hpp"
#include "io_plugin.hpp"
#include "text_scan.hpp"
#include "tfds_info.hpp"
#include "array_record.hpp"
#include "tfrecord.hpp"
#include "tfrecord_writer.hpp"

namespace fs = std::filesystem;

namespace sluice::io {

// tfds.load's data_dir: the parameter, else $TFDS_DATA_DIR, else ~/tensorflow_datasets.
std::string tfds_data_dir(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("TFDS_DATA_DIR"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / "tensorflow_datasets").string();
}

namespace {

std::int64_t shard_bytes(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1;
}

// The sizes of the objects of a version folder in a bucket, from one listing.
std::map<std::string, std::int64_t> remote_shard_bytes(const std::string& dir, Storage* storage) {
  std::map<std::string, std::int64_t> sizes;
  if (!storage) throw DataError("cannot read " + dir + ": remote URIs are read through a Sluice engine");
  for (const auto& object : storage->list(dir + "/")) sizes[object.uri] = static_cast<std::int64_t>(object.size);
  return sizes;
}

// One element per shard a split expression reads, with the examples to skip and take there, in
// TFDS's order (the expression's parts in turn, each part's shards in order); shuffle_files
// shuffles them each epoch with the pipeline's seed. The reader after it (tfds_reader, interleaved
// as TFDS's read_config does: 16 shards, blocks of 16) opens only these shards.
class TfdsSource final : public Source {
 public:
  static OperatorInfo describe() {
    return {"tfds",
            OperatorKind::Source,
            "The shards of a split of a prepared tensorflow_datasets dataset ('path', 'skip', 'take', 'split', 'shard', and 'shard_examples': what shardLengths says the shard holds), "
            "for tfds_reader; split in TFDS's grammar (train[:75%]+test, train[:4shard], ...)",
            {ParamSpec::make("name", ParamType::String, "as tfds.load's: mnist, mnist:3.0.1, NAME/CONFIG, NAME/CONFIG:VERSION (newest version when none)"),
             ParamSpec::make("split", ParamType::String, "TFDS's split expression: train, test[:1000], train[25%:75%], train[:4shard], train+test, all"),
             ParamSpec::make("data_dir", ParamType::Path, "folder holding the datasets; empty: $TFDS_DATA_DIR, else ~/tensorflow_datasets").def(""),
             ParamSpec::make("shuffle_files", ParamType::Bool, "shuffle the shards' order each epoch, as tfds.load(shuffle_files=True)").def("false"),
             ParamSpec::make("seed", ParamType::Int, "shuffle seed; -1 uses the pipeline's seed").def("-1").range(-1, std::nullopt),
             ParamSpec::make("rounding", ParamType::Choice, "how percent boundaries become examples, as tfds.ReadInstruction's")
                 .def("closest")
                 .one_of({"closest", "pct1_dropremainder"})},
            {.stateless = false, .random = true, .saves_state = true},
            {}};
  }
  explicit TfdsSource(const Params& p)
      : name_(p.get_string("name")),
        split_(p.get_string("split")),
        data_dir_(p.get_string("data_dir")),
        shuffle_(p.get_bool("shuffle_files")),
        seed_(p.get_int("seed")),
        rounding_(p.get_string("rounding") == "closest" ? SplitRounding::Closest : SplitRounding::Pct1DropRemainder) {}

  void start(const StageInfo& info) override {
    info_ = info;
    const TfdsDataset ds = read_tfds_dataset(find_tfds_dataset(tfds_data_dir(data_dir_), name_, info.storage), info.storage);
    if (is_remote_uri(ds.dir)) remote_sizes_ = remote_shard_bytes(ds.dir, info.storage);
    const auto splits = ds.split_shards();
    reads_.clear();
    const std::vector<SplitRange> ranges = resolve_split(split_, splits, rounding_);
    std::uint64_t examples = 0;
    for (const SplitRange& range : ranges) examples += range.to - range.from;
    // TFDS refuses such a split ("corresponds to no data"): a slice rounded away is a mistake.
    if (examples == 0)
      throw ParamError("split '" + split_ + "' of " + ds.dir + " takes no example (TFDS refuses it too): widen the slice (a percentage of a small split " +
                       "can round to nothing)");
    for (const SplitRange& range : ranges)
      for (const ShardRead& r : shard_reads(range, ds.split(range.split).shards)) {
        const std::string path = ds.shard_path(r.split, r.shard);
        if (bytes_of(path) < 0)
          throw DataError(path + ": shard " + std::to_string(r.shard) + " of split '" + r.split + "' is missing (dataset_info.json in " +
                          ds.dir + " lists it); prepare the dataset again, or copy the shard back");
        reads_.push_back({path, r, ds.split(range.split).shards.shard_lengths[r.shard]});
      }
  }
  void begin_pass(std::uint64_t pass) override {
    order_.resize(reads_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    if (shuffle_) {
      Rng rng(seed_ >= 0 ? static_cast<std::uint64_t>(seed_) : info_.seed, info_.stage_hash, pass, 0);
      for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    }
    next_ = 0;
  }
  std::int64_t expected_elements() const override { return static_cast<std::int64_t>(reads_.size()); }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= order_.size()) return false;
    const Read& r = reads_[order_[next_++]];
    out.set("path", Tensor::from_string(r.path));
    out.set("skip", Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(r.read.skip)));
    out.set("take", Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(r.read.take)));
    out.set("split", Tensor::from_string(r.read.split));
    out.set("shard", Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(r.read.shard)));
    out.set("shard_examples", Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(r.shard_examples)));
    out.set_origin(r.path);
    return true;
  }
  // The shards read (with their sizes) and what of each, so that a resume over another dataset or
  // split is refused; then the pass's order and place.
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(reads_.size());
    for (const Read& r : reads_) {
      w.put_string(r.path);
      w.put(bytes_of(r.path));
      w.put(r.read.skip);
      w.put(r.read.take);
    }
    w.put<std::uint64_t>(order_.size());
    for (auto i : order_) w.put<std::uint64_t>(i);
    w.put<std::uint64_t>(next_);
    w.describe(std::to_string(next_) + " of " + std::to_string(reads_.size()) + " shards of " + split_);
  }
  void restore_state(StateReader& r) override {
    const auto count = r.get<std::uint64_t>();
    if (count != reads_.size())
      throw Error("the checkpoint's run read " + std::to_string(count) + " shards, split '" + split_ + "' of '" + name_ + "' now reads " +
                  std::to_string(reads_.size()) + ": resume with the same dataset and split");
    for (const Read& now : reads_) {
      const std::string path = r.get_string();
      const auto size = r.get<std::int64_t>();
      const auto skip = r.get<std::uint64_t>();
      const auto take = r.get<std::uint64_t>();
      if (path != now.path || skip != now.read.skip || take != now.read.take)
        throw Error("the checkpoint's run read " + path + " (skip " + std::to_string(skip) + ", take " + std::to_string(take) + ") where split '" +
                    split_ + "' now reads " + now.path + " (skip " + std::to_string(now.read.skip) + ", take " + std::to_string(now.read.take) +
                    "): resume with the same dataset and split");
      if (size != bytes_of(now.path))
        throw Error(now.path + " had " + std::to_string(size) + " bytes in the checkpoint's run and has " + std::to_string(bytes_of(now.path)) +
                    " now: resume over the same dataset");
    }
    const auto ordered = r.get_within<std::uint64_t>(0, reads_.size(), "the number of shards in the saved order");
    order_.assign(static_cast<std::size_t>(ordered), 0);
    for (auto& i : order_) i = static_cast<std::size_t>(r.get_within<std::uint64_t>(0, reads_.size() - 1, "a shard in the saved order"));
    next_ = static_cast<std::size_t>(r.get_within<std::uint64_t>(0, order_.size(), "the next shard's number"));
  }

 private:
  struct Read {
    std::string path;
    ShardRead read;
    std::uint64_t shard_examples;  // what dataset_info.json's shardLengths says the shard holds
  };
  // A shard's size: on disk, or as the bucket's listing gave it (-1: missing).
  std::int64_t bytes_of(const std::string& path) const {
    if (!is_remote_uri(path)) return shard_bytes(path);
    auto it = remote_sizes_.find(path);
    return it == remote_sizes_.end() ? -1 : it->second;
  }
  std::map<std::string, std::int64_t> remote_sizes_;
  std::string name_, split_, data_dir_;
  bool shuffle_;
  std::int64_t seed_;
  SplitRounding rounding_;
  StageInfo info_;
  std::vector<Read> reads_;
  std::vector<std::size_t> order_;
  std::size_t next_ = 0;
};

// What a reader needs of a version folder, read once per folder and shared by its cursors.
struct LoadedDataset {
  TfdsDataset info;
  std::unique_ptr<ExampleParser> parser;
  std::map<std::string, Tensor> class_names;  // ClassLabel feature -> its names (Bytes [num_classes])
};

// TFDS writes the names of ClassLabel 'a/b' to a-b.labels.txt, one per line, when it has names.
std::string class_names_file(const std::string& dir, const TfdsFeature& f) {
  std::string file_name = f.name;
  for (auto& c : file_name)
    if (c == '/') c = '-';
  return (fs::path(dir) / (file_name + ".labels.txt")).string();
}

Tensor read_class_names(const std::string& dir, const TfdsFeature& f, Storage* storage) {
  const std::string path = class_names_file(dir, f);
  std::istringstream remote;
  std::ifstream local;
  std::istream& in = is_remote_uri(path) ? static_cast<std::istream&>(remote) : local;
  if (is_remote_uri(path)) remote.str(read_remote_text(path, storage));
  else local.open(path);
  if (!in) throw DataError(path + " cannot be read: class_names needs the names of ClassLabel '" + f.name + "'; set class_names: false");
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  std::vector<std::string_view> views(names.begin(), names.end());
  return Tensor::from_strings(views, {static_cast<std::int64_t>(views.size())});
}

// A shard's records, in the dataset's file format.
std::unique_ptr<RecordStream> open_shard_records(const std::string& path, const std::string& file_format, const RecordReaderOptions& options,
                                                 Storage* storage) {
  if (file_format == "array_record") return std::make_unique<ArrayRecordStream>(path, storage, options.verify_crc, options.chunk_bytes, options.allocator);
  return std::make_unique<RecordReader>(open_file(path, Compression::None, storage), path, options);
}

class TfdsReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"tfds_reader",
            OperatorKind::Expand,
            "Reads the examples of one tfds shard ('path', 'skip', 'take' from the tfds source) into the fields its features.json "
            "describes (nested names as a/b; images stay encoded for decode_image)",
            {ParamSpec::make("class_names", ParamType::Bool, "add FEATURE_name (bytes) beside each ClassLabel whose names TFDS wrote (FEATURE.labels.txt)").def("false"),
             ParamSpec::make("verify_crc", ParamType::Bool, "check the masked CRC-32C of every length and record (of ArrayRecord files: every chunk's hash)").def("true"),
             ParamSpec::make("buffer_bytes", ParamType::Int, "size of each sequential read").def("4194304").range(4096, 1 << 30)},
            {.stateless = true},
            {}};
  }
  explicit TfdsReader(const Params& p) : class_names_(p.get_bool("class_names")) {
    options_.verify_crc = p.get_bool("verify_crc");
    options_.chunk_bytes = static_cast<std::size_t>(p.get_int("buffer_bytes"));
    options_.allocator = &pool_;
  }

  class Cursor final : public ExpandCursor {
   public:
    Cursor(std::string path, std::shared_ptr<const LoadedDataset> dataset, std::uint64_t skip, std::uint64_t take, std::int64_t shard_examples,
           RecordReaderOptions options, bool class_names, DamageReport& damage, Storage* storage)
        : path_(std::make_shared<const std::string>(std::move(path))),
          dataset_(std::move(dataset)),
          reader_(open_shard_records(*path_, dataset_->info.file_format, options, storage)),
          skip_(skip),
          end_(skip + take),
          shard_examples_(shard_examples),
          class_names_(class_names),
          damage_(damage) {}
    bool next(Sample& out) override {
      Record r;
      while (reader_->records_read() < skip_)
        if (!reader_->next(r, &damage_)) return shard_ended();
      if (reader_->records_read() >= end_) return past_the_last();
      if (!reader_->next(r, &damage_)) return shard_ended();
      out = Sample();
      try {
        dataset_->parser->parse(r.buffer, r.offset, r.length, out);
        for (const TfdsFeature& f : dataset_->info.features) out.set(f.name, tfds_feature_tensor(out.at(f.name), f));
      } catch (const DataError& e) {
        throw DataError(*path_ + ", record " + std::to_string(r.index) + " (byte " + std::to_string(r.file_offset) + "): " + e.what());
      }
      if (class_names_)
        for (const auto& [feature, names] : dataset_->class_names) out.set(feature + "_name", class_name(out.at(feature), names, feature));
      out.set_origin(path_, static_cast<std::int64_t>(r.index), static_cast<std::int64_t>(r.file_offset));
      return true;
    }
    bool seek(std::int64_t record, std::int64_t byte_offset) override {
      return record >= static_cast<std::int64_t>(skip_) && record < static_cast<std::int64_t>(end_) && byte_offset >= 0 &&
             reader_->seek(static_cast<std::uint64_t>(record), static_cast<std::uint64_t>(byte_offset));
    }

   private:
    // A read to the shard's end (by dataset_info.json's shardLengths) checks that it ends there:
    // metadata that shortens a split would drop examples silently (TFDS's own checks fail it).
    bool past_the_last() {
      if (end_checked_ || shard_examples_ < 0 || end_ != static_cast<std::uint64_t>(shard_examples_)) return false;
      end_checked_ = true;
      Record r;
      if (!reader_->next(r, &damage_)) return false;
      const std::string reason = *path_ + " holds more than the " + std::to_string(shard_examples_) + " records dataset_info.json in " +
                                 dataset_->info.dir + " gives it (shardLengths): the metadata is of another preparation and would " +
                                 "leave examples out; prepare the dataset again";
      if (!damage_.skip_damaged(reason)) throw DataError(reason);
      return false;
    }
    // dataset_info.json promised `end_` records here: fewer means the shard lost some.
    bool shard_ended() {
      const std::string reason = *path_ + " ends after " + std::to_string(reader_->records_read()) + " records, where dataset_info.json in " +
                                 dataset_->info.dir + " says the split reads up to record " + std::to_string(end_) +
                                 " (a shard cut short, or metadata of another preparation)";
      if (!damage_.skip_damaged(reason)) throw DataError(reason);
      return false;
    }
    static Tensor class_name(const Tensor& label, const Tensor& names, const std::string& feature) {
      const std::int64_t n = label.num_elements();
      std::vector<std::string_view> out;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t k = label.data<std::int64_t>()[i];
        if (k < 0 || k >= names.num_elements())
          throw DataError("ClassLabel '" + feature + "' is " + std::to_string(k) + ", past its " + std::to_string(names.num_elements()) + " names");
        out.push_back(names.string_at(k));
      }
      return Tensor::from_strings(out, label.shape());
    }

    std::shared_ptr<const std::string> path_;
    std::shared_ptr<const LoadedDataset> dataset_;
    std::unique_ptr<RecordStream> reader_;
    std::uint64_t skip_, end_;
    std::int64_t shard_examples_;  // -1: not given (the read is not checked against its shard's end)
    bool end_checked_ = false;
    bool class_names_;
    DamageReport& damage_;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    if (!in.find("path"))
      throw DataError("tfds_reader reads the elements of the tfds source ('path', 'skip', 'take'); this one has no 'path'");
    std::string path(in.at("path").string_at(0));
    const std::uint64_t skip = in.find("skip") ? static_cast<std::uint64_t>(std::max<std::int64_t>(0, in.at("skip").data<std::int64_t>()[0])) : 0;
    const std::uint64_t take = in.find("take") ? static_cast<std::uint64_t>(std::max<std::int64_t>(0, in.at("take").data<std::int64_t>()[0]))
                                              : std::numeric_limits<std::uint64_t>::max() - skip;
    const std::int64_t shard_examples = in.find("shard_examples") ? in.at("shard_examples").data<std::int64_t>()[0] : -1;
    Storage* storage = ctx.stage ? ctx.stage->storage : nullptr;
    auto dataset = load(fs::path(path).parent_path().string(), storage);
    return std::make_unique<Cursor>(std::move(path), std::move(dataset), skip, take, shard_examples, options_, class_names_, damage, storage);
  }

 private:
  std::shared_ptr<const LoadedDataset> load(const std::string& dir, Storage* storage) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = loaded_[dir];
    if (!slot) {
      auto d = std::make_shared<LoadedDataset>();
      d->info = read_tfds_dataset(dir.empty() ? "." : dir, storage);
      d->parser = std::make_unique<ExampleParser>(tfds_example_spec(d->info.features), std::vector<FeatureSpec>{});
      if (class_names_) {
        const auto remote_sizes = is_remote_uri(d->info.dir) ? remote_shard_bytes(d->info.dir, storage) : std::map<std::string, std::int64_t>{};
        auto exists = [&](const std::string& file) { return is_remote_uri(file) ? remote_sizes.count(file) > 0 : fs::exists(file); };
        for (const TfdsFeature& f : d->info.features)
          if (f.kind == TfdsFeature::Kind::ClassLabel && exists(class_names_file(d->info.dir, f)))
            d->class_names[f.name] = read_class_names(d->info.dir, f, storage);
        if (d->class_names.empty())
          throw DataError(d->info.dir + " names the classes of no ClassLabel (no FEATURE.labels.txt beside its features.json); "
                          "set class_names: false");
      }
      slot = std::move(d);
    }
    return slot;
  }

  bool class_names_;
  PooledHostAllocator pool_;
  RecordReaderOptions options_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const LoadedDataset>> loaded_;
};

// What the bytes of an encoded image say of it without decoding: format, height, width and
// channels (PNG's header, JPEG's frame header); nullopt for anything else.
struct ImageHeader {
  std::string format;
  std::int64_t height = 0, width = 0, channels = 0;
};
std::optional<ImageHeader> image_header(std::string_view b) {
  auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(b[i]); };
  auto be16 = [&](std::size_t i) { return (std::int64_t(byte(i)) << 8) | byte(i + 1); };
  auto be32 = [&](std::size_t i) { return (be16(i) << 16) | be16(i + 2); };
  if (b.size() >= 26 && b.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0 && b.compare(12, 4, "IHDR") == 0) {
    static const int channels_of_color_type[] = {1, 0, 3, 3, 2, 0, 4};
    const int type = byte(25);
    if (type > 6 || channels_of_color_type[type] == 0) return std::nullopt;
    return ImageHeader{"png", be32(20), be32(16), channels_of_color_type[type]};
  }
  if (b.size() < 4 || byte(0) != 0xFF || byte(1) != 0xD8) return std::nullopt;
  for (std::size_t i = 2; i + 9 < b.size();) {  // markers up to the frame header (SOF0-SOF15 but DHT, JPG, DAC)
    if (byte(i) != 0xFF) return std::nullopt;
    const int marker = byte(i + 1);
    if (marker == 0xFF) { ++i; continue; }
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)
      return ImageHeader{"jpeg", be16(i + 5), be16(i + 7), byte(i + 9)};
    i += 2 + static_cast<std::size_t>(be16(i + 2));
  }
  return std::nullopt;
}

// Holds an exclusive flock() on a folder while it lives.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) throw Error("cannot open " + dir + " to lock it: " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) {
        const int err = errno;
        ::close(fd_);
        throw Error("cannot lock " + dir + ": " + std::strerror(err));
      }
  }
  ~DirectoryLock() { ::close(fd_); }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_;
};

// Writes one split of a tensorflow_datasets directory: DATA_DIR/NAME/VERSION/NAME-SPLIT.tfrecord-
// 00000-of-000NN shards (through tfrecord_writer, published whole at the end), then features.json
// from the fields it saw and dataset_info.json with the split's shard lengths. A second run with
// another split adds it beside the first.
class TfdsWriter final : public TFRecordWriter {
 public:
  static OperatorInfo describe() {
    return {"tfds_writer",
            OperatorKind::Sink,
            "Writes a split of a tensorflow_datasets directory (DATA_DIR/NAME/VERSION: shards, dataset_info.json, features.json "
            "from the fields) that the tfds source and tfds.builder_from_directory read",
            {ParamSpec::make("data_dir", ParamType::OutputPath, "folder of the datasets (as tfds.load's data_dir)"),
             ParamSpec::make("name", ParamType::String, "the dataset's name (lower case, digits, _)"),
             ParamSpec::make("version", ParamType::String, "its version, MAJOR.MINOR.PATCH").def("1.0.0"),
             ParamSpec::make("split", ParamType::String, "the split this run writes; other splits already there stay").def("train"),
             ParamSpec::make("max_bytes", ParamType::Int, "start a new shard past this many bytes").def("100000000").range(1, std::nullopt),
             ParamSpec::make("max_records", ParamType::Int, "start a new shard past this many records; 0: no limit").def("0").range(0, std::nullopt),
             ParamSpec::make("class_labels", ParamType::StringList,
                             "integer fields written as ClassLabel: FIELD (classes: the largest value + 1, or more if another split has more) or FIELD:CLASSES")
                 .def(""),
             ParamSpec::make("supervised_keys", ParamType::StringList, "INPUT,TARGET: the fields of as_supervised pairs").def(""),
             ParamSpec::make("description", ParamType::String, "the dataset's description").def("")},
            {.saves_state = true},
            {}};
  }
  explicit TfdsWriter(const Params& p)
      : TFRecordWriter(shard_prefix(p), static_cast<std::uint64_t>(p.get_int("max_bytes")), static_cast<std::uint64_t>(p.get_int("max_records"))),
        dir_((fs::path(p.get_string("data_dir")) / p.get_string("name") / p.get_string("version")).string()),
        name_(p.get_string("name")),
        version_(p.get_string("version")),
        split_(p.get_string("split")),
        description_(p.get_string("description")) {
    for (const auto& entry : p.get_string_list("class_labels")) {  // FIELD or FIELD:CLASSES
      const auto colon = entry.find(':');
      const std::string field = entry.substr(0, colon);
      std::int64_t classes = 0;
      if (colon != std::string::npos) {
        char* end = nullptr;
        classes = std::strtoll(entry.c_str() + colon + 1, &end, 10);
        if (classes < 1 || *end != '\0') throw ParamError("class_labels entry '" + entry + "': CLASSES after ':' is a whole number above 0");
      }
      class_labels_[field] = classes;
    }
    const auto& keys = p.get_string_list("supervised_keys");
    if (keys.size() == 2) supervised_keys_ = std::make_pair(keys[0], keys[1]);
    else if (!keys.empty()) throw ParamError("supervised_keys names " + std::to_string(keys.size()) + " fields; give two: INPUT,TARGET");
  }
  void consume(Sample in, const ElementContext& ctx) override {
    observe(in);
    TFRecordWriter::consume(std::move(in), ctx);
  }
  void finish(bool complete) override {
    if (!complete) return TFRecordWriter::finish(false);
    // Writers of other splits of this dataset (other stages, other processes) read, merge and
    // publish the metadata one at a time.
    const DirectoryLock lock(dir_);
    std::string features, info;
    try {  // refused before the shards are published: nothing of this run replaces what is there
      features = tfds_features_json(described_features(), existing(dir_ + "/features.json"), dir_ + "/features.json");
      TfdsSplit split;
      split.shards.name = split_;
      split.shards.shard_lengths = shard_lengths();
      split.filepath_template = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}";
      split.num_bytes = bytes_;
      info = tfds_dataset_info_json(existing(dir_ + "/dataset_info.json"), dir_ + "/dataset_info.json", name_, version_, split,
                                    supervised_keys_, description_);
    } catch (...) {
      TFRecordWriter::finish(false);
      throw;
    }
    TFRecordWriter::finish(true);
    publish(dir_ + "/features.json", features);
    publish(dir_ + "/dataset_info.json", info);
  }
  void save_state(StateWriter& w) const override {
    TFRecordWriter::save_state(w);
    w.put<std::uint64_t>(bytes_);
    w.put<std::uint64_t>(seen_.size());
    for (const auto& [field, seen] : seen_) {
      w.put_string(field);
      w.put(static_cast<std::uint8_t>(seen.dtype));
      w.put<std::uint64_t>(seen.shape.size());
      for (auto d : seen.shape) w.put(d);
      w.put_string(seen.image_format);
      w.put<std::uint8_t>(seen.image ? 1 : 0);
      w.put(seen.largest);
    }
  }
  void restore_state(StateReader& r) override {
    TFRecordWriter::restore_state(r);
    bytes_ = r.get<std::uint64_t>();
    seen_.clear();
    const auto count = r.get_within<std::uint64_t>(0, 1u << 16, "the number of fields");
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string field = r.get_string();
      Seen& seen = seen_[field];
      order_.push_back(field);
      seen.dtype = static_cast<DType>(r.get_within<std::uint8_t>(0, static_cast<std::uint8_t>(DType::Bytes), "a field's dtype"));
      seen.shape.resize(r.get_within<std::uint64_t>(0, 64, "a field's rank"));
      for (auto& d : seen.shape) d = r.get<std::int64_t>();
      seen.image_format = r.get_string();
      seen.image = r.get<std::uint8_t>() != 0;
      seen.largest = r.get<std::int64_t>();
    }
  }

 private:
  struct Seen {
    DType dtype = DType::Bytes;
    Shape shape;               // -1 where elements differ; for images, height, width, channels
    bool image = true;         // every value so far an encoded PNG or JPEG (bytes scalars only)
    std::string image_format;  // png, jpeg, or "" once both were seen
    std::int64_t largest = -1; // class labels
  };

  static std::string shard_prefix(const Params& p) {
    const std::string& name = p.get_string("name");
    const bool snake_case = !name.empty() && name[0] >= 'a' && name[0] <= 'z' &&
                            std::all_of(name.begin(), name.end(), [](char c) { return (c >= 'a' && c <= 'z') || scan::digit(c) || c == '_'; });
    if (!snake_case)
      throw ParamError("name '" + name + "' is not a TFDS dataset name: lower case letters, digits and _, starting with a letter");
    if (!scan::version(p.get_string("version")))
      throw ParamError("version '" + p.get_string("version") + "' is not MAJOR.MINOR.PATCH (as 1.0.0)");
    if (!scan::name(p.get_string("split"), "-"))
      throw ParamError("split '" + p.get_string("split") + "' is not a split name (letters, digits, _ and -)");
    if (p.get_string("data_dir").empty()) throw ParamError("data_dir must not be empty");
    return (fs::path(p.get_string("data_dir")) / name / p.get_string("version") / (name + "-" + p.get_string("split"))).string();
  }

  void observe(const Sample& in) {
    for (const auto& field : in.fields()) {
      const Tensor& t = field.tensor;
      auto [it, first] = seen_.try_emplace(field.name);
      Seen& seen = it->second;
      if (first) order_.push_back(field.name);
      bytes_ += t.dtype() == DType::Bytes ? t.nbytes() : static_cast<std::uint64_t>(t.num_elements()) * dtype_size(t.dtype());
      Shape shape = t.shape();
      if (t.dtype() == DType::Bytes && t.rank() == 0) {
        const auto header = seen.image ? image_header(t.string_at(0)) : std::nullopt;
        seen.image = seen.image && header.has_value();
        if (header) {
          shape = {header->height, header->width, header->channels};
          if (first) seen.image_format = header->format;
          else if (seen.image_format != header->format) seen.image_format.clear();
        }
      }
      if (first) {
        seen.dtype = t.dtype();
        seen.shape = shape;
      } else {
        if (t.dtype() != seen.dtype)
          throw DataError("field '" + field.name + "' is " + dtype_name(t.dtype()) + " here and was " + dtype_name(seen.dtype) +
                          " before: a TFDS feature has one dtype");
        if (shape.size() != seen.shape.size())
          throw DataError("field '" + field.name + "' has rank " + std::to_string(shape.size()) + " here and " + std::to_string(seen.shape.size()) +
                          " before: a TFDS feature has one rank");
        for (std::size_t d = 0; d < shape.size(); ++d)
          if (seen.shape[d] != shape[d]) seen.shape[d] = -1;
      }
      if (class_labels_.count(field.name)) {
        if (t.dtype() == DType::Bytes || t.dtype() == DType::F32 || t.dtype() == DType::F64 || t.dtype() == DType::F16 || t.dtype() == DType::BF16)
          throw DataError("field '" + field.name + "' is listed in class_labels but holds " + dtype_name(t.dtype()) + ", not integers");
        for (std::int64_t i = 0; i < t.num_elements(); ++i) {
          std::int64_t v = 0;
          switch (t.dtype()) {
            case DType::U8: v = t.data<std::uint8_t>()[i]; break;
            case DType::I16: v = t.data<std::int16_t>()[i]; break;
            case DType::I32: v = t.data<std::int32_t>()[i]; break;
            default: v = t.data<std::int64_t>()[i];
          }
          if (v < 0) throw DataError("field '" + field.name + "' holds class " + std::to_string(v) + "; ClassLabel classes count from 0");
          seen.largest = std::max(seen.largest, v);
        }
      }
    }
  }

  std::vector<TfdsFeature> described_features() const {
    for (const auto& [label, classes] : class_labels_)
      if (!seen_.count(label)) throw DataError("class_labels names field '" + label + "', which no element had");
    for (const auto& key : {supervised_keys_ ? supervised_keys_->first : "", supervised_keys_ ? supervised_keys_->second : ""})
      if (!key.empty() && !seen_.count(key)) throw DataError("supervised_keys names field '" + key + "', which no element had");
    std::vector<TfdsFeature> out;
    for (const auto& name : order_) {
      const Seen& seen = seen_.at(name);
      TfdsFeature f;
      f.name = name;
      f.dtype = seen.dtype;
      f.shape = seen.shape;
      if (class_labels_.count(name)) {
        f.kind = TfdsFeature::Kind::ClassLabel;
        f.num_classes = std::max(seen.largest + 1, class_labels_.at(name));
        if (class_labels_.at(name) && seen.largest >= class_labels_.at(name))
          throw DataError("field '" + name + "' holds class " + std::to_string(seen.largest) + ", past the " + std::to_string(class_labels_.at(name)) +
                          " classes class_labels gives it");
        f.sequence = seen.shape.size() == 1;  // a Sequence of ClassLabel
        if (seen.shape.size() > 1)
          throw DataError("field '" + name + "' is listed in class_labels but has shape " + shape_string(seen.shape) +
                          "; a ClassLabel is one number per element, or a list of them");
      } else if (seen.dtype == DType::Bytes && seen.shape.size() == 3 && seen.image) {
        f.kind = TfdsFeature::Kind::Image;
        f.encoding_format = seen.image_format;
      } else if (seen.dtype == DType::Bytes && seen.shape.empty()) {
        f.kind = TfdsFeature::Kind::Text;
      } else {
        f.kind = TfdsFeature::Kind::Tensor;
        if (std::count(f.shape.begin(), f.shape.end(), -1) > 1)
          throw DataError("field '" + name + "' varies in more than one dimension (" + shape_string(f.shape) +
                          "); TFDS stores such tensors ragged, which tfds_writer does not write: pad it to one shape first");
      }
      out.push_back(std::move(f));
    }
    if (out.empty()) throw DataError("no element reached tfds_writer: a TFDS split needs at least one example");
    return out;
  }

  static std::string existing(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static void publish(const std::string& path, const std::string& text) {
    AtomicOutputFile file(path);
    file.write(text);
    file.commit();
  }

  std::string dir_, name_, version_, split_, description_;
  std::map<std::string, std::int64_t> class_labels_;  // field -> classes given (0: count them)
  std::optional<std::pair<std::string, std::string>> supervised_keys_;
  std::map<std::string, Seen> seen_;
  std::vector<std::string> order_;  // fields in the order first seen
  std::uint64_t bytes_ = 0;
};

}  // namespace

// A numeric value parsed as int64 or float32 (the Example's lists), in the feature's dtype and
// shape: the open dimension is what the value count leaves.
Tensor tfds_feature_tensor(const Tensor& parsed, const TfdsFeature& f) {
  if (f.dtype == DType::Bytes) return parsed;
  Shape shape = f.shape;
  std::int64_t known = 1;
  int open = -1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] < 0) open = i;
    else known *= shape[i];
  }
  const std::int64_t n = parsed.num_elements();
  if (open >= 0) {
    if (known == 0 ? n != 0 : n % known != 0)
      throw DataError("feature '" + f.name + "' has " + std::to_string(n) + " values, not a whole number of items of " + std::to_string(known) +
                      " (features.json's shape " + shape_string(f.shape) + ")");
    shape[open] = known == 0 ? 0 : n / known;
  }
  if (parsed.dtype() == f.dtype) return Tensor::view(f.dtype, shape, parsed.buffer(), parsed.byte_offset());
  Tensor out = Tensor::empty(f.dtype, shape);
  auto convert = [&](auto* to) {
    using To = std::remove_pointer_t<decltype(to)>;
    if (parsed.dtype() == DType::I64) {
      const auto* from = parsed.data<std::int64_t>();
      for (std::int64_t i = 0; i < n; ++i) to[i] = static_cast<To>(from[i]);
    } else {
      const auto* from = parsed.data<float>();
      for (std::int64_t i = 0; i < n; ++i) to[i] = static_cast<To>(from[i]);
    }
  };
  switch (f.dtype) {
    case DType::U8: convert(out.data<std::uint8_t>()); break;
    case DType::I16: convert(out.data<std::int16_t>()); break;
    case DType::I32: convert(out.data<std::int32_t>()); break;
    case DType::I64: convert(out.data<std::int64_t>()); break;
    case DType::F32: convert(out.data<float>()); break;
    case DType::F64: convert(out.data<double>()); break;
    default: throw DataError("feature '" + f.name + "': Sluice cannot hand out " + dtype_name(f.dtype) + " from a tf.train.Example");
  }
  return out;
}


void register_tfds(Registrar& registrar) {
  registrar.add<TfdsSource>();
  registrar.add<TfdsReader>();
  registrar.add<TfdsWriter>();
}

}  // namespace sluice::io
