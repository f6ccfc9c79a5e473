// The dispatcher's ledger of a job's splits in DYNAMIC mode (core/service/src/job_ledger.hpp):
// trainers take splits as they go, a split whose worker died comes back from where its trainer
// stopped, the epoch ends where the source does, and every split is delivered once.
#include <QtTest>

#include <map>
#include <random>

#include "job_ledger.hpp"

using sluice::service::JobLedger;

class TestJobLedger : public QObject {
  Q_OBJECT
 private slots:
  // The least loaded alive worker makes each new split: a worker that finishes sooner gets more.
  void splits_go_to_the_least_loaded_worker() {
    JobLedger ledger;
    JobLedger::Given g;
    QCOMPARE(ledger.next_split({7, 9}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 0u);
    QCOMPARE(g.worker, 7u);
    QCOMPARE(ledger.next_split({7, 9}, g), JobLedger::Next::Split);
    QCOMPARE(g.worker, 9u);
    ledger.done(0);  // worker 7 was quick
    QCOMPARE(ledger.next_split({7, 9}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 2u);
    QCOMPARE(g.worker, 7u);
    QCOMPARE(ledger.next_split({}, g), JobLedger::Next::Wait);  // no worker alive: nothing to hand out
  }

  // A split given back is handed out before any new one, from the elements received.
  void a_split_given_back_comes_again_from_where_it_stopped() {
    JobLedger ledger;
    JobLedger::Given g;
    for (int i = 0; i < 3; ++i) ledger.next_split({1, 2}, g);
    ledger.give_back(1, 40);
    QCOMPARE(ledger.next_split({2}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QCOMPARE(g.skip, 40u);
    QCOMPARE(g.worker, 2u);
    // Given back twice (a second worker died too): from the furthest received.
    ledger.give_back(1, 55);
    QCOMPARE(ledger.next_split({2}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QCOMPARE(g.skip, 55u);
  }

  // The first empty split ends the epoch: nothing past it is handed out or made again, the
  // trainers wait while others hold splits, and it ends when every split before it is done.
  void the_epoch_ends_where_the_source_does() {
    JobLedger ledger;
    JobLedger::Given g;
    for (int i = 0; i < 5; ++i) QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Split);
    ledger.ended_at(3);
    QCOMPARE(ledger.end(), std::optional<std::uint64_t>(3));
    QCOMPARE(ledger.in_hand(), 3u);  // 0, 1, 2 (4 dropped: past the end)
    ledger.give_back(4, 0);
    QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Wait);
    ledger.done(0);
    ledger.done(2);
    ledger.give_back(1, 3);
    QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QVERIFY(!ledger.finished());
    ledger.done(1);
    QVERIFY(ledger.finished());
    QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::End);
    QCOMPARE(ledger.done_count(), 3u);
  }

  // Trainers and failing workers at random: each split of the epoch is delivered exactly once,
  // element by element, as the trainers drop nothing and receive nothing twice.
  void random_failures_deliver_every_element_once() {
    for (int seed = 0; seed < 50; ++seed) {
      std::mt19937 random(seed);
      const std::uint64_t splits = 1 + random() % 30, per_split = 10;
      JobLedger ledger;
      std::map<std::uint64_t, int> delivered;  // element (split * per_split + position) -> times
      std::vector<std::uint64_t> alive{1, 2, 3};
      int rounds = 0;
      for (JobLedger::Given g; rounds < 10000; ++rounds) {
        const auto next = ledger.next_split(alive, g);
        if (next == JobLedger::Next::End) break;
        QCOMPARE(next, JobLedger::Next::Split);  // one trainer at a time: never waits
        if (g.split >= splits) {  // the source has no such split
          ledger.ended_at(g.split);
          continue;
        }
        // The worker sends from g.skip; it may die after some of them.
        const bool dies = random() % 3 == 0;
        const std::uint64_t upto = dies ? g.skip + random() % (per_split - g.skip + 1) : per_split;
        for (std::uint64_t p = g.skip; p < upto; ++p) ++delivered[g.split * per_split + p];
        if (dies && upto < per_split) ledger.give_back(g.split, upto);
        else ledger.done(g.split);
      }
      QVERIFY(rounds < 10000);
      QCOMPARE(delivered.size(), static_cast<std::size_t>(splits * per_split));
      for (const auto& [element, times] : delivered) QCOMPARE(times, 1);
    }
  }
};

QTEST_APPLESS_MAIN(TestJobLedger)
#include "tst_job_ledger.moc"
