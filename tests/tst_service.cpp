// The service's processes as a cluster starts them (core/service/): a dispatcher, workers that
// register and are taken as lost when killed, a dispatcher restarted, and what is refused off
// loopback or without the token. Real processes on loopback.
#include <QtTest>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>

namespace {

// A process of the service, started now and stopped (SIGTERM, then SIGKILL) when it goes.
class Service {
 public:
  explicit Service(const QStringList& args) {
    process_.setProgram(SLUICE_CLI);
    process_.setArguments(args);
    process_.start();
  }
  ~Service() { stop(); }
  // The address the process printed ("... listening on HOST:PORT"), waiting up to 20 s.
  QString address() {
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < 20000) {
      output_ += QString::fromUtf8(process_.readAllStandardOutput());
      static const QRegularExpression listening("listening on (\\S+:\\d+)");
      if (auto m = listening.match(output_); m.hasMatch()) return m.captured(1);
      if (process_.state() == QProcess::NotRunning) break;
      process_.waitForReadyRead(100);
    }
    return {};
  }
  QString port() { return address().section(':', -1); }
  void kill() {
    process_.kill();
    process_.waitForFinished(10000);
  }
  int stop() {
    if (process_.state() == QProcess::NotRunning) return process_.exitCode();
    process_.terminate();
    if (!process_.waitForFinished(10000)) kill();
    return process_.exitStatus() == QProcess::NormalExit ? process_.exitCode() : -1;
  }
  // Everything it wrote on stderr so far.
  QString errors() {
    process_.waitForReadyRead(50);
    errors_ += QString::fromUtf8(process_.readAllStandardError());
    return errors_;
  }
  // Whether it says `text` on stderr within `ms`.
  bool says(const QString& text, int ms = 5000) {
    QElapsedTimer clock;
    clock.start();
    while (!errors().contains(text) && clock.elapsed() < ms) QThread::msleep(50);
    return errors_.contains(text);
  }
  QProcess& process() { return process_; }

 private:
  QProcess process_;
  QString output_, errors_;
};

struct Result {
  int code = -1;
  QString out, err;
};

Result sluice_cli(const QStringList& args) {
  QProcess p;
  p.start(SLUICE_CLI, args);
  p.waitForFinished(30000);
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1, QString::fromUtf8(p.readAllStandardOutput()),
          QString::fromUtf8(p.readAllStandardError())};
}

// `sluice service workers`' lines, waiting up to `ms` for `ready` to hold of them.
QStringList workers_until(const QString& dispatcher, const std::function<bool(const QStringList&)>& ready, int ms = 15000,
                          const QStringList& extra = {}) {
  QElapsedTimer clock;
  clock.start();
  QStringList lines;
  do {
    const auto r = sluice_cli(QStringList{"service", "workers", "--dispatcher", dispatcher} + extra);
    lines = r.out.split('\n', Qt::SkipEmptyParts);
    if (r.code == 0 && ready(lines)) return lines;
    QThread::msleep(200);
  } while (clock.elapsed() < ms);
  return lines;
}

// A pipeline file whose `work` stage and those before it run on the service at `address`: range
// `count` (`us` microseconds of CPU each on the workers), splits of `split` numbers, the trainer
// writing what it gets to `out`.
QString job_file(const QTemporaryDir& dir, const QString& name, const QString& address, int count, int us, int split, const QString& out,
                 const QString& job = "train") {
  const QString text = QString(
                           "options { seed: 5 }\n"
                           "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"%1\" } }\n"
                           "stage { id: \"work\" op: \"simulate_work\" input: \"numbers\" params { key: \"us\" value: \"%2\" }\n"
                           "        distribute { service: \"grpc://%3\" processing_mode: DYNAMIC job_name: \"%4\" split_size: %5 } }\n"
                           "stage { id: \"out\" op: \"jsonl_sink\" input: \"work\" params { key: \"path\" value: \"%6\" } }\n")
                           .arg(count)
                           .arg(us)
                           .arg(address, job)
                           .arg(split)
                           .arg(out);
  const QString path = dir.filePath(name);
  QFile f(path);
  f.open(QIODevice::WriteOnly);
  f.write(text.toUtf8());
  return path;
}

QString write_text(const QString& path, const QString& text) {
  QFile f(path);
  f.open(QIODevice::WriteOnly);
  f.write(text.toUtf8());
  return path;
}

// A pipeline file: `source` (stage lines), then stage `work` (`work_op` and its params text)
// given `distribute { ... }`, then the trainer writing what it gets to `out`.
QString service_file(const QString& path, const QString& source, const QString& work_op, const QString& distribute, const QString& out) {
  return write_text(path, QString("options { seed: 5 }\n%1\n"
                                  "stage { id: \"work\" op: %2 distribute { %3 } }\n"
                                  "stage { id: \"out\" op: \"jsonl_sink\" input: \"work\" params { key: \"path\" value: \"%4\" } }\n")
                              .arg(source, work_op, distribute, out));
}

// The numbers a trainer wrote, as they came: field `field`, a number or (bytes, which jsonl_sink
// writes in base64) the text of one.
std::vector<int> numbers_in(const QString& path, const QString& field = "value") {
  QFile f(path);
  std::vector<int> out;
  if (!f.open(QIODevice::ReadOnly)) return out;
  const QRegularExpression number("\"" + field + "\":(\\d+)"), bytes("\"" + field + "\":\"([A-Za-z0-9+/=]*)\"");
  for (const QByteArray& line : f.readAll().split('\n')) {
    const QString text = QString::fromUtf8(line);
    if (auto m = number.match(text); m.hasMatch()) out.push_back(m.captured(1).toInt());
    else if (auto b = bytes.match(text); b.hasMatch()) out.push_back(QByteArray::fromBase64(b.captured(1).toLatin1()).toInt());
  }
  return out;
}

bool each_once(std::vector<int> got, int count) {
  std::sort(got.begin(), got.end());
  std::vector<int> want(static_cast<std::size_t>(count));
  std::iota(want.begin(), want.end(), 0);
  return got == want;
}

int count_with(const QStringList& lines, const QString& text) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const QString& l) { return l.contains(text); }));
}

