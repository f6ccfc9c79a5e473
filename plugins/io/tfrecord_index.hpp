#pragma once
// Index files of TFRecord files: where each record starts, so that a record can be read at
// random with one positioned read (the random_access source, `sluice index`).
//
// Sluice's own form (FILE.idx beside the file, or INDEX_DIR/NAME-HASH.idx): the magic
// "SLCIDX01", then little-endian u64s: the file's size, its version (a local file's modification
// time in ns since the epoch; an object's ETag, hashed), the record count, each record's byte
// offset, and a checksum of all that. A file whose size or version no longer matches is refused
// by name. Files may be objects in remote storage (s3://, gs://, http(s)://), read through a
// stage's Storage: their index is built by one sequential read, and lives beside them
// (OBJECT.idx, uploaded) or in a local index_dir. DALI's tfrecord2idx form
// (text lines "OFFSET SIZE", SIZE the record's bytes on disk with its framing) is read too, and
// written on request; it records no time, so only its sizes are checked against the file.
#include <cstdint>
#include <string>
#include <vector>

#include "sluice/storage.hpp"

namespace sluice::io {

enum class IndexFormat { Sluice, Dali };

struct TfrecordIndex {
  std::uint64_t file_size = 0;
  std::int64_t mtime_ns = 0;           // 0: not recorded (DALI's form)
  std::vector<std::uint64_t> offsets;  // each record's first byte (its length field)

  std::uint64_t records() const { return offsets.size(); }
  // Record i's bytes on disk, framing included (8 length, 4 CRC, data, 4 CRC).
  std::uint64_t framed_size(std::size_t i) const { return (i + 1 < offsets.size() ? offsets[i + 1] : file_size) - offsets[i]; }
};

// A file as an index describes it: its size and version (0: none known, as for DALI's form).
struct FileVersion {
  std::uint64_t size = 0;
  std::int64_t stamp = 0;
};
// A local file's size and modification time (ns) now; throws DataError naming it when it is missing.
FileVersion local_file_version(const std::string& file);
// An object's size and hashed ETag, as a listing or an opened reader gave them.
FileVersion object_version(const StoredObject& object);

// Where the index of `file` lives: FILE.idx, or in `index_dir` (NAME-HASH.idx, HASH of the
// file's absolute path or URI, so that two files of one name in different folders do not meet).
std::string index_path_for(const std::string& file, const std::string& index_dir);

// Scans a TFRecord file's framing (each length checked against its CRC), reading it once from
// start to end: throws DataError naming the file and the byte where the framing breaks, and for a
// gzip file (no random access into it). A remote `file` (its `object` as listed or opened, size
// and ETag) is read through `storage`.
TfrecordIndex build_tfrecord_index(const std::string& file, Storage* storage = nullptr, const StoredObject* object = nullptr);

// Writes an index atomically (a temporary name, then a rename; a remote index_path is uploaded
// whole through `storage`).
void write_tfrecord_index(const TfrecordIndex& index, const std::string& index_path, IndexFormat format, Storage* storage = nullptr);

// Reads an index of either form and checks it against `file` as it is now (`now`); throws
// DataError naming both when it is stale (another size or version), damaged, or not an index. A
// remote index_path is read through `storage`. `from_zero`: the first record starts at byte 0 (a
// TFRecord file; a tar's first sample may follow folder members).
TfrecordIndex read_tfrecord_index(const std::string& index_path, const std::string& file, const FileVersion& now, Storage* storage = nullptr,
                                  bool from_zero = true);

}  // namespace sluice::io
