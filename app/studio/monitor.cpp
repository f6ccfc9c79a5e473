#include "monitor.hpp"

#include <QDateTime>
#include <QHeaderView>
#include <QSplitter>
#include <QVBoxLayout>

#include "canvas.hpp"

namespace sluice::studio {

namespace {
QChartView* make_chart(const QString& title, QValueAxis*& x, QValueAxis*& y, const QString& y_title) {
  auto* chart = new QChart;
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignRight);
  QFont small = chart->legend()->font();
  small.setPointSizeF(small.pointSizeF() * 0.8);
  chart->legend()->setFont(small);
  chart->setMargins(QMargins(4, 4, 4, 4));
  x = new QValueAxis;
  x->setTitleText("seconds");
  x->setLabelFormat("%.0f");
  y = new QValueAxis;
  y->setTitleText(y_title);
  y->setLabelFormat(y_title == "elements/s" ? "%.0f" : "%.2f");
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  auto* view = new QChartView(chart);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumHeight(160);
  return view;
}
QTableWidgetItem* cell(const QString& text, bool number = true) {
  auto* item = new QTableWidgetItem(text);
  item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  if (number) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
  return item;
}
QString percent(double fraction) { return QString::number(fraction * 100, 'f', 0) + "%"; }
}  // namespace

MonitorPanel::MonitorPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* split = new QSplitter(Qt::Horizontal);
  table_ = new QTableWidget(0, 10);
  table_->setHorizontalHeaderLabels({"stage", "op", "workers", "elements/s", "MB/s", "busy", "starved", "blocked", "buffer", "skipped"});
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  split->addWidget(table_);
  throughput_ = make_chart("Throughput", throughput_x_, throughput_y_, "elements/s");
  occupancy_ = make_chart("Buffer occupancy", occupancy_x_, occupancy_y_, "level / capacity");
  occupancy_y_->setRange(0, 1);
  split->addWidget(throughput_);
  split->addWidget(occupancy_);
  split->setSizes({640, 480, 480});
  layout->addWidget(split);
}

void MonitorPanel::clear() {
  table_->setRowCount(0);
  throughput_->chart()->removeAllSeries();
  occupancy_->chart()->removeAllSeries();
  throughput_series_.clear();
  occupancy_series_.clear();
}

void MonitorPanel::add_point(QChartView* view, QHash<QString, QLineSeries*>& series, QValueAxis* x, QValueAxis* y, const QString& stage,
                             double t, double v) {
  QLineSeries* s = series.value(stage);
  if (!s) {
    s = new QLineSeries;
    s->setName(stage);
    view->chart()->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(y);
    series.insert(stage, s);
  }
  s->append(t, v);
  // Keep the last minutes only.
  int old = 0;
  while (old < s->count() && s->at(old).x() < t - kWindowSeconds) ++old;
  if (old > 0) s->removePoints(0, old);
}

