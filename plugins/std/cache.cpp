#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "sample_codec.hpp"
#include "std_plugin.hpp"

namespace fs = std::filesystem;

namespace sluice::std_ops {
namespace {

// The first iteration passes through and is recorded; later iterations replay the record
// instead of asking the input again. In memory, or in a file that is trusted only once its
// ".complete" marker exists, so an interrupted run never leaves a cache that looks whole.
class Cache final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"cache",
            OperatorKind::Aggregate,
            "Records the first iteration and replays it for the next ones (in memory, or in a file reused across runs)",
            {ParamSpec::make("path", ParamType::Path, "cache file; empty keeps the cache in memory").def("")},
            {.keeps_shape = true},
            {}};
  }
  explicit Cache(const Params& p) : path_(p.get_string("path")) {}

  void start(const StageInfo&) override {
    if (!path_.empty()) {
      ready_from_file_ = fs::exists(path_) && fs::exists(marker());
      if (!ready_from_file_ && fs::exists(marker())) fs::remove(marker());
    }
  }
  std::int64_t input_passes(std::int64_t iterations) const override {
    return (iterations == 0 || ready_from_file_) ? 0 : 1;
  }
  bool keeps_reading_when_skipped() const override { return true; }

  void begin_iteration(std::uint64_t epoch) override {
    if (epoch != 0 || ready_from_file_) return;
    recording_ = true;
    if (!path_.empty()) {
      partial_ = path_ + ".partial-" + std::to_string(::getpid());
      file_ = std::fopen(partial_.c_str(), "wb");
      if (!file_) throw Error("cannot write cache file " + partial_ + " (is the folder writable?)");
      std::fwrite(kCacheMagic, 1, sizeof kCacheMagic, file_);
    }
  }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (recording_) {
      if (file_) write_sample(file_, in);
      else memory_.push_back(in);  // shares the tensors' buffers
    }
    out.push(std::move(in));
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t epoch, Emitter&) override {
    if (epoch != 0 || !recording_) return;
    recording_ = false;
    complete_ = true;
    if (file_) {
      bool ok = std::fflush(file_) == 0;
      std::fclose(file_);
      file_ = nullptr;
      if (!ok) throw Error("writing cache file " + partial_ + " failed (disk full?)");
      fs::rename(partial_, path_);
      std::ofstream(marker()) << "complete\n";
      partial_.clear();
    }
  }
  bool replay(std::uint64_t, Emitter& out) override {
    if (ready_from_file_ || (complete_ && !path_.empty())) return replay_file(out);
    if (!complete_) return false;
    for (const auto& s : memory_)
      if (!out.push(s)) break;
    return true;
  }
  void finish(bool) override {
    if (file_) {
      std::fclose(file_);
      file_ = nullptr;
    }
    if (!partial_.empty()) {
      std::error_code ignored;
      fs::remove(partial_, ignored);  // an interrupted recording is worth nothing
    }
  }

 private:
  std::string marker() const { return path_ + ".complete"; }
  bool replay_file(Emitter& out) {
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    if (!f) throw Error("cannot read cache file " + path_);
    char magic[sizeof kCacheMagic] = {};
    bool ok = std::fread(magic, 1, sizeof magic, f) == sizeof magic && std::memcmp(magic, kCacheMagic, sizeof magic) == 0;
    try {
      if (!ok) throw DataError("cache file " + path_ + " is not a Sluice cache; delete it and " + marker());
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

  std::string path_, partial_;
  bool ready_from_file_ = false, recording_ = false, complete_ = false;
  std::FILE* file_ = nullptr;
  std::vector<Sample> memory_;
};

}  // namespace

void register_cache(Registrar& registrar) { registrar.add<Cache>(); }

}  // namespace sluice::std_ops
