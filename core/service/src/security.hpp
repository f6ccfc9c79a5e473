#pragma once
// What the dispatcher and the workers share: how a server listens (TLS or not, a token checked on
// every call) and how a client reaches one.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "sluice/service/service.hpp"

namespace sluice::service::detail {

// The credentials a server listening on `bind` uses; throws ServiceError when off loopback
// without TLS and a token (and without `insecure`), or when a file cannot be read. `what` names
// the process in messages ("the dispatcher").
std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& bind, const Security& security, const std::string& what);

// Leaves gRPC's own log lines out of the output (Sluice says what failed, in words), unless the
// user set GRPC_VERBOSITY. Called before the first server or channel is made.
void quiet_grpc_logging();

// The token a server wants (empty: none) and a client sends, read from security.token_file.
std::string read_token(const Security& security);

// OK when `context` carries `token` (or none is wanted), else UNAUTHENTICATED saying what to give.
grpc::Status check_token(const grpc::ServerContext& context, const std::string& token);

// A channel to `target` ("host:port"): TLS when security.tls_ca is given.
std::shared_ptr<grpc::Channel> client_channel(const std::string& target, const Security& security);
// A call's context with the token and a deadline.
std::unique_ptr<grpc::ClientContext> client_context(const std::string& token, std::chrono::milliseconds deadline);

// This machine's name (gethostname), as workers tell the dispatcher.
std::string machine_name();

// "DEADLINE_EXCEEDED: ..." for messages.
std::string status_text(const grpc::Status& status);

}  // namespace sluice::service::detail
