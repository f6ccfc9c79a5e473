#pragma once
// Lineage: which records made an output, and the epoch each was read in. The records ride with
// the output's origin (sluice/origin_rows.hpp: the rows of a batch, the parts of a zipped
// element); the epoch rides with each record's `where` when the run follows lineage
// (EngineOptions::lineage): sources and interleaves stamp what they give. A stamped `where` points
// at the same text, so every comparison of origins by their `where` is unchanged.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/origin_rows.hpp"
#include "sluice/sample.hpp"

namespace sluice {

// The key a random stage drew a record's numbers with (ElementContext: the stage's seed, the
// epoch and the element's index at the stage's input): replay draws with the same.
struct DrawKey {
  const std::string* stage = nullptr;  // its id (interned: lives as long as the process)
  std::uint64_t epoch = 0, index = 0;
};

// `where` stamped with the epoch its records were read in; an origin already stamped, or one
// carrying the records of several (a batch unbatched again), keeps what it has. Thread-safe.
std::shared_ptr<const std::string> stamped_with_epoch(const std::shared_ptr<const std::string>& where, std::uint64_t epoch);

// The epoch a record was read in, where the run stamped it.
std::optional<std::uint64_t> read_epoch_of(const Origin& record);

// `where` with one more random stage's key (a map of a run that follows lineage); a `where`
// carrying several records (a batch) is left as it is. The text it points at stays the same.
std::shared_ptr<const std::string> with_draw_key(const std::shared_ptr<const std::string>& where, const std::string& stage,
                                                 std::uint64_t epoch, std::uint64_t index);
std::vector<DrawKey> draw_keys_of(const Origin& record);
// The same id for the same text, for the life of the process.
const std::string* interned_stage_id(const std::string& id);

// One record of an output.
struct RecordLineage {
  std::shared_ptr<const std::string> where;  // its file or object (empty: an element made by no reader)
  std::int64_t record = -1, byte_offset = -1;
  std::optional<std::uint64_t> epoch;
  std::vector<DrawKey> keys;  // of each random map it went through, in order
};
// One row of an output: its record, or one per input of a zip.
struct RowLineage {
  std::vector<RecordLineage> parts;
  bool zipped = false;
};
// The rows of an output with origin `output`: each row of a batch, or the element itself.
std::vector<RowLineage> lineage_of(const Origin& output);

// An output's lineage as bytes, for where its origin cannot go (the service's element messages:
// a worker's elements reach the trainer with their records and epochs), and the origin made
// again from them: the same rows, parts and epoch stamps. Throws DataError naming `what` when the
// bytes are damaged.
std::string lineage_bytes(const Origin& output);
Origin origin_of_lineage_bytes(std::string_view bytes, const std::string& what);

}  // namespace sluice
