#pragma once
// The autotuner's decisions, apart from the engine that applies them: given what each stage did
// in the last window (busy time, buffer swings), how many workers each tuned stage should have
// and how large each tuned buffer should be, within the CPU and RAM budgets.
//
// Workers: a stage's busy time per second is the cores it uses at the pipeline's present speed,
// and the cores it needs grow in proportion to the speed. The pipeline can run as much faster as
// its tightest limit allows: a fixed stage's workers, a tuned stage's most workers, or the CPU
// budget shared by all. Each tuned stage gets the workers that speed needs; the budget itself is
// kept by the engine, which lets only cores_for_tuned() of those workers compute at a time (two
// stages needing 1.5 and 0.5 cores get 2 workers and 1, and share 2 cores). Workers are taken
// away only when three windows in a row say so, so that a noisy window does not make them swing.
// And the model is checked against the pipeline: an increase after which the pipeline ran more
// than 10% slower is undone, and the stage gets no more than that for the next 20 seconds (40,
// 80... after further slowdowns). One stage grows at a time, so that each trial says what that
// stage's workers did, and only while its workers are busy 70% of the time or more.
//
// Buffers: one that swung between empty and full doubles, while the buffers' share of the RAM
// budget allows; one that stayed full for three windows halves (its consumer is the slower side,
// and the memory is better elsewhere).
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace sluice::detail {

struct TunedStage {
  std::string id;
  bool tunes_workers = false, tunes_buffer = false;
  int workers = 1;      // running now
  int max_workers = 1;  // tuned: what it may get
  double busy_cores = 0;  // busy time in the window over the window's length
  bool has_buffer = false;
  std::size_t capacity = 0;        // elements
  std::uint64_t byte_limit = 0;    // 0: elements only
  double empty_fraction = 0, full_fraction = 0;  // of the window
  std::uint64_t swings = 0;                      // in the window
  std::uint64_t mean_element_bytes = 0;          // of what went through the buffer lately
};

struct TuneBudgets {
  double cores = 1;
  std::uint64_t buffer_bytes = 0;  // for every buffer together
};

struct TuneChange {
  int stage = -1;
  bool buffer = false;  // false: workers
  std::int64_t from = 0, to = 0;
  std::uint64_t byte_limit = 0;  // buffers: the new byte limit
  std::string reason;
};

class Autotuner {
 public:
  explicit Autotuner(TuneBudgets budgets) : budgets_(budgets) {}
  // The changes for this window; `stages` in pipeline order, `output_rate` what reached the
  // pipeline's end per second in the window.
  std::vector<TuneChange> plan(const std::vector<TunedStage>& stages, double output_rate);
  // After plan(): how many workers of tuned stages may work at the same moment, so that the CPU
  // budget holds at every moment whatever the worker counts (at least 1).
  int cores_for_tuned() const { return cores_for_tuned_; }

  static constexpr int kCalmWindows = 3;  // windows that must agree before anything shrinks
  static constexpr std::size_t kSmallestBuffer = 64;

 private:
  void plan_workers(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes);
  // Undoes the last increase when the pipeline ran slower since (a hand-off per element can cost
  // more than a second worker brings); the count it came from becomes the stage's ceiling.
  bool undo_increases_that_slowed(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes);
  void plan_buffers(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes);

  TuneBudgets budgets_;
  int cores_for_tuned_ = 1;
  int windows_ = 0;
  std::deque<std::vector<int>> proposals_;  // the last windows' worker proposals, newest first
  std::vector<int> full_windows_;           // per stage: windows in a row its buffer stayed full
  std::deque<double> rates_;                // output rate of the last windows, newest first
  std::vector<int> ceiling_;                // per stage: most workers found to help
  std::vector<int> ceiling_lapses_;         // per stage: the window its ceiling lapses (0: none)
  std::vector<int> slowdowns_;              // per stage: increases undone so far
  // The increases of one window, on trial until kTrialWindows have passed.
  struct Trial {
    std::vector<std::pair<int, int>> raised;  // (stage, count before)
    double rate_before = 0;
    int windows = 0;
  };
  std::optional<Trial> trial_;
};

}  // namespace sluice::detail
