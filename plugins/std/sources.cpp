#include <cmath>
#include <cstdlib>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

class Range final : public Source {
 public:
  static OperatorInfo describe() {
    return {"range",
            OperatorKind::Source,
            "Emits the integers start, start+step, ... (count of them) as an int64 field 'value'",
            {ParamSpec::make("count", ParamType::Int, "how many integers to emit").def("10").range(0, std::nullopt),
             ParamSpec::make("start", ParamType::Int, "first integer").def("0"),
             ParamSpec::make("step", ParamType::Int, "difference between consecutive integers").def("1")},
            {.stateless = false, .random = false, .saves_state = true},
            {}};
  }
  explicit Range(const Params& p) : count_(p.get_int("count")), start_(p.get_int("start")), step_(p.get_int("step")) {
    // The last integer must be an int64 too: refused here rather than wrapping around mid-run.
    std::int64_t span = 0, last = 0;
    if (count_ > 0 && (__builtin_mul_overflow(step_, count_ - 1, &span) || __builtin_add_overflow(start_, span, &last)))
      throw ParamError("start + step * (count - 1) is beyond the 64-bit integer range (start " + std::to_string(start_) +
                       ", step " + std::to_string(step_) + ", count " + std::to_string(count_) + "): lower count or step");
  }
  void begin_pass(std::uint64_t) override { next_ = 0; }
  std::int64_t expected_elements() const override { return count_; }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= count_) return false;
    out.set("value", Tensor::scalar<std::int64_t>(start_ + step_ * next_++));
    return true;
  }
  void save_state(StateWriter& w) const override { w.put(next_); }
  void restore_state(StateReader& r) override { next_ = r.get_within<std::int64_t>(0, count_, "the next integer's number"); }

 private:
  std::int64_t count_, start_, step_, next_ = 0;
};

class FromList final : public Source {
 public:
  static OperatorInfo describe() {
    return {"from_list",
            OperatorKind::Source,
            "Emits the listed literal values, one element each, in a field (int64, float or bytes)",
            {ParamSpec::make("values", ParamType::StringList, "comma-separated values"),
             ParamSpec::make("dtype", ParamType::Choice, "type of the values; auto: int64 if all are integers, else float "
                                                         "if all are numbers, else bytes")
                 .def("auto")
                 .one_of({"auto", "int64", "float", "bytes"}),
             ParamSpec::make("field", ParamType::String, "name of the output field").def("value")},
            {.saves_state = true},
            {}};
  }
  explicit FromList(const Params& p) : values_(p.get_string_list("values")), field_(p.get_string("field")) {
    std::string dtype = p.get_string("dtype");
    if (dtype == "auto") {
      dtype = "int64";
      for (const auto& v : values_)
        if (!parses_int(v)) dtype = "float";
      if (dtype == "float")
        for (const auto& v : values_)
          if (!parses_float(v)) dtype = "bytes";
    }
    for (const auto& v : values_) {
      if (dtype == "int64" && !parses_int(v)) throw ParamError("value '" + v + "' is not an int64");
      if (dtype == "float" && !parses_float(v)) throw ParamError("value '" + v + "' is not a number");
    }
    dtype_ = dtype;
  }
  void begin_pass(std::uint64_t) override { next_ = 0; }
  std::int64_t expected_elements() const override { return static_cast<std::int64_t>(values_.size()); }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= values_.size()) return false;
    const std::string& v = values_[next_++];
    if (dtype_ == "int64") out.set(field_, Tensor::scalar<std::int64_t>(std::strtoll(v.c_str(), nullptr, 10)));
    else if (dtype_ == "float") out.set(field_, Tensor::scalar<float>(std::strtof(v.c_str(), nullptr)));
    else out.set(field_, Tensor::from_string(v));
    return true;
  }
  void save_state(StateWriter& w) const override { w.put<std::uint64_t>(next_); }
  void restore_state(StateReader& r) override {
    next_ = static_cast<std::size_t>(r.get_within<std::uint64_t>(0, values_.size(), "the next value's number"));
  }

 private:
  static bool parses_int(const std::string& s) {
    if (s.empty()) return false;
    char* end = nullptr;
    std::strtoll(s.c_str(), &end, 10);
    return end == s.c_str() + s.size();
  }
  static bool parses_float(const std::string& s) {
    if (s.empty()) return false;
    char* end = nullptr;
    std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
  }
  std::vector<std::string> values_;
  std::string field_, dtype_;
  std::size_t next_ = 0;
};

// Numeric tensors of one shape, as fast as memory can be written: the input of benchmarks of
// what comes after (a GPU feed, a batch), and of tests. Element i holds the bytes
// (i * 2654435761 + k) >> 3 at byte k, plus an int64 'index' field.
class Tensors final : public Source {
 public:
  static OperatorInfo describe() {
    return {"tensors",
            OperatorKind::Source,
            "Emits count elements with a numeric field of the given shape and dtype (deterministic bytes) and an int64 'index'",
            {ParamSpec::make("count", ParamType::Int, "how many elements to emit").def("100").range(0, std::nullopt),
             ParamSpec::make("shape", ParamType::IntList, "shape of each element's tensor").def("224,224,3").range(1, 1e9),
             ParamSpec::make("dtype", ParamType::Choice, "element type").one_of({"u8", "i32", "i64", "f32", "f64"}).def("f32"),
             ParamSpec::make("field", ParamType::String, "name of the tensor field").def("data")},
            {.saves_state = true},
            {}};
  }
  explicit Tensors(const Params& p)
      : count_(p.get_int("count")), shape_(p.get_int_list("shape")), field_(p.get_string("field")) {
    const std::string& t = p.get_string("dtype");
    dtype_ = t == "u8" ? DType::U8 : t == "i32" ? DType::I32 : t == "i64" ? DType::I64 : t == "f64" ? DType::F64 : DType::F32;
    if (shape_elements(shape_) * static_cast<std::int64_t>(dtype_size(dtype_)) > (std::int64_t{1} << 32))
      throw ParamError("shape: " + shape_string(shape_) + " of " + dtype_name(dtype_) + " is over 4 GiB per element");
  }
  void start(const StageInfo& info) override { allocator_ = info.allocator; }
  void begin_pass(std::uint64_t) override { next_ = 0; }
  std::int64_t expected_elements() const override { return count_; }
  bool next(Sample& out, const ElementContext&) override {
    if (next_ >= count_) return false;
    const std::int64_t i = next_++;
    Tensor t = Tensor::empty(dtype_, shape_, *allocator_);
    auto* bytes = t.raw_data();
    const std::uint64_t seed = static_cast<std::uint64_t>(i) * 2654435761u;
    for (std::size_t k = 0; k < t.nbytes(); ++k) bytes[k] = static_cast<std::byte>((seed + k) >> 3);
    out.set(field_, std::move(t));
    out.set("index", Tensor::scalar<std::int64_t>(i));
    return true;
  }
  void save_state(StateWriter& w) const override { w.put(next_); }
  void restore_state(StateReader& r) override { next_ = r.get_within<std::int64_t>(0, count_, "the next element's number"); }

 private:
  std::int64_t count_;
  Shape shape_;
  std::string field_;
  DType dtype_ = DType::F32;
  Allocator* allocator_ = &HostAllocator::instance();
  std::int64_t next_ = 0;
};

}  // namespace

void register_sources(Registrar& registrar) {
  registrar.add<Range>();
  registrar.add<FromList>();
  registrar.add<Tensors>();
}

}  // namespace sluice::std_ops
