// The dispatcher: the workers that registered and whether each is still heard from, the jobs
// trainers registered, and each job's splits per epoch (JobLedger); with a work folder, all of it
// in a journal written before each answer that changes it.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "job_fingerprint.hpp"
#include "job_ledger.hpp"
#include "journal_file.hpp"
#include "security.hpp"
#include "service.grpc.pb.h"
#include <grpcpp/resource_quota.h>
#include "sluice/core/atomic_file.hpp"
#include "sluice/core/spec.hpp"

namespace sluice::service {
namespace {

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool is_static(proto::JobRequest::Mode mode) {
  return mode == proto::JobRequest::FILE || mode == proto::JobRequest::DATA || mode == proto::JobRequest::FILE_OR_DATA;
}

// The operators a job's workers need: its stages'. (In DYNAMIC mode a worker also needs what cuts
// its splits, the operators that skip and take: it finds them by their roles, and a worker
// without them fails the split naming them.) Throws SpecError for a pipeline text that does not parse.
std::vector<std::string> operators_of(const proto::JobRequest& job) {
  const PipelineDocument doc = parse_pipeline(job.pipeline(), job.pipeline_file().empty() ? fmt::format("job '{}'", job.job_name()) : job.pipeline_file());
  std::set<std::string> ops;
  for (const auto& stage : doc.spec.stage()) ops.insert(stage.op());
  return {ops.begin(), ops.end()};
}

class DispatcherService final : public proto::Dispatcher::Service {
 public:
  DispatcherService(const DispatcherOptions& options, std::string token) : options_(options), token_(std::move(token)) {
    if (options_.work_dir.empty()) return;
    load_journal();
    journaled_ = decided();
  }

