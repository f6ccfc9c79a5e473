#include "sluice/core/atomic_file.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "sluice/error.hpp"

namespace sluice {

void write_file_atomically(const std::filesystem::path& target, std::string_view content) {
  auto temporary = target;
  temporary += ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + temporary.string() + " (is the folder writable?)");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw Error("writing " + temporary.string() + " failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, target, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    throw Error("cannot rename " + temporary.string() + " to " + target.string() + ": " + ec.message());
  }
}

}  // namespace sluice
