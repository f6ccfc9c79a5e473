// Files: list_files (glob with **), read_file, label_from_path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <atomic>
#include <mutex>
#include <thread>

#include "byte_source.hpp"
#include "text_scan.hpp"
#include "file_patterns.hpp"
#include "io_plugin.hpp"

namespace fs = std::filesystem;

namespace sluice::io {
namespace {

class ListFiles final : public Source {
 public:
  static OperatorInfo describe() {
    return {"list_files",
            OperatorKind::Source,
            "Emits the paths matching glob patterns ('*', '?', '[ab]', '**' for any depth, {000..099} and {a,b} braces) as 'path', shuffled (shuffle: false for sorted)",
            {ParamSpec::make("patterns", ParamType::PathList, "paths or glob patterns, comma-separated (relative to the pipeline file)"),
             ParamSpec::make("shuffle", ParamType::Bool, "shuffle the list, as tf.data's list_files does (the same order on every worker for a seed); false keeps it sorted").def("true"),
             ParamSpec::make("seed", ParamType::Int, "shuffle seed; -1 uses the pipeline's seed").def("-1").range(-1, std::nullopt),
             ParamSpec::make("reshuffle_each_iteration", ParamType::Bool, "a different order in each epoch").def("true")},
            {.stateless = false, .random = true, .saves_state = true},
            {}};
  }
  explicit ListFiles(const Params& p)
      : patterns_(p.get_string_list("patterns")),
        shuffle_(p.get_bool("shuffle")),
        seed_(p.get_int("seed")),
        reshuffle_(p.get_bool("reshuffle_each_iteration")) {
    if (patterns_.empty()) throw ParamError("patterns is empty; give at least one glob pattern");
  }
  void start(const StageInfo& info) override {
    info_ = info;
    for (const auto& written : patterns_) {
      std::vector<std::string> expanded;
      expand_braces(written, expanded);
      for (const auto& pattern : expanded) {
        if (is_remote_uri(pattern)) {
          add_remote(written, pattern, info.storage);
          continue;
        }
        auto matched = glob(pattern);
        if (matched.empty())
          throw DataError("pattern '" + pattern + "'" + (pattern == written ? "" : " (of '" + written + "')") + " matches no file: " +
                          why_nothing_matches(pattern));
        files_.insert(files_.end(), matched.begin(), matched.end());
      }
    }
  }
  void begin_pass(std::uint64_t pass) override {
    order_.resize(files_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    if (shuffle_) {
      // Fisher-Yates with the counter-based generator: the same seed, the same order everywhere.
      Rng rng(seed_ >= 0 ? static_cast<std::uint64_t>(seed_) : info_.seed, info_.stage_hash, reshuffle_ ? pass : 0, 0);
      for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    }
    next_ = 0;
  }
  std::int64_t expected_elements() const override { return static_cast<std::int64_t>(files_.size()); }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= order_.size()) return false;
    const std::string& path = files_[order_[next_++]];
    out.set("path", Tensor::from_string(path));
    out.set_origin(path);
    return true;
  }
  // The files matched and their sizes, so that a resumed run over other files is refused rather
  // than continued at a place that means something else; then the pass's order and place.
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(files_.size());
    for (const auto& path : files_) {
      w.put_string(path);
      w.put(file_size(path));
      if (is_remote_uri(path)) w.put_string(etag_of(path));  // a replaced object may keep its size
    }
    w.put<std::uint64_t>(order_.size());
    for (auto i : order_) w.put<std::uint64_t>(i);
    w.put<std::uint64_t>(next_);
    w.describe(std::to_string(next_) + " of " + std::to_string(files_.size()) + " files listed");
  }
  void restore_state(StateReader& r) override {
    const auto count = r.get<std::uint64_t>();
    std::vector<std::pair<std::string, std::int64_t>> saved;
    std::map<std::string, std::string> saved_etags;
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string path = r.get_string();
      saved.emplace_back(path, r.get<std::int64_t>());
      if (is_remote_uri(path)) saved_etags[path] = r.get_string();
    }
    for (std::size_t i = 0; i < std::max<std::size_t>(saved.size(), files_.size()); ++i) {
      if (i >= files_.size())
        throw Error("the checkpoint's run read " + std::to_string(saved.size()) + " files, the patterns now match " + std::to_string(files_.size()) +
                    " (" + saved[i].first + " is gone): resume over the same files");
      if (i >= saved.size())
        throw Error("the patterns now match " + std::to_string(files_.size()) + " files, the checkpoint's run read " + std::to_string(saved.size()) +
                    " (" + files_[i] + " is new): resume over the same files");
      if (saved[i].first != files_[i])
        throw Error("file " + std::to_string(i + 1) + " of the list was " + saved[i].first + " in the checkpoint's run and is " + files_[i] +
                    " now: resume over the same files");
      if (const std::int64_t size = file_size(files_[i]); size != saved[i].second)
        throw Error(files_[i] + " had " + std::to_string(saved[i].second) + " bytes in the checkpoint's run and has " + std::to_string(size) +
                    " now: resume over the same files");
      if (auto it = saved_etags.find(files_[i]); it != saved_etags.end() && !it->second.empty() && !etag_of(files_[i]).empty() &&
                                                 it->second != etag_of(files_[i]))
        throw Error(files_[i] + " was replaced since the checkpoint's run (its ETag was " + it->second + ", it is " + etag_of(files_[i]) +
                    "): resume over the same objects");
    }
    const auto ordered = r.get<std::uint64_t>();
    if (ordered > files_.size()) throw DataError("the saved order lists more files than there are");
    order_.assign(static_cast<std::size_t>(ordered), 0);
    for (auto& i : order_) {
      i = static_cast<std::size_t>(r.get<std::uint64_t>());
      if (i >= files_.size()) throw DataError("the saved order names a file past the list");
    }
    next_ = static_cast<std::size_t>(r.get_within<std::uint64_t>(0, order_.size(), "the next file's number"));
  }

 private:
  void add_remote(const std::string& written, const std::string& pattern, Storage* storage) {
    auto found = remote_glob(pattern, storage);
    if (found.objects.empty())
      throw DataError("pattern '" + pattern + "'" + (pattern == written ? "" : " (of '" + written + "')") + " matches no object: " +
                      (found.listed ? "the " + std::to_string(found.listed) + " objects under " + found.prefix + " do not match it"
                                    : "nothing is stored under " + found.prefix));
    for (auto& object : found.objects) {
      if (has_wildcard(pattern)) {
        remote_sizes_[object.uri] = static_cast<std::int64_t>(object.size);
        remote_etags_[object.uri] = object.etag;
      }
      files_.push_back(std::move(object.uri));
    }
  }
  // A local file's size now, a listed object's size when it was listed (-1: unknown), for the
  // checkpoint's check that a resumed run reads the same files.
  std::int64_t file_size(const std::string& path) const {
    if (is_remote_uri(path)) {
      auto it = remote_sizes_.find(path);
      return it == remote_sizes_.end() ? -1 : it->second;
    }
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1;
  }
  // A listed object's ETag when it was listed (empty: unknown, as for a URI named without wildcards).
  std::string etag_of(const std::string& uri) const {
    auto it = remote_etags_.find(uri);
    return it == remote_etags_.end() ? std::string() : it->second;
  }
  std::map<std::string, std::int64_t> remote_sizes_;
  std::map<std::string, std::string> remote_etags_;
  std::vector<std::string> patterns_, files_;
  bool shuffle_;
  std::int64_t seed_;
  bool reshuffle_;
  StageInfo info_;
  std::vector<std::size_t> order_;
  std::size_t next_ = 0;
};

