// The entry point of libsluice_remote.so, which the host loads on the first remote URI
// (core/src/files/remote_access.cpp).
#include "sluice/remote/module.hpp"
#include "sluice/remote/remote_storage.hpp"

extern "C" __attribute__((visibility("default"))) sluice::Storage* sluice_remote_make_stage_storage(
    std::shared_ptr<sluice::remote::RequestCounters> counters, const sluice::remote::StorageOptions& options) {
  return sluice::remote::process_remote_service().storage_for(std::move(counters), options).release();
}

static_assert(std::is_same_v<decltype(&sluice_remote_make_stage_storage), sluice::remote::MakeStageStorage>);
