// Operators with several inputs (tf.data's zip, concatenate, sample_from_datasets and
// choose_from_datasets) and split, the deterministic train/evaluation split of a tee's branches.
#include <cmath>
#include <limits>
#include <numeric>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

std::string input_list(const CombineInputs& inputs) {
  std::string names;
  for (std::size_t k = 0; k < inputs.size(); ++k) names += (k ? ", '" : "'") + inputs.name(k) + "'";
  return names;
}

class Zip final : public Combine {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"zip",
                      OperatorKind::Combine,
                      "One element from each input, their fields merged (tf.data's zip); ends with the shortest input",
                      {ParamSpec::make("prefixes", ParamType::StringList,
                                       "one name per input, put before its fields as NAME/FIELD (empty: fields keep their "
                                       "names, and a field two inputs share is refused)")
                           .def("")},
                      {.saves_state = true},
                      {}};
    info.min_inputs = 2;
    info.max_inputs = kAnyNumberOfInputs;
    return info;
  }
  explicit Zip(const Params& p) : prefixes_(p.get_string_list("prefixes")) {}
  void start(const StageInfo& info) override {
    if (!prefixes_.empty() && prefixes_.size() != info.input_ids.size())
      throw ParamError("prefixes names " + std::to_string(prefixes_.size()) + " inputs, but the stage has " +
                       std::to_string(info.input_ids.size()) + "; give one per input, in order");
  }
  bool next(CombineInputs& inputs, Sample& merged) override {
    std::vector<std::size_t> first_field(inputs.size());  // where each input's fields start in the merged element
    std::vector<Origin> parts(inputs.size());
    merged = Sample();
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      Sample part;
      if (!inputs.next(k, part)) return false;  // the shortest input ended: so does the zip
      if (k == 0) merged.share_origin(part);
      parts[k] = part.shared_origin();
      first_field[k] = merged.size();
      for (auto& field : part.fields()) {
        std::string name = prefixes_.empty() ? field.name : prefixes_[k] + "/" + field.name;
        if (merged.find(name)) throw clash(inputs, first_field, merged, name, k, part);
        merged.set(std::move(name), std::move(field.tensor));
      }
    }
    // The element names the record of each input it was made of (lineage), as the first's.
    if (parts.front().where) {
      const Origin both = origin_of_parts(parts);
      merged.set_origin(both.where, both.record, both.byte_offset);
      merged.set_read_position(both.read_epoch, both.read_index);
    }
    return true;
  }
  // An output takes one element of each input: nothing is carried from one to the next.
  void save_state(StateWriter&) const override {}
  void restore_state(StateReader&) override {}

 private:
  // A field of input k that an earlier input gave already: the message names both inputs.
  static DataError clash(const CombineInputs& inputs, const std::vector<std::size_t>& first_field, const Sample& merged,
                         const std::string& name, std::size_t k, const Sample& part) {
    std::size_t at = 0;
    while (merged.fields()[at].name != name) ++at;
    std::size_t earlier = 0;
    while (earlier + 1 < k && first_field[earlier + 1] <= at) ++earlier;
    return DataError("zip: field '" + name + "' comes from input '" + inputs.name(earlier) + "' and from input '" +
                     inputs.name(k) + "'" + (part.has_origin() ? " (element from " + part.origin() + ")" : std::string()) +
                     "; set `prefixes` to one name per input (inputs " + input_list(inputs) + ") to keep both");
  }
  std::vector<std::string> prefixes_;
};

class Concatenate final : public Combine {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"concatenate", OperatorKind::Combine,
                      "All elements of the first input, then all of the second, and so on (tf.data's concatenate)", {},
                      {.keeps_shape = true, .saves_state = true}, {}};
    info.min_inputs = 2;
    info.max_inputs = kAnyNumberOfInputs;
    return info;
  }
  explicit Concatenate(const Params&) {}
  void start(const StageInfo& info) override { inputs_ = info.input_ids.size(); }
  void begin_iteration(const ElementContext&) override { input_ = 0; }
  bool next(CombineInputs& inputs, Sample& out) override {
    for (; input_ < inputs.size(); ++input_)
      if (inputs.next(input_, out)) return true;
    return false;
  }
  void save_state(StateWriter& w) const override { w.put<std::uint64_t>(input_); }
  void restore_state(StateReader& r) override { input_ = static_cast<std::size_t>(r.get_within<std::uint64_t>(0, inputs_, "the input being read")); }

 private:
  std::size_t input_ = 0;  // the input being read
  std::size_t inputs_ = 0;
};

ParamSpec stop_on_empty_param(bool stop) {
  return ParamSpec::make("stop_on_empty_dataset", ParamType::Bool,
                         "end the iteration as soon as a chosen input has run out (false: go on with the others)")
      .def(stop ? "true" : "false");
}

