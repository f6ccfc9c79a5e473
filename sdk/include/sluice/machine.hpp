#pragma once
/// What the machine has, for operators that check a parameter against it before they allocate
/// (a padded shape, a default value no memory could hold is refused by name, not met by the
/// kernel's out-of-memory killer). Header-only: no ABI.
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

namespace sluice {

/// The machine's physical memory in bytes (0 if unknown), asked once per library. A container's
/// or job's limit may be lower; the host's own checks take that into account.
inline std::uint64_t physical_memory_bytes() {
  static const std::uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : std::uint64_t{0};
  }();
  return bytes;
}

/// "N MiB<each>, more than this machine's memory (M MiB)" when `bytes` cannot fit in the
/// machine's memory, for a message that then says which parameter to change; nullopt when it can
/// (or the memory is unknown). `each`: what the size is per (" a record").
inline std::optional<std::string> beyond_memory(long double bytes, const std::string& each = "") {
  const std::uint64_t memory = physical_memory_bytes();
  if (memory == 0 || bytes <= static_cast<long double>(memory)) return std::nullopt;
  return std::to_string(static_cast<unsigned long long>(bytes / (1 << 20))) + " MiB" + each + ", more than this machine's memory (" +
         std::to_string(memory >> 20) + " MiB)";
}

}  // namespace sluice
