#include "workers.hpp"

#include <QHeaderView>
#include <QRegularExpression>
#include <QVBoxLayout>
#include <algorithm>

namespace sluice::studio {

namespace {
enum Column { kWorker, kAddress, kState, kRate, kDone, kBottleneck, kColumns };

// The end of the pipeline: its (last) sink.
const metrics::StageMetrics* end_stage(const metrics::MetricsSnapshot& snap) {
  const metrics::StageMetrics* end = nullptr;
  for (const auto& st : snap.stage())
    if (st.kind() == "sink") end = &st;
  return end;
}

const char* kRateTip =
    "elements/s out of each worker's pipeline (its last sink), as its own snapshots give them: over the last 2 s while it "
    "runs, as the canvas shows them; over its whole run once it ended (run avg), as its report gives them";
}  // namespace

WorkersPanel::WorkersPanel(QWidget* parent) : QWidget(parent) {
  table_ = new QTableWidget(0, kColumns);
  show_headers(false);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->verticalHeader()->hide();
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  summary_ = new QLabel("Attach to several workers (Run > Attach, their addresses separated by commas) to compare them here, or to a Sluice "
                        "service (Run > Attach to a service, its dispatcher's metrics address).");
  summary_->setWordWrap(true);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(summary_);
  layout->addWidget(table_);
}

WorkersPanel::~WorkersPanel() { forget_clients(); }

void WorkersPanel::show_headers(bool service) {
  if (service) table_->setHorizontalHeaderLabels({"worker", "address", "state", "elements/s", "elements sent", "splits"});
  else table_->setHorizontalHeaderLabels({"worker", "address", "state", "elements/s\nlast 2 s", "elements", "bottleneck"});
  table_->horizontalHeaderItem(kRate)->setToolTip(service ? QString("elements/s sent by each worker, between its last two /metrics readings")
                                                          : QString(kRateTip));
}

void WorkersPanel::attach_service(const QString& address) {
  forget_clients();
  table_->setRowCount(0);
  show_headers(true);
  service_ = std::make_unique<ServiceWatch>();
  connect(service_.get(), &ServiceWatch::changed, this, &WorkersPanel::redraw_service);
  service_->watch(address);
  redraw_service();
}

// A row per worker the dispatcher lists. In DYNAMIC mode a slow worker holds nobody back (it is
// given fewer splits): the summary names it for what it costs, and a lost one for where its
// splits went.
void WorkersPanel::redraw_service() {
  const auto& rows = service_->workers();
  table_->setRowCount(static_cast<int>(rows.size()));
  slowest_ = -1;
  int rated = 0, alive = 0, with_metrics = 0;
  double total = 0, bytes = 0, fastest = 0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto& r = rows[k];
    alive += r.alive;
    with_metrics += !r.metrics.isEmpty();
    if (!r.alive || r.elements_per_s < 0) continue;
    ++rated;
    total += r.elements_per_s;
    bytes += r.bytes_per_s;
    fastest = std::max(fastest, r.elements_per_s);
    if (slowest_ < 0 || r.elements_per_s < rows[static_cast<std::size_t>(slowest_)].elements_per_s) slowest_ = static_cast<int>(k);
  }
  if (rated < 2 || fastest <= 0) slowest_ = -1;  // (all idle: none is slower)
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto& r = rows[k];
    const int row = static_cast<int>(k);
    const bool slow = row == slowest_;
    auto set = [&](int column, const QString& text) {
      auto* item = table_->item(row, column);
      if (!item) table_->setItem(row, column, item = new QTableWidgetItem);
      item->setText(text);
      item->setBackground(!r.alive ? QColor(245, 190, 185) : slow ? QColor(255, 224, 178) : QBrush());
      item->setForeground(!r.alive ? QColor(140, 20, 20) : QBrush());
      item->setToolTip(!r.alive ? "the dispatcher has not heard from this worker for its heartbeat timeout: the splits it was making "
                                  "are made again by the others, from where their trainers were"
                       : slow   ? "the slowest worker: in DYNAMIC mode it is given fewer splits; it holds trainers back only in OFF "
                                  "and static modes, or in coordinated reads"
                                : QString());
    };
    QString state = r.alive ? "alive" : "lost";
    if (r.alive && r.metrics.isEmpty()) state += " (no --metrics-addr: no rate)";
    else if (r.alive && !r.metrics_problem.isEmpty()) state += QString(" (its /metrics at %1: %2)").arg(r.metrics, r.metrics_problem);
    set(kWorker, r.id + (slow ? "  (slowest)" : !r.alive ? "  (lost)" : ""));
    set(kAddress, r.address);
    set(kState, state);
    set(kRate, r.alive && r.elements_per_s >= 0 ? QString::number(r.elements_per_s, 'f', 0) : QString());
    set(kDone, r.metrics_read ? QString::number(r.elements, 'f', 0) : QString());
    set(kBottleneck, r.metrics_read ? QString("%1 in hand, %2 made").arg(r.splits_in_hand).arg(r.splits_made) : QString("%1 in hand").arg(r.splits_in_hand));
  }
  QString text = QString("Service at %1: ").arg(service_->url());
  if (!service_->reached()) {
    summary_->setText(text + service_->problem());
    return;
  }
  if (!service_->problem().isEmpty()) text += QString("(the last reading failed: %1) ").arg(service_->problem());
  text += QString("%1 worker%2, %3 alive").arg(rows.size()).arg(rows.size() == 1 ? "" : "s").arg(alive);
  if (rated > 0)
    text += QString("; %1 elements/s, %2 sent in all")
                .arg(total, 0, 'f', 0)
                .arg(bytes >= 1e6 ? QString("%1 MB/s").arg(bytes / 1e6, 0, 'f', 1) : QString("%1 KB/s").arg(bytes / 1e3, 0, 'f', 1));
  if (slowest_ >= 0) {
    const auto& s = rows[static_cast<std::size_t>(slowest_)];
    text += QString("; slowest: worker %1 at %2 elements/s").arg(s.id).arg(s.elements_per_s, 0, 'f', 0);
    if (fastest > 0) text += QString(" (%1% of the fastest)").arg(100 * s.elements_per_s / fastest, 0, 'f', 0);
  }
  for (const auto& r : rows)
    if (!r.alive) text += QString("; worker %1 (%2) lost: its splits go to the others").arg(r.id, r.address);
  if (!rows.empty() && with_metrics == 0) text += " (start the workers with --metrics-addr to see their rates)";
  summary_->setText(text);
}

