// The example pipelines of resources/pipelines run as shipped, on sample data made by the
// sample-data pipelines (fewer images, so the test stays quick).
#include <QtTest>

#include <cmath>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "pipeline_runner.hpp"

using namespace sluice::test;
namespace fs = std::filesystem;

namespace {
RunOutput run_file(const std::string& name, const std::vector<std::string>& overrides) {
  return run_document(sluice::read_pipeline_file(std::string(SLUICE_SOURCE_DIR) + "/resources/pipelines/" + name), overrides);
}
std::uint64_t out_of(const RunOutput& out, const std::string& stage) {
  for (const auto& m : out.snapshot.stage())
    if (m.id() == stage) return m.elements_out();
  return ~0ull;
}
}  // namespace

class TestPipelines : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::string tfrecords_, jpegs_;

 private slots:
  void initTestCase() {
    tfrecords_ = dir_.path().toStdString() + "/tfrecord";
    jpegs_ = dir_.path().toStdString() + "/jpeg";
    // 320 images: 5 shards of 64, and the same images as class folders.
    auto tf = run_file("sample_data_tfrecord.txtpb", {"images.count=320", "shards.prefix=" + tfrecords_ + "/train", "shards.max_records=64"});
    QVERIFY2(tf.error.empty() && tf.result.state == sluice::RunState::Finished, (tf.error + tf.result.error).c_str());
    QVERIFY(fs::exists(tfrecords_ + "/train-00000-of-00005.tfrecord"));
    auto jpeg = run_file("sample_data_jpeg.txtpb", {"images.count=320", "files.folder=" + jpegs_});
    QVERIFY2(jpeg.error.empty() && jpeg.result.state == sluice::RunState::Finished, (jpeg.error + jpeg.result.error).c_str());
    std::size_t files = 0;
    for (const auto& e : fs::recursive_directory_iterator(jpegs_)) files += e.is_regular_file();
    QCOMPARE(files, std::size_t(320));
  }

  void main_training_pipeline() {
    auto out = run_file("train_tfrecord.txtpb", {"files.patterns=" + tfrecords_ + "/*.tfrecord"});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "read"), std::uint64_t(320));
    QCOMPARE(out_of(out, "batch"), std::uint64_t(5));  // 320 / 64, remainder dropped
    QVERIFY(!out.snapshot.bottleneck().empty());
  }

  // The sample as a tensorflow_datasets directory (two runs: train, then test beside it), then
  // read by a split expression over both.
  void tfds_directory_written_then_read() {
    const std::string tfds = dir_.path().toStdString() + "/tfds";
    const std::vector<std::string> sample{"files.patterns=" + tfrecords_ + "/*.tfrecord", "write.data_dir=" + tfds, "write.max_records=100"};
    auto train = run_file("sample_data_tfds.txtpb", sample);
    QVERIFY2(train.error.empty() && train.result.state == sluice::RunState::Finished, (train.error + train.result.error).c_str());
    auto with_test = sample;
    with_test.insert(with_test.end(), {"part.from=0.9", "part.to=1", "write.split=test"});
    auto test = run_file("sample_data_tfds.txtpb", with_test);
    QVERIFY2(test.error.empty() && test.result.state == sluice::RunState::Finished, (test.error + test.result.error).c_str());
    const std::uint64_t train_count = out_of(train, "part"), test_count = out_of(test, "part");
    QCOMPARE(train_count + test_count, std::uint64_t(320));  // the two ranges split every image
    QVERIFY(fs::exists(tfds + "/sample_images/1.0.0/sample_images-train.tfrecord-00000-of-0000" + std::to_string((train_count + 99) / 100)));

    auto out = run_file("tfds_sample.txtpb", {"split.data_dir=" + tfds});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    const auto quarter = static_cast<std::uint64_t>(std::nearbyint(train_count * 0.75));  // TFDS rounds halves to even too
    QCOMPARE(out_of(out, "read"), quarter + test_count);
  }

  void places365_folder_chain_with_cache() {
    auto out = run_file("places365_folder.txtpb", {"files.patterns=" + jpegs_ + "/**/*.jpg", "label.root=" + jpegs_});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "decode"), std::uint64_t(320));  // decoded once, then replayed by the cache
    QCOMPARE(out_of(out, "cache"), std::uint64_t(960));   // three epochs
    QCOMPARE(out_of(out, "batch"), std::uint64_t(15));
  }

  void single_tfrecord_chain() {
    auto out = run_file("single_tfrecord.txtpb", {"files.patterns=" + tfrecords_ + "/train-00000-of-00005.tfrecord"});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "read"), std::uint64_t(192));  // 64 records, three epochs
    QCOMPARE(out_of(out, "batch"), std::uint64_t(3));
  }

  void multi_tfrecord_interleave_chain_shards_disjointly() {
    std::uint64_t total = 0;
    for (int index = 0; index < 2; ++index) {
      auto out = run_file("multi_tfrecord.txtpb", {"files.patterns=" + tfrecords_ + "/*.tfrecord", "shard.num_shards=2",
                                                   "shard.index=" + std::to_string(index)});
      QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
      total += out_of(out, "read");
    }
    QCOMPARE(total, std::uint64_t(3 * 320));  // the two workers' files together: every record, each epoch
  }

  // The graph pipelines: a tee writing a copy while training, a train/evaluation split, a mixture.
  void tee_trains_and_writes_a_copy_of_the_same_elements() {
    const std::string copy = dir_.path().toStdString() + "/copy/train224";
    auto out = run_file("train_and_keep_copy.txtpb", {"files.patterns=" + tfrecords_ + "/*.tfrecord", "copy.prefix=" + copy,
                                                      "copy.max_records=100"});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "resize"), std::uint64_t(320));
    QCOMPARE(out_of(out, "batch"), std::uint64_t(5));
    QCOMPARE(out_of(out, "copy"), std::uint64_t(320));
    QVERIFY(fs::exists(copy + "-00003-of-00004.tfrecord"));
    // The copy reads back: 320 images of the model's size.
    auto back = run_text(stage("files", "list_files", "", {{"patterns", copy + "-*.tfrecord"}}) + stage("read", "tfrecord_reader", "files") +
                         stage("parse", "parse_example", "read", {{"features", "image:bytes, label:int64"}}) +
                         stage("decode", "decode_image", "parse") + stage("out", "null_sink", "decode"));
    QVERIFY2(back.error.empty() && back.result.state == sluice::RunState::Finished, (back.error + back.result.error).c_str());
    QCOMPARE(out_of(back, "decode"), std::uint64_t(320));
  }

  void train_and_evaluation_branches_split_the_records() {
    auto out = run_file("train_eval_split.txtpb", {"files.patterns=" + tfrecords_ + "/*.tfrecord"});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    const auto train = out_of(out, "train_part"), eval = out_of(out, "eval_part");
    QCOMPARE(train + eval, std::uint64_t(320));
    QVERIFY2(eval >= 15 && eval <= 55, qPrintable(QString::number(eval)));  // about 10%
    // The same split on another run with the files in another order (by content, not position).
    auto again = run_file("train_eval_split.txtpb", {"files.patterns=" + tfrecords_ + "/*.tfrecord", "files.shuffle=true",
                                                     "read.parallelism=1"});
    QVERIFY2(again.error.empty(), again.error.c_str());
    QCOMPARE(out_of(again, "eval_part"), eval);
  }

  void two_datasets_mixed_by_weight() {
    auto out = run_file("mix_two_datasets.txtpb", {"big.patterns=" + tfrecords_ + "/train-0000[0-2]-*.tfrecord",
                                                   "small.patterns=" + tfrecords_ + "/train-0000[3-4]-*.tfrecord"});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "mix"), std::uint64_t(320));  // the mixture goes on when one runs out: every record
    QCOMPARE(out_of(out, "batch"), std::uint64_t(5));
  }

  // 002_*.txt's time-series workflow: CSV readings -> standardized -> windows of 16 steps that
  // never span two assets -> TFRecord shards; then read back, shuffled and batched (32, 16, 3).
  void sensor_windows_written_then_trained_on() {
    const std::string windows = dir_.path().toStdString() + "/windows";
    auto offline = run_file("sensor_windows.txtpb", {"write.prefix=" + windows + "/w"});
    QVERIFY2(offline.error.empty() && offline.result.state == sluice::RunState::Finished, (offline.error + offline.result.error).c_str());
    QCOMPARE(out_of(offline, "rows"), std::uint64_t(600));  // 6 assets of 120, 80, 150, 60, 100 and 90 steps
    // (n - 16) / 4 + 1 windows of an asset of n steps: 27 + 17 + 34 + 12 + 22 + 19; one more if
    // windows ran on from one asset into the next.
    QCOMPARE(out_of(offline, "windows"), std::uint64_t(131));
    const std::string batches = dir_.path().toStdString() + "/sensor_batches.jsonl";
    auto train = run_file("train_sensor_windows.txtpb", {"files.patterns=" + windows + "/w-*.tfrecord", "out.path=" + batches});
    QVERIFY2(train.error.empty() && train.result.state == sluice::RunState::Finished, (train.error + train.result.error).c_str());
    QCOMPARE(out_of(train, "read"), std::uint64_t(131));
    QCOMPARE(out_of(train, "batch"), std::uint64_t(4));
    std::ifstream in(batches);
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      // 32 windows of 16 steps of 3 readings; each window's 16 asset ids are one asset's.
      const auto r = line.find("\"readings\":"), a = line.find("\"asset\":");
      QVERIFY(r != std::string::npos && a != std::string::npos);
      std::string readings = r < a ? line.substr(r, a - r) : line.substr(r);
      readings.erase(readings.rfind(']') + 1);
      QCOMPARE(std::count(readings.begin(), readings.end(), ','), std::ptrdiff_t(32 * 16 * 3 - 1));
      const auto assets = integers(a < r ? line.substr(a, r - a) : line.substr(a));
      QCOMPARE(assets.size(), std::size_t(32 * 16));
      for (std::size_t w = 0; w < 32; ++w)
        for (std::size_t t = 1; t < 16; ++t) QCOMPARE(assets[w * 16 + t], assets[w * 16]);
    }
    QCOMPARE(lines, 4);
  }

  void sequence_examples_padded_and_ragged() {
    const std::string padded = dir_.path().toStdString() + "/padded.jsonl", ragged = dir_.path().toStdString() + "/ragged.jsonl";
    auto out = run_file("sequence_examples.txtpb", {"padded_out.path=" + padded, "ragged_out.path=" + ragged});
    QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    QCOMPARE(out_of(out, "padded"), std::uint64_t(2));
    QCOMPARE(out_of(out, "ragged"), std::uint64_t(2));
    const std::string p = read_file(padded), r = read_file(ragged);
    QVERIFY2(p.find("\"x_int_seq_length\":[3,5]") != std::string::npos && p.find("\"x_int_seq_length\":[7,9]") != std::string::npos, p.c_str());
    QVERIFY2(r.find("\"x_int_seq_row_splits\":[0,3,8]") != std::string::npos && r.find("\"x_int_seq_row_splits\":[0,7,16]") != std::string::npos,
             r.c_str());
  }
};

QTEST_APPLESS_MAIN(TestPipelines)
#include "tst_pipelines.moc"
