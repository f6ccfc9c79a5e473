// A worker: serves trainers, registered with the dispatcher and telling it, every heartbeat, that
// it is alive (registering again when the dispatcher no longer knows it).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "compression.hpp"
#include "job_fingerprint.hpp"
#include "security.hpp"
#include "service_stream.hpp"
#include "service.grpc.pb.h"
#include "sluice/abi.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/delivery_ledger.hpp"
#include "sluice/core/element_queue.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/lineage.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/core/workers.hpp"

namespace sluice::service {
namespace {

// The operator that cuts a DYNAMIC split with `role` (Skips, Takes: the std plugin's skip and take).
std::string cutting_operator(const Registry& registry, OperatorRole role, const proto::JobRequest& job) {
  if (const auto op = registry.with_role(role)) return op->info.name;
  throw Error(fmt::format("job '{}': DYNAMIC splits are cut by an operator that skips and one that takes (the std plugin's), and "
                          "none of this worker's operators {}: start the worker with the std plugin on its plugin path",
                          job.job_name(), role_name(role)));
}

// Split `request.split()` of a job's pipeline, ending in the stream's sink. DYNAMIC: its one
// source's elements [split * size, (split + 1) * size), cut by a skip and a take; OFF: a copy of
// the whole dataset with its own seed (worker `split` of `splits` with sharding off); static: shard
// `split` of `splits`, by file, by record or either, as a job of that many workers shards.
// Throws SpecError or Error.
PipelineDocument split_pipeline(const proto::JobRequest& job, const proto::ProduceRequest& request, const std::string& queue,
                                const Registry& registry) {
  // Named as the trainer's file: paths relative to it are of its folder here too.
  PipelineDocument doc = parse_pipeline(job.pipeline(), job.pipeline_file().empty() ? fmt::format("job '{}'", job.job_name()) : job.pipeline_file());
  auto& stages = *doc.spec.mutable_stage();
  std::set<std::string> consumed;
  for (const auto& stage : stages)
    for (const auto& input : stage.input()) consumed.insert(input);
  std::vector<std::string> ends;
  for (const auto& stage : stages)
    if (!consumed.count(stage.id())) ends.push_back(stage.id());
  if (ends.size() != 1) throw Error(fmt::format("job '{}' ends in {} stages: a job's pipeline ends in the one stage that is distributed", job.job_name(), ends.size()));
  auto add = [&](const std::string& id, const std::string& op, const std::string& input, std::map<std::string, std::string> params) {
    auto* stage = doc.spec.add_stage();
    stage->set_id(id);
    stage->set_op(op);
    stage->add_input(input);
    for (auto& [k, v] : params) (*stage->mutable_params())[k] = v;
  };
  add(kServiceStream, kServiceStream, ends.front(), {{"queue", queue}});
  if (job.mode() == proto::JobRequest::DYNAMIC) {
    std::vector<int> sources;
    for (int i = 0; i < stages.size(); ++i)
      if (stages[i].input().empty()) sources.push_back(i);
    if (sources.size() != 1)
      throw Error(fmt::format("job '{}' has {} sources: DYNAMIC mode splits the elements of one source (OFF or a static mode shard several)",
                              job.job_name(), sources.size()));
    const std::string source = stages[sources.front()].id(), split_skip = "service_split_skip", split_take = "service_split_take";
    // Random draws are keyed by stage and element position, and positions start again at 0 in
    // every split: the stages after the cut are named for their split ("work@split3"), so that
    // each split draws its own (the same split made again draws alike). The source keeps its name:
    // its order (list_files' shuffle) must be the same in every split.
    std::map<std::string, std::string> renamed{{source, split_take}};
    for (auto& stage : stages)
      if (stage.id() != source) renamed[stage.id()] = fmt::format("{}@split{}", stage.id(), request.split());
    for (auto& stage : stages) {
      if (stage.id() != source) stage.set_id(renamed.at(stage.id()));
      for (auto& input : *stage.mutable_input())
        if (auto it = renamed.find(input); it != renamed.end()) input = it->second;
    }
    const std::uint64_t size = std::max<std::uint64_t>(job.split_size(), 1);
    add(split_skip, cutting_operator(registry, OperatorRole::Skips, job), source, {{"count", std::to_string(request.split() * size)}});
    add(split_take, cutting_operator(registry, OperatorRole::Takes, job), split_skip, {{"count", std::to_string(size)}});
  } else {
    auto& options = *doc.spec.mutable_options();
    options.set_sharding(job.mode() == proto::JobRequest::OFF    ? spec::off
                         : job.mode() == proto::JobRequest::FILE ? spec::by_file
                         : job.mode() == proto::JobRequest::DATA ? spec::by_record
                                                                 : spec::automatic);
    WorkerIdentity identity;
    identity.index = static_cast<int>(request.split());
    identity.count = static_cast<int>(std::max<std::uint64_t>(request.splits(), 1));
    identity.source = job.mode() == proto::JobRequest::OFF ? "the service (OFF: a copy of the dataset each)" : "the service (a static shard each)";
    plan_for_worker(doc, registry, identity);  // (it builds the graph: the sink is there already)
  }
  doc.stage_locations.clear();
  return doc;
}

class WorkerService final : public proto::Worker::Service {
 public:
  WorkerService(const detail::TokenHolder& token, Registry* registry,
                std::function<std::optional<proto::JobRequest>(std::uint64_t, std::uint64_t, std::string&)> job_of)
      : token_(token), registry_(registry), job_of_(std::move(job_of)) {}
  ~WorkerService() override {
    std::lock_guard lock(dealt_mutex_);
    for (auto& [key, dealt] : dealt_) {
      {
        std::lock_guard held(dealt->mutex);
        dealt->aborted = true;
        dealt->cv.notify_all();
      }
      if (dealt->run.joinable()) dealt->run.join();
    }
  }
  std::atomic<std::uint64_t> id{0};
  std::atomic<bool> stopping{false};
  // What /metrics says (sluice_worker_*).
  std::atomic<std::uint64_t> splits_active{0}, splits_done{0}, splits_stopped{0}, splits_failed{0};
  std::atomic<std::uint64_t> elements_sent{0}, bytes_sent{0}, bytes_raw{0};
  std::atomic<std::uint64_t> splits_local{0};  // read through the Unix socket
  grpc::Status Ping(grpc::ServerContext* context, const proto::PingRequest*, proto::PingReply* reply) override {
    if (auto denied = token_.check(*context); !denied.ok()) return denied;
    reply->set_worker_id(id.load());
    return grpc::Status::OK;
  }

