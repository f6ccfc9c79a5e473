#include "sluice/core/delivery_ledger.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <roaring/roaring.hh>

#include "checkpoint.pb.h"
#include "sluice/core/lineage.hpp"
#include "sluice/error.hpp"
#include "sluice/rng.hpp"

namespace sluice {
// (Named, not anonymous: DeliveryLedger::Impl holds them.)
namespace ledger_parts {

struct FileDeliveries {
  Roaring delivered, twice;
  std::uint64_t deliveries = 0;
};

struct EpochDeliveries {
  std::map<std::string, FileDeliveries> files;
  std::uint64_t deliveries = 0, digest = 0, unnamed = 0;
};

}  // namespace ledger_parts

using ledger_parts::EpochDeliveries;
using ledger_parts::FileDeliveries;

namespace {

// A delivery's share of the digest: the same record hashes alike in every process (FNV-1a over
// the file's name, then mixed with the record's index).
std::uint64_t name_hash(const std::string& where) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : where) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::uint64_t record_hash(std::uint64_t name, std::int64_t record) { return mix64(name ^ mix64(static_cast<std::uint64_t>(record))); }

std::string bitmap_bytes(Roaring bitmap) {
  bitmap.runOptimize();
  std::string out(bitmap.getSizeInBytes(true), '\0');
  bitmap.write(out.data(), true);
  return out;
}

Roaring bitmap_of(const std::string& bytes, const std::string& what) {
  if (bytes.empty()) return Roaring();
  try {
    Roaring bitmap = Roaring::readSafe(bytes.data(), bytes.size());
    if (bitmap.getSizeInBytes(true) != bytes.size()) throw std::runtime_error("size");
    return bitmap;
  } catch (const std::exception&) {
    throw DataError(what + " is damaged: a bitmap of " + std::to_string(bytes.size()) + " bytes does not read back");
  }
}

}  // namespace

struct DeliveryLedger::Impl {
  mutable std::mutex mutex;
  std::map<std::uint64_t, EpochDeliveries> epochs;
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> sizes;  // [first, end)
  bool run_ended = false;
  std::uint32_t worker_count = 1;
  std::set<std::uint32_t> workers;  // whose deliveries it holds (none named: a ledger of no job)
  std::map<std::string, Roaring> skipped;  // by file: records the run was told to skip
  void know(const std::string& where, std::int64_t first, std::int64_t end) {
    auto [it, added] = sizes.emplace(where, std::make_pair(first, end));
    if (!added) it->second = {std::min(it->second.first, first), std::max(it->second.second, end)};
  }

  // The file and epoch of the last record delivered: consecutive records mostly share them, and a
  // look-up by name and a hash of the name per record cost more than the rest.
  std::shared_ptr<const std::string> last_where;
  std::uint64_t last_epoch = 0, last_name_hash = 0;
  EpochDeliveries* last_epoch_deliveries = nullptr;
  FileDeliveries* last_file = nullptr;

  void deliver_origin(const Origin& o) {
    const std::optional<std::uint64_t> read_in = read_epoch_of(o);
    if (!o.where || o.where->empty() || o.record < 0 || o.record > std::numeric_limits<std::uint32_t>::max() || !read_in) {
      EpochDeliveries& epoch = epochs[read_in.value_or(0)];
      ++epoch.deliveries;
      ++epoch.unnamed;
      return;
    }
    if (!last_file || o.where.get() != last_where.get() || *read_in != last_epoch) {
      last_where = o.where;
      last_epoch = *read_in;
      last_epoch_deliveries = &epochs[*read_in];
      last_file = &last_epoch_deliveries->files[*o.where];
      last_name_hash = name_hash(*o.where);
    }
    ++last_epoch_deliveries->deliveries;
    last_epoch_deliveries->digest += record_hash(last_name_hash, o.record);
    ++last_file->deliveries;
    const auto index = static_cast<std::uint32_t>(o.record);
    if (!last_file->delivered.addChecked(index)) last_file->twice.add(index);
  }
  void deliver_row(const Origin& row) {
    const OriginRecords* parts = records_carried(row);
    if (parts && parts->parts) {
      for (const Origin& part : parts->records) deliver_origin(part);
    } else {
      deliver_origin(row);
    }
  }
  void forget_last() {
    last_where.reset();
    last_file = nullptr;
    last_epoch_deliveries = nullptr;
  }
};

