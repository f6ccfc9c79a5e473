#include "monitor.hpp"

#include <QCursor>
#include <QMouseEvent>
#include <QDateTime>
#include <QToolTip>
#include <cmath>
#include <numeric>
#include <variant>

#include "sluice/core/report.hpp"
#include <QHeaderView>
#include <QScrollBar>
#include <QSplitter>
#include <QVBoxLayout>

#include "canvas.hpp"

namespace sluice::studio {

double nice_tick_interval(double span, int ticks) {
  if (!(span > 0) || ticks < 1) return 1;
  const double raw = span / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double step : {1.0, 2.0, 5.0})
    if (step * power >= raw * (1 - 1e-9)) return step * power;
  return 10 * power;
}

namespace {
// Ticks on round values, labelled with exactly as many decimals as the spacing needs (a format
// of "%.0f" under ticks 2.5 apart printed 3 for 2.5).
void set_ticks(QValueAxis* axis, double low, double high, int ticks) {
  const double interval = nice_tick_interval(high - low, ticks);
  axis->setTickType(QValueAxis::TicksDynamic);
  axis->setTickAnchor(0);
  axis->setTickInterval(interval);
  const int decimals = interval >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(interval) - 1e-9));
  axis->setLabelFormat(QString("%.%1f").arg(decimals));
  axis->setRange(low, high);
}

// Below this a chart's plot is too flat to read; a short panel drops the legends and the axis
// titles before the plot shrinks to it (the table's colour squares are the legend then).
constexpr int kChartMinHeight = 120, kChartRoomyHeight = 230;

QChartView* make_chart(const QString& title, QValueAxis*& x, QAbstractAxis* y) {
  auto* chart = new QChart;
  chart->setTitle(title);
  chart->legend()->hide();  // the full legend is a label under the chart: Qt's cuts names off
  chart->setMargins(QMargins(4, 4, 4, 4));
  x = new QValueAxis;
  x->setTitleText("seconds");
  set_ticks(x, 0, 10, 5);
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  auto* view = new QChartView(chart);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumHeight(kChartMinHeight);
  return view;
}

QLabel* make_legend() {
  auto* legend = new QLabel;
  legend->setObjectName("legend");
  legend->setWordWrap(true);
  legend->setTextFormat(Qt::RichText);
  QFont small = legend->font();
  small.setPointSizeF(small.pointSizeF() * 0.85);
  legend->setFont(small);
  return legend;
}

QWidget* chart_with_legend(QChartView* view, QLabel* legend) {
  auto* box = new QWidget;
  auto* layout = new QVBoxLayout(box);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(view, 1);
  layout->addWidget(legend);
  return box;
}

QTableWidgetItem* cell(const QString& text, bool number = true) {
  auto* item = new QTableWidgetItem(text);
  item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
  if (number) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
  return item;
}
QString percent(double fraction) { return QString::number(fraction * 100, 'f', 0) + "%"; }

// Rates below one per second sit on the log axis' floor.
constexpr double kRateFloor = 1;

// Of the values a stage that pads wrote, the share that is padding; -1 for other stages.
double padding_share(const metrics::StageMetrics& st) {
  const double written = double(st.padding_values()) + double(st.data_values());
  return written > 0 ? double(st.padding_values()) / written : -1.0;
}
}  // namespace

