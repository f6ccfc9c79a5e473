#include "webdataset_format.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "byte_source.hpp"
#include "text_scan.hpp"

namespace sluice::io {

std::pair<std::string, std::string> webdataset_key(const std::string& path) {
  const auto slash = path.rfind('/');
  const auto name_at = slash == std::string::npos ? 0 : slash + 1;
  const auto dot = path.find('.', name_at);
  if (dot == std::string::npos) return {path, ""};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

WebDatasetShard::WebDatasetShard(std::string path, Storage* storage) : path_(std::move(path)), storage_(storage) { open(); }

WebDatasetShard::WebDatasetShard(std::string path, const std::byte* data, std::size_t size)
    : path_(std::move(path)), memory_(data), memory_size_(size) {
  open();
}

ssize_t WebDatasetShard::read_remote(::archive* a, void* self, const void** buffer) {
  auto& shard = *static_cast<WebDatasetShard*>(self);
  try {
    const std::size_t got = shard.remote_->read(shard.remote_buffer_.data(), shard.remote_buffer_.size());
    shard.remote_position_ += got;
    *buffer = shard.remote_buffer_.data();
    return static_cast<la_ssize_t>(got);
  } catch (const std::exception& e) {  // no exception may cross libarchive: it reports the message as a read error
    archive_set_error(a, EIO, "%s", e.what());
    return -1;
  }
}

std::int64_t WebDatasetShard::skip_remote(::archive*, void* self, std::int64_t request) {
  auto& shard = *static_cast<WebDatasetShard*>(self);
  const auto size = static_cast<la_int64_t>(shard.remote_->object().size);
  const la_int64_t skipped = std::max<la_int64_t>(0, std::min<la_int64_t>(request, size - static_cast<la_int64_t>(shard.remote_position_)));
  shard.remote_position_ += static_cast<std::uint64_t>(skipped);
  shard.remote_->seek(shard.remote_position_);
  return skipped;
}

WebDatasetShard::~WebDatasetShard() { close(); }

void WebDatasetShard::close() {
  if (archive_) archive_read_free(archive_);
  archive_ = nullptr;
  if (fd_ >= 0) ::close(fd_);  // libarchive reads the descriptor but leaves closing it to us
  fd_ = -1;
  remote_.reset();
}

void WebDatasetShard::open() {
  close();
  pending_.reset();
  deferred_damage_.clear();
  samples_ = 0;
  ended_ = false;
  const bool remote = !memory_ && is_remote_uri(path_);
  if (memory_) {
  } else if (remote) {
    remote_ = open_remote(path_, storage_);
    remote_buffer_.resize(1 << 20);
    remote_position_ = 0;
  } else {
    fd_ = open_regular_file(path_);  // a FIFO or device refused without waiting on it
  }
  archive_ = archive_read_new();
  archive_read_support_filter_all(archive_);
  archive_read_support_format_tar(archive_);
  archive_read_support_format_gnutar(archive_);
  int opened = ARCHIVE_OK;
  if (memory_) {
    opened = archive_read_open_memory(archive_, memory_, memory_size_);
  } else if (remote) {
    archive_read_set_callback_data(archive_, this);
    archive_read_set_read_callback(archive_, read_remote);
    archive_read_set_skip_callback(archive_, skip_remote);
    opened = archive_read_open1(archive_);
  } else {
    opened = archive_read_open_fd(archive_, fd_, 1 << 20);
  }
  if (opened != ARCHIVE_OK) {
    const std::string why = archive_error_string(archive_) ? archive_error_string(archive_) : "unknown error";
    close();
    throw DataError(path_ + ": cannot be read as a tar archive (" + why + ")");
  }
}

std::string WebDatasetShard::archive_error() const {
  const char* why = archive_error_string(archive_);
  return why ? why : "read error";
}

std::optional<TarMember> WebDatasetShard::read_header() {
  for (;;) {
    archive_entry* entry = nullptr;
    const int rc = archive_read_next_header(archive_, &entry);
    const std::int64_t at = archive_read_header_position(archive_);  // of the header just read (its pax header first)
    if (rc == ARCHIVE_EOF) return std::nullopt;
    // RETRY is a header libarchive could not use (a bad checksum): what follows it cannot be trusted.
    if (rc < ARCHIVE_WARN || rc == ARCHIVE_RETRY) damaged("a damaged member header (" + archive_error() + ")", at);
    if (archive_entry_filetype(entry) != AE_IFREG) continue;  // folders, links: not data (their data skipped by the next read)
    TarMember m;
    m.path = archive_entry_pathname(entry) ? archive_entry_pathname(entry) : "";
    if (m.path.rfind("./", 0) == 0) m.path.erase(0, 2);
    std::tie(m.key, m.field) = webdataset_key(m.path);
    m.header_offset = at;
    // The size a header claims is not trusted with memory: a damaged one may say gigabytes. Room
    // for up to 64 MiB is made at once; a larger member grows as its bytes arrive.
    if (archive_entry_size_is_set(entry))
      m.data.reserve(static_cast<std::size_t>(std::clamp<la_int64_t>(archive_entry_size(entry), 0, la_int64_t{64} << 20)));
    return m;
  }
}

void WebDatasetShard::read_data(TarMember& m) {
  char block[1 << 16];
  for (;;) {
    const la_ssize_t got = archive_read_data(archive_, block, sizeof block);
    if (got == 0) return;
    if (got < 0) {
      if (got >= ARCHIVE_WARN) continue;
      damaged("member " + m.path + " cut short after " + std::to_string(m.data.size()) + " bytes (" + archive_error() + ")", m.header_offset);
    }
    if (m.data.size() + static_cast<std::size_t>(got) > max_member_bytes_)
      damaged("member " + m.path + " holds more than the limit of " + std::to_string(max_member_bytes_) + " bytes (max_member_bytes)",
              m.header_offset);
    m.data.append(block, static_cast<std::size_t>(got));
  }
}

std::optional<TarMember> WebDatasetShard::read_member() {
  std::optional<TarMember> m = read_header();
  if (m) read_data(*m);
  return m;
}

void WebDatasetShard::damaged(const std::string& what, std::int64_t offset) {
  throw DataError(path_ + ": " + what + " at byte " + std::to_string(offset));
}

bool WebDatasetShard::next(WebDatasetSample& out, DamageReport& damage) {
  for (;;) {
    if (!deferred_damage_.empty()) {  // found after the sample before it, which went out whole
      const std::string reason = std::move(deferred_damage_);
      deferred_damage_.clear();
      if (!damage.skip_damaged(reason)) throw DataError(reason);
      return false;
    }
    if (ended_) return false;
    out = WebDatasetSample();
    std::optional<TarMember> first;
    try {
      first = pending_ ? std::move(pending_) : read_member();
    } catch (const DataError& e) {
      ended_ = true;  // a damaged archive: nothing after it can be found again
      if (!damage.skip_damaged(e.what())) throw;
      return false;
    }
    pending_.reset();
    if (!first) {
      ended_ = true;
      return false;
    }
    out.key = first->key;
    out.header_offset = first->header_offset;
    out.index = samples_++;
    out.members.push_back(std::move(*first));
    std::string repeated;
    for (;;) {
      std::optional<TarMember> m;
      try {
        m = read_member();
      } catch (const DataError& e) {
        ended_ = true;
        deferred_damage_ = e.what();
      }
      if (!m) {
        ended_ = true;
        break;
      }
      if (m->key != out.key) {
        pending_ = std::move(m);
        break;
      }
      for (const auto& have : out.members)
        if (have.field == m->field && repeated.empty()) repeated = m->path;
      out.members.push_back(std::move(*m));
    }
    if (repeated.empty()) return true;
    const std::string reason = path_ + ": sample '" + out.key + "' (byte " + std::to_string(out.header_offset) + ") holds member " +
                               repeated + " twice; a sample's members must have different extensions";
    if (!damage.skip_damaged(reason)) throw DataError(reason);
  }
}

bool WebDatasetShard::seek(std::int64_t index, std::int64_t header_offset) {
  if (index < 0 || header_offset < 0) return false;
  try {
    open();
    for (;;) {  // headers only: the members' data before it is skipped, not read
      std::optional<TarMember> m = read_header();
      if (!m || m->header_offset > header_offset) break;
      if (m->header_offset == header_offset) {
        read_data(*m);
        pending_ = std::move(m);
        samples_ = index;
        return true;
      }
    }
  } catch (const DataError&) {
  }
  open();
  return false;
}

namespace {

DType npy_dtype(const std::string& descr) {
  if (descr == "|u1" || descr == "|b1" || descr == "<u1") return DType::U8;
  if (descr == "<i2") return DType::I16;
  if (descr == "<i4") return DType::I32;
  if (descr == "<i8") return DType::I64;
  if (descr == "<f2") return DType::F16;
  if (descr == "<f4") return DType::F32;
  if (descr == "<f8") return DType::F64;
  throw DataError(".npy dtype '" + descr + "' is not one Sluice reads (u1, b1, i2, i4, i8, f2, f4, f8, little-endian)");
}

const char* npy_descr(DType t) {
  switch (t) {
    case DType::U8: return "|u1";
    case DType::I16: return "<i2";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::F16: return "<f2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    default: throw DataError(std::string("a ") + dtype_name(t) + " tensor has no .npy form Sluice writes");
  }
}

// The text between `open` and `close` after 'KEY' in a .npy header's dict ({'descr': '<f4', ...}).
std::string_view npy_entry(std::string_view header, std::string_view key, char open, char close) {
  const std::string quoted = "'" + std::string(key) + "'";
  const std::size_t at = header.find(quoted);
  const std::size_t colon = at == std::string_view::npos ? at : header.find(':', at + quoted.size());
  if (colon == std::string_view::npos) throw DataError(".npy header has no '" + std::string(key) + "'");
  const std::size_t from = open == ':' ? colon : header.find(open, colon + 1);
  const std::size_t to = from == std::string_view::npos ? from : header.find(close, from + 1);
  if (to == std::string_view::npos) throw DataError(".npy header's '" + std::string(key) + "' is not closed");
  return header.substr(from + 1, to - from - 1);
}

}  // namespace

Tensor parse_npy(std::string_view b) {
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) throw DataError("not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<std::uint8_t>(b[6]);
  std::size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = static_cast<std::uint8_t>(b[8]) | (static_cast<std::size_t>(static_cast<std::uint8_t>(b[9])) << 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) throw DataError(".npy file cut short in its header");
    for (int k = 3; k >= 0; --k) header_len = (header_len << 8) | static_cast<std::uint8_t>(b[8 + k]);
    at = 12;
  } else {
    throw DataError(".npy format version " + std::to_string(major) + " is not 1, 2 or 3");
  }
  if (at + header_len > b.size()) throw DataError(".npy file cut short in its header");
  const std::string_view header = b.substr(at, header_len);
  const DType dtype = npy_dtype(std::string(npy_entry(header, "descr", '\'', '\'')));
  const std::string_view order = scan::trimmed(npy_entry(header, "fortran_order", ':', ','));
  if (order == "True") throw DataError(".npy array is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  if (order != "False") throw DataError(".npy header's 'fortran_order' is neither True nor False");
  Shape shape;
  const std::string_view dims = npy_entry(header, "shape", '(', ')');
  for (std::size_t k = 0; k < dims.size();) {
    if (!scan::digit(dims[k])) {
      if (dims[k] != ',' && dims[k] != ' ' && dims[k] != 'L') throw DataError(".npy header's 'shape' is not a tuple of whole numbers");
      ++k;
      continue;
    }
    const std::size_t end = scan::digits(dims, k);
    if (end - k > 15) throw DataError(".npy header's 'shape' holds a dimension too large to read");
    shape.push_back(std::stoll(std::string(dims.substr(k, end - k))));
    k = end;
  }
  Tensor t = Tensor::empty(dtype, shape);
  const std::size_t data_at = at + header_len;
  if (b.size() - data_at != t.nbytes())
    throw DataError(".npy data holds " + std::to_string(b.size() - data_at) + " bytes, its shape " + shape_string(shape) + " of " +
                    dtype_name(dtype) + " needs " + std::to_string(t.nbytes()));
  std::memcpy(t.raw_data(), b.data() + data_at, t.nbytes());
  return t;
}

std::string encode_npy(const Tensor& t) {
  std::string dims;
  for (auto d : t.shape()) dims += std::to_string(d) + ",";
  if (t.rank() > 1) dims.pop_back();  // (3,) for one dimension, (2,3) for more
  std::string header = "{'descr': '" + std::string(npy_descr(t.dtype())) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Padded with spaces and a newline so that the data starts at a multiple of 64 bytes.
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.raw_data()), t.nbytes());
  return out;
}

