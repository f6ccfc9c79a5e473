#pragma once
// Between the host (core/src/files/remote_access.cpp) and the remote module (libsluice_remote.so, in
// lib/sluice/ beside the plugin folder): libcurl and the libraries it brings are loaded only by a
// run that reads a remote URI, so every other start stays as fast as before.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/remote/request_counters.hpp"
#include "sluice/storage.hpp"

namespace sluice::remote {

// The pipeline's `options { remote { ... } }`: how requests are retried and read ahead, and the
// store's settings for those who keep them in the file (each overrides the AWS variable it names;
// credentials are never options).
struct StorageOptions {
  int max_attempts = 10;                  // tries of one request, the first included
  std::int64_t deadline_ms = 300'000;     // no new try this long after a request's first
  std::size_t range_bytes = 8u << 20;     // bytes of one ranged GET
  int ranges_ahead = 2;                   // GETs in flight ahead of each reader, besides the one it reads
  std::size_t part_bytes = 8u << 20;      // parts of a multipart upload (S3 takes 5 MiB and more)
  int parallel_parts = 4;                 // parts of one upload in flight at once
  std::string endpoint_url;               // AWS_ENDPOINT_URL
  std::string region;                     // AWS_REGION
  std::string profile;                    // AWS_PROFILE
  bool anonymous = false;                 // unsigned requests even where credentials are found
  std::string cache_dir;                  // options.remote_cache.dir: local copies of what is read ("": none)
  std::uint64_t cache_max_bytes = 0;      // the most they may take
};

// A new Storage for one stage, counting its requests into `counters` (which it shares, so that
// requests still in flight after the stage ends count somewhere that exists). The caller owns it.
using MakeStageStorage = Storage* (*)(std::shared_ptr<RequestCounters> counters, const StorageOptions& options);
inline constexpr const char* kMakeStageStorageSymbol = "sluice_remote_make_stage_storage";
inline constexpr const char* kModuleName = "libsluice_remote.so";

}  // namespace sluice::remote
