// ArrayRecordStream: a file's records in order, the next batch of chunks decoded ahead on a
// thread of the stream. See array_record.hpp.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "array_record.hpp"
#include "sluice/error.hpp"

namespace sluice::io {

// One thread that decodes the batch of chunks asked for while the stream hands out the one
// before. One batch is asked for at a time; take() waits for it.
class ArrayRecordStream::DecodeAhead {
 public:
  using Decode = std::function<DecodedBatch(std::size_t first, const std::atomic<bool>& cancel)>;
  explicit DecodeAhead(Decode decode) : decode_(std::move(decode)), thread_([this] { serve(); }) {}
  ~DecodeAhead() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
      cancel_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void request(std::size_t first) {
    {
      std::lock_guard lock(mutex_);
      job_ = first;
    }
    wake_.notify_all();
  }
  DecodedBatch take() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return result_.has_value(); });
    DecodedBatch out = std::move(*result_);
    result_.reset();
    return out;
  }
  // Forgets the batch asked for: a decoding in progress stops between chunks and is thrown away.
  void drop() {
    std::unique_lock lock(mutex_);
    job_.reset();
    cancel_ = true;
    done_.wait(lock, [&] { return !busy_; });
    result_.reset();
    cancel_ = false;
  }

 private:
  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return quit_ || job_.has_value(); });
      if (quit_) return;
      const std::size_t first = *job_;
      job_.reset();
      busy_ = true;
      lock.unlock();
      DecodedBatch batch;
      try {
        batch = decode_(first, cancel_);
      } catch (...) {
        batch = DecodedBatch{};
        batch.first_chunk = first;
        batch.failure = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (!cancel_) result_ = std::move(batch);
      done_.notify_all();
    }
  }
  Decode decode_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::optional<std::size_t> job_;
  std::optional<DecodedBatch> result_;
  std::atomic<bool> cancel_{false};
  bool busy_ = false, quit_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

ArrayRecordStream::ArrayRecordStream(const std::string& path, Storage* storage, bool verify, std::size_t span_bytes, Allocator* allocator)
    : ArrayRecordStream(std::make_unique<PositionedFile>(path, storage), verify, span_bytes, allocator) {}
ArrayRecordStream::ArrayRecordStream(std::unique_ptr<PositionedFile> file, bool verify, std::size_t span_bytes, Allocator* allocator)
    : file_(std::move(file)), layout_(read_array_record_layout(*file_)), verify_(verify), span_bytes_(span_bytes), allocator_(allocator) {}
ArrayRecordStream::~ArrayRecordStream() = default;

bool ArrayRecordStream::next(Record& out, DamageReport* damage) {
  while (row_ == rows_)
    if (!next_chunk(damage)) return false;
  const DecodedBatch::Ref& ref = batch_.refs[first_ref_ + row_];
  out.buffer = batch_.buffers[ref.buffer];
  out.offset = ref.at;
  out.length = ref.size;
  out.index = first_record_ + row_;
  out.file_offset = chunk_offset_;
  ++row_;
  read_ = out.index + 1;
  return true;
}

bool ArrayRecordStream::seek(std::uint64_t index, std::uint64_t file_offset) {
  if (index >= layout_.records) return false;
  const std::size_t k = layout_.chunk_of(index);
  if (layout_.chunks[k].offset != file_offset) return false;
  batch_ = DecodedBatch{};
  batch_.first_chunk = k;
  chunk_ = 0;
  row_ = rows_ = 0;
  if (!next_chunk(nullptr)) return false;
  row_ = static_cast<std::size_t>(index - first_record_);
  read_ = index;
  return true;
}

// The next whole chunk made current, taking the next batch when this one is done; a damaged chunk is
// reported (and skipped, or thrown) as its turn comes.
bool ArrayRecordStream::next_chunk(DamageReport* damage) {
  for (;;) {
    while (chunk_ == batch_.chunks.size()) {
      if (batch_.end_chunk() >= layout_.chunks.size()) return false;
      batch_ = take_batch(batch_.end_chunk());
      chunk_ = 0;
    }
    const DecodedBatch::ChunkRecords& decoded = batch_.chunks[chunk_];
    const ArrayRecordChunk& chunk = layout_.chunks[batch_.first_chunk + chunk_];
    ++chunk_;
    if (!decoded.damage.empty()) {
      if (!damage || !damage->skip_damaged(decoded.damage + "; its " + std::to_string(chunk.records) + " records skipped")) throw DataError(decoded.damage);
      continue;
    }
    row_ = 0;
    rows_ = decoded.records;
    first_ref_ = decoded.first_ref;
    first_record_ = chunk.first_record;
    chunk_offset_ = chunk.offset;
    if (rows_ > 0) return true;
  }
}

