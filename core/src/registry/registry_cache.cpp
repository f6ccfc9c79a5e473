#include "registry_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "plugin_probe.hpp"
#include "sluice/abi.hpp"
#include "sluice/core/atomic_file.hpp"
#include "sluice/output_file.hpp"

namespace fs = std::filesystem;

namespace sluice {
namespace {

// The first line of every cache file; the number is the format's, raised when a description
// would be read differently (or the probe's checks change what it accepts).
constexpr std::string_view kMagic = "sluice registry cache ";
constexpr std::string_view kFormat = "1\n";
constexpr off_t kLargestCache = 64 << 20;

std::uint64_t fnv1a(std::string_view bytes) {
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::uint64_t get_u64(std::string_view in) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[static_cast<std::size_t>(i)]);
  return v;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string encode_registry_cache(const registry::Cache& cache) {
  const std::string payload = cache.SerializeAsString();
  std::string content(kMagic);
  content += kFormat;
  put_u64(content, payload.size());
  put_u64(content, fnv1a(payload));
  return content + payload;
}

bool decode_registry_cache(std::string_view view, registry::Cache& out, std::string& problem, bool& ours) {
  ours = true;
  if (view.empty()) {
    problem = "is empty (truncated)";
    return false;
  }
  if (view.size() < kMagic.size() && kMagic.substr(0, view.size()) == view) {
    problem = "is truncated (in its first line)";
    return false;
  }
  if (view.substr(0, kMagic.size()) != kMagic) {
    problem = "is not a Sluice registry cache";
    ours = false;
    return false;
  }
  view.remove_prefix(kMagic.size());
  if (view.substr(0, kFormat.size()) != kFormat) {
    // Another version of Sluice wrote it: not damaged, only of no use here.
    if (view.find('\n') == std::string_view::npos) problem = "is truncated (in its first line)";
    return false;
  }
  view.remove_prefix(kFormat.size());
  if (view.size() < 16) {
    problem = "is truncated (in its header)";
    return false;
  }
  const std::uint64_t length = get_u64(view.substr(0, 8)), hash = get_u64(view.substr(8, 8));
  view.remove_prefix(16);
  if (view.size() != length) {
    problem = fmt::format("is {} ({} bytes of content where its header says {})", view.size() < length ? "truncated" : "damaged",
                          view.size(), length);
    return false;
  }
  if (fnv1a(view) != hash || !out.ParseFromArray(view.data(), static_cast<int>(view.size()))) {
    problem = "is damaged (its checksum does not match its content)";
    out.Clear();
    return false;
  }
  return true;
}

std::string registry_host_key() { return fmt::format("abi {}.{} format {}", kAbiMajor, kAbiMinor, kFormat.substr(0, kFormat.size() - 1)); }

bool describe_file_key(const fs::path& file, registry::Library& key) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return false;
  std::string identity = library_identity(file);
  if (identity.empty()) return false;
  key.set_path(file.string());
  key.set_size(static_cast<std::uint64_t>(st.st_size));
  key.set_mtime_ns(static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  key.set_identity(std::move(identity));
  key.set_host(registry_host_key());
  return true;
}

fs::path RegistryCache::default_file() {
  if (const char* set = std::getenv("SLUICE_REGISTRY")) return std::string(set) == "off" ? fs::path() : fs::path(set);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "sluice" / "registry.bin";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "sluice" / "registry.bin";
  return {};
}

RegistryCache::RegistryCache(fs::path file) : file_(std::move(file)) {}

bool RegistryCache::read_file(registry::Cache& out, std::string& problem, bool& ours) const {
  ours = true;
  // Only a regular file is read, opened without blocking: a FIFO at the cache's path would stop
  // every start waiting for a writer.
  const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return false;  // none yet (or none can be made: save() finds out)
    problem = fmt::format("cannot be read ({})", std::strerror(errno));
    ours = errno != EACCES;  // another user's file is left alone
    return false;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    problem = fmt::format("is {}, not a regular file", file_kind_name(st.st_mode));
    ours = false;
    return false;
  }
  if (st.st_size > kLargestCache) {
    problem = fmt::format("is {} bytes, more than a registry cache ever holds", st.st_size);
    ours = false;
    return false;
  }
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  bytes.resize(got);
  return decode_registry_cache(bytes, out, problem, ours);
}

void RegistryCache::load() {
  if (loaded_ || file_.empty()) return;
  loaded_ = true;
  registry::Cache on_disk;
  std::string problem;
  bool ours = true;
  read_file(on_disk, problem, ours);
  writable_ = ours;
  if (!problem.empty()) {
    warning_ = fmt::format("the plugin registry cache {} {}: {}", file_.string(), problem,
                           ours ? "not trusted; it is rebuilt" : "not used (SLUICE_REGISTRY names another file, or off)");
    dirty_ = ours;
  }
  for (auto& library : *on_disk.mutable_libraries()) {
    if (!exists(library.path())) {  // a removed library drops out
      dirty_ = true;
      continue;
    }
    auto key = std::make_pair(library.path(), library.host());
    entries_[key] = std::move(library);
  }
}

const registry::Library* RegistryCache::find(const registry::Library& key) {
  load();
  auto it = entries_.find({key.path(), key.host()});
  if (it == entries_.end()) return nullptr;
  const auto& kept = it->second;
  if (kept.size() != key.size() || kept.mtime_ns() != key.mtime_ns() || kept.identity() != key.identity()) return nullptr;
  return &kept;
}

void RegistryCache::remember(const registry::Library& described) {
  load();
  if (file_.empty()) return;
  entries_[{described.path(), described.host()}] = described;
  dirty_ = true;
}

void RegistryCache::save() {
  if (!dirty_ || file_.empty() || !writable_) return;
  dirty_ = false;
  // What other processes wrote since this one read the file is kept, unless this one knows better.
  registry::Cache now;
  std::string problem;
  bool ours = true;
  read_file(now, problem, ours);
  if (!ours) return;
  auto merged = entries_;
  for (auto& library : *now.mutable_libraries())
    if (exists(library.path())) merged.emplace(std::make_pair(library.path(), library.host()), std::move(library));
  registry::Cache cache;
  for (auto& [key, library] : merged) *cache.add_libraries() = std::move(library);
  const std::string content = encode_registry_cache(cache);
  try {
    std::error_code ec;
    fs::create_directories(file_.parent_path(), ec);
    write_file_atomically(file_, content);
  } catch (const std::exception&) {
    // A read-only location: every start probes what is new, slower but as safe.
    writable_ = false;
  }
}

}  // namespace sluice
