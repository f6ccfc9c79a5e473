// The main window's runs: started here, attached to (a run's metrics address, a job's workers, a
// service), replayed from a metrics log, compared with the run before, and their verdicts.
#include "main_window.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include <QCloseEvent>
#include <QDir>
#include <QDockWidget>
#include <QRegularExpression>
#include <QFileDialog>
#include <QFileInfo>
#include <QInputDialog>
#include <QLineEdit>
#include <QMap>
#include <QMenuBar>
#include <QScreen>
#include <QSettings>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>

#include "sluice/abi.hpp"
#include "sluice/core/metrics_log.hpp"


namespace sluice::studio {

// A run started here: its snapshots drawn, its end shown with the verdict.
void MainWindow::follow_runs() {
  connect(&runner_, &RunController::snapshot, this, [this](const metrics::MetricsSnapshot& snap) { apply_snapshot(snap); });
  connect(&runner_, &RunController::finished, this, &MainWindow::on_run_finished);
}

// A run attached to: its pipeline drawn when it says which, its snapshots, its end, a lost connection.
void MainWindow::follow_attached_runs() {
  connect(&attach_, &AttachClient::pipeline, this, [this](spec::PipelineSpec spec) {
    show_attached_run();
    if (!document_.read_only()) return;
    Document::lay_out_unless_placed(spec);
    document_.reset(spec, attach_.url(), true);
    attached_pipeline_known_ = true;
    live_graph_.reset();  // the next snapshot is drawn on this graph
    view_->fit();
  });
  connect(&attach_, &AttachClient::snapshot, this, [this](const metrics::MetricsSnapshot& snap) {
    show_attached_run();
    if (document_.read_only() && !attached_pipeline_known_ && document_.spec().stage_size() != snap.stage_size()) {
      // The attached run's pipeline, as its snapshots describe it.
      spec::PipelineSpec shown;
      for (const auto& st : snap.stage()) {
        auto* s = shown.add_stage();
        s->set_id(st.id());
        s->set_op(st.op());
        for (const auto& in : st.inputs()) s->add_input(in);
      }
      Document::lay_out(shown);
      document_.reset(shown, attach_.url(), true);
      view_->fit();
    }
    const QString state = QString::fromStdString(snap.state());
    apply_snapshot(snap, !state.isEmpty() && state != "running" && state != "created");
    if (state == "running") {
      set_run_state("Attached: running at " + attach_.url());
    } else if (!state.isEmpty() && state != "created") {
      const bool first_end = attached_final_state_.isEmpty();
      attached_final_state_ = state;
      if (!snap.failed_stage().empty()) attached_final_state_ += QString(" at stage '%1'").arg(QString::fromStdString(snap.failed_stage()));
      set_run_state("Attached run " + attached_final_state_);
      if (first_end) show_verdict(snap, "run attached at " + attach_.url());
    }
  });
  connect(&attach_, &AttachClient::waiting, this, [this](const QString& why) { set_run_state("Waiting for a run: " + why); });
  connect(&attach_, &AttachClient::ended, this, [this](const QString& why) {
    log_->note(why);
    show_status(why);
    action("detach")->setEnabled(false);
    // The last snapshot told how the run ended; without one, the connection ended first; and
    // without any, there was never an attach to speak of.
    attach_pending_ = false;  // never answered: the window still shows what it showed
    if (!attach_.reached()) set_run_state((why.startsWith("detached") ? "Not attached: " : "Could not attach: ") + why);
    else if (why.startsWith("detached")) set_run_state("Detached from " + attach_.url() + " (numbers as last seen)");
    else if (!attached_final_state_.isEmpty()) set_run_state(QString("Attached run %1; its stream closed").arg(attached_final_state_));
    else {
      set_run_state("Connection lost: " + why + " (numbers as last seen)");
      scene_->mark_lost(why);
    }
  });
}

void MainWindow::set_running(bool running) {
  action("run")->setEnabled(!running);
  action("stop")->setEnabled(running);
  action("attach")->setEnabled(!running);
  action("attach_service")->setEnabled(!running);
}

bool MainWindow::start_run() {
  if (runner_.running()) return false;
  if (attach_pending_) {  // a run here, not the one that has not answered yet
    attach_.detach();
    workers_->attach({});
  }
  if (document_.read_only()) {
    // The canvas shows a run elsewhere, or a log's copy: there is no pipeline here to run.
    const QString why = read_only_because_ + "; then open or build a pipeline to run it here";
    log_->note("not started: " + why);
    show_status("Not started: " + why, 10000);
    return false;
  }
  clear_live();
  clear_verdict();
  log_->reset_run();
  if (auto failure = runner_.start(document_.spec(), document_.file(), document_.registry())) {
    log_->note("cannot run: " + failure->message);
    show_status("Cannot run: " + failure->message);
    if (!failure->stage.isEmpty()) {
      show_start_failure(*failure);
      return false;
    }
    bottom_tabs_->setCurrentIndex(document_.problems().empty() ? 2 : 1);
    return false;
  }
  set_running(true);
  live_graph_ = document_.spec();
  document_.lock_graph("a run of this pipeline is going; stop it (Shift+F5) before changing the pipeline");
  log_->note("run started");
  show_status("Running…");
  set_run_state("Running " + (document_.file().isEmpty() ? QString("untitled") : QFileInfo(document_.file()).fileName()));
  return true;
}

void MainWindow::show_start_failure(const RunController::StartFailure& failure) {
  // A stage that could not start: marked on the canvas with the message, and the Verdict says so,
  // as for a run that failed later.
  metrics::MetricsSnapshot failed;
  failed.set_state("failed");
  failed.set_error(failure.message.toStdString());
  failed.set_failed_stage(failure.stage.toStdString());
  // Only the stage that failed: the others never ran, and have no figures to show.
  for (const auto& st : document_.spec().stage()) {
    if (QString::fromStdString(st.id()) != failure.stage) continue;
    auto* m = failed.add_stage();
    m->set_id(st.id());
    m->set_op(st.op());
  }
  apply_snapshot(failed, true);
  const QString name = document_.file().isEmpty() ? QString("untitled") : QFileInfo(document_.file()).fileName();
  set_run_state(QString("Failed to start at stage '%1': %2").arg(failure.stage, name));
  show_verdict(failed, "run of " + name);
}

void MainWindow::on_run_finished(const QString& state, const QString& error, const QString& failed_stage) {
  set_running(false);
  document_.unlock_graph();
  log_->note(error.isEmpty() ? QString("run %1").arg(state) : QString("run %1: %2").arg(state, error));
  show_status(error.isEmpty() ? QString("Run %1.").arg(state) : QString("Run failed: %1").arg(error));
  const QString name = document_.file().isEmpty() ? QString("untitled") : QFileInfo(document_.file()).fileName();
  // The run's end, on the canvas, in the Verdict, and beside the run before it.
  auto show_end = [&](const metrics::MetricsSnapshot& final_snapshot) {
    show_verdict(final_snapshot, "run of " + name);
    compare_with_shown_run({final_snapshot, live_graph_.value_or(document_.spec()), "run of " + name, document_.read_only() ? QString() : document_.file()});
  };
  if (state == "failed") {
    // The failing stage is marked on the canvas with the message, whatever the last snapshot said.
    metrics::MetricsSnapshot final_state = last_snapshot_;
    final_state.set_state("failed");
    final_state.set_error(error.toStdString());
    final_state.set_failed_stage(failed_stage.toStdString());
    apply_snapshot(final_state, true);
    set_run_state(failed_stage.isEmpty() ? QString("Failed: %1").arg(name) : QString("Failed at stage '%1': %2").arg(failed_stage, name));
    show_end(final_state);
    return;
  }
  if (last_snapshot_.stage_size()) apply_snapshot(last_snapshot_, true);
  set_run_state(state == "stopped" ? QString("Stopped (interrupted): %1").arg(name) : QString("Finished: %1").arg(name));
  show_end(last_snapshot_);
}

void MainWindow::compare_with_shown_run(EndedRun ended) {
  if (ended.final_snapshot.stage_size() == 0) return;
  // A failed run is compared with nothing and is nothing to compare with: the next run is set
  // beside the last one that did not fail, and says so.
  if (ended.final_snapshot.state() == "failed") {
    if (shown_run_) shown_run_->source = "the last run that did not fail";
    return;
  }
  if (shown_run_ && !why_not_comparable(*shown_run_, ended)) verdict_->show_comparison(comparison_html(*shown_run_, ended));
  shown_run_ = std::move(ended);
}

bool MainWindow::compare_with_metrics_log(const QString& file) {
  auto refuse = [&](const QString& why) {
    log_->note(QString("not compared with %1: %2").arg(file, why));
    show_status(QString("Cannot compare with %1: %2").arg(QFileInfo(file).fileName(), why), 10000);
    return false;
  };
  if (!shown_run_) return refuse("no run has ended in this window yet; run the pipeline (F5) or open a metrics log first");
  std::vector<metrics::MetricsSnapshot> snapshots;
  try {
    snapshots = read_metrics_log(file.toStdString());
  } catch (const std::exception& e) {
    return refuse(QString::fromUtf8(e.what()));
  }
  EndedRun logged{snapshots.back(), shown_run_->pipeline, "metrics log " + QFileInfo(file).fileName(),
                  QString::fromStdString(snapshots.front().pipeline().file())};
  if (snapshots.front().has_pipeline()) {
    try {
      logged.pipeline = parse_pipeline(snapshots.front().pipeline().text(), file.toStdString()).spec;
    } catch (const std::exception& e) {
      return refuse(QString("its copy of the pipeline does not read: %1").arg(QString::fromUtf8(e.what())));
    }
  }
  if (auto why = why_not_comparable(logged, *shown_run_)) return refuse(*why);
  verdict_->show_comparison(comparison_html(logged, *shown_run_));
  bottom_tabs_->setCurrentWidget(verdict_);
  return true;
}

void MainWindow::show_verdict(const metrics::MetricsSnapshot& final_snapshot, const QString& source) {
  if (final_snapshot.stage_size() == 0) return;
  verdict_->show_verdict(final_snapshot, source);
  verdict_pipeline_ = live_graph_.value_or(document_.spec());
  verdict_->set_apply_refusal(document_.read_only() ? read_only_because_ : QString());
  bottom_tabs_->setTabText(3, verdict_->suggestion_count() ? QString("Verdict (%1)").arg(verdict_->suggestion_count()) : QString("Verdict"));
  bottom_tabs_->setCurrentWidget(verdict_);
}

bool MainWindow::open_metrics_log(const QString& file) {
  auto refuse = [&](const QString& why) {
    last_open_error_ = why;
    log_->note(QString("metrics log %1 not opened: %2").arg(file, why));
    show_status(QString("Cannot open %1: %2").arg(QFileInfo(file).fileName(), why));
    return false;
  };
  if (runner_.running()) return refuse("a run is going in this window; stop it (Shift+F5) first");
  std::vector<metrics::MetricsSnapshot> snapshots;
  try {
    snapshots = read_metrics_log(file.toStdString());
  } catch (const std::exception& e) {
    return refuse(QString::fromUtf8(e.what()));
  }
  if (auto refusal = show_pipeline_of_log(snapshots.front(), QFileInfo(file).fileName())) return refuse(*refusal);
  replay_log(snapshots, QFileInfo(file).fileName());
  log_->note(QString("metrics log %1: %2 snapshots of the run of %3").arg(file).arg(snapshots.size()).arg(document_.file()));
  return true;
}

namespace {

// Stages (of a pipeline or a snapshot) as (id, operator), sorted: what a metrics log's numbers
// are attached to.
template <class Stages>
std::vector<std::pair<std::string, std::string>> stage_names(const Stages& stages) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& st : stages) out.emplace_back(st.id(), st.op());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::optional<QString> MainWindow::show_pipeline_of_log(const metrics::MetricsSnapshot& first, const QString& name) {
  const bool open_is_the_logs = !document_.read_only() && stage_names(document_.spec().stage()) == stage_names(first.stage());
  if (!first.has_pipeline()) {
    // A log written before logs carried their pipeline: only the open pipeline can be its.
    if (open_is_the_logs) return std::nullopt;
    QStringList stages;
    for (const auto& [id, op] : stage_names(first.stage())) stages << QString::fromStdString(id);
    return QString("%1 holds no copy of its pipeline (it was written by an older Sluice) and its stages (%2) are not the open "
                   "pipeline's: open the pipeline it was made from, then the log")
        .arg(name, stages.join(", "));
  }
  spec::PipelineSpec logged;
  try {
    logged = parse_pipeline(first.pipeline().text(), name.toStdString()).spec;
  } catch (const std::exception& e) {
    return QString("its copy of the pipeline does not read: %1").arg(QString::fromUtf8(e.what()));
  }
  // The open pipeline, or the log's file, is the log's only as it ran: the run's numbers shown on
  // parameters changed since (and Apply offered on them) would be false.
  if (open_is_the_logs && pipeline_changes(logged, document_.spec()).isEmpty()) return std::nullopt;
  if (!confirm_discard()) return QString("the open pipeline has unsaved changes, kept");
  const QString original = QString::fromStdString(first.pipeline().file());
  QString file_now = QFileInfo::exists(original) ? QString("another pipeline now") : QString("not on this machine");
  if (!original.isEmpty() && QFileInfo::exists(original)) {
    try {
      const QStringList changed = pipeline_changes(logged, read_pipeline_file(original.toStdString()).spec);
      if (changed.isEmpty() && open_file(original)) return std::nullopt;
      if (!changed.isEmpty()) file_now = QString("changed since the run: %1").arg(changed.mid(0, 3).join("; ") + (changed.size() > 3 ? "; …" : ""));
    } catch (const std::exception& e) {
      file_now = QString("unreadable now (%1)").arg(QString::fromUtf8(e.what()));
    }
  }
  attach_.detach();
  workers_->attach({});
  Document::lay_out_unless_placed(logged);
  document_.reset(logged, name + " (metrics log)", true);
  read_only_because_ = QString("this window shows the pipeline of the metrics log %1, as the log recorded it (its file %2 is %3); "
                               "open that pipeline file to change it")
                           .arg(name, original.isEmpty() ? QString("(none)") : original, file_now);
  QMetaObject::invokeMethod(view_, [view = view_] { view->fit(); }, Qt::QueuedConnection);
  return std::nullopt;
}

void MainWindow::replay_log(const std::vector<metrics::MetricsSnapshot>& snapshots, const QString& name) {
  clear_live();
  clear_verdict();
  log_->reset_run();
  // The charts from every snapshot, as they were drawn while it ran; the nodes and the table
  // show the run's averages from the last.
  for (std::size_t i = 0; i + 1 < snapshots.size(); ++i) {
    monitor_->show_snapshot(snapshots[i], false);
    log_->show_snapshot(snapshots[i]);
  }
  apply_snapshot(snapshots.back(), true);
  const auto& last = snapshots.back();
  set_run_state(QString("Metrics log %1: %2 after %3 s").arg(name, QString::fromStdString(last.state())).arg(last.elapsed_s(), 0, 'f', 2));
  show_verdict(last, "metrics log " + name);
  compare_with_shown_run({last, document_.spec(), "metrics log " + name, QString::fromStdString(snapshots.front().pipeline().file())});
}

void MainWindow::clear_live() {
  live_graph_.reset();
  last_snapshot_.Clear();
  attached_final_state_.clear();
  scene_->set_live({});
  monitor_->clear();
  inspector_->show_metrics({});
}

void MainWindow::clear_verdict() {
  verdict_->clear();
  verdict_pipeline_.reset();
  applied_steps_.clear();
  bottom_tabs_->setTabText(3, "Verdict");
}

void MainWindow::set_run_state(const QString& text) {
  run_state_text_ = text;
  run_state_->setToolTip(text);
  show_run_state();
}

void MainWindow::show_run_state() {
  // At most under half the status bar, elided (the tooltip has it whole): the messages on the left
  // keep their room and the two never run into each other.
  const int room = std::max(120, width() * 45 / 100);
  run_state_->setMaximumWidth(room);
  run_state_->setText(run_state_->fontMetrics().elidedText(run_state_text_, Qt::ElideMiddle, room - 8));
}

QString MainWindow::run_state() const { return run_state_text_; }

void MainWindow::stop_run() {
  if (!runner_.running()) return;
  runner_.stop();
  show_status("Stopping…");
}

void MainWindow::attach_to(const QString& address) {
  if (runner_.running()) return;
  if (!confirm_discard()) return;
  const QStringList addresses = WorkersPanel::split_addresses(address);
  if (addresses.isEmpty()) return;
  remember_in("recent_attach", address);
  // Several workers: each one's rate in the Workers panel; the canvas shows the first.
  workers_->attach(addresses.size() > 1 ? addresses : QStringList{});
  if (addresses.size() > 1) bottom_tabs_->setCurrentWidget(workers_);
  attach_.attach(addresses.first());  // (a run attached to before ends here, telling so)
  // What the window shows stays until the run answers (show_attached_run): an attach that fails
  // leaves the open file, its title and its numbers as they were.
  attach_pending_ = true;
  set_run_state("Attaching to " + attach_.url());
  action("detach")->setEnabled(true);
  log_->note("attaching to " + attach_.url());
  show_status(QString("Attaching to %1…").arg(attach_.url()));
}

// The run attached to answered: from now on the window shows it, read-only, in place of what it
// showed.
void MainWindow::show_attached_run() {
  if (!std::exchange(attach_pending_, false)) return;
  clear_live();
  clear_verdict();
  log_->reset_run();
  document_.reset({}, attach_.url(), true);
  shown_run_.reset();
  read_only_because_ = QString("this window shows the run attached at %1, which runs elsewhere; detach (Run > Detach)").arg(attach_.url());
  attached_pipeline_known_ = false;
  live_graph_.reset();
  log_->note("attached to " + attach_.url());
  show_status("Attached to " + attach_.url());
}

// A Sluice service: a row per worker its dispatcher lists, in the Workers panel. The canvas shows
// nothing of it (the workers run the jobs of trainers, which are runs of their own).
void MainWindow::attach_to_service(const QString& address) {
  if (runner_.running()) return;
  remember_in("recent_attach_service", address);
  attach_.detach();
  workers_->attach_service(address);
  const QString url = workers_->service()->url();
  // The service has no one pipeline to draw (its workers are in the Workers tab): another run's
  // canvas, title and lost outline go; a file being edited stays, without numbers.
  clear_live();
  clear_verdict();
  shown_run_.reset();
  if (document_.read_only()) {
    document_.reset({}, {});
    read_only_because_.clear();
  }
  bottom_tabs_->setCurrentWidget(workers_);
  action("detach")->setEnabled(true);
  set_run_state("Following the service at " + url);
  log_->note("following the service whose dispatcher serves " + url);
  show_status("Following the service at " + url);
}

void MainWindow::apply_snapshot(const metrics::MetricsSnapshot& snap, bool run_ended) {
  last_snapshot_ = snap;
  if (!live_graph_) live_graph_ = document_.spec();
  QHash<QString, LiveStage> live;
  for (const auto& st : snap.stage()) {
    LiveStage l;
    l.elements_per_s = run_ended ? st.elements_per_s() : st.recent_elements_per_s();
    l.bytes_per_s = run_ended ? st.bytes_per_s() : st.recent_bytes_per_s();
    l.averages = run_ended;
    l.busy = st.busy_fraction();
    // An ended run's buffers are drained: their bars show the mean fill over the run instead.
    auto level = [run_ended](std::uint32_t now, double mean_fill, std::uint32_t capacity) {
      return run_ended ? static_cast<std::uint32_t>(std::lround(std::clamp(mean_fill, 0.0, 1.0) * capacity)) : now;
    };
    l.buffer_level = level(st.buffer_level(), st.mean_buffer_fill(), st.buffer_capacity());
    l.buffer_capacity = st.buffer_capacity();
    l.buffer_bytes = st.buffer_bytes();
    l.buffer_byte_limit = st.buffer_byte_limit();
    for (const auto& r : st.readers())
      l.reader_buffers.insert(QString::fromStdString(r.reader()), {level(r.level(), r.mean_fill(), r.capacity()), r.capacity(), r.bytes(), r.byte_limit()});
    l.fused = !st.fused_with().empty();
    l.workers = st.workers();
    l.workers_tuned = st.workers_tuned();
    l.max_workers = st.max_workers();
    l.skipped = st.errors_skipped();
    if (st.kind() == "source") {
      l.pass_epoch = st.pass_epoch();
      l.pass_position = st.pass_position();
      l.pass_elements = st.pass_elements();
    }
    // A failed run has no bottleneck worth showing: the outline that matters is the failure's.
    // Outlined only when it holds the pipeline up, as the Verdict says; the busiest stage of a
    // balanced pipeline is not marked.
    l.bottleneck = snap.failed_stage().empty() && bottleneck_holds_up(snap) && st.id() == snap.bottleneck();
    if (l.bottleneck) l.bottleneck_reason = QString::fromStdString(snap.bottleneck_reason());
    if (!snap.failed_stage().empty() && st.id() == snap.failed_stage()) {
      l.failure = QString::fromStdString(snap.error());
    }
    for (const auto& d : st.devices())
      l.devices.push_back(QString("%1 %2B/s ring %3/%4")
                              .arg(QString::fromStdString(d.name()), short_number(d.recent_bytes_per_s()))
                              .arg(d.ring_level())
                              .arg(d.ring_capacity()));
    live.insert(QString::fromStdString(st.id()), l);
  }
  scene_->set_live(live);
  monitor_->show_snapshot(snap, run_ended);
  inspector_->show_metrics(snap);
  log_->show_snapshot(snap);
}

}  // namespace sluice::studio
