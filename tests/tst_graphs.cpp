// Pipelines as graphs: stages with several inputs (zip, concatenate, sample_from_datasets,
// choose_from_datasets) and outputs read by several stages (tee), held to tf.data's documented
// semantics, determinism at any parallelism, bounded memory, and wiring refused with its reason.
#include <QtTest>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <numeric>
#include <sstream>

#include "pipeline_runner.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/report.hpp"

using namespace sluice::test;

namespace {

std::string range(const std::string& id, int start, int count) {
  return stage(id, "range", "", {{"start", std::to_string(start)}, {"count", std::to_string(count)}});
}
// A stage with several inputs, in order.
std::string combine(const std::string& id, const std::string& op, const std::vector<std::string>& inputs,
                    const std::vector<std::pair<std::string, std::string>>& params = {}) {
  std::string extra;
  for (const auto& in : inputs) extra += "input: \"" + in + "\" ";
  return stage(id, op, "", params, extra);
}
std::string joined(const RunOutput& out) {
  std::string s;
  for (const auto& l : out.lines) s += l + "\n";
  return s;
}
// A weighted mixture of a (0..) and b (1000000..) through parallel stages, its first n outputs; with
// n 0, every element of two short inputs (the mixture goes on after one runs out).
std::string mixture(int seed, int parallelism, bool deterministic, int n = 3000) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  const int count = n > 0 ? 100000 : 1500;
  return "options { seed: " + std::to_string(seed) + " deterministic: " + (deterministic ? "true" : "false") + " }\n" +
         range("a", 0, count) + stage("wa", "simulate_work", "a", {{"us", "0"}, {"jitter_us", "20"}}, p) +
         range("b", 1000000, count) + stage("wb", "filter_random", "b", {{"p", "0.9"}}, p) +
         combine("mix", "sample_from_datasets", {"wa", "wb"}, {{"weights", "0.7,0.3"}}) +
         stage("after", "simulate_work", "mix", {{"us", "0"}, {"jitter_us", "20"}}, p) +
         (n > 0 ? stage("first", "take", "after", {{"count", std::to_string(n)}}) + sink_after("first") : sink_after("after"));
}

}  // namespace

class TestGraphs : public QObject {
  Q_OBJECT
 private slots:
  // tf.data's Dataset.zip documentation: a = range(1, 4), b = range(4, 7), c = range(7, 13).batch(2),
  // d = range(13, 15).
  void zip_gives_tf_datas_documented_elements() {
    auto ab = run_text(range("a", 1, 3) + range("b", 4, 3) + combine("z", "zip", {"a", "b"}, {{"prefixes", "a,b"}}) + sink_after("z"));
    QCOMPARE(ab.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(ab), std::string("{\"a/value\":1,\"b/value\":4}\n{\"a/value\":2,\"b/value\":5}\n{\"a/value\":3,\"b/value\":6}\n"));

    auto abc = run_text(range("a", 1, 3) + range("b", 4, 3) + range("c0", 7, 6) + stage("c", "batch", "c0", {{"batch_size", "2"}}) +
                        combine("z", "zip", {"a", "b", "c"}, {{"prefixes", "a,b,c"}}) + sink_after("z"));
    QCOMPARE(joined(abc), std::string("{\"a/value\":1,\"b/value\":4,\"c/value\":[7,8]}\n"
                                      "{\"a/value\":2,\"b/value\":5,\"c/value\":[9,10]}\n"
                                      "{\"a/value\":3,\"b/value\":6,\"c/value\":[11,12]}\n"));

    // The shortest input ends the zip.
    auto ad = run_text(range("a", 1, 3) + range("d", 13, 2) + combine("z", "zip", {"a", "d"}, {{"prefixes", "a,d"}}) + sink_after("z"));
    QCOMPARE(joined(ad), std::string("{\"a/value\":1,\"d/value\":13}\n{\"a/value\":2,\"d/value\":14}\n"));
    // What the zip leaves of the longer input is not made: its source is told to stop.
    auto shortest = run_text(range("a", 1, 3) + range("long", 0, 5000000) +
                             combine("z", "zip", {"a", "long"}, {{"prefixes", "a,b"}}) + sink_after("z"));
    QCOMPARE(shortest.lines.size(), std::size_t{3});
    for (const auto& m : shortest.snapshot.stage())
      if (m.id() == "long") QVERIFY2(m.elements_out() < 100000, qPrintable(QString::number(m.elements_out())));
  }