// The batch starting at chunk `first`, decoded (by the thread, which then starts on the next).
DecodedBatch ArrayRecordStream::take_batch(std::size_t first) {
  if (!ahead_) ahead_ = std::make_unique<DecodeAhead>([this](std::size_t from, const std::atomic<bool>& cancel) { return decode_batch(from, cancel); });
  if (requested_ != first) {
    if (requested_ != kNothingRequested) ahead_->drop();
    ahead_->request(first);
  }
  DecodedBatch batch = ahead_->take();
  requested_ = kNothingRequested;
  if (batch.failure) std::rethrow_exception(batch.failure);  // (asked for again by the next call)
  if (batch.end_chunk() < layout_.chunks.size()) {
    ahead_->request(batch.end_chunk());
    requested_ = batch.end_chunk();
  }
  return batch;
}

// On the decoding thread: chunks from `first` decoded, up to kBatchChunks of them or kBatchBytes
// of their stored bytes (at least one), so that the caller waits for little more than a batch at a
// file's start. Their bytes come from the run of chunks last read (up to span_bytes_, one read),
// else a new run is read from `first`; if that read fails, the run's chunks are read one by one,
// so that those that can be read still are.
DecodedBatch ArrayRecordStream::decode_batch(std::size_t first, const std::atomic<bool>& cancel) {
  DecodedBatch batch;
  batch.first_chunk = first;
  if (first < stored_first_ || first >= stored_end_) {
    std::size_t last = first + 1;
    const std::uint64_t begin = layout_.chunks[first].offset;
    while (last < layout_.chunks.size() && layout_.chunks[last].end - begin <= span_bytes_) ++last;
    const auto size = static_cast<std::size_t>(layout_.chunks[last - 1].end - begin);
    stored_.reset();  // (its memory back to the pool before the next is taken)
    stored_first_ = stored_end_ = 0;
    auto stored = room_for(size);
    try {
      file_->read(begin, size, stored->data());
    } catch (const DataError&) {
      read_alone(batch, last, cancel);
      return batch;
    }
    stored_ = std::move(stored);
    stored_offset_ = begin;
    stored_first_ = first;
    stored_end_ = last;
  }
  std::size_t last = first;
  for (std::uint64_t bytes = 0; last < stored_end_ && (last == first || (last - first < kBatchChunks && bytes < kBatchBytes)); ++last)
    bytes += layout_.chunks[last].end - layout_.chunks[last].offset;
  for (std::size_t k = first; k < last && !cancel; ++k) add_chunk(batch, stored_, static_cast<std::size_t>(layout_.chunks[k].offset - stored_offset_), layout_.chunks[k]);
  return batch;
}

// The chunks from batch.first_chunk to `last` each read alone: each that cannot be read is damaged.
void ArrayRecordStream::read_alone(DecodedBatch& batch, std::size_t last, const std::atomic<bool>& cancel) {
  for (std::size_t k = batch.first_chunk; k < last && !cancel; ++k) {
    const ArrayRecordChunk& chunk = layout_.chunks[k];
    const auto size = static_cast<std::size_t>(chunk.end - chunk.offset);
    auto alone = room_for(size);
    try {
      file_->read(chunk.offset, size, alone->data());
    } catch (const DataError& e) {
      batch.chunks.push_back({batch.refs.size(), 0, e.what()});
      continue;
    }
    add_chunk(batch, alone, 0, chunk);
  }
}

// Memory for `size` stored bytes: the reader's pool when it has one.
std::shared_ptr<Buffer> ArrayRecordStream::room_for(std::size_t size) const {
  return allocator_ ? allocator_->allocate(size) : std::make_shared<Buffer>(size);
}

// On the decoding thread: `chunk`, stored in `stored` from `at`, decoded and its records added.
void ArrayRecordStream::add_chunk(DecodedBatch& batch, const std::shared_ptr<Buffer>& stored, std::size_t at, const ArrayRecordChunk& chunk) {
  DecodedBatch::ChunkRecords& out = batch.chunks.emplace_back();
  out.first_ref = batch.refs.size();
  try {
    decode_array_record_chunk(stored, at, static_cast<std::size_t>(chunk.end - chunk.offset), chunk.offset, file_->name(), verify_, scratch_, &arena_);
    if (scratch_.records() != chunk.records)
      throw DataError(array_record_chunk_at(file_->name(), chunk.offset) + ": holds " + std::to_string(scratch_.records()) +
                      " records where the footer says " + std::to_string(chunk.records) + " (damaged)");
  } catch (const DataError& e) {
    out.damage = e.what();
    return;
  }
  if (batch.buffers.empty() || batch.buffers.back() != scratch_.values) batch.buffers.push_back(scratch_.values);
  const std::size_t buffer = batch.buffers.size() - 1;
  for (std::size_t i = 0; i < scratch_.records(); ++i) batch.refs.push_back({buffer, scratch_.begin_of(i), scratch_.size_of(i)});
  out.records = scratch_.records();
}

}  // namespace sluice::io
