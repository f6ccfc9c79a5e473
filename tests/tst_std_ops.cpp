// Semantics of every std operator, as tf.data users expect them.
#include <QtTest>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "pipeline_runner.hpp"

using namespace sluice::test;
using Ints = std::vector<long long>;

namespace {
Ints iota(long long from, long long to) {
  Ints v(static_cast<std::size_t>(to - from));
  std::iota(v.begin(), v.end(), from);
  return v;
}
Ints sorted(Ints v) {
  std::sort(v.begin(), v.end());
  return v;
}
RunOutput run_ok(const std::string& text) {
  auto out = run_text(text);
  if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
    qFatal("pipeline did not finish: %s %s", out.error.c_str(), out.result.error.c_str());
  return out;
}
std::string range(long long count) { return stage("src", "range", "", {{"count", std::to_string(count)}}); }
}  // namespace

class TestStdOps : public QObject {
  Q_OBJECT
 private slots:
  void range_emits_count_from_start_with_step() {
    auto out = run_ok(stage("src", "range", "", {{"count", "4"}, {"start", "10"}, {"step", "-3"}}) + sink_after("src"));
    QCOMPARE(all_integers(out.lines), (Ints{10, 7, 4, 1}));
    QCOMPARE(out.lines.front(), std::string(R"({"value":10})"));
  }

  void from_list_infers_types() {
    auto ints = run_ok(stage("src", "from_list", "", {{"values", "3, -1,7"}}) + sink_after("src"));
    QCOMPARE(all_integers(ints.lines), (Ints{3, -1, 7}));
    auto floats = run_ok(stage("src", "from_list", "", {{"values", "1.5,2"}}) + sink_after("src"));
    QCOMPARE(floats.lines, (std::vector<std::string>{R"({"value":1.5})", R"({"value":2})"}));
    auto bytes = run_ok(stage("src", "from_list", "", {{"values", "hi,abc"}, {"field", "name"}}) + sink_after("src"));
    QCOMPARE(bytes.lines, (std::vector<std::string>{R"({"name":"aGk="})", R"({"name":"YWJj"})"}));
  }

  void repeat_count_and_zero() {
    auto three = run_ok(range(3) + stage("rep", "repeat", "src", {{"count", "3"}}) + sink_after("rep"));
    QCOMPARE(all_integers(three.lines), (Ints{0, 1, 2, 0, 1, 2, 0, 1, 2}));
    auto zero = run_ok(range(3) + stage("rep", "repeat", "src", {{"count", "0"}}) + sink_after("rep"));
    QVERIFY(zero.lines.empty());
  }

  void take_and_skip_per_iteration() {
    auto take = run_ok(range(10) + stage("t", "take", "src", {{"count", "3"}}) + stage("rep", "repeat", "t", {{"count", "2"}}) +
                       sink_after("rep"));
    QCOMPARE(all_integers(take.lines), (Ints{0, 1, 2, 0, 1, 2}));
    auto skip = run_ok(range(5) + stage("s", "skip", "src", {{"count", "3"}}) + stage("rep", "repeat", "s", {{"count", "2"}}) +
                       sink_after("rep"));
    QCOMPARE(all_integers(skip.lines), (Ints{3, 4, 3, 4}));
    auto all = run_ok(range(4) + stage("t", "take", "src", {{"count", "-1"}}) + sink_after("t"));
    QCOMPARE(all_integers(all.lines), iota(0, 4));
  }

