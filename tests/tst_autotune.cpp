// AUTOTUNE as users rely on it: workers go where the work is, the CPU and RAM budgets hold, the
// output does not depend on what the tuner chose, and the default budget is what the process may
// really use.
#include <QtTest>

#include <ctime>
#include <mutex>

#include "engine/autotune.hpp"
#include "pipeline_runner.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/resources.hpp"
#include "sluice/core/text.hpp"

using namespace sluice::test;

namespace {

double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

const sluice::metrics::StageMetrics& stage_of(const sluice::metrics::MetricsSnapshot& s, const std::string& id) {
  for (const auto& m : s.stage())
    if (m.id() == id) return m;
  throw std::runtime_error("no stage " + id);
}

// Runs `text` to its end, calling `watch` with every snapshot the engine publishes.
sluice::RunResult run_watched(const std::string& text, const std::function<void(const sluice::metrics::MetricsSnapshot&)>& watch,
                              sluice::metrics::MetricsSnapshot* final_snapshot = nullptr) {
  sluice::EngineOptions options;
  options.snapshot_interval = std::chrono::milliseconds(50);
  sluice::Engine engine(graph_of(text), options);
  engine.subscribe(watch);
  engine.start();
  auto result = engine.wait();
  if (final_snapshot) *final_snapshot = engine.snapshot();
  return result;
}

// SLUICE_SANITIZED: tests/CMakeLists.txt defines it in the sanitizer builds.
#ifdef SLUICE_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

}  // namespace

class TestAutotune : public QObject {
  Q_OBJECT
 private slots:
  // Two stages trade costs half-way: the workers follow the work. The budget is 4 cores whatever
  // the machine, so the counts do not depend on where the test runs.
  void workers_move_to_the_stage_whose_cost_grows() {
    constexpr int kSwitch = 4000;
    const std::string text = "options { seed: 3 fuse_stages: false autotune { cpu_budget: 4 } }\n" +
                             stage("src", "range", "", {{"count", std::to_string(2 * kSwitch)}}) +
                             stage("first", "simulate_work", "src", {{"us", "800"}, {"later_us", "20"}, {"later_from", std::to_string(kSwitch)}},
                                   "parallelism: -1") +
                             stage("second", "simulate_work", "first", {{"us", "20"}, {"later_us", "800"}, {"later_from", std::to_string(kSwitch)}},
                                   "parallelism: -1") +
                             stage("out", "null_sink", "second");
    std::mutex mutex;
    int first_ahead_before_switch = 0, second_ahead_after_switch = 0;
    sluice::metrics::MetricsSnapshot last;
    auto result = run_watched(text, [&](const sluice::metrics::MetricsSnapshot& s) {
      const auto &first = stage_of(s, "first"), &second = stage_of(s, "second");
      std::lock_guard lock(mutex);
      if (second.elements_in() < kSwitch * 9 / 10 && first.workers() > second.workers()) ++first_ahead_before_switch;
      if (second.elements_in() > kSwitch * 3 / 2 && second.workers() > first.workers()) ++second_ahead_after_switch;
    }, &last);
    QCOMPARE(result.state, sluice::RunState::Finished);
    QVERIFY2(first_ahead_before_switch > 0, "the costly first stage never had more workers than the cheap second one");
    QVERIFY2(second_ahead_after_switch > 0, "after the costs traded places, the workers did not follow");
    QVERIFY(stage_of(last, "first").workers_tuned());
    QCOMPARE(stage_of(last, "first").max_workers(), 4u);
    // Each decision is in the metrics with its reason.
    bool second_grew = false;
    for (const auto& c : last.autotune().changes())
      second_grew = second_grew || (c.stage() == "second" && c.what() == "workers" && c.to() > c.from() && !c.reason().empty());
    QVERIFY(second_grew);
    const std::string report = sluice::format_report(last);
    QVERIFY2(report.find("Autotune: budget 4 cores (options.autotune.cpu_budget)") != std::string::npos, report.c_str());
    QVERIFY2(report.find("second: 1 worker -> ") != std::string::npos, report.c_str());
  }

  // cpu_budget: 1 on a machine with more: the pipeline's busy time stays at one core on average
  // (measured as the process's CPU time over the run), however many workers the stages get.
  void a_budget_of_one_core_keeps_the_work_to_one_core() {
    const std::string text = "options { seed: 3 fuse_stages: false autotune { cpu_budget: 1 } }\n" +
                             stage("src", "range", "", {{"count", "6000"}}) +
                             stage("a", "simulate_work", "src", {{"us", "200"}}, "parallelism: -1") +
                             stage("b", "simulate_work", "a", {{"us", "100"}}, "parallelism: -1") + stage("out", "null_sink", "b");
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    sluice::metrics::MetricsSnapshot last;
    auto result = run_watched(text, [](const sluice::metrics::MetricsSnapshot&) {}, &last);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cores = (process_cpu_seconds() - cpu0) / wall;
    QCOMPARE(result.state, sluice::RunState::Finished);
    QCOMPARE(stage_of(last, "out").elements_in(), std::uint64_t(6000));
    // The stages that are not tuned (source, sink) and the engine's own threads are not throttled:
    // a few percent here, more under a sanitizer's instrumentation.
    const double allowed = kSanitized ? 1.3 : 1.1;
    qInfo("busy cores on a budget of 1: %.2f", cores);
    QVERIFY2(cores <= allowed, qPrintable(QString("the run kept %1 cores busy on a budget of 1").arg(cores)));
  }

