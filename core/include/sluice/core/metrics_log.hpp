#pragma once
// Snapshots as JSON lines: `sluice run --metrics-log FILE.jsonl` appends every snapshot of a run,
// `sluice report FILE.jsonl` renders the end-of-run report again from the last one.
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/output_file.hpp"

#include "metrics.pb.h"

namespace sluice {

// One snapshot as one line of JSON (protobuf's JSON mapping, field names as in metrics.proto).
std::string snapshot_to_json(const metrics::MetricsSnapshot& snapshot);
// Throws Error naming what is wrong with the text.
metrics::MetricsSnapshot snapshot_from_json(const std::string& json);

// Appends snapshots to FILE.partial-XXXXXX while the run goes on (tail -f it), and renames it to
// FILE when the run is over; an interrupted process leaves only the .partial file. A write that
// fails (a full disk) is remembered: close() then throws and renames nothing.
class MetricsLog {
 public:
  explicit MetricsLog(std::filesystem::path file);  // throws Error when the file cannot be created
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // The pipeline the run ran, written into the first snapshot (call before the first append).
  void set_pipeline(std::string file, std::string text);
  void append(const metrics::MetricsSnapshot& snapshot);  // thread-safe with itself
  void close();  // flushes and renames; throws Error on failure

  const std::string& partial_path() const { return out_.writing_path(); }

 private:
  std::mutex mutex_;
  AtomicOutputFile out_;
  std::string write_error_;
  metrics::RunPipeline pipeline_;
  bool first_ = true;
};

// Every snapshot of a log, in order. Throws Error naming the file and line of a bad line.
std::vector<metrics::MetricsSnapshot> read_metrics_log(const std::filesystem::path& file);

}  // namespace sluice
