#include "main_window.hpp"
#include "run_comparison.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <QClipboard>
#include <QCloseEvent>
#include <QDir>
#include <QDockWidget>
#include <QRegularExpression>
#include <QFileDialog>
#include <QFileInfo>
#include <QGuiApplication>
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

MainWindow::MainWindow(const Registry& registry, QWidget* parent) : QMainWindow(parent), document_(registry) {
  scene_ = new PipelineScene(document_, this);
  view_ = new CanvasView(*scene_);
  setCentralWidget(view_);
  build_docks(registry);
  ask_to_save = [this] {
    return QMessageBox::question(this, "Unsaved changes", "The pipeline has unsaved changes. Save them first?",
                                 QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel);
  };

  build_actions();
  build_status_bar();
  follow_the_document();
  follow_the_canvas();
  follow_runs();
  follow_the_verdict();
  follow_attached_runs();
  refresh_problems();
  refresh_title();
  restore_window_layout();
}

// The operators on the left, the inspector on the right, the run's tabs below the canvas.
void MainWindow::build_docks(const Registry& registry) {
  palette_ = new Palette(registry);
  auto* palette_dock = new QDockWidget("Operators", this);
  palette_dock->setObjectName("palette");
  palette_dock->setWidget(palette_);
  addDockWidget(Qt::LeftDockWidgetArea, palette_dock);

  inspector_ = new Inspector(document_);
  inspector_->setMinimumWidth(290);  // room for a path and its picker, or a combo box of choices
  auto* inspector_dock = new QDockWidget("Inspector", this);
  inspector_dock->setObjectName("inspector");
  inspector_dock->setWidget(inspector_);
  addDockWidget(Qt::RightDockWidgetArea, inspector_dock);

  problems_ = new QListWidget;
  monitor_ = new MonitorPanel;
  log_ = new LogPanel;
  verdict_ = new VerdictPanel;
  bottom_tabs_ = new QTabWidget;
  bottom_tabs_->addTab(monitor_, "Monitor");
  bottom_tabs_->addTab(problems_, "Problems");
  bottom_tabs_->addTab(log_, "Log");
  bottom_tabs_->addTab(verdict_, "Verdict");
  workers_ = new WorkersPanel;
  bottom_tabs_->addTab(workers_, "Workers");
  bottom_tabs_->setObjectName("bottom_tabs");
  auto* bottom_dock = new QDockWidget("Run", this);
  bottom_dock->setObjectName("run");
  bottom_dock->setWidget(bottom_tabs_);
  addDockWidget(Qt::BottomDockWidgetArea, bottom_dock);
}

void MainWindow::build_status_bar() {
  statusBar()->showMessage("Ready");
  run_state_ = new QLabel;
  run_state_->setObjectName("run_state");
  statusBar()->addPermanentWidget(run_state_);
  set_run_state("No run");
}

// Problems and title follow every edit; numbers of another graph are cleared; a refused edit says why.
void MainWindow::follow_the_document() {
  connect(&document_, &Document::changed, this, [this] {
    refresh_problems();
    refresh_title();
    // Numbers measured on another graph would be read as this one's.
    if (live_graph_ && !runner_.running() && !attach_.attached() && !same_pipeline_ignoring_layout(*live_graph_, document_.spec())) {
      clear_live();
      set_run_state("No run (the pipeline changed since the last one)");
    }
    // The Verdict stays (its suggestions can be applied, undone, applied again) and says what
    // changed since the run it is of.
    verdict_->show_changed_since(verdict_pipeline_ && !runner_.running() ? pipeline_changes(*verdict_pipeline_, document_.spec()) : QStringList());
  });
  connect(&document_, &Document::edit_refused, this, [this](const QString& reason) {
    show_status("Not changed: " + reason, 8000);
    const QStringList ids = scene_->selected_stage_ids();
    inspector_->show_stage(ids.size() == 1 ? ids.front() : QString());  // back to the document's values
  });
  connect(document_.undo_stack(), &QUndoStack::cleanChanged, this, &MainWindow::refresh_title);
  connect(&document_, &Document::file_changed, this, &MainWindow::refresh_title);
}

// Selection, drops, context menus and clicks on the canvas, the palette, the monitor and the problems.
void MainWindow::follow_the_canvas() {
  connect(scene_, &QGraphicsScene::selectionChanged, this, [this] {
    if (!scene_->selectedItems().isEmpty()) insert_between_.reset();  // the user went on to something else
    const QStringList ids = scene_->selected_stage_ids();
    inspector_->show_stage(ids.size() == 1 ? ids.front() : QString());
    // The Monitor's charts follow: one stage's history, or every stage's.
    monitor_->focus_stage(ids.size() == 1 ? ids.front() : QString());
  });
  connect(monitor_->table(), &QTableWidget::cellClicked, this, [this](int row, int) {
    // A row names its stage first ("decode  ◀ bottleneck"); a device row selects nothing.
    const QString id = monitor_->table()->item(row, 0)->text().section("  ", 0, 0);
    if (scene_->node(id)) scene_->select_stage(id, true);
  });
  connect(scene_, &PipelineScene::hint, this, [this](const QString& text) { show_status(text); });
  connect(scene_, &PipelineScene::connection_refused, this, [this](const QString& reason) { show_status("Not connected: " + reason, 8000); });
  connect(view_, &CanvasView::operator_dropped, this, [this](const QString& op, QPointF at) {
    const QString id = document_.add_stage(op, at);
    scene_->select_stage(id);
  });
  connect(palette_, &Palette::add_requested, this, &MainWindow::add_from_palette);
  connect(view_, &CanvasView::context_menu_requested, this, [this](QPoint view_pos, QPoint global_pos) {
    if (auto menu = context_menu_at(view_pos)) menu->exec(global_pos);
  });
  connect(problems_, &QListWidget::itemClicked, this, [this](QListWidgetItem* item) {
    const QString stage = item->data(Qt::UserRole).toString();
    if (!stage.isEmpty()) scene_->select_stage(stage, true);
  });
}

