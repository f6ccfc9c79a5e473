#include <cstring>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Stacks the same field of every sample along a new first dimension. Numeric fields must agree
// in dtype and shape; bytes fields may differ in length (they are variable-length strings).
Tensor stack_field(const std::vector<Sample>& samples, std::size_t field, Allocator& allocator) {
  const Field& first = samples[0].fields()[field];
  const Tensor& t0 = first.tensor;
  for (std::size_t i = 1; i < samples.size(); ++i) {
    const auto& fields = samples[i].fields();
    const Tensor* t = field < fields.size() && fields[field].name == first.name ? &fields[field].tensor
                                                                                : samples[i].find(first.name);
    if (!t) throw DataError("cannot batch: element " + std::to_string(i) + " of the batch has no field '" + first.name + "'");
    if (t->dtype() != t0.dtype() || t->shape() != t0.shape())
      throw DataError("cannot batch field '" + first.name + "': element 0 is " + dtype_name(t0.dtype()) +
                      shape_string(t0.shape()) + ", element " + std::to_string(i) + " is " + dtype_name(t->dtype()) +
                      shape_string(t->shape()) + " (resize or pad them to one shape first)");
  }
  Shape shape = t0.shape();
  shape.insert(shape.begin(), static_cast<std::int64_t>(samples.size()));
  auto field_of = [&](std::size_t i) -> const Tensor& {
    const auto& fields = samples[i].fields();
    return field < fields.size() && fields[field].name == first.name ? fields[field].tensor : *samples[i].find(first.name);
  };
  if (t0.dtype() == DType::Bytes) {
    std::vector<std::string_view> strings;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const Tensor& t = field_of(i);
      for (std::int64_t k = 0; k < t.num_elements(); ++k) strings.push_back(t.string_at(k));
    }
    return Tensor::from_strings(strings, shape);
  }
  Tensor out = Tensor::empty(t0.dtype(), shape, allocator);
  const std::size_t row = t0.nbytes();
  for (std::size_t i = 0; i < samples.size(); ++i) std::memcpy(out.raw_data() + i * row, field_of(i).raw_data(), row);
  return out;
}

class Batch final : public Aggregate {
 public:
  static OperatorInfo describe() {
    return {"batch",
            OperatorKind::Aggregate,
            "Stacks batch_size consecutive elements into one, field by field, along a new first dimension",
            {ParamSpec::make("batch_size", ParamType::Int, "elements per batch").range(1, 1e9),
             ParamSpec::make("drop_remainder", ParamType::Bool, "drop the short last batch of each iteration").def("false")},
            {},
            {}};
  }
  explicit Batch(const Params& p)
      : batch_size_(static_cast<std::size_t>(p.get_int("batch_size"))), drop_remainder_(p.get_bool("drop_remainder")) {}
  // Batches are large and made at a steady rate: reuse their memory (fresh pages cost far more
  // than reused ones), unless a downstream stage offered its own allocator (pinned memory).
  void start(const StageInfo& info) override {
    allocator_ = std::string(info.allocator->name()) == "host" ? static_cast<Allocator*>(&pool_) : info.allocator;
  }
  void begin_iteration(std::uint64_t) override { pending_.clear(); }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    pending_.push_back(std::move(in));
    if (pending_.size() == batch_size_) emit_batch(out);
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    if (!pending_.empty() && !drop_remainder_) emit_batch(out);
    pending_.clear();
  }

 private:
  void emit_batch(Emitter& out) {
    std::vector<Sample> samples;
    samples.swap(pending_);
    Sample batch;
    for (std::size_t f = 0; f < samples[0].fields().size(); ++f)
      batch.set(samples[0].fields()[f].name, stack_field(samples, f, *allocator_));
    batch.set_origin(samples.front().origin());
    out.push(std::move(batch));
    pending_.reserve(batch_size_);
  }

  std::size_t batch_size_;
  bool drop_remainder_;
  PooledHostAllocator pool_;
  Allocator* allocator_ = &pool_;
  std::vector<Sample> pending_;
};

class Unbatch final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"unbatch", OperatorKind::Expand, "Splits each element along its first dimension into separate elements", {},
            {.stateless = true}, {}};
  }
  explicit Unbatch(const Params&) {}

  class Rows final : public ExpandCursor {
   public:
    explicit Rows(Sample batch) : batch_(std::move(batch)) {
      for (const auto& f : batch_.fields()) {
        if (f.tensor.rank() == 0) throw DataError("cannot unbatch field '" + f.name + "': it is a scalar");
        if (rows_ >= 0 && f.tensor.shape()[0] != rows_)
          throw DataError("cannot unbatch: field '" + f.name + "' has " + std::to_string(f.tensor.shape()[0]) +
                          " rows, others " + std::to_string(rows_));
        rows_ = f.tensor.shape()[0];
      }
    }
    bool next(Sample& out) override {
      if (next_ >= rows_) return false;
      out = Sample();
      for (const auto& f : batch_.fields()) out.set(f.name, f.tensor.row(next_));
      out.set_origin(batch_.origin());
      ++next_;
      return true;
    }

   private:
    Sample batch_;
    std::int64_t rows_ = -1, next_ = 0;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext&, DamageReport&) override {
    return std::make_unique<Rows>(std::move(in));
  }
};

}  // namespace

void register_batching(Registrar& registrar) {
  registrar.add<Batch>();
  registrar.add<Unbatch>();
}

}  // namespace sluice::std_ops
