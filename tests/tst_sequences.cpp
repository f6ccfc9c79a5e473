// Variable-length data: padded, ragged and bucketed batches, windows, packing, text lines and
// fixed-length records. The expected outputs of padded_batch, ragged_batch, window and
// bucket_by_sequence_length are the element sequences tf.data's API documentation prints.
#include <QtTest>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>

#include <fmt/format.h>

#include "pipeline_runner.hpp"
#include "plain_integers.hpp"

using namespace sluice::test;
namespace fs = std::filesystem;
using Lines = std::vector<std::string>;
using Ints = std::vector<long long>;

namespace {

RunOutput run_ok(const std::string& text, const sluice::EngineOptions& options = {}) {
  auto out = run_text(text, {}, options);
  if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
    qFatal("pipeline did not finish: %s %s", out.error.c_str(), out.result.error.c_str());
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// list_files(path) -> text_lines -> split_text(int64) as field `field`: one integer sequence per line.
std::string int_lines(const std::string& path, const std::string& field = "x", const std::string& prefix = "",
                      const std::string& lines_extra = "") {
  return stage(prefix + "files", "list_files", "", {{"patterns", path}}) +
         stage(prefix + "lines", "text_lines", prefix + "files", {}, lines_extra) +
         stage(prefix + "split", "split_text", prefix + "lines", {{"to", "int64"}, {"output", field}}) +
         stage(prefix + "seq", "select_fields", prefix + "split", {{"keep", field}});
}

std::string tf(const std::string& name) { return testdata_dir() + "/tfrecord/" + name; }

}  // namespace

class TestSequences : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::string fill_;  // tf.fill([x], x) for x in 1..4, one line each (the padded_batch docs' A)

