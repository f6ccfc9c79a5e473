#include "sluice/remote/object_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <vector>

#include "sluice/rng.hpp"

namespace sluice::remote {
namespace {

namespace fs = std::filesystem;

// The same name in every process and run.
std::string hex64(std::string_view text) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(stable_hash(text)));
  return out;
}

constexpr const char* kCopySuffix = ".copy";
constexpr const char* kFillingPrefix = "filling-";

}  // namespace

ObjectCache::ObjectCache(std::string folder, std::uint64_t max_bytes) : folder_(std::move(folder)), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (!fs::is_directory(folder_, ec))
    throw StoreError("the remote cache " + folder_ + " is not a folder that can be made" + (ec ? " (" + ec.message() + ")" : std::string()) +
                         "; give options.remote_cache.dir or --remote-cache a writable folder",
                     0, "", false);
}

std::string ObjectCache::copy_name(const std::string& uri, const ObjectVersion& version) const {
  // Another version of the object has another name: a stale copy is never taken for a new one.
  return folder_ + "/" + hex64(uri) + "-" + hex64(version.etag) + "-" + std::to_string(version.size) + kCopySuffix;
}

int ObjectCache::open_copy(const std::string& uri, const ObjectVersion& version) const {
  const std::string name = copy_name(uri, version);
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != version.size) {
    ::close(fd);
    return -1;
  }
  ::futimens(fd, nullptr);  // used now: the last to be evicted (mtime, which noatime mounts keep)
  return fd;
}

std::unique_ptr<ObjectCache::Filling> ObjectCache::begin_fill(const std::string& uri, const ObjectVersion& version) const {
  if (version.size > max_bytes_) return nullptr;  // could never stay
  try {
    return std::make_unique<Filling>(*this, copy_name(uri, version), version.size);
  } catch (const StoreError&) {
    return nullptr;  // a cache that cannot be written costs the copy, not the read
  }
}

ObjectCache::Filling::Filling(const ObjectCache& cache, std::string final_name, std::uint64_t size)
    : cache_(cache), final_name_(std::move(final_name)), size_(size) {
  temporary_ = cache_.folder_ + "/" + kFillingPrefix + "XXXXXX";
  fd_ = ::mkostemp(temporary_.data(), O_CLOEXEC);
  if (fd_ < 0) throw StoreError("cannot fill the remote cache: " + std::string(std::strerror(errno)), 0, "", false);
  ::fchmod(fd_, 0644);  // other processes of the node read the copies too
}

ObjectCache::Filling::~Filling() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

bool ObjectCache::Filling::write(const std::byte* data, std::size_t n) {
  if (fd_ < 0) return false;
  for (std::size_t done = 0; done < n;) {
    const ssize_t put = ::write(fd_, data + done, n - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    done += static_cast<std::size_t>(put);
  }
  written_ += n;
  return true;
}

void ObjectCache::Filling::commit() {
  if (fd_ < 0 || written_ != size_) return;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!closed || ::rename(temporary_.c_str(), final_name_.c_str()) != 0) return;
  temporary_.clear();
  cache_.keep_within_bound();
}

void ObjectCache::keep_within_bound() const {
  const std::string lock_name = folder_ + "/.lock";
  const int lock = ::open(lock_name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return;
  ::flock(lock, LOCK_EX);
  struct Entry {
    std::string path;
    std::uint64_t bytes;
    std::int64_t used_ns;  // nanoseconds: copies filled within one second still have an order
  };
  std::vector<Entry> copies;
  std::uint64_t total = 0;
  const std::time_t now = std::time(nullptr);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (name.rfind(kFillingPrefix, 0) == 0) {
      if (now - st.st_mtime > 3600) ::unlink(entry.path().c_str());  // left by a process that died filling it
      continue;
    }
    if (name.size() < 5 || name.compare(name.size() - 5, 5, kCopySuffix) != 0) continue;
    copies.push_back({entry.path().string(), static_cast<std::uint64_t>(st.st_size),
                      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec});
    total += static_cast<std::uint64_t>(st.st_size);
  }
  std::sort(copies.begin(), copies.end(), [](const Entry& a, const Entry& b) { return a.used_ns < b.used_ns; });
  for (const auto& copy : copies) {
    if (total <= max_bytes_) break;
    if (::unlink(copy.path.c_str()) == 0) total -= copy.bytes;  // a reader that has it open keeps reading it
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
}

}  // namespace sluice::remote