  // Runs the split's pipeline and streams its elements from `skip` on. The same split made again
  // (on this worker or another) gives the same elements: the run has the job's seed and epoch.
  grpc::Status ProduceSplit(grpc::ServerContext* context, const proto::ProduceRequest* request, grpc::ServerWriter<proto::Element>* out) override {
    if (auto denied = token_.check(*context); !denied.ok()) return denied;
    ++splits_active;
    if (context->peer().rfind("unix:", 0) == 0) ++splits_local;
    const grpc::Status status = make_split(context, request, out);
    --splits_active;
    ++(status.ok() ? splits_done : status.error_code() == grpc::StatusCode::CANCELLED ? splits_stopped : splits_failed);
    return status;
  }

  std::string prometheus() const {
    std::string out;
    out += "# HELP sluice_worker_splits_active Splits this worker is making now.\n# TYPE sluice_worker_splits_active gauge\n";
    out += fmt::format("sluice_worker_splits_active {}\n", splits_active.load());
    out += "# HELP sluice_worker_splits_total Splits made: whole (done), stopped by their trainer or by this worker stopping, failed.\n"
           "# TYPE sluice_worker_splits_total counter\n";
    out += fmt::format("sluice_worker_splits_total{{outcome=\"done\"}} {}\nsluice_worker_splits_total{{outcome=\"stopped\"}} {}\n"
                       "sluice_worker_splits_total{{outcome=\"failed\"}} {}\n",
                       splits_done.load(), splits_stopped.load(), splits_failed.load());
    out += fmt::format("# HELP sluice_worker_splits_local_total Splits read by trainers on this machine, through the Unix socket.\n"
                       "# TYPE sluice_worker_splits_local_total counter\nsluice_worker_splits_local_total {}\n",
                       splits_local.load());
    out += fmt::format("# HELP sluice_worker_elements_sent_total Elements streamed to trainers.\n# TYPE sluice_worker_elements_sent_total counter\n"
                       "sluice_worker_elements_sent_total {}\n",
                       elements_sent.load());
    out += fmt::format("# HELP sluice_worker_bytes_sent_total Bytes of elements streamed, as sent (compressed when the job asks).\n"
                       "# TYPE sluice_worker_bytes_sent_total counter\nsluice_worker_bytes_sent_total {}\n"
                       "# HELP sluice_worker_bytes_raw_total Bytes of the same elements before compression.\n"
                       "# TYPE sluice_worker_bytes_raw_total counter\nsluice_worker_bytes_raw_total {}\n",
                       bytes_sent.load(), bytes_raw.load());
    return out;
  }

