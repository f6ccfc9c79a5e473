#include "sluice/core/lineage.hpp"

#include <array>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "checkpoint.pb.h"
#include "chunk_carrier.hpp"
#include "sluice/error.hpp"

namespace sluice {
namespace {

// The "deleter" of a stamped `where`: it keeps the record's `where` alive and says its epoch.
struct ReadEpoch {
  std::shared_ptr<const std::string> where;
  std::uint64_t epoch = 0;
  void operator()(const std::string*) const noexcept {}
};

// The "deleter" of a `where` with random stages' keys: it keeps the `where` it wraps alive
// (stamped with its epoch) and holds the keys, every earlier one included.
struct DrawKeys {
  std::shared_ptr<const std::string> where;
  std::vector<DrawKey> keys;
  void operator()(const std::string*) const noexcept {}
};

RecordLineage record_lineage(const Origin& o) {
  return {o.where, o.record, o.byte_offset, read_epoch_of(o), draw_keys_of(o)};
}

}  // namespace

std::shared_ptr<const std::string> stamped_with_epoch(const std::shared_ptr<const std::string>& where, std::uint64_t epoch) {
  if (!where || std::get_deleter<ReadEpoch>(where) || std::get_deleter<OriginRecords>(where) || std::get_deleter<DrawKeys>(where)) return where;
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
  const std::shared_ptr<const std::string>* where = &record.where;
  if (const auto* keyed = std::get_deleter<DrawKeys>(*where)) where = &keyed->where;
  const auto* stamp = std::get_deleter<ReadEpoch>(*where);
  if (!stamp) return std::nullopt;
  return stamp->epoch;
}

const std::string* interned_stage_id(const std::string& id) {
  static std::mutex mutex;
  static std::set<std::string> ids;  // (never shrinks: a process names few stages)
  std::lock_guard lock(mutex);
  return &*ids.insert(id).first;
}

std::shared_ptr<const std::string> with_draw_key(const std::shared_ptr<const std::string>& where, const std::string& stage,
                                                 std::uint64_t epoch, std::uint64_t index) {
  if (!where || std::get_deleter<OriginRecords>(where)) return where;
  DrawKeys keyed;
  if (const auto* earlier = std::get_deleter<DrawKeys>(where)) {
    keyed = *earlier;
  } else {
    keyed.where = where;
  }
  keyed.keys.push_back({interned_stage_id(stage), epoch, index});
  return std::shared_ptr<const std::string>(where.get(), std::move(keyed));
}

std::vector<DrawKey> draw_keys_of(const Origin& record) {
  const auto* keyed = std::get_deleter<DrawKeys>(record.where);
  return keyed ? keyed->keys : std::vector<DrawKey>{};
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

namespace {

void add_lineage(const Origin& origin, checkpoint::Lineage& lineage, std::map<const std::string*, std::uint32_t>& files,
                 checkpoint::LineageNode& node) {
  if (origin.where && !origin.where->empty()) {
    const auto [it, added] = files.emplace(origin.where.get(), static_cast<std::uint32_t>(files.size() + 1));
    if (added) lineage.add_files(*origin.where);
    node.set_file(it->second);
  }
  node.set_record(origin.record);
  node.set_byte_offset(origin.byte_offset);
  if (const auto epoch = read_epoch_of(origin)) node.set_read_epoch(*epoch);
  for (const DrawKey& key : draw_keys_of(origin)) {
    auto* k = node.add_keys();
    k->set_stage(*key.stage);
    k->set_epoch(key.epoch);
    k->set_index(key.index);
  }
  if (const OriginRecords* carried = records_carried(origin)) {
    node.set_parts(carried->parts);
    for (const Origin& record : carried->records) add_lineage(record, lineage, files, *node.add_records());
  }
}

// A file's name as the records of it already decoded on this thread share it: one `where` per
// file (and one stamp per file and epoch), as a reader makes them, not one per message.
std::shared_ptr<const std::string> shared_name(const std::string& name) {
  thread_local std::array<std::shared_ptr<const std::string>, 16> recent;
  thread_local std::size_t next = 0;
  for (const auto& r : recent)
    if (r && *r == name) return r;
  auto made = std::make_shared<const std::string>(name);
  recent[next++ % recent.size()] = made;
  return made;
}

Origin origin_of_node(const checkpoint::LineageNode& node, const std::vector<std::shared_ptr<const std::string>>& files,
                      const std::string& what) {
  Origin origin;
  if (node.file() > files.size())
    throw DataError(fmt::format("{} is damaged: its lineage names file {} of {}", what, node.file(), files.size()));
  if (node.file() > 0) origin.where = files[node.file() - 1];
  if (origin.where && node.has_read_epoch()) origin.where = stamped_with_epoch(origin.where, node.read_epoch());
  for (const auto& key : node.keys()) origin.where = with_draw_key(origin.where, key.stage(), key.epoch(), key.index());
  origin.record = node.record();
  origin.byte_offset = node.byte_offset();
  if (node.records_size() == 0) return origin;
  std::vector<Origin> records;
  records.reserve(static_cast<std::size_t>(node.records_size()));
  for (const auto& record : node.records()) records.push_back(origin_of_node(record, files, what));
  if (node.parts()) return origin_of_parts(records);
  const Origin head = records.front();  // (the rows are moved into the call)
  return origin_of_rows(head, std::move(records));
}

}  // namespace

std::string lineage_bytes(const Origin& output) {
  checkpoint::Lineage lineage;
  std::map<const std::string*, std::uint32_t> files;
  add_lineage(output, lineage, files, *lineage.mutable_output());
  return lineage.SerializeAsString();
}

Origin origin_of_lineage_bytes(std::string_view bytes, const std::string& what) {
  checkpoint::Lineage lineage;
  if (!lineage.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw DataError(fmt::format("{} is damaged: its lineage ({} bytes) does not read", what, bytes.size()));
  std::vector<std::shared_ptr<const std::string>> files;
  files.reserve(static_cast<std::size_t>(lineage.files_size()));
  for (const auto& name : lineage.files()) files.push_back(shared_name(name));
  return origin_of_node(lineage.output(), files, what);
}

}  // namespace sluice

namespace sluice::detail {

void stamp_draw_key(Sample& element, const std::string& stage, std::uint64_t epoch, std::uint64_t index) {
  if (chunk_in(element)) return;  // (a chunk's rows share one `where`: their keys are not kept)
  const Origin origin = element.shared_origin();
  if (!origin.where) return;
  element.set_origin(with_draw_key(origin.where, stage, epoch, index), origin.record, origin.byte_offset);
  element.set_read_position(origin.read_epoch, origin.read_index);  // (set_origin forgot them)
}

void stamp_read_epoch(Sample& element, std::uint64_t epoch) {
  if (Chunk* chunk = chunk_in(element)) chunk->set_where(stamped_with_epoch(chunk->where(), epoch));
  const Origin origin = element.shared_origin();
  if (!origin.where) return;
  element.set_origin(stamped_with_epoch(origin.where, epoch), origin.record, origin.byte_offset);
  element.set_read_position(origin.read_epoch, origin.read_index);  // (set_origin forgot them)
}

}  // namespace sluice::detail
