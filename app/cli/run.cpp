// `sluice run`: a pipeline run headless, with a progress line, checkpoints on signals and on a
// schedule, a metrics log and endpoint, and the end-of-run report.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cli.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/metrics_log.hpp"
#include "sluice/core/metrics_server.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/text.hpp"
#include "sluice/core/workers.hpp"

namespace sluice_cli {
namespace {

using Clock = std::chrono::steady_clock;

// --timings: what the run's start cost, phase by phase, in milliseconds from main() (what comes
// before, exec and the dynamic linking, is the wall time less their total).
class PhaseClock {
 public:
  void mark(const std::string& phase) {
    const auto now = Clock::now();
    phases_.emplace_back(phase, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  std::string text(const sluice::Registry& registry) const {
    std::string out = "timings (ms):";
    double total = 0;
    for (const auto& [phase, ms] : phases_) {
      out += fmt::format(" {} {:.1f};", phase, ms);
      total += ms;
    }
    out += fmt::format(" total from main {:.1f}\n", total);
    std::size_t probed = 0;
    std::string loaded;
    for (const auto& p : registry.plugins()) {
      probed += p.described_by == "probed";
      if (registry.library_loaded(p.path)) loaded += (loaded.empty() ? "" : ", ") + std::filesystem::path(p.path).filename().string();
    }
    out += fmt::format("plugins: {} described ({} from the registry cache, {} probed now); loaded into this process: {}\n",
                       registry.plugins().size(), registry.plugins().size() - probed, probed, loaded.empty() ? "none" : loaded);
    return out;
  }

 private:
  Clock::time_point last_ = Clock::now();
  std::vector<std::pair<std::string, double>> phases_;
};

// --checkpoint-every: a count of elements reaching the sinks, or a time ("30s", "5m").
struct CheckpointEvery {
  std::uint64_t elements = 0;
  double seconds = 0;
};

CheckpointEvery parse_checkpoint_every(const std::string& text) {
  CheckpointEvery every;
  if (text.empty()) return every;
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  if (used == 0 || value <= 0 || !(unit.empty() || unit == "s" || unit == "m" || unit == "h"))
    throw sluice::Error(fmt::format("--checkpoint-every {}: give a number of batches (500) or a time (30s, 5m, 1h)", text));
  if (unit.empty()) {
    if (value != static_cast<double>(static_cast<std::uint64_t>(value)))
      throw sluice::Error(fmt::format("--checkpoint-every {}: a number of batches is a whole number", text));
    every.elements = static_cast<std::uint64_t>(value);
  } else {
    every.seconds = value * (unit == "h" ? 3600 : unit == "m" ? 60 : 1);
  }
  return every;
}

// Where checkpoints go, how often, and what to resume from, checked before any work: a run that
// cannot write its first checkpoint would find out only when it matters.
struct CheckpointPlan {
  bool enabled = false;
  CheckpointEvery every;
  std::filesystem::path file;
  std::filesystem::path resume_file;
  std::shared_ptr<const sluice::checkpoint::Checkpoint> resume_from;
  // Or the files of a job of another number of workers, continued by this one (resume_file: their folder).
  std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>> resume_workers;
};

CheckpointPlan plan_checkpoints(const RunOptions& options) {
  CheckpointPlan plan;
  plan.enabled = !options.checkpoint_dir.empty();
  plan.every = parse_checkpoint_every(options.checkpoint_every);
  if (!options.checkpoint_every.empty() && !plan.enabled)
    throw sluice::Error("--checkpoint-every needs --checkpoint DIR (where the checkpoints go)");
  if (plan.enabled && sluice::is_remote_uri(options.checkpoint_dir)) {  // a bucket: nothing to make, written by upload
    plan.file = sluice::checkpoint_file(options.checkpoint_dir);
  } else if (plan.enabled) {
    plan.file = sluice::checkpoint_file(options.checkpoint_dir);
    std::error_code ec;
    const auto folder = plan.file.has_parent_path() ? plan.file.parent_path() : std::filesystem::path(".");
    std::filesystem::create_directories(folder, ec);
    if (!std::filesystem::is_directory(folder))
      throw sluice::Error(fmt::format("--checkpoint {}: cannot make the folder {}{}", options.checkpoint_dir, folder.string(),
                                      ec ? ": " + ec.message() : std::string(" (a file is in the way)")));
    if (std::filesystem::exists(plan.file) && !std::filesystem::is_regular_file(plan.file))
      throw sluice::Error(fmt::format("--checkpoint {}: {} exists and is not a regular file", options.checkpoint_dir, plan.file.string()));
    if (::access(folder.c_str(), W_OK) != 0)
      throw sluice::Error(fmt::format("--checkpoint {}: the folder {} is not writable", options.checkpoint_dir, folder.string()));
  }
  return plan;
}

// The workers of a job given one --checkpoint folder each write their own file in it,
// worker-I-of-N.sluice, and each resumes from its own (one worker: checkpoint.sluice, as before).
std::filesystem::path file_of_worker(const std::string& given, const sluice::WorkerIdentity& worker, const char* option) {
  const std::filesystem::path file = sluice::checkpoint_file(given);
  if (worker.count <= 1) return file;
  if (file.filename() != sluice::kCheckpointFileName)
    throw sluice::Error(fmt::format("{} {}: a file, for {} workers that would replace each other's checkpoints; give a folder "
                                    "(each worker then writes worker-I-of-{}.sluice in it)",
                                    option, given, worker.count, worker.count));
  return file.parent_path() / fmt::format("worker-{}-of-{}.sluice", worker.index, worker.count);
}

// A resumed worker's file is missing: the files of a whole job of another number of workers (or
// one worker's) in its folder, which this job continues, or an error saying what the folder holds.
std::vector<std::filesystem::path> job_to_continue(const std::filesystem::path& wanted, const sluice::WorkerIdentity& worker) {
  const std::filesystem::path folder = wanted.parent_path();
  const auto found = sluice::checkpoints_in_folder(folder);
  std::vector<std::string> names;
  std::set<int> counts;
  for (const auto& f : found) {
    names.push_back(f.name);
    counts.insert(f.index < 0 ? 0 : f.count);  // (0: one worker's checkpoint.sluice)
  }
  if (found.empty()) throw sluice::Error(fmt::format("no checkpoint at {}", wanted.string()));
  if (counts.size() > 1)
    throw sluice::Error(fmt::format("no checkpoint of worker {} of {} at {}, and the folder holds the files of several jobs ({}): keep "
                                    "one job's checkpoint in a folder",
                                    worker.index, worker.count, wanted.string(), fmt::join(names, ", ")));
  if (found.front().index < 0) return {folder / sluice::kCheckpointFileName};
  const int count = found.front().count;
  std::vector<std::filesystem::path> files;
  for (int i = 0; i < count; ++i) {
    if (i >= static_cast<int>(found.size()) || found[static_cast<std::size_t>(i)].index != i)
      throw sluice::Error(fmt::format("{} holds the checkpoint of {} workers without worker {}'s (worker-{}-of-{}.sluice): it holds {}; "
                                      "copy the missing file back",
                                      folder.string(), count, i, i, count, fmt::join(names, ", ")));
    files.push_back(folder / found[static_cast<std::size_t>(i)].name);
  }
  return files;
}

// What the worker identity decides: its checkpoint file, and the checkpoint it resumes from (its
// own, or the whole folder's when the job that took it had another number of workers).
void plan_checkpoints_for_worker(CheckpointPlan& plan, const RunOptions& options, const sluice::WorkerIdentity& worker) {
  if (plan.enabled) plan.file = file_of_worker(options.checkpoint_dir, worker, "--checkpoint");
  if (options.resume.empty()) return;
  plan.resume_file = file_of_worker(options.resume, worker, "--resume");
  std::error_code ec;
  const bool folder_given = !std::filesystem::path(options.resume).has_extension();
  const bool own_file_missing = sluice::is_remote_uri(options.resume)
                                    ? [&] {
                                        for (const auto& f : sluice::checkpoints_in_folder(plan.resume_file.parent_path()))
                                          if (f.name == plan.resume_file.filename().string()) return false;
                                        return true;
                                      }()
                                    : !std::filesystem::exists(plan.resume_file, ec);
  if (folder_given && own_file_missing) {
    const auto files = job_to_continue(plan.resume_file, worker);
    if (files.size() > 1 || worker.count > 1) {
      for (const auto& file : files) plan.resume_workers.push_back(std::make_shared<const sluice::checkpoint::Checkpoint>(sluice::read_checkpoint(file)));
      plan.resume_file = plan.resume_file.parent_path();
      return;
    }
  }
  plan.resume_from = std::make_shared<const sluice::checkpoint::Checkpoint>(sluice::read_checkpoint(plan.resume_file));
}

// One run, from its engine's start to its exit code.
class HeadlessRun {
 public:
  HeadlessRun(std::string file, const RunOptions& options, CheckpointPlan checkpoints)
      : file_(std::move(file)), options_(options), checkpoints_(std::move(checkpoints)) {
    if (checkpoints_.resume_from) sink_elements_at_last_ = checkpoints_.resume_from->sink_elements();
  }

  // Opens the metrics log and endpoint, makes the engine and starts it: 0, or the exit code.
  int start(sluice::Graph graph, const sluice::spec::PipelineSpec& as_run, const std::optional<sluice::MetricsAddress>& address,
            const std::string& as_run_note) {
    try {
      open_metrics_outputs(as_run, address, as_run_note);
      sluice::EngineOptions engine_options;
      engine_options.resume_from = checkpoints_.resume_from;
      engine_options.resume_workers = checkpoints_.resume_workers;
      worker_ = graph.worker;
      engine_options.worker_count = worker_.count;
      engine_options.worker_index = worker_.index;
      engine_options.lineage = !options_.ledger.empty();
      try {
        engine_ = std::make_unique<sluice::Engine>(std::move(graph), engine_options);
      } catch (const std::exception& e) {
        if (!resuming()) throw;
        fmt::print(stderr, "error: cannot resume from {}: {}\n", checkpoints_.resume_file.string(),
                   sluice::printable(e.what(), true));
        return kExitBadInput;
      }
      if (checkpoints_.enabled) {
        if (auto refusals = engine_->checkpoint_refusals(); !refusals.empty()) {
          fmt::print(stderr, "error: --checkpoint: this pipeline cannot be checkpointed:\n");
          for (const auto& r : refusals) fmt::print(stderr, "  {}\n", sluice::printable(r, true));
          return kExitBadInput;
        }
      }
      engine_->subscribe([this](const sluice::metrics::MetricsSnapshot& snapshot) { publish(snapshot); });
      const auto starting = Clock::now();
      if (!start_engine()) return interrupted_while_starting();  // the engine, stopped, ends with this object
      if (resuming()) report_resume(starting);
    } catch (const std::exception& e) {
      if (g_interrupted || g_checkpoint_and_stop) return interrupted_while_starting();
      fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
      return kExitRunFailed;
    }
    return 0;
  }

  static int interrupted_while_starting() {
    fmt::print(stderr, "interrupted while the pipeline was starting: stopped\n");
    return kExitInterrupted;
  }

  // engine_->start(), in which a stage may list a bucket for long (list_files): an interrupt
  // (or a checkpoint's signal: there is nothing to checkpoint yet) stops its remote requests at
  // once rather than after the listing. False when it did.
  bool start_engine() {
    // The signal handlers only set flags, so the watcher looks every 50 ms; the start's end
    // wakes it at once (a plain sleep made every run wait up to 50 ms for it: most of a short
    // run's start).
    std::mutex mutex;
    std::condition_variable returned_cv;
    bool returned = false;
    std::atomic<bool> stopped{false};
    std::thread heed([&] {
      std::unique_lock lock(mutex);
      while (!returned) {
        if (g_interrupted || g_checkpoint_and_stop) {
          stopped.store(true);
          lock.unlock();
          engine_->stop();
          return;
        }
        returned_cv.wait_for(lock, std::chrono::milliseconds(50));
      }
    });
    struct Join {
      std::mutex& mutex;
      std::condition_variable& returned_cv;
      bool& returned;
      std::thread& heed;
      ~Join() {
        {
          std::lock_guard lock(mutex);
          returned = true;
        }
        returned_cv.notify_one();
        heed.join();
      }
    } join{mutex, returned_cv, returned, heed};
    engine_->start();
    return !stopped.load();
  }

  // Until the engine ends: progress, autotune explanations, checkpoints, and interrupts.
  void watch() {
    next_progress_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(every());
    while (!engine_->wait_for(std::chrono::milliseconds(50))) {
      if (g_checkpoint_and_stop && !stopped_for_checkpoint_ && !checkpoint_failed_ && !interrupted_) {
        stopped_for_checkpoint_ = true;
        fmt::print(stderr, "{}signal received: checkpointing at the next batch, then stopping...\n", terminal_ && drawn_ ? "\n" : "");
        drawn_ = 0;
        take_checkpoint(true);
        continue;
      }
      if (checkpoint_due()) take_checkpoint(false);
      if (g_interrupted && !interrupted_) {
        interrupted_ = true;
        interrupted_at_ = Clock::now();
        fmt::print(stderr, "{}interrupted: stopping the pipeline (Ctrl-C again to quit at once)...\n", terminal_ && drawn_ ? "\n" : "");
        engine_->stop();
      }
      exit_if_stuck_after_interrupt();
      explain();
      if (!options_.quiet && Clock::now() >= next_progress_) {
        draw_progress(false);
        next_progress_ += std::chrono::duration_cast<Clock::duration>(every());
      }
    }
  }

  // The report, the metrics log closed, and the exit code the run ends with.
  int finish() {
    auto result = engine_->wait();
    explain();
    if (!options_.quiet && terminal_ && drawn_) draw_progress(true);
    sluice::metrics::MetricsSnapshot final_snapshot;
    {
      std::lock_guard lock(latest_mutex_);
      final_snapshot = latest_.stage_size() ? latest_ : engine_->snapshot();
    }
    if (options_.report) fmt::print("{}", sluice::format_report(final_snapshot));
    std::fflush(stdout);
    if (!options_.ledger.empty() && !write_ledger()) return kExitRunFailed;
    if (log_) {
      try {
        log_->close();
      } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
        return kExitRunFailed;
      }
    }
    if (result.state == sluice::RunState::Failed) {
      fmt::print(stderr, "error: {}\n", sluice::printable(result.error, true));
      return kExitRunFailed;
    }
    if (checkpoint_failed_) return kExitRunFailed;
    if (result.stopped_at_checkpoint) {
      fmt::print(stderr, "stopped at the checkpoint; continue with: sluice run {} --resume {}\n", sluice::printable(file_),
                 sluice::printable(options_.checkpoint_dir));
      return kExitCheckpointed;
    }
    if (interrupted_ || g_interrupted) return kExitInterrupted;
    return every_element_skipped(final_snapshot) ? kExitRunFailed : 0;
  }

 private:
  void open_metrics_outputs(const sluice::spec::PipelineSpec& as_run, const std::optional<sluice::MetricsAddress>& address,
                            const std::string& as_run_note) {
    if (!options_.metrics_log.empty()) {
      log_ = std::make_unique<sluice::MetricsLog>(options_.metrics_log);
      log_->set_pipeline(std::filesystem::absolute(file_).lexically_normal().string(), sluice::pipeline_to_text(as_run));
    }
    if (address) {
      server_ = std::make_unique<sluice::MetricsServer>(*address);
      server_->set_pipeline(fmt::format("# {}, as run{}\n", sluice::printable(file_), as_run_note) + sluice::pipeline_to_text(as_run));
      fmt::print(stderr, "metrics: {} (/metrics, /snapshot, /stream, /pipeline)\n", server_->url());
    }
  }

  // From the engine's metrics thread: every snapshot goes to the log and the endpoint, and the
  // last is kept for the progress line and the report.
  void publish(const sluice::metrics::MetricsSnapshot& snapshot) {
    if (log_) log_->append(snapshot);
    if (server_) server_->publish(snapshot);
    std::lock_guard lock(latest_mutex_);
    latest_ = snapshot;
    if (options_.explain_autotune)
      for (; explained_ < snapshot.autotune().changes_size(); ++explained_)
        unexplained_.push_back(sluice::format_autotune_change(snapshot.autotune().changes(explained_)));
  }

  bool resuming() const { return checkpoints_.resume_from || !checkpoints_.resume_workers.empty(); }

  // --ledger: what the sinks were delivered, this run's and the runs' it resumed (a worker of
  // several writes FILE's name with worker-I-of-N before its extension).
  bool write_ledger() {
    std::filesystem::path file = options_.ledger;
    if (worker_.count > 1)
      file.replace_filename(fmt::format("{}.worker-{}-of-{}{}", file.stem().string(), worker_.index, worker_.count, file.extension().string()));
    try {
      const sluice::DeliveryLedger ledger = engine_->delivery_ledger();
      sluice::write_ledger_file(file.string(), ledger);
      fmt::print(stderr, "delivery ledger written to {} (`sluice ledger {}` says what each epoch delivered)\n", file.string(), file.string());
      return true;
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
      return false;
    }
  }

  void report_resume(Clock::time_point starting) {
    std::uint64_t reread = 0;
    const auto now = engine_->snapshot();
    for (const auto& stage : now.stage()) reread += stage.elements_reread();
    if (!checkpoints_.resume_from) {
      std::uint64_t delivered = 0;
      for (const auto& earlier : checkpoints_.resume_workers) delivered += earlier->sink_elements();
      fmt::print(stderr, "resumed the checkpoint of {} worker{} in {} as worker {} of {} ({} elements had reached their sinks; what none "
                         "delivered is split among the {}) in {:.2f} s\n",
                 checkpoints_.resume_workers.size(), checkpoints_.resume_workers.size() == 1 ? "" : "s", checkpoints_.resume_file.string(),
                 worker_.index, worker_.count, delivered, worker_.count,
                 std::chrono::duration<double>(Clock::now() - starting).count());
      return;
    }
    fmt::print(stderr, "resumed from checkpoint {} ({} elements had reached the sinks) in {:.2f} s ({} held elements read again)\n",
               checkpoints_.resume_from->sequence(), checkpoints_.resume_from->sink_elements(),
               std::chrono::duration<double>(Clock::now() - starting).count(), reread);
  }

  std::chrono::duration<double> every() const {
    return std::chrono::duration<double>(options_.progress_every.value_or(terminal_ ? 0.5 : 10.0));
  }

  // Progress on stderr: redrawn in place on a terminal, plain lines otherwise.
  void draw_progress(bool final) {
    std::string line;
    {
      std::lock_guard lock(latest_mutex_);
      if (latest_.stage_size() == 0) return;
      line = sluice::format_progress(latest_);
    }
    if (terminal_) {
      const std::size_t width = line.size();
      if (line.size() < drawn_) line.append(drawn_ - line.size(), ' ');  // wipe the rest of a longer line
      fmt::print(stderr, "\r{}{}", line, final ? "\n" : "");
      drawn_ = width;
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }

  // --explain-autotune: the tuner's decisions not printed yet, above the progress line.
  void explain() {
    std::vector<std::string> lines;
    {
      std::lock_guard lock(latest_mutex_);
      lines.swap(unexplained_);
    }
    if (lines.empty()) return;
    clear_progress_line();
    for (const auto& line : lines) fmt::print(stderr, "{}\n", sluice::printable(line));
    std::fflush(stderr);
  }

  void clear_progress_line() {
    if (terminal_ && drawn_) {  // the next draw puts it back
      fmt::print(stderr, "\r{}\r", std::string(drawn_, ' '));
      drawn_ = 0;
    }
  }

  std::uint64_t sink_elements_now() {
    std::uint64_t n = checkpoints_.resume_from ? checkpoints_.resume_from->sink_elements() : 0;
    std::lock_guard lock(latest_mutex_);
    for (const auto& stage : latest_.stage())
      if (stage.kind() == "sink") n += stage.elements_in();
    return n;
  }

  // Every N elements reaching the sinks or every S seconds (--checkpoint-every).
  bool checkpoint_due() {
    if (!checkpoints_.enabled || stopped_for_checkpoint_ || checkpoint_failed_ || interrupted_) return false;
    const auto& every = checkpoints_.every;
    return (every.elements > 0 && sink_elements_now() >= sink_elements_at_last_ + every.elements) ||
           (every.seconds > 0 && Clock::now() - last_checkpoint_at_ >= std::chrono::duration<double>(every.seconds));
  }

  // A failed write ends the run: training on without the checkpoints asked for would lose the
  // work they were to keep.
  void take_checkpoint(bool then_stop) {
    try {
      auto taken = engine_->checkpoint(then_stop);
      if (!taken) {  // every source and reader had ended: the run finishes what its buffers hold
        if (then_stop) fmt::print(stderr, "the run is in its last elements (every source has ended): finishing it instead of checkpointing\n");
        return;
      }
      sluice::write_checkpoint(checkpoints_.file, *taken);
      sink_elements_at_last_ = taken->sink_elements();
      last_checkpoint_at_ = Clock::now();
      clear_progress_line();
      fmt::print(stderr, "checkpoint {} written to {} ({} elements had reached the sinks; cut in {:.3f} s)\n", taken->sequence(),
                 checkpoints_.file.string(), taken->sink_elements(), taken->save_seconds());
      std::fflush(stderr);
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: checkpoint: {}\n", sluice::printable(e.what(), true));
      checkpoint_failed_ = true;
      engine_->stop();
    }
  }

  // A stage stuck inside a call that ignores the stop (a read that never returns) must not keep
  // the process: the promise is a stop within a second, so past a grace period it exits.
  void exit_if_stuck_after_interrupt() {
    constexpr auto kStopGrace = std::chrono::seconds(2);
    if (!interrupted_ || Clock::now() - interrupted_at_ <= kStopGrace) return;
    fmt::print(stderr, "error: the pipeline did not stop within {} s of the interrupt (a stage is blocked in a call "
                       "that does not return); exiting, outputs stay .partial\n",
               std::chrono::duration_cast<std::chrono::seconds>(kStopGrace).count());
    std::fflush(stderr);
    std::_Exit(kExitInterrupted);
  }

  // Under the skip policy a run whose every element was skipped "succeeds" with nothing done:
  // that is a failure the user must see, not an exit 0.
  static bool every_element_skipped(const sluice::metrics::MetricsSnapshot& final_snapshot) {
    std::uint64_t skipped = 0, reached_sinks = 0;
    for (const auto& stage : final_snapshot.stage()) {
      skipped += stage.errors_skipped();
      if (stage.kind() == "sink") reached_sinks += stage.elements_in();
    }
    if (skipped == 0 || reached_sinks > 0) return false;
    fmt::print(stderr, "error: every element was skipped ({} skipped, none reached a sink); the reasons are listed above\n", skipped);
    return true;
  }

  const std::string file_;
  const RunOptions& options_;
  const CheckpointPlan checkpoints_;
  sluice::WorkerIdentity worker_;
  std::unique_ptr<sluice::MetricsLog> log_;
  std::unique_ptr<sluice::MetricsServer> server_;
  std::unique_ptr<sluice::Engine> engine_;
  // The last published snapshot: the progress line reads it, and the report is made from the
  // final one, the same one the metrics log ends with.
  std::mutex latest_mutex_;
  sluice::metrics::MetricsSnapshot latest_;
  std::vector<std::string> unexplained_;
  int explained_ = 0;
  const bool terminal_ = ::isatty(STDERR_FILENO) != 0;
  std::size_t drawn_ = 0;
  Clock::time_point next_progress_;
  bool interrupted_ = false, stopped_for_checkpoint_ = false, checkpoint_failed_ = false;
  Clock::time_point interrupted_at_, last_checkpoint_at_ = Clock::now();
  std::uint64_t sink_elements_at_last_ = 0;
};

}  // namespace

int cmd_run(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets,
            std::optional<std::uint64_t> seed, const WorkerArgs& worker_args, const RunOptions& options) {
  PhaseClock clock;
  std::optional<sluice::MetricsAddress> metrics_address;
  CheckpointPlan checkpoints;
  // Interrupts are caught from here on, not only once the engine runs: on a cold start, probing
  // the plugins takes a while, and a Ctrl-C then must still end with 130 and say so.
  install_interrupt_handler(!options.checkpoint_dir.empty());
  try {
    if (!options.metrics_addr.empty()) metrics_address = sluice::parse_metrics_address(options.metrics_addr);
    checkpoints = plan_checkpoints(options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
  clock.mark("options");
  sluice::Registry registry;
  load_plugins(registry, common, true);
  clock.mark("plugins described");
  sluice::spec::PipelineSpec as_run;
  std::string skip_records;
  if (!options.skip_records.empty()) {
    std::ifstream in(options.skip_records, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) {
      fmt::print(stderr, "error: --skip-records {}: it cannot be read\n", sluice::printable(options.skip_records));
      return kExitBadInput;
    }
    skip_records = text.str();
  }
  std::optional<sluice::Graph> graph;
  try {
    graph = load_graph(registry, file, sets, seed, worker_args, &as_run, {}, skip_records);
  } catch (const sluice::Error& e) {  // (the records to skip: a line that does not read, named)
    fmt::print(stderr, "error: --skip-records {}: {}\n", sluice::printable(options.skip_records), sluice::printable(e.what(), true));
    return kExitBadInput;
  }
  clock.mark("pipeline read and checked");
  if (g_interrupted) {
    fmt::print(stderr, "interrupted before the pipeline started; nothing ran\n");
    return kExitInterrupted;
  }
  if (!graph) return kExitBadInput;
  try {
    plan_checkpoints_for_worker(checkpoints, options, graph->worker);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
  if (!options.remote_cache.empty()) graph->remote.cache_dir = options.remote_cache;
  for (const auto& st : graph->stages)
    for (const auto& note : st.notes) fmt::print(stderr, "note: stage '{}': {}\n", st.id, note);

  const bool changed = !sets.empty() || seed || graph->worker.count != 1;
  HeadlessRun run(file, options, std::move(checkpoints));
  if (int code = run.start(std::move(*graph), as_run, metrics_address,
                           changed ? " (with --set/--seed and the worker's shard applied)" : "")) return code;
  clock.mark("engine started");
  run.watch();
  clock.mark("ran");
  const int code = run.finish();
  clock.mark("report");
  if (options.timings) fmt::print(stderr, "{}", clock.text(registry));
  return code;
}

}  // namespace sluice_cli
