// The dispatcher: the workers that registered, and whether each is still heard from.
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "job_ledger.hpp"
#include "security.hpp"
#include "service.grpc.pb.h"

namespace sluice::service {
namespace {

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class DispatcherService final : public proto::Dispatcher::Service {
 public:
  DispatcherService(const DispatcherOptions& options, std::string token, std::string address)
      : options_(options), token_(std::move(token)), address_(std::move(address)) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context, const proto::WorkerInfo* info, proto::RegisterReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    if (info->address().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "a worker registers with the address trainers reach it by"};
    std::lock_guard lock(mutex_);
    const std::uint64_t id = next_id_++;
    Known& known = workers_[id];
    known.info = *info;
    known.registered_unix_ms = unix_ms();
    known.last_seen = Clock::now();
    reply->set_worker_id(id);
    reply->set_heartbeat_ms(static_cast<std::uint32_t>(options_.heartbeat.count()));
    std::fprintf(stderr, "sluice dispatcher: worker %llu registered: %s (host %s, pid %lld, %d operators)%s\n",
                 static_cast<unsigned long long>(id), info->address().c_str(), info->host().c_str(), static_cast<long long>(info->pid()),
                 info->operators_size(), options_.security.insecure ? " [--insecure: no TLS, no token]" : "");
    return grpc::Status::OK;
  }

  grpc::Status WorkerHeartbeat(grpc::ServerContext* context, const proto::HeartbeatRequest* request, proto::HeartbeatReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    auto known = workers_.find(request->worker_id());
    reply->set_known(known != workers_.end());
    if (known == workers_.end()) return grpc::Status::OK;
    if (!alive(known->second))
      std::fprintf(stderr, "sluice dispatcher: worker %llu (%s) is heard from again\n", static_cast<unsigned long long>(known->first),
                   known->second.info.address().c_str());
    known->second.last_seen = Clock::now();
    known->second.reported_lost = false;
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext* context, const proto::ListWorkersRequest*, proto::WorkerList* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    for (auto& [id, known] : workers_) {
      auto* state = reply->add_workers();
      state->set_worker_id(id);
      *state->mutable_info() = known.info;
      state->set_alive(alive(known));
      state->set_last_seen_ms_ago(std::chrono::duration_cast<std::chrono::milliseconds>(now - known.last_seen).count());
      state->set_registered_unix_ms(known.registered_unix_ms);
    }
    reply->set_heartbeat_timeout_ms(lost_after().count());
    return grpc::Status::OK;
  }

  grpc::Status GetOrCreateJob(grpc::ServerContext* context, const proto::JobRequest* request, proto::JobReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    if (request->job_name().empty() || request->pipeline().empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, "a job needs a name and its pipeline"};
    std::lock_guard lock(mutex_);
    for (const auto& [id, job] : jobs_) {
      if (job.request.job_name() != request->job_name()) continue;
      if (job.request.pipeline() != request->pipeline() || job.request.split_size() != request->split_size())
        return {grpc::StatusCode::FAILED_PRECONDITION,
                fmt::format("job '{}' is another pipeline's: the trainers sharing a job name run the same pipeline file (give this one "
                            "another job_name)",
                            request->job_name())};
      reply->set_job_id(id);
      return grpc::Status::OK;
    }
    const std::uint64_t id = next_job_++;
    jobs_[id].request = *request;
    reply->set_job_id(id);
    std::fprintf(stderr, "sluice dispatcher: job %llu '%s' registered (splits of %llu source elements)\n", static_cast<unsigned long long>(id),
                 request->job_name().c_str(), static_cast<unsigned long long>(request->split_size()));
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* context, const proto::GetJobRequest* request, proto::JobRequest* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto job = jobs_.find(request->job_id());
    if (job == jobs_.end()) return {grpc::StatusCode::NOT_FOUND, fmt::format("the dispatcher has no job {}", request->job_id())};
    *reply = job->second.request;
    return grpc::Status::OK;
  }

