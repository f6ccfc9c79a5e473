// `sluice service workers`: what a dispatcher knows of its workers, asked as a client.
#include <fmt/format.h>

#include "security.hpp"
#include "service.grpc.pb.h"
#include "sluice/service/service.hpp"

namespace sluice::service {

std::vector<WorkerStatus> list_workers(const std::string& dispatcher, const Security& security) {
  const std::string target = grpc_target(dispatcher);
  auto stub = proto::Dispatcher::NewStub(detail::client_channel(target, security));
  auto context = detail::client_context(detail::client_token(target, security), std::chrono::seconds(10));
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
