#include "remote_access.hpp"

#include "host_module.hpp"

namespace sluice {

Storage& StageRemoteStorage::inner() {
  std::call_once(loaded_, [&] {
    static const auto make = reinterpret_cast<remote::MakeStageStorage>(
        host_module_symbol(remote::kModuleName, remote::kMakeStageStorageSymbol, "cannot read remote storage"));
    inner_.reset(make(counters_));
  });
  return *inner_;
}

bool StageRemoteStorage::used() const { return counters_->requests.load(std::memory_order_relaxed) > 0; }

}  // namespace sluice
