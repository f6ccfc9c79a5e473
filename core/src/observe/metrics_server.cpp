#include "sluice/core/metrics_server.hpp"


#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>


#include <fmt/format.h>

#include "sluice/core/metrics_log.hpp"
#include "modules/host_module.hpp"
#include "modules/http/metrics_http.hpp"
#include "sluice/error.hpp"

namespace fs = std::filesystem;

namespace sluice {

MetricsAddress parse_metrics_address(const std::string& text) {
  MetricsAddress address;
  std::string port = text;
  const auto colon = text.rfind(':');
  if (colon != std::string::npos) {
    std::string host = text.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (!host.empty()) address.host = host;
    port = text.substr(colon + 1);
  }
  try {
    std::size_t used = 0;
    address.port = std::stoi(port, &used);
    if (used != port.size() || address.port < 0 || address.port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    throw Error("metrics address '" + text + "' is not PORT, :PORT or HOST:PORT (for instance 127.0.0.1:9464; port 0 picks a free one)");
  }
  return address;
}

namespace {

std::string label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

template <class Get>
void add_family(std::string& out, const metrics::MetricsSnapshot& snapshot, const char* name, const char* type, const char* help,
                Get get) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  for (const auto& m : snapshot.stage())
    out += fmt::format("{}{{stage=\"{}\",op=\"{}\"}} {}\n", name, label_value(m.id()), label_value(m.op()), get(m));
}

// A series per item of a stage's nested list (a feed sink's devices, a stage's readers), labelled
// by stage and the item's own label; a family with no items prints no samples.
template <class Items, class Label, class Get>
void add_nested_family(std::string& out, const metrics::MetricsSnapshot& snapshot, const char* name, const char* type,
                       const char* help, const char* label, Items items, Label label_of, Get get) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  for (const auto& m : snapshot.stage())
    for (const auto& item : items(m))
      out += fmt::format("{}{{stage=\"{}\",{}=\"{}\"}} {}\n", name, label_value(m.id()), label, label_value(label_of(item)), get(item));
}

// Feed sinks' devices, labelled by stage and device.
template <class Get>
void add_device_family(std::string& out, const metrics::MetricsSnapshot& snapshot, const char* name, const char* type,
                       const char* help, Get get) {
  add_nested_family(out, snapshot, name, type, help, "device", [](const metrics::StageMetrics& m) -> const auto& { return m.devices(); },
                    [](const metrics::DeviceMetrics& d) -> const std::string& { return d.name(); }, get);
}

// One sample per edge: a stage's output buffer as each of its readers sees it (several: a tee).
template <class Get>
void add_edge_family(std::string& out, const metrics::MetricsSnapshot& snapshot, const char* name, const char* type,
                     const char* help, Get get) {
  add_nested_family(out, snapshot, name, type, help, "reader", [](const metrics::StageMetrics& m) -> const auto& { return m.readers(); },
                    [](const metrics::ReaderBuffer& r) -> const std::string& { return r.reader(); }, get);
}

// (lineage) The delivery ledger's verdict on each epoch: records delivered, expected, twice,
// missing, skipped as asked (a gauge per epoch; an alert on twice or missing > 0).
void add_ledger_families(std::string& out, const metrics::MetricsSnapshot& s) {
  if (s.ledger_size() == 0) return;
  using L = metrics::LedgerVerdict;
  const std::pair<const char*, std::function<std::uint64_t(const L&)>> families[] = {
      {"records", [](const L& l) { return l.records(); }},
      {"expected", [](const L& l) { return l.expected(); }},
      {"twice", [](const L& l) { return l.twice(); }},
      {"missing", [](const L& l) { return l.missing(); }},
      {"skipped_as_asked", [](const L& l) { return l.skipped_as_asked(); }}};
  for (const auto& [name, value] : families) {
    out += fmt::format("# HELP sluice_ledger_{0} The delivery ledger, per epoch: records {1}.\n# TYPE sluice_ledger_{0} gauge\n", name,
                       std::string(name) == "records" ? "delivered" : std::string(name) == "skipped_as_asked" ? "skipped as asked" : name);
    for (const auto& l : s.ledger()) {
      if (std::string(name) == "expected" && !l.has_expected()) continue;
      out += fmt::format("sluice_ledger_{}{{epoch=\"{}\",under_way=\"{}\"}} {}\n", name, l.epoch(), l.under_way() ? "true" : "false", value(l));
    }
  }
}

}  // namespace