// Clients are let go of without telling this panel: a connection closing as it goes must not call
// back into rows that are being cleared.
void WorkersPanel::forget_clients() {
  for (auto& w : workers_)
    if (w.client) {
      w.client->disconnect(this);
      w.client->detach();
    }
  workers_.clear();
}

QStringList WorkersPanel::split_addresses(const QString& text) {
  return text.split(QRegularExpression("[,\\s]+"), Qt::SkipEmptyParts);
}

void WorkersPanel::attach(const QStringList& addresses) {
  forget_clients();
  service_.reset();
  show_headers(false);
  if (addresses.isEmpty()) {
    table_->setRowCount(0);
    summary_->setText("Attach to several workers (Run > Attach, their addresses separated by commas) to compare them here, or to a Sluice "
                        "service (Run > Attach to a service, its dispatcher's metrics address).");
    slowest_ = -1;
    return;
  }
  workers_.resize(static_cast<std::size_t>(addresses.size()));
  table_->setRowCount(static_cast<int>(addresses.size()));
  for (std::size_t row = 0; row < workers_.size(); ++row) {
    auto& w = workers_[row];
    w.address = addresses[static_cast<int>(row)];
    w.client = std::make_unique<AttachClient>();
    connect(w.client.get(), &AttachClient::snapshot, this, [this, row](const metrics::MetricsSnapshot& snap) { update(row, snap); });
    connect(w.client.get(), &AttachClient::ended, this, [this, row](const QString& why) {
      auto& ended = workers_[row];
      if (why.startsWith("detached")) {
        if (ended.state == "connecting" || ended.state == "running") ended.state = "detached";
      } else if (ended.state == "connecting") {
        ended.state = "no answer";
      } else if (ended.state == "running") {
        // No final snapshot said it ended: the process died (or its network went).
        ended.state = "dead (stream closed mid-run)";
        ended.dead = true;
        ended.rate = 0;
      }
      redraw();
    });
    w.client->attach(w.address);
  }
  redraw();
}

void WorkersPanel::detach() {
  if (service_) service_->stop();
  for (auto& w : workers_)
    if (w.client) w.client->detach();
}

