// Random access to TFRecord files through their index files: a global shuffle of every record of
// every file (a computed permutation, IndexShuffle), sharded by position in that order, read with
// positioned reads; and tfrecord_index, which writes the index files (`sluice index`).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <deque>
#include <filesystem>
#include <thread>
#include <mutex>
#include <functional>
#include <condition_variable>
#include <map>
#include <optional>
#include <utility>

#include "crc32c.hpp"
#include "array_record.hpp"
#include "index_shuffle.hpp"
#include "random_reads.hpp"
#include "io_plugin.hpp"
#include "byte_source.hpp"
#include "tfds_info.hpp"
#include "tfrecord_index.hpp"
#include "webdataset_format.hpp"

namespace sluice::io {
namespace {

IndexFormat index_format_of(const Params& p, const std::string& param) {
  return p.get_string(param) == "dali" ? IndexFormat::Dali : IndexFormat::Sluice;
}

// Whether an index is there: a local file, or an object (listed: an http(s) server has no
// listing, so there the index is tried and taken as missing when it cannot be read).
bool index_exists(const std::string& index_path, Storage* storage) {
  if (!is_remote_uri(index_path)) return ::access(index_path.c_str(), F_OK) == 0;
  if (!storage) throw DataError("cannot look for the index " + index_path + ": remote URIs are read through a Sluice engine");
  if (index_path.rfind("http", 0) == 0) {
    try {
      storage->open(index_path)->object();
      return true;
    } catch (const DataError&) {
      return false;
    }
  }
  for (const auto& object : storage->list(index_path))
    if (object.uri == index_path) return true;
  return false;
}

// A file's index: read when there and fresh; built and written when missing (and `build` holds),
// or when `rebuild` holds. A stale or damaged index is refused unless rebuilt. A remote file's
// `object` (its size and ETag) is what the index is checked against; its index is read, built and
// written through `storage`.
struct IndexOutcome {
  TfrecordIndex index;
  std::string path;
  std::string state;  // "up to date", "built", "rebuilt"
};
// Whether a file is a WebDataset shard (its samples indexed) rather than TFRecord (its records).
bool is_webdataset_file(const std::string& file, const std::string& format) {
  if (format != "auto") return format == "webdataset";
  return file.size() > 4 && file.compare(file.size() - 4, 4, ".tar") == 0;
}
// Whether a file is ArrayRecord (its own footer indexes it): NAME.array_record, or a tfds shard
// NAME.array_record-00000-of-00001.
bool is_array_record_file(const std::string& file, const std::string& format) {
  if (format != "auto") return format == "array_record";
  const std::string name = file.substr(file.find_last_of('/') + 1);
  const std::size_t at = name.rfind(".array_record");
  return at != std::string::npos && (at + 13 == name.size() || name.compare(at + 13, 1, "-") == 0);
}
// An ArrayRecord file's records as an index gives them: each record's offset is its chunk's first
// byte (many records share one); the records' extents are its chunks', in `layout`.
TfrecordIndex array_record_index(const ArrayRecordLayout& layout) {
  TfrecordIndex index;
  index.file_size = layout.footer_offset;
  index.offsets.reserve(static_cast<std::size_t>(layout.records));
  for (const ArrayRecordChunk& chunk : layout.chunks) index.offsets.insert(index.offsets.end(), static_cast<std::size_t>(chunk.records), chunk.offset);
  return index;
}

IndexOutcome index_of(const std::string& file, const StoredObject* object, Storage* storage, const std::string& index_dir, bool build, bool rebuild,
                      IndexFormat format, bool webdataset = false) {
  IndexOutcome out;
  out.path = index_path_for(file, index_dir);
  const bool existed = index_exists(out.path, storage);
  if (existed && !rebuild) {
    out.index = read_tfrecord_index(out.path, file, object ? object_version(*object) : local_file_version(file), storage, !webdataset);
    out.state = "up to date";
    return out;
  }
  if (!build && !existed)
    throw DataError("no index for " + file + " (looked for " + out.path + "): build it with `sluice index " + file + "`" +
                    (index_dir.empty() ? "" : " --index-dir " + index_dir) + ", or set build_index: true");
  out.index = webdataset ? build_webdataset_index(file, storage, object) : build_tfrecord_index(file, storage, object);
  try {
    write_tfrecord_index(out.index, out.path, format, storage);
  } catch (const Error& e) {
    throw DataError(std::string(e.what()) + " (the index of " + file + "; give index_dir a " +
                    (is_remote_uri(file) ? "local folder" : "folder you can write") + ")");
  }
  out.state = existed ? "rebuilt" : "built";
  return out;
}

// An object's size and ETag: as listed, else (a URI named without wildcards) as opening it says.
StoredObject object_as_it_is(const MatchedFile& file, Storage* storage) {
  if (!file.object->etag.empty() || file.object->size > 0) return *file.object;
  if (!storage) throw DataError("cannot read " + file.path + ": remote URIs are read through a Sluice engine");
  return storage->open(file.path)->object();
}

// Writes (or checks) the index of the file a field names: one element per file, with what was done.
class TfrecordIndexOp final : public Map {
 public:
  static OperatorInfo describe() {
    return {"tfrecord_index",
            OperatorKind::Map,
            "Writes the index file of the TFRecord file a field names (offset of every record), unless a fresh one is there: "
            "what random_access reads; adds 'records', 'index_file' and 'state'",
            {ParamSpec::make("field", ParamType::String, "field holding the file's path").def("path"),
             ParamSpec::make("index_dir", ParamType::Path, "folder of the index files; empty: FILE.idx beside each file").def(""),
             ParamSpec::make("format", ParamType::Choice, "sluice (with the file's size and time) or dali (tfrecord2idx's text)")
                 .def("sluice")
                 .one_of({"sluice", "dali"}),
             ParamSpec::make("rebuild", ParamType::Bool, "write every index again, stale or not").def("false")},
            {.stateless = true},
            {}};
  }
  explicit TfrecordIndexOp(const Params& p)
      : field_(p.get_string("field")), index_dir_(p.get_string("index_dir")), format_(index_format_of(p, "format")), rebuild_(p.get_bool("rebuild")) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    const std::string file(in.at(field_).string_at(0));
    Storage* storage = ctx.stage ? ctx.stage->storage : nullptr;
    std::optional<StoredObject> object;
    if (is_remote_uri(file)) object = object_as_it_is(MatchedFile{file, StoredObject{file, 0, ""}}, storage);
    IndexOutcome done = index_of(file, object ? &*object : nullptr, storage, index_dir_, true, rebuild_, format_, is_webdataset_file(file, "auto"));
    in.set("records", Tensor::scalar<std::int64_t>(static_cast<std::int64_t>(done.index.records())));
    in.set("index_file", Tensor::from_string(done.path));
    in.set("state", Tensor::from_string(done.state));
    return in;
  }

