#pragma once
// ArrayRecord files (Grain's and TFDS's), read and written from the published specifications:
// Riegeli's records format (a file of chunks, interrupted every 64 KiB by a 24-byte block header;
// a chunk's 40-byte header and its data each carry a HighwayHash) and ArrayRecord's layout on it
// (one simple chunk per group of records, then a footer chunk naming each group's chunk, then a
// postscript chunk in the file's last 64 KiB naming the footer). Transposed chunks (Riegeli's
// columnar encoding of protos, `transpose:true`) are refused by name: their encoding is not
// published.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/buffer.hpp"
#include "sluice/storage.hpp"
#include "tfrecord.hpp"

namespace sluice::io {

// A file read at any byte, from any thread: a local file (positioned reads) or an object in
// remote storage (ranged requests). Throws DataError naming it when it cannot be opened.
class PositionedFile {
 public:
  PositionedFile(std::string path, Storage* storage);
  // Bytes in memory, named `name` (tests and fuzzing); they must outlive it.
  PositionedFile(std::string name, const void* data, std::size_t size);
  ~PositionedFile();
  PositionedFile(const PositionedFile&) = delete;
  PositionedFile& operator=(const PositionedFile&) = delete;
  const std::string& name() const { return path_; }
  std::uint64_t size() const { return size_; }
  // Exactly n bytes at `offset`, or a DataError naming the file (it ends before them).
  void read(std::uint64_t offset, std::size_t n, std::byte* dst) const;

 private:
  std::string path_;
  Storage* storage_ = nullptr;
  std::optional<StoredObject> object_;
  int fd_ = -1;
  const std::byte* memory_ = nullptr;
  std::uint64_t size_ = 0;
};

enum class RiegeliCompression : std::uint8_t { None = 0, Brotli = 'b', Zstd = 'z', Snappy = 's' };

// One group of records: its chunk's first byte and the first byte past its stored extent.
struct ArrayRecordChunk {
  std::uint64_t offset = 0, end = 0;
  std::uint64_t records = 0, first_record = 0;
};

// What the footer says of a file.
struct ArrayRecordLayout {
  std::uint64_t file_size = 0, footer_offset = 0, records = 0;
  std::vector<ArrayRecordChunk> chunks;
  std::string writer_options;  // as the writer recorded them ("group_size:1,...,zstd:3")
  // The chunk holding record `record` (< records).
  std::size_t chunk_of(std::uint64_t record) const;
};

// Reads the postscript and the footer. Damage (a hash that does not match, a postscript without
// ArrayRecord's magic, a footer that disagrees with itself or with the file's size) is a DataError
// naming the file and the byte.
ArrayRecordLayout read_array_record_layout(const PositionedFile& file);

// A chunk's records after decoding: their values one after another in `values` from `at`, record
// i between ends[i-1] (0 for the first) and ends[i].
struct DecodedChunk {
  std::shared_ptr<Buffer> values;
  std::size_t at = 0;
  std::vector<std::uint64_t> ends;
  std::size_t records() const { return ends.size(); }
  std::size_t begin_of(std::size_t i) const { return at + (i == 0 ? 0 : static_cast<std::size_t>(ends[i - 1])); }
  std::size_t size_of(std::size_t i) const { return static_cast<std::size_t>(ends[i] - (i == 0 ? 0 : ends[i - 1])); }
};

// Where a reader decodes small chunks' values: one after another in blocks of 256 KiB, so that a
// file of one record per chunk (the package's default) costs an allocation per block, not per
// record. A block lives as long as a record viewing it.
class ValueArena {
 public:
  // Room for `n` bytes: the buffer and where in it.
  std::pair<std::shared_ptr<Buffer>, std::size_t> take(std::size_t n);