DeliveryLedger::DeliveryLedger() : impl_(std::make_unique<Impl>()) {}
DeliveryLedger::~DeliveryLedger() = default;
DeliveryLedger::DeliveryLedger(const DeliveryLedger& other) : impl_(std::make_unique<Impl>()) { merge(other); impl_->run_ended = other.run_ended(); }
DeliveryLedger& DeliveryLedger::operator=(const DeliveryLedger& other) {
  if (this != &other) {
    DeliveryLedger copy(other);
    std::swap(impl_, copy.impl_);
  }
  return *this;
}

void DeliveryLedger::deliver(const Origin& output) {
  std::lock_guard lock(impl_->mutex);
  const OriginRecords* carried = records_carried(output);
  if (carried && !carried->parts) {
    for (const Origin& row : carried->records) impl_->deliver_row(row);
  } else {
    impl_->deliver_row(output);
  }
}

void DeliveryLedger::know_records(const std::string& where, std::int64_t first, std::int64_t end) {
  std::lock_guard lock(impl_->mutex);
  impl_->know(where, first, end);
}

void DeliveryLedger::skip_as_asked(const std::string& where, std::int64_t record) {
  if (record < 0 || record > std::numeric_limits<std::uint32_t>::max()) return;
  std::lock_guard lock(impl_->mutex);
  impl_->skipped[where].add(static_cast<std::uint32_t>(record));
}

std::vector<DeliveryLedger::KnownRecords> DeliveryLedger::records_known() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<KnownRecords> known;
  known.reserve(impl_->sizes.size());
  for (const auto& [where, range] : impl_->sizes) known.push_back({where, range.first, range.second});
  return known;
}

void DeliveryLedger::set_worker(std::uint32_t index, std::uint32_t count) {
  std::lock_guard lock(impl_->mutex);
  impl_->worker_count = std::max<std::uint32_t>(count, 1);
  impl_->workers = {index};
}

void DeliveryLedger::merge(const DeliveryLedger& other) {
  if (&other == this) return;
  std::scoped_lock lock(impl_->mutex, other.impl_->mutex);
  for (const auto& [number, theirs] : other.impl_->epochs) {
    EpochDeliveries& mine = impl_->epochs[number];
    mine.deliveries += theirs.deliveries;
    mine.digest += theirs.digest;
    mine.unnamed += theirs.unnamed;
    for (const auto& [where, file] : theirs.files) {
      FileDeliveries& into = mine.files[where];
      into.twice |= file.twice;
      into.twice |= (into.delivered & file.delivered);  // given by both
      into.delivered |= file.delivered;
      into.deliveries += file.deliveries;
    }
  }
  for (const auto& [where, range] : other.impl_->sizes) impl_->know(where, range.first, range.second);
  for (const auto& [where, records] : other.impl_->skipped) impl_->skipped[where] |= records;
  impl_->worker_count = std::max(impl_->worker_count, other.impl_->worker_count);
  impl_->workers.insert(other.impl_->workers.begin(), other.impl_->workers.end());
}

void DeliveryLedger::set_run_ended(bool ended) {
  std::lock_guard lock(impl_->mutex);
  impl_->run_ended = ended;
}
bool DeliveryLedger::run_ended() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->run_ended;
}
bool DeliveryLedger::empty() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->epochs.empty();
}
std::uint64_t DeliveryLedger::deliveries() const {
  std::lock_guard lock(impl_->mutex);
  std::uint64_t n = 0;
  for (const auto& [_, epoch] : impl_->epochs) n += epoch.deliveries;
  return n;
}