  grpc::Status RegisterWorker(grpc::ServerContext* context, const proto::WorkerInfo* info, proto::RegisterReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    if (info->address().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "a worker registers with the address trainers reach it by"};
    const auto& fixed = options_.worker_addresses;
    if (!fixed.empty() && std::find(fixed.begin(), fixed.end(), info->address()) == fixed.end())
      return {grpc::StatusCode::PERMISSION_DENIED,
              fmt::format("the worker at {} is not in the dispatcher's fixed list (--worker-addresses {}): start it with --port and "
                          "--host as listed, or add it to the list",
                          info->address(), fmt::join(fixed, ","))};
    std::lock_guard lock(mutex_);
    // A worker started again at the same address takes the place it had (a static shard's worker).
    std::uint64_t id = 0;
    for (const auto& [known_id, known] : workers_)
      if (known.info.address() == info->address()) id = known_id;
    const bool again = id != 0;
    if (!again) id = next_id_++;
    Known& known = workers_[id];
    known.info = *info;
    known.operators = {info->operators().begin(), info->operators().end()};
    known.registered_unix_ms = unix_ms();
    known.last_seen = Clock::now();
    known.reported_lost = false;
    if (auto failed = save_journal(); !failed.ok()) return failed;
    reply->set_worker_id(id);
    reply->set_heartbeat_ms(static_cast<std::uint32_t>(options_.heartbeat.count()));
    std::fprintf(stderr, "sluice dispatcher: worker %llu %s: %s (host %s, pid %lld, %d operators)%s\n", static_cast<unsigned long long>(id),
                 again ? "registered again" : "registered", info->address().c_str(), info->host().c_str(), static_cast<long long>(info->pid()),
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
    if (is_static(request->mode()) && options_.worker_addresses.empty())
      return {grpc::StatusCode::FAILED_PRECONDITION,
              fmt::format("job '{}' shards statically ({}), which needs a fixed worker list: start the dispatcher with "
                          "--worker-addresses HOST:PORT,... (each worker with the --port and --host listed), or use DYNAMIC",
                          request->job_name(), proto::JobRequest::Mode_Name(request->mode()))};
    proto::JobRequest job = *request;
    try {
      for (const auto& op : operators_of(job)) job.add_operators(op);
    } catch (const std::exception& e) {
      return {grpc::StatusCode::INVALID_ARGUMENT, fmt::format("job '{}' has a pipeline the dispatcher cannot read: {}", job.job_name(), e.what())};
    }
    if (job.num_consumers() > 0 && (job.consumer_index() < 0 || static_cast<std::uint32_t>(job.consumer_index()) >= job.num_consumers()))
      return {grpc::StatusCode::INVALID_ARGUMENT, fmt::format("job '{}' is read by {} consumers: consumer_index is 0 to {}, not {}", job.job_name(),
                                                              job.num_consumers(), job.num_consumers() - 1, job.consumer_index())};
    std::lock_guard lock(mutex_);
    for (const auto& [id, known] : jobs_) {
      if (known.request.job_name() != job.job_name()) continue;  // (a job whose trainers all left is gone from here)
      if (known.request.pipeline() != job.pipeline() || detail::pipeline_folder(known.request) != detail::pipeline_folder(job) ||
          known.request.split_size() != job.split_size() || known.request.mode() != job.mode() ||
          known.request.compression() != job.compression() || known.request.num_consumers() != job.num_consumers() ||
          known.request.lanes() != job.lanes())
        return {grpc::StatusCode::FAILED_PRECONDITION,
                fmt::format("job '{}' is another pipeline's: the trainers sharing a job name send the same stages, from files in "
                            "the same folder (give this one another job_name)",
                            job.job_name())};
      if (auto taken = take_consumer(jobs_[id], job); !taken.ok()) return taken;
      if (!job.client().empty()) jobs_[id].clients[job.client()] = Clock::now();
      reply->set_job_id(id);
      return grpc::Status::OK;
    }
    const std::uint64_t id = next_job_++;
    Job& created = jobs_[id];
    created.request = job;
    created.request.clear_client();
    created.request.clear_consumer_index();
    take_consumer(created, job);
    // Without a trainer named (none should be), kept a while; with one, over when it leaves.
    created.keep_until = Clock::now() + (job.client().empty() ? std::chrono::seconds(kTrainerTimeout) : std::chrono::seconds(0));
    if (!job.client().empty()) created.clients[job.client()] = Clock::now();
    if (auto failed = save_journal(); !failed.ok()) return failed;
    reply->set_job_id(id);
    const std::string coordinated =
        job.num_consumers() > 0 ? fmt::format("; coordinated among {} consumers, {} splits at a time", job.num_consumers(), job.lanes()) : "";
    if (job.mode() == proto::JobRequest::DYNAMIC)
      std::fprintf(stderr, "sluice dispatcher: job %llu '%s' registered (DYNAMIC: splits of %llu source elements%s)\n",
                   static_cast<unsigned long long>(id), job.job_name().c_str(), static_cast<unsigned long long>(job.split_size()), coordinated.c_str());
    else
      std::fprintf(stderr, "sluice dispatcher: job %llu '%s' registered (%s%s)\n", static_cast<unsigned long long>(id), job.job_name().c_str(),
                   proto::JobRequest::Mode_Name(job.mode()).c_str(), coordinated.c_str());
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
    // Asked again (the answer was lost): the same answer.
    if (auto answered = answers_.find(request->reader()); !request->reader().empty() && answered != answers_.end() &&
                                                          answered->second.sequence() == request->sequence()) {
      *reply = answered->second.reply();
      return grpc::Status::OK;
    }
    const auto found = jobs_.find(request->job_id());
    if (found == jobs_.end())
      return {grpc::StatusCode::NOT_FOUND, fmt::format("the dispatcher has no job {} (it ended, its trainers gone, or the dispatcher was restarted "
                                                       "without its journal): start the trainer again",
                                                       request->job_id())};
    Job& job = found->second;
    if (!job.broken.empty()) return {grpc::StatusCode::FAILED_PRECONDITION, job.broken};
    std::vector<std::uint64_t> able;
    if (auto refused = able_workers(found->first, job, able); !refused.ok()) return refused;
    JobLedger* ledger = ledger_of(job, request->epoch(), able);
    if (!ledger) {
      reply->set_kind(proto::SplitReply::WAIT);
      reply->set_waiting_for("no worker is alive at the dispatcher");
      return grpc::Status::OK;
    }
    if (job.request.num_consumers() > 0) return coordinated_split(job, *request, *ledger, able, *reply);
    // A reader asking is a trainer of the job as its heartbeats are: when it is no longer heard
    // from, the splits in its hands go back (reclaim_unheard).
    if (!request->reader().empty()) job.clients[trainer_of(request->reader())] = Clock::now();
    JobLedger::Given given;
    switch (ledger->next_split(able, given, request->reader())) {
      case JobLedger::Next::End: reply->set_kind(proto::SplitReply::END); return grpc::Status::OK;
      case JobLedger::Next::Wait:
        reply->set_kind(proto::SplitReply::WAIT);
        if (able.empty()) reply->set_waiting_for("no worker is alive at the dispatcher");
        return grpc::Status::OK;
      case JobLedger::Next::Split: break;
    }
    ++job.handed_out;
    answer_split(given, *ledger, *reply);
    if (!request->reader().empty()) remember_answer(*request, *reply);
    return save_journal();
  }

  grpc::Status ReportSplit(grpc::ServerContext* context, const proto::SplitReport* report, proto::SplitReportReply*) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto job = jobs_.find(report->job_id());
    if (job == jobs_.end()) return {grpc::StatusCode::NOT_FOUND, fmt::format("the dispatcher has no job {}", report->job_id())};
    const auto epoch = job->second.epochs.find(report->epoch());
    if (epoch == job->second.epochs.end()) return {grpc::StatusCode::NOT_FOUND, fmt::format("job {} has no epoch {}", report->job_id(), report->epoch())};
    JobLedger& ledger = epoch->second;
    if (job->second.request.num_consumers() > 0) return coordinated_report(job->second, *report, ledger);
    if (auto refused = check_reporter(job->second, *report, ledger); !refused.ok()) return refused;
    bool changed = false;
    switch (report->outcome()) {
      case proto::SplitReport::DONE:
        changed = ledger.done(report->split(), report->lease());
        job->second.done += changed;
        break;
      case proto::SplitReport::EMPTY: changed = ledger.ended_at(report->split(), report->lease()) || ledger.done(report->split(), report->lease()); break;
      case proto::SplitReport::GIVEN_BACK:
        changed = ledger.give_back(report->split(), report->lease(), report->received());
        if (changed) {
          ++job->second.given_back;
          given_back(*report);
        }
        break;
      default: return {grpc::StatusCode::INVALID_ARGUMENT, "an outcome this dispatcher does not know"};
    }
    return changed ? save_journal() : grpc::Status::OK;  // a report sent twice changes nothing
  }

