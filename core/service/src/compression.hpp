#pragma once
// Elements on the wire, compressed as their job asks (zstd or snappy, Debian's libzstd and
// libsnappy): made smaller by the worker, restored by the trainer.
#include <string>

#include "service.pb.h"

namespace sluice::service::detail {

// `raw` in the job's compression (itself when none).
std::string compress(proto::JobRequest::Compression compression, std::string raw);
// The bytes `compress` was given (`raw_size` of them); throws Error naming `what` when they do not
// decompress to that size.
std::string decompress(proto::JobRequest::Compression compression, std::string data, std::size_t raw_size, const std::string& what);

}  // namespace sluice::service::detail
