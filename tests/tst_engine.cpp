// Engine behaviour users rely on: error policies, stop, bottleneck detection, metrics.
#include <QtTest>
#include <fmt/format.h>

#include <atomic>
#include <fstream>
#include <thread>
#include <tuple>

#include "pipeline_runner.hpp"
#include "sluice/core/report.hpp"

using namespace sluice::test;

class TestEngine : public QObject {
  Q_OBJECT
 private slots:
  void fail_policy_stops_with_stage_element_and_origin() {
    auto out = run_text(stage("src", "range", "", {{"count", "100"}}) + stage("tag", "tag_origin", "src") +
                        stage("f", "fail_when", "tag", {{"divisor", "30"}}, "parallelism: 2") + stage("s", "skip", "f", {{"count", "1"}}) +
                        sink_after("s"));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    const auto& e = out.result.error;
    QVERIFY2(e.find("stage 'f' (fail_when) failed on element 0 of epoch 0 from file.rec:record 0: value 0 is planted as corrupt") !=
                 std::string::npos,
             e.c_str());
    QVERIFY(e.find("error_policy: skip") != std::string::npos);
  }

  void skip_policy_drops_counts_and_keeps_reasons() {
    // tag and f share their workers (fused); reasons must still land on f, in input order.
    auto out = run_text(stage("src", "range", "", {{"count", "100"}}) + stage("tag", "tag_origin", "src", {}, "parallelism: 3") +
                        stage("f", "fail_when", "tag", {{"divisor", "10"}}, "parallelism: 3 error_policy: skip") + sink_after("f"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.lines.size(), std::size_t(90));
    QCOMPARE(out.snapshot.stage(2).fused_with(), std::string("tag"));
    QCOMPARE(out.snapshot.stage(1).errors_skipped(), std::uint64_t(0));
    QCOMPARE(out.snapshot.stage(1).skip_reasons_size(), 0);
    const auto& m = out.snapshot.stage(2);
    QCOMPARE(m.errors_skipped(), std::uint64_t(10));
    QCOMPARE(m.skip_reasons_size(), 10);
    QVERIFY(m.skip_reasons(1).find("element 10 of epoch 0 from file.rec:record 10: value 10 is planted as corrupt") != std::string::npos);
    auto report = sluice::format_report(out.snapshot);
    QVERIFY(report.find("Skipped in stage 'f': 10 elements") != std::string::npos);
  }

  void pipeline_wide_skip_policy_applies_to_stages() {
    auto out = run_text("options { error_policy: skip }\n" + stage("src", "range", "", {{"count", "20"}}) +
                        stage("f", "fail_when", "src", {{"divisor", "5"}}) + sink_after("f"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.lines.size(), std::size_t(16));
  }

  void start_stop_200_cycles_without_hang() {
    // An endless pipeline with parallel, stateful and sink stages, stopped at random moments.
    std::string text = stage("src", "range", "", {{"count", "1000000000"}}) + stage("rep", "repeat", "src") +
                       stage("w", "simulate_work", "rep", {{"us", "1"}}, "parallelism: 3") +
                       stage("sh", "shuffle", "w", {{"buffer_size", "100"}}) +
                       stage("sums", "uneven_sums", "sh", {{"size", "2"}}, "parallelism: 3") +
                       stage("b", "batch", "sums", {{"batch_size", "8"}}) + stage("out", "null_sink", "b");
    for (int cycle = 0; cycle < 200; ++cycle) {
      sluice::Engine engine(graph_of(text));
      engine.start();
      std::this_thread::sleep_for(std::chrono::microseconds((cycle * 37) % 3000));
      auto t0 = std::chrono::steady_clock::now();
      engine.stop();
      auto result = engine.wait();
      auto took = std::chrono::steady_clock::now() - t0;
      QCOMPARE(result.state, sluice::RunState::Stopped);
      QVERIFY2(took < std::chrono::seconds(1), "stop took longer than a second");
    }
  }

  // An aggregate that assembles its outputs on several threads (uneven_sums: each assembly
  // sleeps 0-3 ms, so later outputs are often made first) gives what it gives on one: the same
  // outputs in the same order, through iterations, a take that stops wanting more, and a run
  // that ends mid-batch.
  void parallel_assembly_gives_what_one_thread_gives() {
    auto run = [](int parallelism, const std::string& after) {
      // The repeat after the stage asks it for two iterations (each ends with end_iteration()).
      const std::string text = stage("src", "range", "", {{"count", "301"}}) +
                               stage("sums", "uneven_sums", "src", {{"size", "4"}}, "parallelism: " + std::to_string(parallelism)) +
                               stage("rep", "repeat", "sums", {{"count", "2"}}) + after;
      return run_text(text);
    };
    for (const std::string& after : {sink_after("rep"), stage("t", "take", "rep", {{"count", "97"}}) + sink_after("t")}) {
      auto one = run(1, after), four = run(4, after);
      QCOMPARE(one.result.state, sluice::RunState::Finished);
      QCOMPARE(four.result.state, sluice::RunState::Finished);
      QVERIFY(one.lines.size() > 90);
      QCOMPARE(four.lines, one.lines);
      QCOMPARE(four.snapshot.stage(1).workers(), 4u);
    }
    // Both iterations, each ending in a short output (301 = 75 * 4 + 1).
    auto whole = run(4, sink_after("rep"));
    QCOMPARE(whole.lines.size(), std::size_t(2 * 76));
    QCOMPARE(whole.snapshot.stage(1).elements_out(), std::uint64_t(2 * 76));
    QCOMPARE(integers(whole.lines[75]), (std::vector<long long>{300, 300}));
    QCOMPARE(integers(whole.lines[76]), (std::vector<long long>{0 + 1 + 2 + 3, 0}));
  }

  void a_failed_assembly_fails_the_run_naming_the_stage() {
    for (int parallelism : {1, 3}) {
      auto out = run_text(stage("src", "range", "", {{"count", "1000"}}) +
                          stage("sums", "uneven_sums", "src", {{"size", "4"}, {"fail_at", "400"}},
                                "parallelism: " + std::to_string(parallelism)) +
                          sink_after("sums"));
      QCOMPARE(out.result.state, sluice::RunState::Failed);
      const std::string want = parallelism > 1 ? "stage 'sums' (uneven_sums) failed assembling an output of epoch 0: " : "stage 'sums' (uneven_sums) ";
      QVERIFY2(out.result.error.find(want) != std::string::npos, out.result.error.c_str());
      QVERIFY2(out.result.error.find("planted failure assembling the output from value 400") != std::string::npos, out.result.error.c_str());
      // Every output before the failed one was handed on, in order.
      QVERIFY(out.lines.size() <= 100);
      for (std::size_t k = 0; k < out.lines.size(); ++k) QCOMPARE(integers(out.lines[k])[1], static_cast<long long>(4 * k));
    }
  }

  void slow_stage_is_the_bottleneck_with_full_input_data() {
    QTest::addColumn<bool>("fuse");
    QTest::newRow("separate stages") << false;
    QTest::newRow("fused stages") << true;
  }
  void slow_stage_is_the_bottleneck_with_full_input() {
    QFETCH(bool, fuse);
    auto out = run_text(std::string("options { fuse_stages: ") + (fuse ? "true" : "false") + " }\n" +
                        stage("src", "range", "", {{"count", "3000"}}) + stage("fast", "identity", "src") +
                        stage("slow", "simulate_work", "fast", {{"us", "300"}}) + stage("after", "identity", "slow") +
                        stage("out", "null_sink", "after"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.snapshot.bottleneck(), std::string("slow"));
    // The buffer in front of the slow stage: fast's output, or with fusion the group's input.
    const auto& feeding = out.snapshot.stage(fuse ? 0 : 1);
    QVERIFY2(feeding.mean_buffer_fill() > 0.8, "the slow stage's input buffer should be mostly full");
    QCOMPARE(out.snapshot.stage(2).fused_with(), fuse ? std::string("fast") : std::string());
    QVERIFY(out.snapshot.stage(2).busy_fraction() > 0.8);
    QVERIFY(out.snapshot.stage(3).mean_buffer_fill() < 0.2);
    QVERIFY(out.snapshot.bottleneck_reason().find("input buffer is") != std::string::npos);
    auto report = sluice::format_report(out.snapshot);
    QVERIFY(report.find("Bottleneck: stage 'slow'") != std::string::npos);
    QVERIFY2(report.find("raise `parallelism` of stage 'slow' (now 1 worker)") != std::string::npos, report.c_str());
    if (fuse) QVERIFY2(report.find("'fast' and 'after' run fused with it") != std::string::npos, report.c_str());
  }

  void report_suggests_cache_buffer_and_earlier_shard() {
    sluice::metrics::MetricsSnapshot snap;
    auto add = [&](const std::string& id, const std::string& op, const std::string& kind, const std::string& input) {
      auto* m = snap.add_stage();
      m->set_id(id);
      m->set_op(op);
      m->set_kind(kind);
      m->set_workers(1);
      m->set_stateless(kind == "map");
      if (!input.empty()) m->add_inputs(input);
      return m;
    };
    add("files", "list_files", "source", "");
    auto* decode = add("decode", "decode_image", "map", "files");
    decode->set_mean_element_us(900);
    decode->set_epoch(3);
    decode->set_elements_in(3000);
    decode->set_buffer_capacity(64);
    decode->set_buffer_empty_fraction(0.4);
    decode->set_buffer_full_fraction(0.35);
    decode->set_buffer_swings(40);
    decode->set_blocked_fraction(0.3);
    auto* shard = add("shard", "shard", "map", "decode");
    shard->set_role(sluice::role_name(sluice::OperatorRole::Shards));  // the report reads roles, not names
    shard->set_elements_in(3000);
    shard->set_starved_fraction(0.25);
    shard->set_elements_out(750);
    auto* flip = add("flip", "random_flip", "map", "shard");
    flip->set_random(true);
    flip->set_mean_element_us(80);
    flip->set_epoch(3);
    add("out", "null_sink", "sink", "flip");
    const auto text = sluice::format_report(snap);
    QVERIFY2(text.find("add a `cache` stage after 'decode' (decode_image): it is deterministic, costs 900 us") != std::string::npos,
             text.c_str());
    QVERIFY2(text.find("grow `buffer_size` of 'decode' (now 64): its output buffer went between empty and full 40 times, empty 40% "
                       "and full 35%") != std::string::npos,
             text.c_str());
    QVERIFY2(text.find("move 'shard' before 'decode': it keeps 25% of its input") != std::string::npos, text.c_str());
    QVERIFY(text.find("cache` stage after 'flip'") == std::string::npos);  // random: not worth caching
    // A Python function as the bottleneck: the report names the GIL, not more workers.
    snap.set_bottleneck("decode");
    decode->set_op("python_map");
    decode->set_role(sluice::role_name(sluice::OperatorRole::CallsPython));
    const auto python = sluice::format_report(snap);
    QVERIFY2(python.find("'decode' (python_map) runs a Python function, which holds the GIL") != std::string::npos, python.c_str());
    QVERIFY(python.find("raise `parallelism` of stage 'decode'") == std::string::npos);
    // With a cache downstream, no cache is suggested.
    auto* cache = snap.mutable_stage(3);
    cache->set_op("cache");
    cache->set_role(sluice::role_name(sluice::OperatorRole::Caches));
    QVERIFY(sluice::format_report(snap).find("add a `cache`") == std::string::npos);
  }

  // An autotuned bottleneck: the report says how many workers the tuner gave it and whether
  // that is its most, in plain words, and marks the count in the table.
  void report_says_what_the_autotuner_gave_a_stage() {
    sluice::metrics::MetricsSnapshot snap;
    snap.mutable_autotune()->set_cpu_budget(2);
    snap.mutable_autotune()->set_cpu_budget_source("options.autotune.cpu_budget");
    for (const char* id : {"src", "work", "out"}) {
      auto* m = snap.add_stage();
      m->set_id(id);
      m->set_op(std::string(id) == "work" ? "simulate_work" : std::string(id) == "src" ? "range" : "null_sink");
      m->set_kind(std::string(id) == "work" ? "map" : std::string(id) == "src" ? "source" : "sink");
      m->set_workers(1);
      if (std::string(id) != "src") m->add_inputs(std::string(id) == "work" ? "src" : "work");
    }
    auto* work = snap.mutable_stage(1);
    work->set_stateless(true);
    work->set_workers_tuned(true);
    work->set_max_workers(4);
    work->set_busy_fraction(0.9);
    snap.set_bottleneck("work");
    snap.set_bottleneck_reason("busy 90% of the time on 1 worker; its input buffer is 95% full, its output buffer 1% full");
    for (auto [workers, said] : {std::pair{1u, "1 worker of at most 4,"}, std::pair{3u, "3 workers of at most 4,"}, std::pair{4u, "4 workers, the most it may have,"}}) {
      work->set_workers(workers);
      const auto text = sluice::format_report(snap);
      QVERIFY2(text.find(std::string("the autotuner gives stage 'work' ") + said + " within the CPU budget of 2 cores") != std::string::npos, text.c_str());
      QVERIFY2(text.find(fmt::format("\nwork             simulate_work  {:>3} ", std::to_string(workers) + "*")) != std::string::npos, text.c_str());
      QVERIFY2(text.find("* workers chosen by the autotuner") != std::string::npos, text.c_str());
    }
  }

  void skip_reasons_are_counted_by_kind() {
    auto out = run_text(stage("src", "range", "", {{"count", "1000"}}) +
                        stage("f", "fail_when", "src", {{"divisor", "4"}}, "error_policy: skip") + stage("out", "null_sink", "f"));
    const auto& m = out.snapshot.stage(1);
    QCOMPARE(m.errors_skipped(), std::uint64_t(250));
    QCOMPARE(m.skip_reason_counts_size(), 1);
    QCOMPARE(m.skip_reason_counts().begin()->second, std::uint64_t(250));
    const auto text = sluice::format_report(out.snapshot);
    QVERIFY2(text.find("... and 240 more; by kind of reason:") != std::string::npos, text.c_str());
    QVERIFY2(text.find("250 x element N of epoch N: value N is planted as corrupt") != std::string::npos, text.c_str());
  }

  void snapshots_are_published_several_times_a_second() {
    sluice::EngineOptions options;
    options.snapshot_interval = std::chrono::milliseconds(100);
    sluice::Engine engine(graph_of(stage("src", "range", "", {{"count", "1000000000"}}) +
                                   stage("w", "simulate_work", "src", {{"us", "20"}}) + stage("out", "null_sink", "w")),
                          options);
    std::atomic<int> count{0};
    std::atomic<std::uint64_t> last_elements{0};
    bool monotonic = true;
    engine.subscribe([&](const sluice::metrics::MetricsSnapshot& s) {
      if (s.stage(2).elements_out() < last_elements.load()) monotonic = false;
      last_elements = s.stage(2).elements_out();
      ++count;
    });
    engine.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    int during = count.load();
    auto live = engine.snapshot();
    engine.stop();
    engine.wait();
    QVERIFY2(during >= 5, qPrintable(QString("only %1 snapshots in a second").arg(during)));
    QVERIFY(monotonic);
    QCOMPARE(live.state(), std::string("running"));
    QVERIFY(live.stage(1).elements_out() > 0);
    QCOMPARE(live.stage(0).buffer_capacity(), 256u);
  }

  // A buffer the engine sizes holds many small elements (so producer and consumer overlap) but
  // only as many large ones as its byte limit allows: memory stays bounded behind a slow consumer.
  // The consumer takes 100 ms per element, so that even a loaded machine fills the buffer early.
  void engine_sized_buffers_are_bounded_in_elements_and_bytes() {
    // Watches the source's buffer for 0.4 s, and on (up to 5 s) until it held `expected_peak`
    // elements and was full more than half the time: a loaded or cold machine (first image
    // operations, libraries paged in) may fill it late.
    auto peak_of_source_buffer = [](const std::string& source, std::uint32_t expected_peak) {
      sluice::EngineOptions options;
      options.default_buffer_bytes = 1 << 20;
      sluice::Engine engine(graph_of(source + stage("slow", "simulate_work", "src", {{"us", "100000"}}) + stage("out", "null_sink", "slow")),
                            options);
      engine.start();
      std::uint32_t peak_level = 0;
      std::uint64_t peak_bytes = 0;
      sluice::metrics::MetricsSnapshot snap;
      for (int i = 0; i < 500 && (i < 40 || peak_level < expected_peak || snap.stage(0).mean_buffer_fill() <= 0.5); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        snap = engine.snapshot();
        peak_level = std::max(peak_level, snap.stage(0).buffer_level());
        peak_bytes = std::max(peak_bytes, snap.stage(0).buffer_bytes());
      }
      engine.stop();
      engine.wait();
      return std::make_tuple(peak_level, peak_bytes, snap);
    };
    // 8-byte integers: the element bound (256) is reached long before the byte bound.
    auto [small_level, small_bytes, small] = peak_of_source_buffer(stage("src", "range", "", {{"count", "100000"}}), 256);
    QCOMPARE(small.stage(0).buffer_capacity(), 256u);
    QCOMPARE(small.stage(0).buffer_byte_limit(), std::uint64_t(1 << 20));
    QCOMPARE(small_level, 256u);
    // 230 KB images: at most the byte limit plus the one element that crossed it.
    auto [large_level, large_bytes, large] =
        peak_of_source_buffer(stage("src", "synthetic_images", "", {{"count", "1000"}}), 4);
    QVERIFY2(large_level >= 4 && large_level <= 5, qPrintable(QString("peak level %1").arg(large_level)));
    QVERIFY(large_bytes <= (1 << 20) + 320 * 240 * 3);
    QVERIFY2(large.stage(0).mean_buffer_fill() > 0.5, "a buffer full by its bytes counts as full");
    // An explicit buffer_size counts elements only.
    auto [explicit_level, explicit_bytes, explicit_snap] =
        peak_of_source_buffer(stage("src", "synthetic_images", "", {{"count", "1000"}}, "buffer_size: 12"), 12);
    QCOMPARE(explicit_snap.stage(0).buffer_byte_limit(), std::uint64_t(0));
    QCOMPARE(explicit_level, 12u);
  }

  void an_expand_hands_small_rows_on_in_larger_chunks_and_large_ones_in_chunks_of_256() {
    // The rows a reader hands on at once (a chunk) grow past 256 only while a chunk stays within
    // 256 KiB: short lines go in chunks of thousands (after a first one of 256), and the batches
    // are the element-wise run's.
    QTemporaryDir dir;
    const std::string lines_path = dir.filePath("numbers.txt").toStdString();
    {
      std::ofstream lines(lines_path);
      for (int i = 0; i < 20000; ++i) lines << i << "\n";
    }
    const std::string text = stage("files", "list_files", "", {{"patterns", lines_path}}) + stage("lines", "text_lines", "files") +
                             stage("batch", "batch", "lines", {{"batch_size", "5000"}}) + sink_after("batch");
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const auto chunked = run_text(text), elements = run_text(text, {}, element_wise);
    QVERIFY2(chunked.result.state == sluice::RunState::Finished, chunked.result.error.c_str());
    QCOMPARE(chunked.lines.size(), std::size_t(4));
    QCOMPARE(chunked.lines, elements.lines);
    const auto& read = chunked.snapshot.stage(1);
    QCOMPARE(read.chunked_elements_out(), std::uint64_t(20000));
    QVERIFY2(read.chunks_out() >= 20000 / 4096 && read.chunks_out() <= 8, qPrintable(QString("%1 chunks").arg(read.chunks_out())));
#ifdef SLUICE_HAVE_PARQUET
    // A Parquet file of 20,000 integers, then one of 2,000 rows of 6,912 bytes (48x48x3 images),
    // each in one row group, which the reader could hand on 8,192 rows at a time: the integers
    // in 6 chunks (256, then up to 4,096, cut where Arrow's rows are converted), the images in
    // chunks of 256 (1.8 MB each), as before chunks could grow: the small rows before them do not
    // size their chunks.
    auto write = [&](const std::string& source, const std::string& name) {
      auto written = run_text(source + stage("w", "parquet_writer", "src",
                                             {{"prefix", dir.filePath(QString::fromStdString(name)).toStdString()}, {"lists", "fixed"}, {"row_group_rows", "20000"}}));
      QVERIFY2(written.result.state == sluice::RunState::Finished, written.result.error.c_str());
    };
    write(stage("src", "range", "", {{"count", "20000"}}), "a-integers");
    write(stage("src", "synthetic_images", "", {{"count", "2000"}, {"height", "48"}, {"width", "48"}}), "b-images");
    const auto both = run_text(stage("files", "list_files", "", {{"patterns", dir.filePath("*.parquet").toStdString()}, {"shuffle", "false"}}) +
                               stage("read", "parquet_reader", "files") + stage("batch", "batch", "read", {{"batch_size", "500"}}) +
                               stage("out", "null_sink", "batch"));
    QVERIFY2(both.result.state == sluice::RunState::Finished, both.result.error.c_str());
    const auto& parquet_reads = both.snapshot.stage(1);
    QCOMPARE(parquet_reads.chunked_elements_out(), std::uint64_t(22000));
    QVERIFY2(parquet_reads.chunks_out() >= 6 + 2000 / 256, qPrintable(QString("%1 chunks").arg(parquet_reads.chunks_out())));
#endif
  }

  void sink_start_failure_names_the_stage() {
    auto out = run_text(stage("src", "range", "") + stage("out", "jsonl_sink", "src", {{"path", "/nonexistent-dir/x.jsonl"}}));
    QVERIFY2(out.error.find("stage 'out' (jsonl_sink) could not start: cannot write /nonexistent-dir/x.jsonl.partial") !=
                 std::string::npos,
             out.error.c_str());
  }

  void pooled_allocator_reuses_blocks() {
    sluice::PooledHostAllocator pool;
    for (int i = 0; i < 100; ++i) {
      auto t = sluice::Tensor::empty(sluice::DType::F32, {64, 224, 224, 3}, pool);
      t.data<float>()[0] = 1.0f;
    }
    auto c = pool.counters();
    QCOMPARE(c.fresh_allocations, std::uint64_t(1));
    QCOMPARE(c.reused_allocations, std::uint64_t(99));
  }

  void rng_is_a_pure_function_of_its_key() {
    sluice::Rng a(1, 2, 3, 4), b(1, 2, 3, 4), c(1, 2, 3, 5);
    std::uint64_t x = a.next_u64();
    QCOMPARE(x, b.next_u64());
    QVERIFY(x != c.next_u64());
    sluice::Rng u(9, 9, 9, 9);
    for (int i = 0; i < 1000; ++i) {
      double v = u.uniform();
      QVERIFY(v >= 0.0 && v < 1.0);
      QVERIFY(u.below(7) < 7);
    }
  }
};

QTEST_APPLESS_MAIN(TestEngine)
#include "tst_engine.moc"