// Scales weights to sum to 1 without overflow (1e308 twice is a fair mixture, not an infinite
// total): each is divided by the largest first. A weight above 0 stays above 0, however small
// beside the others, so that its input is still read once the others run out.
void normalise(std::vector<double>& weights) {
  const double largest = weights.empty() ? 0 : *std::max_element(weights.begin(), weights.end());
  if (!(largest > 0)) return;
  double total = 0;
  for (double& w : weights) {
    const bool positive = w > 0;
    w /= largest;
    if (positive && w == 0) w = std::numeric_limits<double>::denorm_min();
    total += w;
  }
  for (double& w : weights) w = std::max(w / total, w > 0 ? std::numeric_limits<double>::denorm_min() : 0.0);
}

class SampleFromDatasets final : public Combine {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"sample_from_datasets",
                      OperatorKind::Combine,
                      "Picks the input of each element at random with the given weights (tf.data's sample_from_datasets); "
                      "the same seed gives the same mixture at any parallelism",
                      {ParamSpec::make("weights", ParamType::FloatList,
                                       "relative weight of each input, in order (empty: equal weights)")
                           .def(""),
                       stop_on_empty_param(false),
                       ParamSpec::make("seed", ParamType::Int, "seed for this stage's draws; -1 uses the pipeline's seed")
                           .def("-1")
                           .range(-1, std::nullopt),
                       ParamSpec::make("rerandomize_each_iteration", ParamType::Bool,
                                       "another mixture each epoch (false, tf.data's default: every epoch draws the same)")
                           .def("false")},
                      {.random = true, .keeps_shape = true, .saves_state = true},
                      {}};
    info.min_inputs = 2;
    info.max_inputs = kAnyNumberOfInputs;
    return info;
  }
  explicit SampleFromDatasets(const Params& p)
      : weights_(p.get_float_list("weights")),
        stop_on_empty_(p.get_bool("stop_on_empty_dataset")),
        seed_(p.get_int("seed")),
        rerandomize_(p.get_bool("rerandomize_each_iteration")) {
    double total = 0;
    for (std::size_t k = 0; k < weights_.size(); ++k) {
      if (!(weights_[k] >= 0) || !std::isfinite(weights_[k]))
        throw ParamError("weights[" + std::to_string(k) + "] is " + std::to_string(weights_[k]) + "; weights are 0 or more");
      total += weights_[k];
    }
    if (!weights_.empty() && !(total > 0)) throw ParamError("every weight is 0; give at least one input a weight above 0");
    normalise(weights_);
  }
  void start(const StageInfo& info) override {
    info_ = info;
    if (seed_ >= 0) info_.seed = static_cast<std::uint64_t>(seed_);
    if (weights_.empty()) weights_.assign(info.input_ids.size(), 1.0 / static_cast<double>(info.input_ids.size()));
    if (weights_.size() != info.input_ids.size())
      throw ParamError("weights has " + std::to_string(weights_.size()) + " values, but the stage has " +
                       std::to_string(info.input_ids.size()) + " inputs; give one weight per input, in order");
  }
  void begin_iteration(const ElementContext& iteration) override {
    epoch_ = iteration.epoch;
    live_ = weights_;
    n_ = 0;
  }
  bool next(CombineInputs& inputs, Sample& out) override {
    double total = std::accumulate(live_.begin(), live_.end(), 0.0);
    if (!(total > 0)) return false;
    Rng rng = ElementContext{&info_, rerandomize_ ? epoch_ : 0, n_}.rng();
    for (;;) {
      const double draw = rng.uniform() * total;
      std::size_t k = 0;
      double below = live_[0];
      while (k + 1 < live_.size() && (draw >= below || live_[k] == 0)) below += live_[++k];
      if (inputs.next(k, out)) {
        ++n_;
        return true;
      }
      if (stop_on_empty_) {
        live_.assign(live_.size(), 0.0);
        return false;
      }
      // tf.data renormalizes the remaining weights; drawing again from this element's
      // generator keeps the choice a function of (seed, epoch, n) and of which inputs ran out.
      // Summed again rather than subtracted: what is left is exactly the live inputs' weights, so
      // an input a million million times lighter than the one that ran out still gives all it has.
      live_[k] = 0;
      total = std::accumulate(live_.begin(), live_.end(), 0.0);
      if (!(total > 0)) return false;
    }
  }
  // The outputs given (they key the draws) and the inputs that ran out.
  void save_state(StateWriter& w) const override {
    w.put(epoch_);
    w.put(n_);
    w.put<std::uint64_t>(live_.size());
    for (double weight : live_) w.put(weight);
  }
  void restore_state(StateReader& r) override {
    epoch_ = r.get<std::uint64_t>();
    n_ = r.get<std::uint64_t>();
    const auto count = r.get<std::uint64_t>();
    if (count != weights_.size()) throw DataError("the saved mixture has " + std::to_string(count) + " inputs, this one " + std::to_string(weights_.size()));
    // An input either still has its weight or ran out: a saved weight says which, and the
    // configured one is taken back (any other value is a damaged state, and would skew the mix).
    live_.resize(static_cast<std::size_t>(count));
    for (std::size_t k = 0; k < live_.size(); ++k)
      live_[k] = r.get_within<double>(0, std::numeric_limits<double>::max(), "an input's weight") > 0 ? weights_[k] : 0.0;
  }

 private:
  StageInfo info_;
  std::uint64_t epoch_ = 0;   // of the iteration being made
  std::vector<double> live_;  // an input that ran out weighs 0 from then on
  std::uint64_t n_ = 0;       // outputs given in it: the n-th draws with ElementContext{epoch, n}
  std::vector<double> weights_;
  bool stop_on_empty_;
  std::int64_t seed_;  // -1: the pipeline's
  bool rerandomize_;   // key the draws by epoch (else every epoch draws as the first)
};

