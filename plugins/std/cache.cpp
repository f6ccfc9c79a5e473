#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <filesystem>

#include "sluice/sample_codec.hpp"
#include "std_plugin.hpp"

namespace fs = std::filesystem;

namespace sluice::std_ops {
namespace {

// A cache file: this magic, the fingerprint of the pipeline before the cache, then the elements
// in the SDK's binary form (sluice/sample_codec.hpp). Version 3: the elements keep their whole
// origin (record and byte offset too).
constexpr char kCacheMagic[8] = {'S', 'L', 'C', 'A', 'C', 'H', 'E', '3'};

// The SDK's sample codec over a cache file's stream. Positions are counted here, not asked of the
// stream: ftell costs a system call, and the codec asks what remains before every length.
class CacheFileBytes final : public SampleBytesIn {
 public:
  // `file_size`: -1 for the size of the local file behind the stream.
  CacheFileBytes(std::FILE* file, const std::string& name, std::int64_t file_size) : file_(file), what_("cache file " + name) {
    struct stat st {};
    if (file_size < 0) file_size = ::fstat(::fileno(file), &st) == 0 ? st.st_size : 0;
    const long at = std::ftell(file);
    at_ = at < 0 ? 0 : static_cast<std::uint64_t>(at);
    size_ = static_cast<std::uint64_t>(file_size);
  }
  std::size_t remaining() const override { return at_ > size_ ? 0 : static_cast<std::size_t>(size_ - at_); }
  void read(void* out, std::size_t size) override {
    if (size && std::fread(out, 1, size, file_) != size)
      throw DataError(what_ + " is truncated at byte " + std::to_string(at_) + " (" + kRebuild + ")");
    at_ += size;
  }
  std::string_view view(std::size_t size, std::string& scratch) override {
    scratch.resize(size);
    read(scratch.data(), size);
    return scratch;
  }
  // The next element into `sample`; false at the file's clean end.
  bool next(Sample& sample) {
    if (remaining() == 0) return false;
    try {
      sample = decode_sample(*this, what_);
    } catch (const DataError& e) {
      const std::string why = e.what();
      throw DataError(why.find(kRebuild) == std::string::npos ? why + " (" + kRebuild + ")" : why);
    }
    return true;
  }

 private:
  static constexpr const char* kRebuild = "delete it and its .complete marker to rebuild it";
  std::FILE* file_;
  const std::string what_;  // "cache file PATH", made once: the codec names it only in a refusal
  std::uint64_t at_ = 0, size_ = 0;
};

void write_sample(std::FILE* file, const Sample& sample) {
  encode_sample(sample, [&](const void* data, std::size_t size) {
    if (size && std::fwrite(data, 1, size, file) != size) throw Error("writing the cache file failed (disk full?)");
  });
}

// A cache file opened for reading: a local file, or an object of a bucket read through the
// stage's storage (as a stream through fopencookie, for the sample codec). A failed remote read
// keeps its reason, which close() and check() throw in place of the codec's "truncated".
class CacheFileReader {
 public:
  CacheFileReader(const std::string& path, Storage* storage) : path_(path) {
    if (!is_remote_uri(path)) {
      file_ = std::fopen(path.c_str(), "rb");
      if (!file_) throw Error("cannot read cache file " + path + ": " + std::strerror(errno));
      return;
    }
    if (!storage) throw Error("cannot read cache file " + path + ": remote URIs are read through a Sluice engine");
    auto remote = std::make_unique<Remote>();
    remote->reader = storage->open(path);
    size_ = static_cast<std::int64_t>(remote->reader->object().size);
    cookie_io_functions_t functions{&Remote::read, nullptr, &Remote::seek, &Remote::close};
    remote_ = remote.get();
    file_ = ::fopencookie(remote.release(), "rb", functions);
    if (!file_) throw Error("cannot read cache file " + path + ": " + std::strerror(errno));
  }
  CacheFileReader(const CacheFileReader&) = delete;
  CacheFileReader& operator=(const CacheFileReader&) = delete;
  ~CacheFileReader() {
    if (file_) std::fclose(file_);
  }
  std::FILE* stream() const { return file_; }
  std::int64_t size() const { return size_; }  // -1: the local file's, found by the codec
  // Runs `read` on the stream; a remote read's own failure is what is thrown.
  template <class Read>
  auto reading(Read&& read) -> decltype(read()) {
    try {
      return read();
    } catch (const DataError&) {
      if (remote_ && !remote_->error.empty()) throw DataError("reading cache file " + path_ + ": " + remote_->error);
      throw;
    }
  }