 private:
  // What a split's run ended with: its status, and how many elements it had (positions) and how
  // many of the source's (DYNAMIC: none means the source ends before it).
  struct RunEnd {
    grpc::Status status;
    std::uint64_t positions = 0, source_elements = 0;
    std::uint64_t skipped = 0;         // elements the job's skip policy dropped here
    std::vector<std::string> reasons;  // the first few, each naming its stage
    std::string records_read;          // (lineage) "FIRST END WHERE" per line: the files read to their end
  };

  // Runs split `request.split()` of the job, handing `deliver` each element with its position
  // (from 0); stops early when `deliver` returns false or `cancelled()` says so (CANCELLED).
  RunEnd run_split(const proto::JobRequest& job, const proto::ProduceRequest& request, const std::function<bool(std::uint64_t, Sample&)>& deliver,
                   const std::function<bool()>& cancelled) {
    const std::string who = fmt::format("worker {}", id.load());
    auto queue = std::make_shared<ElementQueue>(64);
    const std::string handle = fmt::format("split:{}:{}:{}:{}", request.job_id(), request.epoch(), request.split(), next_handle_++);
    register_element_queue(handle, queue);
    struct Forget {
      std::string handle;
      ~Forget() { forget_element_queue(handle); }
    } forget{handle};
    std::unique_ptr<Engine> engine;
    try {
      PipelineDocument doc = split_pipeline(job, request, handle, *registry_);
      EngineOptions options;
      options.first_epoch = request.epoch();
      options.lineage = request.lineage();
      engine = std::make_unique<Engine>(build_graph(doc, *registry_), options);
      engine->start();
    } catch (const SpecError& e) {
      std::string text;
      for (const auto& problem : e.problems()) text += (text.empty() ? "" : "; ") + problem.message + (problem.stage.empty() ? "" : " (stage '" + problem.stage + "')");
      return {{grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{} cannot run job '{}': {}", who, job.job_name(), text)}};
    } catch (const std::exception& e) {
      return {{grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{} cannot run job '{}': {}", who, job.job_name(), e.what())}};
    }
    RunEnd end;
    Sample sample;
    bool sent_all = true;
    // The sink is finished only in Engine::wait(): once the engine's workers are done, what is
    // queued is the rest of the split.
    bool workers_done = false;
    for (;;) {
      const ElementQueue::Pop got = queue->pop(sample, std::chrono::milliseconds(workers_done ? 0 : 20));
      if (got == ElementQueue::Pop::Closed) break;
      if (got == ElementQueue::Pop::TimedOut) {
        if (workers_done) break;
        if (stopping.load() || cancelled()) {
          sent_all = false;
          break;
        }
        workers_done = engine->wait_for(std::chrono::milliseconds(0));
        continue;
      }
      if (cancelled() || !deliver(end.positions, sample)) {
        sent_all = false;
        break;
      }
      ++end.positions;
    }
    if (!sent_all || stopping.load()) {
      queue->cancel();
      engine->stop();
      engine->wait();
      end.status = {grpc::StatusCode::CANCELLED, fmt::format("{} stopped making split {} of job '{}'", who, request.split(), job.job_name())};
      return end;
    }
    const RunResult result = engine->wait();
    if (result.state == RunState::Failed) {
      end.status = {grpc::StatusCode::INTERNAL, fmt::format("{} failed making split {} of job '{}': {}", who, request.split(), job.job_name(), result.error)};
      return end;
    }
    const auto snapshot = engine->snapshot();
    for (const auto& stage : snapshot.stage()) {
      if (job.mode() == proto::JobRequest::DYNAMIC && stage.id() == "service_split_take") end.source_elements = stage.elements_out();
      end.skipped += stage.errors_skipped();
      // (Stages after the cut are named for their split: the trainer's file names them plainly.)
      const std::string stage_id = stage.id().substr(0, stage.id().find('@'));
      for (const auto& reason : stage.skip_reasons())
        if (end.reasons.size() < kReasonsSent) end.reasons.push_back(fmt::format("stage '{}' on worker {}: {}", stage_id, id.load(), reason));
    }
    if (request.lineage())
      for (const auto& file : engine->delivery_ledger(false).records_known())
        if (file.where.find('\n') == std::string::npos) end.records_read += fmt::format("{} {} {}\n", file.first, file.end, file.where);
    return end;
  }

  // The element on the wire: its compact form, compressed as the job asks.
  void wire_element(const proto::JobRequest& job, const proto::ProduceRequest& request, std::uint64_t position, const Sample& sample,
                    proto::Element& element) {
    element.set_position(position);
    if (request.lineage()) element.set_lineage(lineage_bytes(sample.shared_origin()));
    std::string raw = encode_sample(sample);
    element.set_raw_size(raw.size());
    element.set_element(detail::compress(job.compression(), std::move(raw)));
    bytes_raw += element.raw_size();
    bytes_sent += element.element().size();
  }

  // The trailer a trainer reads when the split ends whole: how many elements it had, and (DYNAMIC)
  // how many of the source's: none means the source ends before it (a split whose every element a
  // filter dropped has some).
  static void add_trailer(grpc::ServerContext* context, const proto::JobRequest& job, const RunEnd& end) {
    context->AddTrailingMetadata("sluice-split-elements", std::to_string(end.positions));
    if (end.skipped > 0) {
      // The trainer counts them as its own stage's skips (its report shows them).
      context->AddTrailingMetadata("sluice-skipped", std::to_string(end.skipped));
      context->AddTrailingMetadata("sluice-skip-reasons-bin", fmt::format("{}", fmt::join(end.reasons, "\n")));
    }
    if (job.mode() == proto::JobRequest::DYNAMIC) context->AddTrailingMetadata("sluice-source-elements", std::to_string(end.source_elements));
    if (!end.records_read.empty()) context->AddTrailingMetadata("sluice-records-read-bin", end.records_read);
  }

  grpc::Status make_split(grpc::ServerContext* context, const proto::ProduceRequest* request, grpc::ServerWriter<proto::Element>* out) {
    if (!registry_) return {grpc::StatusCode::FAILED_PRECONDITION, "this worker has no plugins to run pipelines with"};
    std::string why;
    const auto job = job_of_(request->job_id(), request->job_fingerprint(), why);
    if (!job) return {grpc::StatusCode::NOT_FOUND, why};
    if (request->num_consumers() > 0) return deal_split(context, *job, *request, out);
    proto::Element element;
    const RunEnd end = run_split(
        *job, *request,
        [&](std::uint64_t position, Sample& sample) {
          if (position < request->skip()) return true;
          wire_element(*job, *request, position, sample, element);
          ++elements_sent;
          return out->Write(element);  // false: the trainer went away
        },
        [&] { return context->IsCancelled(); });
    if (end.status.ok()) add_trailer(context, *job, end);
    return end.status;
  }

  // Coordinated reads: the consumers of a split's lease share one run of it, which deals each
  // element to the consumer whose turn it is (a consumer's queue full holds the run back: the
  // consumers go at the pace of the slowest). A consumer that goes away stops the run for all.
  struct Dealt {
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<std::deque<proto::Element>> queues;  // by consumer
    bool ended = false, aborted = false;
    RunEnd end;
    std::thread run;
    std::chrono::steady_clock::time_point ended_at;
  };
  static constexpr std::size_t kDealtQueue = 16;
  static constexpr std::size_t kReasonsSent = 8;

  std::shared_ptr<Dealt> dealt_for(const proto::JobRequest& job, const proto::ProduceRequest& request) {
    std::lock_guard lock(dealt_mutex_);
    // Runs over a minute ago are let go (a consumer comes for its part within moments, or never).
    const auto now = std::chrono::steady_clock::now();
    for (auto it = dealt_.begin(); it != dealt_.end();) {
      bool old = false;
      {
        std::lock_guard held(it->second->mutex);
        old = it->second->ended && now - it->second->ended_at > std::chrono::minutes(1);
      }
      if (old && it->second->run.joinable()) it->second->run.join();
      it = old ? dealt_.erase(it) : std::next(it);
    }
    auto& dealt = dealt_[{request.job_id(), request.epoch(), request.split(), request.lease()}];
    if (dealt) return dealt;
    dealt = std::make_shared<Dealt>();
    dealt->queues.resize(request.num_consumers());
    dealt->run = std::thread([this, dealt = dealt, job, request] {
      const std::uint32_t consumers = request.num_consumers();
      RunEnd end = run_split(
          job, request,
          [&](std::uint64_t position, Sample& sample) {
            const auto consumer = static_cast<std::uint32_t>((position + request.deal_offset()) % consumers);
            const std::uint64_t needed = consumer < static_cast<std::uint32_t>(request.consumer_next_size()) ? request.consumer_next(static_cast<int>(consumer)) : 0;
            if (position < std::max(request.skip(), needed)) return true;  // it has this one
            proto::Element element;
            wire_element(job, request, position, sample, element);
            std::unique_lock lock(dealt->mutex);
            dealt->cv.wait(lock, [&] { return dealt->queues[consumer].size() < kDealtQueue || dealt->aborted || stopping.load(); });
            if (dealt->aborted || stopping.load()) return false;
            dealt->queues[consumer].push_back(std::move(element));
            dealt->cv.notify_all();
            return true;
          },
          [&] {
            std::lock_guard lock(dealt->mutex);
            return dealt->aborted;
          });
      std::lock_guard lock(dealt->mutex);
      dealt->end = std::move(end);
      dealt->ended = true;
      dealt->ended_at = std::chrono::steady_clock::now();
      dealt->cv.notify_all();
    });
    return dealt;
  }

  grpc::Status deal_split(grpc::ServerContext* context, const proto::JobRequest& job, const proto::ProduceRequest& request,
                          grpc::ServerWriter<proto::Element>* out) {
    if (request.consumer_index() >= request.num_consumers())
      return {grpc::StatusCode::INVALID_ARGUMENT, fmt::format("consumer {} of {}: no such consumer", request.consumer_index(), request.num_consumers())};
    const auto dealt = dealt_for(job, request);
    auto& mine = dealt->queues[request.consumer_index()];
    auto abort = [&] {
      std::lock_guard lock(dealt->mutex);
      dealt->aborted = true;
      dealt->cv.notify_all();
    };
    for (;;) {
      std::unique_lock lock(dealt->mutex);
      dealt->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return !mine.empty() || dealt->ended || dealt->aborted; });
      if (mine.empty() && dealt->ended) break;
      if (dealt->aborted || stopping.load() || context->IsCancelled()) {
        dealt->aborted = true;
        dealt->cv.notify_all();
        return {grpc::StatusCode::CANCELLED, fmt::format("worker {} stopped making split {} of job '{}' (a consumer of it went away)",
                                                         id.load(), request.split(), job.job_name())};
      }
      if (mine.empty()) continue;
      proto::Element element = std::move(mine.front());
      mine.pop_front();
      dealt->cv.notify_all();
      lock.unlock();
      ++elements_sent;
      if (!out->Write(element)) {
        abort();
        return {grpc::StatusCode::CANCELLED, "the trainer went away"};
      }
    }
    std::lock_guard lock(dealt->mutex);
    if (dealt->end.status.ok()) add_trailer(context, job, dealt->end);
    return dealt->end.status;
  }

 private:
  const detail::TokenHolder& token_;
  Registry* registry_;
  std::mutex dealt_mutex_;
  std::map<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>, std::shared_ptr<Dealt>> dealt_;  // by job, epoch, split, lease
  std::function<std::optional<proto::JobRequest>(std::uint64_t, std::uint64_t, std::string&)> job_of_;
  std::atomic<std::uint64_t> next_handle_{0};
};

}  // namespace

struct Worker::Impl {
  WorkerOptions options;
  std::shared_ptr<detail::TokenHolder> token = std::make_shared<detail::TokenHolder>();  // the dispatcher's: checked on trainers' calls, sent with its own
  std::string address, dispatcher_target;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<proto::Dispatcher::Stub> dispatcher;
  int port = 0;
  std::mutex jobs_mutex;
  std::map<std::uint64_t, proto::JobRequest> jobs;  // asked of the dispatcher once each