std::string prometheus_text(const metrics::MetricsSnapshot& s) {
  using M = metrics::StageMetrics;
  std::string out;
  add_family(out, s, "sluice_stage_elements_in_total", "counter", "Elements a stage has taken in.", [](const M& m) { return m.elements_in(); });
  add_family(out, s, "sluice_stage_elements_out_total", "counter", "Elements a stage has emitted.", [](const M& m) { return m.elements_out(); });
  add_family(out, s, "sluice_stage_bytes_in_total", "counter", "Bytes of the elements a stage has taken in.", [](const M& m) { return m.bytes_in(); });
  add_family(out, s, "sluice_stage_bytes_out_total", "counter", "Bytes of the elements a stage has emitted.", [](const M& m) { return m.bytes_out(); });
  add_family(out, s, "sluice_stage_skipped_total", "counter", "Elements a stage skipped under the skip policy.",
             [](const M& m) { return m.errors_skipped(); });
  add_family(out, s, "sluice_stage_elements_per_second", "gauge", "Elements emitted per second since the previous snapshot.",
             [](const M& m) { return m.recent_elements_per_s(); });
  add_family(out, s, "sluice_stage_busy_ratio", "gauge", "Share of its workers' time a stage spent working.",
             [](const M& m) { return m.busy_fraction(); });
  add_family(out, s, "sluice_stage_starved_ratio", "gauge", "Share of its workers' time a stage waited for input.",
             [](const M& m) { return m.starved_fraction(); });
  add_family(out, s, "sluice_stage_blocked_ratio", "gauge", "Share of its workers' time a stage waited for room downstream.",
             [](const M& m) { return m.blocked_fraction(); });
  add_family(out, s, "sluice_stage_buffer_level", "gauge", "Elements in a stage's output buffer now.", [](const M& m) { return m.buffer_level(); });
  add_family(out, s, "sluice_stage_buffer_capacity", "gauge", "Capacity of a stage's output buffer (0: fused, no buffer).",
             [](const M& m) { return m.buffer_capacity(); });
  add_family(out, s, "sluice_stage_buffer_bytes", "gauge", "Bytes of the elements in a stage's output buffer now.",
             [](const M& m) { return m.buffer_bytes(); });
  add_family(out, s, "sluice_stage_buffer_byte_limit", "gauge", "Bytes at which a stage's output buffer is full (0: counted in elements only).",
             [](const M& m) { return m.buffer_byte_limit(); });
  add_family(out, s, "sluice_stage_buffer_fill_ratio", "gauge", "Time-weighted mean fill of a stage's output buffer.",
             [](const M& m) { return m.mean_buffer_fill(); });
  using R = metrics::ReaderBuffer;
  add_edge_family(out, s, "sluice_edge_buffer_level", "gauge", "Elements in the buffer between a stage and one of its readers now.",
                  [](const R& r) { return r.level(); });
  add_edge_family(out, s, "sluice_edge_buffer_fill_ratio", "gauge",
                  "Time-weighted mean fill of the buffer between a stage and one of its readers.", [](const R& r) { return r.mean_fill(); });
  add_family(out, s, "sluice_stage_workers", "gauge", "Workers of a stage now (with parallelism -1: what the autotuner gives it).",
             [](const M& m) { return m.workers(); });
  add_family(out, s, "sluice_stage_epoch", "gauge", "Iterations of its input a stage has completed.", [](const M& m) { return m.epoch(); });
  bool remote = false;
  for (const auto& m : s.stage()) remote = remote || m.has_remote();
  if (remote) {
    add_family(out, s, "sluice_stage_remote_requests_total", "counter", "Requests to remote storage a stage made, retries included.",
               [](const M& m) { return m.remote().requests(); });
    add_family(out, s, "sluice_stage_remote_bytes_total", "counter", "Bytes of remote objects a stage received.",
               [](const M& m) { return m.remote().bytes(); });
    add_family(out, s, "sluice_stage_remote_retries_total", "counter", "Remote requests a stage retried.",
               [](const M& m) { return m.remote().retries(); });
    add_family(out, s, "sluice_stage_remote_throttles_total", "counter", "Remote answers that throttled a stage (503, 429, SlowDown).",
               [](const M& m) { return m.remote().throttles(); });
    add_family(out, s, "sluice_stage_remote_latency_p50_seconds", "gauge", "Median time to the first byte of a stage's remote answers.",
               [](const M& m) { return m.remote().latency_p50_ms() / 1000.0; });
    add_family(out, s, "sluice_stage_remote_latency_p99_seconds", "gauge", "99th percentile of the time to the first byte of a stage's remote answers.",
               [](const M& m) { return m.remote().latency_p99_ms() / 1000.0; });
  }
  bool feeds = false;
  for (const auto& m : s.stage()) feeds = feeds || m.devices_size() > 0;
  if (feeds) {
    using D = metrics::DeviceMetrics;
    add_device_family(out, s, "sluice_device_bytes_total", "counter", "Bytes a feed sink has copied to a device.", [](const D& d) { return d.bytes(); });
    add_device_family(out, s, "sluice_device_slices_total", "counter", "Slices a feed sink has handed to a device.", [](const D& d) { return d.slices(); });
    add_device_family(out, s, "sluice_device_bytes_per_second", "gauge", "Bytes copied to a device per second since the previous snapshot.",
                      [](const D& d) { return d.recent_bytes_per_s(); });
    add_device_family(out, s, "sluice_device_copy_seconds_total", "counter",
                      "Device time a feed's finished copies to a device took (CUDA events; 0 where the feed does not time them).",
                      [](const D& d) { return d.copy_seconds(); });
    add_device_family(out, s, "sluice_device_ring_level", "gauge", "Slots of a device's ring holding a slice not yet released.",
                      [](const D& d) { return d.ring_level(); });
    add_device_family(out, s, "sluice_device_ring_capacity", "gauge", "Slots of a device's ring.", [](const D& d) { return d.ring_capacity(); });
  }
  add_ledger_families(out, s);
  out += fmt::format("# HELP sluice_run_elapsed_seconds Time since the run started.\n# TYPE sluice_run_elapsed_seconds gauge\n"
                     "sluice_run_elapsed_seconds {}\n",
                     s.elapsed_s());
  out += fmt::format("# HELP sluice_run_info The run's state and bottleneck stage.\n# TYPE sluice_run_info gauge\n"
                     "sluice_run_info{{state=\"{}\",bottleneck=\"{}\"}} 1\n",
                     label_value(s.state()), label_value(s.bottleneck()));
  out += fmt::format("# HELP sluice_worker_info Which of the job's workers this process is, and who said so.\n"
                     "# TYPE sluice_worker_info gauge\n"
                     "sluice_worker_info{{index=\"{}\",count=\"{}\",source=\"{}\"}} 1\n",
                     s.worker().index(), std::max(1, s.worker().count()), label_value(s.worker().source()));
  return out;
}

