// What a trainer runs in place of the stages it sends to the service: `service_source`, a source
// reading a job's splits from the workers the dispatcher names, one after another, and
// split_at_service(), which puts it in their place.
#include <fmt/format.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include "compression.hpp"
#include "job_fingerprint.hpp"
#include "security.hpp"
#include "service.grpc.pb.h"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/delivery_ledger.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/lineage.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace sluice::service {
namespace {

// An Element message as gRPC received it, in the slices it arrived in (parsed here rather than
// by protobuf, which would copy the payload into a string of its own): its position, its size
// before compression, and where its payload lies.
struct ReceivedElement {
  std::vector<grpc::Slice> slices;
  std::uint64_t position = 0, raw_size = 0;
  std::size_t slice = 0, offset = 0, length = 0;  // the payload: from byte `offset` of slice `slice`, `length` bytes
  std::string lineage;                             // (when asked) its records, a core Lineage message
};

// Reads bytes across a message's slices.
class SliceBytes final : public SampleBytesIn {
 public:
  SliceBytes(const std::vector<grpc::Slice>& slices, std::size_t slice, std::size_t offset, std::size_t length, std::string what)
      : slices_(slices), slice_(slice), offset_(offset), left_(length), what_(std::move(what)) {}
  std::size_t remaining() const override { return left_; }
  void read(void* out, std::size_t size) override {
    if (size > left_) throw DataError(fmt::format("{} is damaged: it ends {} bytes early", what_, size - left_));
    auto* to = static_cast<std::byte*>(out);
    while (size > 0) {
      skip_empty();
      const grpc::Slice& s = slices_[slice_];
      const std::size_t n = std::min(size, s.size() - offset_);
      std::memcpy(to, s.begin() + offset_, n);
      to += n;
      size -= n;
      left_ -= n;
      offset_ += n;
    }
  }
  std::string_view view(std::size_t size, std::string& scratch) override {
    if (size > left_) throw DataError(fmt::format("{} is damaged: a length of {} bytes with {} left", what_, size, left_));
    skip_empty();
    if (size == 0) return {};
    const grpc::Slice& s = slices_[slice_];
    if (s.size() - offset_ >= size) {  // in one slice: where it lies
      std::string_view v(reinterpret_cast<const char*>(s.begin()) + offset_, size);
      left_ -= size;
      advance(size);
      return v;
    }
    scratch.resize(size);
    read(scratch.data(), size);
    return scratch;
  }
  std::uint64_t varint() {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      std::uint8_t byte = 0;
      read(&byte, 1);
      value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    throw DataError(fmt::format("{} is damaged: a varint of more than 10 bytes", what_));
  }
  void skip(std::size_t size) {
    if (size > left_) throw DataError(fmt::format("{} is damaged: it ends {} bytes early", what_, size - left_));
    left_ -= size;
    advance(size);
  }
  std::size_t slice() {
    skip_empty();
    return slice_;
  }
  std::size_t offset() const { return offset_; }

 private:
  void skip_empty() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) ++slice_, offset_ = 0;
  }
  void advance(std::size_t n) {
    while (n > 0) {
      const std::size_t in_slice = slices_[slice_].size() - offset_;
      if (n < in_slice) {
        offset_ += n;
        return;
      }
      n -= in_slice;
      ++slice_;
      offset_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  std::size_t slice_, offset_, left_;
  std::string what_;
};

// Protobuf's wire format of `message Element { uint64 position = 1; bytes element = 2; uint64
// raw_size = 3; bytes lineage = 4; }`, fields in any order, unknown ones skipped.
void parse_received(grpc::ByteBuffer& buffer, ReceivedElement& out, const std::string& what) {
  out.slices.clear();  // (its room is kept for the next message)
  out.position = out.raw_size = 0;
  out.slice = out.offset = out.length = 0;
  out.lineage.clear();
  if (!buffer.Dump(&out.slices).ok()) throw Error(fmt::format("{}: the message could not be read", what));
  std::size_t total = 0;
  for (const auto& slice : out.slices) total += slice.size();
  SliceBytes in(out.slices, 0, 0, total, what);
  bool payload = false;
  while (in.remaining() > 0) {
    const std::uint64_t tag = in.varint();
    const std::uint64_t field = tag >> 3;
    switch (tag & 7) {
      case 0: {
        const std::uint64_t value = in.varint();
        if (field == 1) out.position = value;
        if (field == 3) out.raw_size = value;
        break;
      }
      case 1: in.skip(8); break;
      case 5: in.skip(4); break;
      case 2: {
        const std::uint64_t length = in.varint();
        if (field == 2) {
          out.slice = in.slice();
          out.offset = in.offset();
          out.length = static_cast<std::size_t>(length);
          payload = true;
        } else if (field == 4) {
          std::string scratch;
          out.lineage.assign(in.view(static_cast<std::size_t>(length), scratch));
          break;
        }
        in.skip(static_cast<std::size_t>(length));
        break;
      }
      default: throw DataError(fmt::format("{} is damaged: wire type {} of field {}", what, tag & 7, field));
    }
  }
  if (!payload) out.slice = out.slices.size();  // an empty payload (proto3 leaves it out)
}

// What ends a trainer's reading (the service refusing, a worker's pipeline failing, a consumer
// gone) is the stage's failure, no element's: the engine ends the run with it, whatever the error
// policy (skipping would only ask again).
std::exception_ptr as_stage_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const StageFailure&) {
    return error;
  } catch (const std::exception& e) {
    return std::make_exception_ptr(StageFailure(e.what()));
  } catch (...) {
    return std::make_exception_ptr(StageFailure("the service's reader failed"));
  }
}