  std::string prometheus() {
    std::lock_guard lock(mutex_);
    std::size_t alive_count = 0;
    std::map<std::uint64_t, std::size_t> in_hand;  // by worker, over every job's epochs
    for (const auto& [id, known] : workers_) alive_count += alive(known);
    for (const auto& [id, job] : jobs_)
      for (const auto& [epoch, ledger] : job.epochs)
        for (const auto& [worker, count] : ledger.load()) in_hand[worker] += count;
    std::string out;
    out += "# HELP sluice_dispatcher_workers Workers registered, by whether they are heard from.\n# TYPE sluice_dispatcher_workers gauge\n";
    out += fmt::format("sluice_dispatcher_workers{{state=\"alive\"}} {}\nsluice_dispatcher_workers{{state=\"lost\"}} {}\n", alive_count,
                       workers_.size() - alive_count);
    // Every worker, with where it is and where its own /metrics is (the studio follows them from here).
    out += "# HELP sluice_dispatcher_worker_alive Whether a registered worker is heard from (1) or lost (0).\n"
           "# TYPE sluice_dispatcher_worker_alive gauge\n";
    for (const auto& [id, known] : workers_)
      out += fmt::format("sluice_dispatcher_worker_alive{{worker=\"{}\",address=\"{}\",host=\"{}\",metrics=\"{}\"}} {}\n", id,
                         known.info.address(), known.info.host(), known.info.metrics_address(), alive(known) ? 1 : 0);
    out += "# HELP sluice_dispatcher_worker_splits_in_hand Splits a worker is making for trainers.\n# TYPE sluice_dispatcher_worker_splits_in_hand gauge\n";
    for (const auto& [id, known] : workers_)
      out += fmt::format("sluice_dispatcher_worker_splits_in_hand{{worker=\"{}\",address=\"{}\"}} {}\n", id, known.info.address(),
                         in_hand.count(id) ? in_hand[id] : 0);
    out += fmt::format("# HELP sluice_dispatcher_jobs Jobs trainers registered.\n# TYPE sluice_dispatcher_jobs gauge\nsluice_dispatcher_jobs {}\n",
                       jobs_.size());
    out += "# HELP sluice_dispatcher_splits_total Splits of a job handed out, delivered whole, and given back by trainers whose worker "
           "stopped answering.\n# TYPE sluice_dispatcher_splits_total counter\n";
    auto totals = ended_totals_;  // by job name: counters stay when jobs end
    for (const auto& [id, job] : jobs_) {
      auto& t = totals[job.request.job_name()];
      t[0] += job.handed_out, t[1] += job.done, t[2] += job.given_back;
    }
    for (const auto& [name, t] : totals)
      for (std::size_t k = 0; k < 3; ++k)
        out += fmt::format("sluice_dispatcher_splits_total{{job=\"{}\",outcome=\"{}\"}} {}\n", name,
                           k == 0 ? "handed_out" : k == 1 ? "done" : "given_back", t[k]);
    return out;
  }

  grpc::Status JobClient(grpc::ServerContext* context, const proto::JobClientRequest* request, proto::JobClientReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    std::lock_guard lock(mutex_);
    const auto job = jobs_.find(request->job_id());
    reply->set_known(job != jobs_.end());
    if (job == jobs_.end()) return grpc::Status::OK;
    if (!request->leaving()) {
      job->second.clients[request->client()] = Clock::now();
      if (request->has_consumer_index() && job->second.request.num_consumers() > 0) job->second.consumers[request->client()] = request->consumer_index();
      return grpc::Status::OK;
    }
    job->second.clients.erase(request->client());
    consumer_left(job->second, request->client(), "left");
    return retire_if_left(job) ? save_journal() : grpc::Status::OK;
  }

  // Says once when a worker stops being heard from, and ends the jobs whose trainers have all
  // left (called from the dispatcher's watch).
  void report_lost() {
    std::lock_guard lock(mutex_);
    bool retired = false;
    const auto now = Clock::now();
    for (auto job = jobs_.begin(); job != jobs_.end();) {
      for (auto c = job->second.clients.begin(); c != job->second.clients.end();) {
        if (now - c->second <= kTrainerTimeout) {
          ++c;
          continue;
        }
        consumer_left(job->second, c->first, "has not been heard from for 10 s");
        c = job->second.clients.erase(c);
      }
      const auto next = std::next(job);
      retired |= retire_if_left(job);
      job = next;
    }
    if (retired | reclaim_unheard()) save_journal();
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
    std::set<std::string> operators;
    std::int64_t registered_unix_ms = 0;
    Clock::time_point last_seen;
    bool reported_lost = false;
  };
  struct Job {
    proto::JobRequest request;
    std::map<std::uint64_t, JobLedger> epochs;
    std::set<std::uint64_t> said_unable;  // workers whose missing operators the log named
    std::uint64_t handed_out = 0, done = 0, given_back = 0;  // splits, over every epoch (since this dispatcher started)
    std::map<std::string, Clock::time_point> clients;  // trainers reading it, when last heard from
    Clock::time_point keep_until;                      // a job begun (or restored) is kept this long without trainers
    // Coordinated reads: each epoch's lanes' slots (lane, slot) in hand, the consumer each trainer
    // is, and why the job cannot go on (a consumer left in mid-epoch).
    struct Slot {
      JobLedger::Given given;
      std::map<std::uint32_t, proto::CoordinatedSlot::Report> reports;  // by consumer, of the lease given
      std::vector<std::uint64_t> next;  // handed again: the position each consumer needs next
    };
    std::map<std::uint64_t, std::map<std::pair<std::uint32_t, std::uint64_t>, Slot>> slots;  // by epoch
    std::map<std::string, std::uint32_t> consumers;  // by trainer
    std::string broken;
    std::set<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> taken;  // leases taken back (epoch, split, lease)
  };
  // A trainer sends a heartbeat every second: one not heard from for this long has left.
  static constexpr std::chrono::seconds kTrainerTimeout{10};
  std::chrono::milliseconds lost_after() const { return options_.heartbeat * options_.lost_after; }
  bool alive(const Known& known) const { return Clock::now() - known.last_seen <= lost_after(); }

