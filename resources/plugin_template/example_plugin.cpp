// A complete Sluice plugin: a map operator with a parameter, and a combine operator reading two
// inputs (ABI 5.0).
#include "sluice/sdk.hpp"

namespace {

class Scale final : public sluice::Map {
 public:
  static sluice::OperatorInfo describe() {
    return {"example_scale",
            sluice::OperatorKind::Map,
            "Multiplies the int64 field 'value' by factor",
            {sluice::ParamSpec::make("factor", sluice::ParamType::Int, "multiplier").def("2")},
            {.stateless = true},
            {}};
  }
  explicit Scale(const sluice::Params& params) : factor_(params.get_int("factor")) {}
  sluice::Sample map(sluice::Sample in, const sluice::ElementContext&) override {
    auto value = in.at("value").item<std::int64_t>();
    in.set("value", sluice::Tensor::scalar<std::int64_t>(value * factor_));
    return in;
  }

 private:
  std::int64_t factor_;
};

// Several inputs: one call per output iteration, pulling from the inputs in the operator's order.
class Alternate final : public sluice::Combine {
 public:
  static sluice::OperatorInfo describe() {
    sluice::OperatorInfo info{"example_alternate", sluice::OperatorKind::Combine,
                              "An element of the first input, then of the second, and so on, until either runs out", {}, {}, {}};
    info.min_inputs = info.max_inputs = 2;
    return info;
  }
  explicit Alternate(const sluice::Params&) {}
  void combine(sluice::CombineInputs& inputs, const sluice::ElementContext&, sluice::Emitter& out) override {
    sluice::Sample sample;
    for (std::size_t k = 0; inputs.next(k, sample); k = 1 - k)
      if (!out.push(std::move(sample))) return;  // downstream wants no more: return promptly
  }
};

}  // namespace

SLUICE_PLUGIN("example", "1.0.0", "An example third-party plugin") {
  registrar.add<Scale>();
  registrar.add<Alternate>();
}
