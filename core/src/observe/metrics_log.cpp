#include "sluice/core/metrics_log.hpp"

#include <google/protobuf/util/json_util.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "files/remote_access.hpp"
#include "sluice/core/text.hpp"
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
  if (json_nesting_depth(json) > kDeepestJson) throw Error("not a metrics snapshot: it nests arrays and objects too deeply");
  metrics::MetricsSnapshot snapshot;
  auto status = google::protobuf::util::JsonStringToMessage(json, &snapshot);
  if (!status.ok()) throw Error("not a metrics snapshot: " + std::string(status.message()));
  return snapshot;
}

MetricsLog::MetricsLog(std::filesystem::path file) {
  try {
    out_.open(file.string(), is_remote_uri(file.string()) ? &host_storage() : nullptr);
  } catch (const Error& e) {
    throw Error(std::string("cannot write the metrics log: ") + e.what());
  }
}

MetricsLog::~MetricsLog() = default;  // not closed: the run did not end normally, the .partial stays

void MetricsLog::set_pipeline(std::string file, std::string text) {
  std::lock_guard lock(mutex_);
  pipeline_.set_file(std::move(file));
  pipeline_.set_text(std::move(text));
}

void MetricsLog::append(const metrics::MetricsSnapshot& snapshot) {
  std::unique_lock lock(mutex_);
  const bool first = std::exchange(first_, false);
  std::string line;
  if (first && !pipeline_.text().empty()) {
    metrics::MetricsSnapshot with_pipeline = snapshot;
    *with_pipeline.mutable_pipeline() = pipeline_;
    line = snapshot_to_json(with_pipeline) + "\n";
  } else {
    lock.unlock();  // the JSON of a snapshot is the costly part: not under the lock
    line = snapshot_to_json(snapshot) + "\n";
    lock.lock();
  }
  if (!out_.is_open() || !write_error_.empty()) return;
  try {
    out_.write(line);
    if (std::fflush(out_.stream()) != 0) throw Error("writing " + out_.writing_path() + " failed: " + std::strerror(errno));
  } catch (const Error& e) {
    write_error_ = e.what();  // the run goes on; close() refuses to call the log complete
  }
}

void MetricsLog::close() {
  std::lock_guard lock(mutex_);
  if (!out_.is_open()) return;
  if (!write_error_.empty()) {
    out_.abandon(/*keep=*/true);
    throw Error("the metrics log is incomplete, left as " + out_.writing_path() + ": " + write_error_);
  }
  out_.commit();
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
