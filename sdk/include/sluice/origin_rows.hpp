#pragma once
/// (6.13) The records an element made of several holds, carried with its origin: a batch names its
/// rows (each the record it was made of), a zipped element its parts (one record per input).
/// The host attaches rows to what batch and padded_batch make; an aggregate or combine of a
/// plugin that builds an element from several gives it `origin_of_rows()` or `origin_of_parts()`,
/// so that lineage (which records made this batch?), the delivery ledger and elastic states can
/// name them. An operator that does not keeps its first input's origin, as before.
///
/// The origin's `where` and record stay the first row's (messages name it as before); the records
/// ride in the control block of the `where` pointer, found again with std::get_deleter, so that
/// every stage that passes an origin on passes them on too, with no field of their own.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "sluice/sample.hpp"

namespace sluice {

/// The "deleter" of such a `where`: it keeps the first record's `where` alive (the pointer points
/// into it) and holds the records; it deletes nothing.
struct OriginRecords {
  std::shared_ptr<const std::string> where;
  std::vector<Origin> records;
  bool parts = false;  ///< one row made of these records (zip), not one row each (batch)
  void operator()(const std::string*) const noexcept {}
};

/// The records an origin carries (nullptr for the origin of one record, or of none).
inline const OriginRecords* records_carried(const Origin& origin) { return std::get_deleter<OriginRecords>(origin.where); }

namespace detail {
inline Origin origin_carrying(const Origin& first, OriginRecords carrier) {
  static const std::string nowhere;
  const std::string* text = first.where ? first.where.get() : &nowhere;
  Origin out = first;
  out.where = std::shared_ptr<const std::string>(text, std::move(carrier));
  return out;
}
}  // namespace detail

/// An element stacking `rows` (a batch): `head` (its own origin, as messages name it: usually
/// the first row's) carrying each row's. A row that is itself a batch gives its rows (a batch of
/// batches names every record once); a zipped row stays one row.
inline Origin origin_of_rows(const Origin& head, std::vector<Origin> rows) {
  OriginRecords carrier;
  const bool nested = std::any_of(rows.begin(), rows.end(), [](const Origin& row) {
    const OriginRecords* inner = records_carried(row);
    return inner && !inner->parts;
  });
  if (!nested) {
    carrier.records = std::move(rows);  // (one record a row: the rows are the records)
  } else {
    for (const Origin& row : rows) {
      const OriginRecords* inner = records_carried(row);
      if (inner && !inner->parts) carrier.records.insert(carrier.records.end(), inner->records.begin(), inner->records.end());
      else carrier.records.push_back(row);
    }
  }
  carrier.where = head.where;
  return detail::origin_carrying(head, std::move(carrier));
}
inline Origin origin_of_rows(const std::vector<Origin>& rows) { return origin_of_rows(rows.empty() ? Origin{} : rows.front(), rows); }

/// One element made of one element of each input (zip): its parts' origins, in input order.
inline Origin origin_of_parts(const std::vector<Origin>& parts) {
  OriginRecords carrier;
  carrier.parts = true;
  carrier.records = parts;
  const Origin head = parts.empty() ? Origin{} : parts.front();
  carrier.where = head.where;
  return detail::origin_carrying(head, std::move(carrier));
}

}  // namespace sluice