  // The trainer a reader belongs to: its name up to the last '-' (readers are "TRAINER-k").
  static std::string trainer_of(const std::string& reader) { return reader.substr(0, std::min(reader.rfind('-'), reader.size())); }

  // A report names the reader the split was handed to: another reader's is refused (any local
  // process holding the token could otherwise end a split it never read), and one of a lease
  // taken back from its trainer says so, so that the trainer fails instead of losing the split.
  grpc::Status check_reporter(const Job& job, const proto::SplitReport& report, const JobLedger& ledger) const {
    if (const JobLedger::Given* held = ledger.holding(report.split(), report.lease())) {
      if (held->reader.empty() || held->reader == report.reader()) return grpc::Status::OK;
      return {grpc::StatusCode::PERMISSION_DENIED,
              fmt::format("split {} of job '{}' was handed to another reader: a reader reports only on the splits handed to it", report.split(),
                          job.request.job_name())};
    }
    if (job.taken.count({report.epoch(), report.split(), report.lease()}))
      return {grpc::StatusCode::FAILED_PRECONDITION,
              fmt::format("split {} of job '{}' was taken back from this trainer: the dispatcher had not heard from it for {} s and handed "
                          "the split to another; start the trainer again",
                          report.split(), job.request.job_name(), kTrainerTimeout.count())};
    return grpc::Status::OK;  // stale: sent twice, or of a lease given back
  }

  // Splits in the hands of readers whose trainer is not heard from (it ended without giving them
  // back, or never was a trainer of the job: a local process asking as a reader) go back, from
  // where they were handed out, so that the job's trainers are not left waiting for them for
  // ever. Restored jobs first give their trainers time to be heard from. True when any went.
  bool reclaim_unheard() {
    bool any = false;
    const auto now = Clock::now();
    for (auto& [id, job] : jobs_) {
      if (job.request.num_consumers() > 0 || now < job.keep_until) continue;  // (coordinated jobs fail when a consumer leaves)
      for (auto& [epoch, ledger] : job.epochs) {
        std::vector<JobLedger::Given> unheard;
        for (const auto& [split, given] : ledger.in_hand_splits())
          if (!given.reader.empty() && !job.clients.count(trainer_of(given.reader))) unheard.push_back(given);
        for (const auto& given : unheard) {
          ledger.give_back(given.split, given.lease, given.skip);
          job.taken.insert({epoch, given.split, given.lease});
          ++job.given_back;
          any = true;
          std::fprintf(stderr, "sluice dispatcher: job %llu '%s' epoch %llu: split %llu taken back from reader %s, whose trainer is not "
                       "heard from: handed out again\n",
                       static_cast<unsigned long long>(id), job.request.job_name().c_str(), static_cast<unsigned long long>(epoch),
                       static_cast<unsigned long long>(given.split), given.reader.c_str());
        }
      }
    }
    return any;
  }

  // A job none of whose trainers is left is over: forgotten, so that a trainer naming it again
  // begins a new one (as tf.data's jobs end when their clients are gone).
  bool retire_if_left(std::map<std::uint64_t, Job>::iterator job) {
    if (!job->second.clients.empty() || Clock::now() < job->second.keep_until) return false;
    std::fprintf(stderr, "sluice dispatcher: job %llu '%s' is over: its trainers have left (a trainer naming it again begins a new job)\n",
                 static_cast<unsigned long long>(job->first), job->second.request.job_name().c_str());
    auto& t = ended_totals_[job->second.request.job_name()];
    t[0] += job->second.handed_out, t[1] += job->second.done, t[2] += job->second.given_back;
    jobs_.erase(job);
    return true;
  }

  // The alive workers that have every operator the job needs. None while some are alive: the
  // job cannot be made, and the error names what each lacks.
  grpc::Status able_workers(std::uint64_t job_id, Job& job, std::vector<std::uint64_t>& able) {
    std::vector<std::string> unable;
    for (const auto& [id, known] : workers_) {
      if (!alive(known)) continue;
      std::vector<std::string> missing;
      for (const auto& op : job.request.operators())
        if (!known.operators.count(op)) missing.push_back("'" + op + "'");
      if (missing.empty()) {
        able.push_back(id);
        continue;
      }
      const std::string why = fmt::format("worker {} ({}) lacks operator{} {}", id, known.info.address(), missing.size() == 1 ? "" : "s",
                                          fmt::join(missing, ", "));
      unable.push_back(why);
      if (job.said_unable.insert(id).second)
        std::fprintf(stderr, "sluice dispatcher: job %llu '%s': %s: it makes none of the job's splits\n", static_cast<unsigned long long>(job_id),
                     job.request.job_name().c_str(), why.c_str());
    }
    if (!able.empty() || unable.empty()) return grpc::Status::OK;
    return {grpc::StatusCode::FAILED_PRECONDITION,
            fmt::format("no worker can make job '{}': {}; start workers whose plugins give {} (`sluice plugins` on a worker lists "
                        "what it has, --plugin-dir adds a folder)",
                        job.request.job_name(), fmt::join(unable, "; "), unable.size() == 1 ? "it" : "them")};
  }

