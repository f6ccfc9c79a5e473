#include <ctime>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

class Identity final : public Map {
 public:
  static OperatorInfo describe() {
    return {"identity", OperatorKind::Map, "Passes every element through unchanged (for benchmarks and tests)", {},
            {.stateless = true, .keeps_shape = true}, {}};
  }
  explicit Identity(const Params&) {}
  Sample map(Sample in, const ElementContext&) override { return in; }
};

class Prefetch final : public Map {
 public:
  static OperatorInfo describe() {
    return {"prefetch",
            OperatorKind::Map,
            "Decouples producer and consumer with a buffer of buffer_size elements (put it last)",
            {ParamSpec::make("buffer_size", ParamType::Int, "elements held ready for the consumer").def("8").range(1, 1e7)},
            {.stateless = true, .keeps_shape = true, .role = OperatorRole::Prefetches},
            {}};
  }
  explicit Prefetch(const Params& p) : buffer_(static_cast<std::size_t>(p.get_int("buffer_size"))) {}
  Sample map(Sample in, const ElementContext&) override { return in; }
  std::size_t preferred_buffer() const override { return buffer_; }

 private:
  std::size_t buffer_;
};

// z-scores of numeric columns with statistics known beforehand (a previous pass over the data, a
// sensor's calibration): what tabular and sensor pipelines do before writing training records.
class Standardize final : public Map {
 public:
  static OperatorInfo describe() {
    return {"standardize",
            OperatorKind::Map,
            "Replaces numeric fields by (value - mean) / std as f32, with a mean and std per field",
            {ParamSpec::make("fields", ParamType::StringList, "the fields to standardize, comma-separated"),
             ParamSpec::make("mean", ParamType::FloatList, "one mean per field"),
             ParamSpec::make("std", ParamType::FloatList, "one standard deviation per field (> 0)")},
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  explicit Standardize(const Params& p)
      : fields_(p.get_string_list("fields")), mean_(p.get_float_list("mean")), std_(p.get_float_list("std")) {
    if (fields_.empty()) throw ParamError("fields is empty; name at least one numeric field");
    if (mean_.size() != fields_.size() || std_.size() != fields_.size())
      throw ParamError("give one mean and one std per field: " + std::to_string(fields_.size()) + " fields, " +
                       std::to_string(mean_.size()) + " means, " + std::to_string(std_.size()) + " stds");
    for (std::size_t i = 0; i < std_.size(); ++i)
      if (!(std_[i] > 0)) throw ParamError("std of field '" + fields_[i] + "' is " + std::to_string(std_[i]) + "; it must be above 0");
  }
  Sample map(Sample in, const ElementContext&) override {
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      const Tensor* t = in.find(fields_[i]);
      if (!t) throw DataError("standardize: the element has no field '" + fields_[i] + "'");
      Tensor out = Tensor::empty(DType::F32, t->shape());
      float* to = out.data<float>();
      const std::size_t n = static_cast<std::size_t>(t->num_elements());
      const double mean = mean_[i], inv = 1.0 / std_[i];
      auto convert = [&](const auto* from) {
        for (std::size_t k = 0; k < n; ++k) to[k] = static_cast<float>((static_cast<double>(from[k]) - mean) * inv);
      };
      switch (t->dtype()) {
        case DType::U8: convert(t->data<std::uint8_t>()); break;
        case DType::I16: convert(t->data<std::int16_t>()); break;
        case DType::I32: convert(t->data<std::int32_t>()); break;
        case DType::I64: convert(t->data<std::int64_t>()); break;
        case DType::F32: convert(t->data<float>()); break;
        case DType::F64: convert(t->data<double>()); break;
        default:
          throw DataError("standardize: field '" + fields_[i] + "' is " + dtype_name(t->dtype()) +
                          ", not a number it can standardize (u8, i16, i32, i64, f32, f64)");
      }
      in.set(fields_[i], std::move(out));
    }
    return in;
  }

 private:
  std::vector<std::string> fields_;
  std::vector<double> mean_, std_;
};

class FilterRandom final : public Filter {
 public:
  static OperatorInfo describe() {
    return {"filter_random",
            OperatorKind::Filter,
            "Keeps each element with probability p, decided by the per-element generator (deterministic)",
            {ParamSpec::make("p", ParamType::Float, "probability of keeping an element").def("0.5").range(0, 1)},
            {.stateless = true, .random = true, .keeps_shape = true},
            {}};
  }
  explicit FilterRandom(const Params& p) : p_(p.get_float("p")) {}
  bool keep(const Sample&, const ElementContext& ctx) override { return ctx.rng().bernoulli(p_); }

 private:
  double p_;
};

// Burns CPU rather than sleeping, so that it competes for cores the way real decoding does.
class SimulateWork final : public Map {
 public:
  static OperatorInfo describe() {
    return {"simulate_work",
            OperatorKind::Map,
            "Burns us microseconds of CPU per element (plus a random 0..jitter_us), passing it through",
            {ParamSpec::make("us", ParamType::Int, "CPU microseconds per element").def("100").range(0, 1e8),
             ParamSpec::make("jitter_us", ParamType::Int, "extra random microseconds, drawn per element").def("0").range(0, 1e8),
             ParamSpec::make("later_us", ParamType::Int, "CPU microseconds per element from element later_from of each iteration on")
                 .def("0")
                 .range(0, 1e8),
             ParamSpec::make("later_from", ParamType::Int, "the element index where later_us takes over; -1: never").def("-1").range(-1, std::nullopt)},
            {.stateless = true, .random = true, .keeps_shape = true},
            {}};
  }
  explicit SimulateWork(const Params& p)
      : us_(p.get_int("us")), jitter_us_(p.get_int("jitter_us")), later_us_(p.get_int("later_us")), later_from_(p.get_int("later_from")) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    std::int64_t us = later_from_ >= 0 && ctx.index >= static_cast<std::uint64_t>(later_from_) ? later_us_ : us_;
    if (jitter_us_ > 0) us += static_cast<std::int64_t>(ctx.rng().below(static_cast<std::uint64_t>(jitter_us_) + 1));
    // The thread's CPU time, not the wall clock: work that waits for a core takes longer, as real
    // work does, so more workers than cores buy nothing.
    const std::int64_t until = thread_cpu_ns() + us * 1000;
    volatile std::uint64_t sink = 0;
    while (thread_cpu_ns() < until)
      for (int i = 0; i < 256; ++i) sink = sink + static_cast<std::uint64_t>(i);
    return in;
  }

 private:
  static std::int64_t thread_cpu_ns() {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  }
  std::int64_t us_, jitter_us_, later_us_, later_from_;
};

}  // namespace

void register_elementwise(Registrar& registrar) {
  registrar.add<Identity>();
  registrar.add<Prefetch>();
  registrar.add<Standardize>();
  registrar.add<FilterRandom>();
  registrar.add<SimulateWork>();
}

}  // namespace sluice::std_ops