namespace {

// Readers of /stream hold their connection for the whole run; beyond this many, they are told to
// come back later, and the rest of the endpoint stays free for scrapes.
constexpr int kMaxStreamClients = 16;

http::StartEndpoint load_http_module() {
  static http::StartEndpoint start =
      reinterpret_cast<http::StartEndpoint>(host_module_symbol(http::kModuleName, http::kStartEndpointSymbol, "cannot serve metrics"));
  return start;
}

}  // namespace

struct MetricsServer::Impl final : http::MetricsContent {
  std::string host;
  int port = 0;
  std::mutex mutex;
  std::condition_variable published;
  metrics::MetricsSnapshot latest;
  std::uint64_t version = 0;  // bumped by every publish
  bool stopping = false;
  int stream_clients = 0;
  std::string pipeline_text;
  std::function<std::string()> more_series;
  std::unique_ptr<http::Endpoint> endpoint;  // last member: stopped first

  metrics::MetricsSnapshot current() {
    std::lock_guard lock(mutex);
    return latest;
  }
  std::string prometheus() override {
    std::function<std::string()> more;
    bool published_any = false;
    {
      std::lock_guard lock(mutex);
      more = more_series;
      published_any = version > 0;
    }
    return (published_any || !more ? prometheus_text(current()) : std::string()) + (more ? more() : std::string());
  }
  std::string snapshot(bool json) override {
    const auto now = current();
    return json ? snapshot_to_json(now) : now.SerializeAsString();
  }
  std::string pipeline() override {
    std::lock_guard lock(mutex);
    return pipeline_text;
  }
  bool enter_stream(std::string& refusal) override {
    std::lock_guard lock(mutex);
    if (stream_clients >= kMaxStreamClients) {
      refusal = fmt::format("too many /stream clients ({}); try again later, or poll /snapshot\n", kMaxStreamClients);
      return false;
    }
    ++stream_clients;
    return true;
  }
  void leave_stream() override {
    {
      std::lock_guard lock(mutex);
      --stream_clients;
    }
    published.notify_all();
  }
  bool next_stream_event(std::uint64_t& seen, std::string& json) override {
    std::unique_lock lock(mutex);
    published.wait_for(lock, std::chrono::seconds(1), [&] { return stopping || version != seen; });
    if (version != seen) {
      seen = version;
      json = snapshot_to_json(latest);
      return true;
    }
    return !stopping;
  }
};