  // Buffers asked for 1,000 elements of 64 KiB each (64 MiB a buffer) under a RAM budget of
  // 48 MiB: the buffers hold at most half the budget together, and the process's peak resident
  // memory grows by less than the budget. Without the budget the same pipeline takes far more,
  // which shows the check can fail.
  void a_ram_budget_smaller_than_the_buffers_bounds_the_memory() {
    // The buffers must fill whatever the machine's load: the consumer burns, on its first element
    // alone, many times the CPU time the source needs for the whole dataset (a sanitizer makes the
    // source's 64 KiB writes 10 times as slow: about 400 a second under ThreadSanitizer), then
    // takes the rest at once. A steady slow consumer let only 651 of 1,500 accumulate once under
    // ThreadSanitizer beside another suite, the source being slowed as much as the consumer.
    const std::string count = kSanitized ? "1500" : "3000", first_us = kSanitized ? "12000000" : "1500000";
    auto pipeline = [&](const std::string& options) {
      return "options { seed: 3 fuse_stages: false " + options + " }\n" +
             stage("src", "tensors", "", {{"count", count}, {"shape", "65536"}, {"dtype", "u8"}}, "buffer_size: 1000") +
             stage("copy", "identity", "src", {}, "buffer_size: 1000") +
             stage("slow", "simulate_work", "copy", {{"us", first_us}, {"later_us", "0"}, {"later_from", "1"}}) +
             stage("out", "null_sink", "slow");
    };
    constexpr std::uint64_t kBudget = 48ull << 20;
    auto peak_growth = [&](const std::string& options, std::uint64_t* most_buffered) {
      const bool measured = sluice::reset_peak_resident_bytes();
      const std::uint64_t before = sluice::resident_bytes();
      std::mutex mutex;
      auto result = run_watched(pipeline(options), [&](const sluice::metrics::MetricsSnapshot& s) {
        std::uint64_t buffered = 0;
        for (const auto& m : s.stage()) buffered += m.buffer_bytes();
        std::lock_guard lock(mutex);
        *most_buffered = std::max(*most_buffered, buffered);
      });
      if (result.state != sluice::RunState::Finished) return std::int64_t{-1};
      return measured ? static_cast<std::int64_t>(sluice::peak_resident_bytes()) - static_cast<std::int64_t>(before) : std::int64_t{0};
    };
    std::uint64_t buffered_unbounded = 0, buffered_bounded = 0;
    const std::int64_t unbounded = peak_growth("", &buffered_unbounded);
    const std::int64_t bounded = peak_growth("autotune { ram_budget: \"48MiB\" }", &buffered_bounded);
    QVERIFY(unbounded >= 0 && bounded >= 0);
    QVERIFY2(buffered_unbounded > kBudget, qPrintable(QString("without a budget the buffers held only %1 bytes").arg(buffered_unbounded)));
    QVERIFY2(buffered_bounded <= kBudget / 2, qPrintable(QString("the buffers held %1 bytes").arg(buffered_bounded)));
    if (kSanitized) QSKIP("resident memory under a sanitizer is the sanitizer's (shadow memory, quarantine); the buffers were checked");
    QVERIFY2(unbounded > static_cast<std::int64_t>(kBudget), qPrintable(QString("without a budget the peak grew by only %1").arg(unbounded)));
    QVERIFY2(bounded < static_cast<std::int64_t>(kBudget), qPrintable(QString("the peak grew by %1 bytes on a budget of %2").arg(bounded).arg(kBudget)));
  }

  // Whatever the tuner chooses, a deterministic pipeline gives the bytes of fixed worker counts.
  void deterministic_output_is_the_same_as_with_fixed_workers() {
    auto pipeline = [](const std::string& workers, const std::string& buffer) {
      return "options { seed: 8 }\n" + stage("src", "range", "", {{"count", "4000"}}) +
             stage("drop", "filter_random", "src", {{"p", "0.7"}}, "parallelism: " + workers) +
             stage("work", "simulate_work", "drop", {{"us", "40"}, {"jitter_us", "60"}}, "parallelism: " + workers + " buffer_size: " + buffer) +
             stage("mix", "shuffle", "work", {{"buffer_size", "300"}}) + stage("batch", "batch", "mix", {{"batch_size", "16"}}) +
             sink_after("batch");
    };
    const auto fixed = run_text(pipeline("1", "0"));
    const auto tuned = run_text(pipeline("-1", "-1"));
    QCOMPARE(fixed.result.state, sluice::RunState::Finished);
    QCOMPARE(tuned.result.state, sluice::RunState::Finished);
    QVERIFY(fixed.lines.size() > 100);
    QVERIFY(tuned.lines == fixed.lines);
  }