// The whole file in one buffer: plain system calls (a stream would add its own buffer and copy).
std::pair<std::shared_ptr<Buffer>, std::size_t> read_whole_file(const std::string& path) {
  const int fd = open_regular_file(path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw DataError("cannot read " + path + ": " + std::strerror(errno));
  std::size_t capacity = st.st_size > 0 ? static_cast<std::size_t>(st.st_size) : 64 * 1024;  // pipes and /proc report 0
  auto buffer = HostAllocator::instance().allocate(capacity);
  std::size_t size = 0;
  for (;;) {
    if (size == capacity) {  // the file grew, or its size was unknown
      auto bigger = HostAllocator::instance().allocate(capacity * 2);
      std::memcpy(bigger->data(), buffer->data(), size);
      buffer = std::move(bigger);
      capacity *= 2;
    }
    const ssize_t got = ::read(fd, buffer->data() + size, capacity - size);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw DataError("reading " + path + " failed: " + std::strerror(errno));
    }
    if (got == 0) break;
    size += static_cast<std::size_t>(got);
    if (st.st_size > 0 && size == static_cast<std::size_t>(st.st_size)) break;  // skip the read that returns 0
  }
  return {std::move(buffer), size};
}

// A remote object in one buffer of its size (the store said it when the reader opened it).
std::pair<std::shared_ptr<Buffer>, std::size_t> read_whole_object(const std::string& uri, Storage* storage) {
  auto reader = open_remote(uri, storage);
  const auto size = static_cast<std::size_t>(reader->object().size);
  auto buffer = HostAllocator::instance().allocate(std::max<std::size_t>(size, 1));
  read_exactly(*reader, buffer->data(), size);
  return {std::move(buffer), size};
}

