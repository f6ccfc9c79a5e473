#pragma once
// What one stage's remote requests did: kept by the host (each stage's metrics and the run
// report) and filled by the remote module as its requests answer.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace sluice::remote {

struct RequestCounters {
  std::atomic<std::uint64_t> requests{0}, bytes{0}, retries{0}, throttles{0}, errors{0};
  // Objects opened from the remote cache's local copies, and their bytes.
  std::atomic<std::uint64_t> cache_hits{0}, cache_bytes{0};
  // Set by the host when the run is asked to stop: the stage's reads and listings, and the waits
  // between their tries, end at once (a publishing upload goes on: outputs are whole or absent).
  std::atomic<bool> cancelled{false};
  // Latency to the first byte of each answer, in power-of-two microsecond buckets: bucket i
  // holds answers that took [2^i, 2^(i+1)) µs.
  static constexpr int kBuckets = 32;
  std::atomic<std::uint64_t> latency_us[kBuckets] = {};

  void add_latency(std::chrono::microseconds latency) {
    auto us = static_cast<std::uint64_t>(latency.count() > 1 ? latency.count() : 1);
    int bucket = 0;
    while (bucket + 1 < kBuckets && (us >>= 1) != 0) ++bucket;
    latency_us[bucket].fetch_add(1, std::memory_order_relaxed);
  }
  // The upper bound of the bucket below which `fraction` of the answers came, in µs; 0 for none.
  std::uint64_t latency_quantile_us(double fraction) const {
    std::uint64_t total = 0;
    for (const auto& b : latency_us) total += b.load(std::memory_order_relaxed);
    if (total == 0) return 0;
    const auto wanted = static_cast<std::uint64_t>(std::ceil(fraction * static_cast<double>(total)));
    std::uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += latency_us[i].load(std::memory_order_relaxed);
      if (seen >= wanted) return std::uint64_t{1} << (i + 1);
    }
    return std::uint64_t{1} << kBuckets;
  }
};

}  // namespace sluice::remote
