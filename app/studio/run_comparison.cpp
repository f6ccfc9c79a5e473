#include "run_comparison.hpp"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <QDir>
#include <QFileInfo>
#include <QSet>
#include <functional>
#include <map>

#include "canvas.hpp"  // short_number

namespace sluice::studio {

namespace {
QString quoted(const std::string& id) { return "'" + QString::fromStdString(id) + "'"; }

QString workers_text(int parallelism) { return parallelism < 0 ? QString("auto") : QString::number(std::max(1, parallelism)); }
QString buffer_text(int size) { return size < 0 ? QString("auto") : size == 0 ? QString("engine's") : QString::number(size); }

// As a pipeline file spells it; unset is the pipeline's own policy, not an enum's name.
QString policy_text(spec::ErrorPolicy policy) {
  return policy == spec::ERROR_POLICY_UNSET ? QString("the pipeline's") : QString::fromStdString(spec::ErrorPolicy_Name(policy));
}

QString short_text(const google::protobuf::Message& message) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(message, &text);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text.empty() ? QString("default") : QString::fromStdString(text);
}

void stage_changes(const spec::Stage& a, const spec::Stage& b, QStringList& out) {
  const QString who = "stage " + quoted(a.id());
  if (a.op() != b.op()) out << QString("%1: operator %2 -> %3").arg(who, QString::fromStdString(a.op()), QString::fromStdString(b.op()));
  if (!std::equal(a.input().begin(), a.input().end(), b.input().begin(), b.input().end())) {
    QStringList x, y;
    for (const auto& in : a.input()) x << QString::fromStdString(in);
    for (const auto& in : b.input()) y << QString::fromStdString(in);
    out << QString("%1: inputs %2 -> %3").arg(who, x.join(", "), y.join(", "));
  }
  if (a.parallelism() != b.parallelism())
    out << QString("%1: parallelism %2 -> %3").arg(who, workers_text(a.parallelism()), workers_text(b.parallelism()));
  if (a.buffer_size() != b.buffer_size())
    out << QString("%1: buffer %2 -> %3").arg(who, buffer_text(a.buffer_size()), buffer_text(b.buffer_size()));
  std::map<std::string, std::string> pa(a.params().begin(), a.params().end()), pb(b.params().begin(), b.params().end());
  for (const auto& [key, value] : pa) {
    auto it = pb.find(key);
    if (it == pb.end()) out << QString("%1: %2 removed (was %3)").arg(who, QString::fromStdString(key), QString::fromStdString(value));
    else if (it->second != value)
      out << QString("%1: %2 %3 -> %4").arg(who, QString::fromStdString(key), QString::fromStdString(value), QString::fromStdString(it->second));
  }
  for (const auto& [key, value] : pb)
    if (!pa.count(key)) out << QString("%1: %2 = %3").arg(who, QString::fromStdString(key), QString::fromStdString(value));
  using google::protobuf::util::MessageDifferencer;
  if (a.error_policy() != b.error_policy())
    out << QString("%1: error policy %2 -> %3")
               .arg(who, policy_text(a.error_policy()), policy_text(b.error_policy()));
  if (!MessageDifferencer::Equals(a.interleave(), b.interleave()))
    out << QString("%1: interleave %2 -> %3").arg(who, short_text(a.interleave()), short_text(b.interleave()));
  if (a.per_input() != b.per_input()) out << QString("%1: per input %2").arg(who, b.per_input() ? "on" : "off");
  if (a.has_deterministic() != b.has_deterministic() || a.deterministic() != b.deterministic())
    out << QString("%1: deterministic %2").arg(who, b.has_deterministic() ? (b.deterministic() ? "true" : "false") : "the pipeline's");
}

// Stages paired by id: the added and removed ones told here, what changed in a kept one told by
// `kept_stage` (every setting for pipeline_changes, the graph only for graph_changes).
void compare_stages(const spec::PipelineSpec& before, const spec::PipelineSpec& after, QStringList& out,
                    const std::function<void(const spec::Stage& was, const spec::Stage& now)>& kept_stage) {
  std::map<std::string, const spec::Stage*> old_stages;
  for (const auto& st : before.stage()) old_stages[st.id()] = &st;
  QSet<QString> kept;
  for (const auto& st : after.stage()) {
    auto it = old_stages.find(st.id());
    if (it == old_stages.end()) {
      out << QString("stage %1 added (%2)").arg(quoted(st.id()), QString::fromStdString(st.op()));
      continue;
    }
    kept.insert(QString::fromStdString(st.id()));
    kept_stage(*it->second, st);
  }
  for (const auto& st : before.stage())
    if (!kept.contains(QString::fromStdString(st.id()))) out << QString("stage %1 removed").arg(quoted(st.id()));
}
}  // namespace

QStringList pipeline_changes(const spec::PipelineSpec& before, const spec::PipelineSpec& after) {
  QStringList out;
  if (!google::protobuf::util::MessageDifferencer::Equals(before.options(), after.options()))
    out << QString("pipeline options: %1 -> %2").arg(short_text(before.options()), short_text(after.options()));
  compare_stages(before, after, out, [&](const spec::Stage& was, const spec::Stage& now) { stage_changes(was, now, out); });
  return out;
}

