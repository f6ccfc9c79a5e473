#pragma once
// A compact binary form of samples, for the file cache. Little-endian, versioned by a header.
#include <cstdio>
#include <string>

#include "sluice/sdk.hpp"

namespace sluice::std_ops {

// Version 2 adds the fingerprint of the pipeline before the cache after the magic.
inline constexpr char kCacheMagic[8] = {'S', 'L', 'C', 'A', 'C', 'H', 'E', '2'};

void write_sample(std::FILE* file, const Sample& sample);
// Returns false at a clean end of file; throws DataError on a truncated or malformed file.
bool read_sample(std::FILE* file, Sample& sample, const std::string& file_name);

}  // namespace sluice::std_ops
