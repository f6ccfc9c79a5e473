#pragma once
// Between the metrics endpoint's state (metrics_server.cpp, in every program that serves metrics)
// and its HTTP server (metrics_http.cpp, built as libsluice_http.so and loaded only when a run
// serves metrics): cpp-httplib brings OpenSSL, zlib and Brotli, whose loading was a third of
// what starting `sluice run` cost. Nothing here names a protobuf type, so the module holds no
// copy of the generated messages the host registers.
#include <cstdint>
#include <string>

namespace sluice::http {

// What the endpoint serves, answered by the host. Thread-safe.
class MetricsContent {
 public:
  virtual ~MetricsContent() = default;
  virtual std::string prometheus() = 0;
  virtual std::string snapshot(bool json) = 0;
  virtual std::string pipeline() = 0;  // empty when the run published none
  // /stream: a place for one more reader, or false when there are too many (`refusal` says so).
  virtual bool enter_stream(std::string& refusal) = 0;
  virtual void leave_stream() = 0;
  // Waits up to a second for a snapshot newer than `seen`: its JSON in `json` (and `seen`
  // updated), or `json` empty when none came; false once the endpoint is stopping and the last
  // snapshot went out.
  virtual bool next_stream_event(std::uint64_t& seen, std::string& json) = 0;
};

// A bound, listening server; destroying it stops serving and joins its threads.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual int port() const = 0;
};

using StartEndpoint = Endpoint* (*)(const char* host, int port, MetricsContent* content, std::string* error);
inline constexpr const char* kStartEndpointSymbol = "sluice_http_start_endpoint";
inline constexpr const char* kModuleName = "libsluice_http.so";

}  // namespace sluice::http
