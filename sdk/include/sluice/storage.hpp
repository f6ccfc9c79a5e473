#pragma once
/// Remote storage (ABI 6.6): objects in S3, S3-compatible stores and Google Cloud Storage, and files
/// served over HTTP(S), read and listed through the host, and outputs published to buckets. A plugin that takes paths hands any path
/// for which is_remote_uri() holds to StageInfo::storage rather than to the file system; the host
/// signs the requests, retries what can be retried, reads ahead and counts requests and bytes
/// into the stage's metrics. Credentials never reach a plugin.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"

namespace sluice {

/// Whether `path` names a remote object rather than a local file: s3://, gs://, http://, https://.
inline bool is_remote_uri(std::string_view path) {
  for (std::string_view scheme : {"s3://", "gs://", "http://", "https://"})
    if (path.substr(0, scheme.size()) == scheme) return true;
  return false;
}

/// One object as the store lists it.
struct StoredObject {
  std::string uri;        ///< s3://bucket/key, or the URL as given
  std::uint64_t size = 0;
  std::string etag;       ///< the store's tag of this version of the object; "" where it gives none
};

/// Reads one object from its start or from any byte. Ranges ahead of the reader are being fetched
/// while it reads; a transfer cut off is resumed at the byte it reached, so a reader never sees
/// bytes twice or misses any. An object that changes while it is read (its ETag) is a DataError
/// naming it. Not thread-safe: one reader per thread.
class RemoteReader {
 public:
  virtual ~RemoteReader() = default;
  virtual const StoredObject& object() const = 0;
  /// Up to n bytes; 0 only at the end of the object. Throws DataError naming the URI, the HTTP
  /// status and the store's error code once retries are spent or the error is not retryable.
  virtual std::size_t read(std::byte* dst, std::size_t n) = 0;
  /// The next read() starts at byte `offset` (past the end: read() returns 0).
  virtual void seek(std::uint64_t offset) = 0;
};

/// Reads the next `size` bytes of `reader`'s object into `dst` (a whole object, after open);
/// throws DataError naming the URI when the object ends before them.
inline void read_exactly(RemoteReader& reader, std::byte* dst, std::uint64_t size) {
  for (std::uint64_t got = 0; got < size;) {
    const std::size_t n = reader.read(dst + got, static_cast<std::size_t>(size - got));
    if (n == 0)
      throw DataError(reader.object().uri + " ended after " + std::to_string(got) + " of its " + std::to_string(size) +
                      " bytes; it changed while it was read");
    got += n;
  }
}

/// The host's remote storage, given to operators in StageInfo::storage.
class Storage {
 public:
  virtual ~Storage() = default;
  /// Opens an object for reading; throws DataError (missing object, access refused) naming the URI.
  virtual std::unique_ptr<RemoteReader> open(const std::string& uri) = 0;
  /// Every object whose URI begins with `prefix` (an s3:// or gs:// URI), over every page of the
  /// store's listing, sorted by URI. Throws DataError for http(s), which has no listing.
  virtual std::vector<StoredObject> list(const std::string& prefix) = 0;
  /// Publishes the local file `local_path` as the object `uri` (s3:// or gs://), whole or not at
  /// all: one PUT, or a multipart upload whose parts go in parallel, completed only once every
  /// part has arrived and aborted on any failure. Throws Error naming the URI. (Outputs reach it
  /// through AtomicOutputFile, which spools them to a local file first.)
  virtual void upload(const std::string& local_path, const std::string& uri) = 0;
  /// (6.7) Up to `length` bytes of `object` at `offset` into `dst`, with one ranged request and
  /// nothing read ahead (for reads at random places: random_access), from any thread; returns how
  /// many (fewer only at the object's end). When `object` names a size or an ETag, an object that
  /// no longer has them is a DataError naming it. Throws DataError as open() does.
  virtual std::size_t read_range(const StoredObject& object, std::uint64_t offset, std::size_t length, std::byte* dst) = 0;
};

}  // namespace sluice