  // tf.data's Dataset.concatenate documentation: range(1, 4) then range(4, 8).
  void concatenate_gives_tf_datas_documented_elements() {
    auto out = run_text(range("a", 1, 3) + range("b", 4, 4) + combine("c", "concatenate", {"a", "b"}) + sink_after("c"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(all_integers(out.lines), (std::vector<long long>{1, 2, 3, 4, 5, 6, 7}));
  }

  // tf.data's choose_from_datasets documentation: "foo", "bar", "baz" repeated, chosen by
  // range(3).repeat(3).
  void choose_from_datasets_gives_tf_datas_documented_elements() {
    std::string text;
    for (const char* word : {"foo", "bar", "baz"})
      text += stage(std::string("w_") + word, "from_list", "", {{"values", word}, {"field", "word"}}) +
              stage(word, "repeat", std::string("w_") + word, {{"count", "-1"}});
    text += range("c0", 0, 3) + stage("choice", "repeat", "c0", {{"count", "3"}}) +
            combine("pick", "choose_from_datasets", {"foo", "bar", "baz", "choice"}, {{"field", "value"}}) + sink_after("pick");
    auto out = run_text(text);
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    std::string words;
    for (const auto& l : out.lines) words += l;
    // jsonl_sink writes bytes fields in base64: foo, bar and baz are Zm9v, YmFy and YmF6.
    QCOMPARE(words, std::string(R"({"word":"Zm9v"}{"word":"YmFy"}{"word":"YmF6"}{"word":"Zm9v"}{"word":"YmFy"}{"word":"YmF6"})"
                                R"({"word":"Zm9v"}{"word":"YmFy"}{"word":"YmF6"})"));
  }

  void choose_from_datasets_names_a_choice_out_of_range() {
    auto out = run_text(range("a", 0, 5) + range("b", 10, 5) + stage("c", "from_list", "", {{"values", "0,1,2"}}) +
                        combine("pick", "choose_from_datasets", {"a", "b", "c"}, {{"field", "value"}}) + sink_after("pick"));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("choice 2") != std::string::npos && out.result.error.find("'pick'") != std::string::npos &&
                 out.result.error.find("0 to 1") != std::string::npos,
             out.result.error.c_str());
  }

  void zip_refuses_fields_two_inputs_share_and_names_both() {
    auto out = run_text(range("a", 0, 3) + range("b", 0, 3) + combine("z", "zip", {"a", "b"}) + sink_after("z"));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("field 'value' comes from input 'a' and from input 'b'") != std::string::npos &&
                 out.result.error.find("prefixes") != std::string::npos,
             out.result.error.c_str());
    auto wrong = run_text(range("a", 0, 3) + range("b", 0, 3) + combine("z", "zip", {"a", "b"}, {{"prefixes", "x"}}) + sink_after("z"));
    QVERIFY2(wrong.error.find("prefixes names 1 inputs, but the stage has 2") != std::string::npos, wrong.error.c_str());
  }

  // Counts per input stay within 5 standard deviations of the weights for several seeds.
  void sample_from_datasets_follows_the_weights() {
    for (int seed : {1, 2, 3, 4, 5}) {
      auto out = run_text(mixture(seed, 1, true, 4000));
      QCOMPARE(out.result.state, sluice::RunState::Finished);
      QCOMPARE(out.lines.size(), std::size_t{4000});
      long long from_a = 0, last_a = -1, last_b = -1;
      for (long long v : all_integers(out.lines)) {
        if (v < 1000000) {
          ++from_a;
          QVERIFY2(v > last_a, "the elements of one input keep their order");
          last_a = v;
        } else {
          QVERIFY(v > last_b);
          last_b = v;
        }
      }
      const double expected = 0.7 * 4000, sd = std::sqrt(4000 * 0.7 * 0.3);
      QVERIFY2(std::abs(from_a - expected) < 5 * sd, qPrintable(QString("seed %1: %2 from a, expected %3").arg(seed).arg(from_a).arg(expected)));
    }
    QVERIFY(joined(run_text(mixture(1, 1, true))) != joined(run_text(mixture(2, 1, true))));
  }