MonitorPanel::MonitorPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* split = new QSplitter(Qt::Horizontal);
  table_ = new QTableWidget(0, 11);
  table_->setHorizontalHeaderLabels({"stage", "op", "workers", "elements/s", "MB/s", "busy", "starved", "blocked", "buffer", "skipped", "padding"});
  table_->horizontalHeaderItem(10)->setToolTip("Share of the values a batching stage wrote that are padding (padded_batch, "
                                               "bucket_by_sequence_length, pack_sequences); bucketing and packing lower it");
  table_->verticalHeader()->hide();
  // Rows as tall as their text: a short panel still shows a pipeline's stages.
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
  table_->horizontalHeader()->setSectionsClickable(true);
  // Shown from the start, with no section sorted: every header has room for the arrow already,
  // so sorting does not widen the columns.
  table_->horizontalHeader()->setSortIndicatorShown(true);
  table_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  connect(table_->horizontalHeader(), &QHeaderView::sectionClicked, this, [this](int column) {
    // Numbers sort largest first, names alphabetically; a second click turns the order round.
    const Qt::SortOrder first = column <= 1 ? Qt::AscendingOrder : Qt::DescendingOrder;
    const Qt::SortOrder other = first == Qt::AscendingOrder ? Qt::DescendingOrder : Qt::AscendingOrder;
    sort_by(column, column == sort_column_ && sort_order_ == first ? other : first);
  });
  split->addWidget(table_);
  throughput_y_ = new QLogValueAxis;
  throughput_y_->setTitleText("elements/s (log)");
  throughput_y_->setBase(10);
  throughput_y_->setLabelFormat("%.0f");
  throughput_y_->setMinorTickCount(8);
  throughput_y_->setRange(kRateFloor, 10);
  occupancy_y_ = new QValueAxis;
  occupancy_y_->setTitleText("level / capacity");
  throughput_ = make_chart("Throughput", throughput_x_, throughput_y_);
  occupancy_ = make_chart("Buffer occupancy", occupancy_x_, occupancy_y_);
  set_ticks(occupancy_y_, 0, 1, 5);
  throughput_legend_ = make_legend();
  occupancy_legend_ = make_legend();
  split->addWidget(chart_with_legend(throughput_, throughput_legend_));
  split->addWidget(chart_with_legend(occupancy_, occupancy_legend_));
  split->setSizes({640, 480, 480});
  split_ = split;
  connect(split, &QSplitter::splitterMoved, this, [this] { user_sized_split_ = true; });
  layout->addWidget(split);
  for (QChartView* view : {throughput_, occupancy_}) {
    view->setMouseTracking(true);
    view->viewport()->installEventFilter(this);
  }
}

QColor MonitorPanel::series_colour(int stage_index) {
  // Twenty colours far apart in hue and lightness (Kelly's contrast set, less white and black):
  // enough for the stages of any pipeline the canvas shows; past twenty they come round again,
  // the lines then dashed.
  static const QColor colours[] = {
      QColor(0xF3, 0xC3, 0x00), QColor(0x87, 0x56, 0x92), QColor(0xF3, 0x84, 0x00), QColor(0x3F, 0x8F, 0xC8),
      QColor(0xBE, 0x00, 0x32), QColor(0x9D, 0x8A, 0x50), QColor(0x84, 0x84, 0x82), QColor(0x00, 0x88, 0x56),
      QColor(0xE6, 0x8F, 0xAC), QColor(0x00, 0x67, 0xA5), QColor(0xF9, 0x84, 0x79), QColor(0x60, 0x4E, 0x97),
      QColor(0xF6, 0xA6, 0x00), QColor(0xB3, 0x44, 0x6C), QColor(0xB0, 0xA0, 0x20), QColor(0x88, 0x2D, 0x17),
      QColor(0x8D, 0xB6, 0x00), QColor(0x65, 0x45, 0x22), QColor(0xE2, 0x58, 0x22), QColor(0x2B, 0x3D, 0x26)};
  constexpr int count = sizeof(colours) / sizeof(colours[0]);
  return colours[((stage_index % count) + count) % count];
}

void MonitorPanel::clear() {
  table_->setRowCount(0);
  for (int c = 0; c < table_->columnCount(); ++c) table_->horizontalHeader()->resizeSection(c, table_->horizontalHeader()->sectionSizeHint(c));
  throughput_->chart()->removeAllSeries();
  occupancy_->chart()->removeAllSeries();
  throughput_series_.clear();
  occupancy_series_.clear();
  busy_series_.clear();
  busy_seconds_at_.clear();
  shown_.Clear();
  hover_text_.clear();
  update_legends();
  // The axes of no run: the last run's seconds and rates went with its lines.
  set_ticks(throughput_x_, 0, 10, 5);
  set_ticks(occupancy_x_, 0, 10, 5);
  throughput_y_->setRange(kRateFloor, 10);
}

