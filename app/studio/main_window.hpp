#pragma once
// The window: palette (left), canvas (centre), inspector (right), problems, monitor and log
// (below). It owns the Document and the live sources, and turns snapshots into what the canvas
// and the monitor show.
#include <QLabel>
#include <QListWidget>
#include <QMainWindow>
#include <QMenu>
#include <QMessageBox>
#include <QTabWidget>
#include <functional>
#include <optional>

#include "canvas.hpp"
#include "document.hpp"
#include "inspector.hpp"
#include "live.hpp"
#include "workers.hpp"
#include "monitor.hpp"
#include "palette.hpp"
#include "run_comparison.hpp"
#include "verdict.hpp"

namespace sluice::studio {

// Puts `value` first in a most-recent-first list of ten kept in the app's settings under `key`
// (recent files, recent attach addresses).
void remember_in(const QString& key, const QString& value);

class MainWindow final : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(const Registry& registry, QWidget* parent = nullptr);
  ~MainWindow() override;

  Document& document() { return document_; }
  PipelineScene& scene() { return *scene_; }
  CanvasView& view() { return *view_; }
  Palette& palette() { return *palette_; }
  Inspector& inspector() { return *inspector_; }
  QListWidget& problems() { return *problems_; }
  MonitorPanel& monitor() { return *monitor_; }
  LogPanel& log() { return *log_; }
  VerdictPanel& verdict() { return *verdict_; }
  // Opens a run recorded with `sluice run --metrics-log FILE` as a run: its own pipeline (the open
  // one when it is the log's, else the log's pipeline file, else the log's copy read-only), its
  // table, charts and node numbers, its Verdict; false (and why in the status and log) when the
  // file cannot be read or the pipeline cannot be shown.
  bool open_metrics_log(const QString& file);
  // The run this window last showed the end of, beside the run a metrics log recorded (the log's
  // as "before"); false (and why) when there is no such run, the log does not read, or it is of
  // another pipeline.
  bool compare_with_metrics_log(const QString& file);
  RunController& runner() { return runner_; }
  AttachClient& attach_client() { return attach_; }
  WorkersPanel& workers() { return *workers_; }
  QTabWidget* bottom_tabs() const { return bottom_tabs_; }
  QString status_text() const;
  // What the live numbers shown belong to: "No run", "Running …", "Finished …", "Failed at stage
  // 'x' …", "Stopped …", "Attached …", "Connection lost …" (also shown in the status bar).
  QString run_state() const;
  const metrics::MetricsSnapshot& last_snapshot() const { return last_snapshot_; }
  QAction* action(const QString& name) const;  // "new", "open", "save", "run", "stop", ...

  // Asked before unsaved changes are thrown away (New, Open, Attach, close). Tests replace it.
  std::function<QMessageBox::StandardButton()> ask_to_save;

  // The menu a right click at this point of the canvas opens: for the stage, the connection or the
  // empty canvas under it (object names "context_stage", "context_connection", "context_canvas").
  std::unique_ptr<QMenu> context_menu_at(QPoint view_pos);

  bool open_file(const QString& file);  // false (and a message) when it cannot be read
  QString last_open_error() const { return last_open_error_; }
  bool save_to(const QString& file);
  bool start_run();
  void stop_run();
  // One address, or several separated by commas (the workers of one job: the first one's
  // pipeline is drawn, every worker is compared in the Workers panel).
  void attach_to(const QString& address);
  // Follows a Sluice service from its dispatcher's metrics address (the Workers panel).
  void attach_to_service(const QString& address);