MetricsServer::MetricsServer(const MetricsAddress& address) : impl_(std::make_unique<Impl>()) {
  impl_->host = address.host;
  std::string error;
  impl_->endpoint.reset(load_http_module()(address.host.c_str(), address.port, impl_.get(), &error));
  if (!impl_->endpoint)
    throw Error(fmt::format("cannot serve metrics on {}:{} ({}); choose another port with --metrics-addr, or 0 for any free one",
                            address.host, address.port, error.empty() ? "in use, or not an address of this machine" : error));
  impl_->port = impl_->endpoint->port();
}

MetricsServer::~MetricsServer() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->published.notify_all();
  {
    // Each /stream reader sends the last snapshot, then ends; a reader that cannot (a peer gone
    // quiet) is not waited for long.
    std::unique_lock lock(impl_->mutex);
    impl_->published.wait_for(lock, std::chrono::seconds(1), [&] { return impl_->stream_clients == 0; });
  }
  impl_->endpoint.reset();
}

void MetricsServer::set_pipeline(const std::string& text) {
  std::lock_guard lock(impl_->mutex);
  impl_->pipeline_text = text;
}

void MetricsServer::add_prometheus(std::function<std::string()> series) {
  std::lock_guard lock(impl_->mutex);
  impl_->more_series = std::move(series);
}

void MetricsServer::publish(const metrics::MetricsSnapshot& snapshot) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->latest = snapshot;
    ++impl_->version;
  }
  impl_->published.notify_all();
}

const std::string& MetricsServer::host() const { return impl_->host; }
int MetricsServer::port() const { return impl_->port; }
std::string MetricsServer::url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}", v6 ? "[" : "", impl_->host, v6 ? "]" : "", impl_->port);
}

}  // namespace sluice
