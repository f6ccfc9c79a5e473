#pragma once
/// What the machine has, for operators that check a parameter against it before they allocate
/// (a padded shape, a default value no memory could hold is refused by name, not met by the
/// kernel's out-of-memory killer). Header-only: no ABI.
#include <unistd.h>

#include <cstdint>

namespace sluice {

/// The machine's physical memory in bytes (0 if unknown). A container's or job's limit may be
/// lower; the host's own checks take that into account.
inline std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

}  // namespace sluice
