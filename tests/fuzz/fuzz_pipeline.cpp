// libFuzzer target: pipeline files as text format and JSON (the first byte picks the overrides
// applied), then what a user's file goes through before any plugin runs: the round trip to text
// and validation of the wiring (ids, inputs, fan-out, cycles, reaching a sink) against an empty
// registry. Any exception other than sluice::Error is a bug.
#include <cstdint>
#include <string>

#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  static const sluice::Registry registry;
  try {
    auto doc = sluice::parse_pipeline(text, "fuzz.txtpb");
    const auto printed = sluice::pipeline_to_text(doc.spec);
    auto again = sluice::parse_pipeline(printed, "printed.txtpb");  // what we print must read back
    if (again.spec.stage_size() != doc.spec.stage_size()) __builtin_trap();
    if (data[0] & 1) {
      try {
        sluice::apply_overrides(doc, {"a.b=1", "x.y.z=2", "=", "src.count=5"});
      } catch (const sluice::SpecError&) {
      }
    }
    (void)sluice::validate_pipeline(doc, registry);
  } catch (const sluice::Error&) {
  }
  return 0;
}