void DeliveryLedger::save(checkpoint::Ledger& out) const {
  std::lock_guard lock(impl_->mutex);
  out.Clear();
  out.set_run_ended(impl_->run_ended);
  for (const auto& [number, epoch] : impl_->epochs) {
    auto* e = out.add_epochs();
    e->set_epoch(number);
    e->set_deliveries(epoch.deliveries);
    e->set_digest(epoch.digest);
    e->set_unnamed(epoch.unnamed);
    for (const auto& [where, file] : epoch.files) {
      auto* f = e->add_files();
      f->set_where(where);
      f->set_deliveries(file.deliveries);
      f->set_delivered(bitmap_bytes(file.delivered));
      if (!file.twice.isEmpty()) f->set_twice(bitmap_bytes(file.twice));
    }
  }
  for (const auto& [where, range] : impl_->sizes) {
    auto* r = out.add_file_records();
    r->set_where(where);
    r->set_first(range.first);
    r->set_end(range.second);
  }
  out.set_worker_count(impl_->worker_count);
  for (auto w : impl_->workers) out.add_workers(w);
  for (const auto& [where, records] : impl_->skipped) {
    auto* f = out.add_skipped_as_asked();
    f->set_where(where);
    f->set_delivered(bitmap_bytes(records));
  }
}

DeliveryLedger DeliveryLedger::load(const checkpoint::Ledger& in, const std::string& what) {
  DeliveryLedger ledger;
  Impl& impl = *ledger.impl_;
  impl.run_ended = in.run_ended();
  for (const auto& e : in.epochs()) {
    EpochDeliveries& epoch = impl.epochs[e.epoch()];
    epoch.deliveries = e.deliveries();
    epoch.digest = e.digest();
    epoch.unnamed = e.unnamed();
    for (const auto& f : e.files()) {
      const std::string of = fmt::format("{}'s ledger of epoch {}, file {}", what, e.epoch(), f.where());
      FileDeliveries& file = epoch.files[f.where()];
      file.delivered = bitmap_of(f.delivered(), of);
      file.twice = bitmap_of(f.twice(), of);
      file.deliveries = f.deliveries();
    }
  }
  for (const auto& r : in.file_records()) {
    if (r.first() < 0 || r.end() < r.first() || r.end() > std::numeric_limits<std::uint32_t>::max())
      throw DataError(fmt::format("{}'s ledger is damaged: file {} reads records {} to {}", what, r.where(), r.first(), r.end()));
    impl.know(r.where(), r.first(), r.end());
  }
  impl.worker_count = std::max<std::uint32_t>(in.worker_count(), 1);
  impl.workers = std::set<std::uint32_t>(in.workers().begin(), in.workers().end());
  for (const auto& f : in.skipped_as_asked())
    impl.skipped[f.where()] |= bitmap_of(f.delivered(), fmt::format("{}'s ledger, the records of {} to skip", what, f.where()));
  return ledger;
}

