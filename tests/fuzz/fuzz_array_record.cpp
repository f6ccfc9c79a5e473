// libFuzzer target: ArrayRecord files (Riegeli's blocks and chunks, compressed chunks, the footer
// and postscript), read in order with damage skipped and thrown, and each chunk decoded alone.
#include <cstdint>

#include "array_record.hpp"

namespace {
class SkipAll final : public sluice::DamageReport {
 public:
  bool skip_damaged(const std::string&) override { return true; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace sluice::io;
  for (bool skip : {true, false}) {
    try {
      SkipAll damage;
      // Small spans: runs of chunks read together and chunks alone.
      ArrayRecordStream stream(std::make_unique<PositionedFile>("fuzz", data, size), skip, 1 << 12, nullptr);
      Record record;
      std::uint64_t total = 0;
      while (stream.next(record, skip ? &damage : nullptr))
        if (record.length) total += std::to_integer<unsigned>(record.data()[record.length - 1]);  // in bounds
      (void)total;
      if (skip && stream.layout().records) stream.seek(stream.layout().records - 1, stream.layout().chunks.back().offset);
    } catch (const sluice::Error&) {
    }
  }
  return 0;
}
