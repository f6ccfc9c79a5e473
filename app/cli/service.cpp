// The service's part of libexec/sluice-service, the command built with the service (cli.hpp):
// `sluice dispatcher`, `sluice worker` and `sluice service workers`, the service's processes
// (core/service/), started by what the cluster runs, each serving until SIGINT or SIGTERM; and the
// trainer's side, the service_source operator and the split at a `distribute` stage.
#include <fmt/format.h>
#include <pthread.h>
#include <stdlib.h>

#include <atomic>
#include <csignal>

#include "cli.hpp"
#include "sluice/core/metrics_server.hpp"
#include "sluice/service/service.hpp"

namespace sluice_cli {
namespace {

// Blocks SIGINT and SIGTERM in every thread started after it (gRPC's included), so that the
// caller takes them with wait_for_stop_signal().
sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// /metrics of a service process (--metrics-addr), serving `series`; none without an address.
std::unique_ptr<sluice::MetricsServer> serve_metrics(const std::string& address, const char* who, std::function<std::string()> series) {
  if (address.empty()) return nullptr;
  auto server = std::make_unique<sluice::MetricsServer>(sluice::parse_metrics_address(address));
  server->add_prometheus(std::move(series));
  fmt::print(stderr, "sluice {}: metrics at {}/metrics\n", who, server->url());
  return server;
}

int wait_for_stop_signal(const sigset_t& signals) {
  int signal = 0;
  sigwait(&signals, &signal);
  return signal;
}

}  // namespace

void remember_command_line(int, char**) { ::unsetenv(kHandedOver); }  // (not passed on to its children)

void add_service_operators(sluice::Registry& registry) { sluice::service::add_service_operators(registry); }

void split_at_service(const sluice::Registry&, sluice::PipelineDocument& doc) { sluice::service::split_at_service(doc); }

int cmd_dispatcher(const DispatcherRequest& request) {
  const sigset_t signals = block_stop_signals();
  sluice::service::Dispatcher dispatcher(request.options);
  const auto metrics = serve_metrics(request.metrics_addr, "dispatcher", [&] { return dispatcher.prometheus(); });
  // The line a launcher (or a test) reads to learn the port when it asked for any (--port 0).
  fmt::print("sluice dispatcher: listening on {}\n", dispatcher.address());
  std::fflush(stdout);
  const int signal = wait_for_stop_signal(signals);
  fmt::print(stderr, "sluice dispatcher: {}: stopping\n", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  dispatcher.shutdown();
  dispatcher.wait();
  return 0;
}

int cmd_worker(const CommonOptions& common, WorkerRequest request) {
  const sigset_t signals = block_stop_signals();
  static sluice::Registry registry;  // operators' code lives in the plugins: kept to the end
  load_plugins(registry, common, true);
  for (const auto& op : registry.operators()) request.options.operators.push_back(op->info.name);
  request.options.registry = &registry;
  request.options.unix_socket = request.unix_socket;
  // Its /metrics first, so that the worker registers where it is; it serves nothing until then.
  std::atomic<const sluice::service::Worker*> serving{nullptr};
  const auto metrics = serve_metrics(request.metrics_addr, "worker", [&] {
    const auto* worker = serving.load();
    return worker ? worker->prometheus() : std::string();
  });
  if (metrics) request.options.metrics_address = metrics->url().substr(metrics->url().find("//") + 2);
  sluice::service::Worker worker(request.options);
  serving = &worker;
  fmt::print("sluice worker: worker {} listening on {}\n", worker.id(), worker.address());
  std::fflush(stdout);
  const int signal = wait_for_stop_signal(signals);
  fmt::print(stderr, "sluice worker: {}: stopping\n", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  worker.shutdown();
  worker.wait();
  return 0;
}

int cmd_service_workers(const std::string& dispatcher, const sluice::service::Security& security) {
  const auto workers = sluice::service::list_workers(dispatcher, security);
  if (workers.empty()) {
    fmt::print("no worker has registered with the dispatcher at {}\n", dispatcher);
    return 0;
  }
  fmt::print("{:<4} {:<24} {:<16} {:>8} {:>9} {:<5} {}\n", "id", "address", "host", "pid", "operators", "abi", "state");
  for (const auto& w : workers)
    fmt::print("{:<4} {:<24} {:<16} {:>8} {:>9} {:<5} {}\n", w.id, w.address, w.host, w.pid, w.operators, w.abi,
               w.alive ? "alive" : fmt::format("lost (not heard from for {:.1f} s)", w.last_seen_ms_ago / 1000.0));
  return 0;
}

}  // namespace sluice_cli
