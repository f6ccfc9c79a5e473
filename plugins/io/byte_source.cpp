#include "byte_source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "crc32c.hpp"
#include "sluice/error.hpp"
#include "sluice/output_file.hpp"

namespace sluice::io {

int open_regular_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd, &st) == 0 ? file_kind_name(st.st_mode) : std::strerror(errno);
    ::close(fd);
    throw DataError("cannot read " + path + ": it is " + kind + ", not a regular file (a read from it may never end)");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::None;
  if (name == "gzip") return Compression::Gzip;
  if (name == "zlib") return Compression::Zlib;
  if (name == "auto") return Compression::Auto;
  throw ParamError("unknown compression '" + name + "' (none, gzip, zlib or auto)");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::None: return "none";
    case Compression::Gzip: return "gzip";
    case Compression::Zlib: return "zlib";
    case Compression::Auto: return "auto";
  }
  return "?";
}

namespace {

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    fd_ = open_regular_file(path);
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~FileSource() override { ::close(fd_); }
  // The first bytes, without moving the read position (for format detection).
  std::size_t peek(std::byte* dst, std::size_t n) {
    ssize_t got = ::pread(fd_, dst, n, 0);
    return got > 0 ? static_cast<std::size_t>(got) : 0;
  }
  std::size_t read(std::byte* dst, std::size_t n) override {
    for (;;) {
      ssize_t got = ::read(fd_, dst, n);
      if (got >= 0) return static_cast<std::size_t>(got);
      if (errno != EINTR) throw DataError("reading " + path_ + " failed: " + std::strerror(errno));
    }
  }
  bool seek(std::uint64_t offset) override {
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) throw DataError("seeking in " + path_ + " failed: " + std::strerror(errno));
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

class RemoteSource final : public ByteSource {
 public:
  explicit RemoteSource(std::unique_ptr<RemoteReader> reader) : reader_(std::move(reader)) {}
  std::size_t read(std::byte* dst, std::size_t n) override { return reader_->read(dst, n); }
  bool seek(std::uint64_t offset) override {
    reader_->seek(offset);
    return true;
  }

 private:
  std::unique_ptr<RemoteReader> reader_;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(const void* data, std::size_t size) : data_(static_cast<const std::byte*>(data)), size_(size) {}
  std::size_t read(std::byte* dst, std::size_t n) override {
    std::size_t k = std::min(n, size_ - at_);
    if (k) std::memcpy(dst, data_ + at_, k);
    at_ += k;
    return k;
  }
  bool seek(std::uint64_t offset) override {
    at_ = static_cast<std::size_t>(std::min<std::uint64_t>(offset, size_));
    return true;
  }

 private:
  const std::byte* data_;
  std::size_t size_, at_ = 0;
};

// Gives back bytes already read (for format detection), then the rest of the inner source.
class PeekedSource final : public ByteSource {
 public:
  PeekedSource(std::vector<std::byte> head, std::unique_ptr<ByteSource> inner) : head_(std::move(head)), inner_(std::move(inner)) {}
  std::size_t read(std::byte* dst, std::size_t n) override {
    if (at_ < head_.size()) {
      std::size_t k = std::min(n, head_.size() - at_);
      std::memcpy(dst, head_.data() + at_, k);
      at_ += k;
      return k;
    }
    return inner_->read(dst, n);
  }
  bool seek(std::uint64_t offset) override {
    if (!inner_->seek(offset)) return false;
    at_ = head_.size();  // the inner source is past its head now
    return true;
  }

 private:
  std::vector<std::byte> head_;
  std::size_t at_ = 0;
  std::unique_ptr<ByteSource> inner_;
};

class InflateSource final : public ByteSource {
 public:
  InflateSource(std::unique_ptr<ByteSource> inner, Compression kind, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)), input_(256 << 10) {
    window_bits_ = kind == Compression::Gzip ? 15 + 16 : 15;
    if (inflateInit2(&z_, window_bits_) != Z_OK) throw Error("zlib initialisation failed");
  }
  ~InflateSource() override { inflateEnd(&z_); }
  std::size_t read(std::byte* dst, std::size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    while (z_.avail_out == static_cast<uInt>(std::min<std::size_t>(n, 1u << 30))) {
      if (z_.avail_in == 0 && !input_ended_) {
        std::size_t got = inner_->read(input_.data(), input_.size());
        if (got == 0) input_ended_ = true;
        z_.next_in = reinterpret_cast<Bytef*>(input_.data());
        z_.avail_in = static_cast<uInt>(got);
        consumed_ += got;
      }
      if (z_.avail_in == 0 && input_ended_) {
        if (!stream_ended_ && produced_any_)
          throw DataError(name_ + ": compressed stream is truncated (ends inside a " + (window_bits_ > 15 ? "gzip" : "zlib") +
                          " member)");
        break;
      }
      if (stream_ended_) {
        // Concatenated gzip members are one stream to a gzip reader.
        if (inflateReset(&z_) != Z_OK) throw DataError(name_ + ": cannot continue after a gzip member");
        stream_ended_ = false;
      }
      int rc = inflate(&z_, Z_NO_FLUSH);
      produced_any_ = true;
      if (rc == Z_STREAM_END) {
        stream_ended_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DataError(name_ + ": decompression failed near compressed byte " + std::to_string(consumed_ - z_.avail_in) + ": " +
                        (z_.msg ? z_.msg : "corrupt data") + " (is the compression right?)");
      }
    }
    return static_cast<std::size_t>(static_cast<std::byte*>(static_cast<void*>(z_.next_out)) - dst);
  }