std::string gunzip(std::string_view bytes, std::uint64_t limit) {  // byte_source's inflating reader: truncation and several members handled there
  auto source = memory_source(bytes.data(), bytes.size(), Compression::Gzip, "gzip data");
  std::string out;
  char block[1 << 16];
  for (std::size_t got; (got = source->read(reinterpret_cast<std::byte*>(block), sizeof block)) > 0;) {
    if (out.size() + got > limit)
      throw DataError("its " + std::to_string(bytes.size()) + " bytes inflate past the limit of " + std::to_string(limit) +
                      " bytes (max_member_bytes): a compression bomb, or a member larger than this reader is set to take");
    out.append(block, got);
  }
  return out;
}

Sample WebDatasetFields::of(WebDatasetSample& sample) const {
  Sample out;
  out.reserve(sample.members.size() + 2);
  out.set("__key__", Tensor::from_string(sample.key));
  for (TarMember& m : sample.members) {
    std::string field = m.field;
    if (inflate && field.ends_with(".gz")) {
      try {
        m.data = gunzip(m.data, max_member_bytes);
      } catch (const DataError& e) {
        throw DataError("member " + m.path + ": " + e.what());
      }
      field.resize(field.size() - 3);
    }
    if (out.find(field)) throw DataError("members give field '" + field + "' twice (" + m.path + ")");
    if (integers.count(field)) out.set(field, Tensor::scalar<std::int64_t>(parse_integer(m, field)));
    else if (npy.count(field)) out.set(field, npy_of(m));
    else out.set(field, Tensor::from_string(m.data));
  }
  return out;
}
std::int64_t WebDatasetFields::parse_integer(const TarMember& m, const std::string& field) {
  std::string_view text(m.data);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw DataError("member " + m.path + " is not one integer ('" + std::string(m.data.substr(0, 40)) + "'); '" + field +
                    "' is in integers: remove it there to keep its bytes");
  return value;
}
Tensor WebDatasetFields::npy_of(const TarMember& m) {
  try {
    return parse_npy(m.data);
  } catch (const DataError& e) {
    throw DataError("member " + m.path + ": " + e.what());
  }
}


