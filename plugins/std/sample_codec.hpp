#pragma once
// A compact binary form of samples, for the file cache. Little-endian, versioned by a header.
#include <cstdint>
#include <cstdio>
#include <string>

#include "sluice/sdk.hpp"

namespace sluice::std_ops {

// Version 2 adds the fingerprint of the pipeline before the cache after the magic.
inline constexpr char kCacheMagic[8] = {'S', 'L', 'C', 'A', 'C', 'H', 'E', '2'};

void write_sample(std::FILE* file, const Sample& sample);
// Returns false at a clean end of file; throws DataError on a truncated or malformed file.
// `file_size` bounds the lengths read; -1: the size of the file behind the stream (fstat).
bool read_sample(std::FILE* file, Sample& sample, const std::string& file_name, std::int64_t file_size = -1);

}  // namespace sluice::std_ops