// Suggestions applied from the verdict, and undone or redone from the undo stack.
void MainWindow::follow_the_verdict() {
  connect(verdict_, &VerdictPanel::apply_requested, this, [this](int index) {
    const auto refusal = document_.apply_suggestion(verdict_->suggestion(index));
    verdict_->mark(index, refusal ? "not applied: " + *refusal : QString("applied"));
    if (!refusal) {
      auto* stack = document_.undo_stack();
      applied_steps_[index] = {stack->index(), stack->command(stack->index() - 1)};
    }
    show_status(refusal ? "Not applied: " + *refusal : QString("Applied; Ctrl+Z undoes it"), 8000);
    // The button just clicked is disabled now: focus would move on to the next field (an
    // inspector's box), whose own Ctrl+Z would not undo the Apply. The canvas takes it.
    view_->setFocus(Qt::OtherFocusReason);
  });
  // An applied suggestion that is undone can be applied again; redone, it is applied again.
  connect(document_.undo_stack(), &QUndoStack::indexChanged, this, [this](int step) {
    auto* stack = document_.undo_stack();
    for (auto it = applied_steps_.begin(); it != applied_steps_.end(); ++it) {
      const bool still = step >= it->first && stack->count() >= it->first && stack->command(it->first - 1) == it->second;
      verdict_->mark(it.key(), still ? QString("applied") : QString());
    }
  });
}

QString MainWindow::dialog_folder() const {
  // The open pipeline's folder, else the last file opened's, else the home folder: never the
  // working directory the app happened to start in.
  if (!document_.read_only() && !document_.file().isEmpty()) return QFileInfo(document_.file()).absolutePath();
  const QStringList recent = QSettings("Sluice", "Sluice Studio").value("recent").toStringList();
  if (!recent.isEmpty()) return QFileInfo(recent.first()).absolutePath();
  return QDir::homePath();
}

void MainWindow::restore_window_layout() {
  // Never larger than the screen's free area (less room for the window manager's frame): the
  // status bar, where run states and errors appear, stays on screen.
  const QRect available = screen() ? screen()->availableGeometry() : QRect(0, 0, 1600, 1000);
  resize(std::min(1600, available.width() * 94 / 100), std::min(1000, available.height() * 92 / 100));
  // Then what the user left it at: size, position and docks.
  // On another screen than it was left on (a laptop's, then a monitor's), the size and the docks'
  // widths of the other would be wrong here: which docks show, and where, are kept; the sizes are
  // the app's own proportions for this screen.
  QSettings settings("Sluice", "Sluice Studio");
  const QSize left_on = settings.value("window/screen").toSize();
  const bool same_screen = !left_on.isValid() || left_on == available.size();
  if (same_screen && settings.contains("window/geometry")) restoreGeometry(settings.value("window/geometry").toByteArray());
  if (settings.contains("window/docks")) docks_restored_ = restoreState(settings.value("window/docks").toByteArray()) && same_screen;
}

namespace {
// The docks beside or under the canvas, not floating: those that take its room.
QList<QDockWidget*> docked(const QMainWindow& window, Qt::DockWidgetArea area) {
  QList<QDockWidget*> found;
  for (auto* dock : window.findChildren<QDockWidget*>())
    if (dock->isVisible() && !dock->isFloating() && window.dockWidgetArea(dock) == area) found << dock;
  return found;
}
}  // namespace

void MainWindow::showEvent(QShowEvent* event) {
  QMainWindow::showEvent(event);
  if (!docks_restored_) size_docks_for_window();
  docks_restored_ = true;  // from now on the user's sizes, only kept from starving the canvas
  // After the layout has placed the docks at this size.
  QMetaObject::invokeMethod(this, &MainWindow::keep_room_for_the_canvas, Qt::QueuedConnection);
}

void MainWindow::resizeEvent(QResizeEvent* event) {
  QMainWindow::resizeEvent(event);
  show_run_state();
  QMetaObject::invokeMethod(this, &MainWindow::keep_room_for_the_canvas, Qt::QueuedConnection);
}

