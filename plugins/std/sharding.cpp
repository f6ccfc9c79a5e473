// The shard family: a job's workers each keep their own share of the elements. `shard` keeps
// every num_shards-th element (tf.data's shard); `balanced_shard` does so with the same count on
// every worker. Worker plans add one of them, found by its role (OperatorRole::Shards, ShardsEvenly).
#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Keeps elements index, index + n, ... of every iteration: a pure function of the element's
// position, so it runs with any parallelism and gives disjoint, complete shards. Left unset (or
// -1), the count and index are the worker's: the host fills parameters taking these hints from
// the process's worker identity (Slurm, MPI, TF_CONFIG, torchrun, --worker-index).
class Shard final : public Filter {
 public:
  static OperatorInfo describe() {
    return {"shard",
            OperatorKind::Filter,
            "Keeps every num_shards-th element starting at index (put it early, before shuffle)",
            {shard_count_param(), shard_index_param()},
            {.stateless = true, .keeps_shape = true, .role = OperatorRole::Shards},
            {}};
  }
  explicit Shard(const Params& p) : shards_(shard_count(p)), index_(shard_index(p, shards_)) {}
  bool keep(const Sample&, const ElementContext& ctx) override {
    return static_cast<std::int64_t>(ctx.index % static_cast<std::uint64_t>(shards_)) == index_;
  }

 private:
  std::int64_t shards_, index_;
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
            {.keeps_shape = true, .saves_state = true, .role = OperatorRole::ShardsEvenly},
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

}  // namespace

void register_sharding(Registrar& registrar) {
  registrar.add<Shard>();
  registrar.add<BalancedShard>();
}

}  // namespace sluice::std_ops
