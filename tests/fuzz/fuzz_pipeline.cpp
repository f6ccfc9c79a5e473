// libFuzzer target: pipeline files as text format and JSON (the first byte picks the overrides
// applied), then what a user's file goes through before any plugin runs: the round trip to text
// and validation of the wiring (ids, inputs listed twice, cycles, reaching a sink) against an empty
// registry; and the studio's save: the file's own text edited (a stage changed, one removed, one
// added), which must read back as the edited pipeline. Any exception other than sluice::Error is
// a bug.
#include <google/protobuf/util/message_differencer.h>

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
    if (sluice::update_pipeline_text(text, doc.spec) != text && text.find_first_not_of(" \t\r\n") != std::string::npos &&
        text[text.find_first_not_of(" \t\r\n")] != '{')
      __builtin_trap();  // nothing changed: nothing may change in the file
    auto edited = doc.spec;
    if (edited.stage_size() > 0) {
      edited.mutable_stage(0)->set_parallelism(edited.stage(0).parallelism() + 1);
      (*edited.mutable_stage(0)->mutable_params())["fuzz"] = "1";
      edited.mutable_stage(edited.stage_size() - 1)->clear_input();
    }
    if (edited.stage_size() > 2) edited.mutable_stage()->DeleteSubrange(1, 1);
    edited.add_stage()->set_id("added");
    edited.mutable_options()->set_seed(edited.options().seed() + 1);
    const std::string saved = sluice::update_pipeline_text(text, edited);
    if (!google::protobuf::util::MessageDifferencer::Equals(sluice::parse_pipeline(saved, "saved.txtpb").spec, edited))
      __builtin_trap();
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
