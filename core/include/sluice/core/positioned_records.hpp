#pragma once
// A source of the registry opened outside any run, for reads at the places a caller chooses: the
// Python module's data sources (Grain's ArrayRecordDataSource and Hugging Face's datasets are
// what they are shaped as). The source is built from its parameters, started with remote storage
// of its own (the environment's settings), and read through ReadsByPosition (operator.hpp).
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/core/registry.hpp"
#include "sluice/operator.hpp"

namespace sluice {

class StageRemoteStorage;

class PositionedRecords {
 public:
  // Throws Error naming the operator when it is not a source that reads by position, ParamError
  // for its parameters, DataError for its files (as a run's start would).
  PositionedRecords(const Registry& registry, const std::string& op, const std::vector<std::pair<std::string, std::string>>& params);
  ~PositionedRecords();
  PositionedRecords(const PositionedRecords&) = delete;
  PositionedRecords& operator=(const PositionedRecords&) = delete;

  std::uint64_t size() const { return size_; }
  // The records at these places, in the order asked; from any thread (one read at a time).
  std::vector<Sample> read(const std::vector<std::uint64_t>& positions);
  std::vector<ReadsByPosition::StoredField> stored_fields() const;
  // The files and the records each gives (empty where the source does not say).
  std::vector<KnowsItsRecords::FileRecords> files() const;

 private:
  std::shared_ptr<const RegisteredOperator> registered_;  // (its library outlives the source)
  std::unique_ptr<StageRemoteStorage> storage_;
  std::unique_ptr<Operator> source_;
  ReadsByPosition* reads_ = nullptr;
  std::uint64_t size_ = 0;
  std::mutex reading_;
};

}  // namespace sluice
