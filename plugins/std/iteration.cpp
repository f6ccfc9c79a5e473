#include <optional>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Iterations are the engine's: repeat(k) asks its input for k passes per iteration it gives, and
// the engine merges them. Elements pass through unchanged: its role says so, and the host hands
// them on (a reader's chunks whole) without calling push(), which an older host calls.
class Repeat final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"repeat",
            OperatorKind::Aggregate,
            "Repeats its input count times (-1: forever); a shuffle before it reshuffles each epoch",
            {ParamSpec::make("count", ParamType::Int, "number of passes, -1 for forever").def("-1").range(-1, std::nullopt)},
            {.keeps_shape = true, .saves_state = true, .role = OperatorRole::Repeats},
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
  // Its passes are the engine's positions: nothing of its own to save.
  void save_state(StateWriter&) const override {}
  void restore_state(StateReader&) override {}

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
            {.keeps_shape = true, .saves_state = true, .role = OperatorRole::Takes},
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
  void save_state(StateWriter& w) const override { w.put(taken_); }
  void restore_state(StateReader& r) override {
    taken_ = r.get_within<std::int64_t>(0, count_ >= 0 ? count_ : std::numeric_limits<std::int64_t>::max(), "the elements taken");
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
            {.keeps_shape = true, .saves_state = true, .role = OperatorRole::Skips},
            {}};
  }
  explicit Skip(const Params& p) : count_(p.get_int("count")) {}
  void begin_iteration(std::uint64_t) override { seen_ = 0; }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (seen_++ >= count_) out.push(std::move(in));
    return Flow::Continue;
  }
  void save_state(StateWriter& w) const override { w.put(seen_); }
  void restore_state(StateReader& r) override { seen_ = r.get_within<std::int64_t>(0, std::numeric_limits<std::int64_t>::max(), "the elements seen"); }

 private:
  std::int64_t count_, seen_ = 0;
};

// Each element `count` times in a row: what tf.data writes as
// interleave(lambda *x: Dataset.from_tensors(x).repeat(count)), and sluice.data builds as an
// interleave of this stage. The copies share the element's tensors; copy k is its record k, so a
// checkpoint names it and a resumed run seeks to it.
class RepeatEach final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"repeat_each",
            OperatorKind::Expand,
            "Gives each element count times in a row (-1: forever); interleaved, the copies of several elements alternate",
            {ParamSpec::make("count", ParamType::Int, "copies of each element, -1 for forever").def("1").range(-1, std::nullopt)},
            {.stateless = true},
            {}};
  }
  explicit RepeatEach(const Params& p) : count_(p.get_int("count")) {}

  class Copies final : public ExpandCursor {
   public:
    Copies(Sample in, std::int64_t count) : in_(std::move(in)), count_(count) {}
    bool next(Sample& out) override {
      if (count_ != kUnbounded && next_ >= count_) return false;
      out = in_;
      out.set_origin(in_.shared_origin().where, next_++, 0);
      return true;
    }
    bool seek(std::int64_t record, std::int64_t) override {
      if (record < 0 || (count_ != kUnbounded && record >= count_)) return false;
      next_ = record;
      return true;
    }

   private:
    Sample in_;
    std::int64_t count_, next_ = 0;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext&, DamageReport&) override {
    return std::make_unique<Copies>(std::move(in), count_);
  }

 private:
  std::int64_t count_;
};

}  // namespace

void register_iteration(Registrar& registrar) {
  registrar.add<Repeat>();
  registrar.add<Take>();
  registrar.add<Skip>();
  registrar.add<RepeatEach>();
}

}  // namespace sluice::std_ops
