#pragma once
// The dispatcher's journal file, read at start.
#include <filesystem>
#include <string>

namespace sluice::service::detail {

// The journal's bytes; false when there is none. Opened without waiting (a FIFO put in its place
// would hold the dispatcher in open() for ever, deaf to signals) and refused, with a ServiceError
// naming it, unless a regular file.
bool read_journal_file(const std::filesystem::path& path, std::string& bytes);

}  // namespace sluice::service::detail
