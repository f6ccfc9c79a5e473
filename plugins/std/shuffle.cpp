#include <optional>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// tf.data's algorithm: hold buffer_size elements; each new element replaces a uniformly chosen
// one, which is emitted; at the end of an iteration the rest leave in random order.
class Shuffle final : public Aggregate, public HandsOnItsInputs, public HoldsOnlyElements {
 public:
  static OperatorInfo describe() {
    return {"shuffle",
            OperatorKind::Aggregate,
            "Shuffles through a buffer of buffer_size elements (as large as the dataset for a full shuffle)",
            {ParamSpec::make("buffer_size", ParamType::Int, "elements held and drawn from").range(1, 1e9),
             ParamSpec::make("seed", ParamType::Int, "seed for this stage; -1 uses the pipeline's seed").def("-1").range(-1, std::nullopt),
             ParamSpec::make("reshuffle_each_iteration", ParamType::Bool, "a different order in each epoch").def("true")},
            {.stateless = false, .random = true, .keeps_shape = true, .saves_state = true},
            {}};
  }
  explicit Shuffle(const Params& p)
      : buffer_size_(static_cast<std::size_t>(p.get_int("buffer_size"))),
        seed_(p.get_int("seed")),
        reshuffle_(p.get_bool("reshuffle_each_iteration")) {}

  void start(const StageInfo& info) override { info_ = info; }
  void begin_iteration(std::uint64_t epoch) override {
    const std::uint64_t seed = seed_ >= 0 ? static_cast<std::uint64_t>(seed_) : info_.seed;
    rng_.emplace(seed, info_.stage_hash, reshuffle_ ? epoch : 0, 0);
    buffer_.clear();
  }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    buffer_.push_back(std::move(in));
    if (buffer_.size() >= buffer_size_) emit_one(out);
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    while (!buffer_.empty())
      if (!emit_one(out)) break;
    buffer_.clear();
  }
  // The generator's place and the elements held, in their order in the buffer.
  void save_state(StateWriter& w) const override {
    w.put<std::uint8_t>(rng_.has_value());
    if (rng_) w.put(*rng_);
    w.put<std::uint64_t>(buffer_.size());
    for (const auto& s : buffer_) w.put_element(s);
    w.describe(std::to_string(buffer_.size()) + " of " + std::to_string(buffer_size_) + " elements held");
  }
  void restore_state(StateReader& r) override {
    rng_.reset();
    if (r.get<std::uint8_t>()) rng_ = r.get<Rng>();
    const auto held = r.get<std::uint64_t>();
    if (held > buffer_size_) throw DataError("the saved buffer holds " + std::to_string(held) + " elements, more than buffer_size");
    buffer_.clear();
    buffer_.reserve(static_cast<std::size_t>(held));
    for (std::uint64_t i = 0; i < held; ++i) buffer_.push_back(r.get_element());
  }

 private:
  bool emit_one(Emitter& out) {
    std::size_t pick = static_cast<std::size_t>(rng_->below(buffer_.size()));
    Sample chosen = std::move(buffer_[pick]);
    buffer_[pick] = std::move(buffer_.back());
    buffer_.pop_back();
    return out.push(std::move(chosen));
  }

  std::size_t buffer_size_;
  std::int64_t seed_;
  bool reshuffle_;
  StageInfo info_;
  std::optional<Rng> rng_;
  std::vector<Sample> buffer_;
};

}  // namespace

void register_shuffle(Registrar& registrar) { registrar.add<Shuffle>(); }

}  // namespace sluice::std_ops