void MainWindow::size_docks_for_window() {
  // The operator list and the inspector as wide as their names and editors need, the Run tabs
  // about a third of the height: the canvas gets the rest.
  for (auto* dock : docked(*this, Qt::LeftDockWidgetArea)) resizeDocks({dock}, {std::max(170, width() * 15 / 100)}, Qt::Horizontal);
  for (auto* dock : docked(*this, Qt::RightDockWidgetArea)) resizeDocks({dock}, {std::max(300, width() * 22 / 100)}, Qt::Horizontal);
  for (auto* dock : docked(*this, Qt::BottomDockWidgetArea)) resizeDocks({dock}, {height() * 34 / 100}, Qt::Vertical);
}

void MainWindow::keep_room_for_the_canvas() {
  // A few pixels over the bound: the docks' separators round the sizes asked for.
  const int spare_width = view_->width() - width() / 2 - 4;
  if (spare_width < 0) {
    // Every side dock gives up its share of what the canvas lacks, down to its minimum.
    QList<QDockWidget*> sides = docked(*this, Qt::LeftDockWidgetArea) + docked(*this, Qt::RightDockWidgetArea);
    int total = 0;
    for (auto* dock : sides) total += dock->width();
    QList<int> widths;
    for (auto* dock : sides) widths << std::max(dock->minimumSizeHint().width(), dock->width() + spare_width * dock->width() / std::max(1, total));
    if (!sides.isEmpty()) resizeDocks(sides, widths, Qt::Horizontal);
  }
  const int spare_height = view_->height() - height() / 2 - 4;
  if (spare_height < 0)
    for (auto* dock : docked(*this, Qt::BottomDockWidgetArea))
      resizeDocks({dock}, {std::max(dock->minimumSizeHint().height(), dock->height() + spare_height)}, Qt::Vertical);
}

MainWindow::~MainWindow() {
  // The undo stack clears itself as the document goes, after this window's members: nothing of
  // this window may hear it.
  document_.undo_stack()->disconnect(this);
  // The scene reads the document: gone before it.
  attach_.detach();
  delete view_;
  // QGraphicsScene's own destructor removes the items, which changes the selection after the
  // PipelineScene part is gone: this window's handler must not hear it (it would call into the
  // destroyed part; clang's UndefinedBehaviorSanitizer saw it).
  scene_->disconnect(this);
  delete scene_;
}

QAction* MainWindow::action(const QString& name) const { return actions_.value(name); }

QString MainWindow::status_text() const { return statusBar()->currentMessage(); }

void MainWindow::show_status(const QString& text, int ms) {
  // Every message goes after a while: what lasts (the run's state) is the label on the right.
  if (text.isEmpty()) statusBar()->clearMessage();
  else statusBar()->showMessage(text, ms > 0 ? ms : kStatusMessageMs);
}

QAction* MainWindow::add_action(const QString& name, const QString& text, const QKeySequence& key, std::function<void()> slot) {
  auto* a = new QAction(text, this);
  a->setShortcut(key);
  connect(a, &QAction::triggered, this, [slot = std::move(slot)] { slot(); });
  actions_.insert(name, a);
  return a;
}

void MainWindow::build_actions() {
  build_file_menu();
  build_edit_menu();
  build_view_menu();
  build_run_menu();
  build_help_menu();
  build_toolbar();
}

void MainWindow::build_file_menu() {
  auto* file = menuBar()->addMenu("&File");
  file->addAction(add_action("new", "&New", QKeySequence::New, [this] {
    if (!confirm_discard()) return;
    attach_.detach();
    workers_->attach({});
    clear_live();
    clear_verdict();
    set_run_state("No run");
    show_status({});  // the old pipeline's messages go with it
    shown_run_.reset();
    document_.reset({}, {});
    view_->fit();  // the old pipeline's zoom goes with it
  }));
  file->addAction(add_action("open", "&Open…", QKeySequence::Open, [this] {
    if (!confirm_discard()) return;
    const QString f = QFileDialog::getOpenFileName(this, "Open pipeline", dialog_folder(), "Pipelines (*.txtpb *.pbtxt *.json);;All files (*)");
    if (!f.isEmpty()) open_file(f);
  }));
  recent_menu_ = file->addMenu("Open &Recent");
  rebuild_recent_menu();
  file->addAction(add_action("open_metrics_log", "Open &metrics log…", QKeySequence(), [this] {
    const QString f = QFileDialog::getOpenFileName(this, "Open a metrics log (sluice run --metrics-log)", dialog_folder(),
                                                   "Metrics logs (*.jsonl);;All files (*)");
    if (!f.isEmpty()) open_metrics_log(f);
  }));
  file->addAction(add_action("compare_metrics_log", "Compare with metrics lo&g…", QKeySequence(), [this] {
    const QString f = QFileDialog::getOpenFileName(this, "Compare the run shown with a metrics log", dialog_folder(),
                                                   "Metrics logs (*.jsonl *.json);;All files (*)");
    if (!f.isEmpty()) compare_with_metrics_log(f);
  }));
  file->addAction(add_action("save", "&Save", QKeySequence::Save, [this] {
    if (document_.file().isEmpty() || document_.read_only()) return action("save_as")->trigger();
    save_to(document_.file());
  }));
  file->addAction(add_action("save_as", "Save &As…", QKeySequence("Ctrl+Shift+S"), [this] {
    QString f = QFileDialog::getSaveFileName(this, "Save pipeline",
                                             document_.read_only() || document_.file().isEmpty() ? dialog_folder() : document_.file(),
                                             "Pipelines (*.txtpb)");
    if (f.isEmpty()) return;
    if (QFileInfo(f).suffix().isEmpty()) f += ".txtpb";  // what Open and the CLI look for
    save_to(f);
  }));
  file->addSeparator();
  file->addAction(add_action("quit", "&Quit", QKeySequence::Quit, [this] { close(); }));
}

