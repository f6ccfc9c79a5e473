#include "sluice/remote/object_store.hpp"
#include "listing_parser.hpp"
#include "text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <tinyxml2.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <random>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "sluice/remote/s3_signature.hpp"

namespace sluice::remote {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string amz_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

// The authority of a URL ("host:port") and what follows it.
std::pair<std::string, std::string> split_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  const auto host_begin = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  const auto path_begin = url.find('/', host_begin);
  if (path_begin == std::string::npos) return {url.substr(host_begin), "/"};
  return {url.substr(host_begin, path_begin - host_begin), url.substr(path_begin)};
}

// "bytes FIRST-LAST/TOTAL" or "bytes */TOTAL": the total, or -1 when unknown ("*").
std::int64_t total_of_content_range(const std::string& value) {
  const auto slash = value.rfind('/');
  if (slash == std::string::npos || slash + 1 >= value.size() || value[slash + 1] == '*') return -1;
  return std::strtoll(value.c_str() + slash + 1, nullptr, 10);
}

std::string xml_text(const tinyxml2::XMLElement* parent, const char* name) {
  const auto* e = parent ? parent->FirstChildElement(name) : nullptr;
  return e && e->GetText() ? e->GetText() : "";
}

bool retryable_answer(long status, const std::string& code) {
  if (status == 500 || status == 502 || status == 503 || status == 504 || status == 429 || status == 408) return true;
  return code == "SlowDown" || code == "InternalError" || code == "RequestTimeout" || code == "ServiceUnavailable";
}

std::string advice_for(const std::string& uri, long status, const std::string& code, const std::string& credentials_from) {
  if (uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0) {  // a web server: no S3 codes, no credentials
    if (status == 404 || status == 410) return "the server has no file at this URL: check it (curl -I URL shows what the server answers)";
    if (status == 401 || status == 403) return "the server refused access: Sluice sends no credentials to http(s) URLs; use a URL that needs none";
    if (status == 429 || status == 503) return "the server is throttling: fewer parallel readers, or a higher retry limit, would help";
    if (status >= 500) return "the server failed; the retries were spent (raise options.remote.max_attempts or try later)";
    return "see the server's answer (curl -I URL)";
  }
  const std::string from = credentials_from.empty() ? "no credentials were found (anonymous requests)" : "credentials from " + credentials_from;
  if (code == "NoSuchKey" || (code.empty() && status == 404)) return "no object has this name: check the key (list the folder with `aws s3 ls`)";
  if (code == "NoSuchBucket") return "the bucket does not exist at this endpoint: check its name, AWS_ENDPOINT_URL and the region";
  if (code == "SignatureDoesNotMatch")
    return "the store computed another signature and did not say over what: either the secret key does not belong to the key id (" + from +
           "), or something between Sluice and the store changed the request (a proxy)";
  if (code == "InvalidAccessKeyId") return "the store does not know the key id (" + from + "): check the credentials and the endpoint";
  if (code == "AccessDenied" || status == 403) return "the store refused access with " + from + ": check the credentials and the bucket's policy";
  if (code == "PreconditionFailed" || status == 412) return "the object changed while it was read: rerun once it no longer changes";
  if (code == "SlowDown" || status == 429 || status == 503) return "the store is throttling: fewer parallel readers, or a higher retry limit, would help";
  if (status >= 500) return "the store failed; the retries were spent (raise options.remote.max_attempts or try later)";
  return "see the store's message";
}

}  // namespace

namespace {

// A line of a canonical request fit to print: a session token is a credential.
std::string printable_line(std::string_view line) {
  if (line.rfind("x-amz-security-token:", 0) == 0) return "x-amz-security-token:(left out)";
  return std::string(line);
}

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t at = 0;;) {
    const auto end = text.find('\n', at);
    lines.push_back(text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
    if (end == std::string_view::npos) return lines;
    at = end + 1;
  }
}

