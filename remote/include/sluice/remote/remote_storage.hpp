#pragma once
// The host side of sluice::Storage (sdk/include/sluice/storage.hpp): readers that keep ranges of
// an object in flight ahead of the read position, on a pool of fetching threads shared by every
// reader of the process, and listings; each stage gets its own view, counting its requests.
#include <memory>
#include <string>

#include "sluice/remote/object_store.hpp"
#include "sluice/storage.hpp"

namespace sluice::remote {

struct ReadAhead {
  std::size_t range_bytes = 8 << 20;  // one GET's range: large, so that a request's latency is small beside its transfer
  int ranges_ahead = 2;               // GETs in flight ahead of the reader, besides the one it reads
};

class FetchPool;

// What the process shares: the store (its connections, settings and retry policy) and the
// fetching threads.
class RemoteService {
 public:
  RemoteService(Environment environment, HttpOptions http, RetryPolicy retry, ReadAhead read_ahead);
  ~RemoteService();
  // The storage a stage is given; `counters` (may be null) receive its requests.
  std::unique_ptr<Storage> storage_for(std::shared_ptr<RequestCounters> counters);
  ObjectStore& store() { return store_; }
  const ReadAhead& read_ahead() const { return read_ahead_; }

 private:
  ObjectStore store_;
  ReadAhead read_ahead_;
  std::unique_ptr<FetchPool> pool_;
};

// The process's service, with settings from its environment, made on first use.
RemoteService& process_remote_service();

}  // namespace sluice::remote