void MainWindow::build_edit_menu() {
  auto* edit = menuBar()->addMenu("&Edit");
  // Through the document, which refuses to undo a graph edit while a run of the graph goes.
  auto* undo = new QAction("&Undo", this);
  undo->setShortcut(QKeySequence::Undo);
  undo->setEnabled(false);
  connect(undo, &QAction::triggered, &document_, &Document::undo);
  connect(document_.undo_stack(), &QUndoStack::canUndoChanged, undo, &QAction::setEnabled);
  connect(document_.undo_stack(), &QUndoStack::undoTextChanged, undo, [undo](const QString& text) {
    undo->setText(text.isEmpty() ? "&Undo" : "&Undo " + text);
  });
  auto* redo = new QAction("&Redo", this);
  redo->setEnabled(false);
  connect(redo, &QAction::triggered, &document_, &Document::redo);
  connect(document_.undo_stack(), &QUndoStack::canRedoChanged, redo, &QAction::setEnabled);
  connect(document_.undo_stack(), &QUndoStack::redoTextChanged, redo, [redo](const QString& text) {
    redo->setText(text.isEmpty() ? "&Redo" : "&Redo " + text);
  });
  // Both common bindings, whatever the platform's theme says.
  QList<QKeySequence> redo_keys = QKeySequence::keyBindings(QKeySequence::Redo);
  for (const char* key : {"Ctrl+Shift+Z", "Ctrl+Y"})
    if (!redo_keys.contains(QKeySequence(key))) redo_keys.push_back(QKeySequence(key));
  redo->setShortcuts(redo_keys);
  actions_.insert("undo", undo);
  actions_.insert("redo", redo);
  edit->addAction(undo);
  edit->addAction(redo);
  edit->addSeparator();
  edit->addAction(add_action("copy", "&Copy", QKeySequence::Copy, [this] { copy_selection(); }));
  edit->addAction(add_action("paste", "&Paste", QKeySequence::Paste, [this] { paste(); }));
  edit->addAction(add_action("duplicate", "D&uplicate", QKeySequence("Ctrl+D"), [this] {
    const QStringList ids = scene_->selected_stage_ids();
    if (!ids.isEmpty()) paste_stages(document_.extract_stages(ids));
  }));
  edit->addAction(add_action("delete", "&Delete", QKeySequence::Delete, [this] { delete_selection(); }));
  edit->addAction(add_action("connect_selected", "Co&nnect selected stages", QKeySequence("Ctrl+K"), [this] { connect_selection(); }));
  edit->addAction(add_action("arrange", "Arrange &left to right", QKeySequence("Ctrl+L"), [this] {
    document_.arrange();
    view_->fit();
  }));
  edit->addSeparator();
  edit->addAction(add_action("find_operator", "&Find operator", QKeySequence::Find, [this] {
    for (auto* dock : findChildren<QDockWidget*>())
      if (dock->objectName() == "palette") dock->show();
    palette_->search()->setFocus(Qt::ShortcutFocusReason);
    palette_->search()->selectAll();
  }));
}

void MainWindow::build_view_menu() {
  auto* view = menuBar()->addMenu("&View");
  view->addAction(add_action("zoom_in", "Zoom &in", QKeySequence::ZoomIn, [this] { view_->zoom_by(1.2); }));
  view->addAction(add_action("zoom_out", "Zoom &out", QKeySequence::ZoomOut, [this] { view_->zoom_by(1 / 1.2); }));
  view->addAction(add_action("fit", "&Fit", QKeySequence("Ctrl+0"), [this] { view_->fit(); }));
  view->addSeparator();
  // Each panel can be closed; these bring it back.
  for (auto* dock : findChildren<QDockWidget*>()) {
    QAction* toggle = dock->toggleViewAction();
    actions_.insert("panel_" + dock->objectName(), toggle);
    view->addAction(toggle);
  }
}

