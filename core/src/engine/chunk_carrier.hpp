#pragma once
// How a chunk (sluice/chunk.hpp) travels through the engine: as a Sample with one field whose
// buffer owns the chunk. Channels, an interleave's read-ahead queues, ordered commits and byte
// limits then handle it as they handle any element (its size is the chunk's), and only the code
// that counts elements or calls operators looks inside. No operator ever sees a carrier: a stage
// that takes chunks is given the chunk, and a producer splits its chunks into elements for a
// reader that does not take them.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "channel.hpp"
#include "sluice/chunk.hpp"

namespace sluice::detail {

inline constexpr std::string_view kChunkField = "\x01sluice:chunk";

struct ChunkHolder final : Buffer {
  explicit ChunkHolder(Chunk c) : Buffer(nullptr, c.nbytes(), {}), chunk(std::move(c)) {}
  Chunk chunk;
};

inline Sample carry(Chunk chunk) {
  const Origin first = chunk.origin(0);
  auto holder = std::make_shared<ChunkHolder>(std::move(chunk));
  const std::size_t bytes = holder->size();
  Sample sample;
  sample.set(std::string(kChunkField), Tensor::bytes_view(std::move(holder), 0, bytes));
  if (first.where) sample.set_origin(first.where, first.record, first.byte_offset);
  return sample;
}

inline Chunk* chunk_in(Sample& sample) {
  auto& fields = sample.fields();
  if (fields.size() != 1 || fields[0].name != kChunkField) return nullptr;
  return &static_cast<ChunkHolder*>(fields[0].tensor.buffer().get())->chunk;
}
inline const Chunk* chunk_in(const Sample& sample) { return chunk_in(const_cast<Sample&>(sample)); }

// Elements an item stands for: a chunk's rows, else one.
inline std::size_t rows_of(const Sample& sample) {
  const Chunk* chunk = chunk_in(sample);
  return chunk ? chunk->rows() : 1;
}
inline std::uint64_t rows_of(const std::vector<Item>& items) {
  std::uint64_t n = 0;
  for (const auto& item : items) n += item.is_element() ? rows_of(item.sample) : 0;
  return n;
}

// Appends `chunk` to `out`: as itself for a reader that takes chunks, else row by row.
inline void hand_on(Chunk&& chunk, bool as_chunk, std::vector<Item>& out) {
  if (chunk.rows() == 0) return;
  if (as_chunk) {
    out.push_back(Item::element(carry(std::move(chunk))));
    return;
  }
  for (std::size_t r = 0; r < chunk.rows(); ++r) out.push_back(Item::element(chunk.row(r)));
}

// (EngineOptions::lineage) The element's records (a chunk's rows) stamped as read in `epoch`
// (sluice/core/lineage.hpp): by the source or interleave that read them.
void stamp_read_epoch(Sample& element, std::uint64_t epoch);
// (EngineOptions::lineage) The key random map `stage` drew the element's numbers with.
void stamp_draw_key(Sample& element, const std::string& stage, std::uint64_t epoch, std::uint64_t index);

}  // namespace sluice::detail