 private:
  struct Remote {
    std::unique_ptr<RemoteReader> reader;
    std::uint64_t position = 0;
    std::string error;
    static ssize_t read(void* cookie, char* buffer, std::size_t size) {
      auto* self = static_cast<Remote*>(cookie);
      try {
        const std::size_t got = self->reader->read(reinterpret_cast<std::byte*>(buffer), size);
        self->position += got;
        return static_cast<ssize_t>(got);
      } catch (const std::exception& e) {
        self->error = e.what();
        errno = EIO;
        return -1;
      }
    }
    static int seek(void* cookie, off64_t* offset, int whence) {
      auto* self = static_cast<Remote*>(cookie);
      std::int64_t target = whence == SEEK_SET ? *offset : whence == SEEK_CUR ? static_cast<std::int64_t>(self->position) + *offset : -1;
      if (target < 0) return -1;  // (SEEK_END: the codec never asks)
      try {
        if (static_cast<std::uint64_t>(target) != self->position) self->reader->seek(static_cast<std::uint64_t>(target));
      } catch (const std::exception& e) {
        self->error = e.what();
        return -1;
      }
      self->position = static_cast<std::uint64_t>(target);
      *offset = target;
      return 0;
    }
    static int close(void* cookie) {
      delete static_cast<Remote*>(cookie);
      return 0;
    }
  };
  std::string path_;
  std::FILE* file_ = nullptr;
  Remote* remote_ = nullptr;  // owned by the stream
  std::int64_t size_ = -1;
};

// Whether a cache file is there to replay: a regular local file, or an object of that exact key.
bool cache_file_exists(const std::string& path, Storage* storage) {
  if (is_remote_uri(path)) {
    if (!storage) throw Error("cannot look for cache file " + path + ": remote URIs are read through a Sluice engine");
    for (const auto& object : storage->list(path))
      if (object.uri == path) return true;
    return false;
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The first iteration passes through and is recorded; later iterations replay the record
// instead of asking the input again. In memory, or in a file reused across runs. The file is
// written under a temporary name and renamed when the first iteration is complete, so a cache
// file that exists is whole; it starts with the fingerprint of the pipeline before the cache
// (StageInfo::input_fingerprint), and a file made by another pipeline is refused, never replayed.
class Cache final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"cache",
            OperatorKind::Aggregate,
            "Records the first iteration and replays it for the next ones (in memory, or in a file reused across runs)",
            {ParamSpec::make("path", ParamType::OutputPath, "cache file; empty keeps the cache in memory").def("")},
            {.keeps_shape = true, .saves_state = true, .role = OperatorRole::Caches},
            {}};
  }
  explicit Cache(const Params& p) : path_(p.get_string("path")) {}

  void start(const StageInfo& info) override {
    fingerprint_ = info.input_fingerprint;
    storage_ = info.storage;
    if (path_.empty()) return;
    resolve_output_target(path_);  // refuses a directory, FIFO or device at the path before any work
    ready_from_file_ = cache_file_exists(path_, storage_);
    if (ready_from_file_) check_header_of_existing_file();
  }
  std::int64_t input_passes(std::int64_t iterations) const override {
    return (iterations == 0 || ready_from_file_) ? 0 : 1;
  }
  bool keeps_reading_when_skipped() const override { return true; }

  // The run's first iteration records, whatever its epoch (a run may continue earlier ones).
  void begin_iteration(std::uint64_t) override {
    if (begun_++ != 0 || ready_from_file_) return;
    recording_ = true;
    if (!path_.empty()) {
      file_.open(path_, storage_);
      file_.write(kCacheMagic, sizeof kCacheMagic);
      file_.write(&fingerprint_, sizeof fingerprint_);
    }
  }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (recording_) {
      if (file_.is_open()) {
        write_sample(file_.stream(), in);
        ++recorded_;
      } else {
        memory_.push_back(in);  // shares the tensors' buffers
      }
    }
    out.push(std::move(in));
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter&) override {
    if (!recording_) return;
    recording_ = false;
    complete_ = true;
    if (file_.is_open()) file_.commit();
  }
  bool replay(std::uint64_t, Emitter& out) override {
    if (ready_from_file_ || (complete_ && !path_.empty())) return replay_file(out);
    if (!complete_) return false;
    for (const auto& s : memory_)
      if (!out.push(s)) break;
    return true;
  }
  void finish(bool) override {
    if (file_.is_open()) file_.abandon(/*keep=*/false);  // an interrupted recording is worth nothing
  }