void MonitorPanel::update_legends() {
  auto text_of = [](const QHash<QString, QLineSeries*>& series, const metrics::MetricsSnapshot& order) {
    QString html;
    for (const auto& st : order.stage()) {
      QLineSeries* s = series.value(QString::fromStdString(st.id()));
      if (!s || !s->isVisible()) continue;
      html += QString("<span style='color:%1'>&#9632;</span>&nbsp;%2 &nbsp; ")
                  .arg(s->color().name(), s->name().toHtmlEscaped());
    }
    return html;
  };
  throughput_legend_->setText(text_of(throughput_series_, shown_));
  occupancy_legend_->setText(text_of(occupancy_series_, shown_));
}

QLineSeries* MonitorPanel::series_for(QChartView* view, QHash<QString, QLineSeries*>& series, QAbstractAxis* x, QAbstractAxis* y,
                                      const QString& stage, Qt::PenStyle style) {
  if (QLineSeries* found = series.value(stage)) return found;
  auto* s = new QLineSeries;
  s->setName(stage);
  view->chart()->addSeries(s);
  s->attachAxis(x);
  s->attachAxis(y);
  int index = 0;
  while (index < shown_.stage_size() && QString::fromStdString(shown_.stage(index).id()) != stage) ++index;
  QPen pen(series_colour(index), 2);
  pen.setStyle(index >= 20 ? Qt::DashLine : style);
  s->setPen(pen);
  s->setVisible(focused_.isEmpty() ? &series != &busy_series_ : stage == focused_);
  series.insert(stage, s);
  return s;
}

void MonitorPanel::add_point(QChartView* view, QHash<QString, QLineSeries*>& series, QAbstractAxis* x, QAbstractAxis* y,
                             const QString& stage, double t, double v) {
  QLineSeries* s = series_for(view, series, x, y, stage);
  s->append(t, v);
  // Keep the last minutes only.
  int old = 0;
  while (old < s->count() && s->at(old).x() < t - kWindowSeconds) ++old;
  if (old > 0) s->removePoints(0, old);
}

bool MonitorPanel::eventFilter(QObject* watched, QEvent* event) {
  for (QChartView* view : {throughput_, occupancy_}) {
    if (watched != view->viewport()) continue;
    if (event->type() == QEvent::MouseMove) show_value_under(view, static_cast<QMouseEvent*>(event)->position());
    if (event->type() == QEvent::Leave) QToolTip::hideText();
  }
  return QWidget::eventFilter(watched, event);
}

void MonitorPanel::show_value_under(QChartView* view, QPointF viewport_pos) {
  QChart* chart = view->chart();
  const QPointF pointer = chart->mapFromScene(view->mapToScene(viewport_pos.toPoint()));
  constexpr double kReach = 8;  // pixels from the line
  double nearest = kReach;
  QString text;
  auto consider = [&](QLineSeries* s, const QString& what) {
    if (!s->isVisible() || s->count() == 0) return;
    // The line's height at the pointer's time, in pixels (the rate axis is logarithmic).
    const QList<QPointF> points = s->points();
    const double t = chart->mapToValue(pointer, s).x();
    auto after = std::lower_bound(points.begin(), points.end(), t, [](const QPointF& p, double v) { return p.x() < v; });
    if (after == points.end() || after == points.begin()) {
      const QPointF end = after == points.end() ? points.back() : points.front();
      if (QLineF(chart->mapToPosition(end, s), pointer).length() > kReach) return;
      after = after == points.end() ? points.end() - 1 : after;
    }
    const QPointF b = *after, a = after == points.begin() ? b : *(after - 1);
    const QPointF pa = chart->mapToPosition(a, s), pb = chart->mapToPosition(b, s);
    const double line_y = pb.x() > pa.x() ? pa.y() + (pb.y() - pa.y()) * (pointer.x() - pa.x()) / (pb.x() - pa.x()) : pb.y();
    const double distance = std::abs(pointer.y() - line_y);
    if (distance >= nearest) return;
    nearest = distance;
    const QPointF sample = std::abs(t - a.x()) <= std::abs(b.x() - t) ? a : b;
    text = what.arg(s->name()).arg(sample.x(), 0, 'f', 1);
    if (view == throughput_) text = text.arg(short_number(sample.y() <= kRateFloor ? 0 : sample.y()));
    else text = text.arg(sample.y() * 100, 0, 'f', 0);
  };
  if (view == throughput_) {
    for (auto* s : throughput_series_) consider(s, "%1: %3 elements/s at %2 s");
  } else {
    for (auto* s : occupancy_series_) consider(s, "%1: buffer %3% full at %2 s");
    for (auto* s : busy_series_) consider(s, "%1: busy %3% at %2 s");
  }
  if (text.isEmpty()) return QToolTip::hideText();
  hover_text_ = text;
  QToolTip::showText(view->viewport()->mapToGlobal(viewport_pos.toPoint()), hover_text_, view->viewport());
}

