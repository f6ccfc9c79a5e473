// A complete Sluice plugin: one map operator with a parameter.
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

}  // namespace

SLUICE_PLUGIN("example", "1.0.0", "An example third-party plugin") { registrar.add<Scale>(); }
