#include "pipeline_runner.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sluice::test {

const Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    reg->load_search_path({std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"});
    return reg;
  }();
  return *r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::map<std::string, std::string> files_under(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root))
    if (entry.is_regular_file()) out[std::filesystem::relative(entry.path(), root).string()] = read_file(entry.path().string());
  return out;
}

Graph graph_of(const std::string& text) { return build_graph(parse_pipeline(text, "test.txtpb"), registry()); }

RunOutput run_document(PipelineDocument doc, const std::vector<std::string>& overrides, const EngineOptions& options) {
  RunOutput out;
  try {
    apply_overrides(doc, overrides);
    Engine engine(build_graph(doc, registry()), options);
    engine.start();
    out.result = engine.wait();
    out.snapshot = engine.snapshot();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

namespace {
RunOutput run_text_with(const std::string& text, const std::vector<std::string>& overrides, const EngineOptions& options,
                        const WorkerIdentity* worker, WorkerPlan* plan) {
  RunOutput out;
  QTemporaryDir dir;
  // As one of several workers, the output is the worker's own ({worker} in its path).
  const std::string written = dir.path().toStdString() + (worker ? "/out-{worker}.jsonl" : "/out.jsonl");
  const std::string path = worker ? substitute_worker_fields(written, *worker) : written;
  std::string resolved = text;
  for (std::size_t at; (at = resolved.find("$OUT")) != std::string::npos;) resolved.replace(at, 4, written);
  try {
    auto doc = parse_pipeline(resolved, "test.txtpb");
    if (worker) {
      auto done = plan_for_worker(doc, registry(), *worker);
      if (plan) *plan = done;
    }
    out = run_document(std::move(doc), overrides, options);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  if (!out.error.empty()) return out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) out.lines.push_back(line);
  return out;
}
}  // namespace

RunOutput run_text(const std::string& text, const std::vector<std::string>& overrides, const EngineOptions& options) {
  return run_text_with(text, overrides, options, nullptr, nullptr);
}

RunOutput run_text_as_worker(const std::string& text, const WorkerIdentity& worker, WorkerPlan* plan) {
  return run_text_with(text, {}, {}, &worker, plan);
}

std::vector<long long> integers(const std::string& line) {
  std::vector<long long> values;
  auto colon = line.find(':');
  for (std::size_t i = colon == std::string::npos ? 0 : colon + 1; i < line.size();) {
    if (line[i] == '-' || std::isdigit(static_cast<unsigned char>(line[i]))) {
      char* end = nullptr;
      values.push_back(std::strtoll(line.c_str() + i, &end, 10));
      i = std::max<std::size_t>(i + 1, static_cast<std::size_t>(end - line.c_str()));
    } else {
      ++i;
    }
  }
  return values;
}

std::vector<long long> all_integers(const std::vector<std::string>& lines) {
  std::vector<long long> values;
  for (const auto& l : lines) {
    auto v = integers(l);
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

}  // namespace sluice::test

namespace sluice::test {

std::string testdata_dir() {
  if (const char* env = std::getenv("SLUICE_TESTDATA")) return env;
  return std::string(SLUICE_SOURCE_DIR) + "/tests/data/real";
}

}  // namespace sluice::test
