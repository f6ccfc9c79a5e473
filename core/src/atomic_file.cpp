#include "sluice/core/atomic_file.hpp"

#include "remote_access.hpp"
#include "sluice/output_file.hpp"

namespace sluice {

void write_file_atomically(const std::filesystem::path& target, std::string_view content) {
  AtomicOutputFile out(target.string(), is_remote_uri(target.string()) ? &host_storage() : nullptr);
  try {
    out.write(content);
    out.commit();
  } catch (...) {
    out.abandon(/*keep=*/false);
    throw;
  }
}

}  // namespace sluice