// Exactly once: the elements of a split arrive in order; one given back and made again elsewhere
// starts where this trainer stopped (and any element it already has is dropped). Several splits
// are read at once (`splits_in_flight`, each by a thread of its own), so that several workers
// work for this trainer; their elements are handed on as they come.
class ServiceSource final : public Source, public KnowsItsRecords {
 public:
  static OperatorInfo describe();  // below, with its parameters
  explicit ServiceSource(const Params& p) : in_flight_(static_cast<int>(p.get_int("splits_in_flight"))) {
    security_.token_file = p.get_string("token_file");
    security_.tls_ca = p.get_string("tls_ca");
    service_ = p.get_string("service");
    job_.set_job_name(p.get_string("job_name"));
    job_.set_pipeline(p.get_string("pipeline"));
    job_.set_pipeline_file(p.get_string("pipeline_file"));
    job_.set_split_size(static_cast<std::uint64_t>(std::max<std::int64_t>(p.get_int("split_size"), 1)));
    // The parameters' choices are the service's enum names (the schema checked them).
    proto::JobRequest::Mode mode = proto::JobRequest::DYNAMIC;
    proto::JobRequest::Mode_Parse(p.get_string("processing_mode"), &mode);
    job_.set_mode(mode);
    proto::JobRequest::Compression compression = proto::JobRequest::NONE;
    proto::JobRequest::Compression_Parse(p.get_string("compression"), &compression);
    job_.set_compression(compression);
    if (p.get_int("num_consumers") > 0) {
      job_.set_num_consumers(static_cast<std::uint32_t>(p.get_int("num_consumers")));
      job_.set_lanes(static_cast<std::uint32_t>(in_flight_));
      job_.set_consumer_index(static_cast<std::int32_t>(p.get_int("consumer_index")));
    }
    // Each reader names itself to the dispatcher, so that a question asked again gets the answer
    // it had (this trainer's readers are told apart from every other's by a random name).
    std::random_device random;
    reader_prefix_ = fmt::format("{:08x}{:08x}-{}of{}", random(), random(), p.get_int("trainer_index"), p.get_int("num_trainers"));
  }
  ~ServiceSource() override {
    stop_readers();
    leave_job();
  }
  void start(const StageInfo& info) override {
    // A pool's blocks (large batches cost fresh pages every time otherwise), unless a stage
    // downstream offered its own (pinned memory for a GPU feed).
    allocator_ = std::string(info.allocator->name()) == "host" ? static_cast<Allocator*>(&pool_) : info.allocator;
    counters_ = dynamic_cast<HostStageCounters*>(info.counters);
    follows_lineage_ = counters_ && counters_->follows_lineage();
    target_ = grpc_target(service_);
    token_ = detail::client_token(target_, security_);
    dispatcher_ = proto::Dispatcher::NewStub(detail::client_channel(target_, security_));
  }
  void begin_pass(std::uint64_t pass) override {
    stop_readers();
    if (job_id_ == 0) {
      job_id_ = register_job();
      keeper_ = std::thread([this] { keep_job(); });
    }
    epoch_ = pass;
    stopping_ = false;
    error_ = nullptr;
    ready_.clear();
    readers_left_ = in_flight_;
    if (coordinated()) {
      lanes_.assign(static_cast<std::size_t>(in_flight_), Lane{});
      round_ = 0;
      lane_at_ = 0;
      for (int i = 0; i < in_flight_; ++i) readers_.emplace_back([this, i] { read_lane(static_cast<std::uint32_t>(i)); });
      return;
    }
    for (int i = 0; i < in_flight_; ++i) readers_.emplace_back([this, i] { read_splits(fmt::format("{}-{}", reader_prefix_, i)); });
  }
  bool next(Sample& out, const ElementContext&) override {
    if (coordinated()) return next_in_round(out);
    std::unique_lock lock(mutex_);
    ready_cv_.wait(lock, [&] { return !ready_.empty() || readers_left_ == 0 || error_; });
    if (error_) std::rethrow_exception(error_);
    if (ready_.empty()) return false;
    out = std::move(ready_.front());
    ready_.pop_front();
    room_cv_.notify_one();
    return true;
  }
  void cancel() override {
    std::lock_guard lock(mutex_);
    stop_locked();
  }
  void finish(bool) override {
    stop_readers();
    leave_job();
  }

