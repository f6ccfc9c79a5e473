#pragma once
// Two ended runs of one pipeline side by side, as the Verdict shows them after a change: what
// changed in the pipeline, and what it bought (elements/s out, the run's length, the bottleneck,
// each stage's workers, busy share and rate).
#include <QString>
#include <QStringList>
#include <optional>

#include "metrics.pb.h"
#include "pipeline.pb.h"

namespace sluice::studio {

struct EndedRun {
  metrics::MetricsSnapshot final_snapshot;
  spec::PipelineSpec pipeline;  // as it ran (a log's copy for a metrics log)
  QString source;               // "run of train.txtpb", "metrics log run.jsonl"
};

// The differences a person made between two versions of a pipeline, one line each ("stage
// 'decode': parallelism 2 -> 3"); positions on the canvas are not differences.
QStringList pipeline_changes(const spec::PipelineSpec& before, const spec::PipelineSpec& after);

// Elements per second out of the pipeline over a run: the sum over the stages no stage reads.
double output_rate(const metrics::MetricsSnapshot& snapshot);

// Why two runs cannot be compared (no stage in common: another pipeline); nothing when they can.
std::optional<QString> why_not_comparable(const EndedRun& before, const EndedRun& after);

// The comparison as the Verdict shows it (HTML: a line of changes, then a table).
QString comparison_html(const EndedRun& before, const EndedRun& after);

}  // namespace sluice::studio
