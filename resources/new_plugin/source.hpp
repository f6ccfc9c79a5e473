#pragma once
// @NAME@: a source (no input; it makes the elements). `count` elements numbered from `start`,
// in a field `value` (int64), and their square in `square`.
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Source {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Source,
            "@SUMMARY@",
            {sluice::ParamSpec::make("count", sluice::ParamType::Int, "elements per pass").def("10").range(0, std::nullopt),
             sluice::ParamSpec::make("start", sluice::ParamType::Int, "the first element's value").def("0")},
            // saves_state: `sluice run --checkpoint` can stop it and resume it exactly.
            {.saves_state = true},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one with the defaults when it
  // loads the plugin. Resources (files, connections) are taken in start().
  explicit @CLASS@(const sluice::Params& params) : count_(params.get_int("count")), start_(params.get_int("start")) {}

  void begin_pass(std::uint64_t) override { next_ = 0; }
  bool next(sluice::Sample& out, const sluice::ElementContext&) override {
    if (next_ >= count_) return false;
    const std::int64_t value = start_ + next_++;
    out.set("value", sluice::Tensor::scalar<std::int64_t>(value));
    out.set("square", sluice::Tensor::scalar<std::int64_t>(value * value));
    return true;
  }
  // Progress and ETA in the CLI and the studio.
  std::int64_t expected_elements() const override { return count_; }
  // Where it is in the pass; restore_state() reads the same values in the same order.
  void save_state(sluice::StateWriter& w) const override { w.put(next_); }
  void restore_state(sluice::StateReader& r) override {
    next_ = r.get<std::int64_t>();
    if (next_ < 0 || next_ > count_) throw sluice::DataError("the saved position " + std::to_string(next_) + " is outside this source's count");
  }

 private:
  std::int64_t count_, start_;
  std::int64_t next_ = 0;
};
