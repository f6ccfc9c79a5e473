#include "remote_access.hpp"

#include "sluice/core/remote_files.hpp"

#include "modules/host_module.hpp"

namespace sluice {

Storage& StageRemoteStorage::inner() {
  std::call_once(loaded_, [&] {
    static const auto make = reinterpret_cast<remote::MakeStageStorage>(
        host_module_symbol(remote::kModuleName, remote::kMakeStageStorageSymbol, "cannot read remote storage"));
    inner_.reset(make(counters_, options_));
  });
  return *inner_;
}

void StageRemoteStorage::set_options(const RemoteOptions& options) {
  options_.max_attempts = options.max_attempts;
  options_.deadline_ms = static_cast<std::int64_t>(options.deadline_seconds * 1000);
  options_.range_bytes = static_cast<std::size_t>(options.range_bytes);
  options_.ranges_ahead = options.ranges_ahead;
  options_.part_bytes = static_cast<std::size_t>(options.part_bytes);
  options_.endpoint_url = options.endpoint_url;
  options_.region = options.region;
  options_.profile = options.profile;
  options_.anonymous = options.anonymous;
  options_.cache_dir = options.cache_dir;
  options_.cache_max_bytes = options.cache_max_bytes;
}

Storage& host_storage() {
  static StageRemoteStorage storage;
  return storage;
}

std::string read_remote_text(const std::string& uri) {
  auto reader = host_storage().open(uri);
  std::string text(static_cast<std::size_t>(reader->object().size), '\0');
  read_exactly(*reader, reinterpret_cast<std::byte*>(text.data()), text.size());
  return text;
}

std::vector<std::string> list_remote(const std::string& prefix) {
  std::vector<std::string> uris;
  for (auto& object : host_storage().list(prefix)) uris.push_back(std::move(object.uri));
  return uris;
}

bool StageRemoteStorage::used() const {
  return counters_->requests.load(std::memory_order_relaxed) > 0 || counters_->cache_hits.load(std::memory_order_relaxed) > 0;
}

}  // namespace sluice
