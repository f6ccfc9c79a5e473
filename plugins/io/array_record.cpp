// ArrayRecord's reading and writing: Riegeli's block and chunk framing, simple chunks and their
// compression, ArrayRecord's footer and postscript. See array_record.hpp.
#include "array_record.hpp"

#include <brotli/decode.h>
#include <brotli/encode.h>
#include <fcntl.h>
#include <highwayhash/c_bindings.h>
#include <snappy.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <tuple>
#include <cerrno>
#include <cstring>

#include "byte_source.hpp"
#include "sluice/error.hpp"

namespace sluice::io {
namespace {

constexpr std::uint64_t kBlock = 1 << 16, kBlockHeader = 24, kUsable = kBlock - kBlockHeader, kChunkHeader = 40;
constexpr std::uint64_t kPostscriptMagic = 0x71930e704fdae05eull;  // ArrayRecord's, in its RiegeliPostscript
constexpr std::uint64_t kMaxDecodedChunk = 1ull << 30;  // a chunk decoding to more is refused (damage, or hostile)

std::uint64_t riegeli_hash(const void* data, std::size_t n) {
  static const std::uint64_t key[4] = {0x2f696c6567656952ull, 0x0a7364726f636572ull, 0x2f696c6567656952ull, 0x0a7364726f636572ull};
  return HighwayHash64(key, static_cast<const char*>(data), n);
}
std::uint64_t load_le64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void append_le64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void append_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
// A varint at p (< end), moving p past it; nullopt when it runs past end or over 10 bytes.
std::optional<std::uint64_t> get_varint(const std::byte*& p, const std::byte* end) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const auto b = static_cast<std::uint8_t>(*p++);
    v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  return std::nullopt;
}

// The stored extent of `size` bytes written from `pos` on: the block headers crossed added.
std::uint64_t add_with_overhead(std::uint64_t pos, std::uint64_t size) {
  return pos + size + (size + (pos + kUsable - 1) % kBlock) / kUsable * kBlockHeader;
}
std::uint64_t round_up_to_possible_chunk_boundary(std::uint64_t pos) {
  const std::uint64_t remaining = kBlock - 1 - (pos + kBlock - 1) % kBlock;
  return pos + (remaining > kUsable - 1 ? remaining - (kUsable - 1) : 0);
}
std::uint64_t chunk_end(std::uint64_t begin, std::uint64_t data_size, std::uint64_t records) {
  return std::max(add_with_overhead(begin, kChunkHeader + data_size), round_up_to_possible_chunk_boundary(begin + records));
}


// The bytes of a chunk without the block headers among them: a view when none interrupts them,
// else a copy.
struct Logical {
  std::shared_ptr<Buffer> buffer;
  std::size_t at = 0, size = 0;
  const std::byte* data() const { return buffer->data() + at; }
};
// Calls piece(offset in stored, length) for each run of the chunk's bytes between block headers;
// returns how many there were.
template <class Piece> std::size_t for_each_piece(std::size_t at, std::size_t size, std::uint64_t begin, Piece piece) {
  std::size_t pieces = 0;
  for (std::uint64_t pos = begin, end = begin + size; pos < end;) {
    if (pos % kBlock == 0) {
      pos += std::min<std::uint64_t>(kBlockHeader, end - pos);
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(end - pos, kBlock - pos % kBlock);
    piece(at + static_cast<std::size_t>(pos - begin), static_cast<std::size_t>(take));
    ++pieces;
    pos += take;
  }
  return pieces;
}
Logical strip_block_headers(const std::shared_ptr<Buffer>& stored, std::size_t at, std::size_t size, std::uint64_t begin) {
  // Most chunks lie within one block: counted first, they are views, with nothing allocated.
  std::size_t first_at = at, first_length = 0, total = 0;
  const std::size_t pieces = for_each_piece(at, size, begin, [&](std::size_t offset, std::size_t length) {
    if (total == 0) first_at = offset, first_length = length;
    total += length;
  });
  if (pieces <= 1) return {stored, first_at, first_length};
  Logical out{std::make_shared<Buffer>(total), 0, total};
  std::size_t to = 0;
  for_each_piece(at, size, begin, [&](std::size_t offset, std::size_t length) {
    std::memcpy(out.buffer->data() + to, stored->data() + offset, length);
    to += length;
  });
  return out;
}

// A compressed block of a simple chunk (its decompressed size first), into `dst` of `expected`
// bytes; throws DataError saying what failed.
void decompress_block(RiegeliCompression compression, const std::byte* p, std::size_t n, std::byte* dst, std::uint64_t expected, const char* what) {
  const std::byte* end = p + n;
  const auto size = get_varint(p, end);
  if (!size || *size != expected)
    throw DataError(std::string("its ") + what + " say they decompress to " + (size ? std::to_string(*size) : "?") + " bytes where " +
                    std::to_string(expected) + " were expected");
  const std::size_t in = static_cast<std::size_t>(end - p);
  bool ok = false;
  switch (compression) {
    case RiegeliCompression::Zstd: {
      // One context per thread, kept: ZSTD_decompress makes and frees one per call, which cost more
      // than decoding a chunk of one small record.
      thread_local std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> context(ZSTD_createDCtx(), ZSTD_freeDCtx);
      const std::size_t got = ZSTD_decompressDCtx(context.get(), dst, static_cast<std::size_t>(expected), p, in);
      ok = !ZSTD_isError(got) && got == expected;
      break;
    }
    case RiegeliCompression::Brotli: {
      std::size_t got = static_cast<std::size_t>(expected);
      ok = BrotliDecoderDecompress(in, reinterpret_cast<const std::uint8_t*>(p), &got, reinterpret_cast<std::uint8_t*>(dst)) ==
               BROTLI_DECODER_RESULT_SUCCESS &&
           got == expected;
      break;
    }
    case RiegeliCompression::Snappy: {
      std::size_t length = 0;
      ok = snappy::GetUncompressedLength(reinterpret_cast<const char*>(p), in, &length) && length == expected &&
           snappy::RawUncompress(reinterpret_cast<const char*>(p), in, reinterpret_cast<char*>(dst));
      break;
    }
    case RiegeliCompression::None:
      break;
  }
  if (!ok) throw DataError(std::string("its ") + what + " do not decompress (damaged)");
}

std::string compress_block(RiegeliCompression compression, int level, const std::string& raw) {
  std::string out;
  if (compression == RiegeliCompression::None) return raw;
  append_varint(out, raw.size());
  const std::size_t prefix = out.size();
  switch (compression) {
    case RiegeliCompression::Zstd: {
      std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> context(ZSTD_createCCtx(), ZSTD_freeCCtx);
      ZSTD_CCtx_setParameter(context.get(), ZSTD_c_compressionLevel, level);
      ZSTD_CCtx_setParameter(context.get(), ZSTD_c_windowLog, 20);  // the package's window_log:20
      out.resize(prefix + ZSTD_compressBound(raw.size()));
      const std::size_t n = ZSTD_compress2(context.get(), out.data() + prefix, out.size() - prefix, raw.data(), raw.size());
      if (ZSTD_isError(n)) throw Error(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
      out.resize(prefix + n);
      break;
    }
    case RiegeliCompression::Brotli: {
      std::size_t n = BrotliEncoderMaxCompressedSize(raw.size());
      out.resize(prefix + (n ? n : raw.size() + 1024));
      n = out.size() - prefix;
      if (!BrotliEncoderCompress(level, 22, BROTLI_MODE_GENERIC, raw.size(), reinterpret_cast<const std::uint8_t*>(raw.data()), &n,
                                 reinterpret_cast<std::uint8_t*>(out.data() + prefix)))
        throw Error("brotli compression failed");
      out.resize(prefix + n);
      break;
    }
    case RiegeliCompression::Snappy: {
      std::string packed;
      snappy::Compress(raw.data(), raw.size(), &packed);
      out += packed;
      break;
    }
    case RiegeliCompression::None:
      break;
  }
  return out;
}

// The fields of a small protobuf message: (field number, varint value or bytes).
struct ProtoField {
  std::uint32_t number = 0;
  std::uint64_t value = 0;
  const std::byte* bytes = nullptr;
  std::size_t size = 0;
};
bool parse_proto(const std::byte* p, std::size_t n, std::vector<ProtoField>& out) {
  const std::byte* end = p + n;
  while (p < end) {
    const auto tag = get_varint(p, end);
    if (!tag) return false;
    ProtoField f;
    f.number = static_cast<std::uint32_t>(*tag >> 3);
    if ((*tag & 7) == 0) {
      const auto v = get_varint(p, end);
      if (!v) return false;
      f.value = *v;
    } else if ((*tag & 7) == 2) {
      const auto length = get_varint(p, end);
      if (!length || *length > static_cast<std::uint64_t>(end - p)) return false;
      f.bytes = p;
      f.size = static_cast<std::size_t>(*length);
      p += f.size;
    } else {
      return false;  // (none of ArrayRecord's messages has other wire types)
    }
    out.push_back(f);
  }
  return true;
}
std::uint64_t field_or(const std::vector<ProtoField>& fields, std::uint32_t number, std::uint64_t otherwise) {
  for (const auto& f : fields)
    if (f.number == number && !f.bytes) return f.value;
  return otherwise;
}

// Reads and decodes the chunk stored in [begin, end) of `file`.
DecodedChunk read_chunk(const PositionedFile& file, std::uint64_t begin, std::uint64_t end) {
  auto stored = std::make_shared<Buffer>(static_cast<std::size_t>(end - begin));
  file.read(begin, stored->size(), stored->data());
  return decode_array_record_chunk(stored, 0, stored->size(), begin, file.name(), true);
}

}  // namespace

PositionedFile::PositionedFile(std::string path, Storage* storage) : path_(std::move(path)), storage_(storage) {
  if (is_remote_uri(path_)) {
    auto reader = open_remote(path_, storage_);
    object_ = reader->object();
    size_ = object_->size;
    return;
  }
  fd_ = open_regular_file(path_);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw DataError("cannot read " + path_ + ": " + std::strerror(errno));
  size_ = static_cast<std::uint64_t>(st.st_size);
}
PositionedFile::PositionedFile(std::string name, const void* data, std::size_t size)
    : path_(std::move(name)), memory_(static_cast<const std::byte*>(data)), size_(size) {}
PositionedFile::~PositionedFile() {
  if (fd_ >= 0) ::close(fd_);
}
void PositionedFile::read(std::uint64_t offset, std::size_t n, std::byte* dst) const {
  for (std::size_t got = 0; got < n;) {
    std::size_t step = 0;
    if (memory_) {
      if (offset + got < size_) {
        step = static_cast<std::size_t>(std::min<std::uint64_t>(n - got, size_ - offset - got));
        std::memcpy(dst + got, memory_ + offset + got, step);
      }
    } else if (object_) {
      step = storage_->read_range(*object_, offset + got, n - got, dst + got);
    } else {
      const ssize_t r = ::pread(fd_, dst + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw DataError("cannot read " + path_ + " at byte " + std::to_string(offset + got) + ": " + std::strerror(errno));
      step = static_cast<std::size_t>(r);
    }
    if (step == 0)
      throw DataError(path_ + " ends at byte " + std::to_string(offset + got) + ", before the " + std::to_string(n) + " bytes from byte " +
                      std::to_string(offset) + " its footer names (truncated, or changed while it was read)");
    got += step;
  }
}

std::size_t ArrayRecordLayout::chunk_of(std::uint64_t record) const {
  const auto it = std::upper_bound(chunks.begin(), chunks.end(), record, [](std::uint64_t r, const ArrayRecordChunk& c) { return r < c.first_record; });
  return static_cast<std::size_t>(it - chunks.begin()) - 1;
}

std::pair<std::shared_ptr<Buffer>, std::size_t> ValueArena::take(std::size_t n) {
  if (n > kBlockBytes / 4) return {std::make_shared<Buffer>(n), 0};  // a large chunk: its own buffer
  if (!block_ || used_ + n > block_->size()) {
    block_ = std::make_shared<Buffer>(kBlockBytes);
    used_ = 0;
  }
  const std::size_t at = used_;
  used_ += n;
  return {block_, at};
}

namespace {
// decode_array_record_chunk's work; its DataErrors say what is wrong, and the caller names where.
void decode_chunk(const std::shared_ptr<Buffer>& stored, std::size_t at, std::size_t size, std::uint64_t begin, bool verify, DecodedChunk& out,
                  ValueArena* arena) {
  const Logical logical = strip_block_headers(stored, at, size, begin);
  if (logical.size < kChunkHeader) throw DataError("truncated (its header needs 40 bytes, " + std::to_string(logical.size) + " are there)");
  const std::byte* header = logical.data();
  if (riegeli_hash(header + 8, kChunkHeader - 8) != load_le64(header)) throw DataError("its header's hash does not match (damaged)");
  const std::uint64_t data_size = load_le64(header + 8), type_and_records = load_le64(header + 24), decoded_size = load_le64(header + 32);
  const auto type = static_cast<char>(type_and_records & 0xff);
  const std::uint64_t records = type_and_records >> 8;
  if (type == 't')
    throw DataError("a transposed chunk (written with transpose:true), whose encoding is not published; write the file with transpose:false");
  if (type != 'r') throw DataError("a chunk of type '" + std::string(1, type) + "' where records were expected (not a records chunk)");
  if (data_size > logical.size - kChunkHeader)
    throw DataError("truncated (its data has " + std::to_string(data_size) + " bytes, " + std::to_string(logical.size - kChunkHeader) + " are there)");
  const std::byte* data = header + kChunkHeader;
  if (verify && riegeli_hash(data, static_cast<std::size_t>(data_size)) != load_le64(header + 16))
    throw DataError("its data's hash does not match (damaged)");
  if (decoded_size > kMaxDecodedChunk)
    throw DataError("its records say they take " + std::to_string(decoded_size) + " bytes (over 1 GiB: damaged, or not an ArrayRecord file)");
  const std::byte* p = data;
  const std::byte* end = data + data_size;
  if (p == end) throw DataError("its data is empty");
  const auto compression = static_cast<RiegeliCompression>(*p++);
  if (compression != RiegeliCompression::None && compression != RiegeliCompression::Zstd && compression != RiegeliCompression::Brotli &&
      compression != RiegeliCompression::Snappy)
    throw DataError("an unknown compression (byte " + std::to_string(static_cast<int>(compression)) + ")");
  const auto sizes_size = get_varint(p, end);
  if (!sizes_size || *sizes_size > static_cast<std::uint64_t>(end - p)) throw DataError("its record sizes run past its data");
  const std::byte* sizes = p;
  std::size_t sizes_length = static_cast<std::size_t>(*sizes_size);
  p += sizes_length;
  thread_local std::string sizes_raw;  // (its memory kept from one chunk to the next)
  if (compression != RiegeliCompression::None) {
    const std::byte* q = sizes;
    const auto raw = get_varint(q, sizes + sizes_length);
    if (!raw || *raw > 10 * records + 10 || *raw > kMaxDecodedChunk) throw DataError("its record sizes say they decompress to a size they cannot have");
    sizes_raw.resize(static_cast<std::size_t>(*raw));
    decompress_block(compression, sizes, sizes_length, reinterpret_cast<std::byte*>(sizes_raw.data()), *raw, "record sizes");
    sizes = reinterpret_cast<const std::byte*>(sizes_raw.data());
    sizes_length = sizes_raw.size();
  }
  if (records > sizes_length) throw DataError("it says it holds " + std::to_string(records) + " records, more than its sizes can name");
  out.ends.clear();
  out.ends.reserve(static_cast<std::size_t>(records));
  std::uint64_t total = 0;
  for (const std::byte *q = sizes, *sizes_end = sizes + sizes_length; out.ends.size() < records;) {
    const auto n = get_varint(q, sizes_end);
    if (!n || *n > decoded_size - total) throw DataError("its record sizes do not add up to the " + std::to_string(decoded_size) + " bytes it says they take");
    total += *n;
    out.ends.push_back(total);
  }
  if (total != decoded_size) throw DataError("its record sizes add up to " + std::to_string(total) + " bytes where it says " + std::to_string(decoded_size));
  const std::size_t values_stored = static_cast<std::size_t>(end - p);
  if (compression == RiegeliCompression::None) {
    if (values_stored != decoded_size)
      throw DataError("its values take " + std::to_string(values_stored) + " bytes where its sizes say " + std::to_string(decoded_size));
    out.values = logical.buffer;
    out.at = logical.at + static_cast<std::size_t>(p - logical.data());
  } else {
    std::tie(out.values, out.at) = arena ? arena->take(static_cast<std::size_t>(decoded_size))
                                         : std::pair{std::make_shared<Buffer>(static_cast<std::size_t>(decoded_size)), std::size_t{0}};
    decompress_block(compression, p, values_stored, out.values->data() + out.at, decoded_size, "values");
  }
}
}  // namespace

void decode_array_record_chunk(const std::shared_ptr<Buffer>& stored, std::size_t at, std::size_t size, std::uint64_t begin,
                               const std::string& name, bool verify, DecodedChunk& out, ValueArena* arena) {
  // The file and chunk are named only when something is wrong: a string made per chunk cost as
  // much as decoding a chunk of one small record.
  try {
    decode_chunk(stored, at, size, begin, verify, out, arena);
  } catch (const DataError& e) {
    throw DataError(array_record_chunk_at(name, begin) + ": " + e.what());
  }
}

std::string array_record_chunk_at(const std::string& name, std::uint64_t offset) { return name + ", chunk at byte " + std::to_string(offset); }

ArrayRecordLayout read_array_record_layout(const PositionedFile& file) {
  ArrayRecordLayout layout;
  layout.file_size = file.size();
  const std::string& name = file.name();
  static const unsigned char signature[64] = {
      0x83, 0xaf, 0x70, 0xd1, 0x0d, 0x88, 0x4a, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xba, 0xc2, 0x3c, 0x92, 0x87, 0xe1, 0xa9,
      0, 0, 0, 0, 0, 0, 0, 0, 0xe1, 0x9f, 0x13, 0xc0, 0xe9, 0xb1, 0xc3, 0x72, 0x73, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::byte head[64];
  if (layout.file_size < 2 * kBlock) {
    const bool riegeli = layout.file_size >= 64 && (file.read(0, 64, head), std::memcmp(head, signature, 64) == 0);
    throw DataError(name + " is " + std::to_string(layout.file_size) + " bytes: " +
                    (riegeli ? "too short for an ArrayRecord file (its postscript fills the last 64 KiB; truncated?)"
                             : "not an ArrayRecord file (it does not begin with Riegeli's signature)"));
  }
  file.read(0, 64, head);
  if (std::memcmp(head, signature, 64) != 0) throw DataError(name + " is not an ArrayRecord file (it does not begin with Riegeli's signature)");
  const std::uint64_t postscript_at = layout.file_size - kBlock;
  if (postscript_at % kBlock != 0)
    throw DataError(name + " is " + std::to_string(layout.file_size) + " bytes, not a whole number of 64 KiB blocks: truncated, or written by an "
                           "ArrayRecord writer that did not finish");
  DecodedChunk postscript;
  try {
    postscript = read_chunk(file, postscript_at, layout.file_size);
  } catch (const DataError& e) {
    throw DataError(std::string(e.what()) + " (its postscript: truncated, or a writer that did not finish?)");
  }
  for (std::size_t i = 0; i < postscript.records() && !layout.footer_offset; ++i) {  // (three copies: the first intact one)
    std::vector<ProtoField> fields;
    if (!parse_proto(postscript.values->data() + postscript.begin_of(i), postscript.size_of(i), fields)) continue;
    if (field_or(fields, 2, 0) == kPostscriptMagic) layout.footer_offset = field_or(fields, 1, 0);
  }
  if (layout.footer_offset < 64 || layout.footer_offset >= postscript_at)
    throw DataError(array_record_chunk_at(name, postscript_at) + ": no postscript of ArrayRecord's names a footer before it (not an ArrayRecord file, or damaged)");
  const DecodedChunk footer = read_chunk(file, layout.footer_offset, postscript_at);
  const std::string where = array_record_chunk_at(name, layout.footer_offset) + " (its footer)";
  std::vector<ProtoField> metadata, inner;
  if (footer.records() == 0 || !parse_proto(footer.values->data() + footer.begin_of(0), footer.size_of(0), metadata))
    throw DataError(where + ": no metadata record");
  for (const auto& f : metadata)
    if (f.number == 1 && f.bytes && parse_proto(f.bytes, f.size, inner)) {
      for (const auto& g : inner)
        if (g.number == 4 && g.bytes) layout.writer_options.assign(reinterpret_cast<const char*>(g.bytes), g.size);
    }
  const std::uint64_t chunks = field_or(inner, 2, ~0ull), records = field_or(inner, 3, ~0ull);
  if (chunks != footer.records() - 1)
    throw DataError(where + ": it names " + std::to_string(footer.records() - 1) + " chunks where its metadata says " + std::to_string(chunks));
  layout.chunks.reserve(static_cast<std::size_t>(chunks));
  std::vector<ProtoField> fields;  // (one vector for every entry: a file of a million chunks has a million)
  for (std::size_t i = 1; i < footer.records(); ++i) {
    fields.clear();
    if (!parse_proto(footer.values->data() + footer.begin_of(i), footer.size_of(i), fields)) throw DataError(where + ": entry " + std::to_string(i - 1) + " is damaged");
    ArrayRecordChunk c{field_or(fields, 1, 0), 0, field_or(fields, 3, 0), layout.records};
    const std::uint64_t previous = layout.chunks.empty() ? 63 : layout.chunks.back().offset;
    if (c.offset <= previous || c.offset >= layout.footer_offset || c.records == 0 || c.records > layout.footer_offset)
      throw DataError(where + ": entry " + std::to_string(i - 1) + " names a chunk at byte " + std::to_string(c.offset) + " of " +
                      std::to_string(c.records) + " records, outside the file's records (damaged)");
    if (!layout.chunks.empty()) layout.chunks.back().end = c.offset;
    layout.records += c.records;
    layout.chunks.push_back(c);
  }
  if (!layout.chunks.empty()) layout.chunks.back().end = layout.footer_offset;
  if (records != layout.records)
    throw DataError(where + ": its chunks hold " + std::to_string(layout.records) + " records where its metadata says " + std::to_string(records));
  return layout;
}

ArrayRecordWriterOptions parse_array_record_options(const std::string& options) {
  ArrayRecordWriterOptions out;
  out.compression = RiegeliCompression::Zstd;  // the package's defaults: group_size:1, zstd:3
  out.level = 3;
  out.group_size = 1;
  std::string normalized_compression = "zstd:3";
  std::size_t start = 0;
  auto number = [&](const std::string& item, const std::string& text, long long low, long long high) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end || v < low || v > high)
      throw ParamError("options: '" + item + "' needs a number from " + std::to_string(low) + " to " + std::to_string(high));
    return v;
  };
  while (start <= options.size()) {
    std::size_t comma = options.find(',', start);
    if (comma == std::string::npos) comma = options.size();
    const std::string item = options.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    const std::string key = item.substr(0, colon), value = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (key == "group_size") {
      out.group_size = static_cast<std::uint64_t>(number(item, value, 1, 1ll << 32));
    } else if (key == "uncompressed" && value.empty()) {
      out.compression = RiegeliCompression::None;
      normalized_compression = "uncompressed";
    } else if (key == "zstd") {
      out.compression = RiegeliCompression::Zstd;
      out.level = value.empty() ? 3 : static_cast<int>(number(item, value, -131072, 22));
      normalized_compression = "zstd:" + std::to_string(out.level);
    } else if (key == "brotli") {
      out.compression = RiegeliCompression::Brotli;
      out.level = value.empty() ? 6 : static_cast<int>(number(item, value, 0, 11));
      normalized_compression = "brotli:" + std::to_string(out.level);
    } else if (key == "snappy" && value.empty()) {
      out.compression = RiegeliCompression::Snappy;
      normalized_compression = "snappy";
    } else if (key == "transpose" && value == "false") {
    } else if (key == "transpose" && value == "true") {
      throw ParamError("options: transpose:true writes transposed chunks, whose encoding is not published; Sluice writes transpose:false");
    } else if (key == "pad_to_block_boundary" && value == "false") {
    } else if ((key == "max_parallelism" || key == "window_log") && !value.empty()) {
      number(item, value, 0, 64);
    } else {
      throw ParamError("options: '" + item +
                       "' is not an ArrayRecord writer option (group_size:N, uncompressed, zstd[:LEVEL], brotli[:LEVEL], snappy, transpose:false)");
    }
  }
  out.text = "group_size:" + std::to_string(out.group_size) + ",transpose:false,pad_to_block_boundary:false," + normalized_compression +
             (out.compression == RiegeliCompression::Zstd ? ",window_log:20" : "") + ",max_parallelism:1";
  return out;
}

ArrayRecordEncoder::ArrayRecordEncoder(ArrayRecordWriterOptions options) : options_(std::move(options)) {
  append_chunk('s', 0, 0, "");  // the file signature: Riegeli's fixed first 64 bytes
}

void ArrayRecordEncoder::append_chunk(char type, std::uint64_t records, std::uint64_t decoded_size, const std::string& data) {
  const std::uint64_t begin = position_, end = chunk_end(begin, data.size(), records);
  std::string logical;
  logical.reserve(kChunkHeader + data.size());
  append_le64(logical, 0);
  append_le64(logical, data.size());
  append_le64(logical, riegeli_hash(data.data(), data.size()));
  append_le64(logical, static_cast<std::uint8_t>(type) | (records << 8));
  append_le64(logical, decoded_size);
  const std::uint64_t header_hash = riegeli_hash(logical.data() + 8, kChunkHeader - 8);
  std::memcpy(logical.data(), &header_hash, 8);
  logical += data;
  logical.resize(static_cast<std::size_t>(end - begin), '\0');  // (its padding: never more than it needs with its headers)
  std::size_t from = 0;
  for (std::uint64_t pos = begin; pos < end;) {
    if (pos % kBlock == 0) {
      std::string block;
      append_le64(block, 0);
      append_le64(block, pos - begin);
      append_le64(block, end - pos);
      const std::uint64_t hash = riegeli_hash(block.data() + 8, 16);
      std::memcpy(block.data(), &hash, 8);
      out_ += block;
      pos += kBlockHeader;
      continue;
    }
    const std::uint64_t take = std::min(end - pos, kBlock - pos % kBlock);
    out_.append(logical, from, static_cast<std::size_t>(take));
    from += static_cast<std::size_t>(take);
    pos += take;
  }
  position_ = end;
}

void ArrayRecordEncoder::add(const void* data, std::size_t size) {
  append_varint(sizes_, size);
  values_.append(static_cast<const char*>(data), size);
  ++records_;
  if (++pending_ == options_.group_size) flush();
}

void ArrayRecordEncoder::flush() {
  if (pending_ == 0) return;
  std::string data(1, static_cast<char>(options_.compression));
  const std::string sizes = compress_block(options_.compression, options_.level, sizes_);
  append_varint(data, sizes.size());
  data += sizes;
  data += compress_block(options_.compression, options_.level, values_);
  chunks_.push_back({position_, 0, pending_, records_ - pending_});
  decoded_sizes_.push_back(values_.size());
  append_chunk('r', pending_, values_.size(), data);
  sizes_.clear();
  values_.clear();
  pending_ = 0;
}

void ArrayRecordEncoder::finish() {
  flush();
  // The footer: RiegeliFooterMetadata {array_record_metadata {version, num_chunks, num_records,
  // the writer's options}}, then an ArrayRecordFooter {chunk_offset, decoded_data_size,
  // num_records} per chunk, as records of one simple chunk.
  std::string metadata, inner;
  inner += '\x08';
  append_varint(inner, 1);
  inner += '\x10';
  append_varint(inner, chunks_.size());
  inner += '\x18';
  append_varint(inner, records_);
  inner += '\x22';
  append_varint(inner, options_.text.size());
  inner += options_.text;
  metadata += '\x0a';
  append_varint(metadata, inner.size());
  metadata += inner;
  std::string footer_sizes, footer_values = metadata;
  append_varint(footer_sizes, metadata.size());
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    std::string entry;
    entry += '\x08';
    append_varint(entry, chunks_[i].offset);
    entry += '\x10';
    append_varint(entry, decoded_sizes_[i]);
    entry += '\x18';
    append_varint(entry, chunks_[i].records);
    append_varint(footer_sizes, entry.size());
    footer_values += entry;
  }
  std::string data(1, static_cast<char>(options_.compression));
  const std::string sizes = compress_block(options_.compression, options_.level, footer_sizes);
  append_varint(data, sizes.size());
  data += sizes;
  data += compress_block(options_.compression, options_.level, footer_values);
  const std::uint64_t footer_offset = position_;
  append_chunk('r', chunks_.size() + 1, footer_values.size(), data);
  // Padding to the next block, where the postscript begins: ArrayRecord's readers find it 64 KiB
  // before the file's end.
  auto pad_to_block = [&] {
    if (position_ % kBlock == 0) return;
    std::uint64_t target = position_ - position_ % kBlock + kBlock;
    if (target - position_ < kChunkHeader) target += kBlock;  // (no room for a header: the next block)
    const std::uint64_t headers = (target - position_ > kBlock - position_ % kBlock) ? kBlockHeader : 0;
    append_chunk('p', 0, 0, std::string(static_cast<std::size_t>(target - position_ - kChunkHeader - headers), '\0'));
  };
  pad_to_block();
  std::string postscript;
  postscript += '\x08';
  append_varint(postscript, footer_offset);
  postscript += '\x10';
  append_varint(postscript, kPostscriptMagic);
  std::string data_ps(1, '\0');
  append_varint(data_ps, 3);
  for (int copy = 0; copy < 3; ++copy) append_varint(data_ps, postscript.size());
  for (int copy = 0; copy < 3; ++copy) data_ps += postscript;
  append_chunk('r', 3, 3 * postscript.size(), data_ps);
  pad_to_block();
}

std::string ArrayRecordEncoder::saved() const {
  std::string out;
  append_le64(out, position_);
  append_le64(out, records_);
  append_le64(out, chunks_.size());
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    append_le64(out, chunks_[i].offset);
    append_le64(out, chunks_[i].records);
    append_le64(out, decoded_sizes_[i]);
  }
  return out;
}

void ArrayRecordEncoder::restore(const std::string& saved) {
  const auto* p = reinterpret_cast<const std::byte*>(saved.data());
  if (saved.size() < 24) throw DataError("an ArrayRecord writer's saved state is damaged");
  position_ = load_le64(p);
  records_ = load_le64(p + 8);
  const std::uint64_t chunks = load_le64(p + 16);
  if (saved.size() != 24 + 24 * chunks) throw DataError("an ArrayRecord writer's saved state is damaged");
  chunks_.clear();
  decoded_sizes_.clear();
  out_.clear();
  sizes_.clear();
  values_.clear();
  pending_ = 0;
  std::uint64_t first = 0;
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::byte* q = p + 24 + 24 * i;
    chunks_.push_back({load_le64(q), 0, load_le64(q + 8), first});
    first += chunks_.back().records;
    decoded_sizes_.push_back(load_le64(q + 16));
  }
}

}  // namespace sluice::io
