#pragma once
#include <filesystem>
#include <string_view>

namespace sluice {

class Storage;  // sluice/storage.hpp

// Writes `content` to a temporary file beside `target`, flushes it, then renames it over
// `target`: readers see the old file or the whole new one, never a part.
// A remote target (s3://, gs://) is uploaded through `storage` once written.
void write_file_atomically(const std::filesystem::path& target, std::string_view content, Storage* storage = nullptr);

}  // namespace sluice
