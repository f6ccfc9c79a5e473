#include "compression.hpp"

#include <fmt/format.h>
#include <snappy.h>
#include <zstd.h>

#include "sluice/error.hpp"

namespace sluice::service::detail {

std::string compress(proto::JobRequest::Compression compression, std::string raw) {
  switch (compression) {
    case proto::JobRequest::ZSTD: {
      std::string out(ZSTD_compressBound(raw.size()), '\0');
      // Level 1: several hundred MB/s a core, so that a worker's CPU goes to the pipeline.
      const std::size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 1);
      if (ZSTD_isError(n)) throw Error(fmt::format("zstd could not compress an element: {}", ZSTD_getErrorName(n)));
      out.resize(n);
      return out;
    }
    case proto::JobRequest::SNAPPY: {
      std::string out;
      snappy::Compress(raw.data(), raw.size(), &out);
      return out;
    }
    default: return raw;
  }
}

std::string decompress(proto::JobRequest::Compression compression, std::string data, std::size_t raw_size, const std::string& what) {
  switch (compression) {
    case proto::JobRequest::ZSTD: {
      std::string out(raw_size, '\0');
      const std::size_t n = ZSTD_decompress(out.data(), out.size(), data.data(), data.size());
      if (ZSTD_isError(n) || n != raw_size)
        throw Error(fmt::format("{} does not decompress (zstd: {}): the worker and this trainer differ in version, or the bytes were damaged",
                                what, ZSTD_isError(n) ? ZSTD_getErrorName(n) : "another size"));
      return out;
    }
    case proto::JobRequest::SNAPPY: {
      std::string out;
      if (!snappy::Uncompress(data.data(), data.size(), &out) || out.size() != raw_size)
        throw Error(fmt::format("{} does not decompress (snappy): the worker and this trainer differ in version, or the bytes were damaged", what));
      return out;
    }
    default: return data;
  }
}

}  // namespace sluice::service::detail