 private:
  std::unique_ptr<ByteSource> inner_;
  std::string name_;
  std::vector<std::byte> input_;
  z_stream z_{};
  int window_bits_;
  bool input_ended_ = false, stream_ended_ = false, produced_any_ = false;
  std::uint64_t consumed_ = 0;
};

namespace {

// Whether the first bytes of a stream inflate without an error as far as they go. A zlib header
// is two bytes that one pair in 31 of a suitable first byte passes ("80 a" in a text file does):
// the deflate data after it must hold up too.
bool inflates_so_far(const std::byte* head, std::size_t have) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return false;
  std::vector<Bytef> out(1 << 16);  // ten bytes of deflate data can stand for kilobytes
  z.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(head));
  z.avail_in = static_cast<uInt>(have);
  int status = Z_OK;
  while (status == Z_OK && z.avail_in > 0) {
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(out.size());
    status = inflate(&z, Z_NO_FLUSH);
  }
  inflateEnd(&z);
  return status == Z_OK || status == Z_STREAM_END || status == Z_BUF_ERROR;
}

}  // namespace

// gzip magic, else a valid TFRecord header (plain), else a zlib header whose stream inflates as
// far as it goes (a window of at most 32 KB, no preset dictionary, valid deflate data), else plain.
Compression detect(const std::byte* head, std::size_t have) {
  auto b = [&](std::size_t i) { return std::to_integer<unsigned>(head[i]); };
  if (have >= 2 && b(0) == 0x1f && b(1) == 0x8b) return Compression::Gzip;
  if (have == 12) {
    std::uint32_t stored;
    std::memcpy(&stored, head + 8, 4);
    const bool plain = mask_crc(crc32c(head, 8)) == stored;
    const bool zlib_header = (b(0) & 0x0f) == 8 && ((b(0) << 8) | b(1)) % 31 == 0;
    if (!plain && zlib_header && inflates_so_far(head, have)) return Compression::Zlib;
  }
  return Compression::None;
}

std::unique_ptr<ByteSource> wrap(std::unique_ptr<ByteSource> raw, Compression compression, const std::string& name) {
  if (compression == Compression::Auto) {
    std::vector<std::byte> head(12);
    std::size_t have = 0;
    while (have < head.size()) {
      std::size_t got = raw->read(head.data() + have, head.size() - have);
      if (got == 0) break;
      have += got;
    }
    head.resize(have);
    compression = detect(head.data(), have);
    raw = std::make_unique<PeekedSource>(std::move(head), std::move(raw));
  }
  if (compression == Compression::None) return raw;
  return std::make_unique<InflateSource>(std::move(raw), compression, name);
}

// Detects the compression at the first read rather than when opened: an interleave opens its
// inputs on one thread and reads them on several, so a remote object's first request (which the
// detection's first bytes would make) belongs on a reader.
class DetectOnFirstRead final : public ByteSource {
 public:
  DetectOnFirstRead(std::unique_ptr<ByteSource> raw, std::string name) : raw_(std::move(raw)), name_(std::move(name)) {}
  std::size_t read(std::byte* dst, std::size_t n) override { return source().read(dst, n); }
  // A seek before any read (a resumed run) reads the head first, once.
  bool seek(std::uint64_t offset) override { return source().seek(offset); }

 private:
  ByteSource& source() {
    if (!detected_) detected_ = wrap(std::move(raw_), Compression::Auto, name_);
    return *detected_;
  }
  std::unique_ptr<ByteSource> raw_, detected_;
  std::string name_;
};

}  // namespace

std::unique_ptr<RemoteReader> open_remote(const std::string& uri, Storage* storage) {
  if (!storage) throw DataError("cannot read " + uri + ": remote URIs are read through a Sluice engine (run the pipeline, not the operator alone)");
  return storage->open(uri);
}

std::string read_remote_text(const std::string& uri, Storage* storage) {
  auto reader = open_remote(uri, storage);
  std::string text(static_cast<std::size_t>(reader->object().size), '\0');
  read_exactly(*reader, reinterpret_cast<std::byte*>(text.data()), text.size());
  return text;
}

std::unique_ptr<ByteSource> open_file(const std::string& path, Compression compression, Storage* storage) {
  if (is_remote_uri(path)) {
    auto remote = std::make_unique<RemoteSource>(open_remote(path, storage));
    if (compression == Compression::Auto) return std::make_unique<DetectOnFirstRead>(std::move(remote), path);
    return wrap(std::move(remote), compression, path);
  }
  auto file = std::make_unique<FileSource>(path);
  if (compression == Compression::Auto) {
    std::byte head[12];
    compression = detect(head, file->peek(head, sizeof head));
  }
  if (compression != Compression::None) return wrap(std::move(file), compression, path);
  return file;
}

std::unique_ptr<ByteSource> memory_source(const void* data, std::size_t size, Compression compression,
                                          const std::string& name) {
  return wrap(std::make_unique<MemorySource>(data, size), compression, name);
}

}  // namespace sluice::io