// What http://ADDRESS/metrics answers (bash's /dev/tcp: the suite links no HTTP client).
QString metrics_of(const QString& address) {
  QProcess get;
  get.start("bash", {"-c", QString("exec 3<>/dev/tcp/%1/%2 && printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && cat <&3")
                               .arg(address.section(':', 0, -2), address.section(':', -1))});
  get.waitForFinished(10000);
  return QString::fromUtf8(get.readAllStandardOutput());
}

// A port no process listens on now (a dispatcher takes any, then lets it go).
QString free_port() {
  Service probe({"dispatcher", "--port", "0"});
  const QString port = probe.port();
  probe.stop();
  return port;
}

// Waits until the dispatcher lists `count` alive workers.
bool alive_workers(const QString& dispatcher, int count, const QStringList& extra = {}) {
  return count_with(workers_until(dispatcher, [&](const QStringList& l) { return count_with(l, " alive") == count; }, 15000, extra), " alive") == count;
}

std::multiset<int> multiset_of(const std::vector<int>& values) { return {values.begin(), values.end()}; }

// The batches a trainer wrote ({"value":[a,b,...]} lines), as they came.
std::vector<std::vector<int>> batches_in(const QString& path) {
  QFile f(path);
  std::vector<std::vector<int>> out;
  if (!f.open(QIODevice::ReadOnly)) return out;
  const QRegularExpression list("\"value\":\\[([0-9,]*)\\]");
  for (const QByteArray& line : f.readAll().split('\n'))
    if (auto m = list.match(QString::fromUtf8(line)); m.hasMatch()) {
      std::vector<int> batch;
      for (const QString& n : m.captured(1).split(',', Qt::SkipEmptyParts)) batch.push_back(n.toInt());
      out.push_back(batch);
    }
  return out;
}

// A coordinated job's pipeline for consumer `index` of 2: range `count` (`us` of CPU each), in
// batches of 4 made on the workers, splits of `split` numbers, `lanes` splits read at once.
QString coordinated_file(const QTemporaryDir& dir, const QString& address, int index, int count, int us, int split, int lanes) {
  const QString source = QString("stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"%1\" } }\n"
                                 "stage { id: \"slow\" op: \"simulate_work\" input: \"numbers\" params { key: \"us\" value: \"%2\" } }")
                             .arg(count)
                             .arg(us);
  return service_file(dir.filePath(QString("consumer%1.txtpb").arg(index)), source, "\"batch\" input: \"slow\" params { key: \"batch_size\" value: \"4\" }",
                      QString("service: \"grpc://%1\" job_name: \"rounds\" split_size: %2 splits_in_flight: %3 num_consumers: 2 consumer_index: %4")
                          .arg(address)
                          .arg(split)
                          .arg(lanes)
                          .arg(index),
                      dir.filePath(QString("consumer%1.jsonl").arg(index)));
}

}  // namespace

class TestService : public QObject {
  Q_OBJECT
 private slots:
  // Two workers register; one killed with SIGKILL is taken as lost within the heartbeat timeout
  // (2 s), the other stays alive; a worker joining later is listed too.
  void workers_register_and_a_killed_one_is_lost() {
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    QVERIFY2(!address.isEmpty(), qPrintable(dispatcher.errors()));
    QVERIFY(address.startsWith("127.0.0.1:"));
    auto first = std::make_unique<Service>(QStringList{"worker", "--dispatcher", address});
    Service second({"worker", "--dispatcher", "grpc://" + address});
    const QString first_address = first->address(), second_address = second.address();
    QVERIFY2(!first_address.isEmpty() && !second_address.isEmpty(), qPrintable(first->errors() + second.errors()));
    auto lines = workers_until(address, [](const QStringList& l) { return count_with(l, " alive") == 2; });
    QVERIFY2(count_with(lines, " alive") == 2, qPrintable(lines.join('\n')));
    QVERIFY(lines.join('\n').contains(first_address) && lines.join('\n').contains(second_address));

    first->kill();
    lines = workers_until(address, [](const QStringList& l) { return count_with(l, "lost (not heard from") == 1; });
    QVERIFY2(count_with(lines, "lost (not heard from") == 1 && count_with(lines, " alive") == 1, qPrintable(lines.join('\n')));
    QVERIFY(lines.filter(first_address).join("").contains("lost"));
    QVERIFY(lines.filter(second_address).join("").contains("alive"));
    QVERIFY2(dispatcher.says("(" + first_address + ") has not been heard from for 2000 ms: taken as lost"), qPrintable(dispatcher.errors()));

    Service third({"worker", "--dispatcher", address});
    QVERIFY(!third.address().isEmpty());
    lines = workers_until(address, [](const QStringList& l) { return count_with(l, " alive") == 2; });
    QVERIFY2(count_with(lines, " alive") == 2 && lines.size() == 4, qPrintable(lines.join('\n')));  // a header and three workers
    QCOMPARE(third.stop(), 0);
    QCOMPARE(second.stop(), 0);
    QCOMPARE(dispatcher.stop(), 0);
  }

  // Workers may start before the dispatcher, and a dispatcher restarted on its port (without a
  // journal) is told of them again by their next heartbeats.
  void workers_wait_for_the_dispatcher_and_register_again_after_its_restart() {
    Service probe({"dispatcher", "--port", "0"});  // a free port, then let go
    const QString port = probe.port();
    QVERIFY(!port.isEmpty());
    QCOMPARE(probe.stop(), 0);
    const QString address = "127.0.0.1:" + port;
    Service worker({"worker", "--dispatcher", address});
    QTest::qWait(700);
    QVERIFY(worker.process().state() == QProcess::Running);
    auto dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", port});
    QCOMPARE(dispatcher->address(), address);
    QVERIFY2(!worker.address().isEmpty(), qPrintable(worker.errors()));
    QVERIFY2(worker.says("waiting for the dispatcher at " + address), qPrintable(worker.errors()));
    auto lines = workers_until(address, [](const QStringList& l) { return count_with(l, " alive") == 1; });
    QVERIFY2(count_with(lines, " alive") == 1, qPrintable(lines.join('\n')));

    dispatcher->kill();
    dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", port});
    QCOMPARE(dispatcher->address(), address);
    lines = workers_until(address, [](const QStringList& l) { return count_with(l, " alive") == 1; });
    QVERIFY2(count_with(lines, " alive") == 1, qPrintable(lines.join('\n')));
    QVERIFY2(worker.says("registered again with the dispatcher at " + address), qPrintable(worker.errors()));
  }

