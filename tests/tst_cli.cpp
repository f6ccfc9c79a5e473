// The `sluice` command as a user runs it: exit codes, messages, reports, Ctrl-C.
#include <QDirIterator>
#include <QtTest>

#include <csignal>
#include <map>
#include <memory>

#include "pipeline_runner.hpp"

using namespace sluice::test;

namespace {
struct Result {
  int code = -1;
  QString out, err;
};

Result sluice_cli(const QStringList& args, int timeout_ms = 60000, const QString& working_dir = {},
                  const QProcessEnvironment& env = QProcessEnvironment::systemEnvironment()) {
  QProcess p;
  if (!working_dir.isEmpty()) p.setWorkingDirectory(working_dir);
  p.setProcessEnvironment(env);
  p.start(SLUICE_CLI, args);
  p.waitForFinished(timeout_ms);
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

QString write(const QTemporaryDir& dir, const QString& name, const std::string& text) {
  QString path = dir.filePath(name);
  QFile f(path);
  f.open(QIODevice::WriteOnly);
  f.write(text.data(), static_cast<qint64>(text.size()));
  return path;
}
}  // namespace

class TestCli : public QObject {
  Q_OBJECT
 private slots:
  // A process restricted to one CPU (taskset, as a Slurm binding does) gets a CPU budget of one
  // core by default; --explain-autotune prints each decision as it is made.
  void autotune_budget_follows_the_affinity_and_decisions_are_explained() {
    if (QStandardPaths::findExecutable("taskset").isEmpty()) QSKIP("taskset (util-linux) is not installed");
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", "options { fuse_stages: false }\n" + stage("src", "range", "", {{"count", "3000"}}) +
                                          stage("work", "simulate_work", "src", {{"us", "300"}}, "parallelism: -1") +
                                          stage("out", "null_sink", "work"));
    QProcess p;
    p.start("taskset", {"-c", "0", SLUICE_CLI, "run", "--quiet", "--explain-autotune", file});
    QVERIFY(p.waitForFinished(60000));
    const QString out = QString::fromUtf8(p.readAllStandardOutput()), err = QString::fromUtf8(p.readAllStandardError());
    QCOMPARE(p.exitCode(), 0);
    QVERIFY2(out.contains("Autotune: budget 1 cores (1 CPU in this process's affinity)"), qPrintable(out));
    QVERIFY2(out.contains("work: kept 1 worker"), qPrintable(out));  // one core: nothing to add
    // With two cores of budget the stage gets a second worker, and the decision is explained.
    auto two = sluice_cli({"run", "--quiet", "--explain-autotune", "--set", "work.parallelism=autotune", write(dir, "q.txtpb",
                           "options { fuse_stages: false autotune { cpu_budget: 2 } }\n" + stage("src", "range", "", {{"count", "6000"}}) +
                               stage("work", "simulate_work", "src", {{"us", "300"}}) + stage("out", "null_sink", "work"))});
    QCOMPARE(two.code, 0);
    QVERIFY2(two.err.contains(QRegularExpression("\\d:\\d\\d\\.\\d autotune: 'work' workers 1 -> 2: busy \\d+% of the time on its 1 worker; the "
                                                 "pipeline could run [\\d.]+x as fast before (the CPU budget of 2 cores|stage 'work' at its most 2 workers) "
                                                 "holds it back, "
                                                 "and at that speed this stage needs [\\d.]+ cores\n")),
             qPrintable(two.err));
    // The table marks the worker count the tuner chose, and says so under it.
    QVERIFY2(two.out.contains(QRegularExpression("\nwork +simulate_work +[12]\\* ")) && !two.out.contains(QRegularExpression("\nsrc +range +1\\*")) &&
                 two.out.contains("* workers chosen by the autotuner (parallelism AUTOTUNE): see Autotune below\n"),
             qPrintable(two.out));
    // The summary says where the stage ended and why: with two workers, or (on a machine busy
    // with other work, where the second worker made the run slower) back at one, saying so.
    QVERIFY2(two.out.contains("work: 1 worker -> 2 workers at") ||
                 two.out.contains(QRegularExpression("work: 1 worker -> 1 worker in \\d+ changes, the last at \\d:\\d\\d\\.\\d \\(2 -> 1\\) "
                                                     "because the pipeline ran slower with 2 workers")),
             qPrintable(two.out));
  }

  // `sluice index`: the index files random_access reads, written once and then left alone.
  void index_writes_index_files_and_leaves_fresh_ones() {
    QTemporaryDir dir;
    const QString shard = dir.filePath("pets.record");
    QVERIFY(QFile::copy(QString::fromStdString(sluice::test::testdata_dir()) + "/tfrecord/pets_examples.record", shard));
    auto first = sluice_cli({"index", shard});
    QVERIFY2(first.code == 0, qPrintable(first.err));
    QVERIFY2(first.out.contains(shard + ": ") && first.out.contains("index built " + shard + ".idx"), qPrintable(first.out));
    QVERIFY2(first.out.contains("1 files, ") && first.out.contains("1 index written, 0 up to date"), qPrintable(first.out));
    QVERIFY2(!first.out.contains("Bottleneck"), qPrintable(first.out));  // what was done, not the stages' report
    auto again = sluice_cli({"index", shard});
    QVERIFY2(again.out.contains("0 indexes written, 1 up to date"), qPrintable(again.out));
    auto quiet = sluice_cli({"index", "--quiet", "--rebuild", shard});
    QVERIFY2(quiet.code == 0 && quiet.out.isEmpty() && quiet.err.isEmpty(), qPrintable(quiet.out + quiet.err));
    auto dali = sluice_cli({"index", "--quiet", "--format", "dali", "--index-dir", dir.filePath("idx"), shard});
    QVERIFY2(dali.code == 0, qPrintable(dali.err));
    QDir idx(dir.filePath("idx"));
    const auto files = idx.entryList({"pets.record-*.idx"}, QDir::Files);
    QCOMPARE(files.size(), 1);
    QFile text(idx.filePath(files.first()));
    QVERIFY(text.open(QIODevice::ReadOnly));
    QVERIFY(QString::fromUtf8(text.readLine()).startsWith("0 "));  // DALI's "OFFSET SIZE" lines
    auto missing = sluice_cli({"index", "--quiet", dir.filePath("nothing.record")});
    QVERIFY(missing.code != 0);
    QVERIFY2(missing.err.contains("nothing.record"), qPrintable(missing.err));
  }

