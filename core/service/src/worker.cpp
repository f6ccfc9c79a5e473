// A worker: serves trainers, registered with the dispatcher and telling it, every heartbeat, that
// it is alive (registering again when the dispatcher no longer knows it).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "security.hpp"
#include "service.grpc.pb.h"
#include "sluice/abi.hpp"

namespace sluice::service {
namespace {

class WorkerService final : public proto::Worker::Service {
 public:
  explicit WorkerService(std::string token) : token_(std::move(token)) {}
  std::atomic<std::uint64_t> id{0};
  grpc::Status Ping(grpc::ServerContext* context, const proto::PingRequest*, proto::PingReply* reply) override {
    if (auto denied = detail::check_token(*context, token_); !denied.ok()) return denied;
    reply->set_worker_id(id.load());
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

std::string machine_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

struct Worker::Impl {
  WorkerOptions options;
  std::string token, address, dispatcher_target;
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<proto::Dispatcher::Stub> dispatcher;
  int port = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::thread heartbeat;

  proto::WorkerInfo info() const {
    proto::WorkerInfo out;
    out.set_address(address);
    out.set_host(machine_name());
    out.set_pid(::getpid());
    for (const auto& op : options.operators) out.add_operators(op);
    out.set_abi(fmt::format("{}.{}", kAbiMajor, kAbiMinor));
    return out;
  }
  // One try; false (with `why`) when the dispatcher did not answer.
  bool register_once(std::string& why, std::chrono::milliseconds& heartbeat_every) {
    auto context = detail::client_context(token, std::chrono::seconds(5));
    proto::RegisterReply reply;
    const grpc::Status status = dispatcher->RegisterWorker(context.get(), info(), &reply);
    if (!status.ok()) {
      why = detail::status_text(status);
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) throw ServiceError(fmt::format("the dispatcher at {} refused this worker: {}", dispatcher_target, why));
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
  w.token = detail::read_token(options.security);
  auto credentials = detail::server_credentials(options.bind, options.security, "the worker");
  const std::string listen = fmt::format("{}:{}", options.bind, options.port);
  w.service = std::make_unique<WorkerService>(w.token);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials, &w.port);
  builder.RegisterService(w.service.get());
  w.server = builder.BuildAndStart();
  if (!w.server || w.port == 0)
    throw ServiceError(fmt::format("the worker cannot listen on {}: the address is in use or not this machine's; give another --port or --bind", listen));
  const std::string host = !options.host.empty() ? options.host : (options.bind == "0.0.0.0" || options.bind == "::") ? machine_name() : options.bind;
  w.address = fmt::format("{}:{}", host, w.port);
  if (options.security.insecure && !is_loopback(options.bind))
    std::fprintf(stderr, "sluice worker: --insecure: serving %s without TLS or a token; anyone who reaches it may use it\n", listen.c_str());

  // The dispatcher may start after its workers: keep trying for a while, saying so once.
  w.dispatcher = proto::Dispatcher::NewStub(detail::client_channel(w.dispatcher_target, options.security));
  std::chrono::milliseconds every{500};
  std::string why;
  const auto give_up = std::chrono::steady_clock::now() + options.wait_for_dispatcher;
  bool said = false;
  while (!w.register_once(why, every)) {
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
      auto context = detail::client_context(w.token, every * 4);
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

void Worker::shutdown() {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Worker::wait() {
  impl_->server->Wait();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
}

}  // namespace sluice::service
