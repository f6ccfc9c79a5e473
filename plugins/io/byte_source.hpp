#pragma once
// Where TFRecord bytes come from: a plain file read in large sequential chunks, a zlib/gzip
// stream inflated on the fly, or memory (for tests and fuzzing).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/buffer.hpp"

namespace sluice::io {

enum class Compression { None, Gzip, Zlib, Auto };
Compression parse_compression(const std::string& name);  // none, gzip, zlib, auto
const char* compression_name(Compression c);

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; 0 only at the end. Throws DataError on an I/O or decompression error.
  virtual std::size_t read(std::byte* dst, std::size_t n) = 0;
  // The whole remaining content as one buffer without copying (a memory-mapped plain file), or
  // null when the source can only be read.
  virtual std::shared_ptr<sluice::Buffer> map_all() { return nullptr; }
};

// `Auto` looks at the first bytes: gzip magic, else a valid TFRecord header (plain), else a zlib
// header. `name` is used in error messages.
// `allow_map`: a plain file may be memory-mapped (records are then views of the page cache, with
// no copy at all). A file truncated by someone else while mapped would end the process, so
// readers of files that change under them should not map.
std::unique_ptr<ByteSource> open_file(const std::string& path, Compression compression, bool allow_map = false);
std::unique_ptr<ByteSource> memory_source(const void* data, std::size_t size, Compression compression,
                                          const std::string& name);

}  // namespace sluice::io
