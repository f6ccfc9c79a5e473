// gpu_feed against the hardware, each against a baseline measured in the same run:
//  1. host-to-device bytes/s: the feed (batches replayed from pinned memory, consume: none)
//     against plain cudaMemcpyAsync of the same slices from pinned memory on one stream per
//     logical device;
//  2. step time: a simulated training step (a kernel of step_us) per slice with the feed copying
//     the next slices meanwhile, against the same kernels launched back to back with no feed.
// The copies' own rate is timed on the device (CUDA events around each of the feed's slices, and
// around each stream's copies in the baseline: bytes over the device time they took, per logical
// device). The end-to-end rate and the step time come from two runs of different lengths (their
// difference cancels start-up and the first epoch that assembles the batches); on a machine whose
// runs vary (an H100, 2026-11-27: 34-99 GB/s) only the timed copies are to be trusted.
//
// Usage: bench_feed [--devices LIST] [--batch N] [--step-us US] [--emulate N]
//   --devices: gpu_feed's list, e.g. 0 or 0,0,0,0 (default 0); --emulate: no GPU (dry run:
//   there is no cudaMemcpyAsync to compare with, and the baselines are skipped).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_clock.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

#if defined(SLUICE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "kernels.hpp"
#endif

namespace {
using sluice::bench::Clock;
using sluice::bench::since;

struct Options {
  std::string devices = "0";
  int batch = 64;
  int step_us = 2000;
  int emulate = 0;
};

std::vector<int> ordinals(const std::string& list) {
  std::vector<int> out;
  std::size_t at = 0;
  while (at < list.size()) {
    std::size_t comma = list.find(',', at);
    out.push_back(std::atoi(list.substr(at, comma - at).c_str()));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

struct FeedRun {
  double seconds = 0;       // wall time of the run
  double bytes = 0;         // copied to all devices
  double timed_bytes = 0;   // of copies timed on the devices (CUDA events), all devices
  double timed_seconds = 0; // their device time, all devices
  bool operator<(const FeedRun& other) const { return seconds < other.seconds; }
};

// Batches of `batch` 224x224x3 f32 images, 8 distinct ones made once (cache), replayed `repeats`
// times into the feed.
FeedRun run_feed(const sluice::Registry& registry, const Options& o, int repeats, const std::string& consume) {
  const std::string text = fmt::format(
      "stage {{ id: \"src\" op: \"tensors\" params {{ key: \"count\" value: \"{n}\" }} params {{ key: \"shape\" value: \"224,224,3\" }} }}\n"
      "stage {{ id: \"batch\" op: \"batch\" input: \"src\" params {{ key: \"batch_size\" value: \"{b}\" }} }}\n"
      "stage {{ id: \"cache\" op: \"cache\" input: \"batch\" }}\n"
      "stage {{ id: \"repeat\" op: \"repeat\" input: \"cache\" params {{ key: \"count\" value: \"{r}\" }} }}\n"
      "stage {{ id: \"feed\" op: \"gpu_feed\" input: \"repeat\" params {{ key: \"devices\" value: \"{d}\" }} "
      "params {{ key: \"consume\" value: \"{c}\" }} params {{ key: \"step_us\" value: \"{s}\" }} params {{ key: \"emulate\" value: \"{e}\" }} }}\n",
      fmt::arg("n", 8 * o.batch), fmt::arg("b", o.batch), fmt::arg("r", repeats), fmt::arg("d", o.devices), fmt::arg("c", consume),
      fmt::arg("s", o.step_us), fmt::arg("e", o.emulate));
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench_feed"), registry));
  const auto t0 = Clock::now();
  engine.start();
  auto result = engine.wait();
  const double seconds = since(t0);
  if (result.state != sluice::RunState::Finished) throw sluice::Error(result.error);
  auto snap = engine.snapshot();
  FeedRun run;
  run.seconds = seconds;
  for (const auto& s : snap.stage())
    for (const auto& d : s.devices()) {
      run.bytes += static_cast<double>(d.bytes());
      run.timed_seconds += d.copy_seconds();
      run.timed_bytes += d.copy_bytes_per_s() * d.copy_seconds();
    }
  return run;
}

// Bytes per second of device time, per logical device.
double timed_rate(const FeedRun& run) { return run.timed_seconds > 0 ? run.timed_bytes / run.timed_seconds : 0; }

#if defined(SLUICE_HAVE_CUDA)
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw sluice::Error(fmt::format("{}: {}", what, cudaGetErrorString(status)));
}

// The same slices as the feed copies, from one pinned batch, one stream per logical device.
// Returns (bytes/s of wall time, bytes/s of device time per stream: CUDA events before and after
// each stream's copies, which run back to back).
std::pair<double, double> baseline_copy(const Options& o, int repeats) {
  const auto devs = ordinals(o.devices);
  const std::size_t image = 224 * 224 * 3 * sizeof(float), rows = static_cast<std::size_t>(o.batch) / devs.size();
  void* host = nullptr;
  check(cudaHostAlloc(&host, image * static_cast<std::size_t>(o.batch), cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(host, 1, image * static_cast<std::size_t>(o.batch));
  std::vector<cudaStream_t> streams(devs.size());
  std::vector<void*> targets(devs.size());
  std::vector<cudaEvent_t> started(devs.size()), ended(devs.size());
  for (std::size_t d = 0; d < devs.size(); ++d) {
    check(cudaSetDevice(devs[d]), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&targets[d], rows * image), "cudaMalloc");
    check(cudaEventCreate(&started[d]), "cudaEventCreate");
    check(cudaEventCreate(&ended[d]), "cudaEventCreate");
  }
  auto pass = [&](int n) {
    for (std::size_t d = 0; d < devs.size(); ++d) check(cudaEventRecord(started[d], streams[d]), "cudaEventRecord");
    for (int r = 0; r < n; ++r)
      for (std::size_t d = 0; d < devs.size(); ++d)
        check(cudaMemcpyAsync(targets[d], static_cast<char*>(host) + d * rows * image, rows * image, cudaMemcpyHostToDevice, streams[d]),
              "cudaMemcpyAsync");
    for (std::size_t d = 0; d < devs.size(); ++d) check(cudaEventRecord(ended[d], streams[d]), "cudaEventRecord");
    for (auto s : streams) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  };
  pass(5);  // warm-up
  const auto t0 = Clock::now();
  pass(repeats);
  const double seconds = since(t0);
  double device_seconds = 0;
  for (std::size_t d = 0; d < devs.size(); ++d) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, started[d], ended[d]), "cudaEventElapsedTime");
    device_seconds += ms / 1e3;
    cudaSetDevice(devs[d]);
    cudaEventDestroy(started[d]);
    cudaEventDestroy(ended[d]);
    cudaFree(targets[d]);
    cudaStreamDestroy(streams[d]);
  }
  cudaFreeHost(host);
  const double bytes = static_cast<double>(repeats) * static_cast<double>(devs.size() * rows * image);
  return {bytes / seconds, bytes / device_seconds};
}

