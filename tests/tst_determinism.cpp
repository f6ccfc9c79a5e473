// The same seed gives byte-identical output at any parallelism; another seed gives another.
#include <QtTest>

#include <filesystem>
#include <numeric>
#include <set>

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

  // A random map or filter that repeat runs again for every epoch (it sits before the repeat, so
  // each pass restarts its element indices) draws anew in every epoch: the epoch is part of each
  // element's key. The draws are still the same at parallelism 1 and 4. (After the repeat the
  // indices run on across epochs, as in tf.data, where the stream is one long iteration.)
  void random_stages_repeated_by_repeat_draw_anew_each_epoch_at_any_parallelism() {
    constexpr int kEpochs = 3;
    using Params = std::vector<std::pair<std::string, std::string>>;
    struct Case {
      const char* op;
      Params params;
      std::string source;
      int elements_per_epoch;  // 0: a filter over a range, whose epochs start where the values fall back
      bool after_slow_map = false;  // fused after 100 us of work per element: the group runs element by element
    };
    const std::string images = stage("src", "synthetic_images", "", {{"count", "16"}, {"height", "4"}, {"width", "6"}});
    const std::vector<Case> cases = {
        {"filter_random", {{"p", "0.5"}}, stage("src", "range", "", {{"count", "200"}}), 0},
        {"random_flip", {{"direction", "horizontal"}}, images, 16},
        {"random_brightness", {{"max_delta", "0.2"}}, images, 16},
        {"filter_random", {{"p", "0.5"}}, stage("src", "range", "", {{"count", "200"}}), 0, true},
    };
    for (const auto& c : cases) {
      auto epochs_at = [&](int parallelism) {
        const std::string workers = "parallelism: " + std::to_string(parallelism);
        const std::string slow = c.after_slow_map ? stage("work", "simulate_work", "src", {{"us", "100"}}, workers) : "";
        auto out = run_text("options { seed: 21 }\n" + c.source + slow + stage("rand", c.op, c.after_slow_map ? "work" : "src", c.params, workers) +
                            stage("rep", "repeat", "rand", {{"count", std::to_string(kEpochs)}}) + sink_after("rep"));
        std::vector<std::vector<std::string>> epochs(kEpochs + 1);  // the last gathers any excess
        if (out.result.state != sluice::RunState::Finished) return epochs;
        if (c.after_slow_map) {
          bool fused = false;
          for (const auto& m : out.snapshot.stage()) fused = fused || (m.id() == "rand" && m.fused_with() == "work");
          if (!fused) return std::vector<std::vector<std::string>>{};  // the case would not test what it is for
        }
        if (c.elements_per_epoch > 0) {
          for (std::size_t i = 0; i < out.lines.size(); ++i)
            epochs[std::min<std::size_t>(i / c.elements_per_epoch, kEpochs)].push_back(out.lines[i]);
        } else {
          const auto values = all_integers(out.lines);
          std::size_t epoch = 0;
          for (std::size_t i = 0; i < values.size(); ++i) {
            if (i > 0 && values[i] < values[i - 1]) ++epoch;
            epochs[std::min<std::size_t>(epoch, kEpochs)].push_back(std::to_string(values[i]));
          }
        }
        return epochs;
      };
      const QString label = QString(c.op) + (c.after_slow_map ? " (fused after a slow map)" : "");
      const auto serial = epochs_at(1);
      QVERIFY2(!serial.empty(), qPrintable(QString("%1 was not fused with the slow map before it").arg(label)));
      QVERIFY2(serial[kEpochs].empty(), qPrintable(label));
      for (int e = 0; e < kEpochs; ++e) {
        QVERIFY2(!serial[e].empty(), qPrintable(QString("%1: epoch %2 is empty").arg(label).arg(e)));
        if (c.elements_per_epoch > 0) QCOMPARE(serial[e].size(), std::size_t(c.elements_per_epoch));
        for (int earlier = 0; earlier < e; ++earlier)
          QVERIFY2(serial[e] != serial[earlier], qPrintable(QString("%1: epoch %2 drew what epoch %3 drew").arg(label).arg(e).arg(earlier)));
      }
      QVERIFY2(epochs_at(4) == serial, qPrintable(QString("%1: parallelism 4 differs from 1").arg(label)));
    }
  }

  // A run that continues earlier ones (EngineOptions::first_epoch, Python's next iter()) gives
  // what one run with a repeat at its end gives: run k starts at epoch k, a repeat upstream scales
  // it, and shuffles, random stages and a file cache draw and replay as in the one long run.
  void consecutive_runs_continue_the_epochs_of_one_repeating_run() {
    constexpr int kRuns = 3;
    QTemporaryDir dir;
    const std::string cache_file = dir.path().toStdString() + "/epochs.cache";
    struct Case {
      const char* name;
      std::string body;  // ends with stage "last"
    };
    const std::vector<Case> cases = {
        {"random filter, shuffle, batch",
         stage("src", "range", "", {{"count", "300"}}) + stage("drop", "filter_random", "src", {{"p", "0.7"}}, "parallelism: 4") +
             stage("shuf", "shuffle", "drop", {{"buffer_size", "64"}}) + stage("last", "batch", "shuf", {{"batch_size", "8"}})},
        {"a repeat before the shuffle",
         stage("src", "range", "", {{"count", "50"}}) + stage("drop", "filter_random", "src", {{"p", "0.5"}}) +
             stage("rep", "repeat", "drop", {{"count", "2"}}) + stage("last", "shuffle", "rep", {{"buffer_size", "100"}})},
        {"a file cache before the shuffle",
         stage("src", "range", "", {{"count", "80"}}) + stage("drop", "filter_random", "src", {{"p", "0.5"}}) +
             stage("keep", "cache", "drop", {{"path", cache_file}}) + stage("last", "shuffle", "keep", {{"buffer_size", "100"}})},
    };
    for (const auto& c : cases) {
      const QString label = c.name;
      const std::string options = "options { seed: 17 }\n";
      std::filesystem::remove(cache_file);
      const auto one = run_text(options + c.body + stage("more", "repeat", "last", {{"count", std::to_string(kRuns)}}) + sink_after("more"));
      QVERIFY2(one.result.state == sluice::RunState::Finished, qPrintable(label + ": " + QString::fromStdString(one.error + one.result.error)));
      std::filesystem::remove(cache_file);
      std::vector<std::string> runs;
      std::vector<std::string> first_run;
      for (int k = 0; k < kRuns; ++k) {
        sluice::EngineOptions engine_options;
        engine_options.first_epoch = static_cast<std::uint64_t>(k);
        const auto run = run_text(options + c.body + sink_after("last"), {}, engine_options);
        QVERIFY2(run.result.state == sluice::RunState::Finished, qPrintable(label + ": " + QString::fromStdString(run.error + run.result.error)));
        if (k == 0) first_run = run.lines;
        else QVERIFY2(run.lines != first_run, qPrintable(label + QString(": run %1 repeated run 0").arg(k)));
        runs.insert(runs.end(), run.lines.begin(), run.lines.end());
      }
      QVERIFY2(runs.size() > 30, qPrintable(label));
      QVERIFY2(runs == one.lines, qPrintable(label + ": three runs differ from one run repeating three times"));
    }
  }

  // A cache in memory records the first iteration of its run, whatever that iteration's epoch.
  void memory_cache_replays_in_a_run_that_starts_at_a_later_epoch() {
    sluice::EngineOptions options;
    options.first_epoch = 4;
    const auto out = run_text(stage("src", "range", "", {{"count", "10"}}) + stage("keep", "cache", "src") +
                                  stage("rep", "repeat", "keep", {{"count", "3"}}) + sink_after("rep"),
                              {}, options);
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.lines.size(), std::size_t(30));
    QCOMPARE(out.snapshot.stage(0).elements_out(), std::uint64_t(10));  // read once, replayed twice
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

  // tf.data's map(..., deterministic=False): one stage gives up its order, the others keep the
  // pipeline's; and a stage may keep order in a pipeline that does not.
  void a_stage_sets_its_own_order() {
    auto text = [](const std::string& pipeline, const std::string& stage_setting) {
      return "options { seed: 9 " + pipeline + " }\n" + stage("src", "range", "", {{"count", "600"}}) +
             stage("work", "simulate_work", "src", {{"us", "0"}, {"jitter_us", "300"}}, "parallelism: 4 " + stage_setting) +
             sink_after("work");
    };
    auto values = [](const RunOutput& out) {
      if (out.result.state != sluice::RunState::Finished) qFatal("run failed: %s %s", out.error.c_str(), out.result.error.c_str());
      return all_integers(out.lines);
    };
    std::vector<long long> all(600);
    std::iota(all.begin(), all.end(), 0);
    QCOMPARE(values(run_text(text("deterministic: false", "deterministic: true"))), all);
    // Completion order differs from input order on 4 jittered workers nearly always; five tries
    // make a false failure vanishingly rare.
    bool reordered = false;
    for (int attempt = 0; attempt < 5 && !reordered; ++attempt) {
      auto got = values(run_text(text("", "deterministic: false")));
      QCOMPARE(std::multiset<long long>(got.begin(), got.end()), std::multiset<long long>(all.begin(), all.end()));
      reordered = got != all;
    }
    QVERIFY2(reordered, "a stage with deterministic: false kept input order in five runs");
    // Such a stage makes the run's order depend on timing: no exact checkpoint.
    sluice::Engine engine(graph_of(text("", "deterministic: false")));
    const auto refusals = engine.checkpoint_refusals();
    QCOMPARE(refusals.size(), std::size_t(1));
    QVERIFY2(refusals[0].find("'work'") != std::string::npos && refusals[0].find("deterministic: false") != std::string::npos,
             refusals[0].c_str());
  }
};

QTEST_APPLESS_MAIN(TestDeterminism)
#include "tst_determinism.moc"