class ChooseFromDatasets final : public Combine {
 public:
  static OperatorInfo describe() {
    OperatorInfo info{"choose_from_datasets",
                      OperatorKind::Combine,
                      "The last input says which of the others gives each element (its `field`, an integer: 0 for the "
                      "first input); tf.data's choose_from_datasets",
                      {ParamSpec::make("field", ParamType::String, "the integer field of the last input's elements").def("index"),
                       stop_on_empty_param(true)},
                      {.keeps_shape = true, .saves_state = true},
                      {}};
    info.min_inputs = 2;
    info.max_inputs = kAnyNumberOfInputs;
    return info;
  }
  explicit ChooseFromDatasets(const Params& p) : field_(p.get_string("field")), stop_on_empty_(p.get_bool("stop_on_empty_dataset")) {}
  bool next(CombineInputs& inputs, Sample& out) override {
    const std::size_t choices = inputs.size() - 1, datasets = choices;
    Sample choice;
    while (inputs.next(choices, choice)) {
      const Tensor& t = choice.at(field_);
      std::int64_t k = -1;
      switch (t.dtype()) {
        case DType::U8: k = t.item<std::uint8_t>(); break;
        case DType::I16: k = t.item<std::int16_t>(); break;
        case DType::I32: k = t.item<std::int32_t>(); break;
        case DType::I64: k = t.item<std::int64_t>(); break;
        default:
          throw DataError("choose_from_datasets: field '" + field_ + "' of " + choice.origin() + " is " + dtype_name(t.dtype()) +
                          ", not an integer");
      }
      if (k < 0 || k >= static_cast<std::int64_t>(datasets))
        throw DataError("choose_from_datasets: choice " + std::to_string(k) + " from " + choice.origin() + " (input '" +
                        inputs.name(choices) + "') is out of range: there are " + std::to_string(datasets) +
                        " inputs to choose from, 0 to " + std::to_string(datasets - 1));
      if (inputs.next(static_cast<std::size_t>(k), out)) return true;
      if (stop_on_empty_) return false;
    }
    return false;
  }
  // Each output follows the next choice: nothing is carried from one to the next.
  void save_state(StateWriter&) const override {}
  void restore_state(StateReader&) override {}

 private:
  std::string field_;
  bool stop_on_empty_;
};

// Keeps the elements whose hash falls in [from, to): branches of a tee given [0, 0.9) and
// [0.9, 1) split the data between them, each element on one side only, the same in every run.
// The hash is the pipeline seed's, not the stage's, so that the branches agree.
class Split final : public Filter {
 public:
  static OperatorInfo describe() {
    return {"split",
            OperatorKind::Filter,
            "Keeps the elements whose hash (of `key`, else of the element's position) falls in [from, to): "
            "complementary ranges on two branches split the data between them",
            {ParamSpec::make("from", ParamType::Float, "start of the kept range of hashes, 0..1").def("0").range(0, 1),
             ParamSpec::make("to", ParamType::Float, "end of the kept range, from..1").def("1").range(0, 1),
             ParamSpec::make("key", ParamType::String,
                             "a field whose bytes decide the side (an element keeps its side when the order changes); "
                             "empty: the element's position in the iteration")
                 .def("")},
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  explicit Split(const Params& p) : from_(p.get_float("from")), to_(p.get_float("to")), key_(p.get_string("key")) {
    if (to_ < from_) throw ParamError("to (" + std::to_string(to_) + ") is below from (" + std::to_string(from_) + ")");
  }
  void start(const StageInfo& info) override { seed_ = info.seed; }
  bool keep(const Sample& in, const ElementContext& ctx) override {
    std::uint64_t h = 0;
    if (key_.empty()) {
      h = mix64(seed_ ^ mix64(ctx.index + 0x9e3779b97f4a7c15ull));
    } else {
      const Tensor& t = in.at(key_);
      const std::string_view bytes = t.dtype() == DType::Bytes && t.num_elements() == 1
                                         ? t.string_at(0)
                                         : std::string_view(reinterpret_cast<const char*>(t.raw_data()), t.nbytes());
      h = mix64(seed_ ^ stable_hash(bytes));
    }
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
    return u >= from_ && u < to_;
  }

 private:
  double from_, to_;
  std::string key_;
  std::uint64_t seed_ = 0;
};

}  // namespace

void register_combinators(Registrar& registrar) {
  registrar.add<Zip>();
  registrar.add<Concatenate>();
  registrar.add<SampleFromDatasets>();
  registrar.add<ChooseFromDatasets>();
  registrar.add<Split>();
}

}  // namespace sluice::std_ops
