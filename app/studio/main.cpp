// sluice-studio: the desktop app. `sluice-studio [PIPELINE]` opens a pipeline file;
// `--attach HOST:PORT` follows a headless run; `--attach-service HOST:PORT` a Sluice service (its
// dispatcher's metrics address: the Workers panel); `--screenshot FILE --run-seconds N` runs the
// pipeline for N seconds (stopping it then if it still runs), saves the window as a PNG once the
// run has ended (its averages and verdict shown) and exits; with --attach instead of a pipeline,
// it saves the window after following the runs for N seconds. scripts/screenshots.sh makes the
// pictures of docs/studio.md so.
// `--list-palette` prints the palette's operators and exits (a plugin author's check, offscreen).
#include <QApplication>
#include <QCommandLineParser>
#include <QSaveFile>
#include <QTabWidget>
#include <QTimer>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "main_window.hpp"

namespace {

const QCommandLineOption plugin_dir("plugin-dir", "also load plugins from DIR", "DIR");
const QCommandLineOption attach("attach", "follow a headless run's metrics endpoint, or each worker's (comma-separated)", "HOST:PORT");
const QCommandLineOption attach_service("attach-service", "follow a Sluice service: its dispatcher's metrics endpoint (--metrics-addr)",
                                        "HOST:PORT");
const QCommandLineOption screenshot("screenshot",
                                    "run the pipeline (or follow --attach), then save the window with the run's verdict as PNG to FILE, exit",
                                    "FILE");
const QCommandLineOption run_seconds("run-seconds", "with --screenshot: how long to run first (default 4)", "N", "4");
const QCommandLineOption tab("tab", "with --screenshot: the bottom tab to show (Monitor, Problems, Log, Verdict; default: the verdict)",
                             "NAME");
const QCommandLineOption list_palette("list-palette",
                                      "print the palette's operators as the window shows them (plugin / kind / operator) and exit");

void set_up(QCommandLineParser& cli) {
  cli.setApplicationDescription("Build input pipelines visually and watch every stage live.");
  cli.addHelpOption();
  cli.addPositionalArgument("file", "pipeline file to open (.txtpb, .json), or a metrics log of a run (.jsonl, from sluice run --metrics-log)");
  cli.addOptions({plugin_dir, attach, attach_service, screenshot, run_seconds, tab, list_palette});
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    for (const char* help : {"-h", "--help", "-?", "--help-all"})
      if (std::strcmp(argv[i], help) == 0) return true;
  return false;
}

// Qt aborts (exit 134) when the window system it would use is not there: say so instead.
bool has_a_display() {
  for (const char* variable : {"QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"})
    if (const char* value = std::getenv(variable); value && *value) return true;
  return false;
}

// Saves the window as a PNG once it shows what it should (the bottom tab asked for), then exits.
void save_window_and_exit(sluice::studio::MainWindow& window, const QCommandLineParser& cli) {
  // Once the window has drawn the ended run.
  QTimer::singleShot(300, &window, [&window, &cli] {
    if (cli.isSet(tab)) {
      auto* tabs = window.findChild<QTabWidget*>("bottom_tabs");
      for (int i = 0; tabs && i < tabs->count(); ++i)
        if (tabs->tabText(i).startsWith(cli.value(tab), Qt::CaseInsensitive)) tabs->setCurrentIndex(i);
    }
    const QString target = cli.value(screenshot);
    QSaveFile out(target);  // written whole or not at all
    const bool ok = out.open(QIODevice::WriteOnly) && window.grab().save(&out, "PNG") && out.commit();
    if (!ok) std::fprintf(stderr, "cannot write %s: %s\n", qPrintable(target), qPrintable(out.errorString()));
    else std::fprintf(stderr, "wrote %s (%s)\n", qPrintable(target), qPrintable(window.run_state()));
    QApplication::exit(ok ? 0 : 1);
  });
}

// --screenshot: runs the open pipeline (or follows the attached runs) for --run-seconds, stops
// a run of its own that still goes, and saves the window once its end is shown.
bool take_screenshot_when_done(sluice::studio::MainWindow& window, const QCommandLineParser& cli, bool run_here) {
  if (run_here && !window.start_run()) {
    std::fprintf(stderr, "cannot run %s: %s\n", qPrintable(cli.positionalArguments().value(0)), qPrintable(window.status_text()));
    return false;
  }
  QTimer::singleShot(cli.value(run_seconds).toDouble() * 1000, &window, [&window, &cli, run_here] {
    // A run that already ended (shorter than --run-seconds) sends no second `finished`.
    if (!run_here || !window.runner().running()) return save_window_and_exit(window, cli);
    QObject::connect(&window.runner(), &sluice::studio::RunController::finished, &window, [&window, &cli] { save_window_and_exit(window, cli); });
    window.stop_run();
  });
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (asks_for_help(argc, argv)) {
    // The help needs no window system: a terminal without a display gets it too.
    QCoreApplication text_only(argc, argv);
    QCoreApplication::setApplicationName("Sluice Studio");
    QCommandLineParser cli;
    set_up(cli);
    cli.process(text_only);  // prints the help and exits
  }
  if (!has_a_display()) {
    std::fprintf(stderr, "sluice-studio needs a display: set DISPLAY (X11) or WAYLAND_DISPLAY; without one, "
                         "QT_QPA_PLATFORM=offscreen runs --screenshot and --list-palette\n");
    return 2;
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName("Sluice Studio");
  QApplication::setOrganizationName("Sluice");
  QCommandLineParser cli;
  set_up(cli);
  cli.process(app);

  sluice::Registry registry;
  std::vector<std::filesystem::path> extra;
  for (const QString& d : cli.values(plugin_dir)) extra.emplace_back(d.toStdString());
  registry.load_search_path(extra);
  for (const auto& warning : registry.warnings()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  for (const auto& refused : registry.refused())
    std::fprintf(stderr, "plugin %s not loaded: %s\n", refused.path.c_str(), refused.reason.c_str());

  sluice::studio::MainWindow window(registry);
  const QStringList args = cli.positionalArguments();
  const bool follows = cli.isSet(attach) || cli.isSet(attach_service);
  if (cli.isSet(screenshot) && args.isEmpty() && !follows) {
    std::fprintf(stderr, "--screenshot needs a pipeline file to run, or --attach (or --attach-service) HOST:PORT to follow\n");
    return 2;
  }
  if (cli.isSet(list_palette)) {
    // What a user could drag onto the canvas: every entry of the window's own palette (a plugin
    // built elsewhere shows up here, or does not, as it would on screen).
    std::function<void(const QTreeWidgetItem*, const QString&)> print = [&](const QTreeWidgetItem* item, const QString& path) {
      const QString here = path.isEmpty() ? item->text(0) : path + " / " + item->text(0);
      if (!item->data(0, sluice::studio::OperatorTree::kOperatorRole).toString().isEmpty()) std::printf("%s\n", qPrintable(here));
      for (int i = 0; i < item->childCount(); ++i) print(item->child(i), here);
    };
    const auto* tree = window.palette().tree();
    for (int i = 0; i < tree->topLevelItemCount(); ++i) print(tree->topLevelItem(i), {});
    return 0;
  }
  // The window first: a file that cannot be opened is explained in it (and on stderr), and the
  // app stays open on an empty pipeline, as it would after File > Open of the same file.
  window.show();
  const bool metrics_log = !args.isEmpty() && args.front().endsWith(".jsonl");
  if (!args.isEmpty() && !(metrics_log ? window.open_metrics_log(args.front()) : window.open_file(args.front()))) {
    std::fprintf(stderr, "cannot open %s%s: %s\n", qPrintable(args.front()), metrics_log ? " as a metrics log" : "",
                 qPrintable(window.last_open_error()));
    if (cli.isSet(screenshot)) return 1;
  }
  if (cli.isSet(attach)) window.attach_to(cli.value(attach));
  if (cli.isSet(attach_service)) window.attach_to_service(cli.value(attach_service));

  if (cli.isSet(screenshot) && !take_screenshot_when_done(window, cli, !follows && !metrics_log)) return 1;
  return app.exec();
}