// What a store that says what it signed (S3 puts its CanonicalRequest in a SignatureDoesNotMatch
// answer) tells about a refused signature: the same request signed with another key is a secret
// that does not belong to the key id; another request is something that changed it on the way.
std::string advice_for_refused_signature(const std::string& stores_request, const std::string& ours, const std::string& credentials_from) {
  const std::string from = credentials_from.empty() ? "no credentials were found" : "credentials from " + credentials_from;
  if (stores_request == ours)
    return "the store signed the request Sluice signed and got another signature: the secret key does not belong to the key id (" + from + ")";
  const auto theirs = lines_of(stores_request), mine = lines_of(ours);
  std::size_t line = 0;
  while (line < theirs.size() && line < mine.size() && theirs[line] == mine[line]) ++line;
  const std::string store_line = line < theirs.size() ? printable_line(theirs[line]) : "(nothing)";
  const std::string our_line = line < mine.size() ? printable_line(mine[line]) : "(nothing)";
  return "the store signed another request than Sluice sent: line " + std::to_string(line + 1) + " of its canonical request is '" +
         store_line + "' where Sluice signed '" + our_line +
         "': something between them changed the request (a proxy), or the store reads it otherwise; the secret key was not checked";
}

}  // namespace

StoreError error_of_answer(const std::string& uri, long status, const std::string& body, const std::string& credentials_from,
                           const std::string& signed_canonical_request) {
  std::string code, message, stores_request;
  tinyxml2::XMLDocument doc;
  if (!body.empty() && doc.Parse(body.data(), body.size()) == tinyxml2::XML_SUCCESS) {
    const auto* error = doc.FirstChildElement("Error");
    code = xml_text(error, "Code");
    message = xml_text(error, "Message");  // the store's words; a key id is left out
    stores_request = xml_text(error, "CanonicalRequest");
  }
  const std::string advice = code == "SignatureDoesNotMatch" && !stores_request.empty() && !signed_canonical_request.empty()
                                 ? advice_for_refused_signature(stores_request, signed_canonical_request, credentials_from)
                                 : advice_for(uri, status, code, credentials_from);
  std::string text = uri + ": HTTP " + std::to_string(status) + (code.empty() ? "" : " " + code) + (message.empty() ? "" : " (" + message + ")") +
                     ": " + advice;
  return StoreError(text, status, code, retryable_answer(status, code));
}

ObjectStore::ObjectStore(Environment environment, HttpOptions http) : environment_(std::move(environment)), http_(std::move(http)) {}

const S3Settings& ObjectStore::settings_for(RemoteLocation::Scheme scheme) {
  std::lock_guard lock(settings_mutex_);
  auto& slot = settings_[scheme];
  if (!slot) slot = std::make_unique<S3Settings>(s3_settings(scheme, environment_));
  return *slot;
}

ObjectStore::Target ObjectStore::target_of(const RemoteLocation& at) {
  Target target;
  if (at.scheme == RemoteLocation::Scheme::Http || at.scheme == RemoteLocation::Scheme::Https) {
    target.url = at.url;
    return target;
  }
  target.settings = &settings_for(at.scheme);
  target.url = object_url(*target.settings, at.bucket, at.key);
  target.host = split_url(target.url).first;
  target.path = target.settings->path_style ? "/" + at.bucket + "/" + at.key : "/" + at.key;
  return target;
}

std::string ObjectStore::sign(HttpRequest& request, const Target& target, const std::vector<std::pair<std::string, std::string>>& query,
                              const std::string& payload_sha256) {
  if (!query.empty()) {
    request.url += '?';
    for (std::size_t i = 0; i < query.size(); ++i)
      request.url += (i ? "&" : "") + uri_encode(query[i].first, false) + "=" + uri_encode(query[i].second, false);
  }
  if (!target.settings || target.settings->anonymous) return "";
  RequestToSign to_sign;
  to_sign.method = request.method;
  to_sign.path = target.path;
  to_sign.query = query;
  to_sign.payload_sha256 = payload_sha256;
  to_sign.region = target.settings->region;
  to_sign.amz_date = amz_date_now();
  to_sign.headers = {{"host", target.host}, {"x-amz-content-sha256", payload_sha256}, {"x-amz-date", to_sign.amz_date}};
  if (!target.settings->credentials.session_token.empty())
    to_sign.headers.emplace_back("x-amz-security-token", target.settings->credentials.session_token);
  for (const auto& header : to_sign.headers)
    if (header.first != "host") request.headers.push_back(header);
  std::string canonical = canonical_request(to_sign);
  request.headers.emplace_back("Authorization", authorization(to_sign, canonical, target.settings->credentials));
  return canonical;
}