  // The epoch's ledger, begun on the first request for it. OFF: a copy of the dataset for each
  // worker able now; static: a shard for each worker of the fixed list. Null while an OFF epoch
  // has no worker to begin with.
  JobLedger* ledger_of(Job& job, std::uint64_t epoch, const std::vector<std::uint64_t>& able) {
    if (auto it = job.epochs.find(epoch); it != job.epochs.end()) return &it->second;
    const auto mode = job.request.mode();
    JobLedger ledger;
    if (mode == proto::JobRequest::OFF) {
      if (able.empty()) return nullptr;
      ledger = JobLedger(able);
    } else if (is_static(mode)) {
      std::vector<std::uint64_t> owners;
      for (const auto& address : options_.worker_addresses) {
        std::uint64_t owner = 0;
        for (const auto& [id, known] : workers_)
          if (known.info.address() == address) owner = id;
        owners.push_back(owner);
      }
      ledger = JobLedger(owners);
    }
    return &job.epochs.emplace(epoch, std::move(ledger)).first->second;
  }

  // The reply handing out `given` (made from `next` on for each consumer, when handed again).
  void answer_split(const JobLedger::Given& given, const JobLedger& ledger, proto::SplitReply& reply, const std::vector<std::uint64_t>& next = {}) {
    reply.set_kind(proto::SplitReply::SPLIT);
    reply.set_split(given.split);
    reply.set_skip(given.skip);
    reply.set_worker_id(given.worker);
    const proto::WorkerInfo& maker = workers_.at(given.worker).info;
    reply.set_worker_address(maker.address());
    reply.set_worker_host(maker.host());
    reply.set_worker_local_address(maker.local_address());
    reply.set_lease(given.lease);
    reply.set_splits(ledger.split_count());
    for (const auto n : next) reply.add_consumer_next(n);
  }

  // Coordinated reads: a trainer is one of the job's consumers, and no other live trainer is the same one.
  grpc::Status take_consumer(Job& job, const proto::JobRequest& request) {
    if (job.request.num_consumers() == 0 || request.client().empty()) return grpc::Status::OK;
    const auto index = static_cast<std::uint32_t>(request.consumer_index());
    for (const auto& [client, consumer] : job.consumers)
      if (consumer == index && client != request.client() && job.clients.count(client))
        return {grpc::StatusCode::FAILED_PRECONDITION,
                fmt::format("consumer {} of job '{}' is read by another trainer already: each of the job's {} trainers takes its own "
                            "consumer_index, 0 to {}",
                            index, job.request.job_name(), job.request.num_consumers(), job.request.num_consumers() - 1)};
    job.consumers[request.client()] = index;
    return grpc::Status::OK;
  }

  // A consumer of a coordinated job left: in mid-epoch the others would wait for it for ever (its
  // rounds' elements are dealt to it), so the job fails for them, saying why.
  void consumer_left(Job& job, const std::string& client, const char* how) {
    const auto it = job.consumers.find(client);
    if (it == job.consumers.end()) return;
    const std::uint32_t index = it->second;
    job.consumers.erase(it);
    if (job.epochs.empty() || job.epochs.rbegin()->second.finished() || !job.broken.empty()) return;
    job.broken = fmt::format("consumer {} of job '{}' {} in mid-epoch: coordinated reads go on only while all {} consumers read; start "
                             "every trainer of the job again",
                             index, job.request.job_name(), how, job.request.num_consumers());
    std::fprintf(stderr, "sluice dispatcher: %s\n", job.broken.c_str());
  }

  // Coordinated reads: slot `slot` of lane `lane` is one split for every consumer: the first to
  // ask takes it from the ledger, the others get the same. Asked again after its stream broke
  // (after_lease), it is handed again, in place, once every consumer has said how far it got;
  // the consumers whose part was whole need not come back for it.
  grpc::Status coordinated_split(Job& job, const proto::SplitRequest& request, JobLedger& ledger, const std::vector<std::uint64_t>& able,
                                 proto::SplitReply& reply) {
    if (request.lane() >= job.request.lanes() || request.consumer_index() >= job.request.num_consumers())
      return {grpc::StatusCode::INVALID_ARGUMENT, fmt::format("job '{}' has {} lanes and {} consumers: lane {} of consumer {} is not one",
                                                              job.request.job_name(), job.request.lanes(), job.request.num_consumers(),
                                                              request.lane(), request.consumer_index())};
    auto& slots = job.slots[request.epoch()];
    const auto key = std::make_pair(request.lane(), request.slot());
    auto held = slots.find(key);
    auto wait = [&](std::string why) {
      reply.set_kind(proto::SplitReply::WAIT);
      reply.set_waiting_for(std::move(why));
      return grpc::Status::OK;
    };
    if (held == slots.end()) {
      JobLedger::Given given;
      switch (ledger.next_split(able, given)) {
        case JobLedger::Next::End: reply.set_kind(proto::SplitReply::END); return grpc::Status::OK;
        case JobLedger::Next::Wait: return wait(able.empty() ? "no worker is alive at the dispatcher" : "");
        case JobLedger::Next::Split: break;
      }
      ++job.handed_out;
      held = slots.emplace(key, Job::Slot{given, {}, {}}).first;
      answer_split(given, ledger, reply);
      return save_journal();
    }
    Job::Slot& slot = held->second;
    if (request.after_lease() != slot.given.lease) {
      answer_split(slot.given, ledger, reply, slot.next);
      return grpc::Status::OK;
    }
    if (slot.reports.size() < job.request.num_consumers()) {
      std::vector<std::string> silent;
      for (std::uint32_t c = 0; c < job.request.num_consumers(); ++c)
        if (!slot.reports.count(c)) silent.push_back(std::to_string(c));
      return wait(fmt::format("consumer{} {} of the coordinated job to report how far {} got in split {}", silent.size() == 1 ? "" : "s",
                              fmt::join(silent, ", "), silent.size() == 1 ? "it" : "they", slot.given.split));
    }
    std::vector<std::uint64_t> next(job.request.num_consumers(), 0);
    for (const auto& [consumer, report] : slot.reports) next[consumer] = report.next();
    JobLedger::Given again;
    switch (ledger.hand_again(slot.given.split, slot.given.lease, *std::min_element(next.begin(), next.end()), able, again)) {
      case JobLedger::Next::End:
        return {grpc::StatusCode::INTERNAL, fmt::format("split {} of job '{}' is no longer in hand", slot.given.split, job.request.job_name())};
      case JobLedger::Next::Wait: return wait("no worker is alive at the dispatcher");
      case JobLedger::Next::Split: break;
    }
    ++job.handed_out;
    ++job.given_back;
    // A consumer whose stream ended whole before the worker died has its part: it goes on to its
    // next slot and never reports this lease, so its report stands for it here.
    auto whole_parts = slot.reports;
    std::erase_if(whole_parts, [](const auto& said) { return said.second.outcome() == proto::SplitReport::GIVEN_BACK; });
    slot = Job::Slot{again, std::move(whole_parts), next};
    answer_split(again, ledger, reply, next);
    return save_journal();
  }