 private:
  struct Stream {
    std::uint64_t split = 0, received = 0, skip = 0, worker_id = 0, lease = 0;
    std::string worker;
    std::unique_ptr<grpc::ClientContext> context;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader;  // the Worker's ProduceSplit, read as it arrives
    grpc::ByteBuffer message;
    ReceivedElement element;
    std::string what;  // its messages, as a damaged one is named
    std::string reader_name;  // the reader it was handed to: its report names it
  };
  static constexpr std::size_t kMostReady = 256;
  static constexpr std::size_t kMostReadyInLane = 64;
  static constexpr int kMostFailures = 4;
  static constexpr std::chrono::seconds kDispatcherWait{30};  // how long a dispatcher may not answer (README: "The service")

  // Coordinated reads (num_consumers): the job's consumers read the same splits in the same
  // order, `lanes` at a time; each split's elements are dealt in turn, so the lane's k-th round
  // is one element for every consumer, all from one worker's consecutive output (a round may
  // straddle two of the lane's splits: the turn carries on). This trainer hands on round 0 of
  // every lane, then round 1 of every lane, and so on: its n-th element is of the same round as
  // every other consumer's. Only a lane's last round may be short, and a consumer it leaves out
  // goes on to the next.
  struct Lane {
    std::deque<std::pair<std::uint64_t, Sample>> ready;  // (round, element)
    bool ended = false;
  };
  bool coordinated() const { return job_.num_consumers() > 0; }