template <class Attempt>
auto ObjectStore::with_retries(const std::string& uri, const RetryPolicy& retry, RequestCounters* counters, const std::atomic<bool>* cancelled,
                               Attempt&& attempt) -> decltype(attempt()) {
  const auto first = Clock::now();
  thread_local std::minstd_rand jitter(static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  auto backoff = retry.first_backoff;
  auto stopped = [&] { return cancelled && cancelled->load(std::memory_order_relaxed); };
  auto stop = [&] { return StoreError(uri + ": stopped: the run was asked to stop", 0, "", false); };
  for (int tries = 1;; ++tries) {
    if (stopped()) throw stop();
    if (counters) counters->requests.fetch_add(1, std::memory_order_relaxed);
    std::string why;
    try {
      return attempt();
    } catch (const TransportError& e) {
      if (e.cancelled()) throw stop();
      if (!e.retryable()) {
        if (counters) counters->errors.fetch_add(1, std::memory_order_relaxed);
        throw StoreError(uri + ": " + e.what() + " (not retried)", 0, "", false);
      }
      why = uri + ": " + e.what();
    } catch (const StoreError& e) {
      if (!e.retryable()) {
        if (counters) counters->errors.fetch_add(1, std::memory_order_relaxed);
        throw;
      }
      if (counters && (e.code() == "SlowDown" || e.status() == 429 || e.status() == 503))
        counters->throttles.fetch_add(1, std::memory_order_relaxed);
      why = e.what();
    }
    const auto elapsed = Clock::now() - first;
    if (tries >= retry.max_attempts || elapsed + backoff > retry.deadline) {
      if (counters) counters->errors.fetch_add(1, std::memory_order_relaxed);
      const auto seconds = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() / 1000.0;
      throw StoreError(why + " (gave up after " + std::to_string(tries) + " tries over " + std::to_string(seconds).substr(0, 5) +
                           " s; options.remote.max_attempts and deadline set how long to keep trying)", 0, "", false);
    }
    if (counters) counters->retries.fetch_add(1, std::memory_order_relaxed);
    std::uniform_int_distribution<long> wait(backoff.count() / 2, backoff.count());
    // In short steps, so that a stop asked for during a long backoff is heard at once.
    for (auto until = Clock::now() + std::chrono::milliseconds(wait(jitter)); Clock::now() < until && !stopped();)
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
    backoff = std::min(backoff * 2, retry.max_backoff);
  }
}

namespace {
const std::atomic<bool>* cancel_flag(RequestCounters* counters) { return counters ? &counters->cancelled : nullptr; }

bool ends_with(const std::string& text, std::string_view tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// What is wrong with a 200 OK answering a ranged GET ("" when nothing): a web page where the URI
// names no web page, or a body whose length is not the object's size (known from a listing or an
// earlier answer: `known_size`, -1 when not known).
std::string contradicting_answer(const std::string& uri, const HttpResponse& answer, std::int64_t length, std::int64_t known_size) {
  const std::string type = lowercase(answer.header("content-type"));
  const std::string path = lowercase(uri.substr(0, uri.find_first_of("?#")));
  const std::string size = length >= 0 ? std::to_string(length) + " bytes" : "a body of unknown length";
  if (type.rfind("text/html", 0) == 0 && !ends_with(path, ".html") && !ends_with(path, ".htm"))
    return "200 OK and " + size + " of text/html (a web page)";
  if (known_size >= 0 && length >= 0 && length != known_size)
    return "200 OK and " + size + " where the object has " + std::to_string(known_size);
  return "";
}

// Notes an answer's time to its first byte (its headers) in the stage's latency buckets.
HttpClient::HeadersSeen latency_noter(RequestCounters* counters) {
  if (!counters) return {};
  return [counters, sent = Clock::now()](const HttpResponse&) {
    counters->add_latency(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent));
    return true;
  };
}
}  // namespace

ObjectVersion ObjectStore::head(const std::string& uri, const RetryPolicy& retry, RequestCounters* counters) {
  const auto at = parse_remote_uri(uri);
  if (!at) throw StoreError(uri + " is not a remote URI", 0, "", false);
  const Target target = target_of(*at);
  return with_retries(uri, retry, counters, cancel_flag(counters), [&] {
    HttpRequest request;
    request.cancelled = cancel_flag(counters);
    request.method = "HEAD";
    request.url = target.url;
    const std::string signed_request = sign(request, target, {}, kEmptySha256);
    const HttpResponse answer = http_.perform(request, {}, latency_noter(counters));
    if (answer.status >= 300)
      throw error_of_answer(uri, answer.status, "", target.settings ? target.settings->credentials_from : "", signed_request);
    ObjectVersion version;
    version.size = std::strtoull(answer.header("content-length").c_str(), nullptr, 10);
    version.etag = answer.header("etag");
    return version;
  });
}

std::size_t ObjectStore::read_range(const std::string& uri, std::uint64_t offset, std::size_t length, std::byte* dst, ObjectVersion& version,
                                    const RetryPolicy& retry, RequestCounters* counters, const std::function<void(std::size_t)>& progress) {
  const auto at = parse_remote_uri(uri);
  if (!at) throw StoreError(uri + " is not a remote URI", 0, "", false);
  const Target target = target_of(*at);
  const std::string credentials_from = target.settings ? target.settings->credentials_from : "";
  bool known = !version.etag.empty() || version.size > 0;
  std::size_t got = 0;
  if (known && offset >= version.size) return 0;
  return with_retries(uri, retry, counters, cancel_flag(counters), [&]() -> std::size_t {
    if (got == length || (known && offset + got >= version.size)) return got;
    const std::uint64_t from = offset + got;
    HttpRequest request;
    request.cancelled = cancel_flag(counters);
    request.url = target.url;
    request.headers.emplace_back("Range", "bytes=" + std::to_string(from) + "-" + std::to_string(offset + length - 1));
    if (known && !version.etag.empty()) request.headers.emplace_back("If-Match", version.etag);
    const std::string signed_request = sign(request, target, {}, kEmptySha256);

    long status = 0;
    std::string error_body, changed, contradiction;
    std::uint64_t skip = 0;  // a server that ignored the range sends the object from its start
    std::int64_t total = -1;
    const auto sent = Clock::now();
    auto on_headers = [&](const HttpResponse& answer) {
      if (counters) counters->add_latency(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent));
      status = answer.status;
      if (status == 206 || status == 416) total = total_of_content_range(answer.header("content-range"));
      if (status == 200) {
        total = std::strtoll(answer.header("content-length").c_str(), nullptr, 10);
        skip = from;
        // A server that ignores ranges sends the whole object; one that sends a page of its own
        // (a login or error page, 200 OK all the same) must not be read as the object.
        contradiction = contradicting_answer(uri, answer, total, known ? static_cast<std::int64_t>(version.size) : -1);
        if (!contradiction.empty()) return false;
      }
      if (status >= 300 && status != 416) return true;  // the body explains the error
      const std::string etag = answer.header("etag");
      if (known && ((!version.etag.empty() && !etag.empty() && etag != version.etag) ||
                    (total >= 0 && static_cast<std::uint64_t>(total) != version.size))) {
        changed = "its ETag was " + version.etag + " and " + std::to_string(version.size) + " bytes, and is now " + etag + " and " +
                  std::to_string(total) + " bytes";
        return false;
      }
      if (!known && total >= 0) {
        version.size = static_cast<std::uint64_t>(total);
        version.etag = etag;
        known = true;
        if (progress) progress(got);
      }
      // Nothing to take at or past the end (some servers answer a range of an empty object with a
      // promised byte they never send).
      return total < 0 || from < static_cast<std::uint64_t>(total);
    };
    auto on_body = [&](const char* data, std::size_t size) {
      if (status >= 300) {
        if (error_body.size() < 65536) error_body.append(data, std::min<std::size_t>(size, 65536 - error_body.size()));
        return true;
      }
      if (skip) {
        const std::size_t dropped = static_cast<std::size_t>(std::min<std::uint64_t>(skip, size));
        skip -= dropped;
        data += dropped;
        size -= dropped;
      }
      const std::size_t take = std::min(size, length - got);
      std::memcpy(dst + got, data, take);
      got += take;
      if (progress) progress(got);
      if (counters) counters->bytes.fetch_add(take, std::memory_order_relaxed);
      return got < length;
    };
    http_.perform(request, on_body, on_headers);
    if (!contradiction.empty())
      throw StoreError(uri + ": the server answered a request for bytes " + std::to_string(from) + "-" + std::to_string(offset + length - 1) +
                           " with " + contradiction + ", not the object's bytes; check that the URL names the object itself",
                       status, "", false);
    if (!changed.empty())
      throw StoreError(uri + " changed while it was read: " + changed + "; rerun once it no longer changes", status, "", false);
    if (status == 416) return got;  // at or past the end
    if (status >= 300) {
      if (status == 412)
        throw StoreError(uri + " changed while it was read (HTTP 412: it no longer has ETag " + version.etag + "); rerun once it no longer changes",
                         status, "PreconditionFailed", false);
      throw error_of_answer(uri, status, error_body, credentials_from, signed_request);
    }
    const std::uint64_t end = total >= 0 ? std::min<std::uint64_t>(static_cast<std::uint64_t>(total), offset + length) : offset + length;
    if (total >= 0 && offset + got < end)
      throw TransportError("the answer ended after " + std::to_string(offset + got) + " of " + std::to_string(end) + " bytes", true);
    return got;
  });
}