  // The job of that id whose fingerprint is `fingerprint`, asked of the dispatcher unless known.
  std::optional<proto::JobRequest> job_of(std::uint64_t job_id, std::uint64_t fingerprint, std::string& why) {
    {
      std::lock_guard lock(jobs_mutex);
      if (auto it = jobs.find(job_id); it != jobs.end() && detail::job_fingerprint(it->second) == fingerprint) return it->second;
    }
    auto context = detail::client_context(token->get(), std::chrono::seconds(10));
    proto::GetJobRequest request;
    request.set_job_id(job_id);
    proto::JobRequest job;
    const grpc::Status status = dispatcher->GetJob(context.get(), request, &job);
    if (!status.ok()) {
      why = fmt::format("the dispatcher at {} did not give job {}: {}", dispatcher_target, job_id, detail::status_text(status));
      return std::nullopt;
    }
    if (detail::job_fingerprint(job) != fingerprint) {
      why = fmt::format("job {} at the dispatcher at {} is not the job the trainer reads ('{}'): was the dispatcher restarted without "
                        "its journal (--work-dir)? Start the trainer again",
                        job_id, dispatcher_target, job.job_name());
      return std::nullopt;
    }
    std::lock_guard lock(jobs_mutex);
    return jobs.insert_or_assign(job_id, std::move(job)).first->second;
  }
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::thread heartbeat;
  std::string socket_path;  // the Unix socket trainers on this machine read, when there is one
  std::string metrics_address;  // as others reach it (a wildcard bind named by this machine's name)

