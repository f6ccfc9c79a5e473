// Replay by running (sluice/core/prepare.hpp: select_step): the epoch made again up to one step.
#include <fmt/format.h>

#include "sluice/core/prepare.hpp"
#include "sluice/core/registry.hpp"

namespace sluice {

void select_step(PipelineDocument& doc, const Registry& registry, std::uint64_t step) {
  int sink = -1, sinks = 0;
  for (int i = 0; i < doc.spec.stage_size(); ++i) {
    const auto op = registry.find(doc.spec.stage(i).op());
    if (op && op->info.kind == OperatorKind::Sink) {
      sink = i;
      ++sinks;
    }
  }
  if (sinks != 1) throw Error(fmt::format("{} ends in {} sinks; a step is one sink's output: keep the one to replay", doc.file, sinks));
  if (doc.spec.stage(sink).input_size() != 1) throw Error(fmt::format("{}: its sink reads {} stages", doc.file, doc.spec.stage(sink).input_size()));
  auto fresh_id = [&](std::string id) {
    for (int n = 2; std::any_of(doc.spec.stage().begin(), doc.spec.stage().end(), [&](const auto& s) { return s.id() == id; }); ++n)
      id = fmt::format("{}_{}", id, n);
    return id;
  };
  const std::string input = doc.spec.stage(sink).input(0), skip_id = fresh_id("replay_skip"), take_id = fresh_id("replay_take");
  // The operators of the loaded plugins that skip and take (their roles say `count`).
  auto op_of = [&](OperatorRole role, const char* what) {
    const auto op = registry.with_role(role);
    if (!op) throw Error(fmt::format("no loaded plugin {} elements (the std plugin does): replaying a step by running needs one", what));
    return op->info.name;
  };
  auto add = [&](const std::string& id, const std::string& op, const std::string& from, std::uint64_t count) {
    auto* st = doc.spec.add_stage();
    st->set_id(id);
    st->set_op(op);
    st->add_input(from);
    (*st->mutable_params())["count"] = std::to_string(count);
  };
  add(skip_id, op_of(OperatorRole::Skips, "skips"), input, step);
  add(take_id, op_of(OperatorRole::Takes, "takes"), skip_id, 1);
  doc.spec.mutable_stage(sink)->set_input(0, take_id);
}

}  // namespace sluice