TfrecordIndex build_webdataset_index(const std::string& path, Storage* storage, const StoredObject* object) {
  TfrecordIndex index;
  FileVersion version;
  unsigned char magic[6] = {};
  if (is_remote_uri(path)) {
    if (!storage) throw DataError("cannot read " + path + ": remote URIs are read through a Sluice engine");
    auto reader = storage->open(object ? object->uri : path);
    version = object_version(reader->object());
    reader->read(reinterpret_cast<std::byte*>(magic), sizeof magic);
  } else {
    version = local_file_version(path);
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw DataError("cannot read " + path + ": " + std::strerror(errno));
    (void)std::fread(magic, 1, sizeof magic, f);
    std::fclose(f);
  }
  const bool gzip = magic[0] == 0x1f && magic[1] == 0x8b, zstd = magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd;
  const bool bzip2 = magic[0] == 'B' && magic[1] == 'Z' && magic[2] == 'h', xz = magic[0] == 0xfd && magic[1] == '7' && magic[2] == 'z';
  if (gzip || zstd || bzip2 || xz)
    throw DataError(path + " is a compressed tar: its samples cannot be read at random; decompress it (a plain .tar) and index that");
  index.file_size = version.size;
  index.mtime_ns = version.stamp;
  WebDatasetShard shard(path, storage);
  struct Refuse final : DamageReport {
    bool skip_damaged(const std::string&) override { return false; }
  } refuse;
  for (WebDatasetSample sample; shard.next(sample, refuse);) index.offsets.push_back(static_cast<std::uint64_t>(sample.header_offset));
  return index;
}

}  // namespace sluice::io