void MainWindow::build_run_menu() {
  auto* run = menuBar()->addMenu("&Run");
  run->addAction(add_action("run", "&Run", QKeySequence("F5"), [this] { start_run(); }));
  run->addAction(add_action("stop", "&Stop", QKeySequence("Shift+F5"), [this] { stop_run(); }));
  run->addSeparator();
  run->addAction(add_action("attach", "&Attach to a run…", QKeySequence("Ctrl+Shift+A"), [this] {
    // The addresses attached to before, latest first, to pick again or edit.
    QStringList recent = QSettings("Sluice", "Sluice Studio").value("recent_attach").toStringList();
    if (recent.isEmpty()) recent << "127.0.0.1:9464";
    bool ok = false;
    const QString address = QInputDialog::getItem(
        this, "Attach", "Metrics address of a headless run (sluice run --metrics-addr), or of each worker, comma-separated:",
        recent, 0, true, &ok);
    if (ok && !address.trimmed().isEmpty()) attach_to(address.trimmed());
  }));
  run->addAction(add_action("attach_service", "Attach to a &service…", QKeySequence(), [this] {
    QStringList recent = QSettings("Sluice", "Sluice Studio").value("recent_attach_service").toStringList();
    if (recent.isEmpty()) recent << "127.0.0.1:9465";
    bool ok = false;
    const QString address = QInputDialog::getItem(
        this, "Attach to a service", "Metrics address of the service's dispatcher (sluice dispatcher --metrics-addr):", recent, 0, true, &ok);
    if (ok && !address.trimmed().isEmpty()) attach_to_service(address.trimmed());
  }));
  run->addAction(add_action("detach", "&Detach", QKeySequence(), [this] {
    attach_.detach();
    workers_->detach();
  }));
  action("stop")->setEnabled(false);
  action("detach")->setEnabled(false);
}

void MainWindow::build_help_menu() {
  auto* help = menuBar()->addMenu("&Help");
  help->addAction(add_action("shortcuts", "&Keyboard shortcuts", QKeySequence::HelpContents, [this] {
    QString text = "<table>";
    for (const char* name : {"new", "open", "save", "save_as", "undo", "redo", "copy", "paste", "duplicate", "delete", "connect_selected",
                             "find_operator", "arrange", "zoom_in", "zoom_out", "fit", "run", "stop", "attach"}) {
      QAction* a = action(name);
      if (!a || a->shortcut().isEmpty()) continue;
      text += QString("<tr><td>%1&nbsp;&nbsp;</td><td>%2</td></tr>")
                  .arg(a->shortcut().toString(QKeySequence::NativeText).toHtmlEscaped(), a->text().remove('&').remove(QChar(0x2026)));
    }
    text += "</table><p>On the canvas: drag from an output port to an input port to connect; Delete removes the "
            "selection; the wheel zooms; a drag on empty space pans; a right click on a stage, a connection or the empty "
            "canvas offers what can be done there (insert an operator on a connection, rename, disconnect). The arrow keys go from "
            "stage to stage (Right: a stage it feeds; Left: its input; Up, Down: the stage above or below), Shift+arrow adds the "
            "stage reached to the selection, and Ctrl+K connects the first stage selected to the second. In the operator list: "
            "type to search, Enter adds the highlighted operator after the selected stage.</p>";
    auto* box = new QMessageBox(QMessageBox::Information, "Keyboard shortcuts", text, QMessageBox::Ok, this);
    box->setObjectName("shortcuts");
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
  }));
  help->addAction(add_action("about", "&About Sluice Studio", QKeySequence(), [this] {
    QMessageBox::about(this, "About Sluice Studio",
                       QString("<b>Sluice Studio</b><br>Builds input pipelines visually and shows each stage live.<br>"
                               "Plugin ABI %1.%2; %3 operators loaded.")
                           .arg(kAbiMajor)
                           .arg(kAbiMinor)
                           .arg(document_.registry().operators().size()));
  }));
}

// The buttons: each one's tooltip says what it does and its shortcut.
void MainWindow::build_toolbar() {
  auto* bar = addToolBar("Main");
  bar->setObjectName("main_toolbar");
  for (const char* name : {"new", "open", "save"}) bar->addAction(action(name));
  bar->addSeparator();
  bar->addAction(action("undo"));
  bar->addAction(action("redo"));
  bar->addAction(action("arrange"));
  bar->addSeparator();
  bar->addAction(action("run"));
  bar->addAction(action("stop"));
  bar->addAction(action("attach"));
  // Undo's text names the step ("Undo Set work parallelism"): the button keeps one word, so the
  // buttons after it do not move; every button's tooltip says what it does and its shortcut.
  action("undo")->setIconText("Undo");
  action("redo")->setIconText("Redo");
  for (QAction* a : bar->actions()) {
    auto describe = [a] {
      QString text = a->text().remove('&');
      if (text.endsWith(QString::fromUtf8("\u2026"))) text.chop(1);
      const QString key = a->shortcut().toString(QKeySequence::NativeText);
      const QString tip = key.isEmpty() ? text : QString("%1 (%2)").arg(text, key);
      if (a->toolTip() != tip) a->setToolTip(tip);
    };
    describe();
    connect(a, &QAction::changed, a, describe);
  }
}

namespace {
// Validation speaks the file's language ("add `input: \"parse\"`"); on the canvas a connection is
// made by dragging between ports.
QString in_canvas_terms(QString message) {
  static const QRegularExpression add_sink(R"(add a sink \(([^)]*)\) with `input: "[^"]*"`)");
  static const QRegularExpression add_input(R"(add `input: "[^"]*"`)");
  message.replace(add_sink, "connect its output port to a sink (\\1)");
  message.replace(add_input, "connect a stage's output port to its input port");
  return message;
}
}  // namespace