std::vector<ListedObject> ObjectStore::list(const std::string& uri_prefix, const RetryPolicy& retry, RequestCounters* counters) {
  const auto at = parse_remote_uri(uri_prefix);
  if (!at || at->scheme == RemoteLocation::Scheme::Http || at->scheme == RemoteLocation::Scheme::Https)
    throw StoreError(uri_prefix + ": only s3:// and gs:// can be listed (an http(s) server has no listing); name the objects one by one", 0, "",
                     false);
  RemoteLocation bucket = *at;
  bucket.key.clear();
  const Target target = target_of(bucket);
  std::vector<ListedObject> objects;
  std::set<std::string> tokens_seen;  // a store that hands out a token twice would be listed for ever
  std::string token;
  for (std::size_t pages = 1;; ++pages) {
    std::vector<std::pair<std::string, std::string>> query = {{"list-type", "2"}, {"prefix", at->key}};
    if (!token.empty()) query.emplace_back("continuation-token", token);
    auto page = with_retries(uri_prefix, retry, counters, cancel_flag(counters), [&] { return list_page(uri_prefix, target, query, counters); });
    objects.insert(objects.end(), std::make_move_iterator(page->objects.begin()), std::make_move_iterator(page->objects.end()));
    if (!page->truncated) break;
    if (page->next_token.empty())
      throw StoreError(uri_prefix + ": the store's listing page " + std::to_string(pages) +
                           " says it is truncated but gives no NextContinuationToken to go on from; the store does not list as S3 does",
                       200, "", false);
    if (!tokens_seen.insert(page->next_token).second)
      throw StoreError(uri_prefix + ": the store's listing gave page " + std::to_string(pages) +
                           " a continuation token it had already given: listing on would never end (" + std::to_string(objects.size()) +
                           " objects listed, some of them more than once); the store does not list as S3 does",
                       200, "", false);
    token = page->next_token;
  }
  std::sort(objects.begin(), objects.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return objects;
}

// One page of a listing, parsed as it arrives; an error answer's text is kept for its message.
std::unique_ptr<ListingPage> ObjectStore::list_page(const std::string& uri_prefix, const Target& target,
                                                    const std::vector<std::pair<std::string, std::string>>& query, RequestCounters* counters) {
  HttpRequest request;
  request.cancelled = cancel_flag(counters);
  request.url = target.url;
  const std::string signed_request = sign(request, target, query, kEmptySha256);
  auto page = std::make_unique<ListingPage>();
  std::string error_text;
  bool failed = false, not_xml = false;
  const auto noted = latency_noter(counters);
  const auto answer = http_.perform(
      request,
      [&](const char* data, std::size_t size) {
        if (failed) {
          if (error_text.size() < (1 << 20)) error_text.append(data, size);
          return true;
        }
        if (counters) counters->bytes.fetch_add(size, std::memory_order_relaxed);
        not_xml = !page->feed(data, size);
        return !not_xml;
      },
      [&](const HttpResponse& headers) {
        failed = headers.status >= 300;
        return noted ? noted(headers) : true;
      });
  if (answer.status >= 300) throw error_of_answer(uri_prefix, answer.status, error_text, target.settings->credentials_from, signed_request);
  if (not_xml || !page->finish())
    throw StoreError(uri_prefix + ": the store's listing is not a ListBucketResult document (" + page->error() + ")", 200, "", false);
  return page;
}

}  // namespace sluice::remote

