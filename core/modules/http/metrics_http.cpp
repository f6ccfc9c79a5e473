// The metrics endpoint's HTTP server (libsluice_http.so): cpp-httplib serving what the host's
// MetricsContent answers. Loaded by metrics_server.cpp only when a run serves metrics.
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "metrics_http.hpp"

namespace sluice::http {
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

class HttpEndpoint final : public Endpoint {
 public:
  explicit HttpEndpoint(MetricsContent& content) : content_(content) {}

  // Binds (false when it cannot) and serves on its own thread.
  bool start(const std::string& host, int port) {
    configure();
    route();
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ < 0) return false;
    widen_accept_queue();
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() does nothing to a server not yet listening: wait until it is, so that the destructor
    // can always end it.
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  }

  ~HttpEndpoint() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port() const override { return port_; }

 private:
  void configure() {
    // Slow or silent clients give up their thread after a few seconds; request bodies are refused.
    server_.new_task_queue = [] { return new ConnectionThreads; };
    server_.set_read_timeout(3, 0);
    server_.set_write_timeout(3, 0);
    server_.set_keep_alive_timeout(3);
    server_.set_payload_max_length(1024);
    // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second run on the same
    // port would bind too and the two would share its connections.
    server_.set_socket_options([this](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const char*>(&yes), sizeof yes);
      listening_socket_ = sock;
    });
  }

  // Debian's httplib is compiled with an accept queue of 5. The kernel drops a connection attempt
  // while the queue is full and the client tries again only a second later: a scrape arriving
  // with a burst of clients waited seconds. listen() again on the bound socket sets a longer one.
  void widen_accept_queue() {
    if (listening_socket_ >= 0) ::listen(listening_socket_, 512);
  }

  void route() {
    MetricsContent& content = content_;
    server_.Get("/metrics", [&content](const httplib::Request&, httplib::Response& res) {
      res.set_content(content.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/snapshot", [&content](const httplib::Request& req, httplib::Response& res) {
      if (req.get_param_value("format") == "json") res.set_content(content.snapshot(true), "application/json");
      else res.set_content(content.snapshot(false), "application/x-protobuf");
    });
    server_.Get("/stream", [&content](const httplib::Request&, httplib::Response& res) {
      std::string refusal;
      if (!content.enter_stream(refusal)) {
        res.status = 503;
        res.set_content(refusal, "text/plain");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [&content, seen = std::uint64_t(0)](std::size_t, httplib::DataSink& sink) mutable {
            std::string json;
            // The last snapshot (finished, stopped or failed) goes out before the stream closes,
            // so a viewer can tell how the run ended from a connection that was lost.
            if (!content.next_stream_event(seen, json)) return false;
            // A comment when nothing came keeps proxies and dead peers in check.
            const std::string event = json.empty() ? ": waiting for the next snapshot\n\n" : "data: " + json + "\n\n";
            return sink.write(event.data(), event.size());
          },
          [&content](bool) { content.leave_stream(); });
    });
    server_.Get("/pipeline", [&content](const httplib::Request&, httplib::Response& res) {
      const std::string text = content.pipeline();
      if (text.empty()) {
        res.status = 404;
        res.set_content("this run did not publish its pipeline\n", "text/plain");
        return;
      }
      res.set_content(text, "text/plain; charset=utf-8");
    });
    server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(
          "Sluice metrics: /metrics (Prometheus), /snapshot (protobuf; ?format=json), /stream (server-sent events), "
          "/pipeline (the pipeline as run)\n",
          "text/plain");
    });
  }

  MetricsContent& content_;
  httplib::Server server_;
  std::thread thread_;
  int listening_socket_ = -1;
  int port_ = -1;
};

}  // namespace
}  // namespace sluice::http

extern "C" __attribute__((visibility("default"))) sluice::http::Endpoint* sluice_http_start_endpoint(
    const char* host, int port, sluice::http::MetricsContent* content, std::string* error) {
  try {
    auto endpoint = std::make_unique<sluice::http::HttpEndpoint>(*content);
    if (!endpoint->start(host, port)) return nullptr;
    return endpoint.release();
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