void MainWindow::refresh_problems() {
  problems_->clear();
  for (const auto& p : document_.problems()) {
    QString where;
    if (!p.stage.empty()) where = QString("stage '%1'").arg(QString::fromStdString(p.stage));
    if (!p.param.empty()) where += QString(", parameter '%1'").arg(QString::fromStdString(p.param));
    auto* item = new QListWidgetItem((where.isEmpty() ? QString() : where + ": ") + in_canvas_terms(QString::fromStdString(p.message)));
    item->setData(Qt::UserRole, QString::fromStdString(p.stage));
    item->setForeground(QColor(170, 20, 20));
    problems_->addItem(item);
  }
  bottom_tabs_->setTabText(1, document_.problems().empty() ? "Problems" : QString("Problems (%1)").arg(document_.problems().size()));
}

void MainWindow::refresh_title() {
  QString name = document_.file().isEmpty() ? "untitled" : QFileInfo(document_.file()).fileName();
  if (document_.read_only()) name = (document_.file().endsWith("(metrics log)") ? "" : "attached: ") + document_.file();
  setWindowTitle(QString("%1[*] — Sluice Studio").arg(name));
  setWindowModified(document_.modified());
}

bool MainWindow::confirm_discard() {
  if (!document_.modified() || document_.read_only()) return true;
  switch (ask_to_save()) {
    case QMessageBox::Save:
      action("save")->trigger();
      return !document_.modified();
    case QMessageBox::Discard: return true;
    default: return false;
  }
}

bool MainWindow::open_file(const QString& file) {
  try {
    attach_.detach();
    workers_->attach({});
    document_.open(file);
    show_status({});  // the last pipeline's messages go with it
    shown_run_.reset();  // another pipeline's runs are not compared with this one's
    clear_live();
    clear_verdict();
    set_run_state("No run");
    remember_recent(document_.file());
    // Once the window has its size (it may not be shown yet).
    QMetaObject::invokeMethod(view_, [view = view_] { view->fit(); }, Qt::QueuedConnection);
    show_status(QString("Opened %1").arg(file), 5000);
    return true;
  } catch (const Error& e) {
    last_open_error_ = QString::fromUtf8(e.what());
    log_->note(QString::fromUtf8(e.what()));
    show_status(QString("Cannot open %1: %2").arg(file, QString::fromUtf8(e.what())));
    // Window-modal, not a nested event loop: a run being watched keeps updating behind it.
    auto* box = new QMessageBox(QMessageBox::Warning, "Cannot open", QString::fromUtf8(e.what()), QMessageBox::Ok, this);
    box->setObjectName("open_error");
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
    return false;
  }
}

bool MainWindow::save_to(const QString& file) {
  try {
    document_.save(file);
    remember_recent(document_.file());
    show_status(QString("Saved %1").arg(file), 5000);
    return true;
  } catch (const Error& e) {
    show_status(QString("Cannot save %1: %2").arg(file, QString::fromUtf8(e.what())));
    return false;
  }
}

// A most-recent-first list of ten in the app's settings: recent files, recent attach addresses.
void remember_in(const QString& key, const QString& value) {
  QSettings settings("Sluice", "Sluice Studio");
  QStringList recent = settings.value(key).toStringList();
  recent.removeAll(value);
  recent.prepend(value);
  while (recent.size() > 10) recent.removeLast();
  settings.setValue(key, recent);
}

void MainWindow::remember_recent(const QString& file) {
  remember_in("recent", file);
  rebuild_recent_menu();
}

void MainWindow::rebuild_recent_menu() {
  recent_menu_->clear();
  const QStringList recent = QSettings("Sluice", "Sluice Studio").value("recent").toStringList();
  for (const QString& f : recent)
    recent_menu_->addAction(f, this, [this, f] {
      if (confirm_discard()) open_file(f);
    });
  recent_menu_->setEnabled(!recent.isEmpty());
}

