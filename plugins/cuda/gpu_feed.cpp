// gpu_feed: the sink the whole pipeline exists for. Each global batch is cut into one slice per
// logical device (slice_plan.hpp); each slice is copied from pinned host memory on its device's
// copy stream into a slot of that device's ring; the slot is reused only after whoever reads it
// (the training loop through the Feed interface, or a headless consumer kernel) is done with it.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include "checksum.hpp"
#include "device_backend.hpp"
#include "gpu_feed.hpp"
#include "slice_plan.hpp"

namespace sluice::cuda {
namespace {

constexpr std::size_t kFieldAlignment = 256;
std::size_t aligned(std::size_t n) { return (n + kFieldAlignment - 1) / kFieldAlignment * kFieldAlignment; }

enum class ConsumeMode { External, None, Checksum, SimulateStep };

ConsumeMode parse_consume(const std::string& name) {
  if (name == "external") return ConsumeMode::External;
  if (name == "none") return ConsumeMode::None;
  if (name == "checksum") return ConsumeMode::Checksum;
  if (name == "simulate_step_us") return ConsumeMode::SimulateStep;
  throw ParamError("consume: '" + name + "' is not one of external, none, checksum, simulate_step_us");
}

// "all", or comma-separated ordinals (one may repeat). Empty optional: all.
std::optional<std::vector<int>> parse_devices(const std::string& text) {
  std::string trimmed;
  for (char c : text)
    if (c != ' ') trimmed += c;
  if (trimmed.empty() || trimmed == "all") return std::nullopt;
  std::vector<int> out;
  std::size_t at = 0;
  while (at <= trimmed.size()) {
    std::size_t comma = trimmed.find(',', at);
    std::string item = trimmed.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    bool digits = !item.empty() && item.size() < 6 && std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      throw ParamError("devices: '" + item + "' is not a device ordinal; write `all` or ordinals such as `0,1,2,3` (one may repeat)");
    out.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// One field of the batch as the feed copies it.
struct FieldCopy {
  std::string name;
  DType dtype;
  Shape row_shape;  // without the batch dimension
  std::size_t row_bytes = 0;
  const std::byte* host = nullptr;
};

class GpuFeed final : public Sink, public Feed, public TimesDeviceCopies {
 public:
  static OperatorInfo describe() {
    return {"gpu_feed",
            OperatorKind::Sink,
            "Splits each global batch across GPUs and copies every slice from pinned memory on its device's stream into a ring "
            "of device buffers, overlapping the copies with training",
            {ParamSpec::make("devices", ParamType::String,
                             "CUDA ordinals, comma-separated (one may repeat: several logical devices on one GPU), or all")
                 .def("all"),
             ParamSpec::make("split", ParamType::Choice,
                             "when the batch does not divide evenly: drop the last rows, pad every slice with zero rows, or give "
                             "the first devices one row more")
                 .one_of({"drop", "pad", "uneven"})
                 .def("drop"),
             ParamSpec::make("depth", ParamType::Int, "device buffers per device: slices in flight or held by the training loop")
                 .range(2, 64)
                 .def("3"),
             ParamSpec::make("consume", ParamType::Choice,
                             "who reads the slices: external (the training loop, through Engine::feed), none (dropped once "
                             "copied), checksum (a kernel checks every slice against the host), simulate_step_us (a kernel keeps "
                             "the device busy step_us per slice)")
                 .one_of({"external", "none", "checksum", "simulate_step_us"})
                 .def("none"),
             ParamSpec::make("step_us", ParamType::Int, "the simulated training step per slice (consume: simulate_step_us)")
                 .range(0, 1e7)
                 .def("10000"),
             ParamSpec::make("fields", ParamType::StringList, "fields to copy; empty: every numeric field").def(""),
             ParamSpec::make("emulate", ParamType::Int,
                             "run on this many emulated devices in host memory instead of CUDA (0: CUDA)")
                 .range(0, 64)
                 .def("0")},
            {},
            {}};
  }

  explicit GpuFeed(const Params& p)
      : requested_devices_(parse_devices(p.get_string("devices"))),
        policy_(parse_remainder_policy(p.get_string("split"))),
        depth_(static_cast<int>(p.get_int("depth"))),
        consume_(parse_consume(p.get_string("consume"))),
        step_us_(static_cast<std::uint32_t>(p.get_int("step_us"))),
        wanted_fields_(p.get_string_list("fields")),
        emulate_(static_cast<int>(p.get_int("emulate"))) {
    if (requested_devices_ && requested_devices_->empty()) throw ParamError("devices: name at least one device, or write `all`");
  }

  ~GpuFeed() override {
    for (auto& dev : devices_) {
      if (!dev.lane) continue;  // start() failed before opening it
      try {
        dev.lane->synchronize_all();
      } catch (...) {
      }
      for (auto& slot : dev.slots) {
        if (slot.device) dev.lane->deallocate(slot.device);
        dev.lane->destroy_event(slot.copy_started);
        dev.lane->destroy_event(slot.copied);
        dev.lane->destroy_event(slot.released);
        if (slot.results) backend_->free_pinned(reinterpret_cast<std::byte*>(slot.results));
      }
    }
  }

  void start(const StageInfo& info) override {
    stage_ = info.id;
    backend_ = emulate_ > 0 ? make_emulated_backend(emulate_) : make_cuda_backend();
    std::vector<int> ordinals;
    if (requested_devices_) {
      ordinals = *requested_devices_;
    } else {
      for (int d = 0; d < backend_->device_count(); ++d) ordinals.push_back(d);
    }
    devices_.resize(ordinals.size());
    for (std::size_t d = 0; d < ordinals.size(); ++d) {
      DeviceRing& dev = devices_[d];
      dev.ordinal = ordinals[d];
      dev.lane = backend_->open_lane(ordinals[d]);
      dev.slots.resize(static_cast<std::size_t>(depth_));
      for (auto& slot : dev.slots) {
        slot.copy_started = dev.lane->create_timing_event();
        slot.copied = dev.lane->create_timing_event();
        slot.released = dev.lane->create_event();
      }
    }
    auto backend = backend_;
    pool_.emplace(backend_->emulated() ? "emulated-pinned" : "pinned",
                  PooledHostAllocator::BlockSource{[backend](std::size_t n) { return backend->allocate_pinned(n); },
                                                   [backend](std::byte* p) { backend->free_pinned(p); }});
  }

  Allocator* offered_allocator() override { return pool_ ? &*pool_ : nullptr; }
  Feed* feed() override { return this; }

  void consume(Sample batch, const ElementContext&) override {
    std::vector<FieldCopy> fields;
    const std::int64_t rows = select_fields(batch, fields);
    stage_into_pinned(batch, fields);
    const auto plan = plan_slices(rows, static_cast<int>(devices_.size()), policy_);
    const std::uint64_t index = batch_index_++;
    if (plan.empty()) return;  // split: drop, fewer rows than devices: skipped on every device
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      const int s = acquire_slot(d);
      if (s < 0) return;  // the run is stopping
      fill_slot(d, s, plan[d], fields, batch, index);
    }
  }

  void end_iteration(std::uint64_t) override {
    std::lock_guard lock(mutex_);
    producer_done_ = true;
    cv_.notify_all();
  }

  void finish(bool complete) override {
    {
      std::lock_guard lock(mutex_);
      producer_done_ = true;
      if (!complete) cancelled_ = true;
      cv_.notify_all();
    }
    if (consume_ == ConsumeMode::External) return;  // the loop may still hold slices
    std::string mismatch;
    for (auto& dev : devices_) {
      dev.lane->synchronize_all();
      for (auto& slot : dev.slots) {
        {
          std::lock_guard lock(mutex_);
          count_copy_time(dev, slot);
        }
        std::string m = verify(dev, slot);
        if (mismatch.empty()) mismatch = m;
      }
    }
    if (!mismatch.empty() && complete) throw DataError(mismatch);
  }

  void cancel() override {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    cv_.notify_all();
  }

  std::vector<DeviceCopyTime> device_copy_times() const override {
    std::lock_guard lock(mutex_);
    std::vector<DeviceCopyTime> out;
    for (auto& dev : devices_) {
      for (auto& slot : dev.slots) count_copy_time(dev, slot);
      out.push_back(dev.copy_time);
    }
    return out;
  }

  std::vector<DeviceCounters> device_counters() const override {
    std::lock_guard lock(mutex_);
    std::vector<DeviceCounters> out;
    for (const auto& dev : devices_) {
      DeviceCounters c;
      c.name = dev.lane->name();
      c.bytes = dev.bytes;
      c.slices = dev.slices;
      c.checked = dev.checked;
      c.ring_capacity = static_cast<std::uint32_t>(dev.slots.size());
      for (const auto& slot : dev.slots)
        if (slot.held || (slot.in_use && slot.wait_released && !dev.lane->query(slot.released))) ++c.ring_level;
      out.push_back(std::move(c));
    }
    return out;
  }

  // ---- Feed: the training loop's side ----

  int devices() const override { return static_cast<int>(devices_.size()); }
  bool emulated() const override { return backend_ && backend_->emulated(); }

  FeedStatus next(int device, FeedSlice& out, std::chrono::milliseconds timeout) override {
    if (consume_ != ConsumeMode::External)
      throw Error("stage '" + stage_ + "' (gpu_feed) reads its own slices (consume is not external): set `consume: external` "
                  "to take them with Feed::next");
    check_device(device);
    std::unique_lock lock(mutex_);
    auto& ready = devices_[static_cast<std::size_t>(device)].ready;
    cv_.wait_for(lock, timeout, [&] { return cancelled_ || !ready.empty() || producer_done_; });
    if (cancelled_) return FeedStatus::Stopped;
    if (!ready.empty()) {
      const int s = ready.front();
      ready.pop_front();
      Slot& slot = devices_[static_cast<std::size_t>(device)].slots[static_cast<std::size_t>(s)];
      slot.handed_out = true;
      out = slot.slice;
      return FeedStatus::Ready;
    }
    return producer_done_ ? FeedStatus::End : FeedStatus::TimedOut;
  }

  void wait_ready(const FeedSlice& slice) override {
    auto [dev, slot] = locate(slice);
    dev->lane->synchronize(slot->copied);
  }

  void release(const FeedSlice& slice, void* stream) override {
    auto [dev, slot] = locate(slice);
    std::lock_guard lock(mutex_);
    if (!slot->handed_out || slot->slice.ticket != slice.ticket)
      throw Error("gpu_feed: batch " + std::to_string(slice.batch) + " on device " + std::to_string(slice.device) +
                  " was released already (each slice is released once)");
    dev->lane->record_on(slot->released, stream);
    slot->handed_out = false;
    slot->held = false;
    slot->wait_released = false;
    cv_.notify_all();
  }

  FeedAllocations allocations() const override {
    FeedAllocations a;
    if (pool_) {
      auto c = pool_->counters();
      a.pinned_fresh = c.fresh_allocations;
      a.pinned_reused = c.reused_allocations;
    }
    std::lock_guard lock(mutex_);
    a.device_buffers = device_buffers_;
    a.staged_batches = staged_batches_;
    return a;
  }

 private:
  struct Slot {
    std::byte* device = nullptr;
    std::size_t capacity = 0;
    Event copy_started = nullptr;  // before the slice's copies (timing)
    Event copied = nullptr;    // after the slice's copies (timing)
    std::size_t copy_bytes = 0;  // of its slice
    mutable bool copy_uncounted = false;  // its copies are not yet in the device's copy_time
    Event released = nullptr;  // after the work that read the slice
    bool held = false;           // being filled, or waiting for or with the training loop
    bool handed_out = false;     // given by next() and not yet released: only then may release() take it
    bool in_use = false;         // holds a slice whose host batch is kept until its copies end
    bool wait_released = false;  // a headless consumer: reuse waits for its kernel on the host
    std::uint64_t last_use = 0;
    Sample host;  // the batch the copies read
    FeedSlice slice;
    std::uint64_t* results = nullptr;  // pinned: checksums computed on the device, one per field
    std::size_t result_capacity = 0;
    std::vector<std::uint64_t> expected;  // the same checksums computed on the host
    bool verify = false;
  };
  struct DeviceRing {
    int ordinal = 0;
    std::unique_ptr<Lane> lane;
    std::vector<Slot> slots;
    std::deque<int> ready;  // slots handed to the training loop next, in batch order
    std::uint64_t bytes = 0, slices = 0, checked = 0;
    mutable DeviceCopyTime copy_time;  // the copies counted so far
  };

  // Adds the slot's last copies to its device's copy time once they are done (with mutex_ held;
  // from the metrics thread too, hence the mutable counts).
  static void count_copy_time(const DeviceRing& dev, const Slot& slot) {
    if (!slot.copy_uncounted || !dev.lane->query(slot.copied)) return;
    dev.copy_time.bytes += slot.copy_bytes;
    dev.copy_time.seconds += dev.lane->elapsed_seconds(slot.copy_started, slot.copied);
    slot.copy_uncounted = false;
  }

  std::int64_t select_fields(const Sample& batch, std::vector<FieldCopy>& out) const {
    std::int64_t rows = -1;
    auto add = [&](const Field& f) {
      const Tensor& t = f.tensor;
      if (t.dtype() == DType::Bytes)
        throw DataError("gpu_feed: field '" + f.name + "' holds bytes; only numeric fields go to the device (remove it from `fields`)");
      if (t.rank() == 0)
        throw DataError("gpu_feed: field '" + f.name + "' is a scalar, not a batch: put a `batch` stage before the feed");
      if (rows < 0) rows = t.shape()[0];
      if (t.shape()[0] != rows)
        throw DataError("gpu_feed: field '" + f.name + "' has " + std::to_string(t.shape()[0]) + " rows, the batch's other fields " +
                        std::to_string(rows));
      Shape row_shape(t.shape().begin() + 1, t.shape().end());
      const auto row_bytes = static_cast<std::size_t>(shape_elements(row_shape)) * dtype_size(t.dtype());
      out.push_back({f.name, t.dtype(), std::move(row_shape), row_bytes, t.raw_data()});
    };
    if (wanted_fields_.empty()) {
      for (const auto& f : batch.fields())
        if (f.tensor.dtype() != DType::Bytes) add(f);
    } else {
      for (const auto& name : wanted_fields_) {
        const Tensor& t = batch.at(name);
        add(Field{name, t});
      }
    }
    if (out.empty()) throw DataError("gpu_feed: the batch has no numeric field to copy");
    return rows;
  }

  // Copies from pageable memory would be staged by the driver anyway; doing it here once keeps
  // every device copy asynchronous. Batches assembled in the offered pool skip this.
  void stage_into_pinned(Sample& batch, std::vector<FieldCopy>& fields) {
    bool staged = false;
    for (auto& f : fields) {
      Tensor* t = batch.find(f.name);
      if (pool_->owns(t->raw_data(), t->nbytes())) continue;
      Tensor pinned = Tensor::empty(t->dtype(), t->shape(), *pool_);
      if (t->nbytes()) std::memcpy(pinned.raw_data(), t->raw_data(), t->nbytes());
      *t = std::move(pinned);
      f.host = t->raw_data();
      staged = true;
    }
    if (staged) {
      std::lock_guard lock(mutex_);
      ++staged_batches_;
    }
  }

  void check_device(int device) const {
    if (device < 0 || device >= static_cast<int>(devices_.size()))
      throw Error("gpu_feed: device " + std::to_string(device) + " is not one of this feed's " + std::to_string(devices_.size()) +
                  " logical devices");
  }

  std::pair<DeviceRing*, Slot*> locate(const FeedSlice& slice) {
    check_device(slice.device);
    auto& dev = devices_[static_cast<std::size_t>(slice.device)];
    const auto s = static_cast<std::size_t>((slice.ticket >> 32) & 0xffff);
    if (s >= dev.slots.size()) throw Error("gpu_feed: this slice does not come from this feed");
    return {&dev, &dev.slots[s]};
  }

  // Waits for a slot of device d that nobody holds, then makes sure the work of its previous
  // slice is over. Returns -1 when the run is stopping.
  int acquire_slot(std::size_t d) {
    DeviceRing& dev = devices_[d];
    int chosen = -1;
    bool in_use = false, wait_released = false;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] {
        if (cancelled_) return true;
        return std::any_of(dev.slots.begin(), dev.slots.end(), [](const Slot& s) { return !s.held; });
      });
      if (cancelled_) return -1;
      for (std::size_t s = 0; s < dev.slots.size(); ++s)
        if (!dev.slots[s].held && (chosen < 0 || dev.slots[s].last_use < dev.slots[static_cast<std::size_t>(chosen)].last_use))
          chosen = static_cast<int>(s);
      dev.slots[static_cast<std::size_t>(chosen)].held = true;
      in_use = dev.slots[static_cast<std::size_t>(chosen)].in_use;
      wait_released = dev.slots[static_cast<std::size_t>(chosen)].wait_released;
    }
    Slot& slot = dev.slots[static_cast<std::size_t>(chosen)];
    if (in_use) {
      dev.lane->synchronize(slot.copied);
      if (wait_released) dev.lane->synchronize(slot.released);
      {
        std::lock_guard lock(mutex_);
        count_copy_time(dev, slot);
      }
      std::string mismatch = verify(dev, slot);
      slot.host = Sample();
      std::lock_guard lock(mutex_);
      slot.in_use = false;
      if (!mismatch.empty()) {
        slot.held = false;
        throw DataError(mismatch);
      }
    }
    return chosen;
  }