  std::string path(const std::string& name) const { return dir_.path().toStdString() + "/" + name; }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    fill_ = path("fill.txt");
    write_file(fill_, "1\n2 2\n3 3 3\n4 4 4 4\n");
  }

  // ---- split_text: str.split() then int() / float(), exact values ----
  void split_text_reads_integers_exactly() {
    // Signs, leading zeros, tabs and runs of blanks, an empty line, the largest int64s (19 digits:
    // past the one-pass reader, read by the general one), "+-5" as strtoll reads it.
    write_file(path("ints.txt"), "-3 +4 0 007  12\t-0\n\n 9223372036854775807 -9223372036854775808 \n999999999999999999 +-5\n");
    auto ints = run_ok(int_lines(path("ints.txt")) + sink_after("seq"));
    QCOMPARE(ints.lines, (Lines{R"({"x":[-3,4,0,7,12,0]})", R"({"x":[]})", R"({"x":[9223372036854775807,-9223372036854775808]})",
                                R"({"x":[999999999999999999,-5]})"}));
    // One bad token fails its line, naming the token, whichever reader met it first.
    for (const std::string bad : {"1 2 3x 4", "1 - 2", "1 9999999999999999999", "1 2.5"}) {
      write_file(path("bad.txt"), "5 6\n" + bad + "\n");
      auto failed = run_text(int_lines(path("bad.txt")) + sink_after("seq"));
      QVERIFY2(failed.result.state == sluice::RunState::Failed, bad.c_str());
      QVERIFY2(failed.result.error.find("token 2 of field 'line'") != std::string::npos || failed.result.error.find("token 1 of field 'line'") != std::string::npos,
               failed.result.error.c_str());
      QVERIFY2(failed.result.error.find("is not an int64") != std::string::npos, failed.result.error.c_str());
      QVERIFY2(failed.result.error.find("bad.txt record 1") != std::string::npos, failed.result.error.c_str());
    }
    // Floats and a separator keep their own paths.
    write_file(path("floats.txt"), "1.5 -2 3e2\n");
    auto floats = run_ok(stage("files", "list_files", "", {{"patterns", path("floats.txt")}}) + stage("lines", "text_lines", "files") +
                         stage("split", "split_text", "lines", {{"to", "float"}}) + sink_after("split"));
    QVERIFY2(floats.lines.size() == 1 && floats.lines[0].find("\"line\":[1.5,-2,300]") != std::string::npos, floats.lines[0].c_str());
    write_file(path("csvish.txt"), "4,,5\n");
    auto separated = run_text(stage("files", "list_files", "", {{"patterns", path("csvish.txt")}}) + stage("lines", "text_lines", "files") +
                              stage("split", "split_text", "lines", {{"to", "int64"}, {"separator", ","}}) + sink_after("split"));
    QVERIFY2(separated.result.error.find("token 1 of field 'line', '', is not an int64") != std::string::npos, separated.result.error.c_str());
  }

  // The one-pass reader reads 8 bytes at a time: on random texts of digits, blanks, signs and
  // letters, each in memory that ends where the text does (so that a read past it is a sanitizer
  // error), it agrees with a plain reading: split at blanks, each token a sign and 1 to 18 digits.
  void split_texts_one_pass_reader_agrees_with_a_plain_reading() {
    const std::string alphabet = "0123456789012345678901234567890123456789     \t\r\n\v\f--++ax.";
    std::mt19937_64 random(23);
    auto plain = [](const std::string& text, Ints& out) {
      std::size_t at = 0;
      auto blank = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
      for (;;) {
        while (at < text.size() && blank(text[at])) ++at;
        if (at == text.size()) return true;
        std::size_t stop = at;
        while (stop < text.size() && !blank(text[stop])) ++stop;
        const std::string token = text.substr(at, stop - at);
        const std::size_t sign = token[0] == '-' || token[0] == '+' ? 1 : 0;
        const std::string digits = token.substr(sign);
        if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
        const long long value = std::stoll(digits);
        out.push_back(token[0] == '-' ? -value : value);
        at = stop;
      }
    };
    std::size_t read = 0, refused = 0;
    for (int k = 0; k < 200000; ++k) {
      std::string text;
      const int tokens = static_cast<int>(random() % 6);
      for (int t = 0; t < tokens; ++t) {
        if (random() % 3 == 0) text += std::string(random() % 3, ' ');
        if (random() % 8 == 0) text += random() % 2 ? '-' : '+';
        const int length = static_cast<int>(random() % 21);  // 0 to 20 digits: past 8 and past 18
        for (int d = 0; d < length; ++d) text += static_cast<char>('0' + random() % 10);
        if (random() % 10 == 0) text += alphabet[random() % alphabet.size()];
        if (t + 1 < tokens || random() % 2) text += random() % 6 ? ' ' : '\t';
      }
      const auto bytes = std::make_unique<char[]>(text.size() + 1);  // + 1: no zero-sized array
      std::memcpy(bytes.get(), text.data(), text.size());
      Ints expected, got;
      const bool plain_ok = plain(text, expected);
      const bool ok = sluice::std_ops::read_plain_integers(std::string_view(bytes.get(), text.size()),
                                                            [&](std::int64_t v) { got.push_back(v); });
      QVERIFY2(ok == plain_ok, ("'" + text + "'").c_str());
      if (ok) {
        QVERIFY2(got == expected, ("'" + text + "'").c_str());
        read += got.size();
      } else {
        ++refused;
      }
    }
    // Both outcomes were met many times.
    QVERIFY2(read > 100000 && refused > 10000, (std::to_string(read) + " read, " + std::to_string(refused) + " refused").c_str());
  }

  // ---- padded_batch: tf.data.Dataset.padded_batch's documented examples ----
  void padded_batch_pads_to_the_longest_of_each_batch() {
    auto b = run_ok(int_lines(fill_) + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}}) + sink_after("pb"));
    QCOMPARE(b.lines, (Lines{R"({"x":[[1,0],[2,2]]})", R"({"x":[[3,3,3,0],[4,4,4,4]]})"}));
    // The report's padding share: 2 of the 12 values written are padding.
    QCOMPARE(b.snapshot.stage(4).padding_values(), std::uint64_t(2));
    QCOMPARE(b.snapshot.stage(4).data_values(), std::uint64_t(10));
  }
  void padded_batch_pads_to_a_fixed_size_with_a_value() {
    auto c = run_ok(int_lines(fill_) + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padded_shapes", "x:5"}}) + sink_after("pb"));
    QCOMPARE(c.lines, (Lines{R"({"x":[[1,0,0,0,0],[2,2,0,0,0]]})", R"({"x":[[3,3,3,0,0],[4,4,4,4,0]]})"}));
    auto d = run_ok(int_lines(fill_) +
                    stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padded_shapes", "x:5"}, {"padding_values", "-1"}}) +
                    sink_after("pb"));
    QCOMPARE(d.lines, (Lines{R"({"x":[[1,-1,-1,-1,-1],[2,2,-1,-1,-1]]})", R"({"x":[[3,3,3,-1,-1],[4,4,4,4,-1]]})"}));
  }
  // Fields of rank 2 whose inner sizes differ (batches of lines padded once, then batched again):
  // every dimension padded to the longest, with the value given (256: its first byte is 0, and a
  // fill decided by the first byte would give zeros).
  void padded_batch_pads_every_dimension_of_rank_2_fields_with_their_value() {
    write_file(path("ragged2.txt"), "1 2 3\n4\n5 6 7 8 9\n10 11\n");
    auto out = run_ok(int_lines(path("ragged2.txt")) +
                      stage("inner", "padded_batch", "seq", {{"batch_size", "2"}, {"padding_values", "-1"}}) +
                      stage("outer", "padded_batch", "inner", {{"batch_size", "2"}, {"padding_values", "256"}}) + sink_after("outer"));
    QCOMPARE(out.lines, (Lines{R"({"x":[[[1,2,3,256,256],[4,-1,-1,256,256]],[[5,6,7,8,9],[10,11,-1,-1,-1]]]})"}));
  }
  // CRLF line ends are not part of the line, on the element path (a sink right after the reader)
  // and on the chunked one (a batch after it takes the read buffer's lines as one chunk).
  void text_lines_drops_crlf_on_both_paths() {
    write_file(path("crlf.txt"), "ab\r\ncd\r\n\r\nlast");
    const std::string read = stage("files", "list_files", "", {{"patterns", path("crlf.txt")}}) + stage("lines", "text_lines", "files");
    QCOMPARE(run_ok(read + sink_after("lines")).lines, (Lines{R"({"line":"YWI="})", R"({"line":"Y2Q="})", R"({"line":""})", R"({"line":"bGFzdA=="})"}));
    QCOMPARE(run_ok(read + stage("b", "batch", "lines", {{"batch_size", "4"}}) + sink_after("b")).lines,
             (Lines{R"({"line":["YWI=","Y2Q=","","bGFzdA=="]})"}));
  }
  void padded_batch_pads_fields_independently() {
    // elements ([1, 2, 3], [10]) and ([4, 5], [11, 12]); padded_shapes ([4], [None]), padding_values (-1, 100).
    write_file(path("a.txt"), "1 2 3\n4 5\n");
    write_file(path("b.txt"), "10\n11 12\n");
    const std::string zipped = int_lines(path("a.txt"), "a", "a_") + int_lines(path("b.txt"), "b", "b_") +
                               "stage { id: \"zip\" op: \"zip\" input: \"a_seq\" input: \"b_seq\" }\n";
    auto out = run_ok(zipped +
                      stage("pb", "padded_batch", "zip",
                            {{"batch_size", "2"}, {"padded_shapes", "a:4, b:-1"}, {"padding_values", "a:-1, b:100"}}) +
                      sink_after("pb"));
    QCOMPARE(out.lines, (Lines{R"({"a":[[1,2,3,-1],[4,5,-1,-1]],"b":[[10,100],[11,12]]})"}));
    // Dataset.zip((A, A)).padded_batch(2, padding_values=-1): one value pads every field.
    const std::string twice = int_lines(fill_, "a", "a_") + int_lines(fill_, "b", "b_") +
                              "stage { id: \"zip\" op: \"zip\" input: \"a_seq\" input: \"b_seq\" }\n";
    auto e = run_ok(twice + stage("pb", "padded_batch", "zip", {{"batch_size", "2"}, {"padding_values", "-1"}}) + sink_after("pb"));
    QCOMPARE(e.lines, (Lines{R"({"a":[[1,-1],[2,2]],"b":[[1,-1],[2,2]]})", R"({"a":[[3,3,3,-1],[4,4,4,4]],"b":[[3,3,3,-1],[4,4,4,4]]})"}));
  }
  void padded_batch_drop_remainder_lengths_and_masks() {
    auto out = run_ok(int_lines(fill_) +
                      stage("pb", "padded_batch", "seq",
                            {{"batch_size", "3"}, {"drop_remainder", "true"}, {"lengths", "x"}, {"masks", "x"}}) +
                      sink_after("pb"));
    QCOMPARE(out.lines, (Lines{R"({"x":[[1,0,0],[2,2,0],[3,3,3]],"x_length":[1,2,3],"x_mask":[[1,0,0],[1,1,0],[1,1,1]]})"}));
  }
  void padded_batch_refuses_an_element_longer_than_its_padded_shape() {
    const std::string chain = int_lines(fill_);
    auto failed = run_text(chain + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padded_shapes", "x:3"}}) + sink_after("pb"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("field 'x' is [4], longer than its padded shape [3]") != std::string::npos, failed.result.error.c_str());
    QVERIFY2(failed.result.error.find("fill.txt record 3") != std::string::npos, failed.result.error.c_str());
    // Under the skip policy only that element goes, named in the report; its batch is kept.
    auto skipped = run_ok(chain + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padded_shapes", "x:3"}}, "error_policy: skip") +
                          sink_after("pb"));
    QCOMPARE(skipped.lines, (Lines{R"({"x":[[1,0,0],[2,2,0]]})", R"({"x":[[3,3,3]]})"}));
    QCOMPARE(skipped.snapshot.stage(4).errors_skipped(), std::uint64_t(1));
  }
  void padded_batch_bad_parameters_are_named() {
    auto bad = run_text(int_lines(fill_) + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padded_shapes", "x:5y"}}) + sink_after("pb"));
    QVERIFY2(bad.error.find("padded_shapes entry 'x:5y'") != std::string::npos, bad.error.c_str());
    auto value = run_text(int_lines(fill_) + stage("pb", "padded_batch", "seq", {{"batch_size", "2"}, {"padding_values", "x:1.5"}}) + sink_after("pb"));
    QCOMPARE(value.result.state, sluice::RunState::Failed);
    QVERIFY2(value.result.error.find("padding value '1.5' for field 'x' (i64)") != std::string::npos, value.result.error.c_str());
  }

  // ---- ragged_batch: dense_to_ragged_batch's example, range(x) for x in 0..5, batch 2 ----
  void ragged_batch_keeps_rows_unpadded() {
    write_file(path("ranges.txt"), "\n0\n0 1\n0 1 2\n0 1 2 3\n0 1 2 3 4\n");
    auto lengths = run_ok(int_lines(path("ranges.txt")) + stage("rb", "ragged_batch", "seq", {{"batch_size", "2"}}) + sink_after("rb"));
    QCOMPARE(lengths.lines, (Lines{R"({"x":[0],"x_row_lengths":[0,1]})", R"({"x":[0,1,0,1,2],"x_row_lengths":[2,3]})",
                                   R"({"x":[0,1,2,3,0,1,2,3,4],"x_row_lengths":[4,5]})"}));
    auto splits = run_ok(int_lines(path("ranges.txt")) + stage("rb", "ragged_batch", "seq", {{"batch_size", "4"}, {"row_partition", "row_splits"}}) +
                         sink_after("rb"));
    QCOMPARE(splits.lines, (Lines{R"({"x":[0,0,1,0,1,2],"x_row_splits":[0,0,1,3,6]})", R"({"x":[0,1,2,3,0,1,2,3,4],"x_row_splits":[0,4,9]})"}));
    // Assembled on two threads: the same batches.
    auto parallel = run_ok(int_lines(path("ranges.txt")) + stage("rb", "ragged_batch", "seq", {{"batch_size", "2"}}, "parallelism: 2") +
                           sink_after("rb"));
    QCOMPARE(parallel.lines, lengths.lines);
  }

  // ---- bucket_by_sequence_length's two documented examples ----
  void bucket_by_sequence_length_as_documented() {
    write_file(path("buckets.txt"), "0\n1 2 3 4\n5 6 7\n7 8 9 10 11\n13 14 15 16 19 20\n21 22\n");
    auto out = run_ok(int_lines(path("buckets.txt")) +
                      stage("b", "bucket_by_sequence_length", "seq", {{"length_field", "x"}, {"boundaries", "3,5"}, {"batch_sizes", "2,2,2"}}) +
                      sink_after("b"));
    QCOMPARE(out.lines, (Lines{R"({"x":[[1,2,3,4],[5,6,7,0]]})", R"({"x":[[7,8,9,10,11,0],[13,14,15,16,19,20]]})", R"({"x":[[0,0],[21,22]]})"}));

    write_file(path("buckets2.txt"), "0 0\n1 2 3 4\n5 6 7\n7 8 9 10 11\n13 14 15 16 19 20\n21 22\n");
    auto padded = run_ok(int_lines(path("buckets2.txt")) +
                         stage("b", "bucket_by_sequence_length", "seq",
                               {{"length_field", "x"}, {"boundaries", "4,7"}, {"batch_sizes", "2,2,2"}, {"pad_to_bucket_boundary", "true"},
                                {"padding_values", "-1"}}) +
                         sink_after("b"));
    QCOMPARE(padded.lines, (Lines{R"({"x":[[0,0,-1],[5,6,7]]})", R"({"x":[[1,2,3,4,-1,-1],[7,8,9,10,11,-1]]})", R"({"x":[[21,22,-1]]})",
                                  R"({"x":[[13,14,15,16,19,20]]})"}));
  }
  void bucket_by_sequence_length_refusals() {
    auto sizes = run_text(int_lines(fill_) + stage("b", "bucket_by_sequence_length", "seq", {{"length_field", "x"}, {"boundaries", "3,5"}, {"batch_sizes", "2,2"}}) +
                          sink_after("b"));
    QVERIFY2(sizes.error.find("batch_sizes has 2 sizes; 2 boundaries make 3 buckets") != std::string::npos, sizes.error.c_str());
    auto order = run_text(int_lines(fill_) + stage("b", "bucket_by_sequence_length", "seq", {{"length_field", "x"}, {"boundaries", "5,3"}, {"batch_sizes", "2,2,2"}}) +
                          sink_after("b"));
    QVERIFY2(order.error.find("boundaries must increase") != std::string::npos, order.error.c_str());
    auto too_long = run_text(int_lines(fill_) +
                             stage("b", "bucket_by_sequence_length", "seq",
                                   {{"length_field", "x"}, {"boundaries", "2,4"}, {"batch_sizes", "1,1,1"}, {"pad_to_bucket_boundary", "true"}}) +
                             sink_after("b"));
    QCOMPARE(too_long.result.state, sluice::RunState::Failed);
    QVERIFY2(too_long.result.error.find("length 4 of field 'x' is not below the last boundary 4") != std::string::npos, too_long.result.error.c_str());
  }

  // ---- window: Dataset.range(7).window(...) as documented (each window batched) ----
  void window_as_documented() {
    const std::string src = stage("src", "range", "", {{"count", "7"}});
    // Each case also with its windows stacked on three threads: the same windows, in order.
    auto windows = [&](const std::vector<std::pair<std::string, std::string>>& params) {
      const Lines one = run_ok(src + stage("w", "window", "src", params) + sink_after("w")).lines;
      const Lines three = run_ok(src + stage("w", "window", "src", params, "parallelism: 3") + sink_after("w")).lines;
      return three == one ? one : Lines{"stacked on 3 threads, the windows differ"};
    };
    QCOMPARE(windows({{"size", "3"}}), (Lines{R"({"value":[0,1,2]})", R"({"value":[3,4,5]})", R"({"value":[6]})"}));
    QCOMPARE(windows({{"size", "3"}, {"drop_remainder", "true"}}), (Lines{R"({"value":[0,1,2]})", R"({"value":[3,4,5]})"}));
    QCOMPARE(windows({{"size", "3"}, {"shift", "2"}, {"drop_remainder", "true"}}),
             (Lines{R"({"value":[0,1,2]})", R"({"value":[2,3,4]})", R"({"value":[4,5,6]})"}));
    QCOMPARE(windows({{"size", "3"}, {"shift", "1"}, {"stride", "2"}, {"drop_remainder", "true"}}),
             (Lines{R"({"value":[0,2,4]})", R"({"value":[1,3,5]})", R"({"value":[2,4,6]})"}));
    QCOMPARE(windows({{"size", "3"}, {"shift", "1"}}),
             (Lines{R"({"value":[0,1,2]})", R"({"value":[1,2,3]})", R"({"value":[2,3,4]})", R"({"value":[3,4,5]})", R"({"value":[4,5,6]})",
                    R"({"value":[5,6]})", R"({"value":[6]})"}));
    // Windows that skip elements (shift larger than the window) and windows per iteration.
    QCOMPARE(windows({{"size", "2"}, {"shift", "3"}}), (Lines{R"({"value":[0,1]})", R"({"value":[3,4]})", R"({"value":[6]})"}));
    auto per_epoch = run_ok(stage("src", "range", "", {{"count", "5"}}) + stage("w", "window", "src", {{"size", "2"}}) +
                            stage("rep", "repeat", "w", {{"count", "2"}}) + sink_after("rep"));
    QCOMPARE(per_epoch.lines.size(), std::size_t(6));
    QCOMPARE(per_epoch.lines[2], std::string(R"({"value":[4]})"));
    QCOMPARE(per_epoch.lines[3], std::string(R"({"value":[0,1]})"));
  }
  // With a key, windows hold consecutive elements of one key only (one sensor's readings).
  void window_by_key_and_stacked_channels() {
    write_file(path("two_assets.csv"), "asset,t,a,b\n0,0,1,10\n0,1,2,20\n0,2,3,30\n1,0,4,40\n1,1,5,50\n1,2,6,60\n1,3,7,70\n");
    const std::string rows = stage("files", "list_files", "", {{"patterns", path("two_assets.csv")}}) + stage("csv", "csv_reader", "files") +
                             stage("stack", "stack_fields", "csv", {{"fields", "a,b"}, {"output", "x"}, {"dtype", "i64"}}) +
                             stage("only", "select_fields", "stack", {{"keep", "asset, x"}});
    auto out = run_ok(rows + stage("w", "window", "only", {{"size", "2"}, {"shift", "1"}, {"key_field", "asset"}, {"drop_remainder", "true"}}) +
                      sink_after("w"));
    QCOMPARE(out.lines, (Lines{R"({"asset":[0,0],"x":[[1,10],[2,20]]})", R"({"asset":[0,0],"x":[[2,20],[3,30]]})", R"({"asset":[1,1],"x":[[4,40],[5,50]]})",
                               R"({"asset":[1,1],"x":[[5,50],[6,60]]})", R"({"asset":[1,1],"x":[[6,60],[7,70]]})"}));
    auto short_ones = run_ok(rows + stage("w", "window", "only", {{"size", "2"}, {"key_field", "asset"}}) + sink_after("w"));
    QCOMPARE(short_ones.lines, (Lines{R"({"asset":[0,0],"x":[[1,10],[2,20]]})", R"({"asset":[0],"x":[[3,30]]})", R"({"asset":[1,1],"x":[[4,40],[5,50]]})",
                                      R"({"asset":[1,1],"x":[[6,60],[7,70]]})"}));
  }
  void window_refuses_elements_of_another_shape() {
    auto out = run_text(int_lines(fill_) + stage("w", "window", "seq", {{"size", "2"}}) + sink_after("w"));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("field 'x' is i64[2] here and i64[1]") != std::string::npos, out.result.error.c_str());
  }
  // A recording of 10 steps of 2 readings, windowed into 4 steps, 3 apart: the autoencoder's
  // (num_timesteps x num_dimensions) inputs.
  void window_field_windows_one_long_sequence() {
    // Steps as rows: window_field over a [10, 2] field.
    write_file(path("rows.txt"), "0 1\n10 11\n20 21\n30 31\n40 41\n50 51\n60 61\n70 71\n80 81\n90 91\n");
    const std::string recording = int_lines(path("rows.txt")) + stage("rec", "window", "seq", {{"size", "10"}});  // one [10, 2] element
    auto out = run_ok(recording + stage("wf", "window_field", "rec", {{"field", "x"}, {"size", "4"}, {"shift", "3"}, {"drop_remainder", "true"}}) +
                      sink_after("wf"));
    QCOMPARE(out.lines, (Lines{R"({"x":[[0,1],[10,11],[20,21],[30,31]]})", R"({"x":[[30,31],[40,41],[50,51],[60,61]]})",
                               R"({"x":[[60,61],[70,71],[80,81],[90,91]]})"}));
    auto strided = run_ok(recording + stage("wf", "window_field", "rec", {{"field", "x"}, {"size", "3"}, {"shift", "4"}, {"stride", "2"}}) +
                          sink_after("wf"));
    QCOMPARE(strided.lines, (Lines{R"({"x":[[0,1],[20,21],[40,41]]})", R"({"x":[[40,41],[60,61],[80,81]]})", R"({"x":[[80,81]]})"}));
  }

  // ---- SequenceExamples (torchdata's test file: 3, 5, 7, 9 frames of 10 values) ----
  void sequence_examples_batched_padded_and_ragged() {
    const std::string parsed = stage("files", "list_files", "", {{"patterns", tf("torchdata_sequence_example.tfrecord")}}) +
                               stage("read", "tfrecord_reader", "files") +
                               stage("parse", "parse_example", "read",
                                     {{"features", "x_int:int64[10]"}, {"sequence_features", "x_int_seq:int64[10], x_float_seq:float[10]"}});
    // Frame f of record r holds 100r + 10k (ints) and 10r + k (floats), k < 10.
    auto frame_ints = [](int r) {
      Ints v;
      for (int k = 0; k < 10; ++k) v.push_back(100 * r + 10 * k);
      return v;
    };
    auto padded = run_ok(parsed + stage("pb", "padded_batch", "parse", {{"batch_size", "2"}, {"lengths", "x_int_seq"}}) + sink_after("pb"));
    QCOMPARE(padded.lines.size(), std::size_t(2));
    for (int b = 0; b < 2; ++b) {
      const std::string& line = padded.lines[static_cast<std::size_t>(b)];
      const auto begin = line.find("\"x_int_seq\":"), end = line.find("\"x_int_seq_length\"");
      const Ints seq = integers(line.substr(begin, end - begin));
      const int longest = 5 + 4 * b;  // 5, then 9 frames
      Ints expected;
      for (int r = 2 * b; r < 2 * b + 2; ++r)
        for (int f = 0; f < longest; ++f) {
          const Ints frame = f < 3 + 2 * r ? frame_ints(r) : Ints(10, 0);
          expected.insert(expected.end(), frame.begin(), frame.end());
        }
      QCOMPARE(seq, expected);
      QVERIFY2(line.find("\"x_int_seq_length\":[" + std::to_string(3 + 4 * b) + "," + std::to_string(5 + 4 * b) + "]") != std::string::npos, line.c_str());
      QVERIFY(line.find("\"x_float_seq\":[[[" + std::to_string(20 * b) + ",") != std::string::npos);
    }
    auto ragged = run_ok(parsed + stage("rb", "ragged_batch", "parse", {{"batch_size", "4"}, {"fields", "x_int_seq, x_float_seq"}}) + sink_after("rb"));
    QCOMPARE(ragged.lines.size(), std::size_t(1));
    const std::string& line = ragged.lines[0];
    const auto begin = line.find("\"x_int_seq\":"), end = line.find("\"x_int_seq_row_lengths\"");
    Ints expected;
    for (int r = 0; r < 4; ++r)
      for (int f = 0; f < 3 + 2 * r; ++f) {
        const Ints frame = frame_ints(r);
        expected.insert(expected.end(), frame.begin(), frame.end());
      }
    QCOMPARE(integers(line.substr(begin, end - begin)), expected);
    QVERIFY2(line.find("\"x_int_seq_row_lengths\":[3,5,7,9]") != std::string::npos, line.c_str());
    QVERIFY2(line.find("\"x_float_seq_row_lengths\":[3,5,7,9]") != std::string::npos, line.c_str());
    QVERIFY2(line.find("\"x_int\":[[0,10,") != std::string::npos, line.c_str());  // a fixed field is stacked
  }

  // TFX's SequenceExamples: frames of text (feature list s: "10500", "10501" in record 0, one more
  // in each next record), batched ragged and padded with a text padding value.
  void text_feature_lists_batched_ragged_and_padded() {
    const std::string parsed = stage("files", "list_files", "", {{"patterns", tf("tfx_sequence_eval.tfrecord.gz")}}) +
                               stage("read", "tfrecord_reader", "files") +
                               stage("parse", "parse_example", "read", {{"features", "i:int64=-7"}, {"sequence_features", "s:bytes[]"}}) +
                               stage("only", "select_fields", "parse", {{"keep", "s"}}) + stage("first", "take", "only", {{"count", "4"}});
    auto b64 = [](int v) { return QByteArray::number(v).toBase64().toStdString(); };
    auto ragged = run_ok(parsed + stage("rb", "ragged_batch", "first", {{"batch_size", "4"}}) + sink_after("rb"));
    std::string values;
    for (int r = 0; r < 4; ++r) values += (r ? ",[\"" : "[\"") + b64(10500 + r) + "\"],[\"" + b64(10501 + r) + "\"]";
    QCOMPARE(ragged.lines, (Lines{R"({"s":[)" + values + R"(],"s_row_lengths":[2,2,2,2]})"}));
    auto padded = run_ok(parsed + stage("pb", "padded_batch", "first", {{"batch_size", "2"}, {"padded_shapes", "s:3x1"}, {"padding_values", "s:<none>"}}) +
                         sink_after("pb"));
    const std::string none = "\"" + QByteArray("<none>").toBase64().toStdString() + "\"";
    QCOMPARE(padded.lines.front(), R"({"s":[[[")" + b64(10500) + R"("],[")" + b64(10501) + R"("],[)" + none + R"(]],[[")" + b64(10501) + R"("],[")" +
                                       b64(10502) + R"("],[)" + none + R"(]]]})");
  }

  // ---- packing ----
  // First-fit, exactly: a sequence goes into the first open row with room for it (an exact fit
  // included), and a row closed because open_rows were open takes nothing more.
  void pack_sequences_is_first_fit_within_open_rows() {
    auto rows_of = [&](const std::string& text, int length, int open_rows) {
      write_file(path("first_fit.txt"), text);
      auto out = run_ok(int_lines(path("first_fit.txt"), "tokens") +
                        stage("pack", "pack_sequences", "seq",
                              {{"fields", "tokens"}, {"length", std::to_string(length)}, {"open_rows", std::to_string(open_rows)}}) +
                        sink_after("pack"));
      std::vector<Ints> rows;
      for (const auto& line : out.lines) {
        const auto t0 = line.find("\"tokens\":"), s0 = line.find("\"segment_ids\":");
        rows.push_back(integers(line.substr(t0, s0 - t0)));
      }
      return rows;
    };
    QCOMPARE(rows_of("1 2 3 4 5\n6 7 8\n9\n", 8, 2), (std::vector<Ints>{{1, 2, 3, 4, 5, 6, 7, 8}, {9, 0, 0, 0, 0, 0, 0, 0}}));
    QCOMPARE(rows_of("1 2 3 4 5 6\n7 8 9 10 11\n12 13\n", 8, 1), (std::vector<Ints>{{1, 2, 3, 4, 5, 6, 0, 0}, {7, 8, 9, 10, 11, 12, 13, 0}}));
    QCOMPARE(rows_of("1 2 3 4 5 6\n7 8 9 10 11\n12 13\n", 8, 2), (std::vector<Ints>{{1, 2, 3, 4, 5, 6, 12, 13}, {7, 8, 9, 10, 11, 0, 0, 0}}));
  }

  void packing_loses_and_duplicates_no_token() {
    // 300 sequences of 0..40 tokens (some longer than the row), every token id distinct.
    std::mt19937 gen(7);
    std::string text;
    std::vector<Ints> sequences;
    long long next = 1;
    for (int s = 0; s < 300; ++s) {
      const int n = static_cast<int>(gen() % 41);
      Ints seq;
      for (int k = 0; k < n; ++k) {
        text += (k ? " " : "") + std::to_string(next);
        seq.push_back(next++);
      }
      text += "\n";
      sequences.push_back(seq);
    }
    write_file(path("tokens.txt"), text);
    const int length = 32;
    auto out = run_ok(int_lines(path("tokens.txt"), "tokens") +
                      stage("pack", "pack_sequences", "seq", {{"fields", "tokens"}, {"length", std::to_string(length)}, {"open_rows", "4"}}) +
                      sink_after("pack"));
    std::map<long long, int> seen;
    std::set<long long> firsts;  // every segment's first token
    long long used = 0;
    for (const auto& line : out.lines) {
      const auto t0 = line.find("\"tokens\":"), s0 = line.find("\"segment_ids\":"), p0 = line.find("\"positions\":");
      const Ints tokens = integers(line.substr(t0, s0 - t0)), segments = integers(line.substr(s0, p0 - s0)), positions = integers(line.substr(p0));
      QCOMPARE(tokens.size(), std::size_t(length));
      QCOMPARE(segments.size(), std::size_t(length));
      long long segment = 0;
      for (int j = 0; j < length; ++j) {
        if (segments[j] == 0) {  // padding: to the end of the row, zeros
          for (int k = j; k < length; ++k) QVERIFY(segments[k] == 0 && tokens[k] == 0 && positions[k] == 0);
          break;
        }
        ++used;
        ++seen[tokens[j]];
        if (segments[j] != segment) {
          QCOMPARE(segments[j], segment + 1);  // segments numbered 1, 2, ... in the row
          QCOMPARE(positions[j], 0LL);
          segment = segments[j];
          firsts.insert(tokens[j]);
        } else {
          QCOMPARE(positions[j], positions[j - 1] + 1);
          QCOMPARE(tokens[j], tokens[j - 1] + 1);  // a segment is a run of one sequence
        }
      }
    }
    QCOMPARE(used, next - 1);
    QCOMPARE(static_cast<long long>(seen.size()), next - 1);
    for (const auto& [token, count] : seen) QCOMPARE(count, 1);
    // Each sequence starts a segment; one longer than a row starts one more per row it fills.
    for (const auto& seq : sequences)
      for (std::size_t k = 0; k < seq.size(); k += length) QVERIFY(firsts.count(seq[k]));
    qInfo("packed %lld tokens into %zu rows of %d: %.1f%% padding", used, out.lines.size(), length,
          100.0 * (1.0 - double(used) / double(out.lines.size() * length)));
    QCOMPARE(out.snapshot.stage(4).data_values(), std::uint64_t(used));
    QCOMPARE(out.snapshot.stage(4).padding_values(), std::uint64_t(out.lines.size() * length - used));

    auto failed = run_text(int_lines(path("tokens.txt"), "tokens") +
                           stage("pack", "pack_sequences", "seq", {{"fields", "tokens"}, {"length", "16"}, {"too_long", "fail"}}) + sink_after("pack"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("tokens is longer than a packed row (length 16)") != std::string::npos, failed.result.error.c_str());
    auto extra = run_text(stage("files", "list_files", "", {{"patterns", path("tokens.txt")}}) + stage("lines", "text_lines", "files") +
                          stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "tokens"}}) +
                          stage("pack", "pack_sequences", "split", {{"fields", "tokens"}, {"length", "16"}}) + sink_after("pack"));
    QVERIFY2(extra.result.error.find("has a field 'line' that is not packed") != std::string::npos, (extra.error + extra.result.error).c_str());
  }

  // ---- text_lines ----
  void text_lines_line_ends_empty_lines_and_gzip() {
    write_file(path("crlf.txt"), "first\r\n\r\nthird\nlast without end");
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", path("crlf.txt")}}) + stage("lines", "text_lines", "files") + sink_after("lines"));
    // base64 of "first", "", "third", "last without end"
    QCOMPARE(out.lines, (Lines{R"({"line":"Zmlyc3Q="})", R"({"line":""})", R"({"line":"dGhpcmQ="})", R"({"line":"bGFzdCB3aXRob3V0IGVuZA=="})"}));
    write_file(path("plain.txt"), "a\nb\n\nc\n");
    QCOMPARE(std::system(("gzip -c " + path("plain.txt") + " > " + path("plain.txt.gz")).c_str()), 0);
    auto gz = run_ok(stage("files", "list_files", "", {{"patterns", path("plain.txt.gz")}}) +
                     stage("lines", "text_lines", "files", {{"skip_header_lines", "1"}}) + sink_after("lines"));
    QCOMPARE(gz.lines, (Lines{R"({"line":"Yg=="})", R"({"line":""})", R"({"line":"Yw=="})"}));
    write_file(path("empty.txt"), "");
    auto none = run_ok(stage("files", "list_files", "", {{"patterns", path("empty.txt")}}) + stage("lines", "text_lines", "files") + sink_after("lines"));
    QVERIFY(none.lines.empty());
  }
  void text_lines_interleaves_many_files_and_spans_read_chunks() {
    // Lines longer than the 1 MiB read chunk, across several files read four at a time.
    std::set<std::string> want;
    for (int f = 0; f < 6; ++f) {
      std::string text;
      for (int k = 0; k < 5; ++k) {
        const std::string line = std::to_string(f) + "-" + std::to_string(k) + std::string(static_cast<std::size_t>(300000 * k), 'x');
        text += line + "\n";
        want.insert(std::to_string(f) + "-" + std::to_string(k) + ":" + std::to_string(line.size()));
      }
      write_file(path("many" + std::to_string(f) + ".txt"), text);
    }
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", path("many*.txt")}}) +
                      stage("lines", "text_lines", "files", {}, "parallelism: 2 interleave { cycle_length: 4 block_length: 2 }") +
                      sink_after("lines"));
    std::set<std::string> got;
    for (const auto& line : out.lines) {
      const auto begin = line.find(":\"") + 2;
      const QByteArray text = QByteArray::fromBase64(QByteArray::fromStdString(line.substr(begin, line.rfind('"') - begin)));
      got.insert(text.left(text.indexOf('x') < 0 ? text.size() : text.indexOf('x')).toStdString() + ":" + std::to_string(text.size()));
    }
    QCOMPARE(got, want);
  }
  void text_lines_refuses_a_1gb_line_naming_file_and_line() {
    // A sparse 1 GiB line (no line end), then a short one: the limit stops the reader long before
    // it would hold the line.
    const std::string huge = path("huge.txt");
    write_file(huge, "ok\n");
    fs::resize_file(huge, (1ull << 30) + 3);
    std::ofstream(huge, std::ios::binary | std::ios::app) << "\nafter\n";
    const std::string chain = stage("files", "list_files", "", {{"patterns", huge}});
    auto failed = run_text(chain + stage("lines", "text_lines", "files") + stage("out", "null_sink", "lines"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("huge.txt line 2 (byte offset 3): longer than max_line_bytes (67108864)") != std::string::npos,
             failed.result.error.c_str());
    auto skipped = run_ok(chain + stage("lines", "text_lines", "files", {{"max_line_bytes", "1000"}}, "error_policy: skip") + sink_after("lines"));
    QCOMPARE(skipped.lines, (Lines{R"({"line":"b2s="})", R"({"line":"YWZ0ZXI="})"}));
    QCOMPARE(skipped.snapshot.stage(1).errors_skipped(), std::uint64_t(1));
    QVERIFY(skipped.snapshot.stage(1).skip_reasons(0).find("huge.txt line 2") != std::string::npos);
    fs::remove(huge);
  }

  // ---- chunks: text_lines, split_text, select_fields and the sequence aggregates ----
  void text_chunks_give_what_elements_give() {
    // Three files of token lines (0..90 tokens, empty lines, CRLF ends in one, no final newline in
    // another), one over the 1 MiB read buffer: lines go on in chunks of one buffer. Interleaved
    // two at a time in blocks of 7 (a chunk is cut at a block's end) or read one by one, then each
    // sequence layout: the outputs are those of the element-wise run, line for line.
    std::mt19937 gen(11);
    for (int f = 0; f < 3; ++f) {
      std::string text;
      const int lines = f == 0 ? 6000 : 700;
      for (int l = 0; l < lines; ++l) {
        const int n = static_cast<int>(gen() % 91);
        for (int k = 0; k < n; ++k) text += (k ? " " : "") + std::to_string(gen() % 100000);
        if (l + 1 < lines || f != 1) text += f == 2 ? "\r\n" : "\n";
      }
      write_file(path("chunky" + std::to_string(f) + ".txt"), text);
    }
    QVERIFY(fs::file_size(path("chunky0.txt")) > (1u << 20));
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::vector<std::pair<std::string, std::string>> layouts{
        {"padded", stage("out_layout", "padded_batch", "seq", {{"batch_size", "7"}, {"lengths", "x"}, {"masks", "x"}}) + sink_after("out_layout")},
        {"bucketed", stage("out_layout", "bucket_by_sequence_length", "seq",
                           {{"length_field", "x"}, {"boundaries", "8,16,32"}, {"batch_sizes", "3,5,7,9"}, {"padding_values", "-1"}}) +
                         sink_after("out_layout")},
        {"packed", stage("out_layout", "pack_sequences", "seq", {{"fields", "x"}, {"length", "24"}, {"open_rows", "3"}}) +
                       stage("rows", "batch", "out_layout", {{"batch_size", "4"}}) + sink_after("rows")},
        {"fixed padded", stage("out_layout", "padded_batch", "seq", {{"batch_size", "16"}, {"padded_shapes", "x:96"}, {"drop_remainder", "true"}}) +
                             sink_after("out_layout")},
        {"ragged", stage("out_layout", "ragged_batch", "seq", {{"batch_size", "7"}}) + sink_after("out_layout")},
        {"ragged splits", stage("out_layout", "ragged_batch", "seq", {{"batch_size", "9"}, {"row_partition", "row_splits"}}) +
                              sink_after("out_layout")}};
    // Under a sanitizer only the interleaved read on two workers, whose threads it watches (the
    // single reader is the same chunking code on one thread): 31 s of ThreadSanitizer's stage.
#ifdef SLUICE_SANITIZED
    const std::vector<int> worker_counts{2};
#else
    const std::vector<int> worker_counts{1, 2};
#endif
    for (const auto& [name, tail] : layouts) {
      for (int workers : worker_counts) {
        const std::string lines_extra = workers == 1 ? "" : "parallelism: 2 interleave { cycle_length: 2 block_length: 7 }";
        const std::string text = int_lines(path("chunky*.txt"), "x", "", lines_extra) + tail;
        const auto chunked = run_text(text), elements = run_text(text, {}, element_wise);
        const std::string what = name + " on " + std::to_string(workers) + " workers";
        QVERIFY2(chunked.result.state == sluice::RunState::Finished, (what + ": " + chunked.result.error + chunked.error).c_str());
        QVERIFY2(!chunked.lines.empty() && chunked.lines == elements.lines, what.c_str());
        for (int s = 1; s <= 3; ++s) {  // lines, split and select_fields handed on chunks, of every row
          QVERIFY2(chunked.snapshot.stage(s).chunks_out() > 0, (what + ", stage " + std::to_string(s)).c_str());
          QCOMPARE(chunked.snapshot.stage(s).chunked_elements_out(), chunked.snapshot.stage(s).elements_out());
          QCOMPARE(elements.snapshot.stage(s).chunks_out(), std::uint64_t(0));
        }
        QCOMPARE(chunked.snapshot.stage(4).padding_values(), elements.snapshot.stage(4).padding_values());
        if (name != "packed") {  // batches assembled on three threads: the same batches, in order
          const auto parallel = run_text(text, {"out_layout.parallelism=3"});
          QVERIFY2(parallel.lines == elements.lines, (what + ", assembled on 3 threads").c_str());
          QCOMPARE(parallel.snapshot.stage(4).workers(), 3u);
          QCOMPARE(parallel.snapshot.stage(4).padding_values(), elements.snapshot.stage(4).padding_values());
        }
        // Chunks follow the blocks of 7: one per block, but for the few cut short where a read
        // buffer or a file ends (a block is not cut in two for the rest of the file after that).
        if (workers == 2)
          QVERIFY2(chunked.snapshot.stage(1).chunks_out() <= chunked.snapshot.stage(1).elements_out() / 7 + 12,
                   (std::to_string(chunked.snapshot.stage(1).chunks_out()) + " chunks").c_str());
      }
    }
  }

  void ragged_batch_of_chunks_refuses_a_stacked_field_whose_length_changes() {
    // Two fields of every line's numbers: y batched ragged, x stacked. Lines of 3 numbers but one
    // of 4 (row 1700, inside a chunk): x cannot be stacked there. Refused as the element-wise run
    // refuses it, ending the run, or under skip that row alone, chunk or no chunk.
    std::string text;
    for (int l = 0; l < 3000; ++l) text += l == 1700 ? "1 2 3 4\n" : std::to_string(l) + " 5 6\n";
    write_file(path("stacked.txt"), text);
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    for (const std::string policy : {"error_policy: skip", ""}) {
      const std::string pipeline = stage("files", "list_files", "", {{"patterns", path("stacked.txt")}}) + stage("lines", "text_lines", "files") +
                                   stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "x"}}) +
                                   stage("split2", "split_text", "split", {{"to", "int64"}, {"output", "y"}}) +
                                   stage("pair", "select_fields", "split2", {{"keep", "x, y"}}) +
                                   stage("rb", "ragged_batch", "pair", {{"batch_size", "64"}, {"fields", "y"}}, policy) + sink_after("rb");
      const auto chunked = run_text(pipeline), elements = run_text(pipeline, {}, element_wise);
      QVERIFY(chunked.snapshot.stage(1).chunks_out() > 0);
      QCOMPARE(chunked.result.error, elements.result.error);
      if (policy.empty()) {
        QCOMPARE(chunked.result.state, sluice::RunState::Failed);
        QVERIFY2(chunked.result.error.find("it is stacked (not listed in fields), so its shape must not change") != std::string::npos,
                 chunked.result.error.c_str());
        continue;
      }
      QCOMPARE(chunked.result.state, sluice::RunState::Finished);
      QCOMPARE(chunked.lines, elements.lines);
      QCOMPARE(chunked.lines.size(), std::size_t((3000 - 1 + 63) / 64));
      QCOMPARE(chunked.snapshot.stage(5).errors_skipped(), std::uint64_t(1));
    }
  }

  void a_damaged_gzip_stream_keeps_the_lines_before_it() {
    // A gzip file cut short: the lines read before the damage go on, chunk or no chunk, and the
    // damage is reported once (skip) or ends the run (no skip) with the element-wise run's message.
    std::string text;
    for (int l = 0; l < 300000; ++l) text += std::to_string(l) + " " + std::to_string(l * 7 % 1000) + "\n";
    write_file(path("cut.txt"), text);
    QCOMPARE(std::system(("gzip -c " + path("cut.txt") + " > " + path("cut.txt.gz")).c_str()), 0);
    fs::resize_file(path("cut.txt.gz"), fs::file_size(path("cut.txt.gz")) / 2);
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    for (const std::string policy : {"error_policy: skip", ""}) {
      const std::string pipeline = stage("files", "list_files", "", {{"patterns", path("cut.txt.gz")}}) +
                                   stage("lines", "text_lines", "files", {}, policy) + stage("split", "split_text", "lines", {{"to", "int64"}}) +
                                   stage("pb", "padded_batch", "split", {{"batch_size", "1000"}}) + sink_after("pb");
      const auto chunked = run_text(pipeline), elements = run_text(pipeline, {}, element_wise);
      QVERIFY(chunked.snapshot.stage(1).chunks_out() > 0);
      QCOMPARE(chunked.result.error, elements.result.error);
      QCOMPARE(chunked.snapshot.stage(1).elements_out(), elements.snapshot.stage(1).elements_out());
      QVERIFY(chunked.snapshot.stage(1).elements_out() > 1000);
      if (policy.empty()) {
        QCOMPARE(chunked.result.state, sluice::RunState::Failed);
        continue;
      }
      QCOMPARE(chunked.result.state, sluice::RunState::Finished);
      QCOMPARE(chunked.lines, elements.lines);
      QCOMPARE(chunked.snapshot.stage(1).errors_skipped(), std::uint64_t(1));
    }
  }

  void a_bad_line_inside_a_chunk_is_named_and_skipped_alone() {
    // Line 1500 of 3000 holds a token that is no integer, and under a fixed padded shape line 2100
    // is too long: each is skipped alone under skip, named by file and line, and the run stops at
    // the first without skip, as element by element.
    std::string text;
    std::string long_line;
    for (int k = 0; k < 60; ++k) long_line += "5 ";
    for (int l = 0; l < 3000; ++l)
      text += l == 1500 ? "1 2 x3 4\n" : l == 2100 ? long_line + "\n" : std::to_string(l) + " " + std::to_string(l % 7) + "\n";
    write_file(path("damaged.txt"), text);
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::string chain = stage("files", "list_files", "", {{"patterns", path("damaged.txt")}}) + stage("lines", "text_lines", "files");
    for (const std::string policy : {"error_policy: skip", ""}) {
      const std::string pipeline = chain + stage("split", "split_text", "lines", {{"to", "int64"}}, policy) +
                                   stage("pb", "padded_batch", "split", {{"batch_size", "10"}, {"padded_shapes", "line:50"}}, policy) +
                                   sink_after("pb");
      const auto chunked = run_text(pipeline), elements = run_text(pipeline, {}, element_wise);
      QCOMPARE(chunked.lines, elements.lines);
      QCOMPARE(chunked.result.error, elements.result.error);
      QVERIFY(chunked.snapshot.stage(2).chunks_out() > 0);
      if (policy.empty()) {
        QCOMPARE(chunked.result.state, sluice::RunState::Failed);
        QVERIFY2(chunked.result.error.find("damaged.txt record 1500") != std::string::npos, chunked.result.error.c_str());
        QVERIFY2(chunked.result.error.find("token 2 of field 'line', 'x3', is not an int64") != std::string::npos, chunked.result.error.c_str());
        continue;
      }
      QCOMPARE(chunked.result.state, sluice::RunState::Finished);
      QCOMPARE(chunked.lines.size(), std::size_t(300 - 1 + 1));  // 2998 lines in batches of 10: 299 full, one of 8
      QCOMPARE(chunked.snapshot.stage(2).errors_skipped(), std::uint64_t(1));
      QVERIFY(chunked.snapshot.stage(2).skip_reasons(0).find("damaged.txt record 1500") != std::string::npos);
      QCOMPARE(chunked.snapshot.stage(3).errors_skipped(), std::uint64_t(1));
      QVERIFY2(chunked.snapshot.stage(3).skip_reasons(0).find("damaged.txt record 2100") != std::string::npos,
               chunked.snapshot.stage(3).skip_reasons(0).c_str());
      QVERIFY(chunked.snapshot.stage(3).skip_reasons(0).find("longer than its padded shape [50]") != std::string::npos);
    }
  }

  void a_line_kept_beside_its_tokens_batches_in_chunks() {
    // split_text into another field keeps each line's text, a column of spans of the read buffer:
    // padded and bucketed batches of both, in chunks, are those of the element-wise run (this
    // crashed the process: the text column was taken for one of bytes of another type).
    write_file(path("kept.txt"), "1 2\n3\n\n4 5 6 7\n8 9\n10\n");
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::string split = stage("files", "list_files", "", {{"patterns", path("kept.txt")}}) + stage("lines", "text_lines", "files") +
                              stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "tokens"}});
    for (const std::string& layout :
         {stage("b", "padded_batch", "split", {{"batch_size", "4"}, {"lengths", "tokens"}}),
          stage("b", "bucket_by_sequence_length", "split", {{"length_field", "tokens"}, {"boundaries", "2"}, {"batch_sizes", "2,2"}})}) {
      const auto chunked = run_ok(split + layout + sink_after("b"));
      QVERIFY(chunked.snapshot.stage(2).chunks_out() > 0);
      QCOMPARE(chunked.lines, run_ok(split + layout + sink_after("b"), element_wise).lines);
    }
    QCOMPARE(run_ok(split + stage("b", "padded_batch", "split", {{"batch_size", "4"}}) + sink_after("b")).lines.front(),
             std::string(R"({"line":["MSAy","Mw==","","NCA1IDYgNw=="],"tokens":[[1,2,0,0],[3,0,0,0],[0,0,0,0],[4,5,6,7]]})"));
  }

  // ---- per-input stages: tf.data's interleave(lambda f: TextLineDataset(f).map(...).padded_batch(...)) ----
  void per_input_batches_never_mix_inputs() {
    // Five files of 3 to 31 lines (one empty line, one file with no final newline): split and
    // padded per input on the interleave's readers, each file's batches are those of a pipeline
    // reading that file alone, in that order; with one input open at a time they follow file by
    // file, and the interleaved order is the same at any parallelism.
    std::mt19937 gen(5);
    std::vector<Lines> alone;
    for (int f = 0; f < 5; ++f) {
      std::string text;
      const int lines = 3 + 7 * f;
      for (int l = 0; l < lines; ++l) {
        const int n = f == 2 && l == 1 ? 0 : 1 + static_cast<int>(gen() % 9);
        for (int k = 0; k < n; ++k) text += (k ? " " : "") + std::to_string(f * 10000 + l * 10 + k);
        if (l + 1 < lines || f != 3) text += "\n";
      }
      const std::string file = path("per_input" + std::to_string(f) + ".txt");
      write_file(file, text);
      alone.push_back(run_ok(int_lines(file) + stage("pb", "padded_batch", "seq", {{"batch_size", "4"}, {"lengths", "x"}}) + sink_after("pb")).lines);
    }
    auto per_input = [&](int parallelism, int cycle, int block) {
      return stage("files", "list_files", "", {{"patterns", path("per_input*.txt")}, {"shuffle", "false"}}) +
             stage("lines", "text_lines", "files", {},
                   fmt::format("parallelism: {} interleave {{ cycle_length: {} block_length: {} }}", parallelism, cycle, block)) +
             stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "x"}}, "per_input: true") +
             stage("seq", "select_fields", "split", {{"keep", "x"}}, "per_input: true") +
             stage("pb", "padded_batch", "seq", {{"batch_size", "4"}, {"lengths", "x"}}, "per_input: true") + sink_after("pb");
    };
    Lines one_by_one;
    for (const auto& lines : alone) one_by_one.insert(one_by_one.end(), lines.begin(), lines.end());
    QCOMPARE(run_ok(per_input(1, 1, 1)).lines, one_by_one);
    for (int block : {1, 3}) {
      const auto sequential = run_ok(per_input(1, 3, block));
      for (int parallelism : {2, 3}) QCOMPARE(run_ok(per_input(parallelism, 3, block)).lines, sequential.lines);
      // Every file's batches, each whole and in its order, none from two files.
      std::vector<std::size_t> next(alone.size(), 0);
      for (const auto& line : sequential.lines) {
        const auto digit = line.find_first_of("0123456789", line.find("\"x\""));
        const std::size_t f = static_cast<std::size_t>(std::stoll(line.substr(digit)) / 10000);
        QVERIFY(f < alone.size() && next[f] < alone[f].size());
        QCOMPARE(line, alone[f][next[f]++]);
      }
      for (std::size_t f = 0; f < alone.size(); ++f) QCOMPARE(next[f], alone[f].size());
      // The stages count their own elements; the readers' lines reach the batches.
      const auto& snap = sequential.snapshot;
      QCOMPARE(snap.stage(1).elements_out(), snap.stage(2).elements_in());
      QCOMPARE(snap.stage(4).elements_out(), std::uint64_t(sequential.lines.size()));
      QCOMPARE(snap.stage(4).fused_with(), std::string("lines"));
      QVERIFY(snap.stage(4).per_input());
      QVERIFY(snap.stage(4).padding_values() > 0);
    }
  }
  void per_input_take_and_errors_are_each_stages_own() {
    // A take per input keeps each file's first batch; a line that is no integer fails the run
    // naming stage 'split' and its file and line, or is skipped and counted there under skip.
    write_file(path("pi_err0.txt"), "1 2\n3\n4 5 6\n7\n8\n");
    write_file(path("pi_err1.txt"), "10\n11 x\n12 13\n14\n");
    const std::string lines = stage("files", "list_files", "", {{"patterns", path("pi_err*.txt")}}) +
                              stage("lines", "text_lines", "files", {}, "parallelism: 2 interleave { cycle_length: 2 }");
    auto chain = [&](const std::string& policy, const std::string& tail) {
      return lines + stage("split", "split_text", "lines", {{"to", "int64"}}, "per_input: true " + policy) +
             stage("pb", "padded_batch", "split", {{"batch_size", "2"}}, "per_input: true") + tail;
    };
    auto failed = run_text(chain("", sink_after("pb")));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("stage 'split' (split_text)") != std::string::npos, failed.result.error.c_str());
    QVERIFY2(failed.result.error.find("pi_err1.txt record 1") != std::string::npos, failed.result.error.c_str());
    QCOMPARE(failed.result.failed_stage, std::string("split"));
    auto skipped = run_ok(chain("error_policy: skip", sink_after("pb")));
    QCOMPARE(skipped.lines, (Lines{R"({"line":[[1,2],[3,0]]})", R"({"line":[[10,0],[12,13]]})", R"({"line":[[4,5,6],[7,0,0]]})",
                                   R"({"line":[[14]]})", R"({"line":[[8]]})"}));
    QCOMPARE(skipped.snapshot.stage(2).errors_skipped(), std::uint64_t(1));
    QCOMPARE(skipped.snapshot.stage(1).errors_skipped(), std::uint64_t(0));
    auto first = run_ok(chain("error_policy: skip", stage("first", "take", "pb", {{"count", "1"}}, "per_input: true") + sink_after("first")));
    QCOMPARE(first.lines, (Lines{R"({"line":[[1,2],[3,0]]})", R"({"line":[[10,0],[12,13]]})"}));
  }
  void per_input_read_ahead_is_bounded_in_bytes_behind_a_slow_consumer() {
    // Batches of 2 MiB made per input behind a consumer taking 50 ms each: the readers run ahead
    // by a bounded number of bytes, not by counts alone. Before, a reader made a whole read
    // chunk's batches at once (256 lines: 512 MiB per input) and read 4 of its outputs ahead: 511
    // of the run's 600 batches were made before the consumer had taken 12.
    for (int f = 0; f < 2; ++f) {
      std::string text;
      for (int l = 0; l < 300; ++l) text += std::to_string(l) + " " + std::to_string(f) + "\n";
      write_file(path("ahead" + std::to_string(f) + ".txt"), text);
    }
    sluice::EngineOptions options;
    options.default_buffer_bytes = 1 << 20;
    sluice::Engine engine(
        graph_of(stage("files", "list_files", "", {{"patterns", path("ahead*.txt")}}) +
                 stage("lines", "text_lines", "files", {}, "parallelism: 2 interleave { cycle_length: 2 }") +
                 stage("split", "split_text", "lines", {{"to", "int64"}}, "per_input: true") +
                 stage("pb", "padded_batch", "split", {{"batch_size", "1"}, {"padded_shapes", "line:262144"}}, "per_input: true") +
                 stage("slow", "simulate_work", "pb", {{"us", "50000"}}) + stage("out", "null_sink", "slow")),
        options);
    engine.start();
    std::uint64_t most_ahead = 0, consumed = 0;
    for (int i = 0; i < 150 && consumed < 12; ++i) {  // 0.6 s at least, on a loaded machine up to 3 s
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto snap = engine.snapshot();
      const std::uint64_t made = snap.stage(3).elements_out();
      consumed = snap.stage(4).elements_in();
      most_ahead = std::max(most_ahead, made - std::min(made, consumed));
    }
    engine.stop();
    QCOMPARE(engine.wait().state, sluice::RunState::Stopped);
    QVERIFY2(consumed >= 1, "the slow stage took no batch");
    // Per input, 16 MiB read ahead and 16 MiB taken by the interleave's coordinator (each plus the
    // batch that crossed it: 18 batches) and 4 MiB being made (2); then 16 MiB waiting to be
    // handed on (9), and the buffers' 1 MiB each plus a batch (2): 51 at most.
    QVERIFY2(most_ahead >= 8 && most_ahead <= 51, qPrintable(QString("%1 batches of 2 MiB made ahead of the consumer").arg(most_ahead)));
  }
  void per_input_stages_are_refused_where_they_cannot_run() {
    const std::string lines = stage("files", "list_files", "", {{"patterns", fill_}}) + stage("lines", "text_lines", "files");
    auto refusal = [&](const std::string& text) {
      auto out = run_text(text);
      return out.error;
    };
    const std::string split = stage("split", "split_text", "lines", {{"to", "int64"}});
    std::string e = refusal(lines + split + stage("pb", "padded_batch", "split", {{"batch_size", "2"}}, "per_input: true") + sink_after("pb"));
    QVERIFY2(e.find("stage 'pb'") != std::string::npos && e.find("its input 'split' is a map, not an expand stage") != std::string::npos, e.c_str());
    e = refusal(lines + stage("split", "split_text", "lines", {{"to", "int64"}}, "per_input: true parallelism: 2") + sink_after("split"));
    QVERIFY2(e.find("runs on the readers of the interleave 'lines'; set `parallelism` there") != std::string::npos, e.c_str());
    e = refusal(lines + stage("out", "null_sink", "lines", {}, "per_input: true"));
    QVERIFY2(e.find("'null_sink' is a sink; per_input applies to maps, filters and aggregates") != std::string::npos, e.c_str());
    e = refusal(lines + stage("twice", "repeat", "lines", {{"count", "2"}}, "per_input: true") + sink_after("twice"));
    QVERIFY2(e.find("'repeat' reads its input several times per iteration") != std::string::npos, e.c_str());
    e = refusal(lines + stage("split", "split_text", "lines", {{"to", "int64"}}, "per_input: true buffer_size: 4") +
                stage("pb", "padded_batch", "split", {{"batch_size", "2"}}, "per_input: true") + sink_after("pb"));
    QVERIFY2(e.find("set `buffer_size` on the last per-input stage") != std::string::npos, e.c_str());
    e = refusal(lines + stage("split", "split_text", "lines", {{"to", "int64"}}, "per_input: true") + sink_after("split") +
                stage("other", "null_sink", "lines"));
    QVERIFY2(e.find("its input 'lines' is read by 2 stages") != std::string::npos, e.c_str());
  }

  // ---- fixed_length_records ----
  void fixed_length_records_header_footer_and_truncation() {
    write_file(path("fixed.bin"), "HEAD" "aaaaa" "bbbbb" "ccccc" "FT");
    const std::string chain = stage("files", "list_files", "", {{"patterns", path("fixed.bin")}});
    const std::vector<std::pair<std::string, std::string>> params{{"record_bytes", "5"}, {"header_bytes", "4"}, {"footer_bytes", "2"}};
    auto out = run_ok(chain + stage("rec", "fixed_length_records", "files", params) + sink_after("rec"));
    QCOMPARE(out.lines, (Lines{R"({"record":"YWFhYWE="})", R"({"record":"YmJiYmI="})", R"({"record":"Y2NjY2M="})"}));
    write_file(path("cut.bin"), "HEAD" "aaaaa" "bbbbb" "cc" "FT");
    const std::string cut = stage("files", "list_files", "", {{"patterns", path("cut.bin")}});
    auto failed = run_text(cut + stage("rec", "fixed_length_records", "files", params) + sink_after("rec"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("cut.bin record 2 (byte offset 14): truncated, 2 of 5 bytes") != std::string::npos, failed.result.error.c_str());
    auto skipped = run_ok(cut + stage("rec", "fixed_length_records", "files", params, "error_policy: skip") + sink_after("rec"));
    QCOMPARE(skipped.lines, (Lines{R"({"record":"YWFhYWE="})", R"({"record":"YmJiYmI="})"}));
    QCOMPARE(skipped.snapshot.stage(1).errors_skipped(), std::uint64_t(1));
    QVERIFY(skipped.snapshot.stage(1).skip_reasons(0).find("truncated") != std::string::npos);
    // Compressed: the footer is found at the end of the stream.
    QCOMPARE(std::system(("gzip -c " + path("fixed.bin") + " > " + path("fixed.bin.gz")).c_str()), 0);
    auto gz = run_ok(stage("files", "list_files", "", {{"patterns", path("fixed.bin.gz")}}) + stage("rec", "fixed_length_records", "files", params) +
                     sink_after("rec"));
    QCOMPARE(gz.lines, out.lines);
  }
};

QTEST_GUILESS_MAIN(TestSequences)
#include "tst_sequences.moc"