class ReadFile final : public Map {
 public:
  static OperatorInfo describe() {
    return {"read_file",
            OperatorKind::Map,
            "Reads the file named by a field into 'data' (bytes)",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("output", ParamType::String, "field to write the contents to").def("data")},
            {.stateless = true},
            {}};
  }
  explicit ReadFile(const Params& p) : field_(p.get_string("field")), output_(p.get_string("output")) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    std::string path(in.at(field_).string_at(0));
    auto [buffer, size] = is_remote_uri(path) ? read_whole_object(path, ctx.stage ? ctx.stage->storage : nullptr) : read_whole_file(path);
    in.set(output_, Tensor::bytes_view(std::move(buffer), 0, size));
    if (!in.has_origin()) in.set_origin(path);
    return in;
  }

 private:
  std::string field_, output_;
};

// The Places365 convention: a file's parent folder names its class.
class LabelFromPath final : public Map {
 public:
  static OperatorInfo describe() {
    return {"label_from_path",
            OperatorKind::Map,
            "Labels a file by its parent folder: 'class_name' (bytes) and 'label' (its index among the classes)",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("classes", ParamType::StringList, "class names in label order; empty: the sorted subfolders of root").def(""),
             ParamSpec::make("root", ParamType::Path, "folder whose subfolders are the classes (when classes is empty)").def("")},
            {.stateless = true},
            {}};
  }
  explicit LabelFromPath(const Params& p)
      : field_(p.get_string("field")), classes_(p.get_string_list("classes")), root_(p.get_string("root")) {}
  void start(const StageInfo&) override {
    if (classes_.empty()) {
      if (root_.empty()) throw ParamError("give classes or root (a folder whose subfolders are the classes)");
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(root_, ec))
        if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
      if (ec) throw Error("cannot list " + root_ + ": " + ec.message());
      std::sort(classes_.begin(), classes_.end());
      if (classes_.empty()) throw Error(root_ + " has no subfolders to use as classes");
    }
    for (std::size_t i = 0; i < classes_.size(); ++i) index_[classes_[i]] = static_cast<std::int64_t>(i);
  }
  Sample map(Sample in, const ElementContext&) override {
    fs::path path(std::string(in.at(field_).string_at(0)));
    std::string name = path.parent_path().filename().string();
    auto it = index_.find(name);
    if (it == index_.end()) throw DataError("folder '" + name + "' of " + path.string() + " is not one of the " +
                                            std::to_string(classes_.size()) + " classes");
    in.set("class_name", Tensor::from_string(name));
    in.set("label", Tensor::scalar<std::int64_t>(it->second));
    return in;
  }

 private:
  std::string field_;
  std::vector<std::string> classes_;
  std::string root_;
  std::map<std::string, std::int64_t> index_;
};

