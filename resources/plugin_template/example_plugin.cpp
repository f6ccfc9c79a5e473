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

// Several inputs: one call per output, pulling from the inputs in the operator's order. Where it
// is (the input whose turn it is) lives in a member, which it saves for checkpoints.
class Alternate final : public sluice::Combine {
 public:
  static sluice::OperatorInfo describe() {
    sluice::OperatorInfo info{"example_alternate", sluice::OperatorKind::Combine,
                              "An element of the first input, then of the second, and so on, until either runs out", {},
                              {.saves_state = true}, {}};
    info.min_inputs = info.max_inputs = 2;
    return info;
  }
  explicit Alternate(const sluice::Params&) {}
  void begin_iteration(const sluice::ElementContext&) override { turn_ = 0; }
  bool next(sluice::CombineInputs& inputs, sluice::Sample& out) override {
    if (!inputs.next(turn_, out)) return false;  // either input ran out: so does the iteration
    turn_ = 1 - turn_;
    return true;
  }
  void save_state(sluice::StateWriter& w) const override { w.put<std::uint64_t>(turn_); }
  void restore_state(sluice::StateReader& r) override { turn_ = static_cast<std::size_t>(r.get<std::uint64_t>()); }

 private:
  std::size_t turn_ = 0;
};

}  // namespace

SLUICE_PLUGIN("example", "1.0.0", "An example third-party plugin") {
  registrar.add<Scale>();
  registrar.add<Alternate>();
}
