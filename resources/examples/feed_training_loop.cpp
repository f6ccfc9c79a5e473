// A training loop fed by gpu_feed: one thread per logical device takes its slice of every
// global batch, makes its stream wait until the slice is in device memory, runs its "training
// step" on it, and releases the slice so the feed can reuse the slot.
//
//   feed_training_loop PIPELINE [STAGE.PARAM=VALUE ...]
//   feed_training_loop resources/pipelines/train_gpu_feed.txtpb                 # every GPU
//   feed_training_loop resources/pipelines/train_gpu_feed.txtpb feed.emulate=2  # no GPU needed
//
// The step here only reads the first label of the slice back to the host, to show the data is
// there; a real loop launches its model on `stream` instead.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(SLUICE_EXAMPLE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace {

struct DeviceTotals {
  std::uint64_t slices = 0, rows = 0;
  std::int64_t label_sum = 0;  // of the first label of every slice, read back from the device
};

// Reads the first i64 of a device tensor back to the host, after the slice's copies.
std::int64_t first_label(sluice::Feed& feed, const sluice::FeedSlice& slice, const sluice::DeviceTensor& labels, void* stream) {
  std::int64_t value = 0;
  if (feed.emulated()) {
    feed.wait_ready(slice);  // emulated device memory is host memory
    std::memcpy(&value, labels.data, sizeof value);
    return value;
  }
#if defined(SLUICE_EXAMPLE_HAVE_CUDA)
  auto s = static_cast<cudaStream_t>(stream);
  cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(slice.ready_event), 0);  // the GPU waits, not the host
  cudaMemcpyAsync(&value, labels.data, sizeof value, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
#else
  (void)stream;
  feed.wait_ready(slice);
  std::fprintf(stderr, "this example was built without CUDA: it can read slices of emulated devices only\n");
#endif
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: feed_training_loop PIPELINE [STAGE.PARAM=VALUE ...] (its gpu_feed stage must be 'feed')\n");
    return 2;
  }
  try {
    sluice::Registry registry;
    registry.load_search_path();
    auto doc = sluice::read_pipeline_file(argv[1]);
    sluice::apply_overrides(doc, std::vector<std::string>(argv + 2, argv + argc));
    sluice::Engine engine(sluice::build_graph(doc, registry));
    engine.start();
    sluice::Feed& feed = *engine.feed("feed");

    const int devices = feed.devices();
    std::vector<DeviceTotals> totals(static_cast<std::size_t>(devices));
    std::atomic<bool> stopped{false};
    std::vector<std::thread> loops;
    const auto t0 = std::chrono::steady_clock::now();
    for (int d = 0; d < devices; ++d)
      loops.emplace_back([&, d] {
        void* stream = nullptr;
#if defined(SLUICE_EXAMPLE_HAVE_CUDA)
        cudaStream_t s = nullptr;  // made on the slice's device, at the first slice
#endif
        sluice::FeedSlice slice;
        for (;;) {
          const auto status = feed.next(d, slice, std::chrono::seconds(1));
          if (status == sluice::FeedStatus::TimedOut) continue;
          if (status != sluice::FeedStatus::Ready) {
            if (status == sluice::FeedStatus::Stopped) stopped = true;
            break;
          }
#if defined(SLUICE_EXAMPLE_HAVE_CUDA)
          if (!feed.emulated() && !s) {
            cudaSetDevice(slice.ordinal);
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
            stream = s;
          }
#endif
          auto& t = totals[static_cast<std::size_t>(d)];
          for (const auto& field : slice.fields)
            if (field.name == "label" && slice.valid_rows > 0) t.label_sum += first_label(feed, slice, field, stream);
          t.rows += static_cast<std::uint64_t>(slice.valid_rows);
          ++t.slices;
          feed.release(slice, stream);  // the slot is reused once the work on `stream` is done
        }
#if defined(SLUICE_EXAMPLE_HAVE_CUDA)
        if (s) cudaStreamDestroy(s);
#endif
      });
    for (auto& t : loops) t.join();
    const auto result = engine.wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int d = 0; d < devices; ++d) {
      const auto& t = totals[static_cast<std::size_t>(d)];
      std::printf("device %d: %llu slices, %llu rows, sum of first labels %lld\n", d, static_cast<unsigned long long>(t.slices),
                  static_cast<unsigned long long>(t.rows), static_cast<long long>(t.label_sum));
    }
    std::printf("%s after %.2f s on %d %s device%s\n", sluice::run_state_name(result.state), seconds, devices,
                feed.emulated() ? "emulated" : "CUDA", devices == 1 ? "" : "s");
    if (result.state != sluice::RunState::Finished) {
      std::fprintf(stderr, "%s\n", result.error.empty() ? "the run was stopped" : result.error.c_str());
      return 1;
    }
    return stopped ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feed_training_loop: %s\n", e.what());
    return 1;
  }
}
