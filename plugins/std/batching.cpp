#include <algorithm>
#include <cstring>

#include "sluice/memory_ops.hpp"
#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// One field of the batch being assembled. Numeric rows are copied in as elements arrive, while
// they are still in cache and so that each element's memory is freed at once (a batch of images
// otherwise holds twice its size); bytes are variable-length strings and are collected.
struct FieldAssembly {
  std::string name;
  DType dtype = DType::U8;
  Shape shape;  // of one element
  std::size_t row_bytes = 0;
  Tensor rows;  // numeric: [batch_size, shape...]
  std::vector<std::string> strings;
};

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
  void begin_iteration(std::uint64_t) override { reset(); }
  Flow push(Sample in, const ElementContext&, Emitter& out) override {
    if (count_ == 0) begin_batch(in);
    // Every field is checked before any is copied: a refused element leaves the batch as it was.
    std::vector<const Tensor*> tensors(fields_.size());
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      const FieldAssembly& field = fields_[f];
      const auto& have = in.fields();
      const Tensor* t = f < have.size() && have[f].name == field.name ? &have[f].tensor : in.find(field.name);
      if (!t)
        throw DataError("cannot batch: element " + std::to_string(count_) + " of the batch has no field '" + field.name + "'");
      if (t->dtype() != field.dtype || t->shape() != field.shape)
        throw DataError("cannot batch field '" + field.name + "': element 0 is " + dtype_name(field.dtype) + shape_string(field.shape) +
                        ", element " + std::to_string(count_) + " is " + dtype_name(t->dtype()) + shape_string(t->shape()) +
                        " (resize or pad them to one shape first)");
      tensors[f] = t;
    }
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      FieldAssembly& field = fields_[f];
      if (field.dtype == DType::Bytes) {
        for (std::int64_t k = 0; k < tensors[f]->num_elements(); ++k) field.strings.emplace_back(tensors[f]->string_at(k));
      } else {
        copy_to_cold(field.rows.raw_data() + count_ * field.row_bytes, tensors[f]->raw_data(), field.row_bytes);
      }
    }
    if (++count_ == batch_size_) emit_batch(out);
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, Emitter& out) override {
    if (count_ > 0 && !drop_remainder_) emit_batch(out);
    reset();
  }

 private:
  void begin_batch(const Sample& first) {
    fields_.clear();
    for (const auto& f : first.fields()) {
      FieldAssembly field;
      field.name = f.name;
      field.dtype = f.tensor.dtype();
      field.shape = f.tensor.shape();
      if (field.dtype == DType::Bytes) {
        field.strings.reserve(batch_size_ * static_cast<std::size_t>(std::max<std::int64_t>(1, f.tensor.num_elements())));
      } else {
        field.row_bytes = f.tensor.nbytes();
        Shape rows = field.shape;
        rows.insert(rows.begin(), static_cast<std::int64_t>(batch_size_));
        field.rows = Tensor::empty(field.dtype, rows, *allocator_);
      }
      fields_.push_back(std::move(field));
    }
    first_ = Sample();
    first_.share_origin(first);
  }
  void emit_batch(Emitter& out) {
    Sample batch;
    for (auto& field : fields_) {
      Shape shape = field.shape;
      shape.insert(shape.begin(), static_cast<std::int64_t>(count_));
      if (field.dtype == DType::Bytes) {
        std::vector<std::string_view> views(field.strings.begin(), field.strings.end());
        batch.set(field.name, Tensor::from_strings(views, shape));
      } else if (count_ == batch_size_) {
        batch.set(field.name, std::move(field.rows));
      } else {  // a short last batch: its rows are the first count_ of the buffer
        batch.set(field.name, Tensor::view(field.dtype, shape, field.rows.buffer(), field.rows.byte_offset()));
      }
    }
    batch.share_origin(first_);
    reset();
    out.push(std::move(batch));
  }
  void reset() {
    count_ = 0;
    fields_.clear();
    first_ = Sample();
  }

  std::size_t batch_size_;
  bool drop_remainder_;
  PooledHostAllocator pool_;
  Allocator* allocator_ = &pool_;
  std::vector<FieldAssembly> fields_;
  std::size_t count_ = 0;
  Sample first_;  // holds the batch's origin: its first element's
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
      out.share_origin(batch_);
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
