#pragma once
// Below the canvas while a run is watched: a table of every stage (and every device of a feed
// sink), time series of throughput and buffer occupancy per stage over the last minutes (Qt
// Charts), and a log of skipped elements with their reasons.
#include <QChartView>
#include <QHash>
#include <QLineSeries>
#include <QPlainTextEdit>
#include <QSet>
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
  QLineSeries* throughput_series(const QString& stage) const { return throughput_series_.value(stage); }

 private:
  void add_point(QChartView* view, QHash<QString, QLineSeries*>& series, QValueAxis* x, QValueAxis* y, const QString& stage, double t, double v);
  QTableWidget* table_;
  QChartView* throughput_;
  QChartView* occupancy_;
  QValueAxis *throughput_x_, *throughput_y_, *occupancy_x_, *occupancy_y_;
  QHash<QString, QLineSeries*> throughput_series_, occupancy_series_;
};

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
};

}  // namespace sluice::studio
