#pragma once
// Requests to object stores (S3, S3-compatible, GCS's XML API) and HTTP(S) servers: signed,
// retried with exponential backoff and jitter, resumed at the byte a cut transfer reached, and
// refused at once with the URI, status, the store's error code and what to do when another try
// cannot help. Counts requests, bytes, retries, throttles and latency for the metrics.
#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "sluice/remote/http_client.hpp"
#include "sluice/remote/request_counters.hpp"
#include "sluice/remote/store_config.hpp"

namespace sluice::remote {

// A request that failed for good. The message names the URI, the HTTP status and the store's
// error code and says what to do; it never holds a secret.
class StoreError : public std::runtime_error {
 public:
  StoreError(const std::string& message, long status, std::string code, bool retryable)
      : std::runtime_error(message), status_(status), code_(std::move(code)), retryable_(retryable) {}
  long status() const { return status_; }
  const std::string& code() const { return code_; }
  bool retryable() const { return retryable_; }

 private:
  long status_;
  std::string code_;
  bool retryable_;
};

struct RetryPolicy {
  int max_attempts = 10;                            // tries of one request, the first included
  std::chrono::milliseconds deadline{300000};       // and no new try this long after the first
  std::chrono::milliseconds first_backoff{100};     // doubled at each retry, up to max_backoff,
  std::chrono::milliseconds max_backoff{10000};     // each wait drawn between half and all of it
};

struct ObjectVersion {
  std::uint64_t size = 0;
  std::string etag;  // as the store gives it, quotes and all; "" when it gives none
};

struct ListedObject {
  std::string key;
  std::uint64_t size = 0;
  std::string etag;
};

class ObjectStore {
 public:
  ObjectStore(Environment environment, HttpOptions http);

  // Size and ETag, from a HEAD request.
  ObjectVersion head(const std::string& uri, const RetryPolicy& retry, RequestCounters* counters = nullptr);
  // Reads up to `length` bytes at `offset` into `dst` and returns how many (fewer only at the
  // end of the object; 0 at or past it). `version` is filled on the first answer when its size is
  // unknown (etag empty and size 0) and checked on every later one: an object that changed is a
  // StoreError naming it.
  // `progress`, when given, is told the bytes in `dst` so far as they arrive (0 once the first
  // answer's headers have set `version`), so that a reader can start on them before the range ends.
  std::size_t read_range(const std::string& uri, std::uint64_t offset, std::size_t length, std::byte* dst, ObjectVersion& version,
                         const RetryPolicy& retry, RequestCounters* counters, const std::function<void(std::size_t)>& progress = {});
  // Every object of `bucket` whose key begins with `prefix`, over every page, in key order.
  std::vector<ListedObject> list(const std::string& uri_prefix, const RetryPolicy& retry, RequestCounters* counters);
  // Publishes the file at `local_path` as the object `uri`: one PUT up to `part_bytes`, else a
  // multipart upload of parts of `part_bytes` (more where 10,000 parts would not hold the file),
  // `parallel` of them in flight, completed once all arrived and aborted on any failure.
  void upload(const std::string& local_path, const std::string& uri, std::size_t part_bytes, int parallel, const RetryPolicy& retry,
              RequestCounters* counters);

 private:
  struct Target {
    std::string url, host, path;  // path as signed: not yet percent-encoded
    const S3Settings* settings = nullptr;  // null for http(s)
  };
  Target target_of(const RemoteLocation& at);
  const S3Settings& settings_for(RemoteLocation::Scheme scheme);
  // Adds the query to the URL and, unless anonymous, the signature's headers; returns the
  // canonical request signed ("" when unsigned), to compare with what a store says it signed.
  std::string sign(HttpRequest& request, const Target& target, const std::vector<std::pair<std::string, std::string>>& query,
                   const std::string& payload_sha256);
  std::unique_ptr<class ListingPage> list_page(const std::string& uri_prefix, const Target& target,
                                               const std::vector<std::pair<std::string, std::string>>& query, RequestCounters* counters);
  template <class Attempt>
  auto with_retries(const std::string& uri, const RetryPolicy& retry, RequestCounters* counters, const std::atomic<bool>* cancelled,
                    Attempt&& attempt) -> decltype(attempt());

  Environment environment_;
  HttpClient http_;
  std::mutex settings_mutex_;
  std::map<RemoteLocation::Scheme, std::unique_ptr<S3Settings>> settings_;
};

// The error an answer with status >= 300 stands for: the store's code and message from its XML
// body where it has one, whether another try may help, and what to do. `credentials_from` says
// where credentials came from, and `signed_canonical_request` what was signed, for the advice on
// refused signatures.
StoreError error_of_answer(const std::string& uri, long status, const std::string& body, const std::string& credentials_from,
                           const std::string& signed_canonical_request = "");

}  // namespace sluice::remote
