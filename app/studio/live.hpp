#pragma once
// Where live snapshots come from: a run in this process (RunController) or a headless run's
// metrics endpoint (AttachClient). Both hand snapshots to the window on its own thread; the
// engine never calls a widget.
#include <QElapsedTimer>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QObject>
#include <QPointer>
#include <QTimer>
#include <QUrl>
#include <memory>
#include <mutex>

#include "metrics.pb.h"
#include "pipeline.pb.h"
#include "sluice/core/engine.hpp"

namespace sluice::studio {

class RunController final : public QObject {
  Q_OBJECT
 public:
  explicit RunController(QObject* parent = nullptr);
  ~RunController() override;  // stops and joins a run still going
  // Why a run did not start: the message, and the stage it is about (empty when none).
  struct StartFailure {
    QString message;
    QString stage;
  };
  // Builds and starts the pipeline; returns what is wrong instead when it cannot.
  std::optional<StartFailure> start(const spec::PipelineSpec& spec, const QString& file, const Registry& registry);
  void stop();  // returns at once; finished() follows when every thread has joined
  bool running() const { return engine_ != nullptr; }
  std::chrono::milliseconds poll_interval() const { return std::chrono::milliseconds(poll_.interval()); }

 signals:
  void snapshot(const sluice::metrics::MetricsSnapshot& snapshot);
  // state: finished, stopped or failed; error: the engine's message when failed, and the id of
  // the stage it is about (empty when it is about none).
  void finished(const QString& state, const QString& error, const QString& failed_stage);

 private:
  void poll();
  std::unique_ptr<Engine> engine_;
  QTimer poll_;
  // Written by the engine's metrics thread, read by poll() on the GUI thread.
  std::mutex latest_mutex_;
  metrics::MetricsSnapshot latest_;
  std::uint64_t emitted_sequence_ = 0;
  bool have_latest_ = false;
};

// Follows /stream of `sluice run --metrics-addr` (server-sent events, one JSON snapshot each).
// An endpoint of a metrics address: "HOST:PORT", "PORT" (this machine) or http://HOST:PORT.
QUrl endpoint_url(const QString& address, const QString& path);

class AttachClient final : public QObject {
  Q_OBJECT
 public:
  explicit AttachClient(QObject* parent = nullptr);
  // "HOST:PORT", "PORT" or an http:// address. Until the first snapshot, a refused connection
  // (the run has not opened its endpoint yet) is tried again every half second for `patience_ms`.
  void attach(const QString& address);
  void detach();
  bool attached() const { return reply_ != nullptr || retry_.isActive(); }
  const QString& url() const { return url_; }
  // Whether a snapshot came from this address since attach(): the run was reached.
  bool reached() const { return reached_; }
  void set_patience_ms(int ms) { patience_ms_ = ms; }

 signals:
  void snapshot(const sluice::metrics::MetricsSnapshot& snapshot);
  void waiting(const QString& why);  // nothing answers yet; trying again
  void ended(const QString& why);  // the run ended, the address did not answer, or detach()
  // The run's pipeline as it runs (its /pipeline), when the run publishes it: its real parameter
  // values, which snapshots do not carry.
  void pipeline(const sluice::spec::PipelineSpec& spec);

 private:
  void read_events();
  void request_stream();
  QNetworkAccessManager network_;
  QTimer retry_;
  QElapsedTimer trying_since_;
  int patience_ms_ = 30000;
  bool reached_ = false;
  QUrl stream_url_;
  QPointer<QNetworkReply> reply_;
  QPointer<QNetworkReply> pipeline_reply_;
  QByteArray pending_;
  QString url_;
  bool detaching_ = false;
};

}  // namespace sluice::studio
