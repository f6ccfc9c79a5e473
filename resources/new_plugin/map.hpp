#pragma once
// @NAME@: a map (one element in, one out). Multiplies the int64 field `field` by `factor`.
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Map {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Map,
            "@SUMMARY@",
            {sluice::ParamSpec::make("field", sluice::ParamType::String, "the int64 field to scale").def("value"),
             sluice::ParamSpec::make("factor", sluice::ParamType::Int, "what it is multiplied by").def("2").range(-1000000, 1000000)},
            // Stateless: the engine may run several workers at once on it.
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one with the defaults when it
  // loads the plugin. Resources (files, devices) are taken in start().
  explicit @CLASS@(const sluice::Params& params) : field_(params.get_string("field")), factor_(params.get_int("factor")) {
    if (field_.empty()) throw sluice::ParamError("field is empty: name the int64 field to scale");
  }
  sluice::Sample map(sluice::Sample in, const sluice::ElementContext&) override {
    // A DataError fails this element alone (or skips it, under the pipeline's skip policy); the
    // engine adds where the element came from.
    const sluice::Tensor& value = in.at(field_);
    if (value.dtype() != sluice::DType::I64 || value.num_elements() != 1)
      throw sluice::DataError("@NAME@: field '" + field_ + "' is " + sluice::dtype_name(value.dtype()) + sluice::shape_string(value.shape()) +
                              ", not one int64");
    // A new tensor, never a write into the one given: another stage may read it too.
    in.set(field_, sluice::Tensor::scalar<std::int64_t>(value.item<std::int64_t>() * factor_));
    return in;
  }

 private:
  std::string field_;
  std::int64_t factor_;
};
