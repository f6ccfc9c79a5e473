#include "sluice/remote/remote_storage.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/error.hpp"

namespace sluice::remote {

// Range buffers handed back when their range has been read, for the next ranges: a fresh buffer
// of a few MiB is faulted in page by page as a GET fills it, which cost a third of the system time
// of a fast read. Up to kKeptBytes are kept; a buffer serves any range no larger than it.
class BufferRecycler {
 public:
  static constexpr std::size_t kKeptBytes = std::size_t{128} << 20;
  struct GiveBack {
    BufferRecycler* owner = nullptr;
    std::size_t capacity = 0;
    void operator()(std::byte* data) const { owner->give_back(data, capacity); }
  };
  using Buffer = std::unique_ptr<std::byte[], GiveBack>;

  ~BufferRecycler() {
    for (const auto& [data, capacity] : kept_) delete[] data;
  }
  Buffer take(std::size_t size) {
    {
      std::lock_guard lock(mutex_);
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->second < size) continue;
        Buffer buffer(it->first, GiveBack{this, it->second});
        kept_bytes_ -= it->second;
        kept_.erase(it);
        return buffer;
      }
    }
    return Buffer(new std::byte[size], GiveBack{this, size});  // (not zeroed: the GET fills what it returns)
  }

 private:
  void give_back(std::byte* data, std::size_t capacity) {
    {
      std::lock_guard lock(mutex_);
      if (kept_bytes_ + capacity <= kKeptBytes) {
        kept_.emplace_back(data, capacity);
        kept_bytes_ += capacity;
        return;
      }
    }
    delete[] data;
  }
  std::mutex mutex_;
  std::vector<std::pair<std::byte*, std::size_t>> kept_;
  std::size_t kept_bytes_ = 0;
};

