#pragma once
// @NAME@: an aggregate (many elements in, fewer out, with state between them; one worker). Sums
// the int64 field `field` over consecutive groups of `size` elements: one output per group, with
// the sum in `field` and the group's element count in `count`.
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Aggregate {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Aggregate,
            "@SUMMARY@",
            {sluice::ParamSpec::make("size", sluice::ParamType::Int, "elements per group").def("4").range(1, 1000000000),
             sluice::ParamSpec::make("drop_remainder", sluice::ParamType::Bool, "drop the short last group of each iteration").def("false")},
            // saves_state: `sluice run --checkpoint` can stop it between two elements and resume.
            {.saves_state = true},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one with the defaults when it
  // loads the plugin.
  explicit @CLASS@(const sluice::Params& params) : size_(params.get_int("size")), drop_remainder_(params.get_bool("drop_remainder")) {}

  void begin_iteration(std::uint64_t) override { sum_ = count_ = 0; }
  Flow push(sluice::Sample in, const sluice::ElementContext&, sluice::Emitter& out) override {
    // A DataError refuses this element alone (or skips it, under the pipeline's skip policy).
    const sluice::Tensor& value = in.at("value");
    if (value.dtype() != sluice::DType::I64 || value.num_elements() != 1)
      throw sluice::DataError(std::string("@NAME@: field 'value' is ") + sluice::dtype_name(value.dtype()) + sluice::shape_string(value.shape()) + ", not one int64");
    sum_ += value.item<std::int64_t>();
    if (++count_ == size_) emit(out);
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, sluice::Emitter& out) override {
    if (count_ > 0 && !drop_remainder_) emit(out);
    sum_ = count_ = 0;
  }
  // What it holds between two elements; restore_state() reads the same values in the same order.
  void save_state(sluice::StateWriter& w) const override {
    w.put(sum_);
    w.put(count_);
    w.describe(std::to_string(count_) + " of " + std::to_string(size_) + " elements summed");
  }
  void restore_state(sluice::StateReader& r) override {
    sum_ = r.get<std::int64_t>();
    count_ = r.get<std::int64_t>();
    if (count_ < 0 || count_ >= size_) throw sluice::DataError("the saved group holds " + std::to_string(count_) + " elements, not fewer than size");
  }

 private:
  void emit(sluice::Emitter& out) {
    sluice::Sample group;
    group.set("value", sluice::Tensor::scalar<std::int64_t>(sum_));
    group.set("count", sluice::Tensor::scalar<std::int64_t>(count_));
    sum_ = count_ = 0;
    out.push(std::move(group));  // false: nothing more is wanted downstream (a take is satisfied)
  }
  std::int64_t size_;
  bool drop_remainder_;
  std::int64_t sum_ = 0, count_ = 0;
};
