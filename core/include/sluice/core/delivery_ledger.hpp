#pragma once
// The delivery ledger: which records a run delivered, epoch by epoch, so that after preemptions,
// resizes and resumes a user can ask whether every record of an epoch reached the model exactly
// once, and be told which did not. Per epoch and source file: the record indices delivered and
// those delivered more than once (compressed bitmaps), the deliveries counted, and an
// order-independent digest (a sum of hashes, so that the ledgers of a job's workers add up);
// per file, its record count once a reader reached its end. Checkpoints carry it; ledgers of
// several workers or runs merge. Records are named by their origins, stamped with the epoch they
// were read in (sluice/core/lineage.hpp), so a ledger is kept where lineage is followed.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/sample.hpp"

namespace sluice {

namespace checkpoint {
class Ledger;
}

// What an epoch's deliveries say: each record once, or the records given twice or never.
struct EpochVerdict {
  std::uint64_t epoch = 0;
  std::uint64_t deliveries = 0;       // every record given, a record given twice counted twice
  std::uint64_t records = 0;          // distinct records given
  std::optional<std::uint64_t> expected;  // the records the epoch's files hold, where every file's count is known
  std::uint64_t twice = 0, missing = 0;   // records given more than once; never (of files whose count is known)
  std::uint64_t unnamed = 0;          // deliveries of elements no reader named (made, not read)
  std::uint64_t skipped_as_asked = 0; // records the run was told to skip (drop_records), not delivered and not missing
  std::uint64_t digest = 0;
  bool under_way = false;             // the run's last epoch, the run not ended: what is missing may come
  std::vector<std::string> files_of_unknown_size;
  std::uint32_t worker_count = 1, workers_held = 1;  // of the job, and whose deliveries the ledger holds
  struct Record {
    std::string where;
    std::int64_t record = 0;
  };
  std::vector<Record> twice_named, missing_named;  // the first of them, by file and record
};

// A stage that drops records it was given by name (the host's drop_records, which
// skip_named_records places): the ledger counts them as skipped as asked, not as missing.
struct SkippedRecord {
  std::string where;
  std::int64_t record = 0;
};
class NamesSkippedRecords {
 public:
  virtual ~NamesSkippedRecords() = default;
  virtual std::vector<SkippedRecord> skipped_records() const = 0;
};

class DeliveryLedger {
 public:
  DeliveryLedger();
  ~DeliveryLedger();
  DeliveryLedger(const DeliveryLedger&);
  DeliveryLedger& operator=(const DeliveryLedger&);

  // Each record `output` holds (every row of a batch, every part of a zipped row) given once
  // more. Thread-safe, as every call.
  void deliver(const Origin& output);
  // An epoch reads records [first, end) of `where`: a reader reached its end, or a source knows
  // its files (random_access, a tfds split reading part of a shard).
  void know_records(const std::string& where, std::int64_t first, std::int64_t end);
  // The run was told to skip this record (every epoch): not delivered, it is not missing.
  void skip_as_asked(const std::string& where, std::int64_t record);
  struct KnownRecords {
    std::string where;
    std::int64_t first = 0, end = 0;
  };
  // What know_records() was told, file by file (a service worker sends it with a split).
  std::vector<KnownRecords> records_known() const;
  // Worker `index` of a job of `count` keeps this ledger (a merge holds several workers'); a
  // verdict on fewer than all of a job's workers says so (the others' records are not in it).
  void set_worker(std::uint32_t index, std::uint32_t count);
  // Adds another ledger's deliveries (another worker's, or the run before a resume).
  void merge(const DeliveryLedger& other);
  // The run delivered everything it was to: an epoch with records missing is missing them, not
  // under way.
  void set_run_ended(bool ended);
  bool run_ended() const;
  bool empty() const;
  std::uint64_t deliveries() const;

  void save(checkpoint::Ledger& out) const;
  // Throws DataError naming `what` when the ledger's bytes are damaged.
  static DeliveryLedger load(const checkpoint::Ledger& in, const std::string& what);

  // Each epoch's verdict, naming at most `most_named` records of each kind.
  std::vector<EpochVerdict> verdicts(std::size_t most_named = 10) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The verdicts as `sluice ledger` prints them: a line per epoch, then the records named.
std::string format_verdicts(const std::vector<EpochVerdict>& verdicts, bool run_ended);
// Whether every epoch's verdict is clean: no record twice, none missing.
bool verdicts_clean(const std::vector<EpochVerdict>& verdicts);

}  // namespace sluice

namespace sluice {

// A ledger file (`sluice run --ledger FILE`): the Ledger message as JSON (its bitmaps base64),
// written whole or not at all. Throws Error naming the file.
void write_ledger_file(const std::string& path, const DeliveryLedger& ledger);
// What `sluice ledger` reads: a ledger file, a checkpoint (its sinks' ledgers), a Python state's
// bytes, or a folder of a job's checkpoints (every worker's). Throws Error naming the path and
// what is wrong (no ledger in it: the run did not keep one).
DeliveryLedger read_ledgers(const std::string& path);

}  // namespace sluice
