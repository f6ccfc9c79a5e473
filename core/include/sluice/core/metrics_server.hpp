#pragma once
// The metrics endpoint of a headless run (`sluice run --metrics-addr`), over HTTP:
//   /metrics   Prometheus text exposition, one series per stage and counter;
//   /snapshot  the latest snapshot as protobuf (application/x-protobuf), or ?format=json;
//   /stream    every snapshot as it is published, as server-sent events (one JSON object each);
//              the desktop app attaches to a run with it;
//   /pipeline  the pipeline as it runs (text format, --set overrides applied), so that an attached
//              app shows the run's own parameter values.
// The engine only hands snapshots over (publish copies one under a lock); requests are served on
// the server's own threads, with timeouts, so that slow or malformed clients never reach the run.
#include <functional>
#include <memory>
#include <string>

#include "metrics.pb.h"

namespace sluice {

struct MetricsAddress {
  std::string host = "127.0.0.1";
  int port = 9464;
};
// "PORT", ":PORT" (loopback), "HOST:PORT" or "[V6HOST]:PORT"; port 0 picks a free one. Throws
// Error with the expected forms.
MetricsAddress parse_metrics_address(const std::string& text);

// Prometheus text exposition of a snapshot (sluice_stage_* series labelled by stage and op).
std::string prometheus_text(const metrics::MetricsSnapshot& snapshot);

class MetricsServer {
 public:
  // Binds at once (throws Error naming the address when it cannot) and serves on its threads.
  explicit MetricsServer(const MetricsAddress& address);
  ~MetricsServer();  // stops serving and joins; open streams end
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The latest snapshot: answers /metrics and /snapshot, and goes to every /stream client.
  void publish(const metrics::MetricsSnapshot& snapshot);
  // The text /pipeline answers with (404 until set).
  void set_pipeline(const std::string& text);
  // More series for /metrics, asked for at each request (a process that is not a run, such as the
  // service's dispatcher and workers, serves only these). Thread-safe; set before serving matters.
  void add_prometheus(std::function<std::string()> series);

  const std::string& host() const;
  int port() const;  // the one bound (useful with port 0)
  std::string url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