 private:
  static constexpr std::size_t kBlockBytes = 1 << 18;
  std::shared_ptr<Buffer> block_;
  std::size_t used_ = 0;
};

// Decodes the chunk whose stored bytes (block headers included) are `stored` from `at`, `size` of
// them, the chunk beginning at byte `begin` of the file, into `out` (its `ends` keep their
// memory from one chunk to the next). Uncompressed values stay views of `stored`; compressed
// ones go to `arena` when given. Damage is a DataError saying what, naming `name`, the chunk and
// the byte; `verify` checks the data's hash too (the header's always is).
void decode_array_record_chunk(const std::shared_ptr<Buffer>& stored, std::size_t at, std::size_t size, std::uint64_t begin,
                               const std::string& name, bool verify, DecodedChunk& out, ValueArena* arena = nullptr);
inline DecodedChunk decode_array_record_chunk(const std::shared_ptr<Buffer>& stored, std::size_t at, std::size_t size, std::uint64_t begin,
                                              const std::string& name, bool verify) {
  DecodedChunk out;
  decode_array_record_chunk(stored, at, size, begin, name, verify, out);
  return out;
}

// How damage is placed in messages: "FILE, chunk at byte N".
std::string array_record_chunk_at(const std::string& name, std::uint64_t offset);

// Consecutive chunks of a file, decoded: their records, one after another.
struct DecodedBatch {
  struct Ref {
    std::size_t buffer = 0, at = 0, size = 0;  // in buffers[buffer], from byte at
  };
  struct ChunkRecords {
    std::size_t first_ref = 0, records = 0;
    std::string damage;  // what is wrong with the chunk ("FILE, chunk at byte N: ..."); empty when whole
  };
  std::size_t first_chunk = 0;        // of the layout
  std::vector<ChunkRecords> chunks;   // chunks first_chunk... in order
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<Ref> refs;
  std::exception_ptr failure;  // a failure that is not a chunk's damage (a remote read refused): thrown where it is reached
  std::size_t end_chunk() const { return first_chunk + chunks.size(); }
};

// A file's records in order (array_record_reader, tfds_reader): the footer read first, then runs
// of consecutive chunks read with one read each (up to span_bytes, at least one chunk), decoded a
// batch of chunks at a time. While the caller takes one batch's records, a thread of the stream
// reads and decodes the next, as the array-record package's own reader decodes ahead: a file of
// one record per chunk (its default) costs more to decode than to hand on. A Record's file_offset
// is its chunk's first byte. A damaged chunk is reported by file, chunk and byte when its turn
// comes: skipped with its records, or thrown.
class ArrayRecordStream final : public RecordStream {
 public:
  ArrayRecordStream(const std::string& path, Storage* storage, bool verify, std::size_t span_bytes, Allocator* allocator);
  ArrayRecordStream(std::unique_ptr<PositionedFile> file, bool verify, std::size_t span_bytes, Allocator* allocator);
  ~ArrayRecordStream() override;
  bool next(Record& out, DamageReport* damage) override;
  std::uint64_t records_read() const override { return read_; }
  bool seek(std::uint64_t index, std::uint64_t file_offset) override;
  const ArrayRecordLayout& layout() const { return layout_; }

 private:
  class DecodeAhead;
  bool next_chunk(DamageReport* damage);
  DecodedBatch take_batch(std::size_t first);
  DecodedBatch decode_batch(std::size_t first, const std::atomic<bool>& cancel);
  void read_alone(DecodedBatch& batch, std::size_t last, const std::atomic<bool>& cancel);
  std::shared_ptr<Buffer> room_for(std::size_t size) const;
  void add_chunk(DecodedBatch& batch, const std::shared_ptr<Buffer>& stored, std::size_t at, const ArrayRecordChunk& chunk);
  std::unique_ptr<PositionedFile> file_;
  ArrayRecordLayout layout_;
  bool verify_;
  std::size_t span_bytes_;
  Allocator* allocator_;
  // The decoding thread's: the run of chunks last read, and where it decodes.
  static constexpr std::size_t kBatchChunks = 1024, kBatchBytes = 1 << 18;
  std::shared_ptr<Buffer> stored_;
  std::uint64_t stored_offset_ = 0;
  std::size_t stored_first_ = 0, stored_end_ = 0;  // its chunks
  ValueArena arena_;
  DecodedChunk scratch_;
  DecodedBatch batch_;     // the batch being read
  std::size_t chunk_ = 0;  // the next of batch_.chunks to take
  std::size_t row_ = 0, rows_ = 0, first_ref_ = 0;
  std::uint64_t first_record_ = 0, chunk_offset_ = 0, read_ = 0;
  static constexpr std::size_t kNothingRequested = ~std::size_t{0};
  std::size_t requested_ = kNothingRequested;  // the batch asked of the thread, not taken yet
  std::unique_ptr<DecodeAhead> ahead_;  // last: its thread uses the members above
};

// How a writer encodes its chunks: the options string the array-record package takes
// ("group_size:N", "uncompressed", "zstd[:LEVEL]", "brotli[:LEVEL]", "snappy"); throws
// ParamError for anything else (transpose:true among it).
struct ArrayRecordWriterOptions {
  std::uint64_t group_size = 65536;
  RiegeliCompression compression = RiegeliCompression::Brotli;
  int level = 6;
  std::string text;  // recorded in the footer, as the package records its own
};
ArrayRecordWriterOptions parse_array_record_options(const std::string& options);

// Builds an ArrayRecord file as a stream of bytes: add() records, take() what is ready to write,
// finish() the footer and postscript. A writer can be saved between groups and continued from its
// state (checkpoints): flush() ends the group being built.
class ArrayRecordEncoder {
 public:
  explicit ArrayRecordEncoder(ArrayRecordWriterOptions options);
  void add(const void* data, std::size_t size);
  void flush();                  // the records added so far into a chunk of their own
  void finish();                 // flush(), then the footer, padding and postscript
  std::string& ready() { return out_; }  // bytes to append to the file (clear them once written)
  std::uint64_t position() const { return position_; }  // the file's size once ready() is written
  std::uint64_t records() const { return records_; }
  // The state between groups: position and chunks written. (No group may be pending: flush() first.)
  std::string saved() const;
  void restore(const std::string& saved);

 private:
  void append_chunk(char type, std::uint64_t records, std::uint64_t decoded_size, const std::string& data);
  ArrayRecordWriterOptions options_;
  std::string out_;
  std::uint64_t position_ = 0, records_ = 0;
  std::string sizes_, values_;
  std::uint64_t pending_ = 0;
  std::vector<ArrayRecordChunk> chunks_;
  std::vector<std::uint64_t> decoded_sizes_;
};

}  // namespace sluice::io