  grpc::Status GetSplit(grpc::ServerContext* context, const proto::SplitRequest* request, proto::SplitReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto job = jobs_.find(request->job_id());
    if (job == jobs_.end()) return {grpc::StatusCode::NOT_FOUND, fmt::format("the dispatcher has no job {}", request->job_id())};
    std::vector<std::uint64_t> alive_workers;
    for (const auto& [id, known] : workers_)
      if (alive(known)) alive_workers.push_back(id);
    JobLedger::Given given;
    switch (job->second.epochs[request->epoch()].next_split(alive_workers, given)) {
      case JobLedger::Next::End: reply->set_kind(proto::SplitReply::END); break;
      case JobLedger::Next::Wait: reply->set_kind(proto::SplitReply::WAIT); break;
      case JobLedger::Next::Split:
        reply->set_kind(proto::SplitReply::SPLIT);
        reply->set_split(given.split);
        reply->set_skip(given.skip);
        reply->set_worker_id(given.worker);
        reply->set_worker_address(workers_.at(given.worker).info.address());
        break;
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportSplit(grpc::ServerContext* context, const proto::SplitReport* report, proto::SplitReportReply*) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto job = jobs_.find(report->job_id());
    if (job == jobs_.end()) return {grpc::StatusCode::NOT_FOUND, fmt::format("the dispatcher has no job {}", report->job_id())};
    JobLedger& ledger = job->second.epochs[report->epoch()];
    switch (report->outcome()) {
      case proto::SplitReport::DONE: ledger.done(report->split()); break;
      case proto::SplitReport::EMPTY: ledger.ended_at(report->split()); break;
      case proto::SplitReport::GIVEN_BACK:
        ledger.give_back(report->split(), report->received());
        // A trainer that cannot reach a worker need not wait for its heartbeats to stop: no split
        // goes to it until it is heard from again.
        if (auto known = workers_.find(report->worker_id()); report->worker_unreachable() && known != workers_.end() && alive(known->second)) {
          known->second.last_seen = Clock::now() - lost_after() - std::chrono::milliseconds(1);
          std::fprintf(stderr, "sluice dispatcher: worker %llu (%s) cannot be reached by a trainer: taken as lost until it is heard from again\n",
                       static_cast<unsigned long long>(known->first), known->second.info.address().c_str());
        }
        std::fprintf(stderr, "sluice dispatcher: job %llu epoch %llu: split %llu given back after %llu elements (its worker stopped answering)\n",
                     static_cast<unsigned long long>(report->job_id()), static_cast<unsigned long long>(report->epoch()),
                     static_cast<unsigned long long>(report->split()), static_cast<unsigned long long>(report->received()));
        break;
      default: return {grpc::StatusCode::INVALID_ARGUMENT, "an outcome this dispatcher does not know"};
    }
    return grpc::Status::OK;
  }

  // Says once when a worker stops being heard from (called from the dispatcher's watch).
  void report_lost() {
    std::lock_guard lock(mutex_);
    for (auto& [id, known] : workers_)
      if (!alive(known) && !known.reported_lost) {
        known.reported_lost = true;
        std::fprintf(stderr, "sluice dispatcher: worker %llu (%s) has not been heard from for %lld ms: taken as lost\n",
                     static_cast<unsigned long long>(id), known.info.address().c_str(), static_cast<long long>(lost_after().count()));
      }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Known {
    proto::WorkerInfo info;
    std::int64_t registered_unix_ms = 0;
    Clock::time_point last_seen;
    bool reported_lost = false;
  };
  std::chrono::milliseconds lost_after() const { return options_.heartbeat * options_.lost_after; }
  bool alive(const Known& known) const { return Clock::now() - known.last_seen <= lost_after(); }

  const DispatcherOptions options_;
  const std::string token_, address_;
  std::mutex mutex_;
  std::map<std::uint64_t, Known> workers_;
  std::uint64_t next_id_ = 1;
  struct Job {
    proto::JobRequest request;
    std::map<std::uint64_t, JobLedger> epochs;
  };
  std::map<std::uint64_t, Job> jobs_;
  std::uint64_t next_job_ = 1;
};

}  // namespace

struct Dispatcher::Impl {
  DispatcherOptions options;
  std::unique_ptr<DispatcherService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::mutex watch_mutex;
  std::condition_variable watch_cv;
  bool stopping = false;
  std::thread watch;  // says when a worker is lost
};

Dispatcher::Dispatcher(DispatcherOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  const std::string what = "the dispatcher";
  auto credentials = detail::server_credentials(options.bind, options.security, what);
  const std::string listen = fmt::format("{}:{}", options.bind.find(':') != std::string::npos && options.bind.front() != '[' ? "[" + options.bind + "]" : options.bind, options.port);
  impl_->service = std::make_unique<DispatcherService>(options, detail::read_token(options.security), listen);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials, &impl_->port);
  builder.RegisterService(impl_->service.get());
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0)
    throw ServiceError(fmt::format("{} cannot listen on {}: the address is in use or not this machine's; give another --port or --bind", what, listen));
  if (options.security.insecure && !is_loopback(options.bind))
    std::fprintf(stderr, "sluice dispatcher: --insecure: serving %s without TLS or a token; anyone who reaches it may use it\n", listen.c_str());
  impl_->watch = std::thread([impl = impl_.get()] {
    std::unique_lock lock(impl->watch_mutex);
    while (!impl->watch_cv.wait_for(lock, impl->options.heartbeat, [&] { return impl->stopping; })) impl->service->report_lost();
  });
}

Dispatcher::~Dispatcher() {
  shutdown();
  wait();
}

int Dispatcher::port() const { return impl_->port; }
std::string Dispatcher::address() const { return fmt::format("{}:{}", impl_->options.bind, impl_->port); }

void Dispatcher::shutdown() {
  {
    std::lock_guard lock(impl_->watch_mutex);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->watch_cv.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Dispatcher::wait() {
  impl_->server->Wait();
  if (impl_->watch.joinable()) impl_->watch.join();
}

std::vector<WorkerStatus> list_workers(const std::string& dispatcher, const Security& security) {
  const std::string target = grpc_target(dispatcher);
  auto stub = proto::Dispatcher::NewStub(detail::client_channel(target, security));
  auto context = detail::client_context(detail::read_token(security), std::chrono::seconds(10));
  proto::WorkerList reply;
  const grpc::Status status = stub->ListWorkers(context.get(), proto::ListWorkersRequest{}, &reply);
  if (!status.ok()) throw ServiceError(fmt::format("the dispatcher at {} did not answer: {}", target, detail::status_text(status)));
  std::vector<WorkerStatus> out;
  for (const auto& w : reply.workers())
    out.push_back({w.worker_id(), w.info().address(), w.info().host(), w.info().abi(), w.info().pid(), static_cast<std::size_t>(w.info().operators_size()),
                   w.alive(), w.last_seen_ms_ago()});
  return out;
}

}  // namespace sluice::service
