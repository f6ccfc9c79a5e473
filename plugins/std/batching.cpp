#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "sluice/memory_ops.hpp"
#include "sluice/origin_rows.hpp"
#include "sluice/row_origins.hpp"
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
  // Bytes: the strings one after another, and where each ends (no allocation per string).
  std::string bytes;
  std::vector<std::uint64_t> ends;
  void add_string(std::string_view s) {
    bytes.append(s);
    ends.push_back(bytes.size());
  }
  std::vector<std::string_view> strings() const {
    std::vector<std::string_view> views;
    views.reserve(ends.size());
    std::uint64_t begin = 0;
    for (auto end : ends) {
      views.emplace_back(bytes.data() + begin, end - begin);
      begin = end;
    }
    return views;
  }
};

// Stacks elements into batches. The map before it may build each element's large fields straight
// into their rows (Placement: tf.data's map-and-batch fusion), on the worker that made them: the
// batch then has nothing to copy for them. Rows are handed out by element index, which is the
// element's position in deterministic runs; an element that lands elsewhere (an element before
// it was dropped) is copied from where it was built, which is always a later row or batch.
//
// Its chunked form copies runs of rows column by column: a chunk's rows of a fixed-size field lie
// one after another, as they do in the batch.
class Batch final : public Aggregate, public Placement, public ChunkedAggregate, public HoldsOnlyElements, public StacksItsInputs {
 public:
  static OperatorInfo describe() {
    return {"batch",
            OperatorKind::Aggregate,
            "Stacks batch_size consecutive elements into one, field by field, along a new first dimension",
            {ParamSpec::make("batch_size", ParamType::Int, "elements per batch").range(1, 1e9),
             ParamSpec::make("drop_remainder", ParamType::Bool, "drop the short last batch of each iteration").def("false")},
            {.saves_state = true, .role = OperatorRole::Batches},
            {}};
  }
  explicit Batch(const Params& p)
      : batch_size_(static_cast<std::size_t>(p.get_int("batch_size"))), drop_remainder_(p.get_bool("drop_remainder")) {}
  // Batches are large and made at a steady rate: reuse their memory (fresh pages cost far more
  // than reused ones), unless a downstream stage offered its own allocator (pinned memory).
  void start(const StageInfo& info) override {
    allocator_ = std::string(info.allocator->name()) == "host" ? static_cast<Allocator*>(&pool_) : info.allocator;
  }
  void begin_iteration(std::uint64_t) override {
    reset();
    number_ = 0;
  }
  Placement* offered_placement() override { return this; }
  std::uint64_t inputs_per_output() const override { return batch_size_; }

  Tensor place(std::uint64_t epoch, std::uint64_t index, const std::string& field, DType dtype, const Shape& shape) override {
    if (dtype == DType::Bytes) return {};
    std::lock_guard lock(placed_mutex_);
    const std::uint64_t number = index / batch_size_;
    // Batches already emitted take nothing more; nor do those too far ahead (bounded memory).
    if (epoch < done_epoch_ || (epoch == done_epoch_ && number < done_batches_) || placed_.size() >= kMaxBlocksAhead) return {};
    const Tensor* rows = block_for(epoch, number, field, dtype, shape);
    if (!rows) return {};
    const std::size_t row_bytes = rows->nbytes() / batch_size_;
    return Tensor::view(dtype, shape, rows->buffer(), rows->byte_offset() + (index % batch_size_) * row_bytes);
  }

