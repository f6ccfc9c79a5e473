#include "sluice/core/lineage.hpp"

#include <array>

#include "chunk_carrier.hpp"

namespace sluice {
namespace {

// The "deleter" of a stamped `where`: it keeps the record's `where` alive and says its epoch.
struct ReadEpoch {
  std::shared_ptr<const std::string> where;
  std::uint64_t epoch = 0;
  void operator()(const std::string*) const noexcept {}
};

RecordLineage record_lineage(const Origin& o) {
  return {o.where, o.record, o.byte_offset, read_epoch_of(o)};
}

}  // namespace

std::shared_ptr<const std::string> stamped_with_epoch(const std::shared_ptr<const std::string>& where, std::uint64_t epoch) {
  if (!where || std::get_deleter<ReadEpoch>(where) || std::get_deleter<OriginRecords>(where)) return where;
  // Consecutive records mostly share their file: the last few stamps are reused, so that a
  // stamp costs an allocation per file and epoch, not per record. (A cached stamp keeps its
  // `where` alive: its address cannot be another file's meanwhile.)
  struct Recent {
    const std::string* text = nullptr;
    std::uint64_t epoch = 0;
    std::shared_ptr<const std::string> stamped;
  };
  thread_local std::array<Recent, 8> recent;
  thread_local std::size_t next = 0;
  for (const Recent& r : recent)
    if (r.text == where.get() && r.epoch == epoch && r.stamped) return r.stamped;
  std::shared_ptr<const std::string> stamped(where.get(), ReadEpoch{where, epoch});
  recent[next++ % recent.size()] = Recent{where.get(), epoch, stamped};
  return stamped;
}

std::optional<std::uint64_t> read_epoch_of(const Origin& record) {
  const auto* stamp = std::get_deleter<ReadEpoch>(record.where);
  if (!stamp) return std::nullopt;
  return stamp->epoch;
}

std::vector<RowLineage> lineage_of(const Origin& output) {
  std::vector<RowLineage> rows;
  const OriginRecords* carried = records_carried(output);
  auto row_of = [](const Origin& o) {
    RowLineage row;
    const OriginRecords* parts = records_carried(o);
    if (parts && parts->parts) {
      row.zipped = true;
      for (const Origin& part : parts->records) row.parts.push_back(record_lineage(part));
    } else {
      row.parts.push_back(record_lineage(o));
    }
    return row;
  };
  if (carried && !carried->parts) {
    rows.reserve(carried->records.size());
    for (const Origin& r : carried->records) rows.push_back(row_of(r));
  } else {
    rows.push_back(row_of(output));
  }
  return rows;
}

}  // namespace sluice

namespace sluice::detail {

void stamp_read_epoch(Sample& element, std::uint64_t epoch) {
  if (Chunk* chunk = chunk_in(element)) chunk->set_where(stamped_with_epoch(chunk->where(), epoch));
  const Origin origin = element.shared_origin();
  if (!origin.where) return;
  element.set_origin(stamped_with_epoch(origin.where, epoch), origin.record, origin.byte_offset);
  element.set_read_position(origin.read_epoch, origin.read_index);  // (set_origin forgot them)
}

}  // namespace sluice::detail
