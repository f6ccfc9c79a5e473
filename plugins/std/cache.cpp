#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "sample_codec.hpp"
#include "std_plugin.hpp"

namespace fs = std::filesystem;

namespace sluice::std_ops {
namespace {

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
            {.keeps_shape = true},
            {}};
  }
  explicit Cache(const Params& p) : path_(p.get_string("path")) {}

  void start(const StageInfo& info) override {
    fingerprint_ = info.input_fingerprint;
    if (path_.empty()) return;
    resolve_output_target(path_);  // refuses a directory, FIFO or device at the path before any work
    struct stat st {};
    ready_from_file_ = ::stat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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
      file_.open(path_);
      file_.write(kCacheMagic, sizeof kCacheMagic);
      file_.write(&fingerprint_, sizeof fingerprint_);
    }
  }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (recording_) {
      if (file_.is_open()) write_sample(file_.stream(), in);
      else memory_.push_back(in);  // shares the tensors' buffers
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
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    if (!f) throw Error("cannot read cache file " + path_ + ": " + std::strerror(errno));
    try {
      read_header(f);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
  }
  bool replay_file(Emitter& out) {
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    if (!f) throw Error("cannot read cache file " + path_ + ": " + std::strerror(errno));
    try {
      read_header(f);
      Sample s;
      while (read_sample(f, s, path_))
        if (!out.push(std::move(s))) break;
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
    return true;
  }

  std::string path_;
  std::uint64_t fingerprint_ = 0;
  bool ready_from_file_ = false, recording_ = false, complete_ = false;
  std::uint64_t begun_ = 0;  // iterations begun in this run
  AtomicOutputFile file_;
  std::vector<Sample> memory_;
};

}  // namespace

void register_cache(Registrar& registrar) { registrar.add<Cache>(); }

}  // namespace sluice::std_ops
