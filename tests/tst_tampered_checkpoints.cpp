// Checkpoints changed by hand (or by a bug), their checksum made to fit again: what the engine
// can check against the pipeline and the files it reads is checked, and a resume that would
// give other output than the uninterrupted run is refused, naming the stage (issue 61, item 3).
#include <QtTest>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "pipeline_runner.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/engine.hpp"

namespace fs = std::filesystem;
using sluice::test::graph_of;
using sluice::test::run_text;
using sluice::test::stage;

namespace {

// 6 TFRecord files of 200 tf.Examples each (an int64 `label`), written by a pipeline.
std::string make_records(const QTemporaryDir& dir) {
  const std::string prefix = dir.filePath("records/part").toStdString();
  fs::create_directories(dir.filePath("records").toStdString());
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "1200"}, {"height", "4"}, {"width", "4"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {}) + stage("w", "tfrecord_writer", "enc", {{"prefix", prefix}, {"max_records", "200"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing records failed: " + made.result.error);
  return dir.filePath("records").toStdString();
}

std::string pipeline(const std::string& records, const std::string& out) {
  return "options { seed: 7 }\n" + stage("files", "list_files", "", {{"patterns", records + "/*"}, {"shuffle", "false"}}) +
         stage("read", "tfrecord_reader", "files", {}, "buffer_size: 2 interleave { cycle_length: 2 }") +
         stage("parse", "parse_example", "read", {{"features", "label:int64"}}, "parallelism: 2 buffer_size: 2") +
         stage("slow", "simulate_work", "parse", {{"us", "2000"}}, "buffer_size: 2") +
         stage("batch", "batch", "slow", {{"batch_size", "5"}}) + stage("out", "jsonl_sink", "batch", {{"path", out}});
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Runs until the sink took `after` elements, then checkpoints and stops.
sluice::checkpoint::Checkpoint cut(const std::string& text, std::uint64_t after) {
  sluice::Engine engine(graph_of(text));
  for (const auto& why : engine.checkpoint_refusals()) throw std::runtime_error(why);
  engine.start();
  for (;;) {
    std::uint64_t taken = 0;
    const auto snapshot = engine.snapshot();
    for (const auto& s : snapshot.stage())
      if (s.kind() == "sink") taken = s.elements_in();
    if (taken >= after || engine.wait_for(std::chrono::milliseconds(0))) break;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  auto c = engine.checkpoint(/*then_stop=*/true);
  const auto result = engine.wait();
  if (!c) throw std::runtime_error("no checkpoint: " + result.error);
  return *c;
}

// The error of resuming `text` from `c` (empty: it ran to the end).
std::string resume(const std::string& text, const sluice::checkpoint::Checkpoint& c) {
  sluice::EngineOptions options;
  options.resume_from = std::make_shared<const sluice::checkpoint::Checkpoint>(c);
  sluice::Engine engine(graph_of(text), options);
  try {
    engine.start();
  } catch (const std::exception& e) {
    return e.what();
  }
  return engine.wait().error;
}

sluice::checkpoint::StageState& state_of(sluice::checkpoint::Checkpoint& c, const std::string& id) {
  for (auto& s : *c.mutable_stages())
    if (s.id() == id) return s;
  throw std::runtime_error("no stage " + id);
}

}  // namespace

class TestTamperedCheckpoints : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::string records_;

 private slots:
  void initTestCase() { records_ = make_records(dir_); }

  // The run cut and resumed as written gives the uninterrupted run's output: the checks below
  // refuse nothing a run wrote.
  void an_untouched_checkpoint_resumes_to_the_uninterrupted_output() {
    const std::string whole = dir_.filePath("whole.jsonl").toStdString(), out = dir_.filePath("cut.jsonl").toStdString();
    QVERIFY(run_text(pipeline(records_, whole)).result.error.empty());
    const auto c = cut(pipeline(records_, out), 40);
    const std::string error = resume(pipeline(records_, out), c);
    QVERIFY2(error.empty(), error.c_str());
    QCOMPARE(lines_of(out), lines_of(whole));
  }

  // A map's position set to all 0xff (or past what the reader before it had handed on) is refused,
  // naming the stage, instead of resuming with fewer batches.
  void a_map_position_past_its_input_is_refused() {
    const std::string out = dir_.filePath("map.jsonl").toStdString();
    const auto c = cut(pipeline(records_, out), 40);
    for (const bool all_ones : {true, false}) {
      auto tampered = c;
      auto& parse = state_of(tampered, "parse");
      std::string bytes = parse.engine_state();
      QCOMPARE(bytes.size(), std::size_t(16));
      if (all_ones) {
        bytes.assign(16, '\xff');
      } else {
        std::uint64_t index = 0;
        std::memcpy(&index, bytes.data() + 8, 8);
        index += 7;
        std::memcpy(bytes.data() + 8, &index, 8);
      }
      parse.set_engine_state(bytes);
      const std::string error = resume(pipeline(records_, out), tampered);
      QVERIFY2(error.find("stage 'parse'") != std::string::npos && error.find("past what stage 'read' before it had handed on") != std::string::npos,
               error.c_str());
    }
  }

  // A reader's byte offset set to 0 (a record boundary, but not the record's) is refused: what is
  // found there is not the output the checkpoint says was given last.
  void a_reader_offset_that_is_not_its_record_is_refused() {
    const std::string out = dir_.filePath("offset.jsonl").toStdString();
    const auto c = cut(pipeline(records_, out), 40);
    // Each file's record offsets, from the TFRecord framing (length, its CRC, data, the data's CRC).
    std::set<std::pair<std::int64_t, std::int64_t>> records;  // (record, offset) of any file
    for (const auto& entry : fs::directory_iterator(records_)) {
      const std::string bytes = sluice::test::read_file(entry.path().string());
      std::int64_t record = 0;
      for (std::size_t at = 0; at + 12 <= bytes.size(); ++record) {
        std::uint64_t length = 0;
        std::memcpy(&length, bytes.data() + at, 8);
        records.insert({record, static_cast<std::int64_t>(at)});
        at += 12 + length + 4;
      }
    }
    auto tampered = c;
    auto& read = state_of(tampered, "read");
    std::string bytes = read.engine_state();
    int changed = 0;
    for (std::size_t at = 0; at + 16 <= bytes.size() && changed == 0; ++at) {
      std::int64_t record = 0, offset = 0;
      std::memcpy(&record, bytes.data() + at, 8);
      std::memcpy(&offset, bytes.data() + at + 8, 8);
      if (record > 1 && offset > 0 && records.count({record, offset})) {
        const std::int64_t zero = 0;
        std::memcpy(bytes.data() + at + 8, &zero, 8);
        ++changed;
      }
    }
    QVERIFY2(changed == 1, "a slot's last record and its byte offset were found in the reader's state");
    read.set_engine_state(bytes);
    const std::string error = resume(pipeline(records_, out), tampered);
    QVERIFY2(error.find("stage 'read'") != std::string::npos && error.find("as the checkpoint says") != std::string::npos, error.c_str());
  }
};

QTEST_GUILESS_MAIN(TestTamperedCheckpoints)
#include "tst_tampered_checkpoints.moc"
