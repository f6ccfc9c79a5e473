#pragma once
// Helpers shared by the test suites: a registry with the bundled and fixture plugins, and a way
// to run a pipeline given as text and read back what its jsonl_sink wrote.
#include <QTemporaryDir>

#include <map>
#include <string>
#include <vector>

#include "sluice/core/engine.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace sluice::test {

// Bundled plugins plus the good fixture plugins, loaded once per process.
const Registry& registry();

struct RunOutput {
  RunResult result;
  std::vector<std::string> lines;  // what the jsonl_sink wrote ($OUT in the pipeline text)
  metrics::MetricsSnapshot snapshot;
  std::string error;  // a SpecError's or Error's text when the pipeline did not run
};

// Runs a pipeline document with overrides; no output is read back.
RunOutput run_document(PipelineDocument doc, const std::vector<std::string>& overrides = {}, const EngineOptions& options = {});

// Runs `text` (protobuf text format; every "$OUT" is replaced by a file in a temporary folder).
RunOutput run_text(const std::string& text, const std::vector<std::string>& overrides = {}, const EngineOptions& options = {});

// Runs `text` as `worker` of a job (sluice::plan_for_worker first: automatic sharding, seeds);
// `plan`, when given, receives what the planning did.
RunOutput run_text_as_worker(const std::string& text, const WorkerIdentity& worker, WorkerPlan* plan = nullptr);

// The integers of a jsonl line like {"value":3} or {"value":[1,2,3]}, in order.
std::vector<long long> integers(const std::string& line);
// All integers of all lines, flattened.
std::vector<long long> all_integers(const std::vector<std::string>& lines);

// Builds the graph of `text` or throws SpecError.
Graph graph_of(const std::string& text);

std::string read_file(const std::string& path);

// Every regular file under `root`, by its path relative to it, with its bytes.
std::map<std::string, std::string> files_under(const std::string& root);

}  // namespace sluice::test

namespace sluice::test {

// One `stage { ... }` entry of a pipeline file.
inline std::string stage(const std::string& id, const std::string& op, const std::string& input,
                         std::vector<std::pair<std::string, std::string>> params = {}, const std::string& extra = "") {
  std::string s = "stage { id: \"" + id + "\" op: \"" + op + "\"";
  if (!input.empty()) s += " input: \"" + input + "\"";
  for (const auto& [k, v] : params) s += " params { key: \"" + k + "\" value: \"" + v + "\" }";
  return s + " " + extra + " }\n";
}

// A chain: range(count) -> middle stages... -> jsonl_sink($OUT).
inline std::string sink_after(const std::string& input) { return stage("out", "jsonl_sink", input, {{"path", "$OUT"}}); }

}  // namespace sluice::test

namespace sluice::test {

// tests/data/real in the repository (SLUICE_TESTDATA overrides).
std::string testdata_dir();

}  // namespace sluice::test