std::vector<EpochVerdict> DeliveryLedger::verdicts(std::size_t most_named) const {
  std::lock_guard lock(impl_->mutex);
  std::vector<EpochVerdict> out;
  const std::uint64_t last = impl_->epochs.empty() ? 0 : impl_->epochs.rbegin()->first;
  // Every file any epoch delivered from, or a reader measured, belongs to every epoch.
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> files = impl_->sizes;
  for (const auto& [_, other] : impl_->epochs)
    for (const auto& [where, __] : other.files) files.emplace(where, std::make_pair(std::int64_t{-1}, std::int64_t{-1}));
  for (const auto& [number, epoch] : impl_->epochs) {
    EpochVerdict v;
    v.epoch = number;
    v.deliveries = epoch.deliveries;
    v.digest = epoch.digest;
    v.unnamed = epoch.unnamed;
    v.under_way = !impl_->run_ended && number == last;
    v.worker_count = impl_->worker_count;
    v.workers_held = impl_->workers.empty() ? v.worker_count : static_cast<std::uint32_t>(impl_->workers.size());
    std::uint64_t expected = 0;
    for (const auto& [where, range] : files) {
      auto it = epoch.files.find(where);
      const FileDeliveries* file = it == epoch.files.end() ? nullptr : &it->second;
      if (file) {
        v.records += file->delivered.cardinality();
        v.twice += file->twice.cardinality();
        for (auto r = file->twice.begin(); r != file->twice.end() && v.twice_named.size() < most_named; ++r)
          v.twice_named.push_back({where, static_cast<std::int64_t>(*r)});
      }
      if (range.first < 0) {
        v.files_of_unknown_size.push_back(where);
        continue;
      }
      expected += static_cast<std::uint64_t>(range.second - range.first);
      Roaring all;
      all.addRange(static_cast<std::uint64_t>(range.first), static_cast<std::uint64_t>(range.second));
      if (file) all -= file->delivered;
      if (auto skipped = impl_->skipped.find(where); skipped != impl_->skipped.end()) {
        const std::uint64_t before = all.cardinality();
        all -= skipped->second;
        v.skipped_as_asked += before - all.cardinality();
      }
      v.missing += all.cardinality();
      for (auto r = all.begin(); r != all.end() && v.missing_named.size() < most_named; ++r)
        v.missing_named.push_back({where, static_cast<std::int64_t>(*r)});
    }
    if (v.files_of_unknown_size.empty()) v.expected = expected;
    out.push_back(std::move(v));
  }
  return out;
}

bool verdicts_clean(const std::vector<EpochVerdict>& verdicts) {
  return std::all_of(verdicts.begin(), verdicts.end(), [](const EpochVerdict& v) { return v.twice == 0 && (v.missing == 0 || v.under_way); });
}

std::string format_verdicts(const std::vector<EpochVerdict>& verdicts, bool run_ended) {
  if (verdicts.empty()) return "no deliveries recorded\n";
  std::string out;
  auto named = [](const std::vector<EpochVerdict::Record>& records, std::uint64_t count) {
    std::string text;
    for (const auto& r : records) text += fmt::format("\n    {} record {}", r.where, r.record);
    if (count > records.size()) text += fmt::format("\n    and {} more", count - records.size());
    return text;
  };
  for (const auto& v : verdicts) {
    out += fmt::format("epoch {}: {} records delivered", v.epoch, v.records);
    if (v.expected) out += fmt::format(" of {} expected", *v.expected);
    out += v.twice == 0 ? ", none twice" : fmt::format(", {} more than once", v.twice);
    if (v.expected || v.missing > 0)
      out += v.missing == 0 ? ", none missing" : fmt::format(", {} {}", v.missing, v.under_way ? "not yet (the epoch is under way)" : "missing");
    if (v.skipped_as_asked > 0) out += fmt::format(", {} skipped as asked", v.skipped_as_asked);
    if (v.unnamed > 0) out += fmt::format("; {} deliveries of elements no reader named", v.unnamed);
    out += fmt::format(" (digest {:016x})\n", v.digest);
    if (v.twice > 0) out += "  more than once:" + named(v.twice_named, v.twice) + "\n";
    if (v.missing > 0 && !v.under_way) out += "  missing:" + named(v.missing_named, v.missing) + "\n";
    if (!v.files_of_unknown_size.empty())
      out += fmt::format("  {} file(s) of unknown size (no reader reached their end): missing records cannot be counted there\n",
                         v.files_of_unknown_size.size());
  }
  if (!run_ended) out += "the run had not ended: its last epoch may still be under way\n";
  if (verdicts.front().workers_held < verdicts.front().worker_count)
    out += fmt::format("these are the ledgers of {} of the job's {} workers: the records of the others' shares count as missing; give "
                       "every worker's\n", verdicts.front().workers_held, verdicts.front().worker_count);
  return out;
}

}  // namespace sluice
