#pragma once
// HTTP(S) requests through libcurl: connections kept and reused across requests (a pool of curl
// handles), the body handed to the caller as it arrives, and failures sorted into those worth a
// retry (resets, timeouts, 5xx, 429) and those that are not.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::remote {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  Headers headers;
  std::string_view body;  // sent for PUT and POST; must outlive perform()
  // When set and true, the transfer ends at once (TransportError, not retryable): the run was
  // asked to stop.
  const std::atomic<bool>* cancelled = nullptr;
};

struct HttpResponse {
  long status = 0;
  Headers headers;  // names lower-cased
  std::string header(std::string_view name) const;  // "" when absent
};

// A request that got no HTTP answer: the connection failed, was reset, or stalled past the
// timeout. `retryable` is false for what another try cannot mend (a certificate that does not
// verify, a host name that does not resolve, a malformed URL).
class TransportError : public std::runtime_error {
 public:
  TransportError(const std::string& message, bool retryable, bool cancelled = false)
      : std::runtime_error(message), retryable_(retryable), cancelled_(cancelled) {}
  bool retryable() const { return retryable_; }
  bool cancelled() const { return cancelled_; }  // ended by HttpRequest::cancelled

 private:
  bool retryable_, cancelled_;
};

struct HttpOptions {
  long connect_timeout_ms = 10000;
  long stall_timeout_s = 30;  // a transfer that moves no byte for this long is cut and retried
  std::string ca_file;        // CURL_CA_BUNDLE or SSL_CERT_FILE: a custom certificate authority
};

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs one request. The body of the answer goes to `on_body` as it arrives (return false
  // to stop the transfer early, which is then no error); `on_headers` sees the status and headers
  // before the first byte of the body and may return false to take no body. Throws TransportError.
  using BodySink = std::function<bool(const char* data, std::size_t size)>;
  using HeadersSeen = std::function<bool(const HttpResponse&)>;
  HttpResponse perform(const HttpRequest& request, const BodySink& on_body, const HeadersSeen& on_headers = {});

  const HttpOptions& options() const { return options_; }

 private:
  struct Pool;
  HttpOptions options_;
  std::unique_ptr<Pool> pool_;
};

// The options as the environment gives them (the CA bundle of CURL_CA_BUNDLE or SSL_CERT_FILE).
HttpOptions http_options_from_environment();

}  // namespace sluice::remote
