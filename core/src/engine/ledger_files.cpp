// Ledger files and the ledgers checkpoints carry (sluice/core/delivery_ledger.hpp).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>

#include "sluice/core/atomic_file.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/delivery_ledger.hpp"
#include "sluice/error.hpp"

namespace fs = std::filesystem;

namespace sluice {
namespace {

std::string file_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot read {}", file.string()));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A checkpoint's ledgers: its sinks' (a run of `sluice run`) or its loop's (a Python state).
DeliveryLedger ledgers_of_checkpoint(const checkpoint::Checkpoint& c, const std::string& what) {
  DeliveryLedger ledger;
  bool found = c.has_ledger();
  if (found) ledger.merge(DeliveryLedger::load(c.ledger(), what));
  for (const auto& stage : c.stages())
    if (stage.has_ledger()) {
      found = true;
      ledger.merge(DeliveryLedger::load(stage.ledger(), fmt::format("{} (stage '{}')", what, stage.id())));
    }
  if (!found)
    throw Error(fmt::format("{} holds no delivery ledger: the run that wrote it kept none (run it with --ledger FILE, or from Python "
                            "with lineage=True)", what));
  ledger.set_run_ended(c.run_ended());
  return ledger;
}

}  // namespace

void write_ledger_file(const std::string& path, const DeliveryLedger& ledger) {
  checkpoint::Ledger message;
  ledger.save(message);
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok())
    throw Error(fmt::format("--ledger {}: the ledger could not be written as JSON", path));
  try {
    write_file_atomically(path, json);
  } catch (const std::exception& e) {
    throw Error(fmt::format("--ledger {}: {}", path, e.what()));
  }
}

DeliveryLedger read_ledgers(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(checkpoint_file(path), ec)) return ledgers_of_checkpoint(read_checkpoint(checkpoint_file(path)), checkpoint_file(path).string());
    const auto found = checkpoints_in_folder(path);
    if (found.empty()) throw Error(fmt::format("{} holds no checkpoint (give a ledger file, a checkpoint or a job's checkpoint folder)", path));
    DeliveryLedger all;
    bool ended = true;
    for (const auto& f : found) {
      const fs::path file = fs::path(path) / f.name;
      DeliveryLedger one = ledgers_of_checkpoint(read_checkpoint(file), file.string());
      ended = ended && one.run_ended();
      all.merge(one);
    }
    all.set_run_ended(ended);
    return all;
  }
  if (!fs::exists(path, ec)) throw Error(fmt::format("{} does not exist (give a ledger file, a checkpoint or a job's checkpoint folder)", path));
  const std::string text = file_text(path);
  if (text.find_first_not_of(" \t\r\n") != std::string::npos && text[text.find_first_not_of(" \t\r\n")] == '{') {
    checkpoint::Ledger message;
    if (!google::protobuf::util::JsonStringToMessage(text, &message).ok())
      throw Error(fmt::format("{} is not a ledger file: its JSON does not read as one", path));
    DeliveryLedger ledger = DeliveryLedger::load(message, path);
    ledger.set_run_ended(message.run_ended());
    return ledger;
  }
  return ledgers_of_checkpoint(read_checkpoint(path), path);
}

}  // namespace sluice
