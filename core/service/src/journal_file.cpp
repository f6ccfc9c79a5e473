// Reading the dispatcher's journal file (dispatcher.cpp writes it).
#include "journal_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sluice/service/service.hpp"

namespace sluice::service::detail {

bool read_journal_file(const std::filesystem::path& path, std::string& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) return false;
  if (fd < 0)
    throw ServiceError(fmt::format("the dispatcher cannot open its journal {}: {} (a link or something other than a file is never "
                                   "followed): move it away",
                                   path.string(), std::strerror(errno)));
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_it{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw ServiceError(fmt::format("the dispatcher's journal {} is not a regular file (a FIFO, a device or a folder): move it away; "
                                   "the dispatcher writes its journal there itself",
                                   path.string()));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  char block[1 << 16];
  for (ssize_t got; (got = ::read(fd, block, sizeof block)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw ServiceError(fmt::format("the dispatcher cannot read its journal {}: {}", path.string(), std::strerror(errno)));
    bytes.append(block, static_cast<std::size_t>(got));
  }
  return true;
}

}  // namespace sluice::service::detail