void MonitorPanel::focus_stage(const QString& stage) {
  focused_ = stage;
  show_focus();
}

void MonitorPanel::show_focus() {
  const bool all = focused_.isEmpty() || !throughput_series_.contains(focused_);
  for (auto it = throughput_series_.begin(); it != throughput_series_.end(); ++it) it.value()->setVisible(all || it.key() == focused_);
  for (auto it = occupancy_series_.begin(); it != occupancy_series_.end(); ++it) it.value()->setVisible(all || it.key() == focused_);
  for (auto it = busy_series_.begin(); it != busy_series_.end(); ++it) it.value()->setVisible(!all && it.key() == focused_);
  fit_charts_to_their_room();  // the titles
  occupancy_y_->setTitleText(all ? "level / capacity" : "share");
  update_legends();
}

void MonitorPanel::sort_by(int column, Qt::SortOrder order) {
  sort_column_ = column;
  sort_order_ = order;
  table_->horizontalHeader()->setSortIndicator(column, order);  // -1: no arrow
  fill_table();
}

void MonitorPanel::show_snapshot(const metrics::MetricsSnapshot& snap, bool run_ended) {
  shown_ = snap;
  shown_run_ended_ = run_ended;
  const bool new_series = [&] {
    for (const auto& st : snap.stage())
      if (!throughput_series_.contains(QString::fromStdString(st.id()))) return true;
    return false;
  }();
  fill_table();
  const double t = snap.elapsed_s();
  for (const auto& st : snap.stage()) {
    const QString id = QString::fromStdString(st.id());
    if (!run_ended)
      add_point(throughput_, throughput_series_, throughput_x_, throughput_y_, id, t, std::max(kRateFloor, st.recent_elements_per_s()));
    if (st.buffer_capacity() > 0 && !run_ended)
      add_point(occupancy_, occupancy_series_, occupancy_x_, occupancy_y_, id, t, double(st.buffer_level()) / st.buffer_capacity());
    if (!run_ended) {
      // Busy between this snapshot and the one before: the change of busy time over the change of time.
      const double busy_seconds = st.busy_fraction() * t;
      const auto [was_t, was_busy] = busy_seconds_at_.value(id, {0.0, 0.0});
      busy_seconds_at_.insert(id, {t, busy_seconds});
      if (t > was_t) {
        series_for(occupancy_, busy_series_, occupancy_x_, occupancy_y_, id, Qt::DotLine);
        add_point(occupancy_, busy_series_, occupancy_x_, occupancy_y_, id, t, std::clamp((busy_seconds - was_busy) / (t - was_t), 0.0, 1.0));
      }
    }
  }
  if (new_series) show_focus();
  double max_rate = 10;
  for (auto* s : throughput_series_)
    for (const auto& p : s->points()) max_rate = std::max(max_rate, p.y());
  const double low = std::max(0.0, t - kWindowSeconds), high = std::max(t, 10.0);
  set_ticks(throughput_x_, low, high, 5);
  set_ticks(occupancy_x_, low, high, 5);
  // Whole decades: stages thousands of times apart (a reader's records, a batcher's batches) all
  // stay readable.
  throughput_y_->setRange(kRateFloor, std::pow(10.0, std::ceil(std::log10(max_rate * 1.05))));
}

