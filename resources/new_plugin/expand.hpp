#pragma once
// @NAME@: an expand (one element in, any number out, as a file becomes its records). Each input
// gives `copies` outputs: the input's fields and a field `copy` (int64, 0 to copies - 1). Outputs
// come one at a time from a cursor, so that the engine can interleave several inputs
// (interleave { cycle_length block_length } in the pipeline file).
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Expand {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Expand,
            "@SUMMARY@",
            {sluice::ParamSpec::make("copies", sluice::ParamType::Int, "outputs per input").def("2").range(0, 1000000),
             sluice::ParamSpec::make("index_field", sluice::ParamType::String, "the field numbering the copies").def("copy")},
            {.stateless = true},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one with the defaults when it
  // loads the plugin.
  explicit @CLASS@(const sluice::Params& params)
      : copies_(params.get_int("copies")), index_field_(params.get_string("index_field")) {
    if (index_field_.empty()) throw sluice::ParamError("index_field is empty: name the field that numbers the copies");
  }
  std::unique_ptr<sluice::ExpandCursor> open(sluice::Sample in, const sluice::ElementContext&, sluice::DamageReport&) override {
    return std::make_unique<Cursor>(std::move(in), copies_, index_field_);
  }

 private:
  // One input's outputs. A reader of a file would also report damage it can step over (a bad
  // record) through the DamageReport, and seek() to where a checkpoint says.
  class Cursor final : public sluice::ExpandCursor {
   public:
    Cursor(sluice::Sample in, std::int64_t copies, const std::string& index_field)
        : in_(std::move(in)), copies_(copies), index_field_(index_field) {}
    bool next(sluice::Sample& out) override {
      if (next_ >= copies_) return false;
      out = in_;  // shares the input's tensors: no copy of their bytes
      out.set(index_field_, sluice::Tensor::scalar<std::int64_t>(next_++));
      return true;
    }

   private:
    sluice::Sample in_;
    std::int64_t copies_;
    std::string index_field_;
    std::int64_t next_ = 0;
  };
  std::int64_t copies_;
  std::string index_field_;
};
