#pragma once
// Where TFRecord bytes come from: a plain file read in large sequential chunks, a zlib/gzip
// stream inflated on the fly, or memory (for tests and fuzzing).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sluice::io {

enum class Compression { None, Gzip, Zlib, Auto };
Compression parse_compression(const std::string& name);  // none, gzip, zlib, auto
const char* compression_name(Compression c);

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; 0 only at the end. Throws DataError on an I/O or decompression error.
  virtual std::size_t read(std::byte* dst, std::size_t n) = 0;
};

// `Auto` looks at the first bytes: gzip magic, else a valid TFRecord header (plain), else a zlib
// header. `name` is used in error messages.
std::unique_ptr<ByteSource> open_file(const std::string& path, Compression compression);
std::unique_ptr<ByteSource> memory_source(const void* data, std::size_t size, Compression compression,
                                          const std::string& name);

}  // namespace sluice::io
