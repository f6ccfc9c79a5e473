#pragma once
// Follows a Sluice service (core/service/) from its dispatcher's /metrics (`sluice dispatcher
// --metrics-addr`): the workers it lists, alive or lost, the splits each has in hand, and, for each
// worker serving its own /metrics (`sluice worker --metrics-addr`, which it told the dispatcher),
// what it sends trainers, as rates between two readings a second apart.
#include <QElapsedTimer>
#include <QMap>
#include <QNetworkAccessManager>
#include <QTimer>
#include <vector>

class QNetworkReply;

namespace sluice::studio {

struct PrometheusSample {
  QString name;
  QMap<QString, QString> labels;
  double value = 0;
};
// The samples of a Prometheus text exposition; comments and lines that are not samples are skipped.
std::vector<PrometheusSample> parse_prometheus(const QString& text);

struct ServiceWorkerRow {
  QString id, address, host, metrics;  // metrics: "host:port" of its /metrics, empty when it serves none
  bool alive = false;
  double splits_in_hand = 0;
  QString metrics_problem;  // its /metrics did not answer: why
  bool metrics_read = false;
  double elements = 0, bytes = 0, splits_active = 0, splits_made = 0;
  double elements_per_s = -1, bytes_per_s = -1;  // -1 until two readings
  qint64 read_at_ms = -1;                        // of the last reading, on the watch's clock
};

class ServiceWatch final : public QObject {
  Q_OBJECT
 public:
  explicit ServiceWatch(QObject* parent = nullptr);
  // "HOST:PORT", "PORT" (this machine) or http://HOST:PORT: the dispatcher's metrics address.
  void watch(const QString& address);
  void stop();
  QString url() const { return url_.toString(); }
  const std::vector<ServiceWorkerRow>& workers() const { return workers_; }
  // Why the dispatcher's /metrics was not read at the last try; empty once it was.
  QString problem() const { return problem_; }
  bool reached() const { return reached_; }
  bool watching() const { return timer_.isActive(); }

 signals:
  void changed();

 private:
  void poll();
  void read_dispatcher(QNetworkReply* reply);
  void read_worker(const QString& id, QNetworkReply* reply);
  ServiceWorkerRow* row(const QString& id);

  QNetworkAccessManager network_;
  QTimer timer_;
  QElapsedTimer clock_;
  QUrl url_;
  std::vector<ServiceWorkerRow> workers_;
  QString problem_;
  bool reached_ = false;
  int in_flight_ = 0;  // readings not answered yet: the next poll waits for them
};

}  // namespace sluice::studio
