#pragma once
// Between the host (core/src/remote_access.cpp) and the remote module (libsluice_remote.so, in
// lib/sluice/ beside the plugin folder): libcurl and the libraries it brings are loaded only by a
// run that reads a remote URI, so every other start stays as fast as before.
#include <memory>

#include "sluice/remote/request_counters.hpp"
#include "sluice/storage.hpp"

namespace sluice::remote {

// A new Storage for one stage, counting its requests into `counters` (which it shares, so that
// requests still in flight after the stage ends count somewhere that exists). The caller owns it.
using MakeStageStorage = Storage* (*)(std::shared_ptr<RequestCounters> counters);
inline constexpr const char* kMakeStageStorageSymbol = "sluice_remote_make_stage_storage";
inline constexpr const char* kModuleName = "libsluice_remote.so";

}  // namespace sluice::remote
