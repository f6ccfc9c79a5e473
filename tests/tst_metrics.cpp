// The metrics endpoint of headless runs as monitoring tools and the desktop app use it.
#include <QtTest>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include "pipeline_runner.hpp"
#include "sluice/core/metrics_log.hpp"
#include "sluice/core/metrics_server.hpp"

using namespace sluice::test;

namespace {
// An endless pipeline publishing snapshots to a server; stopped when the object goes.
struct ServedRun {
  std::unique_ptr<sluice::MetricsServer> server;
  std::unique_ptr<sluice::Engine> engine;
  explicit ServedRun(const std::string& text, std::chrono::milliseconds interval = std::chrono::milliseconds(100)) {
    server = std::make_unique<sluice::MetricsServer>(sluice::parse_metrics_address("127.0.0.1:0"));
    sluice::EngineOptions options;
    options.snapshot_interval = interval;
    engine = std::make_unique<sluice::Engine>(graph_of(text), options);
    engine->subscribe([s = server.get()](const sluice::metrics::MetricsSnapshot& snap) { s->publish(snap); });
    engine->start();
  }
  ~ServedRun() {
    engine->stop();
    engine->wait();
  }
};

const std::string kEndless = stage("src", "range", "", {{"count", "1000000000"}}) +
                             stage("work", "simulate_work", "src", {{"us", "20"}}) + stage("out", "null_sink", "work");

// Series name{labels} -> value, checking every line against the text exposition format.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex help(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+)");
  static const std::regex type(R"(# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram|summary|untyped))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf))");
  std::map<std::string, double> series;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP", 0) == 0) {
      if (!std::regex_match(line, help)) qFatal("bad HELP line: %s", line.c_str());
    } else if (line.rfind("# TYPE", 0) == 0) {
      if (!std::regex_match(line, type)) qFatal("bad TYPE line: %s", line.c_str());
    } else {
      std::smatch m;
      if (!std::regex_match(line, m, sample)) qFatal("bad sample line: %s", line.c_str());
      auto key = line.substr(0, line.rfind(' '));
      if (series.count(key)) qFatal("series twice: %s", key.c_str());
      series[key] = std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return series;
}

httplib::Client client_of(const sluice::MetricsServer& server) {
  httplib::Client c(server.host(), server.port());
  c.set_read_timeout(5, 0);
  return c;
}

// An IPv4 address of this machine that is not loopback, if it has one.
std::string non_loopback_address() {
  ifaddrs* list = nullptr;
  std::string found;
  if (getifaddrs(&list) != 0) return found;
  for (auto* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET) {
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
      if (std::string(text).rfind("127.", 0) != 0) {
        found = text;
        break;
      }
    }
  freeifaddrs(list);
  return found;
}

