#include "sluice/core/positioned_records.hpp"

#include "files/remote_access.hpp"
#include "sluice/core/param_parse.hpp"

namespace sluice {

PositionedRecords::PositionedRecords(const Registry& registry, const std::string& op, const std::vector<std::pair<std::string, std::string>>& params)
    : registered_(registry.find(op)), storage_(std::make_unique<StageRemoteStorage>()) {
  if (!registered_) throw Error("operator '" + op + "' is not registered: is its plugin in this build? (sluice plugins lists them)");
  if (registered_->info.kind != OperatorKind::Source) throw Error("operator '" + op + "' is not a source: records are read by position from a source");
  source_ = registered_->info.create(parse_params(registered_->info.params, params));
  reads_ = dynamic_cast<ReadsByPosition*>(source_.get());
  if (!reads_) throw Error("source '" + op + "' cannot read its records by position (it has no ReadsByPosition)");
  StageInfo info;
  info.id = op;
  info.storage = storage_.get();
  source_->start(info);
  size_ = reads_->records();
}

PositionedRecords::~PositionedRecords() {
  if (source_) {
    try {
      source_->finish(true);
    } catch (...) {  // (nothing to hand the error to in a destructor: the reads are done)
    }
  }
}

std::vector<Sample> PositionedRecords::read(const std::vector<std::uint64_t>& positions) {
  std::lock_guard lock(reading_);
  return reads_->read_positions(positions);
}

std::vector<ReadsByPosition::StoredField> PositionedRecords::stored_fields() const { return reads_->stored_fields(); }

std::vector<KnowsItsRecords::FileRecords> PositionedRecords::files() const {
  if (const auto* knows = dynamic_cast<const KnowsItsRecords*>(source_.get())) return knows->records_per_file();
  return {};
}

}  // namespace sluice