  proto::WorkerInfo info() const {
    proto::WorkerInfo out;
    out.set_address(address);
    out.set_host(detail::machine_name());
    out.set_pid(::getpid());
    for (const auto& op : options.operators) out.add_operators(op);
    out.set_abi(fmt::format("{}.{}", kAbiMajor, kAbiMinor));
    if (!socket_path.empty()) out.set_local_address("unix:" + socket_path);
    out.set_metrics_address(metrics_address);
    return out;
  }
  // One try; false (with `why`) when the dispatcher did not answer.
  bool register_once(std::string& why, std::chrono::milliseconds& heartbeat_every) {
    auto context = detail::client_context(token->get(), std::chrono::seconds(5));
    proto::RegisterReply reply;
    const grpc::Status status = dispatcher->RegisterWorker(context.get(), info(), &reply);
    if (!status.ok()) {
      why = detail::status_text(status);
      // Refused (not merely unreachable): trying again would not help.
      // (A dispatcher on loopback that has just started may not have written its token yet.)
      const bool token_not_yet = status.error_code() == grpc::StatusCode::UNAUTHENTICATED && options.security.token_file.empty() &&
                                 std::chrono::steady_clock::now() < started + std::chrono::seconds(3);
      if ((status.error_code() == grpc::StatusCode::UNAUTHENTICATED && !token_not_yet) || status.error_code() == grpc::StatusCode::PERMISSION_DENIED)
        throw ServiceError(fmt::format("the dispatcher at {} refused this worker: {}", dispatcher_target, why));
      return false;
    }
    service->id = reply.worker_id();
    heartbeat_every = std::chrono::milliseconds(std::max<std::uint32_t>(reply.heartbeat_ms(), 10));
    return true;
  }
};

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.options = options;
  w.dispatcher_target = grpc_target(options.dispatcher);
  if (!options.security.token_file.empty()) w.token->set(detail::read_token(options.security));
  auto credentials = detail::server_credentials(options.bind, options.security, "the worker", w.token);
  const std::string listen = fmt::format("{}:{}", options.bind, options.port);
  if (options.registry) add_service_stream(*options.registry);
  w.service = std::make_unique<WorkerService>(*w.token, options.registry,
                                              [&w](std::uint64_t job, std::uint64_t fingerprint, std::string& why) { return w.job_of(job, fingerprint, why); });
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port held elsewhere is an error, not shared (dispatcher.cpp)
  builder.AddListeningPort(listen, credentials, &w.port);
  if (options.unix_socket) {
    // Only this machine reaches it (the token is still checked): no TLS.
    const char* tmp = std::getenv("TMPDIR");
    std::random_device random;
    w.socket_path = fmt::format("{}/sluice-worker-{}-{:08x}.sock", tmp && *tmp ? tmp : "/tmp", ::getpid(), random());
    builder.AddListeningPort("unix:" + w.socket_path, grpc::InsecureServerCredentials());
  }
  builder.RegisterService(w.service.get());
  w.server = builder.BuildAndStart();
  if (!w.server || w.port == 0)
    throw ServiceError(fmt::format("the worker cannot listen on {}: the address is in use or not this machine's; give another --port or --bind", listen));
  const std::string host = !options.host.empty() ? options.host : (options.bind == "0.0.0.0" || options.bind == "::") ? detail::machine_name() : options.bind;
  w.address = fmt::format("{}:{}", host, w.port);
  if (!options.metrics_address.empty()) {
    // Served on every address: named as the worker is (by this machine's name when the worker
    // itself is on loopback only).
    const auto colon = options.metrics_address.rfind(':');
    const std::string metrics_host = options.metrics_address.substr(0, colon == std::string::npos ? 0 : colon);
    const bool wildcard = metrics_host == "0.0.0.0" || metrics_host == "[::]" || metrics_host == "::";
    const std::string reachable = is_loopback(host) ? detail::machine_name() : host;
    w.metrics_address = wildcard ? reachable + options.metrics_address.substr(colon) : options.metrics_address;
  }
  if (options.security.insecure && !is_loopback(options.bind))
    std::fprintf(stderr, "sluice worker: --insecure: serving %s without TLS or a token; anyone who reaches it may use it\n", listen.c_str());

