// The service's processes as a cluster starts them (core/service/): a dispatcher, workers that
// register and are taken as lost when killed, a dispatcher restarted, and what is refused off
// loopback or without the token. Real processes on loopback.
#include <QtTest>

#include <memory>

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

int count_with(const QStringList& lines, const QString& text) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const QString& l) { return l.contains(text); }));
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

  void a_malformed_address_is_named() {
    const auto r = sluice_cli({"service", "workers", "--dispatcher", "nowhere"});
    QVERIFY(r.code != 0);
    QVERIFY2(r.err.contains("'nowhere' is not a service address") && r.err.contains("HOST:PORT"), qPrintable(r.err));
  }
};

QTEST_GUILESS_MAIN(TestService)
#include "tst_service.moc"