  void a_mixture_is_byte_identical_at_parallelism_1_2_8_and_the_same_multiset_unordered() {
    for (int n : {3000, 0}) {
      const std::string one = joined(run_text(mixture(42, 1, true, n)));
      QVERIFY(!one.empty());
      for (int parallelism : {2, 8}) QCOMPARE(joined(run_text(mixture(42, parallelism, true, n))), one);
    }
    auto sorted_lines = [](const std::string& text) {
      std::vector<std::string> lines;
      std::istringstream in(text);
      for (std::string l; std::getline(in, l);) lines.push_back(l);
      std::sort(lines.begin(), lines.end());
      return lines;
    };
    auto unordered = run_text(mixture(42, 8, false, 0));
    QCOMPARE(unordered.result.state, sluice::RunState::Finished);
    QCOMPARE(sorted_lines(joined(unordered)), sorted_lines(joined(run_text(mixture(42, 1, true, 0)))));
  }

  void an_input_that_runs_out_leaves_the_others_or_stops_the_mixture() {
    // Without stopping: every element of both inputs, each input in its order.
    auto rest = run_text("options { seed: 7 }\n" + range("a", 0, 10) + range("b", 1000, 500) +
                         combine("mix", "sample_from_datasets", {"a", "b"}, {{"weights", "0.5,0.5"}}) + sink_after("mix"));
    QCOMPARE(rest.result.state, sluice::RunState::Finished);
    auto values = all_integers(rest.lines);
    QCOMPARE(values.size(), std::size_t{510});
    auto sorted = values;
    std::sort(sorted.begin(), sorted.end());
    std::vector<long long> expected;
    for (int i = 0; i < 10; ++i) expected.push_back(i);
    for (int i = 1000; i < 1500; ++i) expected.push_back(i);
    QCOMPARE(sorted, expected);
    // With stop_on_empty_dataset: it ends when a draw picks the empty input, so a's ten elements
    // came out, and b's outputs are its first ones.
    auto stop = run_text("options { seed: 7 }\n" + range("a", 0, 10) + range("b", 1000, 500) +
                         combine("mix", "sample_from_datasets", {"a", "b"}, {{"weights", "0.5,0.5"}, {"stop_on_empty_dataset", "true"}}) +
                         sink_after("mix"));
    QCOMPARE(stop.result.state, sluice::RunState::Finished);
    auto stopped = all_integers(stop.lines);
    QVERIFY2(stopped.size() < 100 && stopped.size() >= 10, qPrintable(QString::number(stopped.size())));
    QCOMPARE(std::count_if(stopped.begin(), stopped.end(), [](long long v) { return v < 10; }), 10);
    long long next_b = 1000;
    for (long long v : stopped)
      if (v >= 1000) QCOMPARE(v, next_b++);
    // A weight of 0 never picks its input.
    auto zero = run_text(range("a", 0, 10) + range("b", 1000, 10) +
                         combine("mix", "sample_from_datasets", {"a", "b"}, {{"weights", "0,1"}}) + sink_after("mix"));
    QCOMPARE(all_integers(zero.lines).front(), 1000LL);
    QCOMPARE(zero.lines.size(), std::size_t{10});
  }

  // tf.data: a.repeat(2).concatenate(b) is a a b; a.concatenate(b).repeat(2) is a b a b; zip with an
  // endless input ends with the other.
  void repeat_before_and_after_a_combinator_follow_tf_data() {
    auto before = run_text(range("a", 1, 2) + stage("ra", "repeat", "a", {{"count", "2"}}) + range("b", 10, 2) +
                           combine("c", "concatenate", {"ra", "b"}) + sink_after("c"));
    QCOMPARE(all_integers(before.lines), (std::vector<long long>{1, 2, 1, 2, 10, 11}));
    auto after = run_text(range("a", 1, 2) + range("b", 10, 2) + combine("c", "concatenate", {"a", "b"}) +
                          stage("r", "repeat", "c", {{"count", "2"}}) + sink_after("r"));
    QCOMPARE(all_integers(after.lines), (std::vector<long long>{1, 2, 10, 11, 1, 2, 10, 11}));
    auto endless = run_text(range("a", 0, 3) + stage("ra", "repeat", "a", {{"count", "-1"}}) + range("b", 10, 5) +
                            combine("z", "zip", {"ra", "b"}, {{"prefixes", "a,b"}}) + sink_after("z"));
    QCOMPARE(endless.result.state, sluice::RunState::Finished);
    QCOMPARE(all_integers(endless.lines), (std::vector<long long>{0, 10, 1, 11, 2, 12, 0, 13, 1, 14}));
  }

