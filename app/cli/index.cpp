// `sluice index FILES...`: the index files random_access reads, written by a pipeline of the io
// plugin's tfrecord_index (list_files -> tfrecord_index -> jsonl_sink) run as `sluice run` runs
// one, with its progress line; then what was done, file by file (nothing with --quiet).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "sluice/core/text.hpp"
#include "sluice/storage.hpp"

namespace fs = std::filesystem;

namespace sluice_cli {
namespace {

// A string in protobuf's text format.
std::string text_literal(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// jsonl_sink writes bytes fields as base64.
std::string from_base64(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  unsigned bits = 0;
  int count = 0;
  for (char c : text) {
    const int v = value(c);
    if (v < 0) continue;  // padding
    bits = (bits << 6) | static_cast<unsigned>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

std::string index_pipeline(const IndexRequest& request, const std::string& results) {
  std::string patterns;
  for (const auto& file : request.files) {
    if (file.find_first_of(",{}") != std::string::npos)
      throw sluice::Error("cannot index " + file + " by name: ',' '{' and '}' are pattern characters; rename it, or give a glob that matches it");
    patterns += (patterns.empty() ? "" : ",") + (sluice::is_remote_uri(file) ? file : fs::absolute(file).string());
  }
  std::string index_params = " params { key: \"format\" value: " + text_literal(request.format) + " }";
  if (!request.index_dir.empty()) index_params += " params { key: \"index_dir\" value: " + text_literal(fs::absolute(request.index_dir).string()) + " }";
  if (request.rebuild) index_params += " params { key: \"rebuild\" value: \"true\" }";
  return "stage { id: \"files\" op: \"list_files\" params { key: \"patterns\" value: " + text_literal(patterns) +
         " } params { key: \"shuffle\" value: \"false\" } }\n"
         "stage { id: \"index\" op: \"tfrecord_index\" input: \"files\" parallelism: " +
         std::to_string(request.parallelism) + index_params +
         " }\n"
         "stage { id: \"done\" op: \"jsonl_sink\" input: \"index\" params { key: \"path\" value: " +
         text_literal(results) + " } }\n";
}

}  // namespace

int cmd_index(const CommonOptions& common, const IndexRequest& request) {
  const char* tmp = std::getenv("TMPDIR");
  std::string folder = std::string(tmp && *tmp ? tmp : "/tmp") + "/sluice-index-XXXXXX";
  if (!::mkdtemp(folder.data())) {
    fmt::print(stderr, "error: cannot create a folder in {}: {}\n", fs::path(folder).parent_path().string(), std::strerror(errno));
    return kExitRunFailed;
  }
  struct Cleanup {
    std::string folder;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(folder, ec);
    }
  } cleanup{folder};
  const std::string pipeline = folder + "/index.txtpb", results = folder + "/indexed.jsonl";
  try {
    std::ofstream(pipeline) << index_pipeline(request, results);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
  RunOptions options;
  options.quiet = request.quiet;
  options.report = false;  // what was done, file by file, says more than the stages' table
  // One process indexes every file it is given, whatever job it runs in.
  if (int code = cmd_run(common, pipeline, {}, std::nullopt, WorkerArgs{0, 1}, options)) return code;
  std::ifstream lines(results);
  std::uint64_t records = 0, built = 0, fresh = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto row = nlohmann::json::parse(line);
    const std::string state = from_base64(row.at("state").get<std::string>());
    records += row.at("records").get<std::uint64_t>();
    if (state == "up to date") {
      ++fresh;
      continue;
    }
    ++built;
    if (!request.quiet)
      fmt::print("{}: {} records, index {} {}\n", from_base64(row.at("path").get<std::string>()), row.at("records").get<std::uint64_t>(), state,
               from_base64(row.at("index_file").get<std::string>()));
  }
  if (!request.quiet)
    fmt::print("{} files, {} records: {} index{} written, {} up to date\n", built + fresh, records, built, built == 1 ? "" : "es", fresh);
  return 0;
}

}  // namespace sluice_cli
