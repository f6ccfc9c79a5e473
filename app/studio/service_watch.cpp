#include "service_watch.hpp"

#include <QNetworkReply>
#include <QRegularExpression>
#include <algorithm>

#include "live.hpp"

namespace sluice::studio {

std::vector<PrometheusSample> parse_prometheus(const QString& text) {
  // name{label="value",...} number   (label values escape \ " and newlines with a backslash)
  static const QRegularExpression line(R"(^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$)");
  static const QRegularExpression label(R"re(([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  std::vector<PrometheusSample> out;
  for (const QString& raw : text.split('\n')) {
    const QString l = raw.trimmed();
    if (l.isEmpty() || l.startsWith('#')) continue;
    const auto m = line.match(l);
    if (!m.hasMatch()) continue;
    bool number = false;
    PrometheusSample sample;
    sample.value = m.captured(3).toDouble(&number);
    if (!number) continue;
    sample.name = m.captured(1);
    for (auto it = label.globalMatch(m.captured(2)); it.hasNext();) {
      const auto lm = it.next();
      QString value = lm.captured(2);
      value.replace("\\n", "\n").replace("\\\"", "\"").replace("\\\\", "\\");
      sample.labels[lm.captured(1)] = value;
    }
    out.push_back(std::move(sample));
  }
  return out;
}

ServiceWatch::ServiceWatch(QObject* parent) : QObject(parent) {
  timer_.setInterval(1000);
  connect(&timer_, &QTimer::timeout, this, &ServiceWatch::poll);
}

void ServiceWatch::watch(const QString& address) {
  stop();
  url_ = endpoint_url(address, "/metrics");
  workers_.clear();
  problem_ = "not read yet";
  reached_ = false;
  clock_.start();
  poll();
  timer_.start();
}

void ServiceWatch::stop() {
  timer_.stop();
  // Readings still in flight are let go without reaching this watch.
  for (auto* reply : findChildren<QNetworkReply*>()) {
    reply->disconnect(this);
    reply->abort();
    reply->deleteLater();
  }
  in_flight_ = 0;
}

ServiceWorkerRow* ServiceWatch::row(const QString& id) {
  const auto it = std::find_if(workers_.begin(), workers_.end(), [&](const ServiceWorkerRow& r) { return r.id == id; });
  return it == workers_.end() ? nullptr : &*it;
}

void ServiceWatch::poll() {
  if (in_flight_ > 0) return;  // a slow answer: not asked again on top of it
  ++in_flight_;
  QNetworkRequest request(url_);
  request.setTransferTimeout(3000);
  auto* reply = network_.get(request);
  reply->setParent(this);
  connect(reply, &QNetworkReply::finished, this, [this, reply] { read_dispatcher(reply); });
}

void ServiceWatch::read_dispatcher(QNetworkReply* reply) {
  reply->deleteLater();
  --in_flight_;
  if (reply->error() != QNetworkReply::NoError) {
    problem_ = reply->errorString();
    emit changed();
    return;
  }
  const auto samples = parse_prometheus(QString::fromUtf8(reply->readAll()));
  // The workers the dispatcher lists now, in its order; each keeps what its own /metrics said.
  std::vector<ServiceWorkerRow> listed;
  for (const auto& s : samples) {
    if (s.name != "sluice_dispatcher_worker_alive") continue;
    ServiceWorkerRow r;
    if (const auto* known = row(s.labels.value("worker"))) r = *known;
    r.id = s.labels.value("worker");
    r.address = s.labels.value("address");
    r.host = s.labels.value("host");
    r.metrics = s.labels.value("metrics");
    r.alive = s.value > 0;
    listed.push_back(r);
  }
  if (listed.empty() && std::none_of(samples.begin(), samples.end(), [](const PrometheusSample& s) {
        return s.name.startsWith("sluice_dispatcher_");
      })) {
    problem_ = "this address serves no dispatcher's metrics (give the dispatcher's --metrics-addr)";
    emit changed();
    return;
  }
  for (const auto& s : samples)
    if (s.name == "sluice_dispatcher_worker_splits_in_hand")
      for (auto& r : listed)
        if (r.id == s.labels.value("worker")) r.splits_in_hand = s.value;
  workers_ = std::move(listed);
  problem_.clear();
  reached_ = true;
  for (const auto& r : workers_) {
    if (r.metrics.isEmpty() || !r.alive) continue;
    ++in_flight_;
    QNetworkRequest request(endpoint_url(r.metrics, "/metrics"));
    request.setTransferTimeout(3000);
    auto* worker_reply = network_.get(request);
    worker_reply->setParent(this);
    connect(worker_reply, &QNetworkReply::finished, this,
            [this, id = r.id, worker_reply] { read_worker(id, worker_reply); });
  }
  emit changed();
}

void ServiceWatch::read_worker(const QString& id, QNetworkReply* reply) {
  reply->deleteLater();
  --in_flight_;
  ServiceWorkerRow* r = row(id);
  if (!r) return;  // no longer listed
  if (reply->error() != QNetworkReply::NoError) {
    r->metrics_problem = reply->errorString();
    emit changed();
    return;
  }
  double elements = 0, bytes = 0, active = 0, made = 0;
  for (const auto& s : parse_prometheus(QString::fromUtf8(reply->readAll()))) {
    if (s.name == "sluice_worker_elements_sent_total")
      elements = s.value;
    else if (s.name == "sluice_worker_bytes_sent_total")
      bytes = s.value;
    else if (s.name == "sluice_worker_splits_active")
      active = s.value;
    else if (s.name == "sluice_worker_splits_total" && s.labels.value("outcome") == "done")
      made = s.value;
  }
  const qint64 now = clock_.elapsed();
  // Rates between two readings; a counter that went back (the worker restarted) starts again.
  if (r->metrics_read && now > r->read_at_ms && elements >= r->elements) {
    const double seconds = static_cast<double>(now - r->read_at_ms) / 1000.0;
    r->elements_per_s = (elements - r->elements) / seconds;
    r->bytes_per_s = std::max(0.0, bytes - r->bytes) / seconds;
  }
  r->elements = elements;
  r->bytes = bytes;
  r->splits_active = active;
  r->splits_made = made;
  r->read_at_ms = now;
  r->metrics_read = true;
  r->metrics_problem.clear();
  emit changed();
}

}  // namespace sluice::studio

#include "moc_service_watch.cpp"
