#include "tfrecord_index.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>

#include "crc32c.hpp"
#include "sluice/error.hpp"
#include "sluice/output_file.hpp"
#include "sluice/rng.hpp"

namespace fs = std::filesystem;

namespace sluice::io {
namespace {

constexpr char kMagic[8] = {'S', 'L', 'C', 'I', 'D', 'X', '0', '1'};

std::uint64_t checksum_of(const std::string& bytes) { return stable_hash(bytes); }

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_u64(const std::string& in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

std::string read_whole(const std::string& path, Storage* storage) {
  if (is_remote_uri(path)) {
    if (!storage) throw DataError("cannot read index " + path + ": remote URIs are read through a Sluice engine");
    auto reader = storage->open(path);
    std::string bytes(static_cast<std::size_t>(reader->object().size), '\0');
    read_exactly(*reader, reinterpret_cast<std::byte*>(bytes.data()), bytes.size());
    return bytes;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot read index " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

[[noreturn]] void stale(const std::string& index_path, const std::string& file, const std::string& why) {
  throw DataError("index " + index_path + " does not describe " + file + " as it is now (" + why +
                  "): build it again (sluice index --rebuild " + file + ") or remove it");
}

// Offsets and framed sizes must tile the file from byte 0 (a tar's first sample: from its first
// offset, after folder members) to its end.
void check_tiling(const TfrecordIndex& index, const std::string& index_path, const std::string& file, bool from_zero) {
  std::uint64_t expected = from_zero || index.offsets.empty() ? 0 : index.offsets.front();
  for (std::size_t i = 0; i < index.offsets.size(); ++i) {
    if (index.offsets[i] != expected)
      throw DataError("index " + index_path + " is damaged: record " + std::to_string(i) + " starts at byte " + std::to_string(index.offsets[i]) +
                      ", the one before it ended at " + std::to_string(expected) + "; build it again (sluice index --rebuild " + file + ")");
    if (i + 1 < index.offsets.size() && index.offsets[i + 1] < index.offsets[i] + 16)
      throw DataError("index " + index_path + " is damaged: record " + std::to_string(i) + " is shorter than its framing");
    expected = i + 1 < index.offsets.size() ? index.offsets[i + 1] : index.file_size;
  }
  if (!index.offsets.empty() && index.file_size < index.offsets.back() + 16)
    stale(index_path, file, "its last record would end past the file's " + std::to_string(index.file_size) + " bytes");
}

TfrecordIndex read_dali(const std::string& text, const std::string& index_path, const std::string& file, std::uint64_t size_now, bool from_zero) {
  TfrecordIndex index;
  std::istringstream lines(text);
  std::string line;
  std::uint64_t end = 0;
  for (std::size_t n = 1; std::getline(lines, line); ++n) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::uint64_t offset = 0, size = 0;
    if (!(fields >> offset >> size) || size < 16)
      throw DataError("index " + index_path + " line " + std::to_string(n) + " is not \"OFFSET SIZE\" (DALI's tfrecord2idx form) nor a Sluice index");
    index.offsets.push_back(offset);
    end = offset + size;
  }
  index.file_size = end;
  if (end != size_now) stale(index_path, file, "its records end at byte " + std::to_string(end) + ", the file has " + std::to_string(size_now));
  check_tiling(index, index_path, file, from_zero);
  return index;
}

}  // namespace

FileVersion local_file_version(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) throw DataError("cannot read " + file + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw DataError(file + " is not a regular file");
  return {static_cast<std::uint64_t>(st.st_size), static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

FileVersion object_version(const StoredObject& object) {
  return {object.size, object.etag.empty() ? 0 : static_cast<std::int64_t>(stable_hash(object.etag) | 1)};
}

std::string index_path_for(const std::string& file, const std::string& index_dir) {
  if (index_dir.empty()) return file + ".idx";
  char hash[17];
  const std::string absolute = is_remote_uri(file) ? file : fs::absolute(file).lexically_normal().string();
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(stable_hash(absolute)));
  return (fs::path(index_dir) / (fs::path(file).filename().string() + "-" + std::string(hash, 8) + ".idx")).string();
}

namespace {

// A file's bytes read once, forward: local files with pread, objects through a reader of the
// storage (its ranges fetched ahead), kept in a window that moves on as the scan does.
class ForwardBytes {
 public:
  ForwardBytes(const std::string& file, Storage* storage, const StoredObject* object) : file_(file) {
    if (!is_remote_uri(file)) {
      fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) throw DataError("cannot read " + file + ": " + std::strerror(errno));
      return;
    }
    if (!storage) throw DataError("cannot read " + file + ": remote URIs are read through a Sluice engine");
    reader_ = storage->open(object ? object->uri : file);
  }
  ~ForwardBytes() {
    if (fd_ >= 0) ::close(fd_);
  }
  const StoredObject* object() const { return reader_ ? &reader_->object() : nullptr; }
  // Up to `n` bytes at `at` (at never before an earlier call's): fewer only at the end.
  std::size_t read_at(std::uint64_t at, unsigned char* dst, std::size_t n) {
    if (fd_ >= 0) {
      const ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(at));
      if (got < 0) throw DataError("reading " + file_ + " failed at byte " + std::to_string(at) + ": " + std::strerror(errno));
      return static_cast<std::size_t>(got);
    }
    while (at + n > window_at_ + window_.size() && !ended_) {  // move the window on
      const std::uint64_t keep_from = std::min<std::uint64_t>(at, window_at_ + window_.size());
      window_.erase(0, static_cast<std::size_t>(keep_from - window_at_));
      window_at_ = keep_from;
      const std::size_t had = window_.size();
      window_.resize(had + kStep);
      std::size_t got = 0;
      while (got < kStep) {
        const std::size_t n_read = reader_->read(reinterpret_cast<std::byte*>(window_.data() + had + got), kStep - got);
        if (n_read == 0) {
          ended_ = true;
          break;
        }
        got += n_read;
      }
      window_.resize(had + got);
      if (at > window_at_ + window_.size()) {  // skipping past the window: read on without keeping
        window_at_ += window_.size();
        window_.clear();
      }
    }
    if (at < window_at_) throw Error("ForwardBytes: a read before the window");
    const std::uint64_t end = std::min<std::uint64_t>(at + n, window_at_ + window_.size());
    if (end <= at) return 0;
    std::memcpy(dst, window_.data() + (at - window_at_), static_cast<std::size_t>(end - at));
    return static_cast<std::size_t>(end - at);
  }

 private:
  static constexpr std::size_t kStep = 4u << 20;
  std::string file_;
  int fd_ = -1;
  std::unique_ptr<RemoteReader> reader_;
  std::string window_;
  std::uint64_t window_at_ = 0;
  bool ended_ = false;
};

}  // namespace

TfrecordIndex build_tfrecord_index(const std::string& file, Storage* storage, const StoredObject* object) {
  TfrecordIndex index;
  ForwardBytes bytes(file, storage, object);
  const FileVersion version = bytes.object() ? object_version(*bytes.object()) : local_file_version(file);
  index.file_size = version.size;
  index.mtime_ns = version.stamp;
  unsigned char head[12];
  for (std::uint64_t at = 0; at < index.file_size;) {
    const std::size_t got = bytes.read_at(at, head, sizeof head);
    if (at == 0 && got >= 2 && head[0] == 0x1f && head[1] == 0x8b)
      throw DataError(file + " is gzip-compressed: its records cannot be read at random; decompress it (gunzip -k) and index the copy");
    if (got < sizeof head) throw DataError(file + " ends inside a record's header at byte " + std::to_string(at) + " (cut short?)");
    std::uint64_t length = 0;
    std::memcpy(&length, head, 8);
    std::uint32_t crc = 0;
    std::memcpy(&crc, head + 8, 4);
    if (mask_crc(crc32c(head, 8)) != crc)
      throw DataError(file + " is not TFRecord framing at byte " + std::to_string(at) + " (the length's CRC does not match): damaged, or not a TFRecord file");
    if (const std::uint64_t room = index.file_size - at; room < 16 || length > room - 16)
      throw DataError(file + ": the record at byte " + std::to_string(at) + " says " + std::to_string(length) + " bytes, past the file's end (cut short?)");
    index.offsets.push_back(at);
    at += 16 + length;
  }
  return index;
}

void write_tfrecord_index(const TfrecordIndex& index, const std::string& index_path, IndexFormat format, Storage* storage) {
  std::string bytes;
  if (format == IndexFormat::Dali) {
    for (std::size_t i = 0; i < index.offsets.size(); ++i)
      bytes += std::to_string(index.offsets[i]) + " " + std::to_string(index.framed_size(i)) + "\n";
  } else {
    bytes.assign(kMagic, sizeof kMagic);
    bytes.reserve(sizeof kMagic + 8 * (index.offsets.size() + 4));
    put_u64(bytes, index.file_size);
    put_u64(bytes, static_cast<std::uint64_t>(index.mtime_ns));
    put_u64(bytes, index.offsets.size());
    for (auto offset : index.offsets) put_u64(bytes, offset);
    put_u64(bytes, checksum_of(bytes));
  }
  if (!is_remote_uri(index_path)) {
    const fs::path parent = fs::path(index_path).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
  }
  AtomicOutputFile out(index_path, storage);
  out.write(bytes);
  out.commit();
}

TfrecordIndex read_tfrecord_index(const std::string& index_path, const std::string& file, const FileVersion& now, Storage* storage, bool from_zero) {
  const std::uint64_t size_now = now.size;
  const std::string bytes = read_whole(index_path, storage);
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return read_dali(bytes, index_path, file, size_now, from_zero);
  constexpr std::size_t header = sizeof kMagic + 24;
  if (bytes.size() < header + 8) throw DataError("index " + index_path + " is damaged: it ends inside its header");
  const std::uint64_t count = get_u64(bytes, sizeof kMagic + 16);
  if (count > (bytes.size() - header - 8) / 8 || bytes.size() != header + 8 * count + 8)
    throw DataError("index " + index_path + " is damaged: it should hold " + std::to_string(count) + " offsets in " + std::to_string(bytes.size()) + " bytes");
  if (checksum_of(bytes.substr(0, bytes.size() - 8)) != get_u64(bytes, bytes.size() - 8))
    throw DataError("index " + index_path + " is damaged: its checksum does not match; build it again (sluice index --rebuild " + file + ")");
  TfrecordIndex index;
  index.file_size = get_u64(bytes, sizeof kMagic);
  index.mtime_ns = static_cast<std::int64_t>(get_u64(bytes, sizeof kMagic + 8));
  if (index.file_size != size_now)
    stale(index_path, file, "it was made for " + std::to_string(index.file_size) + " bytes, the file has " + std::to_string(size_now));
  if (index.mtime_ns != now.stamp)
    stale(index_path, file, is_remote_uri(file) ? "the object was replaced after the index was made (another ETag)" : "the file was modified after the index was made");
  index.offsets.resize(count);
  for (std::uint64_t i = 0; i < count; ++i) index.offsets[i] = get_u64(bytes, header + 8 * i);
  check_tiling(index, index_path, file, from_zero);
  return index;
}

}  // namespace sluice::io
