// What `parallelism` means for each stage kind (sluice/core/spec.hpp): the one place that says it.
#include "sluice/core/param_parse.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace sluice {

bool takes_workers(const OperatorInfo& info, const Operator* made) {
  switch (info.kind) {
    case OperatorKind::Source:
    case OperatorKind::Combine: return false;  // one thread makes the order (the engine's positions are its)
    case OperatorKind::Expand: return true;    // one thread per input read at once
    case OperatorKind::Map:
    case OperatorKind::Filter:
    case OperatorKind::Sink: return info.traits.stateless;  // copies of a stateless operator share the elements
    case OperatorKind::Aggregate:
      // One thread takes the inputs in order; helpers assemble the outputs where the operator can.
      return !made || dynamic_cast<const AssemblesInParallel*>(made) != nullptr;
  }
  return false;
}

std::optional<bool> takes_workers(const RegisteredOperator& op, const std::vector<std::pair<std::string, std::string>>& params) {
  if (op.info.kind != OperatorKind::Aggregate) return takes_workers(op.info, nullptr);
  try {
    const auto made = op.info.create(parse_params(op.info.params, params));
    return takes_workers(op.info, made.get());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int stage_threads(const OperatorInfo& info, const Operator& made, int parallelism) {
  return takes_workers(info, &made) ? parallelism : 1;
}

}  // namespace sluice
