#include "sluice/remote/http_client.hpp"
#include "text.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace sluice::remote {
namespace {

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// What another try may mend: the network, the peer going away, a stall. Not a certificate that
// does not verify, a name that does not resolve or a URL curl cannot parse.
bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:  // a connection cut before a whole status line came
      return true;
    default:
      return false;
  }
}

struct Transfer {
  const HttpRequest* request;
  const HttpClient::BodySink* on_body;
  const HttpClient::HeadersSeen* on_headers;
  HttpResponse response;
  std::size_t sent = 0;
  bool headers_told = false, stopped = false;
  CURL* curl = nullptr;

  // Tells the caller the status and headers once; false: it wants no body.
  bool tell_headers() {
    if (headers_told) return !stopped;
    headers_told = true;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    if (*on_headers && !(*on_headers)(response)) stopped = true;
    return !stopped;
  }
};

std::size_t on_header_line(char* data, std::size_t size, std::size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const std::string_view line(data, size * count);
  if (line.substr(0, 5) == "HTTP/") {
    t.response.headers.clear();  // a new response (after 100 Continue): its own headers
  } else if (line == "\r\n" || line == "\n") {
    // The end of a response's headers: the caller learns them now, before any body arrives (and
    // can refuse a body that would never come, or that it does not need).
    long status = 0;
    curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && !t.tell_headers()) return 0;
  } else if (const auto colon = line.find(':'); colon != std::string_view::npos) {
    t.response.headers.emplace_back(lowercase(trim(line.substr(0, colon))), trim(line.substr(colon + 1)));
  }
  return size * count;
}

std::size_t on_body_bytes(char* data, std::size_t size, std::size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  if (!t.tell_headers()) return 0;  // stops the transfer: CURLE_WRITE_ERROR, taken as no error
  if (*t.on_body && !(*t.on_body)(data, size * count)) {
    t.stopped = true;
    return 0;
  }
  return size * count;
}

std::size_t on_upload_bytes(char* buffer, std::size_t size, std::size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const std::size_t n = std::min(size * count, t.request->body.size() - t.sent);
  std::memcpy(buffer, t.request->body.data() + t.sent, n);
  t.sent += n;
  return n;
}

// Rewinds the body when curl sends it again (a redirect, an authentication round).
int on_seek(void* user, curl_off_t offset, int origin) {
  auto& t = *static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t.request->body.size()) return CURL_SEEKFUNC_FAIL;
  t.sent = static_cast<std::size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

// Called by curl about once a second, and on every chunk: a non-zero answer ends the transfer.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::atomic<bool>*>(user);
  return cancelled->load(std::memory_order_relaxed) ? 1 : 0;
}

// curl's words, and what they mean where they mislead ("Received HTTP/0.9" is a cut connection
// or something other than an HTTP server) or leave out what to check.
std::string explained(CURLcode code, const std::string& detail) {
  switch (code) {
    case CURLE_WEIRD_SERVER_REPLY:
      return "the answer was not HTTP (" + detail + "): the connection was cut before the answer's first line, or what listens there is not an HTTP server";
    case CURLE_COULDNT_RESOLVE_HOST:
      return detail + ": check the host name (and the network's name service)";
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return detail + ": the server's certificate does not verify against the certificate authorities in use (CURL_CA_BUNDLE or "
                      "SSL_CERT_FILE name another)";
    case CURLE_URL_MALFORMAT:
      return detail + ": check the URI";
    default:
      return detail;
  }
}

struct HeaderList {
  curl_slist* list = nullptr;
  ~HeaderList() { curl_slist_free_all(list); }
  void add(const std::string& line) { list = curl_slist_append(list, line.c_str()); }
};

}  // namespace

std::string HttpResponse::header(std::string_view name) const {
  const std::string wanted = lowercase(name);
  for (const auto& [n, v] : headers)
    if (n == wanted) return v;
  return "";
}

// Idle curl handles: each keeps its connections open, so a request taking one reuses a
// connection an earlier request opened to that host.
struct HttpClient::Pool {
  std::mutex mutex;
  std::vector<CURL*> idle;
  ~Pool() {
    for (CURL* c : idle) curl_easy_cleanup(c);
  }
  CURL* take() {
    {
      std::lock_guard lock(mutex);
      if (!idle.empty()) {
        CURL* c = idle.back();
        idle.pop_back();
        curl_easy_reset(c);  // options only: live connections and the DNS cache stay
        return c;
      }
    }
    CURL* c = curl_easy_init();
    if (!c) throw TransportError("libcurl could not make a handle (out of memory?)", false);
    return c;
  }
  void give_back(CURL* c) {
    std::lock_guard lock(mutex);
    idle.push_back(c);
  }
};

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)), pool_(std::make_unique<Pool>()) { init_curl_once(); }
HttpClient::~HttpClient() = default;

HttpResponse HttpClient::perform(const HttpRequest& request, const BodySink& on_body, const HeadersSeen& on_headers) {
  CURL* curl = pool_->take();
  struct Return {
    Pool& pool;
    CURL* curl;
    ~Return() { pool.give_back(curl); }
  } give_back{*pool_, curl};

  Transfer t{&request, &on_body, &on_headers, {}, 0, false, false, curl};
  HeaderList headers;
  for (const auto& [name, value] : request.headers) headers.add(name + ": " + value);
  headers.add("Expect:");  // no 100-continue round trip before a part's body

  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  // The path as given: an object key may hold "." and ".." segments, which are part of the key
  // (resolving them would send the request to another key, or another bucket).
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  if (request.cancelled) {
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, request.cancelled);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  }
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L * 1024);  // a few large reads per range, not 16 KB ones
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, options_.connect_timeout_ms);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, options_.stall_timeout_s);
  if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header_line);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body_bytes);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, on_upload_bytes);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }

  const CURLcode code = curl_easy_perform(curl);
  if (code == CURLE_WRITE_ERROR && t.stopped) return t.response;  // the caller had what it wanted
  if (code == CURLE_ABORTED_BY_CALLBACK) throw TransportError("stopped: the run was asked to stop", false, true);
  if (code != CURLE_OK) {
    std::string detail = error[0] ? std::string(error) : curl_easy_strerror(code);
    while (!detail.empty() && detail.back() == '\n') detail.pop_back();
    // curl 7.88 files "Received HTTP/0.9" (bytes that are no status line) as a protocol error.
    const CURLcode kind = detail.find("HTTP/0.9") != std::string::npos ? CURLE_WEIRD_SERVER_REPLY : code;
    throw TransportError(explained(kind, detail), retryable(kind));
  }
  t.tell_headers();  // an answer without a body
  return t.response;
}

HttpOptions http_options_from_environment() {
  HttpOptions options;
  for (const char* variable : {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    const char* value = std::getenv(variable);
    if (value && *value) {
      options.ca_file = value;
      break;
    }
  }
  return options;
}

}  // namespace sluice::remote
