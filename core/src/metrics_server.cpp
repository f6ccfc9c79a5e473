#include "sluice/core/metrics_server.hpp"

#include <httplib.h>

#include <condition_variable>
#include <algorithm>
#include <mutex>
#include <atomic>
#include <deque>
#include <system_error>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "sluice/core/metrics_log.hpp"
#include "sluice/error.hpp"

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
  bool feeds = false;
  for (const auto& m : s.stage()) feeds = feeds || m.devices_size() > 0;
  if (feeds) {
    using D = metrics::DeviceMetrics;
    add_device_family(out, s, "sluice_device_bytes_total", "counter", "Bytes a feed sink has copied to a device.", [](const D& d) { return d.bytes(); });
    add_device_family(out, s, "sluice_device_slices_total", "counter", "Slices a feed sink has handed to a device.", [](const D& d) { return d.slices(); });
    add_device_family(out, s, "sluice_device_bytes_per_second", "gauge", "Bytes copied to a device per second since the previous snapshot.",
                      [](const D& d) { return d.recent_bytes_per_s(); });
    add_device_family(out, s, "sluice_device_ring_level", "gauge", "Slots of a device's ring holding a slice not yet released.",
                      [](const D& d) { return d.ring_level(); });
    add_device_family(out, s, "sluice_device_ring_capacity", "gauge", "Slots of a device's ring.", [](const D& d) { return d.ring_capacity(); });
  }
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

// A thread per connection (up to kMaxThreads, then connections wait for one): with httplib's
// fixed pool of 8, eight idle or slow clients, or eight /stream readers, left Prometheus without
// an answer. Threads hold the shared state, not the queue, so they may finish after it is gone.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  static constexpr int kMaxThreads = 256;

  void enqueue(std::function<void()> task) override {
    {
      std::lock_guard lock(state_->mutex);
      if (state_->active >= kMaxThreads) {
        state_->waiting.push_back(std::move(task));
        return;
      }
      ++state_->active;
    }
    try {
      std::thread(run, state_, std::move(task)).detach();
    } catch (const std::system_error&) {  // no thread to be had: serve it on the accepting thread
      {
        std::lock_guard lock(state_->mutex);
        --state_->active;
      }
      task();
    }
  }
  void shutdown() override {
    std::unique_lock lock(state_->mutex);
    state_->idle.wait(lock, [&] { return state_->active == 0; });
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable idle;
    int active = 0;
    std::deque<std::function<void()>> waiting;
  };
  static void run(std::shared_ptr<State> state, std::function<void()> task) {
    for (;;) {
      task();
      std::lock_guard lock(state->mutex);
      if (state->waiting.empty()) {
        --state->active;
        state->idle.notify_all();
        return;
      }
      task = std::move(state->waiting.front());
      state->waiting.pop_front();
    }
  }
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Readers of /stream hold their connection for the whole run; beyond this many, they are told to
// come back later, and the rest of the endpoint stays free for scrapes.
constexpr int kMaxStreamClients = 16;

}  // namespace

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::string host;
  int port = 0;
  std::mutex mutex;
  std::condition_variable published;
  metrics::MetricsSnapshot latest;
  std::uint64_t version = 0;  // bumped by every publish
  bool stopping = false;
  std::atomic<int> stream_clients{0};
  std::string pipeline_text;  // under mutex

  std::pair<metrics::MetricsSnapshot, std::uint64_t> current() {
    std::lock_guard lock(mutex);
    return {latest, version};
  }
};

MetricsServer::MetricsServer(const MetricsAddress& address) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.host = address.host;
  auto& server = I.server;
  // Slow or silent clients give up their thread after a few seconds; request bodies are refused.
  server.new_task_queue = [] { return new ConnectionThreads; };
  server.set_read_timeout(3, 0);
  server.set_write_timeout(3, 0);
  server.set_keep_alive_timeout(3);
  server.set_payload_max_length(1024);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second run on the same
  // port would bind too and the two would share its connections.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof yes);
  });

  server.Get("/metrics", [&I](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(I.current().first), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/snapshot", [&I](const httplib::Request& req, httplib::Response& res) {
    auto snapshot = I.current().first;
    if (req.get_param_value("format") == "json") res.set_content(snapshot_to_json(snapshot), "application/json");
    else res.set_content(snapshot.SerializeAsString(), "application/x-protobuf");
  });
  server.Get("/stream", [&I](const httplib::Request&, httplib::Response& res) {
    if (I.stream_clients.fetch_add(1) >= kMaxStreamClients) {
      I.stream_clients.fetch_sub(1);
      res.status = 503;
      res.set_content(fmt::format("too many /stream clients ({}); try again later, or poll /snapshot\n", kMaxStreamClients),
                      "text/plain");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [&I, seen = std::uint64_t(0)](std::size_t, httplib::DataSink& sink) mutable {
      std::string event;
      {
        std::unique_lock lock(I.mutex);
        I.published.wait_for(lock, std::chrono::seconds(1), [&] { return I.stopping || I.version != seen; });
        // The last snapshot (finished, stopped or failed) goes out before the stream closes, so a
        // viewer can tell how the run ended from a connection that was lost.
        if (I.version != seen) {
          seen = I.version;
          event = "data: " + snapshot_to_json(I.latest) + "\n\n";
        } else if (I.stopping) {
          return false;
        }
      }
      if (event.empty()) event = ": waiting for the next snapshot\n\n";  // keeps proxies and dead peers in check
      return sink.write(event.data(), event.size());
    }, [&I](bool) {
      {
        std::lock_guard lock(I.mutex);
        I.stream_clients.fetch_sub(1);
      }
      I.published.notify_all();
    });
  });
  server.Get("/pipeline", [&I](const httplib::Request&, httplib::Response& res) {
    std::string text;
    {
      std::lock_guard lock(I.mutex);
      text = I.pipeline_text;
    }
    if (text.empty()) {
      res.status = 404;
      res.set_content("this run did not publish its pipeline\n", "text/plain");
      return;
    }
    res.set_content(text, "text/plain; charset=utf-8");
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "Sluice metrics: /metrics (Prometheus), /snapshot (protobuf; ?format=json), /stream (server-sent events), "
        "/pipeline (the pipeline as run)\n",
        "text/plain");
  });

  if (address.port == 0) {
    I.port = server.bind_to_any_port(address.host);
  } else {
    I.port = server.bind_to_port(address.host, address.port) ? address.port : -1;
  }
  if (I.port < 0)
    throw Error(fmt::format("cannot serve metrics on {}:{} (in use, or not an address of this machine); choose another "
                            "port with --metrics-addr, or 0 for any free one",
                            address.host, address.port));
  I.thread = std::thread([&I] { I.server.listen_after_bind(); });
  // stop() does nothing to a server not yet listening: wait until it is, so that the destructor
  // can always end it.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
    impl_->published.wait_for(lock, std::chrono::seconds(1), [&] { return impl_->stream_clients.load() == 0; });
  }
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void MetricsServer::set_pipeline(const std::string& text) {
  std::lock_guard lock(impl_->mutex);
  impl_->pipeline_text = text;
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