  // An interleaved reader whose readers the tuner adds and takes away (it reads on its own thread
  // with one, on fetcher threads with more) gives the records of one reader, in the same order.
  void a_tuned_interleaved_reader_reads_every_record_in_order() {
    // Under a sanitizer the files are read 4 times, not 8: still seconds of the tuner's rounds
    // there (ThreadSanitizer spent 28 s on 8 passes, the plain build 3).
    const int passes = kSanitized ? 4 : 8;
    auto pipeline = [&](const std::string& workers) {
      return "options { seed: 2 autotune { cpu_budget: 4 } }\n" +
             stage("files", "list_files", "", {{"patterns", testdata_dir() + "/tfrecord/*.tfrecord*"}}) +
             stage("again", "repeat", "files", {{"count", std::to_string(passes)}}) +
             stage("read", "tfrecord_reader", "again", {}, "interleave { cycle_length: 4 } parallelism: " + workers) +
             stage("work", "simulate_work", "read", {{"us", "20"}}, "parallelism: " + workers) + sink_after("work");
    };
    const auto one = run_text(pipeline("1"));
    const auto tuned = run_text(pipeline("-1"));
    QCOMPARE(one.result.state, sluice::RunState::Finished);
    QCOMPARE(tuned.result.state, sluice::RunState::Finished);
    QVERIFY(one.lines.size() > static_cast<std::size_t>(passes) * 1250);
    QCOMPARE(tuned.lines.size(), one.lines.size());
    QVERIFY(tuned.lines == one.lines);
  }

  // The default budget is what this thread may run on: restricted to one CPU, one core.
  void an_affinity_of_one_cpu_is_a_budget_of_one_core() {
    cpu_set_t original;
    QCOMPARE(::sched_getaffinity(0, sizeof original, &original), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
      if (CPU_ISSET(c, &original)) first = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    QCOMPARE(::sched_setaffinity(0, sizeof one, &one), 0);
    const auto cores = sluice::usable_cores();
    ::sched_setaffinity(0, sizeof original, &original);
    QCOMPARE(cores.cores, 1.0);
    QVERIFY2(cores.why.find("affinity") != std::string::npos, cores.why.c_str());
    QVERIFY(sluice::usable_memory().bytes > 0);
  }

  // The tuner alone, window by window: an increase after which the pipeline ran more than 10%
  // slower is undone after its trial windows, and the stage gets no more for a while; one after
  // which it ran at 95% of its speed stays.
  void an_increase_that_slowed_the_pipeline_is_undone_and_held_off() {
    using namespace sluice::detail;
    for (const double slower : {0.85, 0.95}) {
      Autotuner tuner(TuneBudgets{8, 0});
      TunedStage work;
      work.id = "work";
      work.tunes_workers = true;
      work.max_workers = 8;
      work.busy_cores = 0.99;
      std::vector<TunedStage> stages{work};
      int raised_to = 0;
      for (int window = 0; window < 10 && raised_to == 0; ++window)
        for (const auto& c : tuner.plan(stages, 1000))
          if (!c.buffer && c.to > c.from) raised_to = static_cast<int>(c.to);
      QVERIFY2(raised_to > 1, "a stage busy 99% of one worker, with 8 cores free, got no more");
      stages[0].workers = raised_to;
      stages[0].busy_cores = 0.99 * raised_to;  // as busy, and yet the pipeline is slower
      std::vector<TuneChange> undone;
      for (int window = 0; window < 3; ++window)
        for (const auto& c : tuner.plan(stages, 1000 * slower))
          if (!c.buffer && c.to < c.from) undone.push_back(c);
      if (slower > 0.9) {
        QVERIFY2(undone.empty(), "an increase that kept 95% of the speed was undone");
        continue;
      }
      QCOMPARE(undone.size(), std::size_t(1));
      QCOMPARE(undone[0].to, std::int64_t(1));
      QVERIFY2(undone[0].reason.find("ran slower") != std::string::npos, undone[0].reason.c_str());
      stages[0].workers = 1;
      stages[0].busy_cores = 0.99;
      for (int window = 0; window < 20; ++window)
        for (const auto& c : tuner.plan(stages, 850))
          QVERIFY2(c.buffer || c.to <= c.from, ("raised again while held off: " + c.reason).c_str());
    }
  }

  void byte_sizes_read_as_users_write_them() {
    QCOMPARE(sluice::parse_byte_size("4GiB").value(), 4ull << 30);
    QCOMPARE(sluice::parse_byte_size("512MB").value(), 512ull << 20);
    QCOMPARE(sluice::parse_byte_size("1.5G").value(), 3ull << 29);
    QCOMPARE(sluice::parse_byte_size("65536").value(), 65536ull);
    QCOMPARE(sluice::parse_byte_size("2 kib").value(), 2048ull);
    QVERIFY(!sluice::parse_byte_size("lots"));
    QVERIFY(!sluice::parse_byte_size("4 GB of it"));
    QVERIFY(!sluice::parse_byte_size(""));
    QCOMPARE(sluice::byte_size_text(3ull << 29), std::string("1.5 GiB"));
  }
};

QTEST_APPLESS_MAIN(TestAutotune)
#include "tst_autotune.moc"