 private:
  std::string field_, index_dir_;
  IndexFormat format_;
  bool rebuild_;
};

class RandomAccess final : public Source,
                           public ResumesOnOtherWorkers,
                           public ReadsRecordsAgain,
                           public KnowsItsRecords,
                           public StartsAnywhere,
                           public ReadsByPosition {
 public:
  static OperatorInfo describe() {
    return {"random_access",
            OperatorKind::Source,
            "Every record of the TFRecord files the patterns name, through their index files (of ArrayRecord files, through their "
            "own footers), in a different permutation of all records each epoch (a global shuffle) or in file order; 'record', "
            "'path', 'index', 'offset' as tfrecord_reader (array_record_reader) gives them; sharded by position, so every worker "
            "gets an equal share",
            {ParamSpec::make("patterns", ParamType::PathList, "files, as list_files takes them (globs, {a,b} and {000..009}); or tfds").def(""),
             ParamSpec::make("gzip", ParamType::Choice,
                             "a gzip-compressed TFRecord file: refuse it (its records cannot be read at random), or decompress it once "
                             "into index_dir and read the copy (made again when the file changes)")
                 .def("refuse")
                 .one_of({"refuse", "decompress"}),
             ParamSpec::make("format", ParamType::Choice,
                             "tfrecord (records: 'record', 'path', 'index', 'offset'), webdataset (plain tar shards: a sample per key, "
                             "fields as webdataset_reader gives them), array_record (records, each reading its whole chunk: write "
                             "group_size:1 for random access), or auto: webdataset for .tar files, array_record for .array_record files")
                 .def("auto")
                 .one_of({"auto", "tfrecord", "webdataset", "array_record"}),
             ParamSpec::make("tfds", ParamType::String,
                             "instead of patterns: a prepared tensorflow_datasets dataset, as tfds.load names it (mnist, mnist:3.0.1, "
                             "NAME/CONFIG); its examples come out as the fields its features.json describes")
                 .def(""),
             ParamSpec::make("split", ParamType::String, "with tfds: TFDS's split expression (train, test[:1000], train[25%:75%], train+test)")
                 .def("train"),
             ParamSpec::make("data_dir", ParamType::Path, "with tfds: the folder of the datasets; empty: $TFDS_DATA_DIR, else ~/tensorflow_datasets")
                 .def(""),
             ParamSpec::make("shuffle", ParamType::Bool, "a permutation of all records each epoch; false: file order").def("true"),
             ParamSpec::make("seed", ParamType::Int, "shuffle seed; -1 uses the pipeline's seed").def("-1").range(-1, std::nullopt),
             ParamSpec::make("reshuffle_each_iteration", ParamType::Bool, "another permutation each epoch").def("true"),
             ParamSpec::make("index_dir", ParamType::Path, "folder of the index files; empty: FILE.idx beside each file").def(""),
             ParamSpec::make("build_index", ParamType::Bool, "build missing index files (a stale one is refused)").def("true"),
             ParamSpec::make("index_format", ParamType::Choice, "the form of the index files it builds").def("sluice").one_of({"sluice", "dali"}),
             ParamSpec::make("verify_crc", ParamType::Bool, "check the masked CRC-32C of every length and record (of ArrayRecord files: every chunk's hash)").def("true"),
             ParamSpec::make("num_parallel_reads", ParamType::Int,
                             "positioned reads in flight at once (threads), the records still handed on in order; -1: 1 for local "
                             "files, 16 when objects in remote storage are read; more for network file systems and cold disks")
                 .def("-1")
                 .range(-1, 64),
             ParamSpec::make("num_shards", ParamType::Int, "number of shards; -1: the number of workers of the job")
                 .def("-1")
                 .range(-1, std::nullopt)
                 .takes_hint("num_workers"),
             ParamSpec::make("equal_steps", ParamType::Choice,
                             "every shard the same number of records: drop (the fewest: the last partial round is not read) or pad "
                             "(the most: a shard short of one reads its first record again); empty: shares differ by one at most "
                             "(a job's equal_steps option sets it)")
                 .def("")
                 .one_of({"", "drop", "pad"}),
             ParamSpec::make("index", ParamType::Int, "this worker's shard, 0 <= index < num_shards; -1: this worker's index")
                 .def("-1")
                 .range(-1, std::nullopt)
                 .takes_hint("worker_index")},
            {.stateless = false, .random = true, .saves_state = true},
            {}};
  }
  explicit RandomAccess(const Params& p)
      : patterns_(p.get_string_list("patterns")),
        tfds_(p.get_string("tfds")),
        split_(p.get_string("split")),
        data_dir_(p.get_string("data_dir")),
        file_format_(p.get_string("format")),
        decompress_gzip_(p.get_string("gzip") == "decompress"),
        shuffle_(p.get_bool("shuffle")),
        seed_(p.get_int("seed")),
        reshuffle_(p.get_bool("reshuffle_each_iteration")),
        index_dir_(p.get_string("index_dir")),
        build_(p.get_bool("build_index")),
        format_(index_format_of(p, "index_format")),
        verify_crc_(p.get_bool("verify_crc")),
        equal_steps_(p.get_string("equal_steps") == "drop"  ? EqualSteps::Drop
                     : p.get_string("equal_steps") == "pad" ? EqualSteps::Pad
                                                            : EqualSteps::Unset),
        parallel_reads_(static_cast<int>(p.get_int("num_parallel_reads"))) {
    if (parallel_reads_ == 0) throw ParamError("num_parallel_reads is 0; use 1 or more, or -1 for the default");
    // (Neither is refused at start(): the host builds one with the defaults to check the plugin.)
    if (!patterns_.empty() && !tfds_.empty()) throw ParamError("give patterns or tfds, not both");
    shards_ = p.get_int("num_shards");
    if (shards_ == 0) throw ParamError("num_shards is 0; use 1 or more, or -1 for the number of workers");
    if (shards_ < 0) shards_ = 1;
    shard_ = std::max<std::int64_t>(0, p.get_int("index"));
    if (shard_ >= shards_) throw ParamError("index " + std::to_string(shard_) + " must be less than num_shards " + std::to_string(shards_));
  }

  void start(const StageInfo& info) override {
    info_ = info;
    if (patterns_.empty() && tfds_.empty())
      throw ParamError("patterns is empty; give at least one file or glob pattern, or a tfds dataset");
    storage_ = info.storage;
    files_open_.close_all();  // (file numbers are this start's)
    files_.clear();
    objects_.clear();
    first_record_.assign(1, 0);
    indexes_.clear();
    path_tensors_.clear();
    paths_.clear();
    skips_.clear();
    webdataset_.clear();
    layouts_.clear();
    read_paths_.clear();
    std::vector<std::pair<MatchedFile, ShardRead>> files;
    if (tfds_.empty()) {
      for (MatchedFile& file : match_files(patterns_, storage_)) files.push_back({std::move(file), ShardRead{}});
    } else {
      files = tfds_shards();
    }
    for (const auto& [file, read] : files) {
      files_.push_back(file.path);
      objects_.push_back(file.object ? std::optional<StoredObject>(object_as_it_is(file, storage_)) : std::nullopt);
      webdataset_.push_back(tfds_.empty() && is_webdataset_file(file.path, file_format_));
      read_paths_.push_back(file.path);
      if (tfds_.empty() ? is_array_record_file(file.path, file_format_) : tfds_dataset_->file_format == "array_record") {
        layouts_.push_back(std::make_shared<const ArrayRecordLayout>(read_array_record_layout(PositionedFile(file.path, storage_))));
        indexes_.push_back(array_record_index(*layouts_.back()));
        add_file(file, read);
        continue;
      }
      layouts_.push_back(nullptr);
      if (decompress_gzip_ && !webdataset_.back() && is_gzip(file.path, objects_.back() ? &*objects_.back() : nullptr)) {
        read_paths_.back() = decompressed_copy(file.path, objects_.back() ? &*objects_.back() : nullptr);
        objects_.back().reset();  // (read from the local copy)
      }
      const StoredObject* object = objects_.back() ? &*objects_.back() : nullptr;
      indexes_.push_back(index_of(read_paths_.back(), object, storage_, index_dir_, build_, false, format_, webdataset_.back()).index);
      add_file(file, read);
    }
    // Readers: as asked; by default one for local files (a page-cached pread takes microseconds)
    // and 16 when an object is read (a ranged request takes milliseconds).
    const bool any_remote = std::any_of(objects_.begin(), objects_.end(), [](const auto& o) { return o.has_value(); });
    const int readers = parallel_reads_ > 0 ? parallel_reads_ : any_remote ? 16 : 1;
    if (!crew_ || crew_->size() != readers) crew_ = std::make_unique<ReadCrew>(readers - 1);
  }
  // The records of the file just indexed that the source reads (a tfds split may read part of a
  // shard: records skip .. skip + take of it).
  void add_file(const MatchedFile& file, const ShardRead& read) {
    {
      const std::uint64_t records = indexes_.back().records(), take = tfds_.empty() ? records : read.take;
      if (read.skip + take > records)
        throw DataError(file.path + " holds " + std::to_string(records) + " records, where dataset_info.json says split '" + split_ + "' reads up to record " +
                        std::to_string(read.skip + take) + " (a shard cut short, or metadata of another preparation)");
      skips_.push_back(read.skip);
      first_record_.push_back(first_record_.back() + take);
      path_tensors_.push_back(Tensor::from_string(file.path));
      paths_.push_back(std::make_shared<const std::string>(file.path));
    }
  }
  // Every file's records an epoch gives (all shards' together: the job's ledgers add up).
  std::vector<FileRecords> records_per_file() const override {
    std::vector<FileRecords> out;
    for (std::size_t f = 0; f < paths_.size(); ++f)
      out.push_back({*paths_[f], static_cast<std::int64_t>(skips_[f]), static_cast<std::int64_t>(skips_[f] + first_record_[f + 1] - first_record_[f])});
    return out;
  }
  void begin_pass(std::uint64_t pass) override {
    pass_ = pass;
    next_ = planned_ = first_of_pass_ = 0;
    group_.clear();
    order_.emplace(first_record_.back(), key_of(pass));
    reshardings_.clear();  // a resumed pass's split ends with it: later passes are plain
  }
  // A plain pass's positions are arithmetic: its index-th element is at shard + index * shards.
  void begin_pass_at(std::uint64_t pass, std::uint64_t index) override {
    begin_pass(pass);
    std::uint64_t position = 0;
    if (index == 0 || !next_position(position)) return;  // (sets the pass's first place, for equal_steps: pad)
    planned_ = next_ = std::min<std::uint64_t>(index, static_cast<std::uint64_t>(std::max<std::int64_t>(expected_elements(), 0)));
  }
  // This shard's count: positions shard, shard + shards, ... below the records' total (of what
  // was left to the job's workers, in a pass resumed on another number of them).
  std::int64_t expected_elements() const override {
    return static_cast<std::int64_t>(share_of(reshardings_.empty() ? first_record_.back() : left_in_pass_, static_cast<std::uint64_t>(shards_),
                                              static_cast<std::uint64_t>(shard_)));
  }
  bool next(Sample& out, const ElementContext&) override {
    if (group_.taken == group_.records.size() && !read_group()) return false;
    const GroupRecord& r = group_.records[group_.taken++];
    ++next_;
    if (!r.error.empty()) throw DataError(r.error);
    element_of(group_, r, out);
    return true;
  }
  // Places in file order (a caller's choice: the Python module's data sources), read in groups as
  // a pass reads them, each group's records by the readers together.
  std::uint64_t records() const override { return first_record_.back(); }
  std::vector<Sample> read_positions(const std::vector<std::uint64_t>& positions) override {
    std::vector<Sample> out(positions.size());
    for (std::size_t begin = 0; begin < positions.size();) {
      Group group;
      std::uint64_t bytes = 0;
      for (; begin < positions.size() && group.records.size() < kGroupRecords && bytes < kGroupBytes; ++begin) {
        if (positions[begin] >= records())
          throw DataError("record " + std::to_string(positions[begin]) + " is past the " + std::to_string(records()) + " records of " + describe_files());
        group.records.push_back(record_at(positions[begin], bytes));
        bytes += group.records.back().framed;
      }
      read_records(group, bytes);
      const std::size_t first = begin - group.records.size();
      for (std::size_t k = 0; k < group.records.size(); ++k) {
        if (!group.records[k].error.empty()) throw DataError(group.records[k].error);
        element_of(group, group.records[k], out[first + k]);
      }
    }
    return out;
  }
  std::vector<StoredField> stored_fields() const override {
    if (tfds_dataset_ || std::find(webdataset_.begin(), webdataset_.end(), true) != webdataset_.end()) return {};
    return {{"record", "bytes"}};
  }
  std::string describe_files() const {
    return files_.size() == 1 ? files_[0] : std::to_string(files_.size()) + " files" + (files_.empty() ? "" : " (" + files_.front() + " ...)");
  }
  // A checkpoint's reference to an element it gave: read alone, into a group of its own.
  Sample read_again(const std::string& where, std::int64_t record, std::int64_t byte_offset) override {
    const auto f = static_cast<std::size_t>(std::find_if(paths_.begin(), paths_.end(), [&](const auto& p) { return *p == where; }) - paths_.begin());
    if (f == paths_.size()) throw DataError(where + " is not one of the files random_access reads now: its patterns (or the files) changed since the checkpoint");
    const auto number = static_cast<std::uint64_t>(record);
    if (record < 0 || number >= indexes_[f].offsets.size() || indexes_[f].offsets[number] != static_cast<std::uint64_t>(byte_offset))
      throw DataError(files_[f] + " has no record " + std::to_string(record) + " at byte " + std::to_string(byte_offset) + " any more: it changed since the checkpoint");
    Group again;
    again.records.push_back({.file = f, .record = number, .offset = indexes_[f].offsets[number], .framed = extent_of(f, number)});
    read_records(again, again.records.back().framed);  // (no read is in flight: a resume reads these before the source runs)
    const GroupRecord& r = again.records.back();
    if (!r.error.empty()) throw DataError(r.error);
    Sample out;
    element_of(again, r, out);
    return out;
  }
  // The files and their record counts (a resume over other files is refused), then the pass's
  // place: one number, whatever the dataset's size (and, in a pass resumed on another number of
  // workers, how the workers before had split it).
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(files_.size());
    for (std::size_t i = 0; i < files_.size(); ++i) {
      w.put_string(files_[i]);
      w.put<std::uint64_t>(indexes_[i].records());
    }
    w.put<std::int64_t>(shards_);
    w.put<std::int64_t>(shard_);
    w.put<std::uint64_t>(pass_);
    w.put<std::uint64_t>(next_);
    save_reshardings(w, reshardings_);
    w.describe("epoch " + std::to_string(pass_) + ": " + std::to_string(next_) + " of " + std::to_string(expected_elements()) + " records" +
               (reshardings_.empty() ? "" : " (of those left when " + std::to_string(reshardings_.back().workers) + " workers stopped)"));
  }
  void restore_state(StateReader& r) override {
    const Saved saved = read_saved(r);
    if (saved.shards != shards_ || saved.shard != shard_)
      throw Error("the checkpoint was taken as shard " + std::to_string(saved.shard) + " of " + std::to_string(saved.shards) + ", this run is shard " +
                  std::to_string(shard_) + " of " + std::to_string(shards_) + ": resume with the same workers");
    begin_resumed_pass(saved.pass, saved.reshardings);
    const std::uint64_t share = static_cast<std::uint64_t>(std::max<std::int64_t>(expected_elements(), 0));
    if (saved.next > share)
      throw DataError("the checkpoint's next record's place, " + std::to_string(saved.next) + ", is past this shard's " + std::to_string(share) + " records");
    for (std::uint64_t position = 0; planned_ < saved.next && next_position(position);) {
    }
    next_ = planned_;
  }
  // The checkpoint of N workers, resumed on this run's shards_: every position of the pass that no
  // worker had read, or had read without a sink taking it, split anew.
  void restore_on_other_workers(const std::vector<StateReader*>& states, const std::vector<Held>& held, const std::vector<Held>& taken,
                                std::int64_t, std::int64_t) override {
    const std::uint64_t workers = states.size();
    std::vector<std::optional<Saved>> saved(workers);
    const Saved* first = nullptr;
    for (std::uint64_t w = 0; w < workers; ++w) {
      if (!states[w]) continue;  // ended: its whole share delivered
      saved[w] = read_saved(*states[w]);
      const Saved& s = *saved[w];
      if (s.shards != static_cast<std::int64_t>(workers) || s.shard != static_cast<std::int64_t>(w))
        throw Error("worker " + std::to_string(w) + " of the checkpoint read shard " + std::to_string(s.shard) + " of " + std::to_string(s.shards) +
                    ", not " + std::to_string(w) + " of " + std::to_string(workers) + ": its file is of another job");
      if (!first) first = &s;
      if (s.pass != first->pass)
        throw Error("the checkpoint's workers were in different epochs (" + std::to_string(first->pass) + " and " + std::to_string(s.pass) +
                    "): resume it on as many workers as took it, then change their number at an epoch's start");
      if (!same_reshardings(s.reshardings, first->reshardings))
        throw Error("the checkpoint's workers had split the epoch differently (their files are of different runs): resume each run's own checkpoint");
    }
    std::vector<Resharding> chain = first ? first->reshardings : std::vector<Resharding>{};
    begin_resumed_pass(first ? first->pass : 0, chain);
    const std::uint64_t left = reshardings_.empty() ? first_record_.back() : left_in_pass_;
    Resharding cut{workers, std::vector<std::uint64_t>(workers), {}};
    for (std::uint64_t w = 0; w < workers; ++w)
      cut.read[w] = saved[w] ? saved[w]->next : share_of(left, workers, w);
    auto positions_of = [&](const std::vector<Held>& records) {
      std::vector<std::uint64_t> out;
      for (const Held& h : records) out.push_back(position_of_held(h));
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return out;
    };
    cut.held = positions_of(held);
    cut.taken = positions_of(taken);
    chain.push_back(std::move(cut));
    begin_resumed_pass(pass_, chain);
  }