  // The dispatcher may start after its workers: keep trying for a while, saying so once.
  w.dispatcher = proto::Dispatcher::NewStub(detail::client_channel(w.dispatcher_target, options.security));
  std::chrono::milliseconds every{500};
  std::string why;
  const auto give_up = std::chrono::steady_clock::now() + options.wait_for_dispatcher;
  bool said = false;
  for (;;) {
    // The token of a dispatcher on loopback is read from where it keeps it: it may start later.
    if (options.security.token_file.empty()) w.token->set(detail::client_token(w.dispatcher_target, options.security));
    if (w.register_once(why, every)) break;
    if (std::chrono::steady_clock::now() >= give_up) {
      w.server->Shutdown();
      throw ServiceError(fmt::format("the dispatcher at {} did not answer for {} s ({}): is it started, and is the address right?",
                                     w.dispatcher_target, options.wait_for_dispatcher.count() / 1000, why));
    }
    if (!said) std::fprintf(stderr, "sluice worker: waiting for the dispatcher at %s (%s)\n", w.dispatcher_target.c_str(), why.c_str());
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::fprintf(stderr, "sluice worker: worker %llu at %s, registered with the dispatcher at %s\n",
               static_cast<unsigned long long>(w.service->id.load()), w.address.c_str(), w.dispatcher_target.c_str());
  w.heartbeat = std::thread([&w, every] {
    std::unique_lock lock(w.mutex);
    bool unreachable = false;
    while (!w.cv.wait_for(lock, every, [&] { return w.stopping; })) {
      lock.unlock();
      auto context = detail::client_context(w.token->get(), every * 4);
      proto::HeartbeatRequest request;
      request.set_worker_id(w.service->id.load());
      proto::HeartbeatReply reply;
      const grpc::Status status = w.dispatcher->WorkerHeartbeat(context.get(), request, &reply);
      if (!status.ok() && !unreachable)
        std::fprintf(stderr, "sluice worker: the dispatcher at %s does not answer (%s); still trying\n", w.dispatcher_target.c_str(),
                     detail::status_text(status).c_str());
      unreachable = !status.ok();
      if (status.ok() && !reply.known()) {  // a dispatcher restarted without this worker: register again
        std::string why;
        std::chrono::milliseconds again = every;
        try {
          if (w.register_once(why, again))
            std::fprintf(stderr, "sluice worker: registered again with the dispatcher at %s as worker %llu\n", w.dispatcher_target.c_str(),
                         static_cast<unsigned long long>(w.service->id.load()));
        } catch (const ServiceError& e) {
          std::fprintf(stderr, "sluice worker: %s\n", e.what());
        }
      }
      lock.lock();
    }
  });
}

Worker::~Worker() {
  shutdown();
  wait();
}

int Worker::port() const { return impl_->port; }
std::string Worker::address() const { return impl_->address; }
std::uint64_t Worker::id() const { return impl_->service->id.load(); }
std::string Worker::prometheus() const { return impl_->service->prometheus(); }

void Worker::shutdown() {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->service->stopping = true;  // the splits being made end their streams
  impl_->cv.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Worker::wait() {
  impl_->server->Wait();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
  if (!impl_->socket_path.empty()) ::unlink(impl_->socket_path.c_str());
}

}  // namespace sluice::service