  // Coordinated reads: a consumer's report of its part of a split. Once every consumer has
  // reported the lease, the split is done (or empty: the source ended) unless one was given back:
  // then it waits for a consumer to ask its slot again.
  grpc::Status coordinated_report(Job& job, const proto::SplitReport& report, JobLedger& ledger) {
    auto& slots = job.slots[report.epoch()];
    auto held = std::find_if(slots.begin(), slots.end(), [&](const auto& s) {
      return s.second.given.split == report.split() && s.second.given.lease == report.lease();
    });
    if (held == slots.end()) return grpc::Status::OK;  // stale: sent twice, or of a lease handed again
    if (report.consumer_index() >= job.request.num_consumers())
      return {grpc::StatusCode::INVALID_ARGUMENT, fmt::format("job '{}' has {} consumers, not {}", job.request.job_name(),
                                                              job.request.num_consumers(), report.consumer_index() + 1)};
    // Only the consumer's own trainer reports for it (a dispatcher restarted learns which trainer
    // that is from its next heartbeat: asked again).
    const auto reporter = job.consumers.find(trainer_of(report.reader()));
    if (reporter == job.consumers.end())
      return {grpc::StatusCode::UNAVAILABLE, fmt::format("the dispatcher does not know this trainer as a consumer of job '{}' (yet): ask "
                                                         "again after its next heartbeat",
                                                         job.request.job_name())};
    if (reporter->second != report.consumer_index())
      return {grpc::StatusCode::PERMISSION_DENIED, fmt::format("this trainer is consumer {} of job '{}', not consumer {}: it reports only "
                                                               "for its own",
                                                               reporter->second, job.request.job_name(), report.consumer_index())};
    Job::Slot& slot = held->second;
    auto& said = slot.reports[report.consumer_index()];
    said.set_consumer(report.consumer_index());
    said.set_outcome(static_cast<std::uint32_t>(report.outcome()));
    said.set_next(report.received());
    if (report.outcome() == proto::SplitReport::GIVEN_BACK) given_back(report);
    if (slot.reports.size() < job.request.num_consumers()) return save_journal();
    bool whole = true, empty = false;
    for (const auto& [consumer, r] : slot.reports) {
      whole &= r.outcome() != proto::SplitReport::GIVEN_BACK;
      empty |= r.outcome() == proto::SplitReport::EMPTY;
    }
    if (!whole) return save_journal();
    if (empty) ledger.ended_at(slot.given.split, slot.given.lease) || ledger.done(slot.given.split, slot.given.lease);
    else job.done += ledger.done(slot.given.split, slot.given.lease);
    slots.erase(held);
    return save_journal();
  }

  void given_back(const proto::SplitReport& report) {
    // A trainer that cannot reach a worker need not wait for its heartbeats to stop: no split goes
    // to it until it is heard from again.
    if (auto known = workers_.find(report.worker_id()); report.worker_unreachable() && known != workers_.end() && alive(known->second)) {
      known->second.last_seen = Clock::now() - lost_after() - std::chrono::milliseconds(1);
      std::fprintf(stderr, "sluice dispatcher: worker %llu (%s) cannot be reached by a trainer: taken as lost until it is heard from again\n",
                   static_cast<unsigned long long>(known->first), known->second.info.address().c_str());
    }
    std::fprintf(stderr, "sluice dispatcher: job %llu epoch %llu: split %llu given back after %llu elements (its worker stopped answering)\n",
                 static_cast<unsigned long long>(report.job_id()), static_cast<unsigned long long>(report.epoch()),
                 static_cast<unsigned long long>(report.split()), static_cast<unsigned long long>(report.received()));
  }