int connect_to(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

class TestMetrics : public QObject {
  Q_OBJECT
 private slots:
  void prometheus_output_parses_with_one_series_per_stage_and_monotonic_counters() {
    ServedRun run(kEndless);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    auto client = client_of(*run.server);
    auto first = client.Get("/metrics");
    QVERIFY(first && first->status == 200);
    QVERIFY(first->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
    auto a = parse_prometheus(first->body);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    auto b = parse_prometheus(client.Get("/metrics")->body);
    std::set<std::string> stages_seen;
    int counters = 0;
    for (const auto& [key, value] : a) {
      if (key.find("_total{") == std::string::npos) continue;
      ++counters;
      QVERIFY2(b.count(key), key.c_str());
      QVERIFY2(b.at(key) >= value, key.c_str());  // counters never go down between scrapes
      stages_seen.insert(key.substr(key.find("stage=\"")));
    }
    QCOMPARE(counters, 3 * 5);  // 5 counter families, one series per stage
    QCOMPARE(stages_seen.size(), std::size_t(3));
    QVERIFY(b.at("sluice_stage_elements_out_total{stage=\"work\",op=\"simulate_work\"}") >
            a.at("sluice_stage_elements_out_total{stage=\"work\",op=\"simulate_work\"}"));
    // A buffer per edge, named by the stage and its reader; a sink has none.
    QVERIFY(a.count("sluice_edge_buffer_level{stage=\"src\",reader=\"work\"}"));
    QVERIFY(a.count("sluice_edge_buffer_fill_ratio{stage=\"work\",reader=\"out\"}"));
    for (const auto& [key, value] : a) QVERIFY2(key.find("reader=\"\"") == std::string::npos && key.find("stage=\"out\",reader") == std::string::npos, key.c_str());
  }

  // A stage handing on its output in bursts (a batch of 100 every 0.2 s; a reader's chunks) reads
  // as its steady rate, not as zero between bursts: recent rates are over the last 2 s.
  void recent_rates_of_a_bursty_stage_do_not_fall_to_zero_between_bursts() {
    sluice::EngineOptions options;
    options.snapshot_interval = std::chrono::milliseconds(50);
    sluice::Engine engine(graph_of(stage("src", "range", "", {{"count", "1000000000"}}) +
                                   stage("work", "simulate_work", "src", {{"us", "2000"}}) +
                                   stage("batch", "batch", "work", {{"batch_size", "100"}}) + stage("out", "null_sink", "batch")),
                          options);
    std::mutex mutex;
    std::vector<double> batch_rates;
    engine.subscribe([&](const sluice::metrics::MetricsSnapshot& snap) {
      for (const auto& st : snap.stage())
        if (st.id() == "batch" && st.elements_out() > 0 && snap.state() == "running") {
          std::lock_guard lock(mutex);
          batch_rates.push_back(st.recent_elements_per_s());
        }
    });
    engine.start();
    QTest::qWait(3000);
    engine.stop();
    engine.wait();
    std::lock_guard lock(mutex);
    QVERIFY2(batch_rates.size() >= 10, qPrintable(QString::number(batch_rates.size())));
    for (double rate : batch_rates) QVERIFY2(rate > 0, "a snapshot after the first batch read 0 batches/s");
  }

  void snapshot_decodes_as_protobuf_and_json() {
    ServedRun run(kEndless);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto client = client_of(*run.server);
    auto binary = client.Get("/snapshot");
    QVERIFY(binary && binary->status == 200);
    QCOMPARE(binary->get_header_value("Content-Type"), std::string("application/x-protobuf"));
    sluice::metrics::MetricsSnapshot snap;
    QVERIFY(snap.ParseFromString(binary->body));
    QCOMPARE(snap.stage_size(), 3);
    QCOMPARE(snap.stage(1).id(), std::string("work"));
    QCOMPARE(snap.state(), std::string("running"));
    auto json = client.Get("/snapshot?format=json");
    QVERIFY(json && json->status == 200);
    QCOMPARE(sluice::snapshot_from_json(json->body).stage(2).op(), std::string("null_sink"));
    QCOMPARE(client.Get("/nothing-here")->status, 404);
  }

  // An attached app reads the run's own pipeline from /pipeline: its parameter values as run.
  void pipeline_is_served_once_the_run_gives_it() {
    ServedRun run(kEndless);
    auto client = client_of(*run.server);
    auto missing = client.Get("/pipeline");
    QVERIFY(missing && missing->status == 404);
    QVERIFY(missing->body.find("did not publish") != std::string::npos);
    const std::string text = "# as run\n" + kEndless;
    run.server->set_pipeline(text);
    auto given = client.Get("/pipeline");
    QVERIFY(given && given->status == 200);
    QCOMPARE(given->body, text);
  }

  void stream_feeds_two_clients_five_snapshots_a_second() {
    ServedRun run(kEndless, std::chrono::milliseconds(100));
    auto count_events = [&](std::atomic<int>& events) {
      auto client = client_of(*run.server);
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
      client.Get("/stream", [&](const char* data, std::size_t size) {
        std::string chunk(data, size);
        for (std::size_t at = chunk.find("data: {"); at != std::string::npos; at = chunk.find("data: {", at + 1)) ++events;
        return std::chrono::steady_clock::now() < until;
      });
    };
    std::atomic<int> a{0}, b{0};
    std::thread first([&] { count_events(a); }), second([&] { count_events(b); });
    first.join();
    second.join();
    QVERIFY2(a.load() >= 10 && b.load() >= 10, qPrintable(QString("events in 2 s: %1 and %2").arg(a.load()).arg(b.load())));
  }

  void binds_to_loopback_unless_told_otherwise() {
    QCOMPARE(sluice::parse_metrics_address("9464").host, std::string("127.0.0.1"));
    QCOMPARE(sluice::parse_metrics_address(":9464").host, std::string("127.0.0.1"));
    QCOMPARE(sluice::parse_metrics_address("0.0.0.0:9").host, std::string("0.0.0.0"));
    QCOMPARE(sluice::parse_metrics_address("[::1]:9").host, std::string("::1"));
    QVERIFY_THROWS_EXCEPTION(sluice::Error, sluice::parse_metrics_address("localhost:http"));
    QVERIFY_THROWS_EXCEPTION(sluice::Error, sluice::parse_metrics_address("70000"));
    const std::string outside = non_loopback_address();
    if (outside.empty()) QSKIP("this machine has no non-loopback IPv4 address to try");
    {
      sluice::MetricsServer server(sluice::parse_metrics_address("0"));
      int fd = connect_to("127.0.0.1", server.port());
      QVERIFY(fd >= 0);
      ::close(fd);
      QCOMPARE(connect_to(outside, server.port()), -1);  // not reachable from outside
    }
    sluice::MetricsServer open(sluice::parse_metrics_address("0.0.0.0:0"));  // named explicitly: reachable
    int fd = connect_to(outside, open.port());
    QVERIFY(fd >= 0);
    ::close(fd);
  }

  void busy_port_is_a_clear_error() {
    sluice::MetricsServer first(sluice::parse_metrics_address("0"));
    try {
      sluice::MetricsServer second(sluice::parse_metrics_address(std::to_string(first.port())));
      QFAIL("a second server bound the same port");
    } catch (const sluice::Error& e) {
      QVERIFY2(std::string(e.what()).find("cannot serve metrics on 127.0.0.1:" + std::to_string(first.port())) != std::string::npos, e.what());
    }
  }

  void garbage_and_half_open_connections_leave_the_output_identical() {
    const std::string text = stage("src", "range", "", {{"count", "20000"}}) +
                             stage("work", "simulate_work", "src", {{"us", "20"}, {"jitter_us", "20"}}, "parallelism: 2") +
                             sink_after("work");
    auto quiet = run_text(text);
    QCOMPARE(quiet.lines.size(), std::size_t(20000));

    sluice::MetricsServer server(sluice::parse_metrics_address("0"));
    std::atomic<bool> done{false};
    std::vector<int> held;  // half-open: connected, request never finished; and a stream never read
    for (const char* start : {"GET /metr", "", "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"}) {
      int fd = connect_to("127.0.0.1", server.port());
      QVERIFY(fd >= 0);
      if (*start) QVERIFY(::send(fd, start, std::strlen(start), MSG_NOSIGNAL) > 0);
      held.push_back(fd);
    }
    std::thread attacker([&] {
      const std::string garbage[] = {"\x16\x03\x01\x02\x00garbage\r\n\r\n", "GET / HTTP/9.9\r\n\r\n", "POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nxx",
                                     std::string(20000, 'A') + "\r\n\r\n", "GET /snapshot?format=%%%zz HTTP/1.1\r\n\r\n"};
      for (int round = 0; !done.load(); ++round) {
        int fd = connect_to("127.0.0.1", server.port());
        if (fd < 0) continue;
        const auto& g = garbage[round % 5];
        ::send(fd, g.data(), g.size(), MSG_NOSIGNAL);
        ::close(fd);
      }
    });
    auto noisy = run_text(text);  // the same pipeline, while the server is being attacked
    const bool still_serving = static_cast<bool>(client_of(server).Get("/metrics"));
    done = true;
    attacker.join();
    for (int fd : held) ::close(fd);
    QVERIFY(still_serving);
    QCOMPARE(noisy.result.state, sluice::RunState::Finished);
    QVERIFY(noisy.lines == quiet.lines);
  }
};

QTEST_GUILESS_MAIN(TestMetrics)
#include "tst_metrics.moc"
