#pragma once
// TFRecord framing: u64 little-endian length, masked CRC-32C of those 8 bytes, the data, masked
// CRC-32C of the data. Records come out as views of large read buffers (no copy per record).
#include <cstdint>
#include <memory>
#include <string>

#include "byte_source.hpp"
#include "sluice/sdk.hpp"

namespace sluice::io {

struct Record {
  std::shared_ptr<Buffer> buffer;
  std::size_t offset = 0;  // of the data within buffer
  std::size_t length = 0;
  std::uint64_t index = 0;        // record number in the file
  std::uint64_t file_offset = 0;  // byte offset of the record's header (uncompressed stream)
  const std::byte* data() const { return buffer->data() + offset; }
};

struct RecordReaderOptions {
  bool verify_crc = true;
  std::size_t chunk_bytes = 4u << 20;
  std::uint64_t max_record_bytes = 1ull << 30;
  Allocator* allocator = nullptr;  // for read buffers; null: plain host memory
};

// A file's records one after another: TFRecord's (RecordReader) or ArrayRecord's
// (ArrayRecordStream, array_record.hpp), as the readers and tfds_reader take them.
class RecordStream {
 public:
  virtual ~RecordStream() = default;
  // The next record, or false at the end; damage goes to `damage` (null: thrown as DataError).
  virtual bool next(Record& out, DamageReport* damage) = 0;
  virtual std::uint64_t records_read() const = 0;
  // Goes to the record numbered `index` at `file_offset` (as a Record read earlier said); false
  // when it cannot, and nothing moved.
  virtual bool seek(std::uint64_t index, std::uint64_t file_offset) = 0;
};

class RecordReader final : public RecordStream {
 public:
  RecordReader(std::unique_ptr<ByteSource> source, std::string name, RecordReaderOptions options = {});

  // The next record, or false at the end. Damage (bad length CRC, bad data CRC, truncation) is
  // described to `damage` with the file, record index and byte offset: under the skip policy
  // reading goes on where it safely can (after a bad data CRC, at the next record; after a bad
  // length, at the next offset where a valid header starts); otherwise a DataError is thrown.
  bool next(Record& out, DamageReport* damage) override;

  std::uint64_t records_read() const override { return index_; }
  // Goes to the record numbered `index` whose header starts at byte `file_offset` (as a Record
  // read earlier said): within the bytes buffered, without reading; else by seeking the source.
  // False when the source cannot seek (compressed).
  bool seek(std::uint64_t index, std::uint64_t file_offset) override;

  // The whole file as one memory mapping, when it was mapped; null otherwise.

 private:
  bool ensure(std::size_t n);  // at least n unread bytes buffered; false at the end
  bool ensure_in_mapping(std::size_t n);  // ensure() for a record larger than a chunk
  void damaged(const std::string& what, DamageReport* damage);
  bool resynchronise();

  std::unique_ptr<ByteSource> source_;
  std::string name_;
  RecordReaderOptions options_;
  std::shared_ptr<Buffer> chunk_;
  std::size_t begin_ = 0, end_ = 0;
  std::uint64_t chunk_offset_ = 0;  // stream offset of chunk_[0]
  bool eof_ = false;
  std::uint64_t index_ = 0;
};

// Frames `data` as one TFRecord (header, data, CRCs) appended to `out`.
void append_record(std::string& out, const void* data, std::size_t size);

}  // namespace sluice::io