double output_rate(const metrics::MetricsSnapshot& snapshot) {
  QSet<QString> read;
  for (const auto& st : snapshot.stage())
    for (const auto& in : st.inputs()) read.insert(QString::fromStdString(in));
  double rate = 0;
  for (const auto& st : snapshot.stage())
    if (!read.contains(QString::fromStdString(st.id()))) rate += st.elements_per_s();
  return rate;
}

QStringList graph_changes(const spec::PipelineSpec& before, const spec::PipelineSpec& after) {
  QStringList out;
  compare_stages(before, after, out, [&](const spec::Stage& was, const spec::Stage& now) {
    if (was.op() != now.op())
      out << QString("stage %1: operator %2 -> %3").arg(quoted(now.id()), QString::fromStdString(was.op()), QString::fromStdString(now.op()));
    if (!std::equal(was.input().begin(), was.input().end(), now.input().begin(), now.input().end()))
      out << QString("stage %1: other inputs").arg(quoted(now.id()));
  });
  return out;
}

namespace {
QString run_of(const EndedRun& run) {
  return run.file.isEmpty() ? run.source : QString("%1 (a run of %2)").arg(run.source, run.file);
}
}  // namespace

std::optional<QString> why_not_comparable(const EndedRun& before, const EndedRun& after) {
  for (const EndedRun* run : {&before, &after})
    if (run->final_snapshot.state() == "failed")
      return QString("%1 failed after %2 s: its rates are of the moments before the failure; compare runs that finished or were stopped")
          .arg(run->source)
          .arg(run->final_snapshot.elapsed_s(), 0, 'f', 2);
  QSet<QString> ids;
  for (const auto& st : before.final_snapshot.stage()) ids.insert(QString::fromStdString(st.id()));
  bool shared = false;
  for (const auto& st : after.final_snapshot.stage()) shared = shared || ids.contains(QString::fromStdString(st.id()));
  if (!shared) return QString("%1 and %2 have no stage in common: they are runs of different pipelines").arg(run_of(before), run_of(after));
  auto path = [](const QString& file) { return QDir::cleanPath(QFileInfo(file).absoluteFilePath()); };
  if (!before.file.isEmpty() && !after.file.isEmpty() && path(before.file) == path(after.file))
    return std::nullopt;  // one file, edited between its runs
  const QStringList changes = graph_changes(before.pipeline, after.pipeline);
  if (changes.isEmpty()) return std::nullopt;
  return QString("%1 and %2 are runs of different pipelines (%3); stages of the same name are not the same stages")
      .arg(run_of(before), run_of(after), changes.mid(0, 3).join("; ") + (changes.size() > 3 ? "; …" : ""));
}

QString comparison_html(const EndedRun& before, const EndedRun& after) {
  const QStringList changes = pipeline_changes(before.pipeline, after.pipeline);
  const QString earlier = before.source == after.source ? QString("the previous run") : before.source;
  QString html = QString("<b>Compared with %1</b> (%2):").arg(earlier.toHtmlEscaped(),
                                                                  changes.isEmpty() ? QString("the same pipeline")
                                                                                    : "changed: " + changes.join("; ").toHtmlEscaped());
  auto ratio = [](double was, double now) {
    if (!(was > 0) || !(now > 0)) return QString();
    return QString(" (%1%2%)").arg(now >= was ? "+" : "").arg((now / was - 1) * 100, 0, 'f', 0);
  };
  const auto& a = before.final_snapshot;
  const auto& b = after.final_snapshot;
  auto bottleneck = [](const metrics::MetricsSnapshot& s) {
    if (!s.failed_stage().empty()) return "failed at " + QString::fromStdString(s.failed_stage());
    return s.bottleneck().empty() ? QString("none") : QString::fromStdString(s.bottleneck());
  };
  html += "<table cellspacing='0' cellpadding='3' border='1' style='border-collapse:collapse'>";
  html += "<tr><th align='left'></th><th>before</th><th>now</th></tr>";
  auto row = [&](const QString& what, const QString& was, const QString& now) {
    html += QString("<tr><td>%1</td><td align='right'>%2</td><td align='right'>%3</td></tr>").arg(what.toHtmlEscaped(), was.toHtmlEscaped(), now.toHtmlEscaped());
  };
  row("elements/s out", short_number(output_rate(a)), short_number(output_rate(b)) + ratio(output_rate(a), output_rate(b)));
  row("length (s)", QString::number(a.elapsed_s(), 'f', 2), QString::number(b.elapsed_s(), 'f', 2));
  row("bottleneck", bottleneck(a), bottleneck(b));
  std::map<std::string, const metrics::StageMetrics*> old_stages;
  for (const auto& st : a.stage()) old_stages[st.id()] = &st;
  html += "<tr><th align='left'>stage</th><th>workers, busy, elements/s</th><th>workers, busy, elements/s</th></tr>";
  auto stage_text = [](const metrics::StageMetrics& st) {
    return QString("%1 wk, %2%, %3").arg(st.workers()).arg(st.busy_fraction() * 100, 0, 'f', 0).arg(short_number(st.elements_per_s()));
  };
  for (const auto& st : b.stage()) {
    auto it = old_stages.find(st.id());
    row(QString::fromStdString(st.id()), it == old_stages.end() ? QString("(not there)") : stage_text(*it->second), stage_text(st));
  }
  return html + "</table>";
}

}  // namespace sluice::studio