  // Every reader gets every element in order; a slow reader sets the pace without the buffers
  // growing; a reader that stops early (take) does not stop the others.
  void a_tee_gives_every_reader_every_element_with_bounded_memory() {
    QTemporaryDir dir;
    const std::string fast = dir.filePath("fast.jsonl").toStdString(), slow = dir.filePath("slow.jsonl").toStdString(),
                      few = dir.filePath("few.jsonl").toStdString();
    const int n = 4000, buffer = 16;
    const std::string text = stage("src", "range", "", {{"count", std::to_string(n)}}, "buffer_size: " + std::to_string(buffer)) +
                             stage("fast", "jsonl_sink", "src", {{"path", fast}}) +
                             stage("work", "simulate_work", "src", {{"us", "100"}}, "buffer_size: 8") +
                             stage("slow", "jsonl_sink", "work", {{"path", slow}}) +
                             stage("first", "take", "src", {{"count", "3"}}) + stage("few", "jsonl_sink", "first", {{"path", few}});
    sluice::Engine engine(graph_of(text), sluice::EngineOptions{std::chrono::milliseconds(5)});
    std::uint32_t most_held = 0, most_capacity = 0;
    std::size_t snapshots = 0;
    engine.subscribe([&](const sluice::metrics::MetricsSnapshot& snap) {
      ++snapshots;
      for (const auto& m : snap.stage())
        if (m.id() == "src") {
          std::uint32_t held = 0;
          for (const auto& r : m.readers()) {
            held += r.level();
            most_capacity = std::max(most_capacity, r.capacity());
          }
          most_held = std::max(most_held, held);
        }
    });
    engine.start();
    const auto result = engine.wait();
    QCOMPARE(result.state, sluice::RunState::Finished);
    QVERIFY(snapshots > 5);
    QCOMPARE(most_capacity, std::uint32_t(buffer));
    QVERIFY2(most_held <= 3 * buffer, qPrintable(QString("the tee held %1 elements in its three buffers of %2").arg(most_held).arg(buffer)));
    auto read_values = [](const std::string& path) {
      std::vector<std::string> lines;
      std::istringstream in(read_file(path));
      for (std::string l; std::getline(in, l);) lines.push_back(l);
      return all_integers(lines);
    };
    std::vector<long long> expected(n);
    std::iota(expected.begin(), expected.end(), 0);
    QCOMPARE(read_values(fast), expected);
    QCOMPARE(read_values(slow), expected);
    QCOMPARE(read_values(few), (std::vector<long long>{0, 1, 2}));
    // The snapshot has a buffer per edge, named by its reader.
    const auto snap = engine.snapshot();
    QStringList readers;
    for (const auto& m : snap.stage())
      if (m.id() == "src")
        for (const auto& r : m.readers()) readers << QString::fromStdString(r.reader());
    readers.sort();
    QCOMPARE(readers, (QStringList{"fast", "first", "work"}));
    // The report gives each reader's buffer too.
    const std::string report = sluice::format_report(snap);
    QVERIFY2(report.find("Buffers of 'src' per reader (mean fill): 'fast' ") != std::string::npos &&
                 report.find("'work' ") != std::string::npos,
             report.c_str());
  }