std::unique_ptr<QMenu> MainWindow::context_menu_at(QPoint view_pos) {
  const QPointF at = view_->mapToScene(view_pos);
  NodeItem* node = nullptr;
  EdgeItem* edge = nullptr;
  for (QGraphicsItem* item : scene_->items(at)) {
    if ((node = dynamic_cast<NodeItem*>(item))) break;
    if (!edge) edge = dynamic_cast<EdgeItem*>(item);
  }
  auto menu = std::make_unique<QMenu>(this);
  const bool editable = !document_.read_only();
  auto entry = [&](const QString& text, auto&& run, bool enabled = true) {
    QAction* a = menu->addAction(text);
    a->setEnabled(enabled);
    connect(a, &QAction::triggered, this, run);
    return a;
  };
  if (node) {
    const QString id = node->id();
    menu->setObjectName("context_stage");
    if (!node->isSelected()) scene_->select_stage(id);
    // After a stage that feeds one other, the new one goes in between (after one read by several,
    // it becomes one more reader).
    QString consumer;
    int readers = 0;
    for (const auto& st : document_.spec().stage())
      for (const auto& in : st.input())
        if (in == id.toStdString()) {
          ++readers;
          consumer = QString::fromStdString(st.id());
        }
    if (readers != 1) consumer.clear();
    entry("Add operator after…", [this, id, consumer] {
      action("find_operator")->trigger();
      if (!consumer.isEmpty()) insert_between_ = std::make_pair(id, consumer);
    }, editable);
    entry("Rename…", [this, id] {
      for (auto* dock : findChildren<QDockWidget*>())
        if (dock->objectName() == "inspector") dock->show();
      scene_->select_stage(id);
      inspector_->show_stage(id);
      // The form is rebuilt from the event loop: focus its id field once it is there.
      QTimer::singleShot(0, this, [this] {
        if (auto* field = inspector_->findChild<QLineEdit*>("stage:id")) {
          field->setFocus(Qt::OtherFocusReason);
          field->selectAll();
        }
      });
    }, editable);
    const int index = document_.index_of(id);
    const bool has_input = index >= 0 && document_.spec().stage(index).input_size() > 0;
    entry("Disconnect input", [this, id] {
      document_.edit(QString("Disconnect %1").arg(id), [&](spec::PipelineSpec& s) {
        for (auto& st : *s.mutable_stage())
          if (st.id() == id.toStdString()) st.clear_input();
      });
    }, editable && has_input);
    menu->addSeparator();
    menu->addAction(action("delete"));
  } else if (edge) {
    menu->setObjectName("context_connection");
    const QString from = edge->from()->id(), to = edge->to()->id();
    entry("Insert operator here…", [this, from, to] {
      scene_->clearSelection();
      insert_between_ = std::make_pair(from, to);
      action("find_operator")->trigger();
      show_status(QString("Choose an operator (Enter or double-click) to go between '%1' and '%2'").arg(from, to), 8000);
    }, editable);
    entry("Delete connection", [this, edge] {
      scene_->clearSelection();
      edge->setSelected(true);
      delete_selection();
    }, editable);
  } else {
    menu->setObjectName("context_canvas");
    menu->addAction(action("find_operator"));
    menu->addAction(action("arrange"));
    menu->addAction(action("fit"));
    entry("Select all", [this] {
      for (QGraphicsItem* item : scene_->items())
        if (item->flags() & QGraphicsItem::ItemIsSelectable) item->setSelected(true);
    });
  }
  return menu;
}

// Where a stage inserted on the connection from -> to goes: in line, one step right of `from`.
// Where a node stands there, every stage from there rightwards moves right as far as needed first
// (within the caller's undo step): nothing is covered and the pipeline still reads left to right.
QPointF MainWindow::make_room_after(const QString& from) {
  const double step = NodeItem::kWidth + 70;
  const QPointF place = scene_->node(from)->pos() + QPointF(step, 0);
  const QRectF wanted(place, QSizeF(NodeItem::kWidth, NodeItem::kHeight));
  double shift = 0;
  for (const auto& st : document_.spec().stage())
    if (NodeItem* n = scene_->node(QString::fromStdString(st.id())); n && n->sceneBoundingRect().intersects(wanted))
      shift = std::max(shift, place.x() + step - n->pos().x());
  if (shift > 0) {
    const double edge = place.x() - NodeItem::kWidth;
    document_.edit("Make room", [&](spec::PipelineSpec& s) {
      for (auto& st : *s.mutable_stage())
        if (st.layout().x() > edge && st.id() != from.toStdString()) st.mutable_layout()->set_x(st.layout().x() + shift);
    });
  }
  return place;
}

void MainWindow::add_from_palette(const QString& op) {
  if (document_.read_only()) return;
  if (insert_between_) {
    // Named copies, not structured bindings: a lambda below uses `to`, and capturing a binding is
    // something clang before 16 refuses (the sanitizer trees build with clang).
    const QString from = insert_between_->first, to = insert_between_->second;
    insert_between_.reset();
    if (document_.index_of(from) >= 0 && document_.index_of(to) >= 0) {
      const auto* consumer = &document_.spec().stage(document_.index_of(to));
      const auto inputs = consumer->input();
      const auto at = std::find(inputs.begin(), inputs.end(), from.toStdString());
      if (at != inputs.end()) {
        const int slot = static_cast<int>(at - inputs.begin());  // a combine's other inputs stay
        if (document_.refuse_if_graph_locked()) return;
        document_.undo_stack()->beginMacro(QString("Insert %1").arg(op));
        const QString id = document_.add_stage(op, make_room_after(from));
        document_.edit(QString("Connect %1 to %2").arg(id, to), [&](spec::PipelineSpec& s) {
          for (auto& st : *s.mutable_stage())
            if (st.id() == to.toStdString() && slot < st.input_size()) st.set_input(slot, id.toStdString());
        });
        document_.connect_stages(from, id);
        document_.undo_stack()->endMacro();
        scene_->select_stage(id);
        return;
      }
    }
  }
  // Added after the selected stage when it can take the new one's input there, and placed beside
  // it (below any node already there); with nothing selected, in view, staggered so that several
  // added in a row do not cover each other.
  const QStringList selected = scene_->selected_stage_ids();
  QPointF at;
  if (selected.size() == 1 && scene_->node(selected.front())) {
    at = scene_->node(selected.front())->pos() + QPointF(NodeItem::kWidth + 70, 0);
    auto taken = [&](QPointF p) {
      const QRectF wanted(p, QSizeF(NodeItem::kWidth, NodeItem::kHeight));
      for (const auto& st : document_.spec().stage())
        if (auto* n = scene_->node(QString::fromStdString(st.id())); n && n->sceneBoundingRect().intersects(wanted)) return true;
      return false;
    };
    for (int tries = 0; tries < 20 && taken(at); ++tries) at += QPointF(0, NodeItem::kHeight + 30);
  } else {
    const QPointF centre = view_->mapToScene(view_->viewport()->rect().center());
    at = centre + QPointF(-NodeItem::kWidth / 2 + 24 * (added_ % 6), -NodeItem::kHeight / 2 + 24 * (added_ % 6));
    ++added_;
  }
  if (document_.refuse_if_graph_locked()) return;
  document_.undo_stack()->beginMacro(QString("Add %1").arg(op));
  const QString id = document_.add_stage(op, at);
  if (selected.size() == 1 && !document_.connection_refusal(selected.front(), id)) document_.connect_stages(selected.front(), id);
  document_.undo_stack()->endMacro();
  scene_->select_stage(id, true);
}