void MonitorPanel::show_snapshot(const metrics::MetricsSnapshot& snap, bool run_ended) {
  int rows = 0;
  for (const auto& st : snap.stage()) rows += 1 + st.devices_size();
  table_->setRowCount(rows);
  int r = 0;
  double max_rate = 1;
  const double t = snap.elapsed_s();
  // The stage whose output buffer a fused group's members share: the group's last member. The
  // others hand their elements straight to the next member.
  QHash<QString, QString> next_in_group;
  for (const auto& st : snap.stage())
    if (!st.fused_with().empty() && st.inputs_size() == 1) next_in_group.insert(QString::fromStdString(st.inputs(0)), QString::fromStdString(st.id()));
  table_->horizontalHeaderItem(3)->setText(run_ended ? "elements/s (run)" : "elements/s");
  table_->horizontalHeaderItem(4)->setText(run_ended ? "MB/s (run)" : "MB/s");
  for (const auto& st : snap.stage()) {
    const QString id = QString::fromStdString(st.id());
    const bool bottleneck = snap.failed_stage().empty() && st.id() == snap.bottleneck();
    const bool failed_here = !snap.failed_stage().empty() && st.id() == snap.failed_stage();
    // Once the run has ended, its averages: the last interval's rates say little about a run.
    const double elements_per_s = run_ended ? st.elements_per_s() : st.recent_elements_per_s();
    const double bytes_per_s = run_ended ? st.bytes_per_s() : st.recent_bytes_per_s();
    table_->setItem(r, 0, cell(id + (bottleneck ? "  ◀ bottleneck" : failed_here ? "  ✖ failed here" : ""), false));
    table_->setItem(r, 1, cell(QString::fromStdString(st.op()), false));
    table_->setItem(r, 2, cell(QString::number(st.workers())));
    table_->setItem(r, 3, cell(short_number(elements_per_s)));
    table_->setItem(r, 4, cell(QString::number(bytes_per_s / 1e6, 'f', 1)));
    table_->setItem(r, 5, cell(percent(st.busy_fraction())));
    table_->setItem(r, 6, cell(percent(st.starved_fraction())));
    table_->setItem(r, 7, cell(percent(st.blocked_fraction())));
    table_->setItem(r, 8, cell(st.buffer_capacity() > 0        ? QString("%1/%2").arg(st.buffer_level()).arg(st.buffer_capacity())
                               : next_in_group.contains(id) ? QString("fused → %1").arg(next_in_group.value(id))
                                                            : QString("–")));
    table_->setItem(r, 9, cell(QString::number(st.errors_skipped())));
    if (bottleneck || failed_here)
      for (int c = 0; c < table_->columnCount(); ++c) table_->item(r, c)->setBackground(failed_here ? QColor(250, 205, 205) : QColor(255, 225, 190));
    ++r;
    for (const auto& d : st.devices()) {
      table_->setItem(r, 0, cell("    " + QString::fromStdString(d.name()), false));
      // A device takes slices, not elements: the count goes with the kind, not under elements/s.
      table_->setItem(r, 1, cell(QString("device, %1 slices").arg(d.slices()), false));
      table_->setItem(r, 2, cell(""));
      table_->setItem(r, 3, cell(""));
      table_->setItem(r, 4, cell(QString::number((run_ended ? d.bytes_per_s() : d.recent_bytes_per_s()) / 1e6, 'f', 1)));
      for (int c = 5; c < 8; ++c) table_->setItem(r, c, cell(""));
      table_->setItem(r, 8, cell(QString("ring %1/%2").arg(d.ring_level()).arg(d.ring_capacity())));
      table_->setItem(r, 9, cell(""));
      ++r;
    }
    if (!run_ended) add_point(throughput_, throughput_series_, throughput_x_, throughput_y_, id, t, st.recent_elements_per_s());
    if (st.buffer_capacity() > 0 && !run_ended)
      add_point(occupancy_, occupancy_series_, occupancy_x_, occupancy_y_, id, t, double(st.buffer_level()) / st.buffer_capacity());
  }
  for (auto* s : throughput_series_)
    for (const auto& p : s->points()) max_rate = std::max(max_rate, p.y());
  throughput_x_->setRange(std::max(0.0, t - kWindowSeconds), std::max(t, 10.0));
  occupancy_x_->setRange(std::max(0.0, t - kWindowSeconds), std::max(t, 10.0));
  throughput_y_->setRange(0, max_rate * 1.1);
}

LogPanel::LogPanel(QWidget* parent) : QPlainTextEdit(parent) {
  setReadOnly(true);
  setMaximumBlockCount(5000);
}

void LogPanel::note(const QString& line) { appendPlainText(QDateTime::currentDateTime().toString("HH:mm:ss  ") + line); }

void LogPanel::reset_run() {
  skipped_.clear();
  reasons_seen_.clear();
}

void LogPanel::show_snapshot(const metrics::MetricsSnapshot& snap) {
  for (const auto& st : snap.stage()) {
    const QString id = QString::fromStdString(st.id());
    const std::uint64_t before = skipped_.value(id, 0);
    if (st.errors_skipped() == before) continue;
    skipped_[id] = st.errors_skipped();
    note(QString("stage '%1': %2 skipped so far (+%3)").arg(id).arg(st.errors_skipped()).arg(st.errors_skipped() - before));
    for (const auto& reason : st.skip_reasons()) {
      const QString text = QString::fromStdString(reason);
      if (reasons_seen_.contains(id + '\n' + text)) continue;
      reasons_seen_.insert(id + '\n' + text);
      note(QString("    %1").arg(text));
    }
  }
}

}  // namespace sluice::studio
