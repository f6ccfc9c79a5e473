#include "sluice/core/metrics_log.hpp"

#include <google/protobuf/util/json_util.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "sluice/error.hpp"

namespace sluice {

std::string snapshot_to_json(const metrics::MetricsSnapshot& snapshot) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto status = google::protobuf::util::MessageToJsonString(snapshot, &json, options);
  if (!status.ok()) throw Error("cannot write a snapshot as JSON: " + status.ToString());
  return json;
}

metrics::MetricsSnapshot snapshot_from_json(const std::string& json) {
  metrics::MetricsSnapshot snapshot;
  auto status = google::protobuf::util::JsonStringToMessage(json, &snapshot);
  if (!status.ok()) throw Error("not a metrics snapshot: " + std::string(status.message()));
  return snapshot;
}

MetricsLog::MetricsLog(std::filesystem::path file) : file_(std::move(file)), partial_(file_.string() + ".partial") {
  out_ = std::fopen(partial_.c_str(), "w");
  if (!out_) throw Error("cannot write the metrics log " + partial_.string() + ": " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (out_) std::fclose(out_);  // not closed: the run did not end normally, the .partial stays
}

void MetricsLog::append(const metrics::MetricsSnapshot& snapshot) {
  std::string line = snapshot_to_json(snapshot) + "\n";
  if (out_) {
    std::fwrite(line.data(), 1, line.size(), out_);  // one call per line: whole lines, even from two threads
    std::fflush(out_);
  }
}

void MetricsLog::close() {
  if (!out_) return;
  const bool ok = std::fflush(out_) == 0 && ::fsync(fileno(out_)) == 0;
  std::fclose(out_);
  out_ = nullptr;
  if (!ok) throw Error("writing the metrics log " + partial_.string() + " failed: " + std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(partial_, file_, ec);
  if (ec) throw Error("cannot rename " + partial_.string() + " to " + file_.string() + ": " + ec.message());
}

std::vector<metrics::MetricsSnapshot> read_metrics_log(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("cannot open the metrics log " + file.string() + ": " + std::strerror(errno));
  std::vector<metrics::MetricsSnapshot> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      out.push_back(snapshot_from_json(line));
    } catch (const Error& e) {
      throw Error(file.string() + ":" + std::to_string(number) + ": " + e.what() +
                  " (each line of a metrics log is one snapshot, as `sluice run --metrics-log` writes them)");
    }
  }
  if (out.empty()) throw Error(file.string() + " holds no snapshot");
  return out;
}

}  // namespace sluice
