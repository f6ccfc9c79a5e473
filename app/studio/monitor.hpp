#pragma once
// Below the canvas while a run is watched: a table of every stage (and every device of a feed
// sink), time series of throughput and buffer occupancy per stage over the last minutes (Qt
// Charts), and a log of skipped elements with their reasons.
#include <QChartView>
#include <QHash>
#include <QLabel>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QPlainTextEdit>
#include <QSet>
#include <QSplitter>
#include <QTableWidget>
#include <QValueAxis>
#include <QWidget>

#include "metrics.pb.h"

namespace sluice::studio {

class MonitorPanel final : public QWidget {
  Q_OBJECT
 public:
  static constexpr double kWindowSeconds = 300;  // what the charts keep
  explicit MonitorPanel(QWidget* parent = nullptr);
  void clear();
  // run_ended: the run's final snapshot; the table shows its averages over the whole run.
  void show_snapshot(const metrics::MetricsSnapshot& snapshot, bool run_ended = false);
  QTableWidget* table() { return table_; }
  QChart* throughput_chart() { return throughput_->chart(); }
  QChart* occupancy_chart() { return occupancy_->chart(); }
  QChartView* throughput_view() { return throughput_; }
  QChartView* occupancy_view() { return occupancy_; }
  QLineSeries* throughput_series(const QString& stage) const { return throughput_series_.value(stage); }
  QLineSeries* occupancy_series(const QString& stage) const { return occupancy_series_.value(stage); }
  // Every series' name in its colour, under each chart: all of them, however many stages.
  QLabel* throughput_legend() { return throughput_legend_; }
  QLabel* occupancy_legend() { return occupancy_legend_; }
  QLineSeries* busy_series(const QString& stage) const { return busy_series_.value(stage); }
  // What the pointer near a chart's line shows: "stage: value at N s" (the nearest line within a
  // few pixels of the pointer, its sample nearest in time).
  const QString& hover_text() const { return hover_text_; }
  // One stage's history (a click on it): its throughput, and its buffer fill with its busy share,
  // over the run; every stage's again with an empty id.
  void focus_stage(const QString& stage);
  const QString& focused_stage() const { return focused_; }
  // A stage's colour in both charts: the stages of one pipeline never share one.
  static QColor series_colour(int stage_index);
  // Sorts the table by a column (the header's click does the same); -1: pipeline order. The
  // bottleneck, or the stage a run failed at, stays the first row whatever the order.
  void sort_by(int column, Qt::SortOrder order);
  // Narrowest a chart gets while the table wants room, where the panel has it.
  static constexpr int kChartMinWidth = 260;

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  void show_value_under(QChartView* view, QPointF viewport_pos);
  void show_focus();
  QLineSeries* series_for(QChartView* view, QHash<QString, QLineSeries*>& series, QAbstractAxis* x, QAbstractAxis* y, const QString& stage,
                          Qt::PenStyle style = Qt::SolidLine);
  void add_point(QChartView* view, QHash<QString, QLineSeries*>& series, QAbstractAxis* x, QAbstractAxis* y, const QString& stage,
                 double t, double v);
  void fill_table();
  void widen_columns();
  void give_the_table_its_columns();
  void update_legends();
  void fit_charts_to_their_room();
  void show_columns_in_use();
  QTableWidget* table_;
  QSplitter* split_ = nullptr;
  bool user_sized_split_ = false;
  QChartView* throughput_;
  QChartView* occupancy_;
  QLabel* throughput_legend_;
  QLabel* occupancy_legend_;
  QValueAxis *throughput_x_, *occupancy_x_, *occupancy_y_;
  QLogValueAxis* throughput_y_;
  QHash<QString, QLineSeries*> throughput_series_, occupancy_series_, busy_series_;
  // Each stage's busy time so far at the previous snapshot: the busy line is the share of the
  // time between two snapshots (the snapshot's busy_fraction is over the whole run).
  QHash<QString, std::pair<double, double>> busy_seconds_at_;
  QString hover_text_, focused_;
  metrics::MetricsSnapshot shown_;
  bool shown_run_ended_ = false;
  int sort_column_ = -1;
  Qt::SortOrder sort_order_ = Qt::DescendingOrder;
};

// Tick spacing of 1, 2 or 5 times a power of ten giving at most `ticks` intervals over `span`.
double nice_tick_interval(double span, int ticks);

// Skipped elements and their reasons as they happen, plus run events.
class LogPanel final : public QPlainTextEdit {
  Q_OBJECT
 public:
  explicit LogPanel(QWidget* parent = nullptr);
  void note(const QString& line);
  void reset_run();
  void show_snapshot(const metrics::MetricsSnapshot& snapshot);

 private:
  QHash<QString, std::uint64_t> skipped_;
  QSet<QString> reasons_seen_;
  int autotune_changes_seen_ = 0;
};

}  // namespace sluice::studio
