#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "metrics.pb.h"

namespace sluice {

struct Bottleneck {
  int stage = -1;  // index into the snapshot's stages; -1 when there is nothing to say
  std::string reason;
};

// The stage that limits throughput: busy while its input is full and its output empty.
// Sources count as having a full input, sinks an empty output.
Bottleneck find_bottleneck(const metrics::MetricsSnapshot& snapshot);
// Whether the snapshot's bottleneck clearly holds the pipeline up (its input full, its output
// empty); false when none is named or the busiest stage is named only as such ("no stage is
// clearly held up"): then nothing is to be marked as the bottleneck.
bool bottleneck_holds_up(const metrics::MetricsSnapshot& snapshot);

// A change that would help, with the figures behind it (`text`), and what applying it means to the
// pipeline when a tool can apply it (the studio's verdict panel does, as one undoable step).
struct Suggestion {
  enum class Change {
    None,            // advice only (a faster sink, cheaper work, moving a shard)
    SetParallelism,  // `stage` and the stages in `together` (its fused group) to `value` workers
    AddCacheAfter,   // a `cache` stage between `stage` and its consumer
    SetBufferSize,   // `stage`'s output buffer to `value` elements
    SkipFailures,    // `stage`'s error policy to skip (a run stopped at one of its elements)
  };
  std::string text;
  Change change = Change::None;
  std::string stage;
  std::vector<std::string> together;
  std::int64_t value = 0;
};

// Concrete changes that would help, each with the figures behind it: raise the parallelism of
// the bottleneck, add a cache after a deterministic expensive stage recomputed every epoch, grow
// a buffer that swings between empty and full, move a shard before the work it throws away.
std::vector<Suggestion> suggestions_for(const metrics::MetricsSnapshot& snapshot);
// After a run that stopped at an element a stage failed on, where skipping is the advice (the
// stage had passed elements before: not parameters that fit no data): skip such elements.
std::optional<Suggestion> suggestion_after_failure(const metrics::MetricsSnapshot& snapshot);
// The same, as the report's "What would help" lines.
std::vector<std::string> suggest_changes(const metrics::MetricsSnapshot& snapshot);

// The end-of-run table: per stage elements, rates, busy/starved/blocked, buffer fill, skips,
// then the bottleneck and the skip reasons.
std::string format_report(const metrics::MetricsSnapshot& snapshot);

// One decision of the autotuner as a log line (`sluice run --explain-autotune`):
// "0:03.1 autotune: 'decode' workers 2 -> 6: busy 98% of its 2 workers; ...".
std::string format_autotune_change(const metrics::AutotuneChange& change);
// The report's autotune section: the budgets and where they come from, then per stage and
// setting what the tuner did (first and final value, when, and the last reason). Empty when the
// pipeline does not autotune.
std::string format_autotune_summary(const metrics::MetricsSnapshot& snapshot);
// (lineage) The delivery ledger's verdicts in the snapshot, as `sluice ledger` prints them (one
// line an epoch, without the records named); empty where the run keeps no ledger.
std::string format_ledger_summary(const metrics::MetricsSnapshot& snapshot);

// One line of progress: time, elements (and batches), recent elements/s, epoch, how far the
// sources are and the ETA when they know their size, the bottleneck.
std::string format_progress(const metrics::MetricsSnapshot& snapshot);

}  // namespace sluice