  // While recording, the elements recorded so far (a recording file is read back for them: it is
  // removed when the run stops); once complete, a cache file holds them and a memory cache keeps
  // them in the checkpoint. A replay saves nothing of its own: the engine counts its outputs.
  void save_state(StateWriter& w) const override {
    w.put(begun_);
    w.put<std::uint8_t>(recording_);
    w.put<std::uint8_t>(complete_);
    w.put<std::uint8_t>(ready_from_file_);
    if (file_.is_open()) {
      std::fflush(file_.stream());
      w.put<std::uint64_t>(recorded_);
      std::FILE* f = std::fopen(file_.writing_path().c_str(), "rb");
      if (!f) throw Error("cannot read back the cache being recorded, " + file_.writing_path() + ": " + std::strerror(errno));
      try {
        read_header(f);
        Sample s;
        CacheFileBytes recorded(f, file_.writing_path(), -1);
        for (std::uint64_t i = 0; i < recorded_; ++i) {
          if (!recorded.next(s)) throw Error("the cache being recorded ends early");
          w.put_element(s);
        }
      } catch (...) {
        std::fclose(f);
        throw;
      }
      std::fclose(f);
      w.describe("recording, " + std::to_string(recorded_) + " elements so far");
      return;
    }
    const bool keeps_memory = path_.empty();
    w.put<std::uint64_t>(keeps_memory ? memory_.size() : 0);
    if (keeps_memory)
      for (const auto& s : memory_) w.put_element(s);
    w.describe(recording_ ? "recording, " + std::to_string(memory_.size()) + " elements so far"
                          : complete_ ? "complete" : "empty");
  }
  void restore_state(StateReader& r) override {
    const bool file_exists_now = ready_from_file_;  // as start() found it
    begun_ = r.get<std::uint64_t>();
    recording_ = r.get<std::uint8_t>() != 0;
    complete_ = r.get<std::uint8_t>() != 0;
    ready_from_file_ = r.get<std::uint8_t>() != 0;
    if (!path_.empty() && (ready_from_file_ || complete_) && !file_exists_now)
      throw Error("cache file " + path_ + ", complete in the checkpoint's run, is gone: it cannot be replayed");
    if (!path_.empty() && recording_ && file_exists_now)
      throw Error("cache file " + path_ + " exists now but was being written in the checkpoint's run: move it away to resume");
    const auto held = r.get<std::uint64_t>();
    memory_.clear();
    if (recording_ && !path_.empty()) {
      file_.open(path_, storage_);
      file_.write(kCacheMagic, sizeof kCacheMagic);
      file_.write(&fingerprint_, sizeof fingerprint_);
      for (std::uint64_t i = 0; i < held; ++i) write_sample(file_.stream(), r.get_element());
      recorded_ = held;
      return;
    }
    for (std::uint64_t i = 0; i < held; ++i) memory_.push_back(r.get_element());
  }

 private:
  // Reads the magic and fingerprint at the start of a cache file; throws unless they are ours.
  void read_header(std::FILE* f) const {
    char magic[sizeof kCacheMagic] = {};
    std::uint64_t stored = 0;
    if (std::fread(magic, 1, sizeof magic, f) != sizeof magic || std::memcmp(magic, kCacheMagic, sizeof magic) != 0)
      throw DataError("cache file " + path_ + " is not a cache of this Sluice version; delete it to rebuild it");
    if (std::fread(&stored, 1, sizeof stored, f) != sizeof stored || stored != fingerprint_)
      throw DataError(fmt_fingerprint_mismatch(stored));
  }
  std::string fmt_fingerprint_mismatch(std::uint64_t stored) const {
    char text[160];
    std::snprintf(text, sizeof text, " (made by a pipeline with fingerprint %016llx, this one is %016llx)",
                  static_cast<unsigned long long>(stored), static_cast<unsigned long long>(fingerprint_));
    return "cache file " + path_ + " was made by a different pipeline before the cache" + text +
           ": delete it to rebuild it, or give this cache another path";
  }
  void check_header_of_existing_file() const {
    CacheFileReader file(path_, storage_);
    file.reading([&] { read_header(file.stream()); });
  }
  bool replay_file(Emitter& out) {
    CacheFileReader file(path_, storage_);
    file.reading([&] {
      read_header(file.stream());
      Sample s;
      CacheFileBytes elements(file.stream(), path_, file.size());
      while (elements.next(s))
        if (!out.push(std::move(s))) break;
    });
    return true;
  }

  std::string path_;
  Storage* storage_ = nullptr;  // for a cache file in a bucket
  std::uint64_t fingerprint_ = 0;
  bool ready_from_file_ = false, recording_ = false, complete_ = false;
  std::uint64_t begun_ = 0;  // iterations begun in this run
  std::uint64_t recorded_ = 0;  // elements written to the recording file
  AtomicOutputFile file_;
  std::vector<Sample> memory_;
};

}  // namespace

void register_cache(Registrar& registrar) { registrar.add<Cache>(); }

}  // namespace sluice::std_ops
