// The dispatcher against the other processes of a shared machine (issue 61): on loopback, where
// every local user reaches it, it wants a token of its own that only its user can read; a reader
// reports only on splits handed to it; splits held by a reader no trainer stands behind come back,
// and the trainer they were taken from is told; a decision the journal cannot keep is not answered.
// The callers here are raw gRPC clients, as an intruder's would be.
#include <QtTest>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "pipeline_runner.hpp"

#include "security.hpp"
#include "service.grpc.pb.h"
#include "sluice/service/service.hpp"

namespace proto = sluice::service::proto;
using sluice::service::Dispatcher;
using sluice::service::DispatcherOptions;

namespace {

const char* const kPipeline = "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"1000\" } }\n";

// A client of the dispatcher at `port`, sending `token` (none when empty).
struct Caller {
  std::unique_ptr<proto::Dispatcher::Stub> stub;
  std::string token;
  mutable std::uint64_t worker_id = 0;
  Caller(int port, std::string with) : token(std::move(with)) {
    stub = proto::Dispatcher::NewStub(grpc::CreateChannel(QString("127.0.0.1:%1").arg(port).toStdString(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> context() const {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  }
  grpc::Status register_worker(const std::string& address) const {
    proto::WorkerInfo info;
    info.set_address(address);
    for (const char* op : {"range", "skip", "take"}) info.add_operators(op);
    proto::RegisterReply reply;
    const grpc::Status status = stub->RegisterWorker(context().get(), info, &reply);
    worker_id = reply.worker_id();
    return status;
  }
  // The fake worker's heartbeat: it stays alive at the dispatcher.
  grpc::Status worker_alive() const {
    proto::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    proto::HeartbeatReply reply;
    return stub->WorkerHeartbeat(context().get(), request, &reply);
  }
  grpc::Status take_job(const std::string& trainer, std::uint64_t& job_id) const {
    proto::JobRequest request;
    request.set_job_name("shared");
    request.set_pipeline(kPipeline);
    request.set_split_size(10);
    request.set_client(trainer);
    proto::JobReply reply;
    const grpc::Status status = stub->GetOrCreateJob(context().get(), request, &reply);
    job_id = reply.job_id();
    return status;
  }
  grpc::Status split(std::uint64_t job, const std::string& reader, std::uint64_t sequence, proto::SplitReply& reply) const {
    proto::SplitRequest request;
    request.set_job_id(job);
    request.set_reader(reader);
    request.set_sequence(sequence);
    return stub->GetSplit(context().get(), request, &reply);
  }
  grpc::Status report_done(std::uint64_t job, const proto::SplitReply& given, const std::string& reader) const {
    proto::SplitReport report;
    report.set_job_id(job);
    report.set_split(given.split());
    report.set_lease(given.lease());
    report.set_worker_id(given.worker_id());
    report.set_outcome(proto::SplitReport::DONE);
    report.set_received(1000000000);
    report.set_reader(reader);
    proto::SplitReportReply ignored;
    return stub->ReportSplit(context().get(), report, &ignored);
  }
  grpc::Status heartbeat(std::uint64_t job, const std::string& trainer) const {
    proto::JobClientRequest request;
    request.set_job_id(job);
    request.set_client(trainer);
    proto::JobClientReply reply;
    return stub->JobClient(context().get(), request, &reply);
  }
};

// A coordinated job read by trainers "C0" and "C1" (consumers 0 and 1, one lane), a worker
// registered, and its first split as consumer 1 asked for it.
bool coordinated_split(const Caller& caller, std::uint64_t& job, proto::SplitReply& given) {
  if (!caller.register_worker("127.0.0.1:1").ok()) return false;
  for (int consumer = 0; consumer < 2; ++consumer) {
    proto::JobRequest request;
    request.set_job_name("coordinated");
    request.set_pipeline(kPipeline);
    request.set_split_size(10);
    request.set_num_consumers(2);
    request.set_lanes(1);
    request.set_consumer_index(consumer);
    request.set_client("C" + std::to_string(consumer));
    proto::JobReply reply;
    if (!caller.stub->GetOrCreateJob(caller.context().get(), request, &reply).ok()) return false;
    job = reply.job_id();
  }
  proto::SplitRequest request;
  request.set_job_id(job);
  request.set_consumer_index(1);
  return caller.stub->GetSplit(caller.context().get(), request, &given).ok() && given.kind() == proto::SplitReply::SPLIT;
}

// Consumer `consumer`'s report of `given` (by its own trainer), `next` the position it needs next.
proto::SplitReport coordinated_report(std::uint64_t job, const proto::SplitReply& given, std::uint32_t consumer, proto::SplitReport::Outcome outcome,
                                      std::uint64_t next) {
  proto::SplitReport report;
  report.set_job_id(job);
  report.set_split(given.split());
  report.set_lease(given.lease());
  report.set_worker_id(given.worker_id());
  report.set_outcome(outcome);
  report.set_received(next);
  report.set_consumer_index(consumer);
  report.set_reader("C" + std::to_string(consumer) + "-lane0");
  return report;
}

// Sends consumer `consumer`'s report of `given` (see coordinated_report).
grpc::Status send_coordinated_report(const Caller& caller, std::uint64_t job, const proto::SplitReply& given, std::uint32_t consumer,
                                     proto::SplitReport::Outcome outcome, std::uint64_t next) {
  proto::SplitReportReply ignored;
  return caller.stub->ReportSplit(caller.context().get(), coordinated_report(job, given, consumer, outcome, next), &ignored);
}

// Consumer `consumer` asks for slot `slot` of lane 0; `after_lease`: the lease its stream broke off in (0: none).
grpc::Status ask_coordinated(const Caller& caller, std::uint64_t job, std::uint32_t consumer, std::uint64_t slot, std::uint64_t after_lease,
                             proto::SplitReply& reply) {
  proto::SplitRequest request;
  request.set_job_id(job);
  request.set_consumer_index(consumer);
  request.set_slot(slot);
  request.set_after_lease(after_lease);
  reply.Clear();
  return caller.stub->GetSplit(caller.context().get(), request, &reply);
}

std::string code_of(const grpc::Status& status) { return std::to_string(static_cast<int>(status.error_code())) + " " + status.error_message(); }

}  // namespace

class TestServicePeers : public QObject {
  Q_OBJECT
  QTemporaryDir runtime_;

 private slots:
  void initTestCase() { qputenv("SLUICE_RUNTIME_DIR", (runtime_.path() + "/run").toUtf8()); }

  // Without --token-file on loopback, the dispatcher draws a token, keeps it where only its user
  // reads it, and refuses every call without it; this user's clients find it by the port. A
  // dispatcher without a journal takes its token with it when it ends.
  void a_local_process_without_the_token_is_refused() {
    DispatcherOptions options;
    auto dispatcher = std::make_unique<Dispatcher>(options);
    const int port = dispatcher->port();
    const auto kept = sluice::service::detail::own_token_path(port);
    struct stat st {};
    QVERIFY2(::stat(kept.c_str(), &st) == 0, kept.c_str());
    QCOMPARE(st.st_mode & 0777, 0600u);
    QVERIFY(kept.string().rfind(runtime_.path().toStdString(), 0) == 0);

    const Caller intruder(port, "");
    std::uint64_t job = 0;
    QCOMPARE(intruder.register_worker("127.0.0.1:1").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    QCOMPARE(intruder.take_job("intruder", job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    proto::JobRequest pipeline;
    proto::GetJobRequest get;
    get.set_job_id(1);
    QCOMPARE(intruder.stub->GetJob(intruder.context().get(), get, &pipeline).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    proto::WorkerList workers;
    QCOMPARE(intruder.stub->ListWorkers(intruder.context().get(), proto::ListWorkersRequest{}, &workers).error_code(),
             grpc::StatusCode::UNAUTHENTICATED);
    const Caller guesser(port, std::string(64, 'a'));
    QCOMPARE(guesser.register_worker("127.0.0.1:1").error_code(), grpc::StatusCode::UNAUTHENTICATED);

    const std::string token = sluice::service::detail::client_token("127.0.0.1:" + std::to_string(port), {});
    QCOMPARE(token.size(), 64u);
    const Caller owner(port, token);
    QVERIFY2(owner.register_worker("127.0.0.1:1").ok(), "this user's own client is let in");
    QCOMPARE(sluice::service::list_workers("127.0.0.1:" + std::to_string(port), {}).size(), 1u);

    // A token file others can read is not taken as the dispatcher's.
    ::chmod(kept.c_str(), 0644);
    QVERIFY(sluice::service::detail::client_token("127.0.0.1:" + std::to_string(port), {}).empty());
    ::chmod(kept.c_str(), 0600);

    dispatcher.reset();
    QVERIFY2(!std::filesystem::exists(kept), "a dispatcher without a journal leaves no token behind");

    // --insecure on loopback: no token is made or wanted.
    options.security.insecure = true;
    Dispatcher open(options);
    QVERIFY(!std::filesystem::exists(sluice::service::detail::own_token_path(open.port())));
    QVERIFY(Caller(open.port(), "").register_worker("127.0.0.1:1").ok());
  }

  // A process holding the token still cannot end another reader's split: the report names the
  // reader, and the dispatcher refuses it unless the split was handed to that reader.
  void a_reader_reports_only_on_splits_handed_to_it() {
    Dispatcher dispatcher(DispatcherOptions{});
    const std::string token = sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {});
    const Caller trainer(dispatcher.port(), token), intruder(dispatcher.port(), token);
    QVERIFY(trainer.register_worker("127.0.0.1:1").ok());
    std::uint64_t job = 0;
    QVERIFY(trainer.take_job("T", job).ok());
    proto::SplitReply given;
    QVERIFY(trainer.split(job, "T-0", 1, given).ok());
    QCOMPARE(given.kind(), proto::SplitReply::SPLIT);

    const grpc::Status stolen = intruder.report_done(job, given, "intruder");
    QVERIFY2(stolen.error_code() == grpc::StatusCode::PERMISSION_DENIED, code_of(stolen).c_str());
    QVERIFY(stolen.error_message().find("handed to another reader") != std::string::npos);
    QVERIFY(trainer.report_done(job, given, "T-0").ok());
  }

  // Coordinated reads: a trainer reports only as the consumer it took.
  void a_coordinated_trainer_reports_only_as_its_own_consumer() {
    Dispatcher dispatcher(DispatcherOptions{});
    const Caller caller(dispatcher.port(), sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {}));
    std::uint64_t job = 0;
    proto::SplitReply given;
    QVERIFY(coordinated_split(caller, job, given));
    proto::SplitReport report = coordinated_report(job, given, 0, proto::SplitReport::DONE, 0);
    report.set_reader("C1-lane0");  // consumer 1's trainer, reporting as consumer 0
    proto::SplitReportReply ignored;
    const grpc::Status refused = caller.stub->ReportSplit(caller.context().get(), report, &ignored);
    QVERIFY2(refused.error_code() == grpc::StatusCode::PERMISSION_DENIED, code_of(refused).c_str());
    report.set_consumer_index(1);
    QVERIFY(caller.stub->ReportSplit(caller.context().get(), report, &ignored).ok());
  }

  // Coordinated reads: a split whose worker died is made again from the position the *least*
  // advanced consumer needs, and each consumer is told where its own part goes on.
  void a_coordinated_split_handed_again_restarts_at_the_least_advanced_consumer() {
    Dispatcher dispatcher(DispatcherOptions{});
    const Caller caller(dispatcher.port(), sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {}));
    std::uint64_t job = 0;
    proto::SplitReply given;
    QVERIFY(coordinated_split(caller, job, given));
    for (const auto& [consumer, next] : {std::pair{0u, 8u}, std::pair{1u, 5u}})
      QVERIFY(send_coordinated_report(caller, job, given, consumer, proto::SplitReport::GIVEN_BACK, next).ok());
    proto::SplitReply handed;
    QVERIFY(ask_coordinated(caller, job, 0, 0, given.lease(), handed).ok());
    QCOMPARE(handed.kind(), proto::SplitReply::SPLIT);
    QCOMPARE(handed.split(), given.split());
    QVERIFY(handed.lease() != given.lease());
    QCOMPARE(handed.skip(), 5u);
    QCOMPARE(handed.consumer_next_size(), 2);
    QCOMPARE(handed.consumer_next(0), 8u);
    QCOMPARE(handed.consumer_next(1), 5u);
  }

  // Coordinated reads: when a worker dies after one consumer's stream ended whole and before the
  // other's did, the split is made again for the other alone; the whole one goes on to its next
  // slot and never reports the new lease, yet the split is done when the other's part is, and the
  // epoch ends (it once waited for that report for ever).
  void a_coordinated_split_handed_again_needs_no_report_from_a_consumer_whose_part_was_whole() {
    Dispatcher dispatcher(DispatcherOptions{});
    const Caller caller(dispatcher.port(), sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {}));
    std::uint64_t job = 0;
    proto::SplitReply given;
    QVERIFY(coordinated_split(caller, job, given));
    auto report = [&](const proto::SplitReply& lease, std::uint32_t consumer, proto::SplitReport::Outcome outcome, std::uint64_t next) {
      return send_coordinated_report(caller, job, lease, consumer, outcome, next);
    };
    auto ask = [&](std::uint32_t consumer, std::uint64_t slot, std::uint64_t after_lease, proto::SplitReply& reply) {
      return ask_coordinated(caller, job, consumer, slot, after_lease, reply);
    };
    QVERIFY(report(given, 1, proto::SplitReport::DONE, 10).ok());
    QVERIFY(report(given, 0, proto::SplitReport::GIVEN_BACK, 4).ok());
    proto::SplitReply again;
    QVERIFY(ask(0, 0, given.lease(), again).ok());
    QCOMPARE(again.kind(), proto::SplitReply::SPLIT);
    QCOMPARE(again.split(), given.split());
    QCOMPARE(again.skip(), 4u);
    QCOMPARE(again.consumer_next(1), 10u);
    QVERIFY(report(again, 0, proto::SplitReport::DONE, 10).ok());
    proto::SplitReply past_the_end;  // the source ends before the next split: both say so
    QVERIFY(ask(1, 1, 0, past_the_end).ok());
    QCOMPARE(past_the_end.kind(), proto::SplitReply::SPLIT);
    for (std::uint32_t consumer = 0; consumer < 2; ++consumer) QVERIFY(report(past_the_end, consumer, proto::SplitReport::EMPTY, 0).ok());
    for (std::uint32_t consumer = 0; consumer < 2; ++consumer) {
      proto::SplitReply last;
      QVERIFY(ask(consumer, 2, 0, last).ok());
      QVERIFY2(last.kind() == proto::SplitReply::END, (std::to_string(consumer) + ": " + last.waiting_for()).c_str());
    }
  }

  // A reader that takes splits and is never heard from again (a process asking as a reader, or a
  // trainer killed) does not leave the job's trainers waiting for ever: its splits come back, and
  // a late report of one says it was taken back instead of counting it.
  void splits_held_by_a_reader_no_trainer_stands_behind_come_back() {
    DispatcherOptions options;
    options.heartbeat = std::chrono::milliseconds(100);
    Dispatcher dispatcher(options);
    const std::string token = sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {});
    const Caller trainer(dispatcher.port(), token), intruder(dispatcher.port(), token);
    QVERIFY(trainer.register_worker("127.0.0.1:1").ok());
    std::uint64_t job = 0;
    QVERIFY(trainer.take_job("T", job).ok());
    proto::SplitReply stolen;
    QVERIFY(intruder.split(job, "intruder-0", 1, stolen).ok());
    QCOMPARE(stolen.split(), 0u);

    // The trainer keeps reading (and saying so); split 0 comes back to it within the dispatcher's
    // 10 s for trainers not heard from.
    bool back = false;
    std::uint64_t sequence = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!back && std::chrono::steady_clock::now() < give_up) {
      QVERIFY(trainer.heartbeat(job, "T").ok());
      QVERIFY(trainer.worker_alive().ok());
      proto::SplitReply reply;
      QVERIFY(trainer.split(job, "T-0", ++sequence, reply).ok());
      if (reply.kind() == proto::SplitReply::SPLIT) {
        back = reply.split() == 0;
        QVERIFY(trainer.report_done(job, reply, "T-0").ok());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    QVERIFY2(back, "split 0, taken by a reader never heard from, was handed out again");
    const grpc::Status late = intruder.report_done(job, stolen, "intruder-0");
    QVERIFY2(late.error_code() == grpc::StatusCode::FAILED_PRECONDITION, code_of(late).c_str());
    QVERIFY(late.error_message().find("taken back from this trainer") != std::string::npos);
  }

  // A dispatcher restarted on its journal gives the jobs it restores time for their trainers'
  // heartbeats (they come every second) before it takes them as over; the splits in their
  // readers' hands stay theirs meanwhile.
  void restored_jobs_wait_for_their_trainers_heartbeats() {
    QTemporaryDir work;
    DispatcherOptions options;
    options.work_dir = work.path().toStdString();
    options.heartbeat = std::chrono::milliseconds(100);
    auto dispatcher = std::make_unique<Dispatcher>(options);
    options.port = dispatcher->port();
    const std::string token = sluice::service::detail::client_token("127.0.0.1:" + std::to_string(options.port), {});
    const Caller trainer(options.port, token);
    QVERIFY(trainer.register_worker("127.0.0.1:1").ok());
    std::uint64_t job = 0;
    QVERIFY(trainer.take_job("T", job).ok());
    proto::SplitReply held;
    QVERIFY(trainer.split(job, "T-0", 1, held).ok());
    QCOMPARE(held.kind(), proto::SplitReply::SPLIT);
    dispatcher.reset();

    dispatcher = std::make_unique<Dispatcher>(options);  // the same port and journal
    const Caller again(options.port, sluice::service::detail::client_token("127.0.0.1:" + std::to_string(options.port), {}));
    QCOMPARE(again.token, token);  // kept with the journal: the trainer is not refused
    std::this_thread::sleep_for(std::chrono::seconds(3));  // (the trainer's heartbeats were late)
    proto::JobClientReply known;
    proto::JobClientRequest heartbeat;
    heartbeat.set_job_id(job);
    heartbeat.set_client("T");
    QVERIFY(again.stub->JobClient(again.context().get(), heartbeat, &known).ok());
    QVERIFY2(known.known(), "the restored job was taken as over before its trainer could be heard from");
    QVERIFY2(again.report_done(job, held, "T-0").ok(), "the split in the trainer's hands stayed its own");
    sluice::service::detail::forget_own_token(options.port, token);
  }

  // A message of hundreds of megabytes from a local process does not grow the dispatcher: without
  // the token it is refused before its body is read; with it, the dispatcher's connections are held
  // to a bounded memory (gRPC reads a whole message before it checks its size).
  void a_huge_message_does_not_grow_the_dispatcher() {
    QProcess dispatcher;
    dispatcher.setProcessChannelMode(QProcess::MergedChannels);
    dispatcher.start(SLUICE_CLI, {"dispatcher", "--port", "0"});
    QString said;
    QRegularExpressionMatch listening;
    for (int i = 0; i < 200 && !listening.hasMatch(); ++i) {
      dispatcher.waitForReadyRead(100);
      said += QString::fromUtf8(dispatcher.readAll());
      listening = QRegularExpression("listening on \\S+:(\\d+)").match(said);
    }
    QVERIFY2(listening.hasMatch(), qPrintable(said));
    const int port = listening.captured(1).toInt();
    auto peak_kb = [&] {
      QFile status(QString("/proc/%1/status").arg(dispatcher.processId()));
      status.open(QIODevice::ReadOnly);
      const auto m = QRegularExpression("VmHWM:\\s+(\\d+)").match(QString::fromUtf8(status.readAll()));
      return m.captured(1).toLongLong();
    };
    const long long before = peak_kb();
    proto::JobRequest huge;
    huge.set_job_name("huge");
    huge.mutable_pipeline()->assign(std::size_t{300} << 20, 'x');
    proto::JobReply reply;
    const Caller stranger(port, "");
    const grpc::Status refused = stranger.stub->GetOrCreateJob(stranger.context().get(), huge, &reply);
    QVERIFY2(refused.error_code() == grpc::StatusCode::UNAUTHENTICATED, code_of(refused).c_str());
    const long long after_stranger = peak_kb();
    const Caller owner(port, sluice::service::detail::client_token("127.0.0.1:" + std::to_string(port), {}));
    const grpc::Status bounded = owner.stub->GetOrCreateJob(owner.context().get(), huge, &reply);
    QVERIFY2(!bounded.ok(), code_of(bounded).c_str());
    const long long after_owner = peak_kb();
    dispatcher.terminate();
    dispatcher.waitForFinished(10000);
    qInfo("dispatcher's peak: %lld kB at start, %lld after 300 MB without the token, %lld after 300 MB with it", before, after_stranger,
          after_owner);
    QVERIFY2(after_stranger - before < 16 * 1024, "a call without the token has its body read");
    QVERIFY2(after_owner - before < 128 * 1024, "a message with the token is buffered whole");
  }

  // A split handed out while the journal cannot be written is not answered, and asking again
  // does not get it either until the journal takes it: a dispatcher restarted on its journal
  // would otherwise hand the same split again.
  void a_decision_the_journal_cannot_keep_is_not_answered() {
    QTemporaryDir work;
    DispatcherOptions options;
    options.work_dir = work.path().toStdString();
    Dispatcher dispatcher(options);
    const std::string token = sluice::service::detail::client_token("127.0.0.1:" + std::to_string(dispatcher.port()), {});
    const Caller trainer(dispatcher.port(), token);
    QVERIFY(trainer.register_worker("127.0.0.1:1").ok());
    std::uint64_t job = 0;
    QVERIFY(trainer.take_job("T", job).ok());
    const auto journal = std::filesystem::path(options.work_dir) / "dispatcher.journal";
    QVERIFY(std::filesystem::remove(journal));
    std::filesystem::create_directory(journal);  // the journal can no longer be written (as on a full disk)

    proto::SplitReply reply;
    const grpc::Status first = trainer.split(job, "T-0", 1, reply);
    QVERIFY2(first.error_code() == grpc::StatusCode::UNAVAILABLE, code_of(first).c_str());
    const grpc::Status again = trainer.split(job, "T-0", 1, reply);  // the same question asked again
    QVERIFY2(again.error_code() == grpc::StatusCode::UNAVAILABLE, code_of(again).c_str());

    std::filesystem::remove(journal);
    QVERIFY(trainer.split(job, "T-0", 1, reply).ok());
    QCOMPARE(reply.kind(), proto::SplitReply::SPLIT);
    QCOMPARE(reply.split(), 0u);
    QVERIFY(std::filesystem::is_regular_file(journal));
    sluice::service::detail::forget_own_token(dispatcher.port(), token);
  }
};

QTEST_GUILESS_MAIN(TestServicePeers)
#include "tst_service_peers.moc"
