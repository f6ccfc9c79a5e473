#include "sluice/core/output_rows.hpp"

#include <memory>
#include <string>

namespace sluice {
namespace {

// The "deleter" of the aliasing pointer: it keeps the first row's `where` alive (the pointer
// points into it) and holds the rows; it deletes nothing.
struct RowsCarrier {
  std::shared_ptr<const std::string> where;
  std::vector<Origin> rows;
  void operator()(const std::string*) const noexcept {}
};

const std::string& no_where() {
  static const std::string empty;
  return empty;
}

}  // namespace

Origin origin_with_rows(const Origin& first, const std::vector<Origin>& rows) {
  RowsCarrier carrier{first.where, {}};
  carrier.rows.reserve(rows.size());
  for (const Origin& row : rows) {
    if (const auto* inner = rows_carried(row)) carrier.rows.insert(carrier.rows.end(), inner->begin(), inner->end());
    else carrier.rows.push_back(row);
  }
  const std::string* text = first.where ? first.where.get() : &no_where();
  Origin out = first;
  out.where = std::shared_ptr<const std::string>(text, std::move(carrier));
  return out;
}

const std::vector<Origin>* rows_carried(const Origin& origin) {
  const auto* carrier = std::get_deleter<RowsCarrier>(origin.where);
  return carrier ? &carrier->rows : nullptr;
}

}  // namespace sluice
