// The same seed gives byte-identical output at any parallelism; another seed gives another.
#include <QtTest>

#include "pipeline_runner.hpp"

using namespace sluice::test;

namespace {
std::string pipeline(int parallelism, int seed, bool deterministic = true) {
  std::string p = std::to_string(parallelism);
  return "options { seed: " + std::to_string(seed) + " deterministic: " + (deterministic ? "true" : "false") + " }\n" +
         stage("src", "range", "", {{"count", "3000"}}) +
         stage("drop", "filter_random", "src", {{"p", "0.7"}}, "parallelism: " + p) +
         stage("work", "simulate_work", "drop", {{"us", "0"}, {"jitter_us", "30"}}, "parallelism: " + p) +
         stage("shuf", "shuffle", "work", {{"buffer_size", "500"}}) + stage("rep", "repeat", "shuf", {{"count", "2"}}) +
         stage("batch", "batch", "rep", {{"batch_size", "32"}}) + sink_after("batch");
}
std::string joined(const RunOutput& out) {
  std::string s;
  for (const auto& l : out.lines) s += l + "\n";
  return s;
}
}  // namespace

class TestDeterminism : public QObject {
  Q_OBJECT
 private slots:
  void same_seed_same_bytes_at_parallelism_1_2_8() {
    auto one = run_text(pipeline(1, 42));
    QCOMPARE(one.result.state, sluice::RunState::Finished);
    QVERIFY(one.lines.size() > 100);
    for (int parallelism : {2, 8}) {
      auto other = run_text(pipeline(parallelism, 42));
      QCOMPARE(other.result.state, sluice::RunState::Finished);
      QVERIFY2(joined(other) == joined(one), qPrintable(QString("parallelism %1 differs from 1").arg(parallelism)));
    }
  }

  void another_seed_gives_another_output() {
    auto a = run_text(pipeline(2, 42));
    auto b = run_text(pipeline(2, 43));
    QVERIFY(joined(a) != joined(b));
  }

  void repeated_runs_are_identical() {
    auto a = run_text(pipeline(8, 5));
    auto b = run_text(pipeline(8, 5));
    QCOMPARE(joined(a), joined(b));
  }

  void fused_and_separate_stages_give_the_same_bytes() {
    std::string body = stage("src", "range", "", {{"count", "2000"}}) +
                       stage("work", "simulate_work", "src", {{"us", "0"}, {"jitter_us", "10"}}, "parallelism: 4") +
                       stage("drop", "filter_random", "work", {{"p", "0.5"}}, "parallelism: 4") + sink_after("drop");
    auto fused = run_text("options { seed: 11 fuse_stages: true }\n" + body);
    auto separate = run_text("options { seed: 11 fuse_stages: false }\n" + body);
    QCOMPARE(fused.snapshot.stage(2).fused_with(), std::string("work"));
    QVERIFY(separate.snapshot.stage(2).fused_with().empty());
    QVERIFY(fused.lines.size() > 800);
    QCOMPARE(joined(fused), joined(separate));
  }

  void non_deterministic_mode_keeps_every_element() {
    // Completion order may differ, but the elements kept are the same: the decision is per element.
    std::string text = "options { seed: 9 deterministic: false }\n" + stage("src", "range", "", {{"count", "2000"}}) +
                       stage("drop", "filter_random", "src", {{"p", "0.5"}}, "parallelism: 4") +
                       stage("work", "simulate_work", "drop", {{"us", "0"}, {"jitter_us", "20"}}, "parallelism: 4") + sink_after("work");
    auto unordered = run_text(text);
    std::string ordered_text = text;
    ordered_text.replace(ordered_text.find("deterministic: false"), 20, "deterministic: true");
    auto ordered = run_text(ordered_text);
    auto a = all_integers(unordered.lines), b = all_integers(ordered.lines);
    std::sort(a.begin(), a.end());
    QVERIFY(std::is_sorted(b.begin(), b.end()));
    QCOMPARE(a, b);
  }
};

QTEST_APPLESS_MAIN(TestDeterminism)
#include "tst_determinism.moc"