void MonitorPanel::fill_table() {
  const auto& snap = shown_;
  const bool run_ended = shown_run_ended_;
  int rows = 0;
  for (const auto& st : snap.stage()) rows += 1 + st.devices_size();
  table_->setRowCount(rows);
  // The stage whose output buffer a fused group's members share: the group's last member. The
  // others hand their elements straight to the next member.
  QHash<QString, QString> next_in_group;
  for (const auto& st : snap.stage())
    if (!st.fused_with().empty() && st.inputs_size() == 1) next_in_group.insert(QString::fromStdString(st.inputs(0)), QString::fromStdString(st.id()));
  // Two-line headers after a run: the columns stay as narrow as their numbers.
  table_->horizontalHeaderItem(3)->setText(run_ended ? "elements/s\nrun avg" : "elements/s");
  table_->horizontalHeaderItem(4)->setText(run_ended ? "MB/s\nrun avg" : "MB/s");
  table_->horizontalHeaderItem(8)->setText(run_ended ? "buffer\nrun avg" : "buffer");
  // Once the run has ended, its averages: the last interval's rates say little about a run.
  auto elements_per_s = [&](const metrics::StageMetrics& st) { return run_ended ? st.elements_per_s() : st.recent_elements_per_s(); };
  auto bytes_per_s = [&](const metrics::StageMetrics& st) { return run_ended ? st.bytes_per_s() : st.recent_bytes_per_s(); };
  // An ended run's buffers are drained: their mean fill over the run is what says something, as
  // the CLI report's fill%.
  auto buffer_fill = [&](const metrics::StageMetrics& st) {
    if (!st.buffer_capacity()) return -1.0;
    return run_ended ? st.mean_buffer_fill() : double(st.buffer_level()) / st.buffer_capacity();
  };
  auto pinned = [&](const metrics::StageMetrics& st) {
    return snap.failed_stage().empty() ? bottleneck_holds_up(snap) && st.id() == snap.bottleneck() : st.id() == snap.failed_stage();
  };
  auto key = [&](const metrics::StageMetrics& st) -> std::variant<double, std::string> {
    switch (sort_column_) {
      case 0: return st.id();
      case 1: return st.op();
      case 2: return double(st.workers());
      case 3: return elements_per_s(st);
      case 4: return bytes_per_s(st);
      case 5: return st.busy_fraction();
      case 6: return st.starved_fraction();
      case 7: return st.blocked_fraction();
      case 8: return buffer_fill(st);
      case 9: return double(st.errors_skipped());
      case 10: return padding_share(st);
      default: return 0.0;
    }
  };
  std::vector<int> order(static_cast<size_t>(snap.stage_size()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto& x = snap.stage(a);
    const auto& y = snap.stage(b);
    if (pinned(x) != pinned(y)) return pinned(x);
    if (sort_column_ < 0) return false;
    return sort_order_ == Qt::AscendingOrder ? key(x) < key(y) : key(y) < key(x);
  });
  int r = 0;
  for (int index : order) {
    const auto& st = snap.stage(index);
    const QString id = QString::fromStdString(st.id());
    const bool bottleneck = snap.failed_stage().empty() && bottleneck_holds_up(snap) && st.id() == snap.bottleneck();
    const bool failed_here = !snap.failed_stage().empty() && st.id() == snap.failed_stage();
    table_->setItem(r, 0, cell(id + (bottleneck ? "  ◀ bottleneck" : failed_here ? "  ✖ failed here" : ""), false));
    table_->setItem(r, 1, cell(QString::fromStdString(st.op()), false));
    table_->setItem(r, 2, cell(QString::number(st.workers()) + (st.workers_tuned() ? " auto" : "")));
    if (st.workers_tuned()) table_->item(r, 2)->setToolTip("chosen by the autotuner (parallelism AUTOTUNE): the Verdict's Autotune section says why");
    table_->setItem(r, 3, cell(short_number(elements_per_s(st))));
    table_->setItem(r, 4, cell(QString::number(bytes_per_s(st) / 1e6, 'f', 1)));
    table_->setItem(r, 5, cell(percent(st.busy_fraction())));
    table_->setItem(r, 6, cell(percent(st.starved_fraction())));
    table_->setItem(r, 7, cell(percent(st.blocked_fraction())));
    table_->setItem(r, 8, cell(st.buffer_capacity() > 0 && run_ended ? QString("%1 of %2").arg(percent(st.mean_buffer_fill())).arg(st.buffer_capacity())
                               : st.buffer_capacity() > 0        ? QString("%1/%2").arg(st.buffer_level()).arg(st.buffer_capacity())
                               : next_in_group.contains(id) ? QString("fused → %1").arg(next_in_group.value(id))
                                                            : QString("–")));
    table_->setItem(r, 9, cell(QString::number(st.errors_skipped())));
    table_->setItem(r, 10, cell(padding_share(st) >= 0 ? percent(padding_share(st)) : QString("–")));
    // The stage's colour in the charts: the legend where the charts have no room for theirs.
    if (QLineSeries* line = throughput_series_.value(id)) table_->item(r, 0)->setData(Qt::DecorationRole, line->color());
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
      table_->setItem(r, 10, cell(""));
      ++r;
    }
  }
  show_columns_in_use();
  widen_columns();
}

