#pragma once
// The host side of sluice::Storage (sdk/include/sluice/storage.hpp): readers that keep ranges of
// an object in flight ahead of the read position, on a pool of fetching threads shared by every
// reader of the process, and listings; each stage gets its own view, counting its requests.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sluice/remote/module.hpp"
#include "sluice/remote/object_cache.hpp"
#include "sluice/remote/object_store.hpp"
#include "sluice/storage.hpp"

namespace sluice::remote {

class FetchPool;

// What the process shares: the stores (their connections and resolved settings, one per set of
// store options in use) and the fetching threads.
class RemoteService {
 public:
  RemoteService(Environment environment, HttpOptions http);
  ~RemoteService();
  // The storage a stage is given; `counters` (may be null) receive its requests.
  std::unique_ptr<Storage> storage_for(std::shared_ptr<RequestCounters> counters, const StorageOptions& options);
  // The version of `uri` this process reads: asked of the store (HEAD) the first time, the same
  // afterwards, so that a cached copy is checked once per run rather than at every epoch.
  ObjectVersion version_of(ObjectStore& store, const std::string& uri, const RetryPolicy& retry, RequestCounters* counters);

 private:
  ObjectStore& store_for(const StorageOptions& options);
  ObjectCache* cache_for(const StorageOptions& options);
  Environment environment_;
  HttpOptions http_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<ObjectStore>> stores_;
  std::map<std::string, std::unique_ptr<ObjectCache>> caches_;
  std::map<std::string, ObjectVersion> versions_;
  std::unique_ptr<FetchPool> pool_;
};

// The process's service, with settings from its environment, made on first use.
RemoteService& process_remote_service();

}  // namespace sluice::remote
