#pragma once
// What the dispatcher and the workers share: how a server listens (TLS or not, a token checked on
// every call) and how a client reaches one.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "sluice/service/service.hpp"

namespace sluice::service::detail {

class TokenHolder;

// The credentials a server listening on `bind` uses; throws ServiceError when off loopback
// without TLS and a token (and without `insecure`), or when a file cannot be read. `what` names
// the process in messages ("the dispatcher"). Unless it serves --insecure, a call without the
// token `token` holds is refused as soon as its metadata arrives, before its message is read
// (gRPC reads a whole message, of any size, before a handler sees it).
std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& bind, const Security& security, const std::string& what,
                                                            std::shared_ptr<const TokenHolder> token);

// Leaves gRPC's own log lines out of the output (Sluice says what failed, in words), unless the
// user set GRPC_VERBOSITY. Called before the first server or channel is made.
void quiet_grpc_logging();

// The token a server wants (empty: none) and a client sends, read from security.token_file.
std::string read_token(const Security& security);

// A dispatcher on loopback given no token file still wants a token: its own, made at random and
// kept in a file only its user can read (own_token_path), where that user's workers, trainers and
// `sluice service` commands on this machine find it by the dispatcher's port. Any other user's
// process reaches loopback too, and is refused.
std::filesystem::path own_token_path(int port);
// The token kept for `port` when a valid one is there (a dispatcher restarted on its port keeps
// its callers), else a new one; written by keep_own_token once the port is known.
std::string own_token(int port);
void keep_own_token(int port, const std::string& token);
// Removes the file when it still holds `token` (a dispatcher that ends without a journal).
void forget_own_token(int port, const std::string& token);
// Whether a server on `bind` with `security` makes its own token.
bool makes_own_token(const std::string& bind, const Security& security);
// The token a client of the dispatcher at `target` ("host:port") sends: the token file's, else,
// for a dispatcher on loopback, the one it keeps for its port when this user can read it, else none.
std::string client_token(const std::string& target, const Security& security);

// OK when `context` carries `token` (or none is wanted), else UNAUTHENTICATED saying what to give.
grpc::Status check_token(const grpc::ServerContext& context, const std::string& token);
// The same for a call's "authorization" value (null: none given).
grpc::Status check_authorization(const grpc::string_ref* given, const std::string& token);

// The token a worker checks and sends, known once it has reached its dispatcher (a dispatcher on
// loopback writes its own when it starts, maybe after its workers): until then, calls are refused.
class TokenHolder {
 public:
  void set(std::string token) {
    std::lock_guard lock(mutex_);
    token_ = std::move(token);
    known_ = true;
  }
  std::string get() const {
    std::lock_guard lock(mutex_);
    return token_;
  }
  // OK when known and `context` carries it.
  grpc::Status check(const grpc::ServerContext& context) const {
    std::lock_guard lock(mutex_);
    if (!known_) return {grpc::StatusCode::UNAVAILABLE, "this worker has not reached its dispatcher yet: ask again soon"};
    return check_token(context, token_);
  }
  grpc::Status check(const grpc::string_ref* authorization) const {
    std::lock_guard lock(mutex_);
    if (!known_) return {grpc::StatusCode::UNAVAILABLE, "this worker has not reached its dispatcher yet: ask again soon"};
    return check_authorization(authorization, token_);
  }

 private:
  mutable std::mutex mutex_;
  std::string token_;
  bool known_ = false;
};

// A channel to `target` ("host:port"): TLS when security.tls_ca is given.
std::shared_ptr<grpc::Channel> client_channel(const std::string& target, const Security& security);
// A call's context with the token and a deadline.
std::unique_ptr<grpc::ClientContext> client_context(const std::string& token, std::chrono::milliseconds deadline);

// This machine's name (gethostname), as workers tell the dispatcher.
std::string machine_name();

// "DEADLINE_EXCEEDED: ..." for messages.
std::string status_text(const grpc::Status& status);

}  // namespace sluice::service::detail
