#include "security.hpp"

#include <fmt/format.h>
#include <grpc/support/log.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sluice::service {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::string grpc_target(const std::string& address) {
  std::string target = address;
  if (target.rfind("grpc://", 0) == 0) target = target.substr(7);
  const auto colon = target.rfind(':');
  if (target.empty() || colon == std::string::npos || colon == 0 || colon + 1 == target.size() ||
      target.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    throw ServiceError(fmt::format("'{}' is not a service address: give HOST:PORT (or grpc://HOST:PORT)", address));
  return target;
}

namespace detail {
namespace {

void drop_grpc_log_line(gpr_log_func_args*) {}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ServiceError(fmt::format("cannot read {} {}: {}", what, path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void quiet_grpc_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC's own lines ("E1129 ... chttp2_server.cc:1045] UNKNOWN:No address added ...") came
    // before Sluice's message saying the same in words; GRPC_VERBOSITY set by the user keeps them.
    const char* verbosity = std::getenv("GRPC_VERBOSITY");
    if (!verbosity || !*verbosity) gpr_set_log_function(drop_grpc_log_line);
  });
}

std::string read_token(const Security& security) {
  if (security.token_file.empty()) return {};
  std::string token = read_file(security.token_file, "the token file");
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw ServiceError(fmt::format("the token file {} is empty: put the shared token in it", security.token_file));
  return token;
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& bind, const Security& security, const std::string& what) {
  quiet_grpc_logging();
  const bool tls = !security.tls_cert.empty() || !security.tls_key.empty();
  if (tls && (security.tls_cert.empty() || security.tls_key.empty()))
    throw ServiceError(fmt::format("{}: TLS needs both --tls-cert and --tls-key", what));
  if (!is_loopback(bind) && !security.insecure && (!tls || security.token_file.empty()))
    throw ServiceError(fmt::format("{} would listen on {}, which other machines reach: give it --tls-cert, --tls-key and --token-file "
                                   "(every client then needs the token), or say --insecure to serve without them",
                                   what, bind));
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({read_file(security.tls_key, "the TLS key"), read_file(security.tls_cert, "the TLS certificate")});
  return grpc::SslServerCredentials(options);
}

grpc::Status check_token(const grpc::ServerContext& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto given = metadata.find("authorization");
  if (given == metadata.end())
    return {grpc::StatusCode::UNAUTHENTICATED, "this server wants the shared token: give the client --token-file"};
  const std::string want = "Bearer " + token;
  const std::string_view have(given->second.data(), given->second.size());
  // The same time whatever the mismatch, so that the token cannot be guessed byte by byte.
  unsigned char differ = have.size() != want.size();
  for (std::size_t i = 0; i < want.size(); ++i) differ |= static_cast<unsigned char>(want[i] ^ (i < have.size() ? have[i] : 0));
  if (differ) return {grpc::StatusCode::UNAUTHENTICATED, "the token given is not this server's: give the client the service's --token-file"};
  return grpc::Status::OK;
}

std::shared_ptr<grpc::Channel> client_channel(const std::string& target, const Security& security) {
  quiet_grpc_logging();
  // A dispatcher or worker restarted is reached again within 2 s (gRPC's own backoff grows to
  // 2 minutes, longer than trainers wait).
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Elements of any size (batches of images are tens of MB).
  arguments.SetMaxReceiveMessageSize(-1);
  if (security.tls_ca.empty()) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments);
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = read_file(security.tls_ca, "the TLS authority");
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(options), arguments);
}

std::unique_ptr<grpc::ClientContext> client_context(const std::string& token, std::chrono::milliseconds deadline) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + deadline);
  return context;
}

std::string machine_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::string status_text(const grpc::Status& status) {
  static const char* const names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                      "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                      "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  return fmt::format("{}: {}", code >= 0 && code <= 16 ? names[code] : "status " + std::to_string(code), status.error_message());
}

}  // namespace detail
}  // namespace sluice::service