// "padding" only where a stage pads (padded_batch, bucket_by_sequence_length, pack_sequences).
void MonitorPanel::show_columns_in_use() {
  bool pads = false;
  for (const auto& st : shown_.stage()) pads = pads || padding_share(st) >= 0;
  table_->setColumnHidden(10, !pads);
}

void MonitorPanel::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  fit_charts_to_their_room();
}

// A short panel: the plots keep what room there is, without legends and axis titles, whose
// units go into the charts' titles.
void MonitorPanel::fit_charts_to_their_room() {
  const bool roomy = height() >= kChartRoomyHeight;
  for (QLabel* legend : {throughput_legend_, occupancy_legend_}) legend->setVisible(roomy);
  for (QChartView* view : {throughput_, occupancy_})
    for (QAbstractAxis* axis : view->chart()->axes()) axis->setTitleVisible(roomy);
  const bool all = focused_.isEmpty() || !throughput_series_.contains(focused_);
  throughput_->chart()->setTitle((all ? QString("Throughput") : QString("Throughput of '%1'").arg(focused_)) + (roomy ? "" : " (elements/s, log)"));
  occupancy_->chart()->setTitle(all ? QString("Buffer occupancy") + (roomy ? "" : " (level / capacity)")
                                    : QString("'%1': buffer fill (solid) and busy (dotted)").arg(focused_));
}

void MonitorPanel::widen_columns() {
  // Columns grow to what they hold and never shrink while a run is shown: a click on a header to
  // sort does not move the headers under the pointer. (Resizing to contents redid every width at
  // each snapshot.)
  auto* header = table_->horizontalHeader();
  for (int c = 0; c < table_->columnCount(); ++c) {
    const int was = header->sectionSize(c);
    table_->resizeColumnToContents(c);
    if (header->sectionSize(c) < was) header->resizeSection(c, was);
  }
  give_the_table_its_columns();
}

void MonitorPanel::give_the_table_its_columns() {
  // Until the user moves the dividers: the table as wide as its columns (every column readable
  // without a scrollbar), up to 66% of the panel; the two charts share the rest.
  if (user_sized_split_) return;
  const QList<int> sizes = split_->sizes();
  int total = 0;
  for (int size : sizes) total += size;
  // The charts keep a readable width where the panel has it; the table scrolls sideways then.
  const int wanted = std::min(table_->horizontalHeader()->length() + table_->verticalScrollBar()->sizeHint().width() + 2 * table_->frameWidth(),
                              std::max(total - 2 * kChartMinWidth, total * 40 / 100));
  if (total <= 0 || wanted <= sizes.value(0)) return;
  const int chart = (total - wanted) / 2;
  split_->setSizes({wanted, chart, total - wanted - chart});
}

LogPanel::LogPanel(QWidget* parent) : QPlainTextEdit(parent) {
  setReadOnly(true);
  setMaximumBlockCount(5000);
}

void LogPanel::note(const QString& line) { appendPlainText(QDateTime::currentDateTime().toString("HH:mm:ss  ") + line); }

void LogPanel::reset_run() {
  skipped_.clear();
  reasons_seen_.clear();
  autotune_changes_seen_ = 0;
}

void LogPanel::show_snapshot(const metrics::MetricsSnapshot& snap) {
  // The autotuner's decisions as it makes them, with their reasons (sluice run --explain-autotune).
  for (int i = autotune_changes_seen_; i < snap.autotune().changes_size(); ++i)
    note(QString::fromStdString(format_autotune_change(snap.autotune().changes(i))));
  autotune_changes_seen_ = std::max(autotune_changes_seen_, snap.autotune().changes_size());
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

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_monitor.cpp"
