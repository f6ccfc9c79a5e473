#pragma once
// The Sluice service (core/service/README.md): a dispatcher that knows the workers, and workers
// that register with it and keep telling it they are alive. Processes are started by what the
// cluster runs (Slurm, Kubernetes, mpirun); they talk gRPC.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/error.hpp"

namespace sluice {
class Registry;
struct PipelineDocument;
struct OperatorInfo;
}

namespace sluice::service {

// A failure of the service (an address that cannot be bound or reached, a refused token): the
// message names the address and what to do.
class ServiceError : public Error {
 public:
  using Error::Error;
};

// How a process listens and talks. Off loopback a server needs TLS (certificate and key) and a
// shared token, or an explicit `insecure` that its log repeats; a client gives the token (and
// trusts `tls_ca`) when told to.
struct Security {
  std::string tls_cert, tls_key;  // PEM files: this server's certificate and key
  std::string tls_ca;             // PEM file: the authority a client trusts (TLS when given)
  std::string token_file;         // a file holding the shared token (never printed)
  bool insecure = false;
};

// Whether `host` is this machine's loopback ("127.0.0.1", "::1", "localhost").
bool is_loopback(const std::string& host);
// "host:port" of "grpc://host:port" or "host:port"; throws ServiceError naming a malformed one.
std::string grpc_target(const std::string& address);

struct DispatcherOptions {
  std::string bind = "127.0.0.1";
  int port = 0;  // 0: any free port (Dispatcher::port() says which)
  Security security;
  // Workers send a heartbeat this often; one not heard from for `lost_after` heartbeats is lost.
  std::chrono::milliseconds heartbeat{500};
  int lost_after = 4;
  // Where the journal is kept (DIR/dispatcher.journal): written whole before each answer that
  // changes what the dispatcher knows, and read at start, so that a dispatcher restarted on it
  // continues its jobs. Empty: none (a restart forgets the jobs; workers register again).
  std::string work_dir;
  // The fixed worker list static sharding needs ("host:port" as the workers register): shard i
  // is worker i's; a worker at another address is refused. Empty: any worker may register.
  std::vector<std::string> worker_addresses;
};

class Dispatcher {
 public:
  // Listens at once; throws ServiceError when it cannot (address in use, TLS files unreadable,
  // off loopback without TLS and a token or `insecure`).
  explicit Dispatcher(DispatcherOptions options);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;
  int port() const;
  std::string address() const;  // "host:port" as bound
  void shutdown();               // stops serving; wait() returns
  void wait();
  // Prometheus series (sluice_dispatcher_*): workers alive and lost, jobs, each job's splits
  // handed out, done and given back, and the splits each worker has in hand.
  std::string prometheus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct WorkerOptions {
  std::string dispatcher;  // "host:port" or "grpc://host:port"
  std::string bind = "127.0.0.1";
  int port = 0;
  std::string host;  // the name trainers reach it by; empty: the bind address, or this machine's name when it binds every address
  Security security;
  std::vector<std::string> operators;  // what its plugins give, told to the dispatcher
  // The plugins' operators the jobs' pipelines are built from (it gains the worker's own sink).
  Registry* registry = nullptr;
  // How long to keep trying to reach the dispatcher at start (it may start after the workers).
  std::chrono::milliseconds wait_for_dispatcher{60000};
  // Also listen on a Unix socket (in $TMPDIR), which trainers on this machine then read instead of
  // TCP. Off by default: it measured slower than loopback TCP for large batches, then faster once
  // the trainer's copy went, on one machine only (bench/README.md, "service.sh").
  bool unix_socket = false;
  // Where its /metrics is served ("HOST:PORT", empty: nowhere), told to the dispatcher, whose own
  // /metrics lists it, so that the studio finds every worker's from the dispatcher's.
  std::string metrics_address;
};

class Worker {
 public:
  // Listens, then registers with the dispatcher (trying for `wait_for_dispatcher`); throws
  // ServiceError naming the address that failed.
  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  int port() const;
  std::string address() const;  // as told to the dispatcher
  std::uint64_t id() const;
  void shutdown();
  void wait();
  // Prometheus series (sluice_worker_*): splits being made and made (done, stopped, failed),
  // elements and bytes sent (on the wire, and before compression).
  std::string prometheus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a dispatcher knows of its workers (`sluice service workers`).
struct WorkerStatus {
  std::uint64_t id = 0;
  std::string address, host, abi;
  std::int64_t pid = 0;
  std::size_t operators = 0;
  bool alive = false;
  std::int64_t last_seen_ms_ago = 0;
};
std::vector<WorkerStatus> list_workers(const std::string& dispatcher, const Security& security);

// The trainer's side. Adds `service_source`, the source that reads a job from the workers.
void add_service_operators(Registry& registry);
// service_source's name, kind, parameters and role (ReadsService), without its factory: what
// lists and checks it where the service is not linked (`sluice`, whose service commands continue
// in libexec/sluice-service: app/cli/service_handoff.cpp). Links without gRPC (sluice_service_info).
OperatorInfo service_source_info();
// A pipeline with a `distribute` stage: that stage and those before it become the job's pipeline,
// sent to the service, and a service_source of that id takes their place here. Throws SpecError
// naming the stage (two distributed, a missing service or job name, a stage after the service
// reading one of its stages).
void split_at_service(PipelineDocument& doc);

}  // namespace sluice::service
