#include "autotune.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "sluice/core/text.hpp"

namespace sluice::detail {
namespace {

// A stage counts as able to keep up while its workers are busy at most this much of the time.
constexpr double kUsable = 0.92;
// Workers are sized so that each would be busy this much at the target speed.
constexpr double kTarget = 0.9;
// Below this many busy cores a stage says nothing about the pipeline's speed.
constexpr double kIdle = 0.02;
constexpr std::size_t kLargestBuffer = 1 << 16;

std::string workers_text(int n) { return fmt::format("{} worker{}", n, n == 1 ? "" : "s"); }

}  // namespace

// Windows an increase is watched for before it is judged (the first one lets it settle), and
// windows a ceiling found that way holds (costs change; then it is tried again).
constexpr int kTrialWindows = 3;
constexpr int kCeilingWindows = 80;
constexpr int kStartWindows = 2;
// A stage grows only while its workers are this busy: one with time to spare is held up
// elsewhere, and more workers would only wait.
constexpr double kBusyToGrow = 0.7;

std::vector<TuneChange> Autotuner::plan(const std::vector<TunedStage>& stages, double output_rate) {
  std::vector<TuneChange> changes;
  if (ceiling_.size() != stages.size()) {
    ceiling_.clear();
    for (const auto& s : stages) ceiling_.push_back(s.max_workers);
    ceiling_lapses_.assign(stages.size(), 0);
    slowdowns_.assign(stages.size(), 0);
  }
  for (std::size_t i = 0; i < stages.size(); ++i)
    if (ceiling_lapses_[i] != 0 && windows_ >= ceiling_lapses_[i]) {  // costs change: try again, once in a while
      ceiling_[i] = stages[i].max_workers;
      ceiling_lapses_[i] = 0;
    }
  rates_.push_front(output_rate);
  if (rates_.size() > 8) rates_.pop_back();
  // The first windows are the start-up (threads, files opening): nothing to judge by yet.
  if (++windows_ <= kStartWindows) return changes;
  if (!undo_increases_that_slowed(stages, changes)) plan_workers(stages, changes);
  plan_buffers(stages, changes);
  if (!trial_) {
    Trial trial;
    for (const auto& c : changes)
      if (!c.buffer && c.to > c.from) trial.raised.emplace_back(c.stage, static_cast<int>(c.from));
    if (!trial.raised.empty()) {
      trial.rate_before = rates_[0];
      trial_ = std::move(trial);
    }
  }
  return changes;
}

bool Autotuner::undo_increases_that_slowed(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes) {
  if (!trial_ || ++trial_->windows < kTrialWindows) return false;
  const Trial trial = std::move(*trial_);
  trial_.reset();
  double after = 0;
  for (int k = 0; k < kTrialWindows - 1; ++k) after += rates_[static_cast<std::size_t>(k)];
  after /= kTrialWindows - 1;
  if (trial.rate_before <= 0 || after >= 0.9 * trial.rate_before) return false;
  for (const auto& [i, before] : trial.raised) {
    const auto& s = stages[static_cast<std::size_t>(i)];
    ceiling_[static_cast<std::size_t>(i)] = before;
    // Each time it slows the pipeline again, the ceiling holds twice as long.
    const int holds = kCeilingWindows << std::min(slowdowns_[static_cast<std::size_t>(i)]++, 6);
    ceiling_lapses_[static_cast<std::size_t>(i)] = windows_ + holds;
    if (s.workers <= before) continue;
    changes.push_back({i, false, s.workers, before, 0,
                       fmt::format("the pipeline ran slower with {}: {:.0f} elements/s at its end against {:.0f} before; back to {}, "
                                   "and no more for the next {:.0f} s",
                                   workers_text(s.workers), after, trial.rate_before, before, holds * 0.25)});
  }
  return true;
}

void Autotuner::plan_workers(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes) {
  const int n = static_cast<int>(stages.size());
  double total_load = 0, fixed_load = 0;
  int tuned = 0;
  for (const auto& s : stages) {
    total_load += s.busy_cores;
    if (s.tunes_workers) ++tuned;
    else fixed_load += s.busy_cores;
  }
  // The cores the tuned stages may keep busy at once: the budget less what the others use now,
  // rounded up from a fifth of a core (rounding 1.45 cores down to 1 would make two tuned stages
  // take turns on one core while the other idles).
  cores_for_tuned_ = std::max(1, static_cast<int>(std::floor(budgets_.cores - fixed_load + 0.8)));
  if (tuned == 0 || total_load < kIdle) return;  // nothing to tune, or nothing ran in the window

  // How much faster the pipeline could run, and what holds it there.
  double speedup = budgets_.cores / total_load;
  std::string limit = fmt::format("the CPU budget of {:.3g} cores", budgets_.cores);
  for (const auto& s : stages) {
    if (s.busy_cores < kIdle) continue;
    const int most = s.tunes_workers ? s.max_workers : s.workers;
    const double can = most * kUsable / s.busy_cores;
    if (can < speedup) {
      speedup = can;
      limit = s.tunes_workers ? fmt::format("stage '{}' at its most {}", s.id, workers_text(most))
                              : fmt::format("stage '{}' on its {}", s.id, workers_text(most));
    }
  }
  // Each tuned stage: the workers that speed needs, each busy kTarget of the time. Their sum may
  // pass the budget (a worker is not a core): the engine lets only cores_for_tuned() of them work
  // at once.
  std::vector<int> proposal(n, 0);
  std::vector<double> need(n, 0);
  for (int i = 0; i < n; ++i) {
    if (!stages[i].tunes_workers) continue;
    need[i] = stages[i].busy_cores * speedup;
    proposal[i] = std::clamp(static_cast<int>(std::ceil(need[i] / kTarget - 1e-9)), 1,
                             std::min(stages[i].max_workers, ceiling_[static_cast<std::size_t>(i)]));
  }
  proposals_.push_front(proposal);
  if (proposals_.size() > static_cast<std::size_t>(kCalmWindows)) proposals_.pop_back();

  // One stage grows at a time, the one that needs it most, so that a trial's outcome is its own.
  int grow = -1;
  if (!trial_)
    for (int i = 0; i < n; ++i)
      if (stages[i].tunes_workers && proposal[i] > stages[i].workers && stages[i].busy_cores >= kBusyToGrow * stages[i].workers &&
          (grow < 0 || need[i] / stages[i].workers > need[grow] / stages[grow].workers))
        grow = i;
  for (int i = 0; i < n; ++i) {
    const auto& s = stages[i];
    if (!s.tunes_workers) continue;
    int target = proposal[i];
    if (target > s.workers && i != grow) continue;
    if (target < s.workers) {
      // Fewer only when the last windows all agree, and to the most any of them wanted.
      if (proposals_.size() < static_cast<std::size_t>(kCalmWindows)) continue;
      int largest = 0;
      for (const auto& p : proposals_) largest = std::max(largest, p[i]);
      target = std::min(s.workers, largest);
    }
    if (target == s.workers) continue;
    const double busy = s.workers > 0 ? 100.0 * s.busy_cores / s.workers : 0.0;
    std::string reason =
        target > s.workers
            ? fmt::format("busy {:.0f}% of the time on its {}; the pipeline could run {:.2g}x as fast before {} holds it "
                          "back, and at that speed this stage needs {:.1f} cores",
                          busy, workers_text(s.workers), speedup, limit, need[i])
            : fmt::format("busy {:.0f}% of the time on its {} for {} windows in a row: {} {} up with the speed {} allows", busy,
                          workers_text(s.workers), kCalmWindows, workers_text(target), target == 1 ? "keeps" : "keep", limit);
    changes.push_back({i, false, s.workers, target, 0, std::move(reason)});
  }
}

void Autotuner::plan_buffers(const std::vector<TunedStage>& stages, std::vector<TuneChange>& changes) {
  full_windows_.resize(stages.size(), 0);
  std::uint64_t held = 0;  // bytes the buffers may hold together now
  for (const auto& s : stages)
    if (s.has_buffer) held += s.byte_limit > 0 ? s.byte_limit : s.capacity * s.mean_element_bytes;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    if (!s.tunes_buffer || !s.has_buffer) continue;
    if (s.swings >= 2 || (s.empty_fraction > 0.1 && s.full_fraction > 0.1)) {
      full_windows_[i] = 0;
      if (s.capacity >= kLargestBuffer) continue;
      std::uint64_t bytes = s.byte_limit * 2;
      const std::uint64_t others = held - s.byte_limit;
      if (others + bytes > budgets_.buffer_bytes) bytes = budgets_.buffer_bytes > others ? budgets_.buffer_bytes - others : 0;
      if (bytes <= s.byte_limit) continue;  // at the RAM budget
      const std::size_t capacity = std::min(kLargestBuffer, s.capacity * 2);
      held += bytes - s.byte_limit;
      changes.push_back({static_cast<int>(i), true, static_cast<std::int64_t>(s.capacity), static_cast<std::int64_t>(capacity), bytes,
                         fmt::format("went from empty to full and back {} times, empty {:.0f}% and full {:.0f}% of the time: a "
                                     "larger buffer absorbs the swings (up to {})",
                                     s.swings, 100 * s.empty_fraction, 100 * s.full_fraction, byte_size_text(bytes))});
    } else if (s.full_fraction > 0.95) {
      if (++full_windows_[i] < kCalmWindows || s.capacity <= kSmallestBuffer) continue;
      full_windows_[i] = 0;
      const std::size_t capacity = std::max(kSmallestBuffer, s.capacity / 2);
      const std::uint64_t bytes = std::max<std::uint64_t>(s.byte_limit / 2, 1);
      held -= s.byte_limit - bytes;
      changes.push_back({static_cast<int>(i), true, static_cast<std::int64_t>(s.capacity), static_cast<std::int64_t>(capacity), bytes,
                         fmt::format("stayed full for {} windows: its reader is the slower side, and the memory is better "
                                     "left free",
                                     kCalmWindows)});
    } else {
      full_windows_[i] = 0;
    }
  }
}

}  // namespace sluice::detail
