#pragma once
// The Workers panel: one row per worker of a job run headless on several processes (each with its
// own `sluice run --metrics-addr`), followed at once: each worker's rate and progress, and which
// worker synchronous training waits for: the slowest, or one that died (its stream closed while
// it was running, without a final snapshot). Or one row per worker of a Sluice service, from its
// dispatcher's /metrics (ServiceWatch): alive or lost, its splits, what it sends trainers.
#include <QLabel>
#include <QTableWidget>
#include <QWidget>
#include <memory>
#include <vector>

#include "live.hpp"
#include "service_watch.hpp"

namespace sluice::studio {

class WorkersPanel final : public QWidget {
  Q_OBJECT
 public:
  explicit WorkersPanel(QWidget* parent = nullptr);
  ~WorkersPanel() override;
  // Follows every address ("HOST:PORT", "PORT" or http://...), replacing what was followed.
  void attach(const QStringList& addresses);
  void detach();
  // Follows a Sluice service: its dispatcher's metrics address (`sluice dispatcher --metrics-addr`).
  void attach_service(const QString& address);
  const ServiceWatch* service() const { return service_.get(); }
  int attached_count() const;
  QTableWidget* table() const { return table_; }
  QString summary() const { return summary_->text(); }
  // The row of the slowest running worker, -1 when fewer than two report a rate or a worker died
  // (then the dead one is what the job waits for).
  int slowest_row() const { return slowest_; }

  // "a:1, b:2 c:3" -> its addresses.
  static QStringList split_addresses(const QString& text);

 private:
  struct Worker {
    std::unique_ptr<AttachClient> client;
    QString address;
    QString state = "connecting";
    int index = -1, count = 0;
    // Elements/s out of the pipeline's (last) sink, as its snapshot says: over the last 2 s while
    // it runs (the canvas' figure), over its whole run once it ended (its report's).
    double rate = 0;
    bool ended = false;  // its last snapshot was its final one (finished, stopped or failed)
    std::uint64_t done = 0;
    double last_elapsed = -1;  // of the last snapshot; -1 before the first
    QString bottleneck;
    bool dead = false;  // its stream closed while it was running: no rate any more
  };
  void forget_clients();
  void update(std::size_t row, const metrics::MetricsSnapshot& snap);
  void redraw();
  void redraw_service();
  void show_headers(bool service);
  std::vector<Worker> workers_;
  std::unique_ptr<ServiceWatch> service_;
  QTableWidget* table_;
  QLabel* summary_;
  int slowest_ = -1;
};

}  // namespace sluice::studio