  // The workers of a job given one --checkpoint folder each write their own file there and resume
  // from it; a job of another size is refused, naming what the folder holds.
  void the_workers_of_a_job_share_a_checkpoint_folder() {
    QTemporaryDir dir;
    const QString ck = dir.filePath("ck");
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "100000"}}) +
                                          stage("slow", "simulate_work", "src", {{"us", "2000"}}, "buffer_size: 1") +
                                          stage("out", "jsonl_sink", "slow", {{"path", dir.filePath("out-{worker}.jsonl").toStdString()}}));
    std::vector<std::unique_ptr<QProcess>> workers;
    for (int w = 0; w < 2; ++w) {
      workers.push_back(std::make_unique<QProcess>());
      workers.back()->start(SLUICE_CLI, {"run", "-q", file, "--checkpoint", ck, "--worker-index", QString::number(w), "--num-workers", "2"});
      QVERIFY(workers.back()->waitForStarted());
    }
    QTest::qWait(1500);
    for (auto& p : workers) {
      p->terminate();  // SIGTERM: a checkpoint, then exit 75
      QVERIFY(p->waitForFinished(60000));
      QVERIFY2(p->exitCode() == 75, p->readAllStandardError().constData());
    }
    QCOMPARE(QDir(ck).entryList(QDir::Files), (QStringList{"worker-0-of-2.sluice", "worker-1-of-2.sluice"}));
    // A range's order cannot be split among another number of workers (random_access's can: below).
    auto other_size = sluice_cli({"run", "-q", file, "--resume", ck, "--worker-index", "0", "--num-workers", "3"});
    QCOMPARE(other_size.code, 2);
    QVERIFY2(other_size.err.contains("a checkpoint of 2 workers cannot continue on another number of workers: stage 'src' (range)") &&
                 other_size.err.contains("resume it on 2 workers"),
             qPrintable(other_size.err));
    QFile::copy(ck + "/worker-1-of-2.sluice", dir.filePath("kept.sluice"));
    QFile::remove(ck + "/worker-1-of-2.sluice");
    auto incomplete = sluice_cli({"run", "-q", file, "--resume", ck, "--worker-index", "0", "--num-workers", "3"});
    QCOMPARE(incomplete.code, 2);
    QVERIFY2(incomplete.err.contains("holds the checkpoint of 2 workers without worker 1's (worker-1-of-2.sluice)"), qPrintable(incomplete.err));
    QFile::rename(dir.filePath("kept.sluice"), ck + "/worker-1-of-2.sluice");
    auto as_a_file = sluice_cli({"run", "-q", file, "--checkpoint", ck + "/mine.sluice", "--worker-index", "0", "--num-workers", "2"});
    QCOMPARE(as_a_file.code, 2);
    QVERIFY2(as_a_file.err.contains("give a folder"), qPrintable(as_a_file.err));
    QProcess resumed;
    resumed.start(SLUICE_CLI, {"run", "-q", file, "--resume", ck, "--checkpoint", ck, "--worker-index", "1", "--num-workers", "2"});
    QVERIFY(resumed.waitForStarted());
    QTest::qWait(500);
    resumed.terminate();
    QVERIFY(resumed.waitForFinished(60000));
    const QString said = QString::fromUtf8(resumed.readAllStandardError());
    QVERIFY2(resumed.exitCode() == 75, qPrintable(said));
    QVERIFY2(said.contains("resumed from checkpoint"), qPrintable(said));  // its own file: worker 1's
  }

  // A job checkpointed by 2 workers (SIGTERM) and resumed by 3 from the same folder: a global
  // shuffle's epoch is split anew, every record delivered once in all.
  void a_job_of_two_workers_resumes_on_three() {
    QTemporaryDir dir;
    for (const char* name : {"pets_examples.record", "tfx_mnist.tfrecord", "torchdata_example.tfrecord"})
      QVERIFY(QFile::copy(QString::fromStdString(sluice::test::testdata_dir()) + "/tfrecord/" + name, dir.filePath(name)));
    const QString ck = dir.filePath("ck");
    auto file = write(dir, "p.txtpb", stage("src", "random_access", "", {{"patterns", dir.filePath("*.*record").toStdString()}}, "buffer_size: 2") +
                                          stage("pick", "select_fields", "src", {{"keep", "path,index"}}, "buffer_size: 2") +
                                          stage("slow", "simulate_work", "pick", {{"us", "3000"}}, "buffer_size: 2") +
                                          stage("mix", "shuffle", "slow", {{"buffer_size", "16"}}, "buffer_size: 2") +
                                          stage("out", "jsonl_sink", "mix", {{"path", dir.filePath("out-{worker}-of-{num_workers}.jsonl").toStdString()}}));
    auto job = [&](int workers, const QStringList& extra) {
      std::vector<std::unique_ptr<QProcess>> started;
      for (int w = 0; w < workers; ++w) {
        started.push_back(std::make_unique<QProcess>());
        started.back()->start(SLUICE_CLI, QStringList{"run", "-q", file, "--checkpoint", ck, "--worker-index", QString::number(w), "--num-workers",
                                                      QString::number(workers)} + extra);
      }
      return started;
    };
    auto two = job(2, {"--checkpoint-every", "50"});
    // SIGTERM once each has written a checkpoint: mid-epoch (each worker's share takes 1.5 s).
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(ck + "/worker-0-of-2.sluice") && QFile::exists(ck + "/worker-1-of-2.sluice"), 30000);
    // Both told at once: one worker's cut (slow under sanitizers) must not let the other run on to
    // the end of its share meanwhile.
    for (auto& p : two) p->terminate();
    for (auto& p : two) {
      QVERIFY(p->waitForFinished(60000));
      QVERIFY2(p->exitCode() == 75, p->readAllStandardError().constData());
      // The report says where the source stood in its share of the epoch (507 records each).
      const QString report = QString::fromUtf8(p->readAllStandardOutput());
      QVERIFY2(report.contains("Position of stage 'src' (random_access): epoch 0, ") && report.contains(" of 507 elements read"), qPrintable(report));
    }
    // The folder described worker by worker.
    auto info = sluice_cli({"checkpoint", "info", ck});
    QVERIFY2(info.code == 0 && info.out.contains("worker-0-of-2.sluice: worker 0 of 2") && info.out.contains("worker-1-of-2.sluice: worker 1 of 2") &&
                 info.out.contains("of 507 records"),
             qPrintable(info.out + info.err));
    auto three = job(3, {"--resume", ck});
    QString said;
    for (auto& p : three) {
      QVERIFY(p->waitForFinished(60000));
      said += QString::fromUtf8(p->readAllStandardError());
      QVERIFY2(p->exitCode() == 0, qPrintable(said));
    }
    QVERIFY2(said.contains("resumed the checkpoint of 2 workers in " + ck + " as worker 2 of 3"), qPrintable(said));
    QStringList records;
    for (const QString& out : QDir(dir.path()).entryList({"out-*.jsonl"}, QDir::Files)) {
      QFile f(dir.filePath(out));
      QVERIFY(f.open(QIODevice::ReadOnly));
      for (const QByteArray& line : f.readAll().split('\n'))
        if (!line.isEmpty()) records << QString::fromUtf8(line);
    }
    QCOMPARE(QDir(dir.path()).entryList({"out-*.jsonl"}, QDir::Files).size(), 5);  // 2 cut, 3 resumed
    QVERIFY2(records.size() == 1014, qPrintable(QString::number(records.size())));  // 10 + 1000 + 4
    records.removeDuplicates();
    QCOMPARE(records.size(), 1014);
  }

  void run_prints_report_and_writes_output() {
    QTemporaryDir dir;
    auto out_path = dir.filePath("o.jsonl").toStdString();
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "100"}}) + stage("out", "jsonl_sink", "src", {{"path", out_path}}));
    auto r = sluice_cli({"run", file, "--set", "src.count=7"});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("elements/s") && r.out.contains("busy%") && r.out.contains("starved%") && r.out.contains("blocked%"));
    QVERIFY(r.out.contains("fill%") && r.out.contains("skipped") && r.out.contains("Bottleneck: stage"));
    QCOMPARE(QString::fromStdString(read_file(out_path)).count('\n'), 7);
  }

  // One of several workers: the identity from the launcher's variables or the options, said on
  // the progress line and in the report; what each worker runs shown by validate; bad variables
  // named, exit 2.
  void runs_as_one_of_several_workers() {
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "10"}}) +
                                          stage("out", "jsonl_sink", "src", {{"path", dir.filePath("out-{worker}.jsonl").toStdString()}}));
    auto env = QProcessEnvironment::systemEnvironment();
    env.insert("SLURM_PROCID", "1");
    env.insert("SLURM_NTASKS", "3");
    env.insert("SLURM_STEP_ID", "0");  // a task of srun, not the batch script
    auto r = sluice_cli({"run", file, "--progress-every", "0.05"}, 60000, {}, env);
    QCOMPARE(r.code, 0);
    QVERIFY2(r.out.contains("Worker 1 of 3 (Slurm: SLURM_PROCID=1, SLURM_NTASKS=3)"), qPrintable(r.out));
    QVERIFY2(r.err.contains("note: sharded by record"), qPrintable(r.err));
    QCOMPARE(QString::fromStdString(read_file(dir.filePath("out-1.jsonl").toStdString())),
             QString("{\"value\":1}\n{\"value\":4}\n{\"value\":7}\n"));
    // The command line decides over the environment.
    r = sluice_cli({"validate", file, "--worker-index", "0", "--num-workers", "2"}, 60000, {}, env);
    QCOMPARE(r.code, 0);
    QVERIFY2(r.err.contains("worker 0 of 2 (--worker-index/--num-workers)") && r.err.contains("'shard_workers' (shard) added after 'src'"),
             qPrintable(r.err));
    env.insert("SLURM_PROCID", "one");
    r = sluice_cli({"run", file}, 60000, {}, env);
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("SLURM_PROCID='one' is not a worker index"), qPrintable(r.err));
    // Every worker writing one file: refused before anything runs, with the fix.
    env.insert("SLURM_PROCID", "0");
    auto shared = write(dir, "shared.txtpb", stage("src", "range", "", {{"count", "10"}}) +
                                                 stage("out", "jsonl_sink", "src", {{"path", dir.filePath("all.jsonl").toStdString()}}));
    r = sluice_cli({"run", shared}, 60000, {}, env);
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("stage 'out': parameter 'path': all 3 workers would write"), qPrintable(r.err));
    QVERIFY(!QFile::exists(dir.filePath("all.jsonl")));
  }

  // The same pipeline file does the same from any directory: its relative paths are its folder's.
  // A --set path is the command line's, relative to where the command runs.
  void a_pipeline_files_relative_paths_are_relative_to_its_folder() {
    QTemporaryDir dir;
    QDir().mkpath(dir.filePath("job/data"));
    QDir().mkpath(dir.filePath("elsewhere"));
    write(dir, "job/data/a.txt", "alpha");
    write(dir, "job/data/b.txt", "beta");
    const QString file = write(dir, "job/p.txtpb",
                               stage("files", "list_files", "", {{"patterns", "data/*.txt"}}) + stage("read", "read_file", "files") +
                                   stage("out", "jsonl_sink", "read", {{"path", "out.jsonl"}}));
    auto r = sluice_cli({"run", file, "--quiet"}, 60000, dir.filePath("elsewhere"));
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QString written = QString::fromStdString(read_file(dir.filePath("job/out.jsonl").toStdString()));
    QCOMPARE(written.count('\n'), 2);
    QVERIFY(!QFile::exists(dir.filePath("elsewhere/out.jsonl")));
    auto set = sluice_cli({"run", file, "--quiet", "--set", "out.path=mine.jsonl"}, 60000, dir.filePath("elsewhere"));
    QVERIFY2(set.code == 0, qPrintable(set.err));
    QVERIFY(QFile::exists(dir.filePath("elsewhere/mine.jsonl")));
  }

  void progress_lines_metrics_log_and_report_again() {
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "400"}}) + stage("w", "simulate_work", "src", {{"us", "3000"}}) +
                                          stage("b", "batch", "w", {{"batch_size", "10"}}) + stage("out", "null_sink", "b"));
    const QString log = dir.filePath("run.jsonl");
    auto r = sluice_cli({"run", file, "--progress-every", "0.25", "--metrics-log", log});
    QCOMPARE(r.code, 0);
    // Not a terminal: plain lines, each with elements, batches, rate, epoch and the sources' progress.
    static const QRegularExpression progress(R"(^0:0\d running \| \S+ elements, \S+ batches \| \S+ elements/s \| epoch 0 \| \d+%)",
                                             QRegularExpression::MultilineOption);
    QVERIFY2(r.err.count(progress) >= 3, qPrintable(r.err));
    QVERIFY(!QFile::exists(log + ".partial"));
    auto again = sluice_cli({"report", log});
    QCOMPARE(again.code, 0);
    QCOMPARE(again.out, r.out);  // the same report, from the log's last snapshot
    QVERIFY(again.out.contains("Bottleneck: stage 'w'"));
    QVERIFY(again.out.contains("raise `parallelism` of stage 'w'"));

    auto quiet = sluice_cli({"run", file, "--quiet", "--progress-every", "0.25"});
    QCOMPARE(quiet.code, 0);
    QVERIFY2(!quiet.err.contains("elements/s"), qPrintable(quiet.err));

    auto missing = sluice_cli({"report", dir.filePath("none.jsonl")});
    QCOMPARE(missing.code, 2);
    QVERIFY(missing.err.contains("cannot open the metrics log"));
    auto bad = write(dir, "bad.jsonl", "{\"sequence\":\"1\"}\nnot json\n");
    auto garbled = sluice_cli({"report", bad});
    QCOMPARE(garbled.code, 2);
    QVERIFY2(garbled.err.contains("bad.jsonl:2: not a metrics snapshot"), qPrintable(garbled.err));
  }

  void progress_is_redrawn_in_place_on_a_terminal() {
    if (QStandardPaths::findExecutable("script").isEmpty()) QSKIP("util-linux's script (a pseudo-terminal) is not installed");
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "300"}}) + stage("w", "simulate_work", "src", {{"us", "3000"}}) +
                                          stage("out", "null_sink", "w"));
    // script runs the command on a pseudo-terminal: stderr is a terminal there.
    const QString command = QString("%1 run %2 --progress-every 0.2").arg(SLUICE_CLI, file);
    auto r = [&] {
      QProcess p;
      p.start("script", {"-qfec", command, "/dev/null"});
      p.waitForFinished(60000);
      return QString::fromUtf8(p.readAllStandardOutput());
    }();
    static const QRegularExpression redraw("\r0:0\\d running \\| ");  // a carriage return, then the line again
    QVERIFY2(r.count(redraw) >= 3, qPrintable(r));
    QVERIFY(r.contains("Run finished"));
  }

  void metrics_endpoint_serves_during_a_run() {
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "300"}}) + stage("w", "simulate_work", "src", {{"us", "5000"}}) +
                                          stage("out", "null_sink", "w"));
    QProcess p;
    p.start(SLUICE_CLI, {"run", file, "--quiet", "--metrics-addr", "127.0.0.1:0"});
    QVERIFY(p.waitForStarted());
    QString err;
    for (int i = 0; i < 100 && !err.contains("\n"); ++i) {
      p.waitForReadyRead(100);
      err += QString::fromUtf8(p.readAllStandardError());
    }
    static const QRegularExpression url(R"(metrics: http://127\.0\.0\.1:(\d+) \(/metrics, /snapshot, /stream, /pipeline\))");
    auto match = url.match(err);
    QVERIFY2(match.hasMatch(), qPrintable(err));
    QVERIFY(p.waitForFinished(30000));
    QCOMPARE(p.exitCode(), 0);
    auto nonsense = sluice_cli({"run", file, "--metrics-addr", "nonsense"});
    QCOMPARE(nonsense.code, 2);
    QVERIFY2(nonsense.err.contains("metrics address 'nonsense' is not PORT, :PORT or HOST:PORT"), qPrintable(nonsense.err));
  }

  void bench_and_ablation_table() {
    QTemporaryDir dir;
    // A CPU-heavy stage with autotuned workers, an interleaved reader of ten "files", a cache, a prefetch.
    auto file = write(dir, "p.txtpb",
                      "options { seed: 3 }\n" + stage("src", "range", "", {{"count", "10"}}) +
                          stage("rep", "repeat", "src", {{"count", "-1"}}) +
                          stage("rows", "unbatch", "wide", {}, "interleave { cycle_length: 2 } parallelism: 2") +
                          stage("wide", "batch", "rep", {{"batch_size", "1"}}) + stage("keep", "cache", "rows") +
                          stage("work", "simulate_work", "keep", {{"us", "2000"}}, "parallelism: -1") +
                          stage("ahead", "prefetch", "work") + stage("out", "null_sink", "ahead"));
    auto plain = sluice_cli({"bench", file, "--seconds", "1", "--warmup", "0.5"});
    QCOMPARE(plain.code, 0);
    QVERIFY2(plain.out.contains("Steady state over") && plain.out.contains("Pipeline: ") && plain.out.contains("Bottleneck: stage 'work'"),
             qPrintable(plain.out));
    auto table = sluice_cli({"bench", file, "--ablate", "--seconds", "1", "--warmup", "0.5"});
    QCOMPARE(table.code, 0);
    const auto lines = table.out.split('\n');
    QVERIFY2(lines.value(0).startsWith("variant") && lines.value(0).contains("speed-up"), qPrintable(table.out));
    QStringList variants;
    for (const auto& line : lines.mid(1))
      if (!line.isEmpty() && !line.startsWith("speed-up")) variants << line.section(' ', 0, 1, QString::SectionSkipEmpty);
    QCOMPARE(variants, (QStringList{"as written", "parallelism 1", "no interleave", "no cache", "no prefetch"}));
    // Each variant says what it changed, with a measured rate and speed-up. (Whether two workers
    // beat one is a timing, which a test on a shared machine cannot promise: ctest runs suites
    // side by side. The benchmarks of bench/ show speed against a baseline of the same run.)
    static const QRegularExpression parallelism(R"(^parallelism 1\s+[\d.]+\s+[\d.]+x\s+parallelism 1 on rows \(2\), work \(AUTOTUNE\)$)",
                                                QRegularExpression::MultilineOption);
    QVERIFY2(parallelism.match(table.out).hasMatch(), qPrintable(table.out));
    QVERIFY2(table.out.contains(QRegularExpression(R"(no cache\s+[\d.]+\s+[\d.]+x\s+1 cache stage removed)")), qPrintable(table.out));
  }

  void validate_reports_every_problem_and_exits_2() {
    QTemporaryDir dir;
    auto file = write(dir, "bad.txtpb", stage("src", "rnage", "") + stage("b", "batch", "src"));
    auto r = sluice_cli({"validate", file});
    QCOMPARE(r.code, 2);
    QVERIFY(r.err.contains("bad.txtpb:1:1: stage 'src': unknown operator 'rnage' (did you mean 'range'?)"));
    QVERIFY(r.err.contains("stage 'b': parameter 'batch_size': is required"));
    auto good = write(dir, "good.txtpb", stage("src", "range", "") + stage("o", "null_sink", "src"));
    auto ok = sluice_cli({"validate", good});
    QCOMPARE(ok.code, 0);
    QVERIFY(ok.out.contains("valid, 2 stages"));
    auto missing = sluice_cli({"run", dir.filePath("nope.txtpb")});
    QCOMPARE(missing.code, 2);
    QVERIFY(missing.err.contains("nope.txtpb: cannot open the pipeline file"));
  }

  void run_failure_exits_1_with_the_reason() {
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "") + stage("f", "fail_when", "src") + stage("o", "null_sink", "f"));
    auto r = sluice_cli({"run", file, "--plugin-dir", QString(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"});
    QCOMPARE(r.code, 1);
    QVERIFY(r.err.contains("stage 'f' (fail_when) failed on element 0"));
  }

  void plugins_lists_describes_and_explains_refusals() {
    auto list = sluice_cli({"plugins"});
    QCOMPARE(list.code, 0);
    QVERIFY(list.out.contains("shuffle") && list.out.contains("aggregate"));
    auto one = sluice_cli({"plugins", "shuffle"});
    QVERIFY(one.out.contains("buffer_size") && one.out.contains("int, required, range [1, 1000000000]"));
    auto typo = sluice_cli({"plugins", "shufle"});
    QCOMPARE(typo.code, 2);
    QVERIFY(typo.err.contains("did you mean 'shuffle'?"));
    auto verbose = sluice_cli({"plugins", "--verbose", "--plugin-dir", QString(SLUICE_FIXTURE_PLUGIN_DIR) + "/broken"});
    QCOMPARE(verbose.code, 0);
    QVERIFY(verbose.out.contains("libfixture_abi_major.so") && verbose.out.contains("major versions differ"));
    auto json = sluice_cli({"plugins", "--json"});
    auto doc = QJsonDocument::fromJson(json.out.toUtf8());
    QVERIFY(doc.isObject());
    auto ops = doc.object()["operators"].toArray();
    QVERIFY(ops.size() >= 16);
    bool found = false;
    for (const auto& op : ops)
      if (op.toObject()["name"] == "batch") {
        found = true;
        QCOMPARE(op.toObject()["params"].toArray()[0].toObject()["name"].toString(), QString("batch_size"));
      }
    QVERIFY(found);
  }

  // A plugin the build left out (as the Parquet plugin is without Arrow C++) leaves a note in its
  // folder: `sluice plugins` prints it, and a pipeline or a look-up naming its operators gets it
  // instead of "unknown operator". (A made-up plugin: this build has the Parquet plugin.)
  void plugins_left_out_of_the_build_say_how_to_get_them() {
    QTemporaryDir dir;
    const QString folder = dir.filePath("plugins");
    QDir().mkpath(folder);
    write(dir, "plugins/feather.left-out",
          "feather_reader, feather_writer: left out of this build, which found no Feather library. Run scripts/install-deps.sh, then build again.\n");
    auto list = sluice_cli({"plugins", "--plugin-dir", folder});
    QCOMPARE(list.code, 0);
    QVERIFY2(list.out.contains("Left out of this build (" + folder + "/feather.left-out):\n  feather_reader, feather_writer: left out"),
             qPrintable(list.out));
    auto one = sluice_cli({"plugins", "feather_writer", "--plugin-dir", folder});
    QCOMPARE(one.code, 2);
    QVERIFY2(one.err.contains("operator 'feather_writer' is not in this build: feather_reader, feather_writer: left out of this build, "
                              "which found no Feather library. Run scripts/install-deps.sh"),
             qPrintable(one.err));
    QVERIFY(sluice_cli({"plugins", "feather", "--plugin-dir", folder}).err.contains("no operator 'feather'"));  // a name the note does not list
    auto file = write(dir, "p.txtpb", stage("files", "list_files", "", {{"patterns", "x.feather"}}) + stage("read", "feather_reader", "files") +
                                         stage("o", "null_sink", "read"));
    auto refused = sluice_cli({"validate", file, "--plugin-dir", folder});
    QCOMPARE(refused.code, 2);
    QVERIFY2(refused.err.contains("stage 'read': operator 'feather_reader' is not in this build: feather_reader, feather_writer: left out"),
             qPrintable(refused.err));
    // (A build without Arrow C++, as the sanitizer builds are, has its own note beside this one.)
    auto json = QJsonDocument::fromJson(sluice_cli({"plugins", "--json", "--plugin-dir", folder}).out.toUtf8());
    QStringList notes;
    for (const auto& note : json.object()["left_out"].toArray()) notes << note.toObject()["path"].toString();
    QVERIFY2(notes.contains(folder + "/feather.left-out"), qPrintable(notes.join(", ")));
  }

  void ctrl_c_stops_within_a_second_with_a_partial_report() {
    QTemporaryDir dir;
    auto file = write(dir, "endless.txtpb",
                      stage("src", "range", "", {{"count", "100"}}) + stage("rep", "repeat", "src") +
                          stage("w", "simulate_work", "rep", {{"us", "50"}}) + stage("out", "null_sink", "w"));
    QProcess p;
    p.start(SLUICE_CLI, {"run", file, "--progress-every", "0.1"});
    QVERIFY(p.waitForStarted());
    // Interrupt once the run is under way (its first progress line): on a cold, loaded machine
    // probing the plugins alone can take longer than any fixed wait.
    QString progress;
    for (int i = 0; i < 300 && !progress.contains("running"); ++i) {
      p.waitForReadyRead(100);
      progress += QString::fromUtf8(p.readAllStandardError());
    }
    QVERIFY2(progress.contains("running"), qPrintable(progress));
    QTest::qWait(200);
    QElapsedTimer timer;
    timer.start();
    ::kill(static_cast<pid_t>(p.processId()), SIGINT);
    QVERIFY(p.waitForFinished(5000));
    QVERIFY2(timer.elapsed() < 1000, qPrintable(QString("took %1 ms").arg(timer.elapsed())));
    QCOMPARE(p.exitCode(), 130);
    auto out = QString::fromUtf8(p.readAllStandardOutput());
    QVERIFY(out.contains("Run stopped") && out.contains("simulate_work"));
  }

  // A preempted job, as Slurm does it (SIGTERM, a grace period, requeue) or `timeout -s TERM`:
  // each run writes a checkpoint when told to stop, exits 75, and the next one resumes; the pieces
  // together are exactly the uninterrupted run's output.
  void preempted_runs_resume_exactly_with_exit_75() {
    if (QStandardPaths::findExecutable("timeout").isEmpty()) QSKIP("coreutils' timeout is not installed");
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", "options { seed: 9 }\n" + stage("src", "range", "", {{"count", "60000"}}) +
                                          stage("work", "simulate_work", "src", {{"us", "60"}}, "parallelism: 2") +
                                          stage("mix", "shuffle", "work", {{"buffer_size", "500"}}) +
                                          stage("b", "batch", "mix", {{"batch_size", "8"}}, "buffer_size: 2") + sink_after("b"));
    auto whole = sluice_cli({"run", "--quiet", file, "--set", "out.path=" + dir.filePath("whole.jsonl")});
    QCOMPARE(whole.code, 0);
    const QString ck = dir.filePath("ck");
    QStringList pieces;
    int stops = 0;
    // Each run gets a second past its start (a slow build, under sanitizers, takes a while to
    // start; a signal before its handlers are set ends it with 143 and it has written nothing).
    double limit = 0.6;
    // Three runs preempted, then one left to finish.
    for (int part = 0; part < 20; ++part) {
      const QString out = dir.filePath(QString("part%1.jsonl").arg(part));
      // Slurm's preemption sends SIGTERM; `sbatch --signal` before a time limit, SIGUSR1: both.
      const QString signal = part % 2 == 0 ? "TERM" : "USR1";
      QStringList args{"--preserve-status", "-s", signal, stops < 3 ? QString::number(limit) : QString("120"), SLUICE_CLI, "run", "--quiet",
                       file, "--checkpoint", ck, "--set", "out.path=" + out};
      if (QFile::exists(ck + "/checkpoint.sluice")) args << "--resume" << ck;
      QProcess p;
      p.start("timeout", args);
      QVERIFY(p.waitForFinished(60000));
      const QString err = QString::fromUtf8(p.readAllStandardError());
      if (p.exitCode() == 128 + (signal == "TERM" ? SIGTERM : SIGUSR1) && err.isEmpty()) {  // signalled before it could start
        QVERIFY2(!QFile::exists(out), "a run killed before it started left an output");
        limit *= 1.5;
        continue;
      }
      pieces << out;
      if (p.exitCode() == 0) break;
      QCOMPARE(p.exitCode(), 75);
      QVERIFY2(err.contains("checkpoint " + QString::number(stops + 1) + " written to " + ck) &&
                   err.contains("continue with: sluice run " + file + " --resume " + ck),
               qPrintable(err));
      ++stops;
    }
    QVERIFY2(stops == 3, "the run was not preempted three times: make it longer");
    QByteArray joined;
    for (const auto& piece : pieces) {
      QFile f(piece);
      QVERIFY2(f.open(QIODevice::ReadOnly), qPrintable(piece));
      joined += f.readAll();
    }
    QFile w(dir.filePath("whole.jsonl"));
    QVERIFY(w.open(QIODevice::ReadOnly));
    QVERIFY2(joined == w.readAll(), "the resumed pieces differ from the uninterrupted run");
  }

  // The printed hint taken at its word: `sluice run P --resume ck/` with the same output paths, after
  // a node lost with kill -9 and after a SIGTERM, leaves exactly the uninterrupted run's files (a
  // JSON-lines file, TFRecord shards, a folder of files), none of what was written twice or lost.
  void resuming_with_the_same_paths_continues_the_outputs() {
    QTemporaryDir dir;
    const std::string pipeline = "options { seed: 4 }\n" +
        stage("img", "synthetic_images", "", {{"count", "400"}, {"height", "8"}, {"width", "8"}, {"classes", "4"}}, "buffer_size: 2") +
        stage("enc", "encode_image", "img", {}, "buffer_size: 2") + stage("work", "simulate_work", "enc", {{"us", "4000"}}, "buffer_size: 2") +
        stage("lines", "jsonl_sink", "work", {{"path", "OUT/out.jsonl"}}) +
        stage("shards", "tfrecord_writer", "work", {{"prefix", "OUT/shards/train"}, {"max_records", "45"}}) +
        stage("files", "write_files", "work", {{"folder", "OUT/files"}});
    auto in = [&](const QString& out) {
      std::string text = pipeline;
      for (std::size_t at; (at = text.find("OUT/")) != std::string::npos;) text.replace(at, 3, out.toStdString());
      QDir().mkpath(dir.filePath(out));
      return write(dir, out + ".txtpb", text);
    };
    QCOMPARE(sluice_cli({"run", "--quiet", in("whole")}).code, 0);
    const QString file = in("cut"), ck = dir.filePath("ck");
    auto start = [&](const QStringList& extra) {
      auto p = std::make_unique<QProcess>();
      p->start(SLUICE_CLI, QStringList{"run", "--quiet", file, "--checkpoint", ck} + extra);
      if (!p->waitForStarted()) qFatal("sluice did not start");
      return p;
    };
    // 1. Checkpoints every 40 batches; the node is lost (kill -9) after the first, past it.
    auto first = start({"--checkpoint-every", "40"});
    for (int waited = 0; waited < 60000 && !QFile::exists(ck + "/checkpoint.sluice"); waited += 10) QTest::qWait(10);
    QTest::qWait(150);
    ::kill(static_cast<pid_t>(first->processId()), SIGKILL);
    first->waitForFinished(10000);
    QVERIFY2(QFile::exists(ck + "/checkpoint.sluice"), "no checkpoint before the kill");
    QVERIFY2(!QFile::exists(dir.filePath("cut/out.jsonl")), "a killed run published its output");
    // 2. Resumed as the hint says, then preempted (SIGTERM: a checkpoint, exit 75) once it runs:
    // its lines file (under its temporary name) grows past what the killed run had left. (A fixed
    // 500 ms wait once caught a resume still starting on a loaded machine, which then stops
    // without a checkpoint, as it should.)
    auto lines_written = [&] {
      qint64 size = 0;
      for (const QFileInfo& f : QDir(dir.filePath("cut")).entryInfoList({"out.jsonl*"}, QDir::Files)) size = std::max(size, f.size());
      return size;
    };
    const qint64 left = lines_written();
    auto second = start({"--resume", ck});
    for (int waited = 0; waited < 30000 && lines_written() <= left; waited += 10) QTest::qWait(10);
    QTest::qWait(100);
    ::kill(static_cast<pid_t>(second->processId()), SIGTERM);
    QVERIFY(second->waitForFinished(60000));
    const QString said = QString::fromUtf8(second->readAllStandardError());
    QVERIFY2(second->exitCode() == 75 && said.contains("--resume " + ck), qPrintable(said));
    // 3. Resumed again, to the end.
    auto third = sluice_cli({"run", "--quiet", file, "--checkpoint", ck, "--resume", ck});
    QVERIFY2(third.code == 0, qPrintable(third.err));
    auto tree = [&](const QString& root) {
      std::map<QString, QByteArray> files;
      QDirIterator it(dir.filePath(root), QDir::Files, QDirIterator::Subdirectories);
      while (it.hasNext()) {
        const QString path = it.next();
        QFile f(path);
        if (f.open(QIODevice::ReadOnly)) files[QDir(dir.filePath(root)).relativeFilePath(path)] = f.readAll();
      }
      return files;
    };
    const auto expected = tree("whole");
    auto got = tree("cut");
    QCOMPARE(expected.size(), std::size_t(1 + 9 + 400));  // the lines, 9 shards, 400 files
    QCOMPARE(got.size(), expected.size());
    for (const auto& [name, bytes] : expected) QVERIFY2(got[name] == bytes, qPrintable("differs from the uninterrupted run's: " + name));
  }

  // A checkpoint is replaced atomically: a process killed at any moment (here while it writes one
  // every few batches) leaves the previous checkpoint whole, and a run resumes from it.
  void kill_9_leaves_the_previous_checkpoint_valid() {
    QTemporaryDir dir;
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "100000"}}) +
                                          stage("work", "simulate_work", "src", {{"us", "20"}}) +
                                          stage("mix", "shuffle", "work", {{"buffer_size", "2000"}}) + sink_after("mix"));
    const QString ck = dir.filePath("ck");
    int checked = 0;
    for (int attempt = 0; attempt < 8; ++attempt) {
      QFile::remove(ck + "/checkpoint.sluice");
      QProcess p;
      p.start(SLUICE_CLI, {"run", "--quiet", file, "--checkpoint", ck, "--checkpoint-every", "1", "--set", "out.path=" + dir.filePath("x.jsonl")});
      QVERIFY(p.waitForStarted());
      // Once checkpoints are being written (however slowly this build starts), at a different
      // moment each time.
      for (int waited = 0; waited < 30000 && !QFile::exists(ck + "/checkpoint.sluice"); waited += 10) QTest::qWait(10);
      QTest::qWait(13 * attempt);
      ::kill(static_cast<pid_t>(p.processId()), SIGKILL);
      p.waitForFinished(10000);
      if (!QFile::exists(ck + "/checkpoint.sluice")) continue;
      auto info = sluice_cli({"checkpoint", "info", ck});
      QCOMPARE(info.code, 0);
      QVERIFY2(info.out.contains("elements had reached the sinks") && info.out.contains("mix"), qPrintable(info.out));
      ++checked;
    }
    QVERIFY(checked >= 4);
    auto resumed = sluice_cli({"run", "--quiet", file, "--resume", ck, "--set", "out.path=" + dir.filePath("rest.jsonl")});
    QCOMPARE(resumed.code, 0);
    QVERIFY2(resumed.err.contains("resumed from checkpoint"), qPrintable(resumed.err));
  }

  void checkpoint_errors_are_clear() {
    QTemporaryDir dir;
    auto unsaved = write(dir, "u.txtpb", stage("n", "unsaved_counter", "", {{"count", "10"}}) + stage("out", "null_sink", "n"));
    auto refused = sluice_cli({"run", unsaved, "--checkpoint", dir.filePath("ck"), "--plugin-dir", QString(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"});
    QCOMPARE(refused.code, 2);
    QVERIFY2(refused.err.contains("cannot be checkpointed") && refused.err.contains("stage 'n' (unsaved_counter)"), qPrintable(refused.err));
    auto file = write(dir, "p.txtpb", stage("src", "range", "", {{"count", "10"}}) + stage("out", "null_sink", "src"));
    auto missing = sluice_cli({"run", file, "--resume", dir.filePath("nowhere")});
    QCOMPARE(missing.code, 2);
    QVERIFY2(missing.err.contains("no checkpoint at " + dir.filePath("nowhere/checkpoint.sluice")), qPrintable(missing.err));
    QDir(dir.path()).mkpath("bad");
    write(dir, "bad/checkpoint.sluice", "SLCKPT01 and then nonsense");
    auto damaged = sluice_cli({"checkpoint", "info", dir.filePath("bad")});
    QCOMPARE(damaged.code, 2);
    QVERIFY2(damaged.err.contains("is damaged"), qPrintable(damaged.err));
    auto every = sluice_cli({"run", file, "--checkpoint", dir.filePath("ck"), "--checkpoint-every", "soon"});
    QCOMPARE(every.code, 2);
    QVERIFY2(every.err.contains("--checkpoint-every soon: give a number of batches (500) or a time (30s, 5m, 1h)"), qPrintable(every.err));
    auto alone = sluice_cli({"run", file, "--checkpoint-every", "5"});
    QCOMPARE(alone.code, 2);
    QVERIFY2(alone.err.contains("--checkpoint-every needs --checkpoint DIR"), qPrintable(alone.err));
  }

  // `sluice` is built without the service (its gRPC costs 14 ms of every start); what needs the
  // service continues in libexec/sluice-service, in the same process: a launcher's pid and signals
  // reach the dispatcher. Without that command, or in a loop, the user is told what to do.
  void the_service_runs_in_the_command_built_with_it() {
    const QString with_service = QFileInfo(QString(SLUICE_CLI)).absolutePath() + "/../libexec/sluice-service";
    auto needed = [](const QString& binary) {
      QProcess readelf;
      readelf.start("readelf", {"-d", binary});
      readelf.waitForFinished(30000);
      return QString::fromUtf8(readelf.readAllStandardOutput());
    };
    QVERIFY(needed(with_service).contains("libgrpc++"));
    QVERIFY2(!needed(SLUICE_CLI).contains("grpc"), "the sluice command links no gRPC");
    auto described = sluice_cli({"plugins", "service_source"});
    QCOMPARE(described.code, 0);
    QVERIFY2(described.out.contains("processing_mode") && described.out.contains("DYNAMIC"), qPrintable(described.out));

    QProcess dispatcher;
    dispatcher.start(SLUICE_CLI, {"dispatcher", "--port", "0"});
    QVERIFY(dispatcher.waitForReadyRead(20000));
    QVERIFY(QString::fromUtf8(dispatcher.readLine()).contains("listening on"));
    QCOMPARE(QFileInfo(QString("/proc/%1/exe").arg(dispatcher.processId())).canonicalFilePath(), QFileInfo(with_service).canonicalFilePath());
    ::kill(static_cast<pid_t>(dispatcher.processId()), SIGTERM);
    QVERIFY(dispatcher.waitForFinished(20000));
    QCOMPARE(dispatcher.exitCode(), 0);

    QTemporaryDir dir;
    auto again = QProcessEnvironment::systemEnvironment();
    again.insert("SLUICE_HANDED_OVER", "1");
    auto looping = sluice_cli({"dispatcher", "--port", "0"}, 20000, {}, again);
    QCOMPARE(looping.code, 1);
    QVERIFY2(looping.err.contains("`sluice dispatcher` needs the Sluice service") && looping.err.contains("was not built with it"),
             qPrintable(looping.err));
    // A copy of the command alone, without its libexec/.
    QDir(dir.path()).mkpath("alone/bin");
    const QString alone = dir.filePath("alone/bin/sluice");
    QVERIFY(QFile::copy(SLUICE_CLI, alone));
    auto run_alone = [&](const QStringList& args) {
      QProcess p;
      p.start(alone, args);
      p.waitForFinished(20000);
      return Result{p.exitCode(), QString::fromUtf8(p.readAllStandardOutput()), QString::fromUtf8(p.readAllStandardError())};
    };
    const QString missing = dir.filePath("alone/libexec/sluice-service");
    auto no_dispatcher = run_alone({"service", "workers", "--dispatcher", "localhost:1"});
    QCOMPARE(no_dispatcher.code, 1);
    QVERIFY2(no_dispatcher.err.contains("`sluice service workers` needs the Sluice service, which runs in " + missing) &&
                 no_dispatcher.err.contains("No such file or directory") && no_dispatcher.err.contains("reinstall Sluice"),
             qPrintable(no_dispatcher.err));
    auto distributed = write(dir, "d.txtpb", stage("numbers", "range", "", {{"count", "3"}}) +
                                                 "stage { id: \"work\" op: \"identity\" input: \"numbers\" distribute { service: \"grpc://localhost:1\" } }\n" +
                                                 stage("out", "null_sink", "work"));
    auto split = run_alone({"run", distributed});
    QCOMPARE(split.code, 1);
    QVERIFY2(split.err.contains(distributed + "'s stage 'work' needs the Sluice service"), qPrintable(split.err));
    auto named = write(dir, "s.txtpb", stage("in", "service_source", "", {{"service", "grpc://localhost:1"}, {"job_name", "j"}, {"pipeline", ""}}) +
                                           stage("out", "null_sink", "in"));
    auto source = run_alone({"validate", named});
    QCOMPARE(source.code, 1);
    QVERIFY2(source.err.contains(named + "'s stage 'in' needs the Sluice service"), qPrintable(source.err));
  }
};

QTEST_MAIN(TestCli)
#include "tst_cli.moc"