  // With a token, a worker or client without it is refused (UNAUTHENTICATED, saying to give
  // --token-file); with it, served. The token never appears in any output.
  void a_token_is_required_when_the_dispatcher_has_one() {
    QTemporaryDir dir;
    const QString token_file = dir.filePath("token");
    QFile f(token_file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("s3cret-t0ken-value\n");
    f.close();
    Service dispatcher({"dispatcher", "--port", "0", "--token-file", token_file});
    const QString address = dispatcher.address();
    QVERIFY(!address.isEmpty());
    const auto refused = sluice_cli({"service", "workers", "--dispatcher", address});
    QVERIFY(refused.code != 0);
    QVERIFY2(refused.err.contains("UNAUTHENTICATED") && refused.err.contains("--token-file"), qPrintable(refused.err));
    Service stranger({"worker", "--dispatcher", address});
    QVERIFY(stranger.process().waitForFinished(20000));
    QVERIFY(stranger.process().exitCode() != 0);
    const QString said = stranger.errors() + QString::fromUtf8(stranger.process().readAllStandardError());
    QVERIFY2(said.contains("refused this worker") && said.contains("UNAUTHENTICATED"), qPrintable(said));

    Service member({"worker", "--dispatcher", address, "--token-file", token_file});
    QVERIFY(!member.address().isEmpty());
    auto lines = workers_until(address, [](const QStringList& l) { return count_with(l, " alive") == 1; }, 15000, {"--token-file", token_file});
    QVERIFY2(count_with(lines, " alive") == 1, qPrintable(lines.join('\n')));
    const QString everything = refused.err + said + member.errors() + dispatcher.errors() + lines.join('\n');
    QVERIFY(!everything.contains("s3cret"));
  }

  // Off loopback, a process needs TLS and a token, or --insecure (which its log says).
  void off_loopback_needs_tls_and_a_token_or_insecure() {
    const auto refused = sluice_cli({"dispatcher", "--port", "0", "--bind", "0.0.0.0"});
    QVERIFY(refused.code != 0);
    QVERIFY2(refused.err.contains("0.0.0.0") && refused.err.contains("--tls-cert") && refused.err.contains("--token-file") &&
                 refused.err.contains("--insecure"),
             qPrintable(refused.err));
    const auto half = sluice_cli({"dispatcher", "--port", "0", "--bind", "0.0.0.0", "--tls-cert", "x.pem"});
    QVERIFY(half.code != 0 && half.err.contains("--tls-key"));
    Service open({"dispatcher", "--port", "0", "--bind", "0.0.0.0", "--insecure"});
    QVERIFY(!open.address().isEmpty());
    QVERIFY2(open.says("--insecure: serving 0.0.0.0:"), qPrintable(open.errors()));
    QCOMPARE(open.stop(), 0);
  }

  // DYNAMIC: the trainer gets every element of the epoch exactly once from two workers, which
  // both made some of its splits.
  void a_pipeline_through_the_service_gives_every_element_once() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service first({"worker", "--dispatcher", address}), second({"worker", "--dispatcher", address});
    QVERIFY(!first.address().isEmpty() && !second.address().isEmpty());
    const QString out = dir.filePath("out.jsonl");
    const auto run = sluice_cli({"run", "--quiet", job_file(dir, "p.txtpb", address, 500, 200, 10, out)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    const auto got = numbers_in(out);
    QVERIFY2(each_once(got, 500), qPrintable(QString("%1 elements").arg(got.size())));
    // Compressed on the wire: the same elements.
    const QString numbers = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"300\" } }";
    for (const QString compression : {"ZSTD", "SNAPPY"}) {
      const QString packed = dir.filePath(compression + ".jsonl");
      const auto compressed = sluice_cli({"run", "--quiet", service_file(dir.filePath(compression + ".txtpb"), numbers, "\"simulate_work\" input: \"numbers\"",
                                                                          QString("service: \"grpc://%1\" job_name: \"%2\" split_size: 30 compression: %2").arg(address, compression),
                                                                          packed)});
      QVERIFY2(compressed.code == 0, qPrintable(compressed.err));
      const auto unpacked = numbers_in(packed);
      QVERIFY2(each_once(unpacked, 300), qPrintable(QString("%1: %2 elements").arg(compression).arg(unpacked.size())));
    }
  }

  // DYNAMIC: random draws differ between splits (positions start again in each split, but a
  // split's stages draw with keys of their own), and stay exactly once.
  void each_split_draws_its_own_random_numbers() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service worker({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 1));
    const QString out = dir.filePath("out.jsonl");
    const auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"),
                                                                 "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"400\" } }",
                                                                 "\"filter_random\" input: \"numbers\" params { key: \"p\" value: \"0.5\" }",
                                                                 QString("service: \"grpc://%1\" job_name: \"draws\" split_size: 20").arg(address), out)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    std::map<int, std::set<int>> kept;  // by split: the offsets inside it that the filter kept
    for (int v : numbers_in(out)) QVERIFY(kept[v / 20].insert(v % 20).second);
    std::set<std::set<int>> patterns;
    for (const auto& [split, offsets] : kept) patterns.insert(offsets);
    QVERIFY2(patterns.size() > 10, qPrintable(QString("%1 patterns over %2 splits").arg(patterns.size()).arg(kept.size())));
  }

