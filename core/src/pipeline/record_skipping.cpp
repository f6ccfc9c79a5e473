// Skipping a named set of records on the next run (sluice/core/prepare.hpp: skip_named_records):
// the host's `drop_records` filter, placed where dropping changes nothing else of the order.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "sluice/core/delivery_ledger.hpp"
#include "sluice/core/prepare.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/origin_rows.hpp"

namespace sluice {
namespace {

constexpr const char* kDropRecords = "drop_records";

class DropRecords final : public Filter, public NamesSkippedRecords {
 public:
  static OperatorInfo describe() {
    OperatorInfo info;
    info.name = kDropRecords;
    info.kind = OperatorKind::Filter;
    info.summary =
        "Drops the records named in `records` (lines \"RECORD SOURCE\": a record's index in its file or object, as lineage names it); "
        "an element made of several records is dropped when every one of them is named";
    info.params = {ParamSpec::make("records", ParamType::String, "the records to drop, one \"RECORD SOURCE\" per line").def("")};
    info.traits.stateless = true;
    info.traits.keeps_shape = true;
    info.create = [](const Params& p) { return std::make_unique<DropRecords>(p.get_string("records")); };
    return info;
  }
  explicit DropRecords(const std::string& lines) : named_(parse_named_records(lines, "drop_records.records")) {}

  bool keep(const Sample& in, const ElementContext&) override {
    const Origin& origin = in.shared_origin();
    const OriginRecords* carried = records_carried(origin);
    if (!carried) return !named(origin);
    return !std::all_of(carried->records.begin(), carried->records.end(), [&](const Origin& record) {
      const OriginRecords* parts = records_carried(record);
      return parts ? std::any_of(parts->records.begin(), parts->records.end(), [&](const Origin& part) { return named(part); }) : named(record);
    });
  }
  std::vector<SkippedRecord> skipped_records() const override {
    std::vector<SkippedRecord> out;
    for (const auto& [where, records] : named_)
      for (std::int64_t record : records) out.push_back({where, record});
    return out;
  }

 private:
  bool named(const Origin& record) const {
    if (!record.where || record.record < 0) return false;
    const auto it = named_.find(*record.where);
    return it != named_.end() && it->second.count(record.record) > 0;
  }
  std::map<std::string, std::set<std::int64_t>> named_;
};

}  // namespace

std::map<std::string, std::set<std::int64_t>> parse_named_records(const std::string& lines, const std::string& what) {
  std::map<std::string, std::set<std::int64_t>> named;
  std::size_t number = 0;
  for (std::size_t at = 0; at < lines.size();) {
    const std::size_t end = std::min(lines.find('\n', at), lines.size());
    const std::string line = lines.substr(at, end - at);
    at = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    long long record = -1;
    int source_at = 0;
    if (std::sscanf(line.c_str(), "%lld %n", &record, &source_at) != 1 || record < 0 || source_at <= 0 ||
        static_cast<std::size_t>(source_at) >= line.size())
      throw Error(fmt::format("{}, line {}: '{}' is not \"RECORD SOURCE\" (a record's index, then its file or object as lineage names it)",
                              what, number, line));
    std::string source = line.substr(static_cast<std::size_t>(source_at));
    if (!source.empty() && source.back() == '\r') source.pop_back();
    named[source].insert(record);
  }
  return named;
}

void add_core_operators(Registry& registry) {
  if (!registry.find(kDropRecords)) registry.add_host_operator(DropRecords::describe(), "host");
}

void skip_named_records(PipelineDocument& doc, const Registry& registry, const std::string& records) {
  parse_named_records(records, "the records to skip");  // (refused here, naming the line, rather than when the stage starts)
  const auto drop = registry.find(kDropRecords);
  if (!drop) throw Error("this registry has no drop_records operator (add_core_operators)");
  auto op_of = [&](const spec::Stage& stage) { return registry.find(stage.op()); };
  // Before the first stage that batches (its rows are then the records, and every draw before it
  // is the run's), else before the sink: what comes after sees the same elements less the named.
  int before = -1;
  for (int i = 0; i < doc.spec.stage_size() && before < 0; ++i) {
    const auto op = op_of(doc.spec.stage(i));
    if (op && op->info.traits.role == OperatorRole::Batches && doc.spec.stage(i).input_size() == 1) before = i;
  }
  for (int i = 0; i < doc.spec.stage_size() && before < 0; ++i) {
    const auto op = op_of(doc.spec.stage(i));
    if (op && op->info.kind == OperatorKind::Sink && doc.spec.stage(i).input_size() == 1) before = i;
  }
  if (before < 0)
    throw Error(fmt::format("{}: no batch and no sink of one input to put the skipping of named records before", doc.file));
  std::string id = "skip_named_records";
  for (int n = 2; std::any_of(doc.spec.stage().begin(), doc.spec.stage().end(), [&](const auto& s) { return s.id() == id; }); ++n)
    id = fmt::format("skip_named_records_{}", n);
  auto* stage = doc.spec.add_stage();
  stage->set_id(id);
  stage->set_op(kDropRecords);
  stage->add_input(doc.spec.stage(before).input(0));
  (*stage->mutable_params())["records"] = records;
  doc.spec.mutable_stage(before)->set_input(0, id);
}

}  // namespace sluice