// The selected stages (and the connections among them) as pipeline-file text: pasted here, into
// another window, or into a pipeline file in an editor.
void MainWindow::copy_selection() {
  const QStringList ids = scene_->selected_stage_ids();
  if (ids.isEmpty()) return show_status("Nothing to copy: select stages first");
  QGuiApplication::clipboard()->setText(QString::fromStdString(pipeline_to_text(document_.extract_stages(ids))));
  show_status(QString("Copied %1 stage%2").arg(ids.size()).arg(ids.size() == 1 ? "" : "s"));
}

void MainWindow::paste() {
  const QString text = QGuiApplication::clipboard()->text();
  try {
    paste_stages(parse_pipeline(text.toStdString(), "the clipboard").spec);
  } catch (const std::exception& e) {
    show_status(QString("Nothing to paste: the clipboard holds no pipeline stages (%1)").arg(QString::fromUtf8(e.what()).section('\n', 0, 0)), 10000);
  }
}

// Added beside where they were, renamed where their ids are taken, and selected.
void MainWindow::paste_stages(const spec::PipelineSpec& stages) {
  if (stages.stage_size() == 0) return show_status("Nothing to paste: the clipboard holds no stage");
  const QStringList added = document_.paste_stages(stages, QPointF(40, 40));
  if (added.isEmpty()) return;
  scene_->clearSelection();
  for (const QString& id : added)
    if (NodeItem* node = scene_->node(id)) node->setSelected(true);
  show_status(QString("Added %1").arg(added.join(", ")));
}

void MainWindow::delete_selection() {
  const QStringList stages = scene_->selected_stage_ids();
  // A connection is one input of its consumer: a combine keeps its other inputs, in order.
  QMap<QString, QList<int>> edges;
  for (const auto& [to, input] : scene_->selected_edges()) edges[to].push_back(input);
  if (stages.isEmpty() && edges.isEmpty()) return;
  // Refused before the undo step opens: a refused edit leaves no empty step to undo.
  if (document_.refuse_if_graph_locked()) return;
  document_.undo_stack()->beginMacro("Delete");
  for (auto it = edges.begin(); it != edges.end(); ++it) {
    const QString to = it.key();
    QList<int> inputs = it.value();
    std::sort(inputs.begin(), inputs.end(), std::greater<int>());
    if (!stages.contains(to))
      document_.edit(QString("Disconnect %1").arg(to), [&](spec::PipelineSpec& s) {
        for (auto& st : *s.mutable_stage())
          if (st.id() == to.toStdString())
            for (int input : inputs)
              if (input < st.input_size()) st.mutable_input()->DeleteSubrange(input, 1);
      });
  }
  document_.remove_stages(stages);
  document_.undo_stack()->endMacro();
}

void MainWindow::connect_selection() {
  const QStringList order = scene_->selection_order();
  if (order.size() != 2) {
    show_status("To connect from the keyboard, select two stages (arrow keys, Shift+arrow to add one): the first selected feeds the second");
    return;
  }
  auto refusal = document_.output_refusal(order[0]);
  if (!refusal) refusal = document_.connection_refusal(order[0], order[1]);
  if (refusal) return show_status(QString("Not connected: %1").arg(*refusal), 8000);
  document_.connect_stages(order[0], order[1]);
  show_status(QString("Connected '%1' to '%2'; Ctrl+Z undoes it").arg(order[0], order[1]));
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (!confirm_discard()) return event->ignore();
  if (runner_.running()) {
    runner_.stop();
  }
  QSettings settings("Sluice", "Sluice Studio");
  settings.setValue("window/geometry", saveGeometry());
  settings.setValue("window/docks", saveState());
  if (screen()) settings.setValue("window/screen", screen()->availableGeometry().size());
  event->accept();
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_main_window.cpp"
