#pragma once
// WebDataset shards: tar files (plain, gzip, zstd, bzip2, xz: libarchive detects the filter) whose
// consecutive members sharing a key make one sample. The key is a member's path up to the first
// dot of its file name ("train/0001.seg.png": key "train/0001", field "seg.png"), as
// webdataset's tariterators split it. Folder entries are skipped.
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tfrecord_index.hpp"

#include "sluice/sdk.hpp"

struct archive;

namespace sluice::io {

// The most bytes one member may hold, read or inflated (webdataset_reader's max_member_bytes), as a
// TFRecord record's limit: what a damaged header or a compression bomb cannot go past.
constexpr std::uint64_t kDefaultMaxMemberBytes = 1ull << 30;

struct TarMember {
  std::string key, field;  // "train/0001", "seg.png"
  std::string path;        // as the archive names it
  std::string data;
  std::int64_t header_offset = 0;  // byte of its header in the uncompressed stream
};

struct WebDatasetSample {
  std::string key;
  std::vector<TarMember> members;  // in the archive's order, each field once
  std::int64_t index = 0;          // samples before it in the shard
  std::int64_t header_offset = 0;  // its first member's
};

class WebDatasetShard {
 public:
  // Opens `path`; throws DataError naming it when it cannot be read or is not an archive.
  // A remote URI (s3://, gs://, http(s)://) is read through `storage`, a skipped member's data
  // skipped by a seek rather than fetched.
  explicit WebDatasetShard(std::string path, Storage* storage = nullptr);
  // The samples of a span of a plain tar held in memory, from a member's header on (random_access
  // reads one sample so); `path` names it in messages. The memory must outlive the shard.
  WebDatasetShard(std::string path, const std::byte* data, std::size_t size);
  ~WebDatasetShard();
  WebDatasetShard(const WebDatasetShard&) = delete;
  WebDatasetShard& operator=(const WebDatasetShard&) = delete;

  // The next sample, or false at the end. Damage (a cut member, a bad header, a field twice in one
  // sample) is described to `damage` with the shard, the member and its byte offset: under skip,
  // a sample with a repeated field is dropped and reading goes on; a damaged archive ends the
  // shard there (a tar has no marks to find the next member by); otherwise DataError.
  bool next(WebDatasetSample& out, DamageReport& damage);

  // Goes to the sample numbered `index` whose first member's header is at `header_offset` (as a
  // sample read before said), reading headers from the start and skipping members' data. False
  // when no sample starts there.
  bool seek(std::int64_t index, std::int64_t header_offset);

  const std::string& path() const { return path_; }
  // A member holding more (a .tar.gz shard's may inflate to anything) is damage named with it.
  void set_max_member_bytes(std::uint64_t bytes) { max_member_bytes_ = bytes; }

 private:
  void open();
  void close();
  // The next regular member's header (its data still unread), or nullopt at the end; then its
  // data. Both throw DataError naming the shard, the member and the byte on damage.
  std::optional<TarMember> read_header();
  void read_data(TarMember& m);
  std::optional<TarMember> read_member();
  std::string archive_error() const;
  [[noreturn]] void damaged(const std::string& what, std::int64_t offset);

  static ssize_t read_remote(::archive*, void* self, const void** buffer);
  static std::int64_t skip_remote(::archive*, void* self, std::int64_t request);

  std::string path_;
  const std::byte* memory_ = nullptr;
  std::size_t memory_size_ = 0;
  int fd_ = -1;
  Storage* storage_ = nullptr;
  std::unique_ptr<RemoteReader> remote_;
  std::vector<std::byte> remote_buffer_;
  std::uint64_t remote_position_ = 0;
  ::archive* archive_ = nullptr;
  std::optional<TarMember> pending_;  // the first member of the next sample
  std::string deferred_damage_;       // damage met while looking for the end of a whole sample
  std::int64_t samples_ = 0;
  bool ended_ = false;
  std::uint64_t max_member_bytes_ = kDefaultMaxMemberBytes;
};

// A sample's fields as webdataset_reader gives them: '__key__', and a field per member named by its
// extension, as bytes; those in `integers` parsed into an int64, in `npy` into a tensor; members
// ending in .gz inflated first (`inflate`: the field loses .gz). Throws DataError naming the member.
class WebDatasetFields {
 public:
  bool inflate = true;
  // The most bytes a member may inflate to (a gzip bomb: 1 MB of zeros that inflate to gigabytes).
  std::uint64_t max_member_bytes = kDefaultMaxMemberBytes;
  std::set<std::string> integers{"cls"}, npy{"npy"};
  Sample of(WebDatasetSample& sample) const;

 private:
  static std::int64_t parse_integer(const TarMember& m, const std::string& field);
  static Tensor npy_of(const TarMember& m);
};

// Where each sample of a plain (uncompressed) tar shard begins: its first member's header (a pax
// header before it included), read once from start to end (`object`: a remote shard's size and
// ETag, read through `storage`). Compressed shards are refused: their samples cannot be read at
// random. The offsets go into a TfrecordIndex (tfrecord_index.hpp: the same index files).
TfrecordIndex build_webdataset_index(const std::string& path, Storage* storage = nullptr, const StoredObject* object = nullptr);

// Splits a member path into (key, field) as webdataset does; field "" when the file name has no dot.
std::pair<std::string, std::string> webdataset_key(const std::string& path);

// A NumPy .npy file (format 1.0 to 3.0, little-endian or single-byte dtypes, C order) as a tensor.
// Throws DataError saying what it does not read.
Tensor parse_npy(std::string_view bytes);
// The .npy file of a numeric tensor (format 1.0).
std::string encode_npy(const Tensor& t);

// The inflated bytes of a gzip member (several members, as gzip allows, one after another); throws
// DataError when they are not gzip, are cut short or inflate past `limit` bytes.
std::string gunzip(std::string_view bytes, std::uint64_t limit = kDefaultMaxMemberBytes);

}  // namespace sluice::io