  bool next_in_round(Sample& out) {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (error_) std::rethrow_exception(error_);
      bool all_ended = true;
      for (const auto& lane : lanes_) all_ended &= lane.ended && lane.ready.empty();
      if (all_ended || stopping_) return false;
      Lane& lane = lanes_[lane_at_];
      auto turn = [&] {
        if (++lane_at_ == lanes_.size()) {
          lane_at_ = 0;
          ++round_;
        }
      };
      if (!lane.ready.empty() && lane.ready.front().first == round_) {
        out = std::move(lane.ready.front().second);
        lane.ready.pop_front();
        turn();
        room_cv_.notify_all();
        return true;
      }
      // Nothing of this round for this consumer in this lane: the lane ended before it (or its
      // last round was short of this consumer).
      if ((!lane.ready.empty() && lane.ready.front().first > round_) || (lane.ended && lane.ready.empty())) {
        turn();
        continue;
      }
      ready_cv_.wait(lock);
    }
  }

  // One lane: its slots one after another, each split read whole (from another worker after its
  // own stops answering), until the epoch ends.
  void read_lane(std::uint32_t lane) {
    const std::uint32_t consumers = job_.num_consumers();
    const auto me = static_cast<std::uint32_t>(job_.consumer_index());
    std::exception_ptr failure;
    try {
      std::uint64_t dealt = 0;  // the lane's elements before this slot's split (every consumer's)
      for (std::uint64_t slot = 0;; ++slot) {
        std::uint64_t after_lease = 0, next = 0;  // next: the position of the split this consumer needs next
        for (;;) {
          proto::SplitRequest request;
          request.set_job_id(job_id_);
          request.set_epoch(epoch_);
          request.set_consumer_index(me);
          request.set_lane(lane);
          request.set_slot(slot);
          request.set_after_lease(after_lease);
          proto::SplitReply reply;
          if (!ask_for_split(request, nullptr, reply)) {
            std::lock_guard lock(mutex_);
            lanes_[lane].ended = true;
            ready_cv_.notify_all();
            throw LaneEnded{};
          }
          proto::ProduceRequest produce;
          produce.set_lease(reply.lease());
          produce.set_num_consumers(consumers);
          produce.set_consumer_index(me);
          produce.set_deal_offset(static_cast<std::uint32_t>(dealt % consumers));
          *produce.mutable_consumer_next() = reply.consumer_next();
          if (reply.consumer_next_size() > static_cast<int>(me)) next = std::max(next, reply.consumer_next(static_cast<int>(me)));
          next = std::max(next, reply.skip());
          Stream stream;
          stream.reader_name = fmt::format("{}-lane{}", reader_prefix_, lane);
          if (!open_stream(reply, produce, stream)) throw LaneEnded{};  // stopping
          stream.received = stream.skip = next;
          while (read_element(stream)) {
            const std::uint64_t position = stream.element.position;
            if (position < next) continue;  // had already
            if ((dealt + position) % consumers != me)
              throw Error(fmt::format("element {} of split {} of job '{}' came to consumer {}, whose turn it is not: the worker at {} is "
                                      "not this version's",
                                      position, stream.split, job_.job_name(), me, stream.worker));
            Sample sample = receive_element(stream);
            std::unique_lock lock(mutex_);
            room_cv_.wait(lock, [&] { return lanes_[lane].ready.size() < kMostReadyInLane || stopping_; });
            if (stopping_) break;
            lanes_[lane].ready.emplace_back((dealt + position) / consumers, std::move(sample));
            stream.received = next = position + 1;
            ready_cv_.notify_all();
          }
          {
            std::lock_guard lock(mutex_);
            streaming_.erase(stream.context.get());
            if (stopping_) throw LaneEnded{};
          }
          std::uint64_t elements = 0;
          if (finish_split(stream, &elements)) {
            dealt += elements;
            break;
          }
          after_lease = stream.lease;  // broken off: the same slot again, once every consumer has said how far it got
        }
      }
    } catch (const LaneEnded&) {
    } catch (...) {
      failure = std::current_exception();
    }
    reader_ended(failure);
  }
  struct LaneEnded {};

  // A reader thread's end: its failure, the first, becomes the run's (the other readers stop), and
  // next() learns that one reader fewer is left.
  void reader_ended(std::exception_ptr failure) {
    std::lock_guard lock(mutex_);
    if (failure) {
      if (!error_) error_ = as_stage_failure(failure);
      stop_locked();
    }
    --readers_left_;
    ready_cv_.notify_all();
  }

  void stop_locked() {
    stopping_ = true;
    for (auto* context : streaming_) context->TryCancel();
    ready_cv_.notify_all();
    room_cv_.notify_all();
  }
  void stop_readers() {
    {
      std::lock_guard lock(mutex_);
      stop_locked();
    }
    for (auto& reader : readers_) reader.join();
    readers_.clear();
  }

  // One reader: splits one after another until the epoch ends (or the run stops or fails).
  void read_splits(const std::string& reader) {
    std::exception_ptr failure;
    try {
      Stream stream;
      std::uint64_t sequence = 0;
      while (open_next_split(reader, sequence, stream)) {
        while (read_element(stream)) {
          const std::uint64_t position = stream.element.position;
          if (position < stream.received) continue;  // delivered already (a split made again)
          if (position > stream.received)
            throw Error(fmt::format("split {} of job '{}' skipped from element {} to {}: the worker at {} is not this version's",
                                    stream.split, job_.job_name(), stream.received, position, stream.worker));
          Sample sample = receive_element(stream);
          std::unique_lock lock(mutex_);
          room_cv_.wait(lock, [&] { return ready_.size() < kMostReady || stopping_; });
          if (stopping_) break;
          ready_.push_back(std::move(sample));
          ++stream.received;
          ready_cv_.notify_one();
        }
        {
          std::lock_guard lock(mutex_);
          streaming_.erase(stream.context.get());
          if (stopping_) break;
        }
        finish_split(stream, nullptr);
      }
    } catch (...) {
      failure = std::current_exception();
    }
    reader_ended(failure);
  }

  // What the job's skip policy dropped on the worker, counted as this stage's skips (the run's
  // report shows them): said once per split, by the run that made it whole (a coordinated job's
  // first consumer alone counts them).
  void count_skipped(const std::string& count, const std::string& reasons, const Stream& stream) {
    if (count.empty() || !counters_ || (coordinated() && job_.consumer_index() != 0)) return;
    std::uint64_t skipped = 0;
    try {
      skipped = std::stoull(count);
    } catch (const std::exception&) {
      return;
    }
    std::vector<std::string> said;
    for (std::size_t at = 0; at < reasons.size();) {
      const std::size_t end = std::min(reasons.find('\n', at), reasons.size());
      said.push_back(fmt::format("split {} of job '{}', {}", stream.split, job_.job_name(), reasons.substr(at, end - at)));
      at = end + 1;
    }
    counters_->add_skipped(skipped, said);
  }

  // The next element of the stream, parsed where it lies; false at the stream's end.
  bool read_element(Stream& stream) {
    if (!stream.reader->Read(&stream.message)) return false;
    parse_received(stream.message, stream.element, stream.what);
    return true;
  }
  // Its tensors are filled straight from the slices gRPC received (into this stage's allocator's
  // memory: reused blocks, or pinned ones a GPU feed offered); a compressed one is restored first.
  Sample receive_element(Stream& stream) {
    const ReceivedElement& e = stream.element;
    const std::string what = fmt::format("element {} of split {} of job '{}'", e.position, stream.split, job_.job_name());
    SliceBytes payload(e.slices, e.slice, e.offset, e.length, what);
    Sample sample;
    if (job_.compression() == proto::JobRequest::NONE) {
      sample = decode_sample(payload, what, *allocator_);
    } else {
      std::string gathered;
      std::string compressed(payload.view(e.length, gathered));
      sample = decode_sample(detail::decompress(job_.compression(), std::move(compressed), static_cast<std::size_t>(e.raw_size), what), what, *allocator_);
    }
    if (follows_lineage_ && !e.lineage.empty()) {
      // The records the worker read, with their epochs: for lineage and the delivery ledger here.
      const Origin origin = origin_of_lineage_bytes(e.lineage, what);
      sample.set_origin(origin.where, origin.record, origin.byte_offset);
    }
    return sample;
  }

  // (lineage) The records of the files the workers read to their end, for the delivery ledger.
  std::vector<FileRecords> records_per_file() const override {
    std::vector<FileRecords> files;
    for (auto& known : records_read_.records_known()) files.push_back({std::move(known.where), known.first, known.end});
    return files;
  }
  // A split's trailer: "FIRST END WHERE" per line (a line that does not read is a worker of
  // another version's, and names nothing).
  void learn_records_read(const std::string& lines) {
    for (std::size_t at = 0; at < lines.size();) {
      const std::size_t end = std::min(lines.find('\n', at), lines.size());
      const std::string line = lines.substr(at, end - at);
      at = end + 1;
      long long first = 0, last = 0;
      int name_at = 0;
      if (std::sscanf(line.c_str(), "%lld %lld %n", &first, &last, &name_at) == 2 && name_at > 0 && first <= last)
        records_read_.know_records(line.substr(static_cast<std::size_t>(name_at)), first, last);
    }
  }

  template <class Call>
  void ask_dispatcher(const char* what, Call&& call) {
    // A dispatcher being restarted (or unable to write its journal) answers UNAVAILABLE for a
    // while: tried again for 30 s, saying so every 5 s.
    const auto began = std::chrono::steady_clock::now();
    const auto give_up = began + kDispatcherWait;
    auto say_at = began + std::chrono::seconds(5);
    for (;;) {
      auto context = detail::client_context(token_, std::chrono::seconds(10));
      // Waits for the connection (up to the deadline) rather than failing at once while the
      // channel is between attempts: a call that fails at once leaves no reason to connect, and
      // a restarted dispatcher is then never reached.
      context->set_wait_for_ready(true);
      const grpc::Status status = call(*context);
      if (status.ok()) return;
      const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE || status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      const auto now = std::chrono::steady_clock::now();
      if (!unreachable || now > give_up)
        throw Error(fmt::format("the service's dispatcher at {} did not {}{}: {}", target_, what,
                                unreachable ? fmt::format(" in {} s", kDispatcherWait.count()) : "", detail::status_text(status)));
      if (now >= say_at) {
        std::fprintf(stderr, "sluice: job '%s': waiting for the service's dispatcher at %s to %s (%lld s of %lld): %s\n", job_.job_name().c_str(),
                     target_.c_str(), what, static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - began).count()),
                     static_cast<long long>(kDispatcherWait.count()), detail::status_text(status).c_str());
        say_at = now + std::chrono::seconds(5);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  // Tells the dispatcher every second that this trainer still reads the job (a job whose trainers
  // have all left is over), until leave_job().
  void keep_job() {
    proto::JobClientRequest request;
    request.set_job_id(job_id_);
    request.set_client(reader_prefix_);
    if (coordinated()) request.set_consumer_index(static_cast<std::uint32_t>(job_.consumer_index()));
    std::unique_lock lock(keeper_mutex_);
    while (!keeper_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return leaving_; })) {
      lock.unlock();
      auto context = detail::client_context(token_, std::chrono::seconds(5));
      context->set_wait_for_ready(true);
      proto::JobClientReply reply;
      dispatcher_->JobClient(context.get(), request, &reply);  // a dispatcher being restarted misses one: the next goes
      lock.lock();
    }
  }
  void leave_job() {
    {
      std::lock_guard lock(keeper_mutex_);
      if (leaving_ || !keeper_.joinable()) return;
      leaving_ = true;
    }
    keeper_cv_.notify_all();
    keeper_.join();
    proto::JobClientRequest request;
    request.set_job_id(job_id_);
    request.set_client(reader_prefix_);
    request.set_leaving(true);
    auto context = detail::client_context(token_, std::chrono::seconds(2));
    proto::JobClientReply reply;
    dispatcher_->JobClient(context.get(), request, &reply);  // unanswered: the dispatcher lets it go after 10 s
  }

  std::uint64_t register_job() {
    proto::JobReply reply;
    job_.set_client(reader_prefix_);
    ask_dispatcher("take the job", [&](grpc::ClientContext& c) { return dispatcher_->GetOrCreateJob(&c, job_, &reply); });
    return reply.job_id();
  }
  // The next split the dispatcher hands this trainer, its stream open; false at the epoch's end.
  bool open_next_split(const std::string& reader, std::uint64_t& sequence, Stream& stream) {
    proto::SplitRequest request;
    request.set_job_id(job_id_);
    request.set_epoch(epoch_);
    request.set_reader(reader);
    proto::SplitReply reply;
    if (!ask_for_split(request, &sequence, reply)) return false;
    stream = Stream{};
    stream.reader_name = reader;
    return open_stream(reply, proto::ProduceRequest{}, stream);
  }
  // Asks the dispatcher until it hands out a split (true) or says the epoch is over (false);
  // answers to wait are waited out. `sequence`: the reader's question count (each try a new one).
  bool ask_for_split(proto::SplitRequest& request, std::uint64_t* sequence, proto::SplitReply& reply) {
    const auto asked = std::chrono::steady_clock::now();
    bool said = false;
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return false;
      }
      if (sequence) request.set_sequence(++*sequence);  // a new question (one asked again keeps its number)
      reply.Clear();
      ask_dispatcher("hand out a split", [&](grpc::ClientContext& c) { return dispatcher_->GetSplit(&c, request, &reply); });
      if (reply.kind() == proto::SplitReply::END) return false;
      if (reply.kind() == proto::SplitReply::SPLIT) return true;
      // WAIT: the rest is in other readers' hands, or no worker is there yet, or (coordinated)
      // other consumers have not said how far they got.
      if (!reply.waiting_for().empty() && !said && std::chrono::steady_clock::now() - asked > std::chrono::seconds(10)) {
        std::fprintf(stderr, "sluice: job '%s' at %s: waiting for the service: %s\n", job_.job_name().c_str(), target_.c_str(),
                     reply.waiting_for().c_str());
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Opens the stream of the split `reply` hands out (`produce` holds what is not in the reply);
  // false when the run is stopping.
  bool open_stream(const proto::SplitReply& reply, proto::ProduceRequest produce, Stream& stream) {
    stream.split = reply.split();
    stream.received = stream.skip = reply.skip();
    stream.worker = reply.worker_address();
    stream.worker_id = reply.worker_id();
    stream.lease = reply.lease();
    stream.what = fmt::format("a message of split {} of job '{}' from the worker at {}", stream.split, job_.job_name(), stream.worker);
    // A worker on this machine is read through its Unix socket, without the network.
    const bool local = !reply.worker_local_address().empty() && reply.worker_host() == detail::machine_name();
    stream.channel = local ? detail::client_channel(reply.worker_local_address(), Security{}) : detail::client_channel(reply.worker_address(), security_);
    stream.context = std::make_unique<grpc::ClientContext>();
    if (!token_.empty()) stream.context->AddMetadata("authorization", "Bearer " + token_);
    produce.set_job_id(job_id_);
    produce.set_epoch(epoch_);
    produce.set_split(reply.split());
    produce.set_skip(reply.skip());
    produce.set_splits(reply.splits());
    produce.set_job_fingerprint(detail::job_fingerprint(job_));
    produce.set_lineage(follows_lineage_);
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    streaming_.insert(stream.context.get());
    static const std::string method = "/sluice.service.proto.Worker/ProduceSplit";
    const grpc::internal::RpcMethod produce_split(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING, stream.channel);
    stream.reader.reset(grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(stream.channel.get(), produce_split, stream.context.get(), produce));
    return true;
  }
  // The stream ended: the split is done (or empty: the source ends before it), or its worker
  // stopped answering and it goes back to the dispatcher with what arrived (false); a pipeline
  // that fails on the worker fails this run, naming the worker. `elements`: how many the split
  // had (all consumers'), when it is done.
  bool finish_split(Stream& stream, std::uint64_t* elements) {
    const grpc::Status status = stream.reader->Finish();
    proto::SplitReport report;
    report.set_job_id(job_id_);
    report.set_epoch(epoch_);
    report.set_split(stream.split);
    report.set_received(stream.received);
    report.set_worker_id(stream.worker_id);
    report.set_lease(stream.lease);
    report.set_reader(stream.reader_name);
    report.set_consumer_index(static_cast<std::uint32_t>(std::max(job_.consumer_index(), 0)));
    if (status.ok()) {
      const auto& trailer = stream.context->GetServerTrailingMetadata();
      auto said = [&](const char* key) {
        const auto it = trailer.find(key);
        return it == trailer.end() ? std::string() : std::string(it->second.data(), it->second.size());
      };
      report.set_outcome(said("sluice-source-elements") == "0" ? proto::SplitReport::EMPTY : proto::SplitReport::DONE);
      count_skipped(said("sluice-skipped"), said("sluice-skip-reasons-bin"), stream);
      if (follows_lineage_) learn_records_read(said("sluice-records-read-bin"));
      if (elements) {
        try {
          *elements = std::stoull(said("sluice-split-elements"));
        } catch (const std::exception&) {
          throw Error(fmt::format("the worker at {} did not say how many elements split {} of job '{}' had: it is not this version's",
                                  stream.worker, stream.split, job_.job_name()));
        }
        report.set_received(*elements);  // coordinated: this consumer has every one of its part
      }
    } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE || status.error_code() == grpc::StatusCode::CANCELLED ||
               status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || status.error_code() == grpc::StatusCode::UNKNOWN) {
      // A split that breaks again and again without giving anything new is not a worker that
      // died: it is one the workers cannot make (a crash on it): the run fails, naming it.
      int failures = 0;
      {
        std::lock_guard lock(mutex_);
        auto& count = failures_[stream.split];
        count = stream.received > stream.skip ? 1 : count + 1;
        failures = count;
      }
      if (failures >= kMostFailures)
        throw Error(fmt::format("split {} of job '{}' broke off {} times without a new element (last on the worker at {}: {}): the "
                                "workers cannot make it; see their logs",
                                stream.split, job_.job_name(), failures, stream.worker, detail::status_text(status)));
      report.set_outcome(proto::SplitReport::GIVEN_BACK);
      report.set_worker_unreachable(status.error_code() == grpc::StatusCode::UNAVAILABLE);
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * failures));  // a moment for the service to see what happened
    } else {
      throw Error(fmt::format("the service could not make split {} of job '{}' (worker at {}): {}", stream.split, job_.job_name(),
                              stream.worker, detail::status_text(status)));
    }
    proto::SplitReportReply ignored;
    ask_dispatcher("take the split's report", [&](grpc::ClientContext& c) { return dispatcher_->ReportSplit(&c, report, &ignored); });
    return report.outcome() != proto::SplitReport::GIVEN_BACK;
  }

  const int in_flight_;
  Security security_;
  std::string service_, target_, token_, reader_prefix_;
  proto::JobRequest job_;
  std::unique_ptr<proto::Dispatcher::Stub> dispatcher_;
  std::uint64_t job_id_ = 0, epoch_ = 0;
  std::vector<std::thread> readers_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable ready_cv_, room_cv_;
  std::deque<Sample> ready_;
  int readers_left_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::set<grpc::ClientContext*> streaming_;
  std::map<std::uint64_t, int> failures_;  // by split: streams broken in a row without a new element
  PooledHostAllocator pool_;
  Allocator* allocator_ = &pool_;
  HostStageCounters* counters_ = nullptr;  // the engine's: skips on the workers are counted here
  bool follows_lineage_ = false;           // the run follows lineage: the workers send each element's records
  DeliveryLedger records_read_;            // (lineage) the records of the files the workers read to their end
  std::vector<Lane> lanes_;                // coordinated reads: what each lane brought
  std::uint64_t round_ = 0;                // coordinated reads: the round and lane handed on next
  std::size_t lane_at_ = 0;
  std::thread keeper_;  // keep_job()
  std::mutex keeper_mutex_;
  std::condition_variable keeper_cv_;
  bool leaving_ = false;
};

