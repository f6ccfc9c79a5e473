#pragma once
// @NAME@: a sink (consumes the elements). Writes the int64 field `field` of each element as a
// line of text to `path`, atomically: the file appears, complete, only when the run finishes.
#include "sluice/sdk.hpp"

class @CLASS@ final : public sluice::Sink {
 public:
  // Everything the host knows without running the operator: the CLI's help, validation and the
  // studio's inspector come from this schema. An output-path parameter: validation refuses two
  // stages writing one file, and the studio offers a save dialog.
  static sluice::OperatorInfo describe() {
    return {"@NAME@",
            sluice::OperatorKind::Sink,
            "@SUMMARY@",
            {sluice::ParamSpec::make("path", sluice::ParamType::OutputPath, "the text file written"),
             sluice::ParamSpec::make("field", sluice::ParamType::String, "the int64 field written").def("value")},
            {},
            {}};
  }
  // Constructors check parameters and stay cheap: the host builds one when it loads the plugin
  // (a required parameter is then empty). The file is opened in start().
  explicit @CLASS@(const sluice::Params& params) : path_(params.get_string("path")), field_(params.get_string("field")) {}
  void start(const sluice::StageInfo&) override {
    if (path_.empty()) throw sluice::ParamError("path is empty: name the file to write");
    file_.open(path_);  // a temporary name beside it, renamed over it at the end
  }
  void consume(sluice::Sample in, const sluice::ElementContext&) override {
    const sluice::Tensor& value = in.at(field_);
    if (value.dtype() != sluice::DType::I64 || value.num_elements() != 1)
      throw sluice::DataError("@NAME@: field '" + field_ + "' is " + sluice::dtype_name(value.dtype()) + sluice::shape_string(value.shape()) +
                              ", not one int64");
    file_.write(std::to_string(value.item<std::int64_t>()) + "\n");
  }
  // complete is false when the run stopped early or failed: no file that looks complete is left.
  void finish(bool complete) override {
    if (!file_.is_open()) return;
    if (complete) file_.commit();
    else file_.abandon(/*keep=*/false);
  }

 private:
  std::string path_, field_;
  sluice::AtomicOutputFile file_;
};
