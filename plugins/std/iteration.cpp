#include <optional>

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
            {.keeps_shape = true, .saves_state = true},
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
            {.keeps_shape = true, .saves_state = true},
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
            {.keeps_shape = true, .saves_state = true},
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

// shard, with the same number of elements per iteration on every shard: synchronous training
// waits for every worker at every step, and a worker with one batch fewer hangs the others at the
// end of an epoch. Each worker sees every element's position, so it knows, without talking to the
// others, whether its last element is one more than some shard gets (drop: held back until the
// round of num_shards positions it belongs to is complete) or one fewer than some shard gets (pad:
// its first element of the iteration again).
class BalancedShard final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"balanced_shard",
            OperatorKind::Aggregate,
            "shard that gives every shard the same number of elements per iteration (drop the excess or pad by repeating)",
            {shard_count_param(), shard_index_param(),
             ParamSpec::make("equal_steps", ParamType::Choice, "drop: every shard gets the fewest; pad: every shard gets the most")
                 .def("drop")
                 .one_of({"drop", "pad"})},
            {.keeps_shape = true, .saves_state = true},
            {}};
  }
  explicit BalancedShard(const Params& p)
      : shards_(static_cast<std::uint64_t>(shard_count(p))),
        index_(static_cast<std::uint64_t>(shard_index(p, static_cast<std::int64_t>(shards_)))),
        pad_(p.get_string("equal_steps") == "pad") {}
  void begin_iteration(std::uint64_t) override {
    held_.reset();
    first_.reset();
    first_is_own_ = false;
    seen_ = given_ = 0;
  }
  Flow push(Sample in, const ElementContext& ctx, Emitter& out) override {
    seen_ = std::max(seen_, ctx.index + 1);
    if (held_ && ctx.index >= held_round_end_) release(out);
    if (ctx.index % shards_ != index_) {
      if (pad_ && !first_) first_ = std::move(in);  // padding for a shard that gets nothing of its own
      return Flow::Continue;
    }
    if (pad_) {
      if (!first_ || !first_is_own_) first_ = in, first_is_own_ = true;
      ++given_;
      out.push(std::move(in));
      return Flow::Continue;
    }
    held_ = std::move(in);
    held_round_end_ = ctx.index - index_ + shards_ - 1;  // the last position of its round
    if (ctx.index >= held_round_end_) release(out);
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    held_.reset();  // its round is incomplete: some shard has one element fewer
    if (pad_ && first_) {
      const std::uint64_t most = (seen_ + shards_ - 1) / shards_;
      while (given_ < most) {
        ++given_;
        if (!out.push(*first_)) break;
      }
    }
    first_.reset();
    first_is_own_ = false;
  }
  void save_state(StateWriter& w) const override {
    for (const auto* held : {&held_, &first_}) {
      w.put<std::uint8_t>(held->has_value());
      if (*held) w.put_element(**held);
    }
    w.put<std::uint8_t>(first_is_own_);
    w.put(held_round_end_);
    w.put(seen_);
    w.put(given_);
  }
  void restore_state(StateReader& r) override {
    for (auto* held : {&held_, &first_}) {
      held->reset();
      if (r.get<std::uint8_t>()) *held = r.get_element();
    }
    first_is_own_ = r.get<std::uint8_t>() != 0;
    held_round_end_ = r.get<std::uint64_t>();
    seen_ = r.get<std::uint64_t>();
    given_ = r.get<std::uint64_t>();
  }

 private:
  void release(Emitter& out) {
    out.push(std::move(*held_));
    held_.reset();
  }
  std::uint64_t shards_, index_;
  bool pad_;
  std::optional<Sample> held_, first_;
  bool first_is_own_ = false;
  std::uint64_t held_round_end_ = 0, seen_ = 0, given_ = 0;
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
  registrar.add<BalancedShard>();
  registrar.add<RepeatEach>();
}

}  // namespace sluice::std_ops
