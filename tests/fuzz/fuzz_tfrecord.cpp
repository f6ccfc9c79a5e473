// libFuzzer target: TFRecord framing (plain, gzip, zlib auto-detected), damage skipped or thrown.
#include <cstdint>

#include "tfrecord.hpp"

namespace {
class SkipAll final : public sluice::DamageReport {
 public:
  bool skip_damaged(const std::string&) override { return true; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  sluice::io::RecordReaderOptions options;
  options.chunk_bytes = 1 << 12;  // small chunks exercise records spanning reads
  options.max_record_bytes = 1 << 24;
  for (bool skip : {true, false}) {
    try {
      SkipAll damage;
      sluice::io::RecordReader reader(sluice::io::memory_source(data, size, sluice::io::Compression::Auto, "fuzz"), "fuzz", options);
      sluice::io::Record record;
      std::uint64_t total = 0;
      while (reader.next(record, skip ? &damage : nullptr))
        if (record.length) total += std::to_integer<unsigned>(record.data()[record.length - 1]);  // in bounds
      (void)total;
    } catch (const sluice::Error&) {
    }
  }
  return 0;
}