  Flow push(Sample in, const ElementContext& ctx, Emitter& out) override {
    if (count_ == 0) {
      begin_batch(in, ctx.epoch);
      first_index_ = ctx.index;
    }
    add_row(in);
    if (++count_ == batch_size_) emit_batch(out);
    return Flow::Continue;
  }
  // Every field is checked before any is copied: a refused element leaves the batch as it was.
  void add_row(const Sample& in) {
    std::vector<const Tensor*> tensors(fields_.size());
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      const FieldAssembly& field = fields_[f];
      const auto& have = in.fields();
      const Tensor* t = f < have.size() && have[f].name == field.name ? &have[f].tensor : in.find(field.name);
      // The engine names this element (index and origin); the message names the one it is compared with.
      auto first = [&] { return "the batch's first element (element " + std::to_string(first_index_) + " of the input)"; };
      if (!t) throw DataError("cannot batch: this element has no field '" + field.name + "', which " + first() + " has");
      if (t->dtype() != field.dtype || t->shape() != field.shape)
        throw DataError("cannot batch field '" + field.name + "': this element is " + dtype_name(t->dtype()) + shape_string(t->shape()) +
                        ", " + first() + " is " + dtype_name(field.dtype) + shape_string(field.shape) +
                        " (resize or pad them to one shape first)");
      tensors[f] = t;
    }
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      FieldAssembly& field = fields_[f];
      if (field.dtype == DType::Bytes) {
        for (std::int64_t k = 0; k < tensors[f]->num_elements(); ++k) field.add_string(tensors[f]->string_at(k));
      } else {
        std::byte* row = field.rows.raw_data() + count_ * field.row_bytes;
        if (tensors[f]->raw_data() != row) copy_to_cold(row, tensors[f]->raw_data(), field.row_bytes);  // else built in place
      }
    }
    row_origins_.push_back(in.shared_origin());
  }
  Flow push_chunk(const Chunk& in, const ElementContext& first, Emitter& out) override {
    std::vector<const Column*> columns;
    std::size_t r = 0;
    while (r < in.rows()) {
      if (count_ == 0) {
        begin_batch(in.row(r), first.epoch);
        first_index_ = first.index + r;
        columns.clear();
      }
      if (columns.empty()) {
        // As push() checks each element: every field of the batch, of the same type and shape. A
        // chunk's rows share their types and shapes, so the first row of it stands for the rest.
        for (const FieldAssembly& field : fields_) {
          const Column* column = in.find(field.name);
          auto first_element = [&] { return "the batch's first element (element " + std::to_string(first_index_) + " of the input)"; };
          if (!column) throw RowError(r, "cannot batch: this element has no field '" + field.name + "', which " + first_element() + " has");
          const Tensor one = column->row(r);
          if (one.dtype() != field.dtype || one.shape() != field.shape)
            throw RowError(r, "cannot batch field '" + field.name + "': this element is " + dtype_name(one.dtype()) +
                                  shape_string(one.shape()) + ", " + first_element() + " is " + dtype_name(field.dtype) +
                                  shape_string(field.shape) + " (resize or pad them to one shape first)");
          columns.push_back(column);
        }
      }
      std::size_t take = std::min(in.rows() - r, batch_size_ - count_);
      // Rows of a Ragged column may differ in shape: the first that differs from the batch's is
      // refused, after the rows before it are taken.
      std::string refused;
      for (std::size_t f = 0; f < fields_.size(); ++f) {
        if (columns[f]->layout != Column::Layout::Ragged) continue;
        for (std::size_t k = 0; k < take; ++k) {
          if (columns[f]->row_length(r + k) == (fields_[f].shape.empty() ? -1 : fields_[f].shape[0])) continue;
          const Shape have = columns[f]->row_shape(r + k);
          if (have == fields_[f].shape) continue;
          refused = "cannot batch field '" + fields_[f].name + "': this element is " + dtype_name(fields_[f].dtype) + shape_string(have) +
                    ", the batch's first element (element " + std::to_string(first_index_) + " of the input) is " +
                    dtype_name(fields_[f].dtype) + shape_string(fields_[f].shape) + " (resize or pad them to one shape first)";
          take = k;
          break;
        }
      }
      for (std::size_t f = 0; f < fields_.size(); ++f) {
        FieldAssembly& field = fields_[f];
        const Column& column = *columns[f];
        if (field.dtype == DType::Bytes) {
          const bool one_string = column.layout == Column::Layout::Spans ||
                                  column.tensor.rank() == (column.layout == Column::Layout::Constant ? 0u : 1u);
          for (std::size_t k = 0; k < take; ++k) {
            if (!one_string) {  // several strings per row
              const Tensor row = column.row(r + k);
              for (std::int64_t j = 0; j < row.num_elements(); ++j) field.add_string(row.string_at(j));
            } else {
              field.add_string(column.string_at(r + k));
            }
          }
        } else if (column.layout == Column::Layout::Rows) {
          copy_to_cold(field.rows.raw_data() + count_ * field.row_bytes, column.tensor.raw_data() + r * field.row_bytes, take * field.row_bytes);
        } else if (column.layout == Column::Layout::Ragged) {
          for (std::size_t k = 0; k < take; ++k)
            std::memcpy(field.rows.raw_data() + (count_ + k) * field.row_bytes, column.row_data(r + k), field.row_bytes);
        } else {  // one value for every row
          for (std::size_t k = 0; k < take; ++k)
            std::memcpy(field.rows.raw_data() + (count_ + k) * field.row_bytes, column.tensor.raw_data(), field.row_bytes);
        }
      }
      row_origins_.append(in, r, r + take);
      count_ += take;
      r += take;
      if (count_ == batch_size_) emit_batch(out);
      if (!refused.empty()) throw RowError(r, refused);
    }
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t epoch, Emitter& out) override {
    if (count_ > 0 && !drop_remainder_) emit_batch(out);
    reset();
    std::lock_guard lock(placed_mutex_);
    for (auto it = placed_.begin(); it != placed_.end();) it = it->first.first <= epoch ? placed_.erase(it) : std::next(it);
    done_epoch_ = epoch + 1;
    done_batches_ = 0;
  }
  // The rows gathered so far, each an element with its origin (the host names those it can by
  // where they were read, instead of keeping their bytes), and which batch they belong to.
  void save_state(StateWriter& w) const override {
    w.put<std::uint64_t>(count_);
    w.put(first_index_);
    w.put(epoch_);
    w.put(number_);
    w.put(done_epoch_);
    w.put(done_batches_);
    if (count_ == 0) return;
    std::vector<Tensor> strings(fields_.size());  // a bytes field's rows, stacked once
    for (std::size_t f = 0; f < fields_.size(); ++f) {
      if (fields_[f].dtype != DType::Bytes) continue;
      Shape shape = fields_[f].shape;
      shape.insert(shape.begin(), static_cast<std::int64_t>(count_));
      strings[f] = Tensor::from_strings(fields_[f].strings(), shape);
    }
    for (std::size_t k = 0; k < count_; ++k) {
      Sample row;
      for (std::size_t f = 0; f < fields_.size(); ++f) {
        const FieldAssembly& field = fields_[f];
        row.set(field.name, field.dtype == DType::Bytes
                                ? strings[f].row(static_cast<std::int64_t>(k))
                                : Tensor::view(field.dtype, field.shape, field.rows.buffer(), field.rows.byte_offset() + k * field.row_bytes));
      }
      const Origin origin = row_origins_[k];
      row.set_origin(origin.where, origin.record, origin.byte_offset);
      row.set_read_position(origin.read_epoch, origin.read_index);
      w.put_element(row);
    }
    w.describe(std::to_string(count_) + " of " + std::to_string(batch_size_) + " rows of batch " + std::to_string(number_) + " gathered");
  }
  void restore_state(StateReader& r) override {
    reset();
    count_ = static_cast<std::size_t>(r.get<std::uint64_t>());
    first_index_ = r.get<std::uint64_t>();
    epoch_ = r.get<std::uint64_t>();
    number_ = r.get<std::uint64_t>();
    done_epoch_ = r.get<std::uint64_t>();
    done_batches_ = r.get<std::uint64_t>();
    if (count_ == 0) return;
    if (count_ >= batch_size_) throw DataError("the saved batch holds " + std::to_string(count_) + " rows, not fewer than batch_size");
    // The rows go in as they first did, the first one standing for the batch's shapes.
    const std::size_t rows = count_;
    count_ = 0;
    for (std::size_t k = 0; k < rows; ++k) {
      const Sample row = r.get_element();
      if (k == 0) begin_batch(row, epoch_);
      add_row(row);
      ++count_;
    }
  }

 private:
  struct PlacedField {
    std::string name;
    DType dtype;
    Shape shape;
    Tensor rows;
  };
  static constexpr std::size_t kMaxBlocksAhead = 8;

  // The rows of batch `number` of iteration `epoch` for one field, made on first demand by
  // whichever comes first, a worker placing an element or the batch starting. Null when the
  // field exists there with another type or shape. Under placed_mutex_.
  const Tensor* block_for(std::uint64_t epoch, std::uint64_t number, const std::string& field, DType dtype, const Shape& shape) {
    auto& fields = placed_[{epoch, number}];
    for (const auto& f : fields)
      if (f.name == field) return f.dtype == dtype && f.shape == shape ? &f.rows : nullptr;
    fields.push_back({field, dtype, shape, new_rows(dtype, shape)});
    return &fields.back().rows;
  }
  // Room for a whole batch of elements of `shape`.
  Tensor new_rows(DType dtype, const Shape& shape) const {
    Shape rows = shape;
    rows.insert(rows.begin(), static_cast<std::int64_t>(batch_size_));
    return Tensor::empty(dtype, rows, *allocator_);
  }

  void begin_batch(const Sample& first, std::uint64_t epoch) {
    epoch_ = epoch;
    fields_.clear();
    for (const auto& f : first.fields()) {
      FieldAssembly field;
      field.name = f.name;
      field.dtype = f.tensor.dtype();
      field.shape = f.tensor.shape();
      if (field.dtype == DType::Bytes) {
        field.ends.reserve(batch_size_ * static_cast<std::size_t>(std::max<std::int64_t>(1, f.tensor.num_elements())));
        field.bytes.reserve(std::min<std::size_t>(batch_size_ * f.tensor.nbytes(), 64u << 20));
      } else {
        field.row_bytes = f.tensor.nbytes();
        std::lock_guard lock(placed_mutex_);
        if (const Tensor* placed = block_for(epoch, number_, field.name, field.dtype, field.shape)) {
          field.rows = *placed;
        } else {  // placed there with another shape: this batch has its own rows
          field.rows = new_rows(field.dtype, field.shape);
        }
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
        batch.set(field.name, Tensor::from_strings(field.strings(), shape));
      } else if (count_ == batch_size_) {
        batch.set(field.name, std::move(field.rows));
      } else {  // a short last batch: its rows are the first count_ of the buffer
        batch.set(field.name, Tensor::view(field.dtype, shape, field.rows.buffer(), field.rows.byte_offset()));
      }
    }
    batch.share_origin(first_);
    reset();
    {
      std::lock_guard lock(placed_mutex_);
      placed_.erase({epoch_, number_});
      done_epoch_ = epoch_;
      done_batches_ = ++number_;
    }
    out.push(std::move(batch));
  }
  void reset() {
    count_ = 0;
    fields_.clear();
    row_origins_.clear();
    first_ = Sample();
  }

  std::size_t batch_size_;
  bool drop_remainder_;
  PooledHostAllocator pool_;
  Allocator* allocator_ = &pool_;
  std::vector<FieldAssembly> fields_;
  std::size_t count_ = 0;
  std::uint64_t first_index_ = 0;
  Sample first_;  // holds the batch's origin: its first element's
  RowOrigins row_origins_;  // each row's, for checkpoints
  std::uint64_t epoch_ = 0, number_ = 0;  // the batch being assembled

  std::mutex placed_mutex_;  // the workers' place() against the batch's own thread
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<PlacedField>> placed_;  // by (epoch, batch)
  std::uint64_t done_epoch_ = 0, done_batches_ = 0;  // batches before these were emitted
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
      name_row(out);
      ++next_;
      return true;
    }

   private:
    // A batch that names its rows (sluice/origin_rows.hpp) gives each row its own record, so that
    // lineage and the delivery ledger see each once, rebatched or not. The origin messages and
    // checkpoints name stays the batch's.
    void name_row(Sample& out) const {
      const Origin& origin = batch_.shared_origin();
      const OriginRecords* rows = records_carried(origin);
      if (!rows || rows->parts || rows->records.size() != static_cast<std::size_t>(rows_)) return;
      Origin head = origin;
      head.where = rows->where;  // (the same text: messages and checkpoints see no difference)
      const Origin named = origin_of_rows(head, {rows->records[static_cast<std::size_t>(next_)]});
      out.set_origin(named.where, named.record, named.byte_offset);
      out.set_read_position(origin.read_epoch, origin.read_index);
    }

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