 protected:
  void closeEvent(QCloseEvent* event) override;
  void showEvent(QShowEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  // The constructor's phases: docks, status bar, then what each part follows.
  void build_docks(const Registry& registry);
  void build_status_bar();
  void follow_the_document();
  void follow_the_canvas();
  void follow_runs();  // main_window_run.cpp, as everything about runs and attaching
  void follow_the_verdict();
  void follow_attached_runs();
  void build_actions();
  QAction* add_action(const QString& name, const QString& text, const QKeySequence& key, std::function<void()> slot);
  void build_file_menu();
  void build_edit_menu();
  void build_view_menu();
  void build_run_menu();
  void build_help_menu();
  void build_toolbar();
  // The window's size within the screen, then the size, position and docks it was closed with.
  void restore_window_layout();
  // Docks sized in proportion to the window (a first start), and never leaving the canvas less
  // than half the window's width or half its height (a smaller window than they were set for).
  void size_docks_for_window();
  void keep_room_for_the_canvas();
  bool docks_restored_ = false;
  // Where the file dialogs open.
  QString dialog_folder() const;
  void refresh_problems();
  void refresh_title();
  void show_status(const QString& text, int ms = 0);
  bool confirm_discard();
  // run_ended: the final snapshot of a run; nodes and table show its averages.
  void apply_snapshot(const metrics::MetricsSnapshot& snapshot, bool run_ended = false);
  void add_from_palette(const QString& op);
  // Set by "Insert operator here" on a connection: the next operator added from the palette goes
  // between these two stages. Dropped when the selection changes.
  std::optional<std::pair<QString, QString>> insert_between_;
  void delete_selection();
  void copy_selection();
  // Ctrl+K: the two stages selected, connected from the first selected to the second.
  void connect_selection();
  void paste();
  void paste_stages(const spec::PipelineSpec& stages);
  QPointF make_room_after(const QString& from);
  void remember_recent(const QString& file);
  void rebuild_recent_menu();
  void set_running(bool running);
  // Clears every number, gauge and outline that belongs to another run or another graph.
  void clear_live();
  void clear_verdict();
  void set_run_state(const QString& text);
  void show_run_state();
  QString run_state_text_;
  static constexpr int kStatusMessageMs = 10000;
  void on_run_finished(const QString& state, const QString& error, const QString& failed_stage);
  void show_start_failure(const RunController::StartFailure& failure);
  void show_verdict(const metrics::MetricsSnapshot& final_snapshot, const QString& source);
  // open_metrics_log's phases: the log's pipeline on the canvas (or why not), then its snapshots.
  std::optional<QString> show_pipeline_of_log(const metrics::MetricsSnapshot& first, const QString& name);
  void replay_log(const std::vector<metrics::MetricsSnapshot>& snapshots, const QString& name);

  Document document_;
  PipelineScene* scene_;
  CanvasView* view_;
  Palette* palette_;
  Inspector* inspector_;
  QListWidget* problems_;
  MonitorPanel* monitor_;
  LogPanel* log_;
  WorkersPanel* workers_ = nullptr;
  VerdictPanel* verdict_;
  QTabWidget* bottom_tabs_;  // Monitor, Problems, Log, Verdict, Workers
  RunController runner_;
  AttachClient attach_;
  QMenu* recent_menu_ = nullptr;
  QHash<QString, QAction*> actions_;
  QString last_open_error_;
  QLabel* run_state_ = nullptr;
  // The graph the numbers on screen were measured on; edits that change it clear them.
  std::optional<spec::PipelineSpec> live_graph_;
  // The pipeline the Verdict's run was of: edits since are said there.
  std::optional<spec::PipelineSpec> verdict_pipeline_;
  // The last run (or metrics log) whose end this window showed, for the next one's comparison;
  // forgotten when another pipeline is opened.
  std::optional<EndedRun> shown_run_;
  void compare_with_shown_run(EndedRun ended);
  metrics::MetricsSnapshot last_snapshot_;
  bool attached_pipeline_known_ = false;  // the attached run sent its pipeline (real parameters)
  bool attach_pending_ = false;           // attaching: the run has not answered yet
  void show_attached_run();
  QString read_only_because_;
  // Suggestions applied from the Verdict: the undo step that applied each (its index after it, and
  // the command), so that Undo gives the suggestion back.
  QHash<int, std::pair<int, const QUndoCommand*>> applied_steps_;  // why the document is read-only: what it shows and how to edit instead
  QString attached_final_state_;  // the state the attached run's last snapshot gave
  int added_ = 0;  // stages added from the palette without a drop position, to stagger them
};

}  // namespace sluice::studio