 private:
  static constexpr std::size_t kGroupRecords = 64;
  static constexpr std::uint64_t kGroupBytes = 4u << 20;
  struct GroupRecord {
    std::size_t file = 0;
    std::uint64_t record = 0, offset = 0, framed = 0;
    std::uint64_t at = 0;  // in the group's buffer
    int fd = -1;
    std::string error;
    std::shared_ptr<Buffer> value;  // an ArrayRecord's record, decoded out of its chunk (else null)
    std::size_t value_at = 0, value_size = 0;
  };
  struct Group {
    std::vector<GroupRecord> records;
    std::size_t taken = 0;
    std::shared_ptr<Buffer> bytes, numbers;
    void clear() {
      records.clear();
      taken = 0;
      bytes.reset();
      numbers.reset();
    }
  };
  // A pass resumed on another number of workers than read it: the workers before, how many of
  // their shares each had read, the positions they had read that no sink had taken (given back),
  // and those they read after their cut that a sink took all the same (a Python loop's, between
  // its state's cut and the state). The positions left are those of the pass every resharding
  // left, in order.
  struct Resharding {
    std::uint64_t workers = 1;
    std::vector<std::uint64_t> read;   // per worker
    std::vector<std::uint64_t> held;   // sorted positions
    std::vector<std::uint64_t> taken;  // sorted positions
    bool operator==(const Resharding&) const = default;
  };
  static bool same_reshardings(const std::vector<Resharding>& a, const std::vector<Resharding>& b) { return a == b; }
  static void save_reshardings(StateWriter& w, const std::vector<Resharding>& chain) {
    w.put<std::uint64_t>(chain.size());
    for (const auto& r : chain) {
      w.put<std::uint64_t>(r.workers);
      for (auto n : r.read) w.put<std::uint64_t>(n);
      w.put<std::uint64_t>(r.held.size());
      for (auto p : r.held) w.put<std::uint64_t>(p);
      w.put<std::uint64_t>(r.taken.size());
      for (auto p : r.taken) w.put<std::uint64_t>(p);
    }
  }
  struct Saved {
    std::int64_t shards = 1, shard = 0;
    std::uint64_t pass = 0, next = 0;
    std::vector<Resharding> reshardings;
  };
  // What save_state() wrote, checked against this run's files.
  Saved read_saved(StateReader& r) const {
    const auto count = r.get<std::uint64_t>();
    if (count != files_.size())
      throw Error("the checkpoint's run read " + std::to_string(count) + " files, the patterns now match " + std::to_string(files_.size()) +
                  ": resume over the same files");
    for (std::size_t i = 0; i < files_.size(); ++i) {
      const std::string path = r.get_string();
      const auto records = r.get<std::uint64_t>();
      if (path != files_[i] || records != indexes_[i].records())
        throw Error("file " + std::to_string(i + 1) + " was " + path + " with " + std::to_string(records) + " records in the checkpoint's run and is " +
                    files_[i] + " with " + std::to_string(indexes_[i].records()) + " now: resume over the same files");
    }
    Saved s;
    s.shards = r.get_within<std::int64_t>(1, std::numeric_limits<std::int64_t>::max(), "the number of shards");
    s.shard = r.get_within<std::int64_t>(0, s.shards - 1, "the shard");
    s.pass = r.get<std::uint64_t>();
    s.next = r.get_within<std::uint64_t>(0, first_record_.back(), "the next record's place");
    const auto chain = r.get_within<std::uint64_t>(0, 1024, "the number of reshardings");
    for (std::uint64_t i = 0; i < chain; ++i) {
      Resharding step;
      step.workers = r.get_within<std::uint64_t>(1, 1u << 20, "a resharding's workers");
      for (std::uint64_t w = 0; w < step.workers; ++w) step.read.push_back(r.get_within<std::uint64_t>(0, first_record_.back(), "a worker's place"));
      const auto held = r.get_within<std::uint64_t>(0, first_record_.back(), "the records held");
      for (std::uint64_t h = 0; h < held; ++h) step.held.push_back(r.get_within<std::uint64_t>(0, first_record_.back(), "a held record's place"));
      const auto taken = r.get_within<std::uint64_t>(0, first_record_.back(), "the records taken after the cut");
      for (std::uint64_t t = 0; t < taken; ++t) step.taken.push_back(r.get_within<std::uint64_t>(0, first_record_.back(), "a taken record's place"));
      s.reshardings.push_back(std::move(step));
    }
    return s;
  }
  // Starts `pass` as a resumed one (the host goes on with next(), without begin_pass()): its
  // permutation, and with reshardings, how many positions they left.
  void begin_resumed_pass(std::uint64_t pass, std::vector<Resharding> chain) {
    pass_ = pass;
    order_.emplace(first_record_.back(), key_of(pass_));
    reshardings_ = std::move(chain);
    next_ = planned_ = first_of_pass_ = 0;
    group_.clear();
    scan_ = {};
    left_in_pass_ = 0;
    if (reshardings_.empty()) return;
    std::uint64_t position = 0, rank = 0;
    while (next_left(position, rank))
      if (left_in_pass_++ == 0) first_of_pass_ = position;  // (what a shard short of one pads with, before its own)
    scan_ = {};
  }
  // The next position left by every resharding, and its rank among them (walking the pass).
  bool next_left(std::uint64_t& position, std::uint64_t& rank) {
    const std::uint64_t total = first_record_.back();
    scan_.counts.resize(reshardings_.size());
    for (; scan_.position < total; ++scan_.position) {
      const std::uint64_t p = scan_.position;
      std::uint64_t r = p;  // its rank among the positions left before this resharding
      bool left = true;
      for (std::size_t l = 0; l < reshardings_.size() && left; ++l) {
        const Resharding& step = reshardings_[l];
        left = (r / step.workers >= step.read[r % step.workers] && !std::binary_search(step.taken.begin(), step.taken.end(), p)) ||
               std::binary_search(step.held.begin(), step.held.end(), p);
        if (left) r = scan_.counts[l]++;
      }
      if (!left) continue;
      position = p;
      rank = r;
      ++scan_.position;
      return true;
    }
    return false;
  }
  // The place in the pass of this shard's next record not yet read (its planned_-th).
  bool next_position(std::uint64_t& position) {
    const std::uint64_t shards = static_cast<std::uint64_t>(shards_), shard = static_cast<std::uint64_t>(shard_);
    if (planned_ >= static_cast<std::uint64_t>(expected_elements())) return false;  // (equal_steps: drop stops early)
    bool found = false;
    if (reshardings_.empty()) {
      position = shard + planned_ * shards;
      found = position < first_record_.back();
    } else {
      for (std::uint64_t rank = 0; !found && next_left(position, rank);) found = rank % shards == shard;
    }
    if (!found) position = first_of_pass_;  // equal_steps: pad, one short: this shard's first record again
    if (planned_++ == 0) first_of_pass_ = position;
    return true;
  }
  // How many records shard `shard` of `shards` reads of `left` (equal_steps decides the remainder).
  std::uint64_t share_of(std::uint64_t left, std::uint64_t shards, std::uint64_t shard) const {
    if (equal_steps_ == EqualSteps::Drop) return left / shards;
    if (equal_steps_ == EqualSteps::Pad) return (left + shards - 1) / shards;
    return left <= shard ? 0 : (left - shard + shards - 1) / shards;
  }
  // The place in the pass of a record a worker had read that no sink had taken.
  std::uint64_t position_of_held(const Held& held) const {
    const auto file = std::find(files_.begin(), files_.end(), held.where);
    if (file == files_.end()) throw Error("the checkpoint's stages held a record of " + held.where + ", which this source does not read");
    const auto f = static_cast<std::size_t>(file - files_.begin());
    const std::uint64_t records = first_record_[f + 1] - first_record_[f];
    if (held.record < static_cast<std::int64_t>(skips_[f]) || static_cast<std::uint64_t>(held.record) - skips_[f] >= records)
      throw Error("the checkpoint's stages held record " + std::to_string(held.record) + " of " + held.where + ", of which this source reads " +
                  std::to_string(records) + " from record " + std::to_string(skips_[f]) + ": the file changed since");
    const std::uint64_t global = first_record_[f] + static_cast<std::uint64_t>(held.record) - skips_[f];
    return shuffle_ ? order_->position_of(global) : global;
  }

