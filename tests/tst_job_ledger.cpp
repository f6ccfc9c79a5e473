// The dispatcher's ledger of a job's splits (core/service/src/job_ledger.hpp): trainers take
// splits as they go, a split whose worker died comes back from where its trainer stopped, the
// epoch ends where the source does (DYNAMIC) or after its copies or shards (OFF, static), stale
// reports change nothing, and every split is delivered once, across a save and restore too.
#include <QtTest>

#include <map>
#include <random>

#include "job_ledger.hpp"
#include "service.pb.h"

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
    QVERIFY(ledger.done(0, 1));  // worker 7 was quick
    QCOMPARE(ledger.next_split({7, 9}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 2u);
    QCOMPARE(g.worker, 7u);
    QCOMPARE(ledger.next_split({}, g), JobLedger::Next::Wait);  // no worker alive: nothing to hand out
  }

  // A split given back is handed out before any new one, from the elements received.
  void a_split_given_back_comes_again_from_where_it_stopped() {
    JobLedger ledger;
    JobLedger::Given g;
    std::map<std::uint64_t, std::uint64_t> lease;
    for (int i = 0; i < 3; ++i) {
      ledger.next_split({1, 2}, g);
      lease[g.split] = g.lease;
    }
    QVERIFY(ledger.give_back(1, lease[1], 40));
    QCOMPARE(ledger.next_split({2}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QCOMPARE(g.skip, 40u);
    QCOMPARE(g.worker, 2u);
    // The same report again (sent twice) changes nothing: the split is in other hands now.
    QVERIFY(!ledger.give_back(1, lease[1], 40));
    QVERIFY(!ledger.done(1, lease[1]));
    QCOMPARE(ledger.in_hand(), 3u);
    // Given back twice (a second worker died too): from the furthest received.
    QVERIFY(ledger.give_back(1, g.lease, 55));
    QCOMPARE(ledger.next_split({2}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QCOMPARE(g.skip, 55u);
  }

  // Coordinated reads: a split whose worker died is handed out again at once, the same split (it
  // keeps its lane's place), by another worker, under a new lease; the old lease is then stale.
  void a_coordinated_split_is_handed_again_in_place() {
    JobLedger ledger;
    JobLedger::Given first, again;
    QCOMPARE(ledger.next_split({3, 4}, first), JobLedger::Next::Split);
    QCOMPARE(ledger.hand_again(first.split, first.lease, 12, {}, again), JobLedger::Next::Wait);  // no worker alive yet
    QCOMPARE(ledger.hand_again(first.split, first.lease, 12, {4}, again), JobLedger::Next::Split);
    QCOMPARE(again.split, first.split);
    QCOMPARE(again.skip, 12u);
    QCOMPARE(again.worker, 4u);
    QVERIFY(again.lease != first.lease);
    QCOMPARE(ledger.hand_again(first.split, first.lease, 20, {4}, again), JobLedger::Next::End);  // stale: nothing handed
    QVERIFY(!ledger.done(first.split, first.lease));
    QCOMPARE(ledger.in_hand(), 1u);
    QVERIFY(ledger.done(again.split, again.lease));
    QCOMPARE(ledger.done_count(), 1u);
  }

  // The first empty split ends the epoch: nothing past it is handed out or made again, the
  // trainers wait while others hold splits, and it ends when every split before it is done.
  void the_epoch_ends_where_the_source_does() {
    JobLedger ledger;
    JobLedger::Given g;
    std::map<std::uint64_t, std::uint64_t> lease;
    for (int i = 0; i < 5; ++i) {
      QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Split);
      lease[g.split] = g.lease;
    }
    QVERIFY(ledger.ended_at(3, lease[3]));
    QCOMPARE(ledger.end(), std::optional<std::uint64_t>(3));
    QCOMPARE(ledger.in_hand(), 3u);  // 0, 1, 2 (4 dropped: past the end)
    QVERIFY(!ledger.give_back(4, lease[4], 0));
    QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Wait);
    QVERIFY(ledger.done(0, lease[0]));
    QVERIFY(ledger.done(2, lease[2]));
    QVERIFY(ledger.give_back(1, lease[1], 3));
    QCOMPARE(ledger.next_split({1}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QVERIFY(!ledger.finished());
    QVERIFY(ledger.done(1, g.lease));
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
          QVERIFY(ledger.ended_at(g.split, g.lease));
          continue;
        }
        // The worker sends from g.skip; it may die after some of them.
        const bool dies = random() % 3 == 0;
        const std::uint64_t upto = dies ? g.skip + random() % (per_split - g.skip + 1) : per_split;
        for (std::uint64_t p = g.skip; p < upto; ++p) ++delivered[g.split * per_split + p];
        if (dies && upto < per_split) QVERIFY(ledger.give_back(g.split, g.lease, upto));
        else QVERIFY(ledger.done(g.split, g.lease));
        // Now and then the dispatcher restarts from its journal.
        if (random() % 7 == 0) {
          sluice::service::proto::LedgerState saved;
          ledger.save(saved);
          ledger = JobLedger::restore(saved);
        }
      }
      QVERIFY(rounds < 10000);
      QCOMPARE(delivered.size(), static_cast<std::size_t>(splits * per_split));
      for (const auto& [element, times] : delivered) QCOMPARE(times, 1);
    }
  }

  // OFF and static modes: a fixed number of splits (copies, shards), each made by its own worker
  // while that one can; one whose worker is gone goes to another, from where its trainer stopped.
  void fixed_splits_go_to_their_own_workers() {
    JobLedger ledger({4, 5, 6});
    QVERIFY(ledger.fixed());
    JobLedger::Given g;
    QCOMPARE(ledger.next_split({4, 5, 6}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 0u);
    QCOMPARE(g.worker, 4u);
    QCOMPARE(ledger.next_split({4, 5, 6}, g), JobLedger::Next::Split);
    QCOMPARE(g.worker, 5u);
    QVERIFY(ledger.give_back(1, g.lease, 17));  // worker 5 died
    QCOMPARE(ledger.next_split({4, 6}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 1u);
    QCOMPARE(g.skip, 17u);
    QVERIFY(g.worker == 6u);  // the least loaded of those left
    const auto lease1 = g.lease;
    QCOMPARE(ledger.next_split({4, 5, 6}, g), JobLedger::Next::Split);
    QCOMPARE(g.split, 2u);
    QCOMPARE(g.worker, 6u);
    QVERIFY(!ledger.ended_at(2, g.lease));  // a fixed epoch has no source end to find
    QCOMPARE(ledger.next_split({4, 5, 6}, g), JobLedger::Next::Wait);
    QVERIFY(ledger.done(0, 1) && ledger.done(1, lease1) && ledger.done(2, lease1 + 1));
    QCOMPARE(ledger.next_split({4, 5, 6}, g), JobLedger::Next::End);
  }

  // The journal's form of a ledger in mid-epoch continues as the ledger would have.
  void a_saved_ledger_continues_where_it_was() {
    JobLedger ledger;
    JobLedger::Given g, a, b;
    for (int i = 0; i < 4; ++i) ledger.next_split({1, 2}, g);
    QVERIFY(ledger.done(0, 1));
    QVERIFY(ledger.give_back(2, 3, 9));
    sluice::service::proto::LedgerState saved;
    ledger.save(saved);
    JobLedger restored = JobLedger::restore(saved);
    QCOMPARE(restored.in_hand(), ledger.in_hand());
    QCOMPARE(restored.done_count(), 1u);
    QCOMPARE(ledger.next_split({1, 2}, a), JobLedger::Next::Split);
    QCOMPARE(restored.next_split({1, 2}, b), JobLedger::Next::Split);
    QCOMPARE(b.split, a.split);
    QCOMPARE(b.skip, 9u);
    QCOMPARE(b.worker, a.worker);
    QCOMPARE(b.lease, a.lease);
    QVERIFY(restored.done(1, 2));  // a split handed out before the restart is reported after it
  }
};

QTEST_APPLESS_MAIN(TestJobLedger)
#include "tst_job_ledger.moc"