// service_source's description (service_source_info.cpp, which the `sluice` command links
// without the service) and the source itself.
OperatorInfo ServiceSource::describe() {
  OperatorInfo info = service_source_info();
  info.create = [](const Params& p) { return std::make_unique<ServiceSource>(p); };
  return info;
}

}  // namespace

void add_service_operators(Registry& registry) {
  OperatorInfo info = ServiceSource::describe();
  if (registry.find(info.name)) return;
  registry.add_host_operator(std::move(info), "service");
}

void split_at_service(PipelineDocument& doc) {
  auto& stages = *doc.spec.mutable_stage();
  int at = -1;
  for (int i = 0; i < stages.size(); ++i)
    if (stages[i].has_distribute()) {
      if (at >= 0)
        throw SpecError({{doc.file, 0, 0, stages[i].id(), "distribute",
                          fmt::format("only one stage may be distributed (stage '{}' is too)", stages[at].id())}});
      at = i;
    }
  if (at < 0) return;
  const spec::Stage distributed = stages[at];
  const auto& d = distributed.distribute();
  auto refuse = [&](const std::string& message) { throw SpecError({{doc.file, 0, 0, distributed.id(), "distribute", message}}); };
  if (d.service().empty()) refuse("distribute needs service: \"grpc://HOST:PORT\" (the dispatcher)");
  // Without a name the job is this run's alone, as tf.data's anonymous jobs are.
  std::string job_name = d.job_name();
  if (d.num_consumers() > 0) {
    if (job_name.empty())
      refuse(fmt::format("coordinated reads (num_consumers: {}) need a job_name, the one the {} trainers share", d.num_consumers(), d.num_consumers()));
    if (!d.has_consumer_index() || d.consumer_index() >= d.num_consumers())
      refuse(fmt::format("coordinated reads among {} trainers need consumer_index, this trainer's, 0 to {}{}", d.num_consumers(),
                         d.num_consumers() - 1, d.has_consumer_index() ? fmt::format(" (not {})", d.consumer_index()) : ""));
  } else if (d.has_consumer_index()) {
    refuse("consumer_index is for coordinated reads: give num_consumers too (the trainers that read the job together)");
  }
  if (job_name.empty()) {
    std::random_device random;
    job_name = fmt::format("anonymous-{:08x}{:08x}", random(), random());
  }
  // The prefix: the distributed stage and every stage it reads from, directly or not.
  std::map<std::string, int> index;
  for (int i = 0; i < stages.size(); ++i) index[stages[i].id()] = i;
  std::set<int> prefix;
  std::function<void(int)> take = [&](int i) {
    if (!prefix.insert(i).second) return;
    for (const auto& input : stages[i].input())
      if (auto it = index.find(input); it != index.end()) take(it->second);
  };
  take(at);
  for (int i = 0; i < stages.size(); ++i) {
    if (prefix.count(i)) continue;
    for (const auto& input : stages[i].input())
      if (input != distributed.id() && index.count(input) && prefix.count(index[input]))
        refuse(fmt::format("stage '{}' reads '{}', which runs on the service: only the distributed stage's output comes back", stages[i].id(), input));
  }
  spec::PipelineSpec on_service;
  *on_service.mutable_options() = doc.spec.options();
  // The job is every trainer's: which trainer this is, and how a job of several processes
  // shards, are not the service's (its processing mode shares the work among its workers).
  on_service.mutable_options()->clear_worker_index();
  on_service.mutable_options()->clear_num_workers();
  on_service.mutable_options()->clear_sharding();
  on_service.mutable_options()->clear_equal_steps();
  spec::PipelineSpec here;
  *here.mutable_options() = doc.spec.options();
  std::vector<std::pair<int, int>> locations;
  for (int i = 0; i < stages.size(); ++i) {
    if (prefix.count(i)) {
      auto* stage = on_service.add_stage();
      *stage = stages[i];
      stage->clear_distribute();
    }
    if (prefix.count(i) && i != at) continue;
    auto* stage = here.add_stage();
    if (i < static_cast<int>(doc.stage_locations.size())) locations.push_back(doc.stage_locations[static_cast<std::size_t>(i)]);
    if (i != at) {
      *stage = stages[i];
      continue;
    }
    stage->set_id(distributed.id());
    stage->set_op(service_source_info().name);
    auto& params = *stage->mutable_params();
    params["service"] = d.service();
    params["job_name"] = job_name;
    params["pipeline"] = pipeline_to_text(on_service);
    if (!doc.file.empty()) {
      std::error_code ec;
      const auto file = std::filesystem::absolute(doc.file, ec);
      params["pipeline_file"] = ec ? doc.file : file.lexically_normal().string();
    }
    params["split_size"] = std::to_string(std::max<std::uint64_t>(d.split_size(), 1));
    params["processing_mode"] = d.processing_mode() == spec::Distribute::PROCESSING_MODE_UNSET ? "DYNAMIC" : spec::Distribute::ProcessingMode_Name(d.processing_mode());
    if (d.splits_in_flight() > 0) params["splits_in_flight"] = std::to_string(d.splits_in_flight());
    if (d.compression() == spec::Distribute::ZSTD || d.compression() == spec::Distribute::SNAPPY)
      params["compression"] = spec::Distribute::Compression_Name(d.compression());
    if (d.num_consumers() > 0) {
      params["num_consumers"] = std::to_string(d.num_consumers());
      params["consumer_index"] = std::to_string(d.consumer_index());
    }
    if (!d.token_file().empty()) params["token_file"] = d.token_file();
    if (!d.tls_ca().empty()) params["tls_ca"] = d.tls_ca();
  }
  doc.spec = here;
  doc.stage_locations = locations;
}

}  // namespace sluice::service