  // Whether a file (or object) begins as gzip does.
  bool is_gzip(const std::string& path, const StoredObject* object) const {
    unsigned char magic[2] = {};
    if (object) {
      if (object->size < 2) return false;
      storage_->read_range(*object, 0, 2, reinterpret_cast<std::byte*>(magic));
    } else {
      std::FILE* f = std::fopen(path.c_str(), "rb");
      if (!f) throw DataError("cannot read " + path + ": " + std::strerror(errno));
      const std::size_t got = std::fread(magic, 1, 2, f);
      std::fclose(f);
      if (got < 2) return false;
    }
    return magic[0] == 0x1f && magic[1] == 0x8b;
  }
  // A gzip file's records, decompressed once into index_dir: NAME-HASH.tfrecord, HASH of its path,
  // size and version, so that a changed file gets a new copy. Written whole or not at all.
  std::string decompressed_copy(const std::string& path, const StoredObject* object) const {
    if (index_dir_.empty() || is_remote_uri(index_dir_))
      throw DataError(path + " is gzip-compressed: gzip: decompress needs index_dir, a local folder for the decompressed copies");
    const FileVersion version = object ? object_version(*object) : local_file_version(path);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(stable_hash(path + "\n" + std::to_string(version.size) + "\n" + std::to_string(version.stamp))));
    const std::string name = path.substr(path.find_last_of('/') + 1);
    const std::string copy = index_dir_ + "/" + name + "-" + std::string(hash, 8) + ".tfrecord";
    if (::access(copy.c_str(), F_OK) == 0) return copy;
    std::error_code ec;
    std::filesystem::create_directories(index_dir_, ec);
    auto source = open_file(path, Compression::Gzip, storage_);
    AtomicOutputFile out(copy);
    std::vector<std::byte> buffer(1 << 20);
    for (std::size_t n; (n = source->read(buffer.data(), buffer.size())) > 0;) out.write(buffer.data(), n);
    out.commit();
    return copy;
  }

  // The shards a tfds split reads (with what to skip and take of each), as the tfds source finds them.
  std::vector<std::pair<MatchedFile, ShardRead>> tfds_shards() {
    tfds_dataset_ = std::make_shared<TfdsDataset>(read_tfds_dataset(find_tfds_dataset(tfds_data_dir(data_dir_), tfds_, storage_), storage_));
    tfds_parser_ = std::make_unique<ExampleParser>(tfds_example_spec(tfds_dataset_->features), std::vector<FeatureSpec>{});
    std::vector<std::pair<MatchedFile, ShardRead>> out;
    for (const SplitRange& range : resolve_split(split_, tfds_dataset_->split_shards()))
      for (const ShardRead& r : shard_reads(range, tfds_dataset_->split(range.split).shards)) {
        const std::string path = tfds_dataset_->shard_path(r.split, r.shard);
        MatchedFile file{path, std::nullopt};
        if (is_remote_uri(path)) file.object = StoredObject{path, 0, ""};
        out.push_back({std::move(file), r});
      }
    return out;
  }
  // The bytes a record's read takes: a TFRecord's framed record, or an ArrayRecord's whole chunk.
  std::uint64_t extent_of(std::size_t f, std::uint64_t record) const {
    if (const auto& layout = layouts_[f]) {
      const ArrayRecordChunk& chunk = layout->chunks[layout->chunk_of(record)];
      return chunk.end - chunk.offset;
    }
    return indexes_[f].framed_size(static_cast<std::size_t>(record));
  }
  // A record's own bytes once read: its framing left out, or decoded out of its chunk.
  struct RecordBytes {
    std::shared_ptr<Buffer> buffer;
    std::size_t at = 0, size = 0;
  };
  static RecordBytes record_bytes(const Group& g, const GroupRecord& r) {
    if (r.value) return {r.value, r.value_at, r.value_size};
    return {g.bytes, static_cast<std::size_t>(r.at + 12), static_cast<std::size_t>(r.framed - 16)};
  }
  // Record r of group g, read: as the format gives it.
  void element_of(const Group& g, const GroupRecord& r, Sample& out) const {
    if (tfds_dataset_) return decode_example(g, r, out);
    if (webdataset_[r.file]) return read_sample(g, r, out);
    out.reserve(4);
    const RecordBytes bytes = record_bytes(g, r);
    out.set("record", Tensor::bytes_view(bytes.buffer, bytes.at, bytes.size));
    out.set("path", path_tensors_[r.file]);
    const std::size_t k = static_cast<std::size_t>(&r - g.records.data());
    out.set("index", Tensor::view(DType::I64, {}, g.numbers, 16 * k));
    out.set("offset", Tensor::view(DType::I64, {}, g.numbers, 16 * k + 8));
    out.set_origin(paths_[r.file], static_cast<std::int64_t>(r.record), static_cast<std::int64_t>(r.offset));
  }
  // A tfds example: its features, as tfds_reader gives them.
  void decode_example(const Group& g, const GroupRecord& r, Sample& out) const {
    try {
      const RecordBytes bytes = record_bytes(g, r);
      tfds_parser_->parse(bytes.buffer, bytes.at, bytes.size, out);
      for (const TfdsFeature& f : tfds_dataset_->features) out.set(f.name, tfds_feature_tensor(out.at(f.name), f));
    } catch (const DataError& e) {
      throw DataError(files_[r.file] + ", record " + std::to_string(r.record) + " (byte " + std::to_string(r.offset) + "): " + e.what());
    }
    out.set_origin(paths_[r.file], static_cast<std::int64_t>(r.record), static_cast<std::int64_t>(r.offset));
  }

  // A WebDataset sample: its span of the tar (its members, from its first header to the next
  // sample's) read as a tar of its own, its fields as webdataset_reader gives them.
  void read_sample(const Group& g, const GroupRecord& r, Sample& out) const {
    const std::string where = files_[r.file] + ", sample " + std::to_string(r.record) + " (byte " + std::to_string(r.offset) + ")";
    struct Refuse final : DamageReport {
      bool skip_damaged(const std::string&) override { return false; }
    } refuse;
    WebDatasetSample sample;
    try {
      WebDatasetShard span(files_[r.file], g.bytes->data() + r.at, static_cast<std::size_t>(r.framed));
      if (!span.next(sample, refuse)) throw DataError("no sample starts there (the shard changed since it was indexed?)");
      out = webdataset_fields_.of(sample);
    } catch (const DataError& e) {
      throw DataError(where + ": " + e.what());
    }
    out.set("__url__", path_tensors_[r.file]);
    out.set_origin(paths_[r.file], static_cast<std::int64_t>(r.record), static_cast<std::int64_t>(r.offset));
  }

  // The permutation's key of a pass: from the seed and the epoch alone (the same on every worker).
  std::uint64_t key_of(std::uint64_t pass) const {
    return Rng(seed_ >= 0 ? static_cast<std::uint64_t>(seed_) : info_.seed, info_.stage_hash, reshuffle_ ? pass : 0, 0).next_u64();
  }
  // Reads the records of this shard's next places, up to kGroupRecords of them or kGroupBytes, into
  // one buffer (their index and offset scalars in another): two allocations for the group, not
  // several per record. Its readers share the records out; a record that cannot be read keeps its
  // error, thrown at its turn. False at the pass's end.
  bool read_group() {
    group_.clear();
    std::uint64_t bytes = 0, position = 0;
    while (group_.records.size() < kGroupRecords && bytes < kGroupBytes && next_position(position)) {
      group_.records.push_back(record_at(shuffle_ ? (*order_)(position) : position, bytes));
      bytes += group_.records.back().framed;
    }
    if (group_.records.empty()) return false;
    read_records(group_, bytes);
    return true;
  }
  // The record at a place in file order, to be read at byte `at` of its group's buffer.
  GroupRecord record_at(std::uint64_t global, std::uint64_t at) const {
    GroupRecord r;
    r.file = static_cast<std::size_t>(std::upper_bound(first_record_.begin(), first_record_.end(), global) - first_record_.begin() - 1);
    r.record = global - first_record_[r.file] + skips_[r.file];
    r.offset = indexes_[r.file].offsets[static_cast<std::size_t>(r.record)];
    r.framed = extent_of(r.file, r.record);
    r.at = at;
    return r;
  }
  // Reads a group's planned records (`bytes` in all) into one buffer, their index and offset
  // scalars into another.
  void read_records(Group& group, std::uint64_t bytes) {
    files_open_.make_room(group.records.size());
    group.bytes = pool_.allocate(static_cast<std::size_t>(bytes));
    group.numbers = pool_.allocate(16 * group.records.size());
    auto* numbers = reinterpret_cast<std::int64_t*>(group.numbers->data());
    for (std::size_t k = 0; k < group.records.size(); ++k) {
      numbers[2 * k] = static_cast<std::int64_t>(group.records[k].record);
      numbers[2 * k + 1] = static_cast<std::int64_t>(group.records[k].offset);
      if (objects_[group.records[k].file]) continue;  // read by ranged requests
      try {
        group.records[k].fd = files_open_.fd(group.records[k].file, read_paths_[group.records[k].file]);  // opened here, on one thread
      } catch (const std::exception& e) {
        group.records[k].error = e.what();
      }
    }
    const int readers = std::min<int>(crew_->size(), static_cast<int>(group.records.size()));
    crew_->run(readers, [&](int part) {
      for (std::size_t k = static_cast<std::size_t>(part); k < group.records.size(); k += static_cast<std::size_t>(readers)) read_into_group(group, group.records[k]);
    });
  }
  void read_into_group(const Group& g, GroupRecord& r) {
    const std::string& path = files_[r.file];
    std::byte* data = g.bytes->data() + r.at;
    if (!r.error.empty()) {  // (the file could not be opened)
      r.framed = 16;
      return;
    }
    try {
      if (const auto& object = objects_[r.file]) {
        for (std::uint64_t got = 0; got < r.framed;) {
          const std::size_t n = storage_->read_range(*object, r.offset + got, static_cast<std::size_t>(r.framed - got), data + got);
          if (n == 0) throw DataError("the object ends before it (replaced since it was indexed?)");
          got += n;
        }
      } else {
        for (std::uint64_t got = 0; got < r.framed;) {
          const ssize_t n = ::pread(r.fd, data + got, static_cast<std::size_t>(r.framed - got), static_cast<off_t>(r.offset + got));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0)
            throw DataError(n == 0 ? std::string("the file ends before it (changed since it was indexed?)") : std::strerror(errno));
          got += static_cast<std::uint64_t>(n);
        }
      }
      if (webdataset_[r.file]) return;  // (a tar's members are checked as the sample is read)
      if (const auto& layout = layouts_[r.file]) {  // its chunk, decoded (its hashes checked)
        const ArrayRecordChunk& chunk = layout->chunks[layout->chunk_of(r.record)];
        const DecodedChunk decoded = decode_array_record_chunk(g.bytes, static_cast<std::size_t>(r.at), static_cast<std::size_t>(r.framed), r.offset,
                                                               path, verify_crc_);
        if (decoded.records() != chunk.records) throw DataError("its chunk holds " + std::to_string(decoded.records()) + " records where the footer says " +
                                                                std::to_string(chunk.records) + " (damaged)");
        const auto k = static_cast<std::size_t>(r.record - chunk.first_record);
        r.value = decoded.values;
        r.value_at = decoded.begin_of(k);
        r.value_size = decoded.size_of(k);
        return;
      }
      std::uint64_t length = 0;
      std::memcpy(&length, data, 8);
      if (length + 16 != r.framed)
        throw DataError("holds " + std::to_string(length) + " bytes where its index says " + std::to_string(r.framed - 16) +
                        ": the file changed since it was indexed; build the index again");
      if (verify_crc_) {
        std::uint32_t length_crc = 0, data_crc = 0;
        std::memcpy(&length_crc, data + 8, 4);
        std::memcpy(&data_crc, data + 12 + length, 4);
        if (mask_crc(crc32c(data, 8)) != length_crc || mask_crc(crc32c(data + 12, static_cast<std::size_t>(length))) != data_crc)
          throw DataError("its CRC does not match (damaged)");
      }
    } catch (const std::exception& e) {
      r.error = path + ", record " + std::to_string(r.record) + " (byte " + std::to_string(r.offset) + "): " + e.what();
      r.framed = 16;  // (an empty view)
    }
  }

  std::vector<std::string> patterns_;
  std::string tfds_, split_, data_dir_;
  std::shared_ptr<const TfdsDataset> tfds_dataset_;  // with tfds: its metadata, and the parser of its examples
  std::unique_ptr<ExampleParser> tfds_parser_;
  std::vector<std::uint64_t> skips_;  // per file: the records before those it reads (a tfds split's part of a shard)
  std::string file_format_;
  bool decompress_gzip_;
  std::vector<std::string> read_paths_;  // per file: where its records are read (a gzip file's decompressed copy)
  std::vector<bool> webdataset_;  // per file: a WebDataset shard (its samples), else TFRecord
  std::vector<std::shared_ptr<const ArrayRecordLayout>> layouts_;  // per file: an ArrayRecord file's footer (else null)
  WebDatasetFields webdataset_fields_;
  bool shuffle_;
  std::int64_t seed_;
  bool reshuffle_;
  std::string index_dir_;
  bool build_;
  IndexFormat format_;
  bool verify_crc_;
  enum class EqualSteps { Unset, Drop, Pad } equal_steps_;  // (read per record: resolved once)
  std::int64_t shards_ = 1, shard_ = 0;
  StageInfo info_;
  std::vector<std::string> files_;
  std::vector<TfrecordIndex> indexes_;
  std::vector<std::uint64_t> first_record_;  // global number of each file's first record; back(): the total
  std::vector<Tensor> path_tensors_;
  std::vector<std::shared_ptr<const std::string>> paths_;
  PooledHostAllocator pool_;
  OpenFiles files_open_;
  int parallel_reads_;
  std::unique_ptr<ReadCrew> crew_;
  Storage* storage_ = nullptr;
  std::vector<std::optional<StoredObject>> objects_;  // per file: its object, when it is remote
  Group group_;
  std::uint64_t planned_ = 0;  // this shard's places read (or being read) ahead of next_
  std::uint64_t first_of_pass_ = 0;  // the place of this shard's first record in the pass (equal_steps: pad)
  std::uint64_t pass_ = 0;
  std::optional<IndexShuffle> order_;  // this pass's permutation of all records, made once per pass
  std::uint64_t next_ = 0;  // this shard's next place in the pass
  std::vector<Resharding> reshardings_;  // this pass's, when it was resumed on another number of workers
  std::uint64_t left_in_pass_ = 0;       // the positions they left
  struct Scan {
    std::uint64_t position = 0;
    std::vector<std::uint64_t> counts;  // per resharding: the positions it left, seen so far
  } scan_;
};

}  // namespace

void register_random_access(Registrar& registrar) {
  registrar.add<RandomAccess>();
  registrar.add<TfrecordIndexOp>();
}

}  // namespace sluice::io
