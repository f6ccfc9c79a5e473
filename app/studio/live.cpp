#include "live.hpp"

#include <QUrl>

#include "sluice/core/metrics_log.hpp"
#include "sluice/core/prepare.hpp"
#include "sluice/core/spec.hpp"

namespace sluice::studio {

RunController::RunController(QObject* parent) : QObject(parent) {
  poll_.setInterval(200);
  connect(&poll_, &QTimer::timeout, this, &RunController::poll);
}

RunController::~RunController() {
  if (engine_) {
    engine_->stop();
    engine_->wait();
  }
}

std::optional<RunController::StartFailure> RunController::start(const spec::PipelineSpec& spec, const QString& file,
                                                                const Registry& registry) {
  if (engine_) return StartFailure{"a run is already going; stop it first", {}};
  try {
    PipelineDocument doc;
    doc.spec = spec;
    doc.file = file.isEmpty() ? "untitled" : file.toStdString();
    // The studio runs the pipeline as one process, as drawn, whatever launcher it was started
    // under; it links no service, so a `distribute` stage is validated as written.
    PrepareOptions one_process;
    one_process.worker = {0, 1, "the studio (one process)"};
    auto engine = std::make_unique<Engine>(prepare_pipeline(std::move(doc), registry, one_process).graph);
    {
      std::lock_guard lock(latest_mutex_);
      have_latest_ = false;
      emitted_sequence_ = 0;
    }
    engine->subscribe([this](const metrics::MetricsSnapshot& s) {
      std::lock_guard lock(latest_mutex_);
      latest_ = s;
      have_latest_ = true;
    });
    engine->start();
    engine_ = std::move(engine);
  } catch (const StageStartError& e) {
    return StartFailure{QString::fromUtf8(e.what()), QString::fromStdString(e.stage())};
  } catch (const Error& e) {
    return StartFailure{QString::fromUtf8(e.what()), {}};
  }
  poll_.start();
  return std::nullopt;
}

void RunController::stop() {
  if (engine_) engine_->stop();
}

void RunController::poll() {
  if (!engine_) return poll_.stop();
  const bool done = engine_->wait_for(std::chrono::milliseconds(0));
  RunResult result;
  if (done) result = engine_->wait();  // every thread joined; the last snapshot is published
  metrics::MetricsSnapshot s;
  bool fresh = false;
  {
    std::lock_guard lock(latest_mutex_);
    if (have_latest_ && latest_.sequence() != emitted_sequence_) {
      s = latest_;
      emitted_sequence_ = s.sequence();
      fresh = true;
    }
  }
  if (fresh) emit snapshot(s);
  if (!done) return;
  poll_.stop();
  engine_.reset();
  emit finished(QString::fromUtf8(run_state_name(result.state)), QString::fromStdString(result.error),
                QString::fromStdString(result.failed_stage));
}

AttachClient::AttachClient(QObject* parent) : QObject(parent) {
  retry_.setSingleShot(true);
  retry_.setInterval(500);
  connect(&retry_, &QTimer::timeout, this, &AttachClient::request_stream);
}

QUrl endpoint_url(const QString& address, const QString& path) {
  QString text = address.trimmed();
  if (!text.contains("://")) text = "http://" + (text.contains(':') ? text : "127.0.0.1:" + text);
  QUrl url(text);
  url.setPath(path);
  return url;
}

void AttachClient::attach(const QString& address) {
  detach();
  const QUrl url = endpoint_url(address, "/stream");
  url_ = url.toString();
  stream_url_ = url;
  reached_ = false;
  trying_since_.start();
  request_stream();
}

void AttachClient::request_stream() {
  pending_.clear();
  QNetworkRequest request(stream_url_);
  request.setRawHeader("Accept", "text/event-stream");
  request.setAttribute(QNetworkRequest::CacheLoadControlAttribute, QNetworkRequest::AlwaysNetwork);
  reply_ = network_.get(request);
  QUrl pipeline_url(stream_url_);
  pipeline_url.setPath("/pipeline");
  QNetworkRequest pipeline_request(pipeline_url);
  pipeline_request.setAttribute(QNetworkRequest::CacheLoadControlAttribute, QNetworkRequest::AlwaysNetwork);
  pipeline_reply_ = network_.get(pipeline_request);
  connect(pipeline_reply_, &QNetworkReply::finished, this, [this, reply = pipeline_reply_] {
    reply->deleteLater();
    // A run of an older version, or another server: the canvas keeps what snapshots say.
    if (reply != pipeline_reply_ || reply->error() != QNetworkReply::NoError) return;
    try {
      const QByteArray text = reply->readAll();
      emit pipeline(parse_pipeline(text.toStdString(), url_.toStdString()).spec);
    } catch (const Error&) {
    }
  });
  connect(reply_, &QNetworkReply::readyRead, this, &AttachClient::read_events);
  connect(reply_, &QNetworkReply::finished, this, [this, reply = reply_] {
    const bool detached = detaching_;
    reply->deleteLater();
    if (reply_ == reply) reply_ = nullptr;
    // Refused before anything came: the run may still be starting (a job whose workers open their
    // endpoints once their pipeline is built). Tried again while patience lasts.
    if (!detached && !reached_ && reply->error() == QNetworkReply::ConnectionRefusedError && trying_since_.elapsed() < patience_ms_) {
      emit waiting(QString("nothing answers at %1 yet; trying again for %2 s more")
                       .arg(url_)
                       .arg((patience_ms_ - trying_since_.elapsed()) / 1000));
      retry_.start();
      return;
    }
    const QString why = detached                                   ? QString("detached from %1").arg(url_)
                        : reply->error() == QNetworkReply::NoError ? QString("the run at %1 ended").arg(url_)
                        : !reached_ ? QString("nothing answered at %1 in %2 s: %3").arg(url_).arg(trying_since_.elapsed() / 1000).arg(reply->errorString())
                                    : QString("%1: %2").arg(url_, reply->errorString());
    emit ended(why);
  });
}

void AttachClient::detach() {
  if (retry_.isActive()) {
    retry_.stop();
    emit ended(QString("detached from %1").arg(url_));
  }
  if (pipeline_reply_) pipeline_reply_->abort();
  if (!reply_) return;
  detaching_ = true;
  reply_->abort();  // finished() fires inside abort()
  detaching_ = false;
}

void AttachClient::read_events() {
  pending_ += reply_->readAll();
  // Events end with a blank line; each of ours is one "data: JSON" line.
  for (qsizetype end; (end = pending_.indexOf("\n\n")) >= 0;) {
    const QByteArray event = pending_.left(end);
    pending_.remove(0, end + 2);
    for (const QByteArray& line : event.split('\n')) {
      if (!line.startsWith("data:")) continue;
      try {
        auto parsed = snapshot_from_json(line.mid(5).trimmed().toStdString());
        reached_ = true;
        emit snapshot(parsed);
      } catch (const Error&) {
        // A line that is not a snapshot (another server on that port): ignored, the next may be.
      }
    }
  }
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_live.cpp"
