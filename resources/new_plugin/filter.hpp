#pragma once
// @NAME@: a filter (keeps or drops each element). Keeps the elements whose int64 field `field`
// is a multiple of `divisor`.
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Filter {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Filter,
            "@SUMMARY@",
            {sluice::ParamSpec::make("field", sluice::ParamType::String, "the int64 field tested").def("value"),
             sluice::ParamSpec::make("divisor", sluice::ParamType::Int, "keep multiples of it").def("2").range(1, std::nullopt)},
            // Stateless: the engine may run several workers at once on it.
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one with the defaults when it
  // loads the plugin.
  explicit @CLASS@(const sluice::Params& params) : field_(params.get_string("field")), divisor_(params.get_int("divisor")) {
    if (field_.empty()) throw sluice::ParamError("field is empty: name the int64 field to test");
  }
  bool keep(const sluice::Sample& in, const sluice::ElementContext&) override {
    // A DataError fails this element alone (or skips it, under the pipeline's skip policy).
    const sluice::Tensor& value = in.at(field_);
    if (value.dtype() != sluice::DType::I64 || value.num_elements() != 1)
      throw sluice::DataError("@NAME@: field '" + field_ + "' is " + sluice::dtype_name(value.dtype()) + sluice::shape_string(value.shape()) +
                              ", not one int64");
    return value.item<std::int64_t>() % divisor_ == 0;
  }

 private:
  std::string field_;
  std::int64_t divisor_;
};
