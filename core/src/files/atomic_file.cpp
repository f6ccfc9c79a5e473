#include "sluice/core/atomic_file.hpp"

#include "sluice/output_file.hpp"

namespace sluice {

void write_file_atomically(const std::filesystem::path& target, std::string_view content, Storage* storage) {
  AtomicOutputFile out(target.string(), storage);
  try {
    out.write(content);
    out.commit();
  } catch (...) {
    out.abandon(/*keep=*/false);
    throw;
  }
}

}  // namespace sluice