  void remember_answer(const proto::SplitRequest& request, const proto::SplitReply& reply) {
    proto::JournalAnswer& answer = answers_[request.reader()];
    answer.set_reader(request.reader());
    answer.set_sequence(request.sequence());
    *answer.mutable_reply() = reply;
    answer_order_.push_back(request.reader());
    // Readers come and go with trainers' runs: the oldest answers are let go (a reader asks again
    // only for its last question).
    while (answer_order_.size() > kAnswersKept) {
      const std::string oldest = answer_order_.front();
      answer_order_.pop_front();
      if (std::find(answer_order_.begin(), answer_order_.end(), oldest) == answer_order_.end()) answers_.erase(oldest);
    }
  }

  std::filesystem::path journal_path() const { return std::filesystem::path(options_.work_dir) / "dispatcher.journal"; }

  // Written whole before the answer: a dispatcher that dies after it restarts knowing what it
  // answered. A journal that cannot be written fails the call (UNAVAILABLE: the caller asks again).
  grpc::Status save_journal() {
    if (options_.work_dir.empty()) return grpc::Status::OK;
    proto::Journal journal;
    journal.set_version(1);
    journal.set_next_worker_id(next_id_);
    journal.set_next_job_id(next_job_);
    for (const auto& [id, known] : workers_) {
      auto* w = journal.add_workers();
      w->set_worker_id(id);
      *w->mutable_info() = known.info;
      w->set_registered_unix_ms(known.registered_unix_ms);
    }
    for (const auto& [id, job] : jobs_) {
      auto* j = journal.add_jobs();
      j->set_job_id(id);
      *j->mutable_request() = job.request;
      for (const auto& [epoch, ledger] : job.epochs) {
        auto* e = j->add_epochs();
        e->set_epoch(epoch);
        ledger.save(*e->mutable_ledger());
        if (const auto slots = job.slots.find(epoch); slots != job.slots.end())
          for (const auto& [key, slot] : slots->second) {
            auto* s = e->add_coordinated();
            s->set_lane(key.first);
            s->set_slot(key.second);
            s->mutable_given()->set_split(slot.given.split);
            s->mutable_given()->set_skip(slot.given.skip);
            s->mutable_given()->set_worker(slot.given.worker);
            s->mutable_given()->set_lease(slot.given.lease);
            for (const auto& [consumer, report] : slot.reports) *s->add_reports() = report;
            for (const auto n : slot.next) s->add_consumer_next(n);
          }
      }
    }
    for (const auto& [reader, answer] : answers_) *journal.add_answers() = answer;
    try {
      write_file_atomically(journal_path(), journal.SerializeAsString());
    } catch (const std::exception& e) {
      // What was decided since the journal was last written is undone: an answer not journaled is
      // never given (a dispatcher restarted on the journal would hand the same split again).
      undo_to_journaled();
      if (!journal_failing_)
        std::fprintf(stderr, "sluice dispatcher: cannot write its journal %s: %s; answering UNAVAILABLE (callers ask again) until it "
                     "can: free space or fix the folder\n",
                     journal_path().c_str(), e.what());
      journal_failing_ = true;
      return {grpc::StatusCode::UNAVAILABLE, fmt::format("the dispatcher cannot write its journal {}: {}", journal_path().string(), e.what())};
    }
    if (journal_failing_) std::fprintf(stderr, "sluice dispatcher: its journal %s is written again\n", journal_path().c_str());
    journal_failing_ = false;
    journaled_ = decided();
    return grpc::Status::OK;
  }

  // What the journal keeps (the rest, when workers and trainers were last heard from, is not).
  struct Decided {
    std::map<std::uint64_t, Known> workers;
    std::uint64_t next_id = 1;
    std::map<std::uint64_t, Job> jobs;
    std::uint64_t next_job = 1;
    std::map<std::string, proto::JournalAnswer> answers;
    std::deque<std::string> answer_order;
  };
  Decided decided() const { return {workers_, next_id_, jobs_, next_job_, answers_, answer_order_}; }

  // Back to what the journal says, keeping what was heard since (heartbeats, trainers).
  void undo_to_journaled() {
    if (!journaled_) return;
    Decided was = *journaled_;
    for (auto& [id, known] : was.workers)
      if (const auto now = workers_.find(id); now != workers_.end()) {
        known.last_seen = now->second.last_seen;
        known.reported_lost = now->second.reported_lost;
      }
    for (auto& [id, job] : was.jobs)
      if (const auto now = jobs_.find(id); now != jobs_.end()) {
        job.clients = now->second.clients;
        job.consumers = now->second.consumers;
        job.keep_until = now->second.keep_until;
        job.said_unable = now->second.said_unable;
        job.broken = now->second.broken;
      }
    workers_ = std::move(was.workers);
    next_id_ = was.next_id;
    jobs_ = std::move(was.jobs);
    next_job_ = was.next_job;
    answers_ = std::move(was.answers);
    answer_order_ = std::move(was.answer_order);
  }