  std::string verify(DeviceRing& dev, Slot& slot) {
    if (!slot.verify) return {};
    slot.verify = false;
    for (std::size_t f = 0; f < slot.expected.size(); ++f)
      if (slot.results[f] != slot.expected[f]) {
        const auto& field = slot.slice.fields[f];
        return "gpu_feed: checksum mismatch on " + dev.lane->name() + " for field '" + field.name + "' of batch " +
               std::to_string(slot.slice.batch) + " (rows " + std::to_string(slot.slice.first_row) + ".." +
               std::to_string(slot.slice.first_row + slot.slice.valid_rows) + "): the device holds other bytes than were sent";
      }
    std::lock_guard lock(mutex_);
    ++dev.checked;
    return {};
  }

  void fill_slot(std::size_t d, int s, const SliceRange& range, const std::vector<FieldCopy>& fields, const Sample& batch,
                 std::uint64_t index) {
    DeviceRing& dev = devices_[d];
    Slot& slot = dev.slots[static_cast<std::size_t>(s)];
    std::size_t need = fields.size() * sizeof(std::uint64_t);  // checksum scratch at the end
    for (const auto& f : fields) need += aligned(static_cast<std::size_t>(range.rows) * f.row_bytes);
    if (slot.capacity < need) {
      if (slot.device) dev.lane->deallocate(slot.device);
      slot.device = static_cast<std::byte*>(dev.lane->allocate(need));
      slot.capacity = need;
      std::lock_guard lock(mutex_);
      ++device_buffers_;
    }
    if (consume_ == ConsumeMode::Checksum && slot.result_capacity < fields.size()) {
      if (slot.results) backend_->free_pinned(reinterpret_cast<std::byte*>(slot.results));
      slot.results = reinterpret_cast<std::uint64_t*>(backend_->allocate_pinned(fields.size() * sizeof(std::uint64_t)));
      slot.result_capacity = fields.size();
    }

    Lane& lane = *dev.lane;
    lane.copy_wait(slot.released);  // the previous reader of this slot is done with it
    lane.copy_record(slot.copy_started);  // after the wait: the copies' time alone
    FeedSlice& slice = slot.slice;
    slice.fields.clear();
    std::size_t offset = 0, copied = 0;
    for (const auto& f : fields) {
      const std::size_t valid = static_cast<std::size_t>(range.valid) * f.row_bytes;
      const std::size_t total = static_cast<std::size_t>(range.rows) * f.row_bytes;
      if (valid) lane.copy_to_device(slot.device + offset, f.host + static_cast<std::size_t>(range.first) * f.row_bytes, valid);
      if (total > valid) lane.zero(slot.device + offset + valid, total - valid);
      Shape shape = f.row_shape;
      shape.insert(shape.begin(), range.rows);
      slice.fields.push_back({f.name, f.dtype, std::move(shape), slot.device + offset, total});
      offset += aligned(total);
      copied += valid;
    }
    lane.copy_record(slot.copied);
    slot.host = batch;
    slice.batch = index;
    slice.device = static_cast<int>(d);
    slice.ordinal = dev.ordinal;
    slice.first_row = range.first;
    slice.rows = range.rows;
    slice.valid_rows = range.valid;
    slice.ready_event = lane.native_event(slot.copied);

    std::byte* scratch = slot.device + offset;
    switch (consume_) {
      case ConsumeMode::External: break;
      case ConsumeMode::None: break;
      case ConsumeMode::Checksum:
        lane.compute_wait(slot.copied);
        slot.expected.clear();
        for (std::size_t f = 0; f < fields.size(); ++f) {
          const std::size_t valid = static_cast<std::size_t>(range.valid) * fields[f].row_bytes;
          lane.checksum(slice.fields[f].data, slice.fields[f].nbytes, scratch + f * sizeof(std::uint64_t), &slot.results[f]);
          slot.expected.push_back(
              host_checksum(fields[f].host + static_cast<std::size_t>(range.first) * fields[f].row_bytes, valid, slice.fields[f].nbytes));
        }
        lane.compute_record(slot.released);
        slot.verify = true;
        break;
      case ConsumeMode::SimulateStep:
        lane.compute_wait(slot.copied);
        lane.spin(step_us_);
        lane.compute_record(slot.released);
        break;
    }

    std::lock_guard lock(mutex_);
    slot.in_use = true;
    slot.copy_bytes = copied;
    slot.copy_uncounted = true;
    slot.last_use = ++uses_;
    slice.ticket = (static_cast<std::uint64_t>(s) << 32) | (slot.last_use & 0xffffffffu);
    dev.bytes += copied;
    ++dev.slices;
    if (consume_ == ConsumeMode::External) {
      dev.ready.push_back(s);
    } else {
      slot.held = false;
      slot.wait_released = consume_ != ConsumeMode::None;
    }
    cv_.notify_all();
  }

  // Parameters.
  std::optional<std::vector<int>> requested_devices_;
  RemainderPolicy policy_;
  int depth_;
  ConsumeMode consume_;
  std::uint32_t step_us_;
  std::vector<std::string> wanted_fields_;
  int emulate_;

  std::string stage_;
  std::shared_ptr<Backend> backend_;
  std::vector<DeviceRing> devices_;
  std::optional<PooledHostAllocator> pool_;
  std::uint64_t batch_index_ = 0;  // the sink thread's own

  mutable std::mutex mutex_;  // slot ownership, ready queues, counters, flags
  std::condition_variable cv_;
  bool cancelled_ = false, producer_done_ = false;
  std::uint64_t uses_ = 0, device_buffers_ = 0, staged_batches_ = 0;
};

}  // namespace

void register_gpu_feed(Registrar& registrar) { registrar.add<GpuFeed>(); }

}  // namespace sluice::cuda
