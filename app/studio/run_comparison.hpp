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
  QString file;                 // the pipeline file it read, absolute; empty when none (untitled)
};

// The differences a person made between two versions of a pipeline, one line each ("stage
// 'decode': parallelism 2 -> 3"); positions on the canvas are not differences.
QStringList pipeline_changes(const spec::PipelineSpec& before, const spec::PipelineSpec& after);

// Elements per second out of the pipeline over a run: the sum over the stages no stage reads.
double output_rate(const metrics::MetricsSnapshot& snapshot);

// The differences between two pipelines' graphs (a stage added or removed, another operator,
// other inputs): what makes them two pipelines rather than two versions of one.
QStringList graph_changes(const spec::PipelineSpec& before, const spec::PipelineSpec& after);

// Why two runs cannot be compared; nothing when they can. Runs of one pipeline file compare
// whatever was edited between them; runs of two files (or of none) compare only when their graphs
// are the same, only settings changed. A failed run is compared with nothing: its rates are of
// the moments before the failure.
std::optional<QString> why_not_comparable(const EndedRun& before, const EndedRun& after);

// The comparison as the Verdict shows it (HTML: a line of changes, then a table).
QString comparison_html(const EndedRun& before, const EndedRun& after);

}  // namespace sluice::studio
