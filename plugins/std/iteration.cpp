#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Iterations are the engine's: repeat(k) asks its input for k passes per iteration it gives, and
// the engine merges them. Elements pass through unchanged.
class Repeat final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"repeat",
            OperatorKind::Aggregate,
            "Repeats its input count times (-1: forever); a shuffle before it reshuffles each epoch",
            {ParamSpec::make("count", ParamType::Int, "number of passes, -1 for forever").def("-1").range(-1, std::nullopt)},
            {.keeps_shape = true},
            {}};
  }
  explicit Repeat(const Params& p) : count_(p.get_int("count")) {}
  std::int64_t input_passes(std::int64_t iterations) const override {
    if (iterations == 0 || count_ == 0) return 0;
    if (iterations == kUnbounded || count_ == kUnbounded) return kUnbounded;
    return iterations * count_;
  }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    out.push(std::move(in));
    return Flow::Continue;
  }

 private:
  std::int64_t count_;
};

class Take final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"take",
            OperatorKind::Aggregate,
            "Keeps the first count elements of each iteration and stops reading the rest",
            {ParamSpec::make("count", ParamType::Int, "elements to keep, -1 for all").def("-1").range(-1, std::nullopt)},
            {.keeps_shape = true},
            {}};
  }
  explicit Take(const Params& p) : count_(p.get_int("count")) {}
  void begin_iteration(std::uint64_t) override { taken_ = 0; }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (count_ >= 0 && taken_ >= count_) return Flow::SkipRestOfIteration;
    ++taken_;
    out.push(std::move(in));
    return (count_ >= 0 && taken_ >= count_) ? Flow::SkipRestOfIteration : Flow::Continue;
  }

 private:
  std::int64_t count_, taken_ = 0;
};

class Skip final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"skip",
            OperatorKind::Aggregate,
            "Drops the first count elements of each iteration",
            {ParamSpec::make("count", ParamType::Int, "elements to drop").def("0").range(0, std::nullopt)},
            {.keeps_shape = true},
            {}};
  }
  explicit Skip(const Params& p) : count_(p.get_int("count")) {}
  void begin_iteration(std::uint64_t) override { seen_ = 0; }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (seen_++ >= count_) out.push(std::move(in));
    return Flow::Continue;
  }

 private:
  std::int64_t count_, seen_ = 0;
};

}  // namespace

void register_iteration(Registrar& registrar) {
  registrar.add<Repeat>();
  registrar.add<Take>();
  registrar.add<Skip>();
}

}  // namespace sluice::std_ops
