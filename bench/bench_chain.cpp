// Throughput of chains of pass-through stages, next to baselines measured in the same run:
// a plain loop doing the same work on one thread, and GStreamer's
// `fakesrc ! queue ! identity ! ... ! fakesink` with as many queue+identity pairs.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string chain_text(long long elements, int stages, bool fuse) {
  std::string text = fmt::format("options {{ fuse_stages: {} }}\n", fuse ? "true" : "false");
  text += fmt::format("stage {{ id: \"src\" op: \"range\" params {{ key: \"count\" value: \"{}\" }} }}\n", elements);
  std::string previous = "src";
  for (int i = 0; i < stages; ++i) {
    std::string id = fmt::format("pass{}", i);
    text += fmt::format("stage {{ id: \"{}\" op: \"identity\" input: \"{}\" }}\n", id, previous);
    previous = id;
  }
  return text + fmt::format("stage {{ id: \"out\" op: \"null_sink\" input: \"{}\" }}\n", previous);
}

double sluice_rate(const sluice::Registry& registry, long long elements, int stages, bool fuse) {
  auto graph = sluice::build_graph(sluice::parse_pipeline(chain_text(elements, stages, fuse), "bench"), registry);
  sluice::Engine engine(std::move(graph));
  auto t0 = Clock::now();
  engine.start();
  auto result = engine.wait();
  double s = seconds_since(t0);
  if (result.state != sluice::RunState::Finished) throw sluice::Error("bench pipeline failed: " + result.error);
  return elements / s;
}

// The same work without the engine: make each element as range does and pass it through the
// same identity operator objects, on one thread.
double plain_loop_rate(const sluice::Registry& registry, long long elements, int stages) {
  auto op = registry.find("identity");
  sluice::Params none;
  std::vector<std::unique_ptr<sluice::Operator>> ops;
  std::vector<sluice::Map*> maps;
  for (int i = 0; i < stages; ++i) {
    ops.push_back(op->info.create(none));
    maps.push_back(dynamic_cast<sluice::Map*>(ops.back().get()));
  }
  sluice::StageInfo info;
  sluice::ElementContext ctx{&info, 0, 0};
  std::size_t checksum = 0;
  auto t0 = Clock::now();
  for (long long i = 0; i < elements; ++i) {
    sluice::Sample s;
    s.set("value", sluice::Tensor::scalar<std::int64_t>(i));
    for (auto* m : maps) s = m->map(std::move(s), ctx);
    checksum += s.nbytes();
  }
  double s = seconds_since(t0);
  if (checksum != static_cast<std::size_t>(elements) * 8) std::abort();
  return elements / s;
}

double run_seconds(const std::string& command) {
  auto t0 = Clock::now();
  int rc = std::system(command.c_str());
  double s = seconds_since(t0);
  return rc == 0 ? s : -1;
}

// GStreamer's rate with its process start-up (measured with one buffer) taken out.
double gstreamer_rate(long long elements, int stages) {
  std::string chain;
  for (int i = 0; i < stages; ++i) chain += " ! queue ! identity";
  auto command = [&](long long n) { return fmt::format("gst-launch-1.0 -q fakesrc num-buffers={}{} ! fakesink > /dev/null 2>&1", n, chain); };
  double startup = run_seconds(command(1));
  double total = run_seconds(command(elements));
  if (startup < 0 || total < 0) return -1;
  return elements / std::max(1e-9, total - startup);
}

}  // namespace

int main(int argc, char** argv) {
  long long elements = argc > 1 ? std::atoll(argv[1]) : 2000000;
  long long gst_elements = argc > 2 ? std::atoll(argv[2]) : 300000;
  sluice::Registry registry;
  registry.load_search_path();
  bool have_gst = std::system("command -v gst-launch-1.0 > /dev/null 2>&1") == 0;

  fmt::print("elements per run: {} (GStreamer: {}); each figure is the best of 3 runs\n\n", elements, gst_elements);
  fmt::print("{:>6} {:>14} {:>16} {:>16} {:>16} {:>8} {:>12}\n", "stages", "sluice elem/s", "unfused elem/s",
             "plain loop", "GStreamer", "vs loop", "vs GStreamer");
  for (int stages : {1, 5, 10}) {
    double ours = 0, unfused = 0, loop = 0, gst = -1;
    for (int rep = 0; rep < 3; ++rep) {
      ours = std::max(ours, sluice_rate(registry, elements, stages, true));
      unfused = std::max(unfused, sluice_rate(registry, elements, stages, false));
      loop = std::max(loop, plain_loop_rate(registry, elements, stages));
      if (have_gst) gst = std::max(gst, gstreamer_rate(gst_elements, stages));
    }
    fmt::print("{:>6} {:>14.0f} {:>16.0f} {:>16.0f} {:>16} {:>7.2f}x {:>12}\n", stages, ours, unfused, loop,
               gst > 0 ? fmt::format("{:.0f}", gst) : "n/a", ours / loop, gst > 0 ? fmt::format("{:.1f}x", ours / gst) : "n/a");
  }
  if (!have_gst) fmt::print("\nGStreamer baseline skipped: install gstreamer1.0-tools (SLUICE_BENCH_DEPS=1 scripts/install-deps.sh)\n");
  return 0;
}