int WorkersPanel::attached_count() const {
  if (service_) return service_->watching() ? static_cast<int>(service_->workers().size()) : 0;
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.client && w.client->attached(); }));
}

void WorkersPanel::update(std::size_t row, const metrics::MetricsSnapshot& snap) {
  auto& w = workers_[row];
  w.state = QString::fromStdString(snap.state());
  w.index = snap.worker().index();
  w.count = std::max(1, snap.worker().count());
  // The snapshot's own figures, never a rate of this panel's: the same as the canvas and the
  // worker's report show.
  const metrics::StageMetrics* end = end_stage(snap);
  w.ended = w.state != "running" && w.state != "created";
  w.rate = !end ? 0 : w.ended ? end->elements_per_s() : end->recent_elements_per_s();
  w.done = end ? end->elements_in() : 0;
  w.last_elapsed = snap.elapsed_s();
  w.bottleneck = QString::fromStdString(snap.bottleneck());
  redraw();
}

void WorkersPanel::redraw() {
  // The slowest: the lowest rate among the workers still running (once two have a rate).
  slowest_ = -1;
  int rated = 0;
  double fastest = 0, total = 0;
  for (std::size_t row = 0; row < workers_.size(); ++row) {
    const auto& w = workers_[row];
    if (w.state != "running" || w.last_elapsed < 0) continue;
    ++rated;
    total += w.rate;
    fastest = std::max(fastest, w.rate);
    if (slowest_ < 0 || w.rate < workers_[static_cast<std::size_t>(slowest_)].rate) slowest_ = static_cast<int>(row);
  }
  const auto dead = std::find_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.dead; });
  if (rated < 2 || dead != workers_.end()) slowest_ = -1;  // a dead worker is what the job waits for
  for (std::size_t row = 0; row < workers_.size(); ++row) {
    const auto& w = workers_[row];
    const int r = static_cast<int>(row);
    auto set = [&](int column, const QString& text) {
      auto* item = table_->item(r, column);
      if (!item) table_->setItem(r, column, item = new QTableWidgetItem);
      item->setText(text);
      const bool slow = r == slowest_;
      item->setBackground(w.dead ? QColor(245, 190, 185) : slow ? QColor(255, 224, 178) : QBrush());
      item->setForeground(w.dead ? QColor(140, 20, 20) : QBrush());
      item->setToolTip(w.dead ? "this worker's stream closed while it was running, without a final snapshot: the process died "
                                "or its network went; synchronous training waits for it"
                       : slow ? "the slowest worker: synchronous training waits for it at every step"
                              : QString());
    };
    set(kWorker, w.index < 0 ? "?" : QString("%1 of %2%3").arg(w.index).arg(w.count).arg(r == slowest_ ? "  (slowest)" : w.dead ? "  (dead)" : ""));
    set(kAddress, w.address);
    set(kState, w.state);
    set(kRate, w.last_elapsed < 0 ? ""
               : w.dead           ? QString::fromUtf8("\u2014")
               : w.ended          ? QString("%1 run avg").arg(w.rate, 0, 'f', 0)
                                  : QString::number(w.rate, 'f', 0));
    set(kDone, w.last_elapsed < 0 ? "" : QString::number(w.done));
    set(kBottleneck, w.dead ? QString() : w.bottleneck);
  }
  if (workers_.empty()) return;
  QString text = QString("%1 workers, %2 running").arg(workers_.size()).arg(rated);
  if (rated > 0) text += QString(", %1 elements/s in all").arg(total, 0, 'f', 0);
  if (dead != workers_.end()) {
    text += QString("; worker %1 (%2) died after %3 elements: synchronous training waits for it")
                .arg(dead->index < 0 ? QString("?") : QString::number(dead->index), dead->address)
                .arg(dead->done);
    const auto more = std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.dead; }) - 1;
    if (more > 0) text += QString(" (and %1 more dead)").arg(more);
  } else if (slowest_ >= 0) {
    const auto& s = workers_[static_cast<std::size_t>(slowest_)];
    text += QString("; slowest: worker %1 at %2 elements/s").arg(s.index).arg(s.rate, 0, 'f', 0);
    if (fastest > 0) text += QString(" (%1% of the fastest)").arg(100 * s.rate / fastest, 0, 'f', 0);
    if (!s.bottleneck.isEmpty()) text += QString(", its bottleneck '%1'").arg(s.bottleneck);
  }
  summary_->setText(text);
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_workers.cpp"