  void a_tee_branch_that_repeats_gets_its_iterations_and_the_other_one() {
    QTemporaryDir dir;
    const std::string once = dir.filePath("once.jsonl").toStdString();
    auto out = run_text(range("src", 0, 3) + stage("once", "jsonl_sink", "src", {{"path", once}}) +
                        stage("twice", "repeat", "src", {{"count", "2"}}) + sink_after("twice"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(all_integers(out.lines), (std::vector<long long>{0, 1, 2, 0, 1, 2}));
    std::vector<std::string> lines;
    std::istringstream in(read_file(once));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    QCOMPARE(all_integers(lines), (std::vector<long long>{0, 1, 2}));
  }

  void bad_wiring_is_refused_with_the_stage_and_input_named() {
    auto one_input = run_text(range("a", 0, 3) + combine("z", "zip", {"a"}) + sink_after("z"));
    QVERIFY2(one_input.error.find("'zip' takes 2 or more inputs, got 1") != std::string::npos, one_input.error.c_str());
    QVERIFY(one_input.error.find("stage 'z'") != std::string::npos || one_input.error.find("'z'") != std::string::npos);
    auto two_for_a_map = run_text(range("a", 0, 3) + range("b", 0, 3) + combine("m", "identity", {"a", "b"}) + sink_after("m"));
    QVERIFY2(two_for_a_map.error.find("'identity' takes one input, got 2") != std::string::npos, two_for_a_map.error.c_str());
    auto twice = run_text(range("a", 0, 3) + combine("z", "zip", {"a", "a"}) + sink_after("z"));
    QVERIFY2(twice.error.find("lists input 'a' twice") != std::string::npos, twice.error.c_str());
    auto rejoin = run_text(range("a", 0, 3) + stage("l", "identity", "a") + stage("r", "identity", "a") +
                           combine("c", "concatenate", {"l", "r"}) + sink_after("c"));
    QVERIFY2(rejoin.error.find("reads stage 'a' through two branches") != std::string::npos, rejoin.error.c_str());
    auto cycle = run_text(range("a", 0, 3) + combine("c", "concatenate", {"a", "m"}) + stage("m", "identity", "c") + sink_after("c"));
    QVERIFY2(cycle.error.find("form a cycle") != std::string::npos, cycle.error.c_str());
    auto unknown = run_text(range("a", 0, 3) + combine("c", "concatenate", {"a", "nope"}) + sink_after("c"));
    QVERIFY2(unknown.error.find("input 'nope' names no stage") != std::string::npos, unknown.error.c_str());
    auto weights = run_text(range("a", 0, 3) + range("b", 0, 3) +
                            combine("mix", "sample_from_datasets", {"a", "b"}, {{"weights", "1,2,3"}}) + sink_after("mix"));
    QVERIFY2(weights.error.find("weights has 3 values, but the stage has 2 inputs") != std::string::npos, weights.error.c_str());
  }

  // The report names the branch that starves a mixing stage, and finds the bottleneck across
  // branches.
  void the_report_names_the_branch_that_starves_a_mixture() {
    auto out = run_text(range("a", 0, 100000) + range("b", 1000000, 3000) +
                        stage("slow", "simulate_work", "b", {{"us", "300"}}) +
                        combine("mix", "sample_from_datasets", {"a", "slow"}, {{"stop_on_empty_dataset", "true"}}) +
                        stage("out", "null_sink", "mix"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(out.snapshot.bottleneck(), std::string("slow"));
    std::string advice;
    for (const auto& s : sluice::suggest_changes(out.snapshot)) advice += s + "\n";
    QVERIFY2(advice.find("the branch ending at 'slow' starves 'mix'") != std::string::npos &&
                 advice.find("its busiest stage is 'slow'") != std::string::npos,
             advice.c_str());
  }

  // On several workers, each dataset of a mixture is sharded: the workers' outputs are disjoint
  // and together hold every element.
  void each_input_of_a_mixture_is_sharded_between_workers() {
    const std::string text = "options { seed: 5 }\n" + range("a", 0, 300) + range("b", 1000, 200) +
                             combine("mix", "sample_from_datasets", {"a", "b"}, {{"weights", "0.6,0.4"}}) + sink_after("mix");
    std::vector<long long> all;
    for (int index : {0, 1}) {
      sluice::WorkerPlan plan;
      auto out = run_text_as_worker(text, sluice::WorkerIdentity{index, 2, "test", "--worker-index"}, &plan);
      QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
      std::string notes;
      for (const auto& n : plan.notes) notes += n + "\n";
      QVERIFY2(notes.find("added after 'a'") != std::string::npos && notes.find("added after 'b'") != std::string::npos, notes.c_str());
      auto values = all_integers(out.lines);
      QCOMPARE(values.size(), std::size_t{250});
      all.insert(all.end(), values.begin(), values.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<long long> expected;
    for (int i = 0; i < 300; ++i) expected.push_back(i);
    for (int i = 1000; i < 1200; ++i) expected.push_back(i);
    QCOMPARE(all, expected);
  }

  // split: complementary ranges on two branches of a tee share the data out, each element once.
  void split_branches_share_the_elements_out() {
    QTemporaryDir dir;
    const std::string eval = dir.filePath("eval.jsonl").toStdString();
    auto out = run_text("options { seed: 3 }\n" + range("src", 0, 2000) + stage("train", "split", "src", {{"to", "0.8"}}) +
                        sink_after("train") + stage("held", "split", "src", {{"from", "0.8"}}) +
                        stage("eval", "jsonl_sink", "held", {{"path", eval}}));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    std::vector<std::string> lines;
    std::istringstream in(read_file(eval));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    auto both = all_integers(out.lines);
    const auto train_count = both.size();
    for (long long v : all_integers(lines)) both.push_back(v);
    std::sort(both.begin(), both.end());
    std::vector<long long> expected(2000);
    std::iota(expected.begin(), expected.end(), 0);
    QCOMPARE(both, expected);
    QVERIFY2(train_count > 1500 && train_count < 1700, qPrintable(QString::number(train_count)));
  }
};

QTEST_GUILESS_MAIN(TestGraphs)
#include "tst_graphs.moc"