  void load_journal() {
    std::error_code ec;
    std::filesystem::create_directories(options_.work_dir, ec);
    if (ec) throw ServiceError(fmt::format("the dispatcher cannot make its work folder {}: {}", options_.work_dir, ec.message()));
    const auto path = journal_path();
    std::string bytes;
    if (!detail::read_journal_file(path, bytes)) return;
    proto::Journal journal;
    if (!journal.ParseFromString(bytes) || journal.version() != 1)
      throw ServiceError(fmt::format("the dispatcher's journal {} cannot be read (damaged, or another version's): move it away to start "
                                     "afresh (its jobs are then forgotten)",
                                     path.string()));
    next_id_ = std::max<std::uint64_t>(journal.next_worker_id(), 1);
    next_job_ = std::max<std::uint64_t>(journal.next_job_id(), 1);
    // Workers are taken as alive until their heartbeats say otherwise (they keep their ids).
    for (const auto& w : journal.workers()) {
      Known& known = workers_[w.worker_id()];
      known.info = w.info();
      known.operators = {w.info().operators().begin(), w.info().operators().end()};
      known.registered_unix_ms = w.registered_unix_ms();
      known.last_seen = Clock::now();
    }
    for (const auto& j : journal.jobs()) {
      Job& job = jobs_[j.job_id()];
      job.request = j.request();
      job.keep_until = Clock::now() + kTrainerTimeout;  // its trainers' heartbeats come back
      for (const auto& e : j.epochs()) {
        job.epochs.emplace(e.epoch(), JobLedger::restore(e.ledger()));
        for (const auto& s : e.coordinated()) {
          Job::Slot& slot = job.slots[e.epoch()][{s.lane(), s.slot()}];
          slot.given = {s.given().split(), s.given().skip(), s.given().worker(), s.given().lease()};
          for (const auto& report : s.reports()) slot.reports[report.consumer()] = report;
          slot.next.assign(s.consumer_next().begin(), s.consumer_next().end());
        }
      }
    }
    for (const auto& answer : journal.answers()) {
      answers_[answer.reader()] = answer;
      answer_order_.push_back(answer.reader());
    }
    std::fprintf(stderr, "sluice dispatcher: continuing from its journal %s: %zu workers, %zu jobs\n", path.c_str(), workers_.size(), jobs_.size());
  }

  static constexpr std::size_t kAnswersKept = 4096;
  const DispatcherOptions options_;
  const std::string token_;
  std::mutex mutex_;  // guards what follows
  std::map<std::uint64_t, Known> workers_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Job> jobs_;
  std::uint64_t next_job_ = 1;
  std::map<std::string, proto::JournalAnswer> answers_;  // by reader: its last split
  std::map<std::string, std::array<std::uint64_t, 3>> ended_totals_;  // splits handed out, done, given back of jobs that ended, by name
  std::deque<std::string> answer_order_;
  std::optional<Decided> journaled_;  // as the journal on disk says (with a work folder)
  bool journal_failing_ = false;
};

}  // namespace

// What the dispatcher's connections may hold in all (its messages are pipeline texts and splits).
constexpr std::size_t kDispatcherMemory = 64u << 20;

struct Dispatcher::Impl {
  DispatcherOptions options;
  std::unique_ptr<DispatcherService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::mutex watch_mutex;
  std::condition_variable watch_cv;
  bool stopping = false;
  std::thread watch;  // says when a worker is lost
  bool own_token = false;  // made its own token (kept in a file by its port)
  std::string token;
};

Dispatcher::Dispatcher(DispatcherOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  const std::string what = "the dispatcher";
  // On loopback without a token file, a token of its own (every local user reaches loopback).
  impl_->own_token = detail::makes_own_token(options.bind, options.security);
  const std::string token = impl_->own_token ? detail::own_token(options.port) : detail::read_token(options.security);
  auto checked = std::make_shared<detail::TokenHolder>();
  checked->set(token);
  auto credentials = detail::server_credentials(options.bind, options.security, what, checked);
  const std::string listen = fmt::format("{}:{}", options.bind.find(':') != std::string::npos && options.bind.front() != '[' ? "[" + options.bind + "]" : options.bind, options.port);
  impl_->service = std::make_unique<DispatcherService>(options, token);
  grpc::ServerBuilder builder;
  // A port another process (or another dispatcher of this user) holds is an error, not shared:
  // gRPC's SO_REUSEPORT would let both listen and split the callers between them.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC reads a whole message before it checks the message's size (4 MiB here): a local client
  // sending 1 GB grew the dispatcher by 1 GB, kept. Its messages are small: the memory its
  // connections may take is bounded, and a connection past it is closed.
  grpc::ResourceQuota quota("sluice-dispatcher");
  quota.Resize(kDispatcherMemory);
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(listen, credentials, &impl_->port);
  builder.RegisterService(impl_->service.get());
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0)
    throw ServiceError(fmt::format("{} cannot listen on {}: the address is in use or not this machine's; give another --port or --bind", what, listen));
  if (options.security.insecure && !is_loopback(options.bind))
    std::fprintf(stderr, "sluice dispatcher: --insecure: serving %s without TLS or a token; anyone who reaches it may use it\n", listen.c_str());
  if (impl_->own_token) {
    try {
      detail::keep_own_token(impl_->port, token);
    } catch (const ServiceError&) {
      impl_->server->Shutdown();
      throw;
    }
    impl_->token = token;
    std::fprintf(stderr, "sluice dispatcher: its token is in %s, readable by you only: your workers and trainers on this machine use it "
                 "by themselves (others need --token-file)\n", detail::own_token_path(impl_->port).c_str());
  }
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
std::string Dispatcher::prometheus() const { return impl_->service->prometheus(); }
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
  // Without a journal nothing continues after it: its token goes too. With one, a dispatcher
  // restarted on the port keeps it, and its workers and trainers are not refused.
  if (!impl_->token.empty() && impl_->options.work_dir.empty()) detail::forget_own_token(impl_->port, impl_->token);
}

}  // namespace sluice::service
