#pragma once
// Where TFRecord bytes come from: a plain file read in large sequential chunks, a remote object
// (through the host's storage), a zlib/gzip stream inflated on the fly, or memory (for tests and
// fuzzing).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/buffer.hpp"
#include "sluice/storage.hpp"

namespace sluice::io {

enum class Compression { None, Gzip, Zlib, Auto };

// Opens a regular file for reading, or throws a DataError naming it: a FIFO, device, socket or
// directory is refused without waiting on it (a read from /dev/zero or a FIFO may never end).
int open_regular_file(const std::string& path);
Compression parse_compression(const std::string& name);  // none, gzip, zlib, auto
const char* compression_name(Compression c);

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; 0 only at the end. Throws DataError on an I/O or decompression error.
  virtual std::size_t read(std::byte* dst, std::size_t n) = 0;
  // Moves the read position to byte `offset` of the (uncompressed) stream; false if this source
  // cannot (a compressed stream), and nothing moved.
  virtual bool seek(std::uint64_t /*offset*/) { return false; }
};

// `Auto` looks at the first bytes: gzip magic, else a valid TFRecord header (plain), else a zlib
// header. `name` is used in error messages.
// Files are read with plain read() calls, never memory-mapped: mapping was measured slower than
// reading on both 2-core machines tried (1.25-1.35 s against 0.54-0.78 s for 1.5 GB from the page
// cache), and a mapped file that shrinks under the reader ends the process with SIGBUS.
// A remote URI (s3://, gs://, http(s)://) is read through `storage` (StageInfo::storage), whose
// reader fetches ranges ahead and resumes cut transfers; without one it is refused.
std::unique_ptr<ByteSource> open_file(const std::string& path, Compression compression, Storage* storage = nullptr);
// The remote reader of `uri`, or a DataError saying that this stage cannot read remote URIs.
std::unique_ptr<RemoteReader> open_remote(const std::string& uri, Storage* storage);
// A remote object's whole contents as text (metadata files: dataset_info.json, labels).
std::string read_remote_text(const std::string& uri, Storage* storage);
std::unique_ptr<ByteSource> memory_source(const void* data, std::size_t size, Compression compression,
                                          const std::string& name);

}  // namespace sluice::io