namespace sluice::remote {
namespace {

// The local file an upload sends, read part by part with pread (several parts at once).
class LocalFile {
 public:
  explicit LocalFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) throw StoreError("cannot read " + path + ": " + std::strerror(errno), 0, "", false);
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~LocalFile() { ::close(fd_); }
  std::uint64_t size() const { return size_; }
  std::string read(std::uint64_t offset, std::size_t length) const {
    std::string data(length, '\0');
    for (std::size_t got = 0; got < length;) {
      const ssize_t n = ::pread(fd_, data.data() + got, length - got, static_cast<off_t>(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw StoreError("cannot read " + path_ + ": " + (n == 0 ? std::string("it shrank") : std::strerror(errno)), 0, "", false);
      got += static_cast<std::size_t>(n);
    }
    return data;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

void ObjectStore::upload(const std::string& local_path, const std::string& uri, std::size_t part_bytes, int parallel, const RetryPolicy& retry,
                         RequestCounters* counters) {
  const auto at = parse_remote_uri(uri);
  if (!at || at->scheme == RemoteLocation::Scheme::Http || at->scheme == RemoteLocation::Scheme::Https || at->key.empty())
    throw StoreError(uri + ": outputs go to s3:// or gs:// objects (BUCKET/KEY)", 0, "", false);
  const Target target = target_of(*at);
  const std::string& credentials_from = target.settings->credentials_from;
  const LocalFile file(local_path);

  // One request with a body; the answer's body (for errors and the XML of multipart calls).
  auto send = [&](const std::string& method, const std::vector<std::pair<std::string, std::string>>& query, const std::string& body,
                  Headers extra, HttpResponse* answer_out) {
    return with_retries(uri, retry, counters, nullptr, [&] {  // not cancelled: see RequestCounters::cancelled
      HttpRequest request;
      request.method = method;
      request.url = target.url;
      request.body = body;
      request.headers = extra;
      const std::string signed_request = sign(request, target, query, sha256_hex(body));
      std::string text;
      const auto answer = http_.perform(
          request,
          [&](const char* data, std::size_t size) {
            if (text.size() < (1 << 20)) text.append(data, size);
            return true;
          },
          latency_noter(counters));
      // S3 may answer a CompleteMultipartUpload 200 and put an error in the body.
      const bool error_in_body = answer.status == 200 && text.find("<Error>") != std::string::npos;
      if (answer.status >= 300 || error_in_body) throw error_of_answer(uri, error_in_body ? 500 : answer.status, text, credentials_from, signed_request);
      if (counters) counters->bytes.fetch_add(body.size(), std::memory_order_relaxed);
      if (answer_out) *answer_out = answer;
      return text;
    });
  };

  if (file.size() <= part_bytes) {
    send("PUT", {}, file.read(0, static_cast<std::size_t>(file.size())), {}, nullptr);
    return;
  }
  const std::uint64_t part_size = std::max<std::uint64_t>(part_bytes, (file.size() + 9999) / 10000);
  const auto parts = static_cast<std::size_t>((file.size() + part_size - 1) / part_size);
  tinyxml2::XMLDocument started;
  const std::string start_text = send("POST", {{"uploads", ""}}, "", {{"Content-Type", "application/octet-stream"}}, nullptr);
  started.Parse(start_text.data(), start_text.size());
  const std::string upload_id = xml_text(started.FirstChildElement("InitiateMultipartUploadResult"), "UploadId");
  if (upload_id.empty()) throw StoreError(uri + ": the store's answer to starting a multipart upload holds no UploadId", 200, "", false);
  auto abort = [&] {
    try {
      send("DELETE", {{"uploadId", upload_id}}, "", {}, nullptr);
    } catch (...) {  // the upload's first failure is what the user needs to read
    }
  };
  std::vector<std::string> etags(parts);
  std::atomic<std::size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  auto upload_parts = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < parts;) {
      {
        std::lock_guard lock(failure_mutex);
        if (failure) return;
      }
      try {
        const std::uint64_t offset = i * part_size;
        const std::string body = file.read(offset, static_cast<std::size_t>(std::min<std::uint64_t>(part_size, file.size() - offset)));
        HttpResponse answer;
        send("PUT", {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}}, body, {}, &answer);
        etags[i] = answer.header("etag");
        if (etags[i].empty()) throw StoreError(uri + ": the store gave part " + std::to_string(i + 1) + " no ETag", 200, "", false);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> senders;
  for (int t = 1; t < std::min<int>(parallel, static_cast<int>(parts)); ++t) senders.emplace_back(upload_parts);
  upload_parts();
  for (auto& t : senders) t.join();
  if (failure) {
    abort();
    std::rethrow_exception(failure);
  }
  std::string complete = "<CompleteMultipartUpload>";
  for (std::size_t i = 0; i < parts; ++i)
    complete += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + xml_escape(etags[i]) + "</ETag></Part>";
  complete += "</CompleteMultipartUpload>";
  try {
    send("POST", {{"uploadId", upload_id}}, complete, {{"Content-Type", "application/xml"}}, nullptr);
  } catch (...) {
    abort();
    throw;
  }
}

}  // namespace sluice::remote
