#pragma once
// A stage's remote storage (StageInfo::storage): forwards to the remote module, which is loaded
// when the first remote URI is opened or listed. Its requests count into the stage's counters.
#include <memory>
#include <mutex>

#include "sluice/core/spec.hpp"
#include "sluice/remote/module.hpp"
#include "sluice/storage.hpp"

namespace sluice {

class StageRemoteStorage final : public Storage {
 public:
  StageRemoteStorage() : counters_(std::make_shared<remote::RequestCounters>()) {}
  void set_options(const RemoteOptions& options);  // before the first request
  std::unique_ptr<RemoteReader> open(const std::string& uri) override { return inner().open(uri); }
  std::vector<StoredObject> list(const std::string& prefix) override { return inner().list(prefix); }
  void upload(const std::string& local_path, const std::string& uri) override { inner().upload(local_path, uri); }
  std::size_t read_range(const StoredObject& object, std::uint64_t offset, std::size_t length, std::byte* dst) override {
    return inner().read_range(object, offset, length, dst);
  }
  const remote::RequestCounters& counters() const { return *counters_; }
  bool used() const;  // whether any remote request was made
  // The run is stopping: reads and listings in flight, and their waits between tries, end now
  // (with an error the engine then knows for the stop's own).
  void cancel() { counters_->cancelled.store(true); }
  bool cancelled() const { return counters_->cancelled.load(); }

 private:
  Storage& inner();
  std::shared_ptr<remote::RequestCounters> counters_;
  remote::StorageOptions options_;
  std::once_flag loaded_;
  std::unique_ptr<Storage> inner_;
};

// What the host itself writes and reads remotely (--checkpoint, --metrics-log): the environment's
// settings, requests counted apart from any stage.
Storage& host_storage();

}  // namespace sluice