// Seconds per step: `steps` kernels of step_us back to back on each logical device's stream.
double baseline_steps(const Options& o, int steps) {
  const auto devs = ordinals(o.devices);
  std::vector<cudaStream_t> streams(devs.size());
  for (std::size_t d = 0; d < devs.size(); ++d) {
    check(cudaSetDevice(devs[d]), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto pass = [&](int n) {
    for (int s = 0; s < n; ++s)
      for (std::size_t d = 0; d < devs.size(); ++d) {
        check(cudaSetDevice(devs[d]), "cudaSetDevice");
        check(sluice::cuda::launch_spin(static_cast<std::uint32_t>(o.step_us), streams[d]), "spin kernel");
      }
    for (auto s : streams) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  };
  pass(3);
  const auto t0 = Clock::now();
  pass(steps);
  const double seconds = since(t0);
  for (auto s : streams) cudaStreamDestroy(s);
  return seconds / steps;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--devices") o.devices = value;
    else if (flag == "--batch") o.batch = std::atoi(value.c_str());
    else if (flag == "--step-us") o.step_us = std::atoi(value.c_str());
    else if (flag == "--emulate") o.emulate = std::atoi(value.c_str());
    else {
      fmt::print(stderr, "bench_feed: unknown flag {} (--devices LIST --batch N --step-us US --emulate N)\n", flag);
      return 2;
    }
  }
  try {
    sluice::Registry registry;
    registry.load_search_path();
    const auto devs = ordinals(o.devices);
    const double batch_mb = o.batch * 224.0 * 224 * 3 * 4 / 1e6;
    fmt::print("gpu_feed on {} ({} logical device{}{}), batches of {} 224x224x3 f32 images ({:.1f} MB)\n", o.devices, devs.size(),
               devs.size() == 1 ? "" : "s", o.emulate ? ", emulated" : "", o.batch, batch_mb);

    // 1. Bytes per second: the difference of a long and a short run takes out the start and the
    // end. Each is the best of 3, after a run that pays the first use of the devices (the CUDA
    // context, pinned memory): on a real GPU that first run took longer than the long one.
    constexpr int kShort = 40, kLong = 240, kTries = 3;
    auto fastest = [&](int batches, const char* consume) {
      FeedRun best;
      for (int t = 0; t < kTries; ++t) {
        auto run = run_feed(registry, o, batches, consume);
        if (t == 0 || run < best) best = run;
      }
      return best;
    };
    run_feed(registry, o, kShort / 8, "none");  // warm-up
    const FeedRun short_run = fastest(kShort / 8, "none"), long_run = fastest(kLong / 8, "none");
    const double feed_rate = (long_run.bytes - short_run.bytes) / (long_run.seconds - short_run.seconds);
    const double feed_copies = timed_rate(long_run);
    fmt::print("  {:<46} {:>10.2f} GB/s\n", "gpu_feed's copies, device time per device", feed_copies / 1e9);
    fmt::print("  {:<46} {:>10.2f} GB/s  (wall time of long minus short run)\n", "gpu_feed end to end, consume: none", feed_rate / 1e9);
#if defined(SLUICE_HAVE_CUDA)
    if (!o.emulate) {
      const auto [base, base_copies] = baseline_copy(o, kLong - kShort);
      fmt::print("  {:<46} {:>10.2f} GB/s  (gpu_feed: {:.0f}%)\n", "cudaMemcpyAsync, same slices, device time", base_copies / 1e9,
                 100 * feed_copies / base_copies);
      fmt::print("  {:<46} {:>10.2f} GB/s  (gpu_feed: {:.0f}%)\n", "cudaMemcpyAsync end to end", base / 1e9, 100 * feed_rate / base);
    }
#endif
    if (feed_copies <= 0) throw sluice::Error("gpu_feed reported no copy time: its plugin does not time its copies (SDK 6.12)");

    // 2. Step time.
    const double s_short = fastest(kShort / 8, "simulate_step_us").seconds;
    const double s_long = fastest(kLong / 8, "simulate_step_us").seconds;
    const double fed_step = (s_long - s_short) / (kLong - kShort);
    fmt::print("  {:<46} {:>10.0f} us  (step_us {})\n", "step time, fed by gpu_feed", fed_step * 1e6, o.step_us);
#if defined(SLUICE_HAVE_CUDA)
    if (!o.emulate) {
      const double bare = baseline_steps(o, kLong - kShort);
      fmt::print("  {:<46} {:>10.0f} us  (feeding adds {:+.1f}%)\n", "step time, kernels alone", bare * 1e6,
                 100 * (fed_step / bare - 1));
    }
#endif
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_feed: {}\n", e.what());
    return 1;
  }
}
