#include "security.hpp"

#include <fmt/format.h>
#include <grpc/support/log.h>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
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

namespace {

// Where a user's dispatchers keep their own tokens: SLUICE_RUNTIME_DIR, else the session's
// runtime folder ($XDG_RUNTIME_DIR/sluice), else ~/.sluice/run; made private to the user.
std::filesystem::path own_token_folder() {
  std::filesystem::path folder;
  if (const char* set = std::getenv("SLUICE_RUNTIME_DIR"); set && *set) folder = set;
  else if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime) folder = std::filesystem::path(runtime) / "sluice";
  else if (const char* home = std::getenv("HOME"); home && *home) folder = std::filesystem::path(home) / ".sluice" / "run";
  else throw ServiceError("the dispatcher has no folder to keep its token in: set SLUICE_RUNTIME_DIR (or HOME), or give it --token-file");
  return folder;
}

// The token in `path` when it is a regular file of this user that no one else can read.
std::optional<std::string> read_private_token(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::string token;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0 && st.st_size < 4096) {
    char block[4096];
    const ssize_t got = ::read(fd, block, sizeof block);
    if (got > 0) token.assign(block, static_cast<std::size_t>(got));
  }
  ::close(fd);
  while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  if (token.size() != 64 || token.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  return token;
}

// The folder, made if missing; refused when it is not this user's alone (a token put there by
// another could be read or replaced).
void make_private_folder(const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw ServiceError(fmt::format("the dispatcher cannot keep its token in {}: {}; set SLUICE_RUNTIME_DIR to a folder of yours, or give "
                                   "it --token-file",
                                   folder.string(), ec ? ec.message() : "not a folder"));
  if (st.st_uid != ::geteuid())
    throw ServiceError(fmt::format("the folder {} where the dispatcher keeps its token belongs to another user: set SLUICE_RUNTIME_DIR "
                                   "to a folder of yours, or give it --token-file",
                                   folder.string()));
  if ((st.st_mode & 077) != 0) ::chmod(folder.c_str(), 0700);
}

std::string random_token() {
  unsigned char bytes[32];
  for (std::size_t got = 0; got < sizeof bytes;) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ServiceError(fmt::format("the dispatcher cannot draw its token: {}", std::strerror(errno)));
    got += static_cast<std::size_t>(n);
  }
  std::string hex;
  for (const unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace

std::filesystem::path own_token_path(int port) { return own_token_folder() / fmt::format("dispatcher-{}.token", port); }

bool makes_own_token(const std::string& bind, const Security& security) {
  return security.token_file.empty() && !security.insecure && is_loopback(bind);
}

std::string own_token(int port) {
  if (port > 0)
    if (auto kept = read_private_token(own_token_path(port))) return *kept;
  return random_token();
}

void keep_own_token(int port, const std::string& token) {
  const auto path = own_token_path(port);
  if (read_private_token(path) == token) return;
  make_private_folder(path.parent_path());
  std::string temporary = path.string() + ".XXXXXX";
  const int fd = ::mkstemp(temporary.data());  // 0600, a name of its own
  if (fd < 0) throw ServiceError(fmt::format("the dispatcher cannot write its token into {}: {}", path.parent_path().string(), std::strerror(errno)));
  const std::string line = token + "\n";
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw ServiceError(fmt::format("the dispatcher cannot write its token file {}: {}", path.string(), why));
  }
}

void forget_own_token(int port, const std::string& token) {
  try {
    const auto path = own_token_path(port);
    if (read_private_token(path) == token) ::unlink(path.c_str());
  } catch (const ServiceError&) {
  }
}

std::string client_token(const std::string& target, const Security& security) {
  if (!security.token_file.empty()) return read_token(security);
  const auto colon = target.rfind(':');
  std::string host = target.substr(0, colon == std::string::npos ? 0 : colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (colon == std::string::npos || !is_loopback(host)) return {};
  try {
    return read_private_token(own_token_path(std::stoi(target.substr(colon + 1)))).value_or("");
  } catch (const std::exception&) {
    return {};  // no folder to look in, or no port: none (the dispatcher says what it wants)
  }
}

namespace {

// Runs when a call's metadata has arrived, before the server asks for its message: a refused call
// never has its body read (HTTP/2 flow control then holds the sender to a few kilobytes).
class TokenCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenCheck(std::shared_ptr<const TokenHolder> token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*, OutputMetadata*) override {
    const auto given = metadata.find("authorization");
    return token_->check(given == metadata.end() ? nullptr : &given->second);
  }

 private:
  std::shared_ptr<const TokenHolder> token_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& bind, const Security& security, const std::string& what,
                                                            std::shared_ptr<const TokenHolder> token) {
  quiet_grpc_logging();
  const bool tls = !security.tls_cert.empty() || !security.tls_key.empty();
  if (tls && (security.tls_cert.empty() || security.tls_key.empty()))
    throw ServiceError(fmt::format("{}: TLS needs both --tls-cert and --tls-key", what));
  if (!is_loopback(bind) && !security.insecure && (!tls || security.token_file.empty()))
    throw ServiceError(fmt::format("{} would listen on {}, which other machines reach: give it --tls-cert, --tls-key and --token-file "
                                   "(every client then needs the token), or say --insecure to serve without them",
                                   what, bind));
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls) {
    grpc::SslServerCredentialsOptions options;
    options.pem_key_cert_pairs.push_back({read_file(security.tls_key, "the TLS key"), read_file(security.tls_cert, "the TLS certificate")});
    credentials = grpc::SslServerCredentials(options);
  } else if (is_loopback(bind) && !security.insecure) {
    // Plain TCP as before (clients need nothing else), but credentials that take a processor.
    credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    return grpc::InsecureServerCredentials();  // --insecure off loopback: no token either
  }
  credentials->SetAuthMetadataProcessor(std::make_shared<TokenCheck>(std::move(token)));
  return credentials;
}

grpc::Status check_token(const grpc::ServerContext& context, const std::string& token) {
  const auto& metadata = context.client_metadata();
  const auto given = metadata.find("authorization");
  return check_authorization(given == metadata.end() ? nullptr : &given->second, token);
}

grpc::Status check_authorization(const grpc::string_ref* given, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  if (!given)
    return {grpc::StatusCode::UNAUTHENTICATED,
            "this server wants the service's token: the dispatcher's user finds it on the dispatcher's machine by itself (a dispatcher "
            "on loopback keeps its own, readable by that user only); otherwise give the client --token-file"};
  const std::string want = "Bearer " + token;
  const std::string_view have(given->data(), given->size());
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