  void take_after_infinite_repeat_ends_the_run() {
    auto out = run_ok(range(4) + stage("rep", "repeat", "src") + stage("t", "take", "rep", {{"count", "10"}}) + sink_after("t"));
    QCOMPARE(all_integers(out.lines), (Ints{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
  }

  void take_stops_reading_a_huge_source() {
    auto out = run_ok(stage("src", "range", "", {{"count", "4000000000"}}) + stage("t", "take", "src", {{"count", "5"}}) +
                      stage("rep", "repeat", "t", {{"count", "3"}}) + sink_after("rep"));
    QCOMPARE(all_integers(out.lines), (Ints{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
    QVERIFY(out.snapshot.stage(0).elements_out() < 100000);
  }

  void shard_keeps_every_nth_and_shards_are_disjoint_and_complete() {
    std::set<long long> seen;
    for (int index = 0; index < 3; ++index) {
      auto out = run_ok(range(10) +
                        stage("sh", "shard", "src", {{"num_shards", "3"}, {"index", std::to_string(index)}}, "parallelism: 2") +
                        sink_after("sh"));
      Ints got = all_integers(out.lines);
      for (std::size_t k = 0; k < got.size(); ++k) QCOMPARE(got[k], static_cast<long long>(index + 3 * k));
      for (auto v : got) QVERIFY(seen.insert(v).second);
    }
    QCOMPARE(seen.size(), std::size_t(10));
  }

  void shard_rejects_index_out_of_range() {
    auto out = run_text(range(10) + stage("sh", "shard", "src", {{"num_shards", "2"}, {"index", "2"}}) + sink_after("sh"));
    QVERIFY(out.error.find("index 2 must be less than num_shards 2") != std::string::npos);
    QVERIFY(out.error.find("stage 'sh'") != std::string::npos);
  }

  void shuffle_is_a_permutation_and_buffer_one_keeps_order() {
    auto out = run_ok("options { seed: 7 }\n" + range(100) + stage("s", "shuffle", "src", {{"buffer_size", "30"}}) + sink_after("s"));
    Ints got = all_integers(out.lines);
    QCOMPARE(sorted(got), iota(0, 100));
    QVERIFY(got != iota(0, 100));
    auto one = run_ok(range(20) + stage("s", "shuffle", "src", {{"buffer_size", "1"}}) + sink_after("s"));
    QCOMPARE(all_integers(one.lines), iota(0, 20));
  }

  void shuffle_buffer_bounds_displacement() {
    // With a buffer of b, element i cannot leave before position i - b + 1.
    auto out = run_ok(range(200) + stage("s", "shuffle", "src", {{"buffer_size", "10"}}) + sink_after("s"));
    Ints got = all_integers(out.lines);
    for (std::size_t pos = 0; pos < got.size(); ++pos) QVERIFY(got[pos] <= static_cast<long long>(pos) + 9);
  }

  void shuffle_before_repeat_finishes_each_epoch_and_reshuffles() {
    auto out = run_ok(range(50) + stage("s", "shuffle", "src", {{"buffer_size", "50"}}) + stage("rep", "repeat", "s", {{"count", "3"}}) +
                      sink_after("rep"));
    Ints got = all_integers(out.lines);
    QCOMPARE(got.size(), std::size_t(150));
    Ints e0(got.begin(), got.begin() + 50), e1(got.begin() + 50, got.begin() + 100), e2(got.begin() + 100, got.end());
    QCOMPARE(sorted(e0), iota(0, 50));
    QCOMPARE(sorted(e1), iota(0, 50));
    QCOMPARE(sorted(e2), iota(0, 50));
    QVERIFY(e0 != e1 && e1 != e2);
    auto same = run_ok(range(50) + stage("s", "shuffle", "src", {{"buffer_size", "50"}, {"reshuffle_each_iteration", "false"}}) +
                       stage("rep", "repeat", "s", {{"count", "2"}}) + sink_after("rep"));
    Ints g = all_integers(same.lines);
    QVERIFY(Ints(g.begin(), g.begin() + 50) == Ints(g.begin() + 50, g.end()));
  }

  void repeat_before_shuffle_mixes_epochs() {
    auto out = run_ok("options { seed: 3 }\n" + range(20) + stage("rep", "repeat", "src", {{"count", "3"}}) +
                      stage("s", "shuffle", "rep", {{"buffer_size", "60"}}) + sink_after("s"));
    Ints got = all_integers(out.lines);
    Ints first(got.begin(), got.begin() + 20);
    std::set<long long> distinct(first.begin(), first.end());
    QVERIFY2(distinct.size() < 20, "the first 20 elements should contain repeats from several epochs");
    Ints expected;
    for (int e = 0; e < 3; ++e) expected.insert(expected.end(), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
    QCOMPARE(sorted(got), sorted(expected));
  }

  void batch_sizes_and_drop_remainder() {
    auto keep = run_ok(range(10) + stage("b", "batch", "src", {{"batch_size", "4"}}) + sink_after("b"));
    QCOMPARE(keep.lines, (std::vector<std::string>{R"({"value":[0,1,2,3]})", R"({"value":[4,5,6,7]})", R"({"value":[8,9]})"}));
    auto drop = run_ok(range(10) + stage("b", "batch", "src", {{"batch_size", "4"}, {"drop_remainder", "true"}}) + sink_after("b"));
    QCOMPARE(drop.lines.size(), std::size_t(2));
  }

  void batch_after_repeat_crosses_epochs_and_before_does_not() {
    auto after = run_ok(range(5) + stage("rep", "repeat", "src", {{"count", "2"}}) + stage("b", "batch", "rep", {{"batch_size", "3"}}) +
                        sink_after("b"));
    QCOMPARE(after.lines, (std::vector<std::string>{R"({"value":[0,1,2]})", R"({"value":[3,4,0]})", R"({"value":[1,2,3]})",
                                                    R"({"value":[4]})"}));
    auto before = run_ok(range(5) + stage("b", "batch", "src", {{"batch_size", "3"}}) + stage("rep", "repeat", "b", {{"count", "2"}}) +
                         sink_after("rep"));
    QCOMPARE(before.lines, (std::vector<std::string>{R"({"value":[0,1,2]})", R"({"value":[3,4]})", R"({"value":[0,1,2]})",
                                                     R"({"value":[3,4]})"}));
  }

  void rows_built_in_place_by_the_map_before_a_batch_are_exact() {
    // row_pattern builds its 'row' field straight into its batch row (map-and-batch). fail_when
    // drops every 7th element under the skip policy in the same workers, so from the first drop
    // on, elements land in other rows than their index says and must be copied there; at any
    // parallelism, and in completion order too (no placement then), the batches are exact.
    constexpr int kCount = 500, kWidth = 37, kBatch = 16;
    for (const char* mode : {"", "options { deterministic: false }\n"})
      for (int workers : {1, 3}) {
        const std::string par = "parallelism: " + std::to_string(workers);
        auto out = run_ok(std::string(mode) + range(kCount) + stage("f", "fail_when", "src", {{"divisor", "7"}}, par + " error_policy: skip") +
                          stage("rows", "row_pattern", "f", {{"width", std::to_string(kWidth)}}, par) +
                          stage("b", "batch", "rows", {{"batch_size", std::to_string(kBatch)}}) + sink_after("b"));
        std::vector<long long> values;
        for (const auto& line : out.lines) {
          Ints ints = integers(line);
          const std::size_t rows = ints.size() / (1 + kWidth);
          QCOMPARE(ints.size(), rows * (1 + kWidth));
          for (std::size_t r = 0; r < rows; ++r) {
            const long long v = ints[r];
            values.push_back(v);
            for (int k = 0; k < kWidth; ++k)
              if (ints[rows + r * kWidth + k] != 1 + (v * 131 + k * 7) % 250)
                QFAIL(qPrintable(QString("workers %1: row of value %2, byte %3 is wrong").arg(workers).arg(v).arg(k)));
          }
        }
        Ints expected;
        for (int v = 0; v < kCount; ++v)
          if (v % 7 != 0) expected.push_back(v);
        if (std::string(mode).empty()) QCOMPARE(values, expected);  // in order
        else QCOMPARE(sorted(values), expected);
      }
  }

  void batch_of_ragged_numeric_fields_is_an_error_naming_the_field() {
    auto out = run_text(range(4) + stage("b1", "batch", "src", {{"batch_size", "2"}, {"drop_remainder", "false"}}) +
                        stage("u", "unbatch", "b1") + stage("b2", "batch", "u", {{"batch_size", "3"}}) + sink_after("b2"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);  // same shapes: fine
    auto ragged = run_text(range(3) + stage("b1", "batch", "src", {{"batch_size", "2"}}) +
                           stage("b2", "batch", "b1", {{"batch_size", "2"}}) + sink_after("b2"));
    QCOMPARE(ragged.result.state, sluice::RunState::Failed);
    QVERIFY(ragged.result.error.find("cannot batch field 'value'") != std::string::npos);
    QVERIFY(ragged.result.error.find("stage 'b2'") != std::string::npos);
  }

  void unbatch_inverts_batch() {
    auto out = run_ok(range(7) + stage("b", "batch", "src", {{"batch_size", "3"}}) + stage("u", "unbatch", "b", {}, "parallelism: 3") +
                      sink_after("u"));
    QCOMPARE(all_integers(out.lines), iota(0, 7));
    QCOMPARE(out.lines.front(), std::string(R"({"value":0})"));
  }

  void interleave_follows_tf_data_order_at_any_parallelism() {
    // Three inputs of four rows each; two open at once.
    auto run = [&](int cycle, int block, int parallelism, bool deterministic = true) {
      std::string interleave = "interleave { cycle_length: " + std::to_string(cycle) + " block_length: " + std::to_string(block) +
                               " deterministic: " + (deterministic ? "true" : "false") + " } parallelism: " + std::to_string(parallelism);
      return all_integers(run_ok(range(12) + stage("b", "batch", "src", {{"batch_size", "4"}}) + stage("u", "unbatch", "b", {}, interleave) +
                                 sink_after("u"))
                              .lines);
    };
    for (int parallelism : {1, 3}) {
      QCOMPARE(run(2, 1, parallelism), (Ints{0, 4, 1, 5, 2, 6, 3, 7, 8, 9, 10, 11}));
      QCOMPARE(run(2, 2, parallelism), (Ints{0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11}));
      QCOMPARE(run(1, 1, parallelism), iota(0, 12));
      QCOMPARE(run(3, 1, parallelism), (Ints{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
    }
    QCOMPARE(sorted(run(3, 1, 3, false)), iota(0, 12));
  }

  void interleave_drains_each_epoch_before_the_next() {
    auto out = run_ok(range(6) + stage("b", "batch", "src", {{"batch_size", "3"}}) +
                      stage("u", "unbatch", "b", {}, "interleave { cycle_length: 2 } parallelism: 2") +
                      stage("rep", "repeat", "u", {{"count", "2"}}) + sink_after("rep"));
    QCOMPARE(all_integers(out.lines), (Ints{0, 3, 1, 4, 2, 5, 0, 3, 1, 4, 2, 5}));
  }

  void cache_in_memory_replays_the_first_iteration() {
    // filter_random after cache would differ per epoch; before the cache, the replay must be
    // identical to the first iteration, proving the input is not read again.
    auto out = run_ok(range(40) + stage("f", "filter_random", "src", {{"p", "0.5"}}) + stage("c", "cache", "f") +
                      stage("rep", "repeat", "c", {{"count", "3"}}) + sink_after("rep"));
    Ints got = all_integers(out.lines);
    QCOMPARE(got.size() % 3, std::size_t(0));
    std::size_t n = got.size() / 3;
    QVERIFY(n > 5 && n < 35);
    QVERIFY(Ints(got.begin(), got.begin() + n) == Ints(got.begin() + n, got.begin() + 2 * n));
    QVERIFY(Ints(got.begin(), got.begin() + n) == Ints(got.begin() + 2 * n, got.end()));
    QCOMPARE(out.snapshot.stage(0).elements_out(), std::uint64_t(40));  // the source ran once
  }

  void cache_file_is_reused_by_its_pipeline_and_refused_by_another() {
    QTemporaryDir dir;
    std::string path = dir.path().toStdString() + "/c.cache";
    auto pipeline = [&](long long count) {
      return range(count) + stage("c", "cache", "src", {{"path", path}}) + stage("rep", "repeat", "c", {{"count", "2"}}) + sink_after("rep");
    };
    auto first = run_ok(pipeline(5));
    QCOMPARE(all_integers(first.lines), (Ints{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
    QVERIFY(std::filesystem::is_regular_file(path));
    // The same pipeline replays the file without reading its input.
    auto second = run_ok(pipeline(5));
    QCOMPARE(all_integers(second.lines), (Ints{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
    QCOMPARE(second.snapshot.stage(0).elements_out(), std::uint64_t(0));
    // Another pipeline before the cache (another count) is refused, naming the file, not replayed.
    auto other = run_text(pipeline(3));
    QVERIFY2(other.error.find("cache file " + path + " was made by a different pipeline") != std::string::npos, other.error.c_str());
    QVERIFY(other.lines.empty());
    // Deleting it rebuilds it from the input.
    std::filesystem::remove(path);
    auto third = run_ok(pipeline(3));
    QCOMPARE(all_integers(third.lines), (Ints{0, 1, 2, 0, 1, 2}));
  }

  void cache_after_take_still_fills_then_replays() {
    auto out = run_ok(range(6) + stage("c", "cache", "src") + stage("t", "take", "c", {{"count", "2"}}) +
                      stage("rep", "repeat", "t", {{"count", "3"}}) + sink_after("rep"));
    QCOMPARE(all_integers(out.lines), (Ints{0, 1, 0, 1, 0, 1}));
    QCOMPARE(out.snapshot.stage(0).elements_out(), std::uint64_t(6));
  }

  void ragged_and_padded_batches_of_chunks_with_rows_left_out_give_the_element_wise_batches() {
    // Each line's 2 to 4 numbers as words, as floats (y), then as integers (x): every 97th line
    // holds 1.5, which is no integer, and is skipped there. The rows kept of each chunk are not
    // one after another in y's values any more: batched ragged or padded (the words padded with
    // ""), they give the element-wise run's batches.
    QTemporaryDir dir;
    const std::string path = dir.filePath("numbers.txt").toStdString();
    {
      std::ofstream lines(path);
      for (int l = 0; l < 3000; ++l) {
        lines << (l % 97 == 5 ? "1.5" : std::to_string(l)) << " " << l % 7;
        for (int k = 0; k < l % 3; ++k) lines << " 9";
        lines << "\n";
      }
    }
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::string split = stage("files", "list_files", "", {{"patterns", path}}) + stage("lines", "text_lines", "files") +
                              stage("words", "split_text", "lines", {{"output", "words"}}) +
                              stage("y", "split_text", "words", {{"to", "float"}, {"output", "y"}}) +
                              stage("x", "split_text", "y", {{"to", "int64"}, {"output", "x"}}, "error_policy: skip");
    for (const std::string op : {"ragged_batch", "padded_batch"}) {
      const std::string text = split + stage("b", op, "x", {{"batch_size", "64"}}) + sink_after("b");
      const auto chunked = run_text(text), elements = run_text(text, {}, element_wise);
      QVERIFY2(chunked.result.state == sluice::RunState::Finished, chunked.result.error.c_str());
      QVERIFY(chunked.snapshot.stage(4).chunks_out() > 0);
      QCOMPARE(chunked.snapshot.stage(4).errors_skipped(), std::uint64_t(31));
      QCOMPARE(chunked.lines.size(), std::size_t((3000 - 31 + 63) / 64));
      QCOMPARE(chunked.lines, elements.lines);
    }
  }

  void prefetch_and_identity_pass_through_and_prefetch_sets_the_buffer() {
    auto out = run_ok(range(100) + stage("i", "identity", "src", {}, "parallelism: 4") +
                      stage("p", "prefetch", "i", {{"buffer_size", "3"}}) + sink_after("p"));
    QCOMPARE(all_integers(out.lines), iota(0, 100));
    QCOMPARE(out.snapshot.stage(2).buffer_capacity(), 3u);
  }

  void filter_random_keeps_about_p() {
    auto out = run_ok(range(4000) + stage("f", "filter_random", "src", {{"p", "0.25"}}) + sink_after("f"));
    QVERIFY(out.lines.size() > 850 && out.lines.size() < 1150);
    Ints got = all_integers(out.lines);
    QVERIFY(std::is_sorted(got.begin(), got.end()));
    auto none = run_ok(range(100) + stage("f", "filter_random", "src", {{"p", "0"}}) + sink_after("f"));
    QVERIFY(none.lines.empty());
  }

  void simulate_work_passes_elements_through() {
    auto out = run_ok(range(20) + stage("w", "simulate_work", "src", {{"us", "10"}, {"jitter_us", "50"}}, "parallelism: 3") +
                      sink_after("w"));
    QCOMPARE(all_integers(out.lines), iota(0, 20));
  }

  void null_sink_consumes_everything() {
    auto out = run_text(range(1000) + stage("out", "null_sink", "src"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.snapshot.stage(1).elements_out(), std::uint64_t(1000));
  }

  void jsonl_sink_writes_nested_lists_and_leaves_no_file_on_failure() {
    auto out = run_ok(range(6) + stage("b1", "batch", "src", {{"batch_size", "3"}}) + stage("b2", "batch", "b1", {{"batch_size", "2"}}) +
                      sink_after("b2"));
    QCOMPARE(out.lines, (std::vector<std::string>{R"({"value":[[0,1,2],[3,4,5]]})"}));
    QTemporaryDir dir;
    std::string path = dir.path().toStdString() + "/x.jsonl";
    auto failed = run_text(range(20) + stage("f", "fail_when", "src", {{"divisor", "9"}}) +
                           stage("out", "jsonl_sink", "f", {{"path", path}}));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY(!std::filesystem::exists(path));
  }
};

QTEST_APPLESS_MAIN(TestStdOps)
#include "tst_std_ops.moc"