// Threads that run the GETs of every reader. Requests mostly wait on the network, so there are
// more threads than cores: enough for every reader of a wide interleave to have its ranges in
// flight.
class FetchPool {
 public:
  explicit FetchPool(int threads) : wanted_(threads) {}
  ~FetchPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  BufferRecycler& buffers() { return buffers_; }
  void submit(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (threads_.empty())  // started on first use: a run that reads no remote object starts none
        for (int i = 0; i < wanted_; ++i) threads_.emplace_back([this] { work(); });
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  int wanted_;
  BufferRecycler buffers_;  // (before tasks_: a task's ranges hand their buffers back when it is destroyed)
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

namespace {

RetryPolicy retry_policy_of(const StorageOptions& options) {
  RetryPolicy retry;
  retry.max_attempts = options.max_attempts;
  retry.deadline = std::chrono::milliseconds(options.deadline_ms);
  return retry;
}

// One range of an object, fetched by the pool. Its bytes can be read as they arrive.
struct Range {
  std::uint64_t offset = 0;
  std::size_t length = 0;
  BufferRecycler::Buffer data;  // not zeroed: the GET fills what it returns
  std::mutex mutex;
  std::condition_variable cv;
  std::size_t received = 0;  // bytes of `data` filled so far
  bool answered = false;     // the first answer's headers came: the object's size and ETag are known
  bool done = false;         // `received` is all there will be (less than length: the object ended)
  // Why the fetch failed, thrown anew by the reader: an exception object is not shared between
  // threads (its reference count lives in the uninstrumented C++ runtime, which a race detector
  // cannot follow, and a message is all the reader passes on).
  std::string error;
  bool data_error = true;  // DataError (skippable: the object is unreadable); else Error (settings)
  ObjectVersion version;     // what the store said of the object (the first range's answer sets it)
  std::atomic<bool> abandoned{false};  // the reader moved away: not fetched if not begun
};

// Fetches `range` on the calling thread (a pool thread), telling waiting readers of each piece.
void fetch_range(ObjectStore& store, BufferRecycler& buffers, const std::string& uri, Range& range, const RetryPolicy& retry,
                 RequestCounters* counters) {
  if (!range.abandoned) {
    try {
      range.data = buffers.take(range.length);
      ObjectVersion version = range.version;
      store.read_range(uri, range.offset, range.length, range.data.get(), version, retry, counters, [&](std::size_t got) {
        std::lock_guard lock(range.mutex);
        range.received = got;
        if (!range.answered) {
          range.answered = true;
          range.version = version;
        }
        range.cv.notify_all();
      });
      std::lock_guard lock(range.mutex);
      range.version = version;
    } catch (const StoreError& e) {
      std::lock_guard lock(range.mutex);
      range.error = e.what();
    } catch (const std::exception& e) {  // a malformed URI, settings that cannot be used, memory
      std::lock_guard lock(range.mutex);
      range.error = e.what();
      range.data_error = false;
    }
  }
  std::lock_guard lock(range.mutex);
  range.done = true;
  range.answered = true;
  range.cv.notify_all();
}

// A remote object's copy in the cache, read as a local file.
class CachedCopyReader final : public RemoteReader {
 public:
  CachedCopyReader(int fd, StoredObject object) : fd_(fd), object_(std::move(object)) {}
  ~CachedCopyReader() override { ::close(fd_); }
  const StoredObject& object() const override { return object_; }
  std::size_t read(std::byte* dst, std::size_t n) override {
    for (;;) {
      const ssize_t got = ::read(fd_, dst, n);
      if (got >= 0) return static_cast<std::size_t>(got);
      if (errno != EINTR) throw DataError("reading the cached copy of " + object_.uri + " failed: " + std::strerror(errno));
    }
  }
  void seek(std::uint64_t offset) override { ::lseek(fd_, static_cast<off_t>(offset), SEEK_SET); }

 private:
  int fd_;
  StoredObject object_;
};

[[noreturn]] void throw_error_of(const Range& range) {
  if (range.data_error) throw DataError(range.error);
  throw Error(range.error);
}

class PrefetchingReader final : public RemoteReader {
 public:
  PrefetchingReader(ObjectStore& store, FetchPool& pool, const StorageOptions& options, std::shared_ptr<RequestCounters> counters,
                    std::string uri)
      : store_(store), pool_(pool), ahead_(options), retry_(retry_policy_of(options)), counters_(std::move(counters)) {
    object_.uri = std::move(uri);
  }
  ~PrefetchingReader() override {
    if (early_) early_->abandoned = true;
    abandon_all();
  }

  // Asks for the object's first range now, before its first read: what an interleave opens ahead
  // of its turn then has its first bytes on their way. A first read or seek past that range
  // drops it (unfetched if the pool has not begun it).
  void start_early() {
    if (started_ || early_) return;
    early_ = std::make_shared<Range>();
    early_->length = ahead_.range_bytes;
    submit(early_);
  }

  // The version a HEAD found (answers are checked against it), and a cache copy to fill with the
  // object as it is read from its start to its end.
  void read_version(const ObjectVersion& version, std::unique_ptr<ObjectCache::Filling> fill) {
    version_ = version;
    fill_ = std::move(fill);
  }

  const StoredObject& object() const override {
    const_cast<PrefetchingReader*>(this)->start_at(0);
    return object_;
  }

  std::size_t read(std::byte* dst, std::size_t n) override {
    start_at(position_);
    if (position_ >= object_.size || n == 0) return 0;
    if (ranges_.empty()) top_up();
    Range& range = *ranges_.front();
    const std::size_t at = static_cast<std::size_t>(position_ - range.offset);
    std::size_t available = 0;
    {
      std::unique_lock lock(range.mutex);
      range.cv.wait(lock, [&] { return range.done || range.received > at; });
      if (range.received <= at && !range.error.empty()) throw_error_of(range);
      available = range.received;
    }
    if (at >= available) {  // done, and the object ended inside this range: it is shorter than it said
      throw DataError(object_.uri + " ended at byte " + std::to_string(range.offset + available) + " though the store gave its size as " +
                      std::to_string(object_.size) + "; it changed while it was read");
    }
    const std::size_t k = std::min(n, available - at);
    std::memcpy(dst, range.data.get() + at, k);
    position_ += k;
    if (position_ >= range.offset + range.length) {
      copy_to_cache(range);
      ranges_.pop_front();
      top_up();
    }
    return k;
  }

  void seek(std::uint64_t offset) override {
    if (offset != position_) fill_.reset();  // a copy is filled only by a read from start to end
    if (!started_) {  // the first request starts at the offset (a resumed run, an index)
      position_ = offset;
      return;
    }
    // Ranges already in flight that hold the offset are kept; the others are dropped.
    while (!ranges_.empty() && ranges_.front()->offset + ranges_.front()->length <= offset) {
      ranges_.front()->abandoned = true;
      ranges_.pop_front();
    }
    if (ranges_.empty() || ranges_.front()->offset > offset) {
      abandon_all();
      next_fetch_ = offset;
    }
    position_ = offset;
    top_up();
  }

 private:
  // The first range starts where the reader is first read or sought; its answer's headers tell
  // the object's size and ETag, and the ranges after it are then asked for ahead. A small object
  // is whole after this one request.
  void start_at(std::uint64_t offset) {
    if (started_) return;
    std::shared_ptr<Range> first = std::move(early_);
    if (first && offset >= first->offset + first->length) {
      first->abandoned = true;
      first.reset();
    }
    if (!first) {
      first = std::make_shared<Range>();
      first->offset = offset;
      first->length = ahead_.range_bytes;
      submit(first);
    }
    {
      std::unique_lock lock(first->mutex);
      first->cv.wait(lock, [&] { return first->answered; });
      if (!first->error.empty() && first->received == 0) throw_error_of(*first);
      version_ = first->version;
    }
    started_ = true;
    object_.size = version_.size;
    object_.etag = version_.etag;
    // The first range as it will be read: up to the object's end.
    first->length =
        static_cast<std::size_t>(std::min<std::uint64_t>(first->length, object_.size > first->offset ? object_.size - first->offset : 0));
    ranges_.push_back(std::move(first));
    next_fetch_ = ranges_.back()->offset + ranges_.back()->length;
    top_up();
  }
  // A whole range read in order goes into the cache's copy; the last one completes it.
  void copy_to_cache(const Range& range) {
    if (!fill_) return;
    if (range.offset != filled_ || !fill_->write(range.data.get(), range.length)) {
      fill_.reset();
      return;
    }
    filled_ += range.length;
    if (filled_ == object_.size) {
      fill_->commit();
      fill_.reset();
    }
  }
  void submit(const std::shared_ptr<Range>& range) {
    range->version = version_;
    pool_.submit([range, store = &store_, buffers = &pool_.buffers(), retry = retry_, counters = counters_, uri = object_.uri] {
      fetch_range(*store, *buffers, uri, *range, retry, counters.get());
    });
  }
  void top_up() {
    while (static_cast<int>(ranges_.size()) <= ahead_.ranges_ahead && next_fetch_ < object_.size) {
      auto range = std::make_shared<Range>();
      range->offset = next_fetch_;
      range->length = static_cast<std::size_t>(std::min<std::uint64_t>(ahead_.range_bytes, object_.size - next_fetch_));
      next_fetch_ += range->length;
      ranges_.push_back(range);
      submit(range);
    }
  }
  void abandon_all() {
    for (auto& r : ranges_) r->abandoned = true;
    ranges_.clear();
  }

  ObjectStore& store_;
  FetchPool& pool_;
  StorageOptions ahead_;
  RetryPolicy retry_;
  std::shared_ptr<RequestCounters> counters_;
  StoredObject object_;
  ObjectVersion version_;
  std::deque<std::shared_ptr<Range>> ranges_;
  std::shared_ptr<Range> early_;  // the first range, asked for by start_early() before a read
  std::uint64_t position_ = 0, next_fetch_ = 0;
  bool started_ = false;
  std::unique_ptr<ObjectCache::Filling> fill_;
  std::uint64_t filled_ = 0;
};

// A reader made when it is first used.
class ReaderOnFirstUse final : public RemoteReader {
 public:
  explicit ReaderOnFirstUse(std::function<std::unique_ptr<RemoteReader>()> make) : make_(std::move(make)) {}
  const StoredObject& object() const override { return const_cast<ReaderOnFirstUse*>(this)->reader().object(); }
  std::size_t read(std::byte* dst, std::size_t n) override { return reader().read(dst, n); }
  void seek(std::uint64_t offset) override { reader().seek(offset); }

 private:
  RemoteReader& reader() {
    if (!reader_) reader_ = make_();
    return *reader_;
  }
  std::function<std::unique_ptr<RemoteReader>()> make_;
  std::unique_ptr<RemoteReader> reader_;
};

// Runs a request of a stage: a store's refusal is a DataError (the element's object is
// unreadable: skippable), a malformed URI or unusable settings an Error (the run's).
template <class Request>
auto as_stage_errors(Request&& request) -> decltype(request()) {
  try {
    return request();
  } catch (const StoreError& e) {
    throw DataError(e.what());
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
}

// An object's version, asked of the store (once per process: RemoteService::version_of) on the
// fetch pool and awaited by the object's reader. The failure is kept as its message and kind,
// thrown anew by the reader (an exception object is not handed between threads: see Range).
class VersionAsked {
 public:
  void ask(RemoteService& service, ObjectStore& store, const std::string& uri, const RetryPolicy& retry, RequestCounters* counters) {
    ObjectVersion version;
    std::string error;
    bool data_error = true;
    try {
      version = service.version_of(store, uri, retry, counters);
    } catch (const StoreError& e) {
      error = e.what();
    } catch (const std::exception& e) {  // a malformed URI, settings that cannot be used
      error = e.what();
      data_error = false;
    }
    std::lock_guard lock(mutex_);
    version_ = std::move(version);
    error_ = std::move(error);
    data_error_ = data_error;
    done_ = true;
    cv_.notify_all();
  }
  ObjectVersion wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) {
      if (data_error_) throw DataError(error_);
      throw Error(error_);
    }
    return version_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, data_error_ = true;
  ObjectVersion version_;
  std::string error_;
};

class StageStorage final : public Storage {
 public:
  StageStorage(RemoteService& service, ObjectStore& store, FetchPool& pool, ObjectCache* cache, std::shared_ptr<RequestCounters> counters,
               const StorageOptions& options)
      : service_(service), store_(store), pool_(pool), cache_(cache), counters_(std::move(counters)), options_(options),
        retry_(retry_policy_of(options)) {}
  std::unique_ptr<RemoteReader> open(const std::string& uri) override {
    if (!cache_) {
      auto reader = std::make_unique<PrefetchingReader>(store_, pool_, options_, counters_, uri);
      reader->start_early();
      return reader;
    }
    // The cache's question to the store (the object's version) is asked on the fetch pool at
    // once, as an opened object's first range is, and awaited at the first use: an interleave
    // opens its inputs one after the other on one thread, ahead of their turn.
    auto asked = std::make_shared<VersionAsked>();
    pool_.submit([asked, service = &service_, store = &store_, retry = retry_, counters = counters_, uri] {
      asked->ask(*service, *store, uri, retry, counters.get());
    });
    return std::make_unique<ReaderOnFirstUse>([this, uri, asked] { return open_through_cache(uri, asked->wait()); });
  }
  std::unique_ptr<RemoteReader> open_through_cache(const std::string& uri, const ObjectVersion& version) {
    return as_stage_errors([&]() -> std::unique_ptr<RemoteReader> {
      if (const int fd = cache_->open_copy(uri, version); fd >= 0) {
        if (counters_) {
          counters_->cache_hits.fetch_add(1, std::memory_order_relaxed);
          counters_->cache_bytes.fetch_add(version.size, std::memory_order_relaxed);
        }
        return std::make_unique<CachedCopyReader>(fd, StoredObject{uri, version.size, version.etag});
      }
      auto reader = std::make_unique<PrefetchingReader>(store_, pool_, options_, counters_, uri);
      reader->read_version(version, cache_->begin_fill(uri, version));
      reader->start_early();
      return reader;
    });
  }
  std::vector<StoredObject> list(const std::string& prefix) override {
    std::vector<ListedObject> listed = as_stage_errors([&] { return store_.list(prefix, retry_, counters_.get()); });
    const auto at = parse_remote_uri(prefix);
    const std::string bucket_uri = prefix.substr(0, prefix.find("://") + 3) + at->bucket + "/";
    std::vector<StoredObject> objects;
    objects.reserve(listed.size());
    for (auto& o : listed) objects.push_back({bucket_uri + o.key, o.size, std::move(o.etag)});
    return objects;
  }
  std::size_t read_range(const StoredObject& object, std::uint64_t offset, std::size_t length, std::byte* dst) override {
    ObjectVersion version{object.size, object.etag};
    return as_stage_errors([&] { return store_.read_range(object.uri, offset, length, dst, version, retry_, counters_.get()); });
  }
  void upload(const std::string& local_path, const std::string& uri) override {
    try {
      store_.upload(local_path, uri, options_.part_bytes, options_.parallel_parts, retry_, counters_.get());
    } catch (const StoreError& e) {  // an output that cannot be published ends the run: not skippable
      throw Error(e.what());
    } catch (const std::invalid_argument& e) {
      throw Error(e.what());
    }
  }

 private:
  RemoteService& service_;
  ObjectStore& store_;
  FetchPool& pool_;
  ObjectCache* cache_;
  std::shared_ptr<RequestCounters> counters_;
  StorageOptions options_;
  RetryPolicy retry_;
};

}  // namespace

RemoteService::RemoteService(Environment environment, HttpOptions http)
    : environment_(std::move(environment)), http_(std::move(http)), pool_(std::make_unique<FetchPool>(32)) {}
RemoteService::~RemoteService() = default;

// One store per set of store settings: the options given in a pipeline file stand in front of the
// environment's variables of the same meaning. The environment and the AWS files are looked at
// again for each new storage (each stage of each run), as boto3 does for each new client: a
// notebook that changes AWS_SECRET_ACCESS_KEY and reads again signs with the new secret. A store
// made for older settings stays, for the stages still reading with it.
ObjectStore& RemoteService::store_for(const StorageOptions& options) {
  Environment environment = [base = environment_, options](const std::string& name) -> std::string {
    if ((name == "AWS_ENDPOINT_URL" || name == "AWS_ENDPOINT_URL_S3") && !options.endpoint_url.empty()) return options.endpoint_url;
    if ((name == "AWS_REGION" || name == "AWS_DEFAULT_REGION") && !options.region.empty()) return options.region;
    if (name == "AWS_PROFILE" && !options.profile.empty()) return options.profile;
    if (options.anonymous && (name == "AWS_ACCESS_KEY_ID" || name == "AWS_SECRET_ACCESS_KEY" || name == "AWS_SESSION_TOKEN" ||
                              name == "AWS_SHARED_CREDENTIALS_FILE" || name == "AWS_CONFIG_FILE" || name == "HOME"))
      return name == "AWS_SHARED_CREDENTIALS_FILE" || name == "AWS_CONFIG_FILE" ? "/dev/null" : "";
    return base(name);
  };
  const std::string key = settings_digest(environment);
  std::lock_guard lock(mutex_);
  auto& store = stores_[key];
  if (!store) store = std::make_unique<ObjectStore>(std::move(environment), http_);
  return *store;
}

ObjectCache* RemoteService::cache_for(const StorageOptions& options) {
  if (options.cache_dir.empty()) return nullptr;
  std::lock_guard lock(mutex_);
  auto& cache = caches_[options.cache_dir];
  if (!cache) cache = std::make_unique<ObjectCache>(options.cache_dir, options.cache_max_bytes);
  return cache.get();
}

ObjectVersion RemoteService::version_of(ObjectStore& store, const std::string& uri, const RetryPolicy& retry, RequestCounters* counters) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = versions_.find(uri); it != versions_.end()) return it->second;
  }
  const ObjectVersion version = store.head(uri, retry, counters);
  std::lock_guard lock(mutex_);
  return versions_.emplace(uri, version).first->second;
}

std::unique_ptr<Storage> RemoteService::storage_for(std::shared_ptr<RequestCounters> counters, const StorageOptions& options) {
  ObjectCache* cache = nullptr;
  try {
    cache = cache_for(options);
  } catch (const StoreError& e) {
    throw Error(e.what());
  }
  return std::make_unique<StageStorage>(*this, store_for(options), *pool_, cache, std::move(counters), options);
}

RemoteService& process_remote_service() {
  // OpenSSL and libcurl first: their exit handlers then run after the service's destructor, whose
  // fetching threads free their OpenSSL state as they end (the other order leaves it behind).
  static const bool libraries_ready = [] {
    OPENSSL_init_crypto(0, nullptr);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return true;
  }();
  (void)libraries_ready;
  static RemoteService service(process_environment(), http_options_from_environment());
  return service;
}

}  // namespace sluice::remote