  // A worker killed with SIGKILL in mid-epoch: its splits are made again by the other, from where
  // the trainer stopped; a worker that joins in mid-epoch takes splits too. Still exactly once.
  void a_worker_killed_and_one_added_in_mid_epoch_lose_and_repeat_nothing() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    auto doomed = std::make_unique<Service>(QStringList{"worker", "--dispatcher", address});
    Service survivor({"worker", "--dispatcher", address});
    QVERIFY(!doomed->address().isEmpty() && !survivor.address().isEmpty());
    const QString out = dir.filePath("out.jsonl");
    QProcess trainer;
    trainer.start(SLUICE_CLI, {"run", "--quiet", job_file(dir, "p.txtpb", address, 1200, 3000, 20, out)});
    QVERIFY(trainer.waitForStarted());
    QTest::qWait(1200);  // a few splits in
    doomed->kill();
    Service late({"worker", "--dispatcher", address});
    QVERIFY(!late.address().isEmpty());
    QVERIFY(trainer.waitForFinished(90000));
    QVERIFY2(trainer.exitCode() == 0, qPrintable(QString::fromUtf8(trainer.readAllStandardError())));
    const auto got = numbers_in(out);
    QVERIFY2(each_once(got, 1200), qPrintable(QString("%1 elements").arg(got.size())));
    QVERIFY2(dispatcher.says("given back after"), qPrintable(dispatcher.errors()));
  }

  // Two trainers naming one job share its splits: what they get is disjoint and covers the epoch.
  void two_trainers_sharing_a_job_split_the_epoch() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service first({"worker", "--dispatcher", address}), second({"worker", "--dispatcher", address});
    QVERIFY(!first.address().isEmpty() && !second.address().isEmpty());
    QProcess a, b;
    a.start(SLUICE_CLI, {"run", "--quiet", job_file(dir, "a.txtpb", address, 600, 1000, 10, dir.filePath("a.jsonl"))});
    b.start(SLUICE_CLI, {"run", "--quiet", job_file(dir, "b.txtpb", address, 600, 1000, 10, dir.filePath("b.jsonl"))});
    QVERIFY(a.waitForFinished(60000) && b.waitForFinished(60000));
    QVERIFY2(a.exitCode() == 0 && b.exitCode() == 0, qPrintable(QString::fromUtf8(a.readAllStandardError() + b.readAllStandardError())));
    auto got_a = numbers_in(dir.filePath("a.jsonl")), got_b = numbers_in(dir.filePath("b.jsonl"));
    QVERIFY(!got_a.empty() && !got_b.empty());
    std::vector<int> both = got_a;
    both.insert(both.end(), got_b.begin(), got_b.end());
    QVERIFY2(each_once(both, 600), qPrintable(QString("%1 + %2 elements").arg(got_a.size()).arg(got_b.size())));
  }

  // While a job is read, a trainer naming it with another pipeline is refused, saying to name
  // another. Once its trainers have left, the job is over: the same name begins a new job, and a
  // pipeline run again gets its whole epoch again.
  void a_job_belongs_to_its_trainers_while_they_read_it() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service worker({"worker", "--dispatcher", address});
    QVERIFY(!worker.address().isEmpty());
    QProcess reading;  // about 3 s of work
    reading.start(SLUICE_CLI, {"run", "--quiet", job_file(dir, "a.txtpb", address, 300, 10000, 10, dir.filePath("a.jsonl"))});
    QVERIFY(reading.waitForStarted());
    QVERIFY2(dispatcher.says("job 1 'train' registered"), qPrintable(dispatcher.errors()));
    const auto other = sluice_cli({"run", "--quiet", job_file(dir, "b.txtpb", address, 60, 0, 10, dir.filePath("b.jsonl"))});
    QVERIFY(other.code != 0);
    QVERIFY2(other.err.contains("job 'train' is another pipeline's") && other.err.contains("another job_name"), qPrintable(other.err));
    QVERIFY(reading.waitForFinished(60000));
    QCOMPARE(reading.exitCode(), 0);
    QVERIFY2(dispatcher.says("job 1 'train' is over: its trainers have left"), qPrintable(dispatcher.errors()));
    for (int run = 0; run < 2; ++run) {
      const QString out = dir.filePath(QString("again%1.jsonl").arg(run));
      const auto again = sluice_cli({"run", "--quiet", job_file(dir, "c.txtpb", address, 60, 0, 10, out)});
      QVERIFY2(again.code == 0, qPrintable(again.err));
      const auto got = numbers_in(out);
      QVERIFY2(each_once(got, 60), qPrintable(QString("run %1: %2 elements").arg(run).arg(got.size())));
    }
  }

  // Coordinated reads, one split at a time: the lane's batches are dealt in turn, across the
  // splits' ends (a split of 10 numbers makes 3 batches), so consumer k gets exactly the batches
  // numbered k, k + 2, ... of the epoch, each round one for each. A worker killed in mid-epoch and
  // the dispatcher killed and restarted on its journal change nothing: the worker's split is made
  // again by the other, from where the consumers were.
  void coordinated_reads_deal_each_round_to_every_consumer() {
    QTemporaryDir dir;
    const QString work_dir = dir.filePath("dispatcher");
    auto dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", "0", "--work-dir", work_dir});
    const QString address = dispatcher->address();
    auto doomed = std::make_unique<Service>(QStringList{"worker", "--dispatcher", address});
    Service survivor({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 2));
    const int count = 400;
    QProcess consumers[2];
    for (int k = 0; k < 2; ++k) consumers[k].start(SLUICE_CLI, {"run", "--quiet", coordinated_file(dir, address, k, count, 8000, 10, 1)});
    QTest::qWait(800);  // a few splits in
    doomed->kill();
    QVERIFY2(dispatcher->says("given back after"), qPrintable(dispatcher->errors()));  // (the next split goes to it if the current did not)
    dispatcher->kill();
    const QString first_dispatcher = dispatcher->errors();
    QTest::qWait(300);
    dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", address.section(':', -1), "--work-dir", work_dir});
    QVERIFY2(dispatcher->says("continuing from its journal"), qPrintable(dispatcher->errors()));
    for (auto& c : consumers) {
      const bool finished = c.waitForFinished(90000);
      QVERIFY2(finished && c.exitCode() == 0, qPrintable(QString::fromUtf8(c.readAllStandardError()) + "\n-- the dispatcher, killed:\n" + first_dispatcher +
                                                          "\n-- restarted:\n" + dispatcher->errors() +
                                                          "\n-- the surviving worker:\n" + survivor.errors()));
    }
    std::vector<std::vector<int>> epoch;  // the lane's batches in order: each split's 4, 4 and 2
    for (int split = 0; split < count / 10; ++split)
      for (int first = 0; first < 10; first += 4) {
        std::vector<int> batch;
        for (int n = first; n < std::min(first + 4, 10); ++n) batch.push_back(split * 10 + n);
        epoch.push_back(batch);
      }
    for (int k = 0; k < 2; ++k) {
      std::vector<std::vector<int>> want;
      for (std::size_t g = static_cast<std::size_t>(k); g < epoch.size(); g += 2) want.push_back(epoch[g]);
      const auto got = batches_in(dir.filePath(QString("consumer%1.jsonl").arg(k)));
      QVERIFY2(got == want, qPrintable(QString("consumer %1: %2 batches, %3 wanted").arg(k).arg(got.size()).arg(want.size())));
    }
  }

  // Coordinated reads, two splits at a time from three workers, a split of 8 numbers making one
  // round of two batches: at every step both trainers have a batch of the same split, the first
  // consumer its first half; every number once.
  void coordinated_rounds_give_every_trainer_one_batch_of_the_same_round() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service w1({"worker", "--dispatcher", address}), w2({"worker", "--dispatcher", address}), w3({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 3));
    QProcess consumers[2];
    for (int k = 0; k < 2; ++k) consumers[k].start(SLUICE_CLI, {"run", "--quiet", coordinated_file(dir, address, k, 320, 300, 8, 2)});
    for (auto& c : consumers) {
      QVERIFY(c.waitForFinished(90000));
      QVERIFY2(c.exitCode() == 0, qPrintable(QString::fromUtf8(c.readAllStandardError())));
    }
    const auto first = batches_in(dir.filePath("consumer0.jsonl")), second = batches_in(dir.filePath("consumer1.jsonl"));
    QCOMPARE(first.size(), std::size_t(40));
    QCOMPARE(second.size(), std::size_t(40));
    std::vector<int> all;
    for (std::size_t step = 0; step < first.size(); ++step) {
      QVERIFY2(first[step].size() == 4 && second[step].size() == 4 && first[step][0] % 8 == 0 && second[step][0] == first[step][0] + 4,
               qPrintable(QString("step %1: %2 and %3").arg(step).arg(first[step].front()).arg(second[step].front())));
      all.insert(all.end(), first[step].begin(), first[step].end());
      all.insert(all.end(), second[step].begin(), second[step].end());
    }
    QVERIFY(each_once(all, 320));
  }

  // What coordinated reads refuse, by name: a consumer_index without num_consumers, a job without
  // a name, a consumer another trainer already is; and a consumer leaving in mid-epoch ends the
  // job for the others (they would wait for it for ever).
  void coordinated_reads_refuse_what_cannot_be_coordinated() {
    QTemporaryDir dir;
    const QString work_dir = dir.filePath("dispatcher");
    auto dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", "0", "--work-dir", work_dir});
    const QString address = dispatcher->address();
    Service worker({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 1));
    const QString file = coordinated_file(dir, address, 0, 4000, 2000, 10, 1);
    auto run = sluice_cli({"run", "--quiet", file, "--set", "distribute.num_consumers=0"});
    QVERIFY2(run.code != 0 && run.err.contains("consumer_index is for coordinated reads: give num_consumers too"), qPrintable(run.err));
    run = sluice_cli({"run", "--quiet", file, "--set", "distribute.job_name="});
    QVERIFY2(run.code != 0 && run.err.contains("coordinated reads (num_consumers: 2) need a job_name"), qPrintable(run.err));
    run = sluice_cli({"run", "--quiet", file, "--set", "distribute.consumer_index=2"});
    QVERIFY2(run.code != 0 && run.err.contains("consumer_index, this trainer's, 0 to 1 (not 2)"), qPrintable(run.err));
    // Both consumers skip what fails: the service's failure (below) is no element's, and ends the
    // run all the same (skipping it would only ask the dispatcher again, for ever).
    auto skip_failures = [](const QString& path) {
      QFile f(path);
      f.open(QIODevice::ReadOnly);
      write_text(path, QString::fromUtf8(f.readAll()).replace("options { seed: 5 }", "options { seed: 5 error_policy: skip }"));
      return path;
    };
    QProcess first, second;
    first.start(SLUICE_CLI, {"run", "--quiet", skip_failures(file)});
    QVERIFY2(dispatcher->says("job 1 'rounds' registered"), qPrintable(dispatcher->errors()));
    run = sluice_cli({"run", "--quiet", file});
    QVERIFY2(run.code != 0 && run.err.contains("consumer 0 of job 'rounds' is read by another trainer already"), qPrintable(run.err));
    const QString skipping = skip_failures(coordinated_file(dir, address, 1, 4000, 2000, 10, 1));
    second.start(SLUICE_CLI, {"run", "--quiet", skipping});
    QTest::qWait(1000);
    // A dispatcher restarted on its journal learns again, from their heartbeats, which trainer is
    // which consumer.
    dispatcher->kill();
    dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", address.section(':', -1), "--work-dir", work_dir});
    QVERIFY2(dispatcher->says("continuing from its journal"), qPrintable(dispatcher->errors()));
    QTest::qWait(1500);
    first.terminate();  // Ctrl-C's way out: it leaves the job
    QVERIFY(first.waitForFinished(20000));
    QVERIFY(second.waitForFinished(30000));
    const QString err = QString::fromUtf8(second.readAllStandardError());
    QVERIFY2(second.exitCode() != 0 && err.contains("consumer 0 of job 'rounds' left in mid-epoch") && err.contains("start every trainer") &&
                 err.contains("stage 'work' (service_source) failed after element") && !err.contains("error_policy"),
             qPrintable(err));
  }

  // What the job's skip policy drops on a worker is the trainer's to report: counted as its
  // distributed stage's skips, each reason naming the split, the stage, the worker and the file.
  void skips_on_the_workers_are_reported_by_the_trainer() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service worker({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 1));
    QDir().mkpath(dir.filePath("images"));
    const QString jpegs = QString(SLUICE_SOURCE_DIR) + "/tests/data/real/jpeg/pillow/";
    QVERIFY(QFile::copy(jpegs + "hopper_gray.jpg", dir.filePath("images/a.jpg")) && QFile::copy(jpegs + "iptc.jpg", dir.filePath("images/b.jpg")));
    write_text(dir.filePath("images/c.jpg"), "not an image");
    write_text(dir.filePath("images/d.jpg"), "nor this");
    const QString file = write_text(
        dir.filePath("skips.txtpb"),
        QString("stage { id: \"files\" op: \"list_files\" params { key: \"patterns\" value: \"images/*.jpg\" } }\n"
                "stage { id: \"bytes\" op: \"read_file\" input: \"files\" }\n"
                "stage { id: \"decode\" op: \"decode_image\" input: \"bytes\" error_policy: skip\n"
                "        distribute { service: \"grpc://%1\" job_name: \"skips\" } }\n"
                "stage { id: \"out\" op: \"null_sink\" input: \"decode\" }\n")
            .arg(address));
    const auto run = sluice_cli({"run", file});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    QVERIFY2(run.out.contains("Skipped in stage 'decode': 2 elements"), qPrintable(run.out));
    for (const QString name : {"c.jpg", "d.jpg"})
      QVERIFY2(run.out.contains(QRegularExpression("split \\d+ of job 'skips', stage 'decode' on worker 1: element 0 of epoch 0 from \\S*images/" +
                                                   QRegularExpression::escape(name) + ": cannot decode")),
               qPrintable(run.out));
  }

  // OFF: every worker makes the whole dataset with its own seed; the trainer gets each copy's
  // elements, which are what a job of as many workers each reading everything (sharding: off)
  // gets. A random filter shows the seeds differ.
  void off_mode_gives_a_copy_of_the_dataset_from_each_worker() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service first({"worker", "--dispatcher", address}), second({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 2));
    const QString source = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"300\" } }";
    const QString work = "\"filter_random\" input: \"numbers\" params { key: \"p\" value: \"0.5\" }";
    const QString out = dir.filePath("out.jsonl");
    const auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"), source, work,
                                                                 QString("service: \"grpc://%1\" processing_mode: OFF job_name: \"copies\"").arg(address), out)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    // Each copy as a worker of a two-worker job reading everything makes it.
    std::multiset<int> want;
    std::vector<std::set<int>> copies;
    for (int k = 0; k < 2; ++k) {
      const QString local = dir.filePath(QString("copy%1.jsonl").arg(k));
      const QString file = write_text(dir.filePath("copy.txtpb"),
                                      QString("options { seed: 5 sharding: off }\n%1\nstage { id: \"work\" op: %2 }\n"
                                              "stage { id: \"out\" op: \"jsonl_sink\" input: \"work\" params { key: \"path\" value: \"%3\" } }\n")
                                          .arg(source, work, dir.filePath("copy{worker}.jsonl")));
      const auto copy = sluice_cli({"run", "--quiet", file, "--num-workers", "2", "--worker-index", QString::number(k)});
      QVERIFY2(copy.code == 0, qPrintable(copy.err));
      const auto got = numbers_in(local);
      copies.emplace_back(got.begin(), got.end());
      want.insert(got.begin(), got.end());
    }
    QVERIFY(copies[0] != copies[1]);  // their own seeds
    QVERIFY(copies[0].size() > 100 && copies[1].size() > 100);
    const auto got = numbers_in(out);
    QVERIFY2(multiset_of(got) == want, qPrintable(QString("%1 elements, %2 wanted").arg(got.size()).arg(want.size())));
  }

  // Static sharding over the dispatcher's fixed worker list: by record and by file, every element
  // once; a worker not on the list is refused, and a dispatcher without a list refuses the mode.
  void static_sharding_over_a_fixed_worker_list() {
    QTemporaryDir dir;
    const QString p1 = free_port(), p2 = free_port();
    QVERIFY(!p1.isEmpty() && !p2.isEmpty() && p1 != p2);
    const QString a1 = "127.0.0.1:" + p1, a2 = "127.0.0.1:" + p2;
    Service dispatcher({"dispatcher", "--port", "0", "--worker-addresses", a1 + "," + a2});
    const QString address = dispatcher.address();
    Service first({"worker", "--dispatcher", address, "--port", p1}), second({"worker", "--dispatcher", address, "--port", p2});
    QVERIFY(alive_workers(address, 2));
    Service stranger({"worker", "--dispatcher", address});
    QVERIFY(stranger.process().waitForFinished(20000));
    const QString said = stranger.errors() + QString::fromUtf8(stranger.process().readAllStandardError());
    QVERIFY2(stranger.process().exitCode() != 0 && said.contains("not in the dispatcher's fixed list (--worker-addresses " + a1 + "," + a2 + ")"),
             qPrintable(said));

    const QString numbers = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"300\" } }";
    const QString by_record = dir.filePath("records.jsonl");
    auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("records.txtpb"), numbers, "\"simulate_work\" input: \"numbers\"",
                                                           QString("service: \"grpc://%1\" processing_mode: DATA job_name: \"records\"").arg(address), by_record)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    auto got = numbers_in(by_record);
    QVERIFY2(each_once(got, 300), qPrintable(QString("%1 elements").arg(got.size())));

    for (int f = 0; f < 4; ++f) {
      QString lines;
      for (int i = 0; i < 25; ++i) lines += QString::number(f * 25 + i) + "\n";
      write_text(dir.filePath(QString("part%1.txt").arg(f)), lines);
    }
    const QString files = QString("stage { id: \"files\" op: \"list_files\" params { key: \"patterns\" value: \"%1/part*.txt\" } }").arg(dir.path());
    const QString by_file = dir.filePath("files.jsonl");
    run = sluice_cli({"run", "--quiet", service_file(dir.filePath("files.txtpb"), files, "\"text_lines\" input: \"files\"",
                                                      QString("service: \"grpc://%1\" processing_mode: FILE job_name: \"files\"").arg(address), by_file)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    got = numbers_in(by_file, "line");
    QVERIFY2(each_once(got, 100), qPrintable(QString("%1 lines").arg(got.size())));

    Service unlisted({"dispatcher", "--port", "0"});
    const QString other = unlisted.address();
    Service worker({"worker", "--dispatcher", other});
    QVERIFY(!worker.address().isEmpty());
    run = sluice_cli({"run", "--quiet", service_file(dir.filePath("refused.txtpb"), numbers, "\"simulate_work\" input: \"numbers\"",
                                                      QString("service: \"grpc://%1\" processing_mode: DATA job_name: \"records\"").arg(other),
                                                      dir.filePath("refused.jsonl"))});
    QVERIFY(run.code != 0);
    QVERIFY2(run.err.contains("job 'records' shards statically (DATA)") && run.err.contains("--worker-addresses"), qPrintable(run.err));
  }

  // A dispatcher killed with SIGKILL in mid-epoch and started again on its journal continues the
  // job: the trainer waits for it, and gets every element once.
  void a_dispatcher_restarted_on_its_journal_continues_the_job() {
    QTemporaryDir dir;
    const QString work_dir = dir.filePath("dispatcher");
    auto dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", "0", "--work-dir", work_dir});
    const QString address = dispatcher->address();
    const QString port = address.section(':', -1);
    Service first({"worker", "--dispatcher", address}), second({"worker", "--dispatcher", address});
    QVERIFY(alive_workers(address, 2));
    const QString out = dir.filePath("out.jsonl");
    QProcess trainer;
    trainer.start(SLUICE_CLI, {"run", "--quiet", job_file(dir, "p.txtpb", address, 1200, 3000, 20, out)});
    QVERIFY(trainer.waitForStarted());
    QTest::qWait(1200);  // a few splits in
    dispatcher->kill();
    QVERIFY(QFileInfo::exists(work_dir + "/dispatcher.journal"));
    QTest::qWait(500);
    dispatcher = std::make_unique<Service>(QStringList{"dispatcher", "--port", port, "--work-dir", work_dir});
    QCOMPARE(dispatcher->address(), address);
    QVERIFY2(dispatcher->says("continuing from its journal"), qPrintable(dispatcher->errors()));
    QVERIFY(trainer.waitForFinished(90000));
    QVERIFY2(trainer.exitCode() == 0, qPrintable(QString::fromUtf8(trainer.readAllStandardError()) + dispatcher->errors()));
    const auto got = numbers_in(out);
    QVERIFY2(each_once(got, 1200), qPrintable(QString("%1 elements").arg(got.size())));
    // The workers kept their places: none registered anew.
    QVERIFY(!first.errors().contains("registered again") && !second.errors().contains("registered again"));

    // A journal that cannot be read is refused by name, not overwritten.
    dispatcher->kill();
    write_text(work_dir + "/dispatcher.journal", "not a journal");
    const auto damaged = sluice_cli({"dispatcher", "--port", "0", "--work-dir", work_dir});
    QVERIFY(damaged.code != 0);
    QVERIFY2(damaged.err.contains(work_dir + "/dispatcher.journal") && damaged.err.contains("move it away"), qPrintable(damaged.err));
    // A FIFO in the journal's place would hold open() for ever: refused at once, by name.
    QFile::remove(work_dir + "/dispatcher.journal");
    QVERIFY(::mkfifo(QFile::encodeName(work_dir + "/dispatcher.journal").constData(), 0600) == 0);
    QElapsedTimer fifo_clock;
    fifo_clock.start();
    const auto fifo = sluice_cli({"dispatcher", "--port", "0", "--work-dir", work_dir});
    QVERIFY2(fifo.code != 0 && fifo_clock.elapsed() < 20000, qPrintable(fifo.err));
    QVERIFY2(fifo.err.contains(work_dir + "/dispatcher.journal") && fifo.err.contains("is not a regular file"), qPrintable(fifo.err));
  }

  // A worker whose plugins lack an operator of the job makes none of it, and is named; with no
  // other worker the trainer fails naming the operator and the worker.
  void a_worker_without_a_needed_plugin_is_refused_by_name() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0"});
    const QString address = dispatcher.address();
    Service plain({"worker", "--dispatcher", address});
    const QString plain_address = plain.address();
    QVERIFY(alive_workers(address, 1));
    const QString numbers = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"200\" } }";
    const QString distribute = QString("service: \"grpc://%1\" job_name: \"tagged\" split_size: 20").arg(address);
    const auto refused = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"), numbers, "\"tag_origin\" input: \"numbers\"", distribute,
                                                                     dir.filePath("refused.jsonl"))});
    QVERIFY(refused.code != 0);
    QVERIFY2(refused.err.contains("no worker can make job 'tagged'") && refused.err.contains("(" + plain_address + ") lacks operator 'tag_origin'"),
             qPrintable(refused.err));

    Service equipped({"worker", "--dispatcher", address, "--plugin-dir", QString(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"});
    QVERIFY(alive_workers(address, 2));
    const QString out = dir.filePath("out.jsonl");
    const auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"), numbers, "\"tag_origin\" input: \"numbers\"", distribute, out)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    const auto got = numbers_in(out);
    QVERIFY2(each_once(got, 200), qPrintable(QString("%1 elements").arg(got.size())));
    QVERIFY2(dispatcher.says("(" + plain_address + ") lacks operator 'tag_origin': it makes none of the job's splits"), qPrintable(dispatcher.errors()));
  }

  // Off loopback with TLS and a token: a client without TLS, or with TLS and without the token,
  // is refused; a trainer with both gets every element once.
  void tls_and_a_token_off_loopback() {
    QTemporaryDir dir;
    auto openssl = [&](const QStringList& args) {
      QProcess p;
      p.setWorkingDirectory(dir.path());
      p.start("openssl", args);
      return p.waitForFinished(60000) && p.exitCode() == 0;
    };
    QVERIFY(openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Sluice test CA"}));
    QVERIFY(openssl({"req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"}));
    write_text(dir.filePath("san.ext"), "subjectAltName=IP:127.0.0.1\n");
    QVERIFY(openssl({"x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2",
                     "-extfile", "san.ext"}));
    const QString token = write_text(dir.filePath("token"), "tls-t0ken-value\n");
    const QStringList serve{"--bind", "0.0.0.0", "--tls-cert", dir.filePath("server.pem"), "--tls-key", dir.filePath("server.key"), "--token-file", token};
    const QStringList client{"--tls-ca", dir.filePath("ca.pem"), "--token-file", token};
    Service dispatcher(QStringList{"dispatcher", "--port", "0"} + serve);
    const QString port = dispatcher.port();
    QVERIFY2(!port.isEmpty(), qPrintable(dispatcher.errors()));
    const QString address = "127.0.0.1:" + port;
    const QStringList trusting{"--tls-ca", dir.filePath("ca.pem")};
    Service first(QStringList{"worker", "--dispatcher", address, "--host", "127.0.0.1"} + serve + trusting);
    Service second(QStringList{"worker", "--dispatcher", address, "--host", "127.0.0.1"} + serve + trusting);
    QVERIFY2(alive_workers(address, 2, client), qPrintable(first.errors()));

    const auto plain = sluice_cli({"service", "workers", "--dispatcher", address});
    QVERIFY(plain.code != 0);
    QVERIFY2(plain.err.contains("did not answer"), qPrintable(plain.err));
    const auto tokenless = sluice_cli({"service", "workers", "--dispatcher", address, "--tls-ca", dir.filePath("ca.pem")});
    QVERIFY(tokenless.code != 0);
    QVERIFY2(tokenless.err.contains("UNAUTHENTICATED"), qPrintable(tokenless.err));

    const QString out = dir.filePath("out.jsonl");
    const QString numbers = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"300\" } }";
    const auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"), numbers, "\"simulate_work\" input: \"numbers\"",
                                                                 QString("service: \"grpc://%1\" job_name: \"secure\" split_size: 25 token_file: \"%2\" tls_ca: \"%3\"")
                                                                     .arg(address, token, dir.filePath("ca.pem")),
                                                                 out)});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    const auto got = numbers_in(out);
    QVERIFY2(each_once(got, 300), qPrintable(QString("%1 elements").arg(got.size())));
    QVERIFY(!(plain.err + tokenless.err + run.err + dispatcher.errors() + first.errors()).contains("t0ken"));
  }

  // The dispatcher and the workers serve /metrics: workers, jobs and splits; splits made (and
  // read through the Unix socket by a trainer on the same machine), elements and bytes sent
  // before and after compression.
  void the_dispatcher_and_the_workers_serve_metrics() {
    QTemporaryDir dir;
    Service dispatcher({"dispatcher", "--port", "0", "--metrics-addr", "0"});
    const QString address = dispatcher.address();
    Service worker({"worker", "--dispatcher", address, "--metrics-addr", "0", "--unix-socket"});
    QVERIFY(alive_workers(address, 1));
    static const QRegularExpression at("metrics at http://(\\S+)/metrics");
    QVERIFY2(dispatcher.says("/metrics") && worker.says("/metrics"), qPrintable(dispatcher.errors() + worker.errors()));
    const QString dispatcher_metrics = at.match(dispatcher.errors()).captured(1), worker_metrics = at.match(worker.errors()).captured(1);
    const QString source = "stage { id: \"t\" op: \"tensors\" params { key: \"count\" value: \"400\" } params { key: \"shape\" value: \"32,32\" } "
                           "params { key: \"dtype\" value: \"u8\" } }";
    const auto run = sluice_cli({"run", "--quiet", service_file(dir.filePath("p.txtpb"), source, "\"identity\" input: \"t\"",
                                                                 QString("service: \"grpc://%1\" job_name: \"watched\" split_size: 50 compression: ZSTD").arg(address),
                                                                 dir.filePath("out.jsonl"))});
    QVERIFY2(run.code == 0, qPrintable(run.err));
    const QString d = metrics_of(dispatcher_metrics), w = metrics_of(worker_metrics);
    QVERIFY2(d.contains("sluice_dispatcher_workers{state=\"alive\"} 1") && d.contains("sluice_dispatcher_jobs ") &&
                 d.contains("sluice_dispatcher_splits_total{job=\"watched\",outcome=\"done\"} 8"),
             qPrintable(d));
    QVERIFY2(w.contains("sluice_worker_elements_sent_total 400") && w.contains("sluice_worker_splits_active 0"), qPrintable(w));
    // The trainer is on the worker's machine: it read every split through the worker's Unix socket.
    static const QRegularExpression local("sluice_worker_splits_local_total (\\d+)"), done("sluice_worker_splits_total\\{outcome=\"done\"\\} (\\d+)");
    QVERIFY2(local.match(w).captured(1).toInt() > 0 && local.match(w).captured(1) == done.match(w).captured(1), qPrintable(w));
    static const QRegularExpression sent("sluice_worker_bytes_sent_total (\\d+)"), raw("sluice_worker_bytes_raw_total (\\d+)");
    const qint64 sent_bytes = sent.match(w).captured(1).toLongLong(), raw_bytes = raw.match(w).captured(1).toLongLong();
    QVERIFY2(raw_bytes > 400 * 1024 && sent_bytes > 0 && sent_bytes < raw_bytes, qPrintable(w));
  }

  void a_malformed_address_is_named() {
    const auto r = sluice_cli({"service", "workers", "--dispatcher", "nowhere"});
    QVERIFY(r.code != 0);
    QVERIFY2(r.err.contains("'nowhere' is not a service address") && r.err.contains("HOST:PORT"), qPrintable(r.err));
  }

  // A port in use is an error (gRPC's SO_REUSEPORT let a second dispatcher share it and take
  // half the callers), said in Sluice's words alone (gRPC's own log lines came first).
  void a_port_in_use_is_said_without_grpc_log_lines() {
    Service first({"dispatcher", "--port", "0"});
    const QString port = first.address().section(':', -1);
    const auto second = sluice_cli({"dispatcher", "--port", port});
    QVERIFY(second.code != 0);
    QVERIFY2(second.err.startsWith("error: the dispatcher cannot listen on") && !second.err.contains("chttp2"), qPrintable(second.err));
  }
};

QTEST_GUILESS_MAIN(TestService)
#include "tst_service.moc"