// Writes one bytes field per element as a file, optionally in a subfolder per class: the
// Places365-style folder layout. The files go into FOLDER.partial-XXXXXX, which is renamed to
// FOLDER when the run completed: an interrupted run leaves no folder that looks complete, and a
// new set of files is never mixed into an old one (a FOLDER that holds files is refused).
// A FOLDER in a bucket (s3://bucket/prefix) is written into a spool folder
// (SPOOL/upload-HASH.partial-XXXXXX) and its files uploaded under the prefix when the run
// completed; a prefix that holds objects is refused as a folder that holds files is.
class WriteFiles final : public Sink {
 public:
  static OperatorInfo describe() {
    return {"write_files",
            OperatorKind::Sink,
            "Writes a bytes field of each element to FOLDER/[class_LABEL/]NNNNNN.EXT",
            {ParamSpec::make("folder", ParamType::OutputPath, "output folder (must not exist, or be empty)"),
             ParamSpec::make("field", ParamType::String, "bytes field to write").def("image"),
             ParamSpec::make("class_field", ParamType::String, "int64 field naming a subfolder class_NNN; empty: none").def("label"),
             ParamSpec::make("extension", ParamType::String, "file name extension").def(".jpg")},
            {.saves_state = true},
            {}};
  }
  explicit WriteFiles(const Params& p)
      : folder_(p.get_string("folder")), field_(p.get_string("field")), class_field_(p.get_string("class_field")),
        extension_(p.get_string("extension")) {
    if (folder_.empty()) throw ParamError("folder must not be empty");
    if (extension_.find('/') != std::string::npos) throw ParamError("extension must not contain '/'");
  }
  void start(const StageInfo& info) override {
    while (folder_.size() > 1 && folder_.back() == '/') folder_.pop_back();
    if (is_remote_uri(folder_)) return start_remote(info.storage);
    // A folder of files may be a run's that stopped at a checkpoint this run resumes from (taken
    // back in restore_state()): refused only if this run is about to write beside it.
    try {
      refuse_unless_new_or_empty();
    } catch (const Error& e) {
      if (!fs::is_directory(folder_)) throw;
      refusal_ = e.what();
    }
    std::error_code ec;
    const fs::path parent = fs::path(folder_).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) throw Error("cannot create " + parent.string() + ": " + ec.message());
    std::string name = folder_ + ".partial-XXXXXX";
    if (!::mkdtemp(name.data())) throw Error("cannot create " + name + ": " + std::strerror(errno));
    ::chmod(name.c_str(), 0777 & ~AtomicOutputFile::current_umask());  // mkdtemp's 0700 would publish a folder only its owner reads
    temporary_ = name;
  }
  void consume(Sample in, const ElementContext&) override {
    if (!refusal_.empty()) throw Error(refusal_);
    const Tensor& data = in.at(field_);
    if (data.dtype() != DType::Bytes || data.num_elements() != 1) throw DataError("field '" + field_ + "' is not one bytes value");
    fs::path dir = temporary_;
    if (!class_field_.empty()) {
      char name[32];
      std::snprintf(name, sizeof name, "class_%03lld", static_cast<long long>(in.at(class_field_).item<std::int64_t>()));
      dir /= name;
      if (!created_.count(dir.string())) {
        fs::create_directories(dir);
        created_.insert(dir.string());
      }
    }
    char file[32];
    std::snprintf(file, sizeof file, "%06llu", static_cast<unsigned long long>(written_++));
    const fs::path target = dir / (file + extension_);
    auto bytes = data.string_at(0);
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) throw Error("cannot write " + target.string() + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        throw Error("writing " + target.string() + " failed: " + std::strerror(err));
      }
      done += static_cast<std::size_t>(n);
    }
    if (::close(fd) != 0) throw Error("writing " + target.string() + " failed: " + std::strerror(errno));
  }
  void finish(bool complete) override {
    if (!refusal_.empty() && !temporary_.empty()) ::rmdir(temporary_.c_str());  // refused before its first file
    if (temporary_.empty() || !complete) return;  // the .partial folder stays, visibly incomplete
    if (storage_) return publish_remote();
    sync_folder();  // the files' bytes reach the disk before the folder's name says they are complete
    refuse_unless_new_or_empty();
    if (::rename(temporary_.c_str(), folder_.c_str()) != 0)
      throw Error("cannot rename " + temporary_ + " to " + folder_ + ": " + std::strerror(errno));
    temporary_.clear();
  }
  // A resumed run goes on filling the interrupted run's .partial folder after the files written
  // before the checkpoint (those written after it are removed), so that resuming with the same
  // folder gives the uninterrupted run's files.
  void save_state(StateWriter& w) const override {
    sync_folder();
    SavedOutput saved = SavedOutput::of(folder_, temporary_);
    saved.length = written_;  // files, not bytes
    saved.save(w);
    w.describe(std::to_string(written_) + " files written into " + temporary_);
  }
  void restore_state(StateReader& r) override {
    const SavedOutput saved = SavedOutput::load(r);
    if (saved.target != absolute_path(folder_)) return;  // another folder (--set): this run fills its own
    saved.check_partial_of_target();
    struct stat spool {};
    if (storage_ && ::lstat(saved.partial.c_str(), &spool) != 0) return restore_published_remote(saved);
    // A run that stopped at the checkpoint renamed the folder to its name: it is taken back.
    reclaim_partial(saved, {folder_});
    struct stat st {};
    if (::lstat(saved.partial.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error("the checkpoint's output " + saved.partial + " is not the folder it wrote");
    remove_files_from(saved.partial, saved.length);
    ::rmdir(temporary_.c_str());  // this run's own, still empty
    temporary_ = saved.partial;
    written_ = saved.length;
    refusal_.clear();
    refuse_unless_new_or_empty();  // something else took the folder's name meanwhile
  }

 private:
  void sync_folder() const {
    if (const int dir = ::open(temporary_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
      ::syncfs(dir);
      ::close(dir);
    }
  }
  // The number of a file this sink wrote (NNNNNN.EXT, six digits or more), or none.
  std::optional<std::uint64_t> file_number(const std::string& name) const {
    if (name.size() < 6 + extension_.size() || name.compare(name.size() - extension_.size(), std::string::npos, extension_) != 0) return {};
    const std::string number = name.substr(0, name.size() - extension_.size());
    if (number.size() > 19 || !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) return {};
    return std::stoull(number);
  }
  // Removes the files numbered `first` or more (written after a checkpoint) from a partial folder.
  void remove_files_from(const std::string& folder, std::uint64_t first) const {
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      const auto number = file_number(it->path().filename().string());
      if (number && *number >= first) doomed.push_back(it->path());
    }
    if (ec) throw Error("cannot list " + folder + ": " + ec.message());
    for (const auto& path : doomed)
      if (!fs::remove(path, ec) || ec) throw Error("cannot remove " + path.string() + ", written after the checkpoint: " + ec.message());
  }
  // ---- a folder in a bucket ----
  void start_remote(Storage* storage) {
    if (!storage) throw Error("cannot write " + folder_ + ": remote outputs are written through a Sluice engine (this writer was given no storage)");
    storage_ = storage;
    try {  // (as for a local folder, a resumed run may find the checkpoint's own files there)
      refuse_unless_new_or_empty();
    } catch (const Error& e) {
      refusal_ = e.what();
    }
    std::string name = partial_prefix_of(folder_) + "XXXXXX";
    if (!::mkdtemp(name.data())) throw Error("cannot create the spool folder " + name + " for " + folder_ + ": " + std::strerror(errno));
    temporary_ = name;
  }
  // The spool folder's files, uploaded under the prefix by a few threads (each a PUT or a
  // multipart upload); the spool folder goes once all are up. On a failure it stays, named with
  // how far the upload came, so that nothing written is lost.
  void publish_remote() {
    refuse_unless_new_or_empty();
    std::vector<fs::path> files;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(temporary_, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file()) files.push_back(it->path());
    if (ec) throw Error("cannot list the spool folder " + temporary_ + ": " + ec.message());
    std::atomic<std::size_t> next{0}, uploaded{0};
    std::mutex mutex;
    std::string failure;
    auto upload_some = [&] {
      for (std::size_t i; (i = next++) < files.size();) {
        {
          std::lock_guard lock(mutex);
          if (!failure.empty()) return;
        }
        try {
          storage_->upload(files[i].string(), folder_ + "/" + files[i].lexically_relative(temporary_).generic_string());
          ++uploaded;
        } catch (const std::exception& e) {
          std::lock_guard lock(mutex);
          if (failure.empty()) failure = e.what();
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kUploadThreads; ++t) threads.emplace_back(upload_some);
    for (auto& t : threads) t.join();
    if (!failure.empty())
      throw Error(failure + " (" + std::to_string(uploaded.load()) + " of the " + std::to_string(files.size()) + " files of " + folder_ +
                  " were uploaded; all are kept in " + temporary_ + ": upload the rest from there, or remove those objects and run again)");
    fs::remove_all(temporary_, ec);
    temporary_.clear();
  }
  // The checkpoint's run published its files at its stop (its spool folder went with the upload):
  // they stay in the bucket, this run writes the ones after them into its own spool folder and
  // uploads those. The prefix must hold the files numbered below the checkpoint's count.
  void restore_published_remote(const SavedOutput& saved) {
    std::uint64_t found = 0;
    for (const auto& object : storage_->list(folder_ + "/")) {
      const auto number = file_number(object.uri.substr(object.uri.rfind('/') + 1));
      if (number && *number < saved.length) ++found;
    }
    if (found != saved.length)
      throw Error(folder_ + " holds " + std::to_string(found) + " of the " + std::to_string(saved.length) +
                  " files written before the checkpoint (removed or replaced since?); resume from a later checkpoint, or run again");
    written_ = saved.length;
    published_before_ = saved.length;
    refusal_.clear();
  }

  void refuse_unless_new_or_empty() const {
    if (storage_) {
      const auto held = storage_->list(folder_ + "/");
      if (held.size() > published_before_)
        throw Error("output folder " + folder_ + " already holds " + std::to_string(held.size()) + " objects (" + held.front().uri +
                    ", ...); write_files does not mix a new set with an old one: remove them or choose another prefix");
      return;
    }
    struct stat st {};
    if (::stat(folder_.c_str(), &st) != 0) return;
    if (!S_ISDIR(st.st_mode))
      throw Error("output folder " + folder_ + " exists and is " + file_kind_name(st.st_mode) + "; choose a folder path");
    std::error_code ec;
    if (!fs::is_empty(folder_, ec))
      throw Error("output folder " + folder_ + " already holds files; write_files does not mix a new set with an old one: "
                  "remove it or choose another folder");
  }

  static constexpr int kUploadThreads = 4;
  std::string folder_, field_, class_field_, extension_, temporary_;
  Storage* storage_ = nullptr;  // for a folder in a bucket
  std::uint64_t published_before_ = 0;  // files in the bucket already, published at the checkpoint's stop
  std::string refusal_;  // why the folder cannot be written, said at the first file
  std::set<std::string> created_;
  std::uint64_t written_ = 0;
};

}  // namespace

void register_files(Registrar& registrar) {
  registrar.add<WriteFiles>();
  registrar.add<ListFiles>();
  registrar.add<ReadFile>();
  registrar.add<LabelFromPath>();
}

}  // namespace sluice::io
