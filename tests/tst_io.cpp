// The io plugin on files written by other projects (TensorFlow, TFX, PyTorch data), and round trips.
#include <QtTest>

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "array_record.hpp"
#include "byte_source.hpp"
#include "crc32c.hpp"
#include "example_codec.hpp"
#include "example.pb.h"
#include "pipeline_runner.hpp"
#include "tfds_split.hpp"
#include "tfrecord.hpp"

using namespace sluice::test;
using Ints = std::vector<long long>;
namespace fs = std::filesystem;

namespace sluice::io {
std::uint32_t crc32c_portable_for_test(const void* data, std::size_t size);
}

namespace {
std::string tf(const std::string& name) { return testdata_dir() + "/tfrecord/" + name; }

std::string reader_chain(const std::string& pattern, const std::string& reader_extra = "") {
  return stage("files", "list_files", "", {{"patterns", pattern}}) + stage("read", "tfrecord_reader", "files", {}, reader_extra);
}
RunOutput run_ok(const std::string& text) {
  auto out = run_text(text);
  if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
    qFatal("pipeline did not finish: %s %s", out.error.c_str(), out.result.error.c_str());
  return out;
}
std::uint64_t count_records(const std::string& pattern) {
  auto out = run_ok(reader_chain(pattern) + stage("out", "null_sink", "read"));
  return out.snapshot.stage(2).elements_out();
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string read_all(const std::string& path) { return read_file(path); }
}  // namespace

class TestIo : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QVERIFY2(fs::exists(tf("tfx_mnist.tfrecord")),
             qPrintable(QString::fromStdString("test data not found under " + testdata_dir() + " (set SLUICE_TESTDATA)")));
  }

  void crc32c_paths_agree_and_match_the_standard_check_value() {
    const char* check = "123456789";
    QCOMPARE(sluice::io::crc32c(check, 9), 0xe3069283u);
    std::string data(100003, '\0');
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
    QCOMPARE(sluice::io::crc32c(data.data(), data.size()), sluice::io::crc32c_portable_for_test(data.data(), data.size()));
  }

  void every_clean_file_has_its_record_count() {
    QCOMPARE(count_records(tf("tfx_mnist.tfrecord")), std::uint64_t(1000));
    QCOMPARE(count_records(tf("tfx_penguin_train.tfrecord.gz")), std::uint64_t(234));
    QCOMPARE(count_records(tf("tfx_penguin_eval.tfrecord.gz")), std::uint64_t(100));
    QCOMPARE(count_records(tf("tfx_sequence_eval.tfrecord.gz")), std::uint64_t(4500));
    QCOMPARE(count_records(tf("torchdata_example.tfrecord")), std::uint64_t(4));
    QCOMPARE(count_records(tf("torchdata_sequence_example.tfrecord")), std::uint64_t(4));
    QCOMPARE(count_records(tf("pets_examples.record")), std::uint64_t(10));
    // All clean files at once, interleaved across two readers at a time.
    auto all = run_ok(stage("files", "list_files", "", {{"patterns", testdata_dir() + "/tfrecord/*.*"}}) +
                      stage("read", "tfrecord_reader", "files", {}, "interleave { cycle_length: 3 } parallelism: 2") +
                      stage("out", "null_sink", "read"));
    QCOMPARE(all.snapshot.stage(2).elements_out(), std::uint64_t(1000 + 234 + 100 + 4500 + 4 + 4 + 10));
  }

  void torchdata_example_values() {
    auto out = run_ok(reader_chain(tf("torchdata_example.tfrecord")) +
                      stage("parse", "parse_example", "read", {{"features", "x_float:float[10], x_int:int64[10], x_byte:bytes"}}) +
                      sink_after("parse"));
    QCOMPARE(out.lines.size(), std::size_t(4));
    // Record i: x_float holds i*10 ... i*10+9, x_int ten times those (checked against protobuf's
    // own parser when the test was written), x_byte b"test str".
    for (int i = 0; i < 4; ++i) {
      Ints floats, ints;
      for (int k = 0; k < 10; ++k) {
        floats.push_back(i * 10 + k);
        ints.push_back(10 * (i * 10 + k));
      }
      auto values = integers(out.lines[i]);  // x_float, then x_int: all integral
      QCOMPARE(Ints(values.begin(), values.begin() + 10), floats);
      QCOMPARE(Ints(values.begin() + 10, values.begin() + 20), ints);
      QVERIFY(out.lines[i].find("\"x_byte\":\"dGVzdCBzdHI=\"") != std::string::npos);
    }
  }

  void torchdata_sequence_example_frames() {
    auto out = run_ok(reader_chain(tf("torchdata_sequence_example.tfrecord")) +
                      stage("parse", "parse_example", "read",
                            {{"features", "x_int:int64[10]"}, {"sequence_features", "x_int_seq:int64[10], x_float_seq:float[10]"}}) +
                      sink_after("parse"));
    QCOMPARE(out.lines.size(), std::size_t(4));
    for (int i = 0; i < 4; ++i) {
      auto& line = out.lines[i];
      auto begin = line.find("\"x_int_seq\":");
      auto seq = line.substr(begin, line.find("]]", begin) - begin);
      int frames = 1;
      for (std::size_t at = 0; (at = seq.find("],[", at)) != std::string::npos; ++at) ++frames;
      QCOMPARE(frames, 3 + 2 * i);  // 3, 5, 7, 9 frames
    }
  }

  void mnist_and_penguin_values() {
    auto mnist = run_ok(reader_chain(tf("tfx_mnist.tfrecord")) +
                        stage("parse", "parse_example", "read", {{"features", "image_floats:float[784], image_class:int64"}}) +
                        stage("t", "take", "parse", {{"count", "3"}}) + sink_after("t"));
    QCOMPARE(mnist.lines.size(), std::size_t(3));
    for (const auto& l : mnist.lines) {
      auto v = integers(l.substr(l.find("\"image_class\"")));
      QVERIFY(v.size() == 1 && v[0] >= 0 && v[0] <= 9);
    }
    auto penguin = run_ok(reader_chain(tf("tfx_penguin_train.tfrecord.gz")) +
                          stage("parse", "parse_example", "read",
                                {{"features", "body_mass_g:float, culmen_depth_mm:float, culmen_length_mm:float, flipper_length_mm:float, species:int64"}}) +
                          sink_after("parse"));
    QCOMPARE(penguin.lines.size(), std::size_t(234));
    for (const auto& l : penguin.lines) {
      auto species = integers(l.substr(l.find("\"species\"")));
      QVERIFY(species[0] >= 0 && species[0] <= 2);
    }
  }

  void empty_features_count_as_missing() {
    // 450 of the 4500 records carry context f and i as an empty Feature.
    std::string chain = reader_chain(tf("tfx_sequence_eval.tfrecord.gz"));
    auto with_default = run_ok(chain + stage("parse", "parse_example", "read", {{"features", "f:float=-1, i:int64=-7"}, {"sequence_features", "s:bytes[]"}}) +
                               sink_after("parse"));
    QCOMPARE(with_default.lines.size(), std::size_t(4500));
    std::size_t defaulted = 0;
    for (const auto& l : with_default.lines) defaulted += l.find("\"i\":-7") != std::string::npos;
    QCOMPARE(defaulted, std::size_t(450));
    auto var_len = run_ok(chain + stage("parse", "parse_example", "read", {{"features", "i:int64[]"}}) + sink_after("parse"));
    std::size_t empty = 0;
    for (const auto& l : var_len.lines) empty += l.find("\"i\":[]") != std::string::npos;
    QCOMPARE(empty, std::size_t(450));
    auto strict = run_text(chain + stage("parse", "parse_example", "read", {{"features", "i:int64"}}) + stage("out", "null_sink", "parse"));
    QCOMPARE(strict.result.state, sluice::RunState::Failed);
    QVERIFY2(strict.result.error.find("feature 'i' is empty and the spec gives no default") != std::string::npos, strict.result.error.c_str());
    QVERIFY(strict.result.error.find("tfx_sequence_eval.tfrecord.gz record ") != std::string::npos);
  }

  void parse_errors_name_the_feature_and_record() {
    auto missing = run_text(reader_chain(tf("torchdata_example.tfrecord")) +
                            stage("parse", "parse_example", "read", {{"features", "nope:int64"}}) + stage("out", "null_sink", "parse"));
    QVERIFY2(missing.result.error.find("feature 'nope' is missing") != std::string::npos, missing.result.error.c_str());
    QVERIFY(missing.result.error.find("torchdata_example.tfrecord record 0 (byte offset 0)") != std::string::npos);
    // Every record will lack it: the message says to fix the spec, not to skip them all.
    QVERIFY2(missing.result.error.find("its parameters likely do not fit the data") != std::string::npos &&
                 missing.result.error.find("error_policy: skip") == std::string::npos,
             missing.result.error.c_str());
    auto type = run_text(reader_chain(tf("torchdata_example.tfrecord")) +
                         stage("parse", "parse_example", "read", {{"features", "x_int:float[10]"}}) + stage("out", "null_sink", "parse"));
    QVERIFY(type.result.error.find("feature 'x_int' holds int64 values, the spec says float") != std::string::npos);
    auto shape = run_text(reader_chain(tf("torchdata_example.tfrecord")) +
                          stage("parse", "parse_example", "read", {{"features", "x_int:int64[3]"}}) + stage("out", "null_sink", "parse"));
    QVERIFY(shape.result.error.find("feature 'x_int' has 10 values, the spec's shape [3] needs 3") != std::string::npos);
    auto spec = run_text(reader_chain(tf("torchdata_example.tfrecord")) +
                         stage("parse", "parse_example", "read", {{"features", "x_int:int32"}}) + stage("out", "null_sink", "parse"));
    QVERIFY(spec.error.find("dtype 'int32' is not bytes, int64 or float") != std::string::npos);
    // A comma left out is a syntax error at validation, not a feature named "x_int:int64 y".
    auto comma = run_text(reader_chain(tf("torchdata_example.tfrecord")) +
                          stage("parse", "parse_example", "read", {{"features", "x_int:int64[10] x_float:float[10]"}}) +
                          stage("out", "null_sink", "parse"));
    QVERIFY2(comma.error.find("lacks a ',' before 'x_float:float[10]' (column 17)") != std::string::npos, comma.error.c_str());
  }

  void corrupt_file_fails_with_file_index_offset_or_skips() {
    const std::string corrupt = tf("corrupt/pets_examples.crlf_damaged.record");
    auto failed = run_text(reader_chain(corrupt) + stage("out", "null_sink", "read"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find(corrupt + ": record 0 at byte offset 0: data CRC mismatch") != std::string::npos,
             failed.result.error.c_str());
    auto skipped = run_ok(reader_chain(corrupt, "error_policy: skip") +
                          stage("parse", "parse_example", "read", {{"features", "image/filename:bytes"}}) + sink_after("parse"));
    QCOMPARE(skipped.lines.size(), std::size_t(4));
    const auto& m = skipped.snapshot.stage(1);
    QCOMPARE(m.errors_skipped(), std::uint64_t(6));
    QVERIFY(m.skip_reasons(1).find("record 1 at byte offset 18446: corrupt length") != std::string::npos);
  }

  void a_file_shrinking_while_it_is_read_is_reported_not_fatal() {
    // The reader reads with read(), never a mapping: a file cut short under it ends in a named
    // truncation, never in SIGBUS. The shrink is made between two reads of the reader.
    QTemporaryDir dir;
    const std::string path = dir.path().toStdString() + "/shrinking.tfrecord";
    const std::string whole = read_all(tf("tfx_mnist.tfrecord"));  // 1000 records of 3,199 bytes
    write_file(path, whole);
    sluice::io::RecordReaderOptions options;
    options.chunk_bytes = 64 << 10;
    sluice::io::RecordReader reader(sluice::io::open_file(path, sluice::io::Compression::Auto), path, options);
    sluice::io::Record record;
    QVERIFY(reader.next(record, nullptr));
    fs::resize_file(path, whole.size() / 2 + 100);  // inside record 501
    std::uint64_t records = 1;
    QString error;
    try {
      while (reader.next(record, nullptr)) ++records;
    } catch (const sluice::DataError& e) {
      error = e.what();
    }
    QVERIFY2(records < 1000, qPrintable(QString::number(records)));
    QVERIFY2(error.contains(QString::fromStdString(path)), qPrintable(error));
  }

  void zlib_is_detected() {
    // No zlib TFRecord exists in the wild data: recompress a clean one.
    std::string plain = read_all(tf("torchdata_example.tfrecord"));
    uLongf size = compressBound(plain.size());
    std::string packed(size, '\0');
    QCOMPARE(compress2(reinterpret_cast<Bytef*>(packed.data()), &size, reinterpret_cast<const Bytef*>(plain.data()), plain.size(), 6), Z_OK);
    packed.resize(size);
    QTemporaryDir dir;
    std::string path = dir.path().toStdString() + "/x.tfrecord.zz";
    write_file(path, packed);
    QCOMPARE(count_records(path), std::uint64_t(4));
  }

  // Text whose first two bytes happen to make a zlib header is read as text: "80" does (the
  // preset-dictionary bit is set), "x^" does and what follows is no deflate data.
  void text_that_looks_like_a_zlib_header_is_plain() {
    QTemporaryDir dir;
    const std::string a = dir.path().toStdString() + "/a.txt", b = dir.path().toStdString() + "/b.txt";
    write_file(a, "80 a\n80 b\n80 c\n");
    write_file(b, "x^only a line\nand another\n");
    auto read = run_ok(stage("files", "list_files", "", {{"patterns", a + "," + b}, {"shuffle", "false"}}) + stage("lines", "text_lines", "files") +
                       sink_after("lines"));
    QCOMPARE(read.lines.size(), std::size_t(5));
    const auto line = [](const char* text) { return "{\"line\":\"" + QByteArray(text).toBase64().toStdString() + "\"}"; };
    QCOMPARE(read.lines[0], line("80 a"));
    QCOMPARE(read.lines[3], line("x^only a line"));
  }

  void writer_round_trip_plain_and_gzip() {
    for (std::string compression : {"none", "gzip"}) {
      QTemporaryDir dir;
      std::string prefix = dir.path().toStdString() + "/shard";
      auto written = run_text(stage("src", "range", "", {{"count", "50"}}) + stage("b", "batch", "src", {{"batch_size", "5"}}) +
                              stage("w", "tfrecord_writer", "b", {{"prefix", prefix}, {"max_records", "4"}, {"compression", compression}}));
      QCOMPARE(written.result.state, sluice::RunState::Finished);
      auto files = QDir(dir.path()).entryList(QDir::Files, QDir::Name);
      QCOMPARE(files.size(), 3);  // 10 records, 4 per shard
      QVERIFY(files[0].startsWith("shard-00000-of-00003.tfrecord"));
      auto back = run_ok(stage("files", "list_files", "", {{"patterns", prefix + "-*"}}) + stage("read", "tfrecord_reader", "files") +
                         stage("parse", "parse_example", "read", {{"features", "value:int64[5]"}}) + sink_after("parse"));
      Ints expected(50);
      std::iota(expected.begin(), expected.end(), 0);
      QCOMPARE(all_integers(back.lines), expected);
    }
  }

  void writer_names_shards_by_worker() {
    QTemporaryDir dir;
    std::string prefix = dir.path().toStdString() + "/part";
    for (int worker : {0, 3}) {
      auto written = run_text(stage("src", "range", "", {{"count", "10"}}) +
                              stage("w", "tfrecord_writer", "src",
                                    {{"prefix", prefix}, {"max_records", "6"}, {"naming", "worker"}, {"worker", std::to_string(worker)}}));
      QCOMPARE(written.result.state, sluice::RunState::Finished);
    }
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files, QDir::Name),
             (QStringList{"part-worker-0-00000.tfrecord", "part-worker-0-00001.tfrecord", "part-worker-3-00000.tfrecord",
                          "part-worker-3-00001.tfrecord"}));
    // Unset, the worker is the process's (here as told by --worker-index: the host fills it).
    auto doc = sluice::parse_pipeline(stage("src", "range", "", {{"count", "2"}}) +
                                          stage("w", "tfrecord_writer", "src", {{"prefix", prefix + "env"}, {"naming", "worker"}}),
                                      "test.txtpb");
    doc.worker = sluice::WorkerIdentity{7, 8, "--worker-index/--num-workers", ""};
    auto from_identity = run_document(doc);
    QCOMPARE(from_identity.result.state, sluice::RunState::Finished);
    QVERIFY(fs::exists(prefix + "env-worker-7-00000.tfrecord"));
  }

  void written_records_are_examples_to_protobuf() {
    // What the writer produces must parse as tf.train.Example with TensorFlow's field numbers.
    QTemporaryDir dir;
    std::string prefix = dir.path().toStdString() + "/ex";
    auto written = run_text(stage("src", "from_list", "", {{"values", "cat,dog"}, {"field", "name"}}) +
                            stage("w", "tfrecord_writer", "src", {{"prefix", prefix}}));
    QCOMPARE(written.result.state, sluice::RunState::Finished);
    std::string bytes = read_all(prefix + "-00000-of-00001.tfrecord");
    sluice::io::RecordReader reader(sluice::io::memory_source(bytes.data(), bytes.size(), sluice::io::Compression::None, "mem"), "mem");
    sluice::io::Record record;
    std::vector<std::string> names;
    while (reader.next(record, nullptr)) {
      sluice::tfexample::Example example;
      QVERIFY(example.ParseFromArray(record.data(), static_cast<int>(record.length)));
      names.push_back(example.features().feature().at("name").bytes_list().value(0));
    }
    QCOMPARE(names, (std::vector<std::string>{"cat", "dog"}));
  }

  void protobuf_written_examples_parse_packed_or_not() {
    sluice::tfexample::Example example;
    auto& features = *example.mutable_features()->mutable_feature();
    for (int v : {4, 5, 6}) features["ints"].mutable_int64_list()->add_value(v);
    features["floats"].mutable_float_list()->add_value(0.5f);
    features["text"].mutable_bytes_list()->add_value("hello");
    std::string serialized = example.SerializeAsString();
    // The same values unpacked: int64 as separate varints (wire type 0).
    std::string framed;
    sluice::io::append_record(framed, serialized.data(), serialized.size());
    QTemporaryDir dir;
    std::string path = dir.path().toStdString() + "/pb.tfrecord";
    write_file(path, framed);
    auto out = run_ok(reader_chain(path) + stage("parse", "parse_example", "read", {{"features", "ints:int64[3], floats:float, text:bytes"}}) +
                      sink_after("parse"));
    QCOMPARE(out.lines.front(), std::string(R"({"ints":[4,5,6],"floats":0.5,"text":"aGVsbG8="})"));
  }

  void chunks_give_the_same_bytes_as_elements() {
    // The reader, parse_example and batch hand on chunks (sluice/chunk.hpp) by default: on real
    // files their outputs are those of the element-wise run byte for byte, at one and three parser
    // workers, batched or not, and the chunked path is the one taken.
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    struct Case {
      std::string file, features, keep;
    };
    const std::vector<Case> cases{
        {"tfx_mnist.tfrecord", "image_floats:float[784], image_class:int64", ""},
        {"tfx_penguin_train.tfrecord.gz", "body_mass_g:float, culmen_depth_mm:float, species:int64, missing:bytes=none", "path,index"},
        {"torchdata_example.tfrecord", "x_float:float[10], x_int:int64[10], x_byte:bytes", "record"},
        {"pets_examples.record", "image/encoded:bytes, image/height:int64, image/filename:bytes", "offset"}};
    for (const auto& c : cases) {
      for (int workers : {1, 3}) {
        for (bool batched : {false, true}) {
          const std::string text = reader_chain(tf(c.file)) +
                                   stage("parse", "parse_example", "read", {{"features", c.features}, {"keep", c.keep}},
                                         "parallelism: " + std::to_string(workers)) +
                                   (batched ? stage("batch", "batch", "parse", {{"batch_size", "7"}}) + sink_after("batch") : sink_after("parse"));
          const auto chunked = run_text(text);
          const auto elements = run_text(text, {}, element_wise);
          const std::string what = c.file + (batched ? " batched" : "") + " on " + std::to_string(workers) + " workers";
          QVERIFY2(chunked.result.state == sluice::RunState::Finished, (what + ": " + chunked.result.error + chunked.error).c_str());
          QVERIFY2(!chunked.lines.empty() && chunked.lines == elements.lines, what.c_str());
          QVERIFY2(chunked.snapshot.stage(1).chunks_out() > 0, what.c_str());  // the reader made chunks
          QCOMPARE(chunked.snapshot.stage(1).chunked_elements_out(), chunked.snapshot.stage(1).elements_out());
          QCOMPARE(elements.snapshot.stage(1).chunks_out(), std::uint64_t(0));
          // Parsed rows go on in chunks to a batch; a jsonl_sink takes elements.
          QCOMPARE(chunked.snapshot.stage(2).chunks_out() > 0, batched);
        }
      }
    }
  }

  void chunks_read_by_two_stages_reach_both_whole() {
    // A parser's chunks read by two batches (a tee): each gets every row, as element by element.
    const std::string text = reader_chain(tf("tfx_mnist.tfrecord")) +
                             stage("parse", "parse_example", "read", {{"features", "image_class:int64"}}) +
                             stage("a", "batch", "parse", {{"batch_size", "5"}}) + stage("b", "batch", "parse", {{"batch_size", "7"}}) +
                             stage("sink_a", "null_sink", "a") + sink_after("b");
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const auto chunked = run_text(text), elements = run_text(text, {}, element_wise);
    QVERIFY2(chunked.result.state == sluice::RunState::Finished, chunked.result.error.c_str());
    QVERIFY(chunked.snapshot.stage(2).chunks_out() > 0);
    QCOMPARE(chunked.snapshot.stage(3).elements_in(), std::uint64_t(1000));
    QCOMPARE(chunked.snapshot.stage(4).elements_in(), std::uint64_t(1000));
    QCOMPARE(chunked.lines.size(), std::size_t(143));
    QCOMPARE(chunked.lines, elements.lines);
  }

  void a_repeat_hands_a_readers_chunks_on_whole() {
    // tf.data users repeat after the reader (TFRecordDataset(files).repeat(3)): the repeat hands on
    // the parser's chunks as they come to a batch that takes them; before a sink that does not, or
    // a take, the parser makes rows (a chunk waits for its rows, which a slow read would hold up),
    // and the take stops it in mid-pass; the lines are the element-wise run's every time.
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::string parsed =
        reader_chain(tf("tfx_mnist.tfrecord")) + stage("parse", "parse_example", "read", {{"features", "image_class:int64"}});
    const std::string batched = parsed + stage("again", "repeat", "parse", {{"count", "3"}}) +
                                stage("batch", "batch", "again", {{"batch_size", "7"}}) + sink_after("batch");
    const auto chunked = run_text(batched), elements = run_text(batched, {}, element_wise);
    QVERIFY2(chunked.result.state == sluice::RunState::Finished, chunked.result.error.c_str());
    QCOMPARE(chunked.lines.size(), std::size_t(429));  // 3,000 rows in batches of 7
    QCOMPARE(chunked.lines, elements.lines);
    const auto& again = chunked.snapshot.stage(3);
    QCOMPARE(again.elements_in(), std::uint64_t(3000));
    QCOMPARE(again.elements_out(), std::uint64_t(3000));
    QCOMPARE(again.chunked_elements_out(), std::uint64_t(3000));
    QVERIFY(again.chunks_out() > 0 && again.chunks_out() < 3000 / 8);
    QCOMPARE(elements.snapshot.stage(3).chunks_out(), std::uint64_t(0));
    for (const std::string& after : {sink_after("again"), stage("some", "take", "again", {{"count", "1500"}}) + sink_after("some")}) {
      const std::string text = parsed + stage("again", "repeat", "parse", {{"count", "3"}}) + after;
      const auto rows = run_text(text), one_by_one = run_text(text, {}, element_wise);
      QVERIFY2(rows.result.state == sluice::RunState::Finished, rows.result.error.c_str());
      QCOMPARE(rows.lines.size(), std::size_t(after.find("take") == std::string::npos ? 3000 : 1500));
      QCOMPARE(rows.lines, one_by_one.lines);
      QCOMPARE(rows.snapshot.stage(3).chunks_out(), std::uint64_t(0));
      QCOMPARE(rows.snapshot.stage(2).chunks_out(), std::uint64_t(0));
    }
  }

  void a_bad_record_inside_a_chunk_is_named_and_skipped_alone() {
    // 600 records, one chunk holds many of them: record 300 is not an Example, record 450 has a
    // broken data CRC. Under skip each is dropped alone and named by its record and byte offset;
    // without skip the run stops at record 300 with the element-wise run's message.
    QTemporaryDir dir;
    const std::string path = dir.path().toStdString() + "/mixed.tfrecord";
    std::string framed;
    std::vector<std::size_t> offsets;
    for (int i = 0; i < 600; ++i) {
      sluice::tfexample::Example example;
      (*example.mutable_features()->mutable_feature())["id"].mutable_int64_list()->add_value(i);
      const std::string serialized = i == 300 ? std::string("\x0a\x7f\x01") : example.SerializeAsString();  // a field past the end
      offsets.push_back(framed.size());
      sluice::io::append_record(framed, serialized.data(), serialized.size());
    }
    framed[offsets[450] + 12] ^= 0x40;  // record 450's data: its CRC no longer matches
    write_file(path, framed);
    sluice::EngineOptions element_wise;
    element_wise.chunks = false;
    const std::string skipping = reader_chain(path, "error_policy: skip") +
                                 stage("parse", "parse_example", "read", {{"features", "id:int64"}}, "error_policy: skip parallelism: 2") +
                                 stage("batch", "batch", "parse", {{"batch_size", "64"}}) + sink_after("batch");
    for (bool chunks : {true, false}) {
      const auto out = chunks ? run_text(skipping) : run_text(skipping, {}, element_wise);
      QCOMPARE(out.result.state, sluice::RunState::Finished);
      Ints expected;
      for (int i = 0; i < 600; ++i)
        if (i != 300 && i != 450) expected.push_back(i);
      QCOMPARE(all_integers(out.lines), expected);
      QCOMPARE(out.snapshot.stage(1).errors_skipped(), std::uint64_t(1));
      QVERIFY2(out.snapshot.stage(1).skip_reasons(0).find("record 450 at byte offset " + std::to_string(offsets[450]) + ": data CRC mismatch") !=
                   std::string::npos,
               out.snapshot.stage(1).skip_reasons(0).c_str());
      QCOMPARE(out.snapshot.stage(2).errors_skipped(), std::uint64_t(1));
      QVERIFY2(out.snapshot.stage(2).skip_reasons(0).find("element 300 of epoch 0 from " + path + " record 300 (byte offset " +
                                                          std::to_string(offsets[300]) + "): malformed record") != std::string::npos,
               out.snapshot.stage(2).skip_reasons(0).c_str());
    }
    const std::string failing = reader_chain(path, "error_policy: skip") + stage("parse", "parse_example", "read", {{"features", "id:int64"}}) +
                                stage("out", "null_sink", "parse");
    const auto chunked = run_text(failing), elements = run_text(failing, {}, element_wise);
    QCOMPARE(chunked.result.state, sluice::RunState::Failed);
    QCOMPARE(chunked.result.error, elements.result.error);
    QVERIFY2(chunked.result.error.find("record 300 (byte offset " + std::to_string(offsets[300]) + ")") != std::string::npos, chunked.result.error.c_str());
  }

  void hand_built_unpacked_and_mixed_lists_parse_to_exact_values() {
    // Writers other than TensorFlow's may write Int64List and FloatList unpacked, one tag per
    // value (int64: tag 0x08, a varint each; float: tag 0x0d, 4 bytes each), and a packed block
    // followed by unpacked values of the same field concatenates. Built by hand, byte by byte.
    auto varint = [](std::string& out, std::uint64_t v) {
      while (v >= 0x80) {
        out += static_cast<char>(v | 0x80);
        v >>= 7;
      }
      out += static_cast<char>(v);
    };
    auto field = [&](std::string& out, int number, const std::string& bytes) {  // length-delimited
      varint(out, static_cast<std::uint64_t>(number) << 3 | 2);
      varint(out, bytes.size());
      out += bytes;
    };
    auto entry = [&](const std::string& name, int list_kind, const std::string& list) {
      std::string feature, map_entry;
      field(feature, list_kind, list);  // Feature: float_list = 2, int64_list = 3
      field(map_entry, 1, name);
      field(map_entry, 2, feature);
      return map_entry;
    };
    std::string unpacked_ints;
    for (std::int64_t v : {std::int64_t(4), std::int64_t(300), std::int64_t(-7)}) {
      unpacked_ints += '\x08';
      varint(unpacked_ints, static_cast<std::uint64_t>(v));
    }
    std::string unpacked_floats;
    for (float v : {0.5f, -2.25f}) {
      unpacked_floats += '\x0d';
      unpacked_floats.append(reinterpret_cast<const char*>(&v), 4);
    }
    std::string mixed, packed_block;
    varint(packed_block, 1);
    varint(packed_block, 2);
    field(mixed, 1, packed_block);  // packed [1, 2] ...
    mixed += '\x08';
    varint(mixed, 3);  // ... then an unpacked 3
    std::string mixed_floats, packed_floats;
    const float first[] = {1.5f, 2.5f}, last = 3.5f;
    packed_floats.append(reinterpret_cast<const char*>(first), sizeof first);
    field(mixed_floats, 1, packed_floats);
    mixed_floats += '\x0d';
    mixed_floats.append(reinterpret_cast<const char*>(&last), 4);
    std::string features;
    field(features, 1, entry("ints", 3, unpacked_ints));
    field(features, 1, entry("floats", 2, unpacked_floats));
    field(features, 1, entry("mixed", 3, mixed));
    field(features, 1, entry("mixed_floats", 2, mixed_floats));
    std::string example;
    field(example, 1, features);

    sluice::io::ExampleParser parser(
        sluice::io::parse_feature_spec("ints:int64[3], floats:float[2], mixed:int64[3], mixed_floats:float[3]"), {});
    auto buffer = std::make_shared<sluice::Buffer>(example.size());
    std::memcpy(buffer->data(), example.data(), example.size());
    sluice::Sample out;
    parser.parse(buffer, 0, example.size(), out);
    auto ints = [&](const char* name) {
      const auto& t = out.at(name);
      return std::vector<std::int64_t>(t.data<std::int64_t>(), t.data<std::int64_t>() + t.num_elements());
    };
    auto floats = [&](const char* name) {
      const auto& t = out.at(name);
      return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
    };
    QCOMPARE(ints("ints"), (std::vector<std::int64_t>{4, 300, -7}));
    QCOMPARE(floats("floats"), (std::vector<float>{0.5f, -2.25f}));
    QCOMPARE(ints("mixed"), (std::vector<std::int64_t>{1, 2, 3}));
    QCOMPARE(floats("mixed_floats"), (std::vector<float>{1.5f, 2.5f, 3.5f}));
  }

  void read_file_reads_whole_files_and_names_missing_ones() {
    QTemporaryDir dir;
    const std::string root = dir.path().toStdString();
    std::string big(300000, '\0');
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
    write_file(root + "/big.txt", big);
    write_file(root + "/empty.txt", "");
    auto sizes = run_ok(stage("files", "list_files", "", {{"patterns", root + "/*.txt"}}) + stage("read", "read_file", "files") +
                        sink_after("read"));
    QCOMPARE(sizes.lines.size(), std::size_t(2));
    auto data_of = [](const std::string& line) {  // bytes fields are base64 in JSON lines
      auto at = line.find("\"data\":\"") + 8;
      auto b64 = QByteArray::fromStdString(line.substr(at, line.find('"', at) - at));
      return QByteArray::fromBase64(b64).toStdString();
    };
    QVERIFY(data_of(sizes.lines[0]) == big);  // big.txt sorts first
    QCOMPARE(data_of(sizes.lines[1]), std::string());
    const std::string chain = stage("paths", "from_list", "", {{"values", root + "/big.txt," + root + "/missing.txt," + root}, {"field", "path"}});
    auto failed = run_text(chain + stage("read", "read_file", "paths") + stage("out", "null_sink", "read"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find("cannot open " + root + "/missing.txt: No such file or directory") != std::string::npos,
             failed.result.error.c_str());
    auto skipped = run_ok(chain + stage("read", "read_file", "paths", {}, "error_policy: skip") + stage("out", "null_sink", "read"));
    QCOMPARE(skipped.snapshot.stage(2).elements_out(), std::uint64_t(1));
    QCOMPARE(skipped.snapshot.stage(1).errors_skipped(), std::uint64_t(2));
    QVERIFY(skipped.snapshot.stage(1).skip_reasons(1).find("it is a directory") != std::string::npos);
  }

  void list_files_globs_and_errors() {
    QTemporaryDir dir;
    std::string root = dir.path().toStdString();
    fs::create_directories(root + "/a/b");
    for (auto p : {"/x.txt", "/a/y.txt", "/a/b/z.txt", "/a/b/skip.dat"}) write_file(root + p, "1");
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", root + "/**/*.txt"}}) + sink_after("files"));
    QCOMPARE(out.lines.size(), std::size_t(3));
    auto none = run_text(stage("files", "list_files", "", {{"patterns", root + "/**/*.png"}}) + stage("out", "null_sink", "files"));
    QVERIFY2(none.error.find("pattern '" + root + "/**/*.png' matches no file") != std::string::npos, none.error.c_str());
    auto shuffled = [&](int seed) {
      return run_ok("options { seed: " + std::to_string(seed) + " }\n" +
                    stage("files", "list_files", "", {{"patterns", root + "/**/*.*"}, {"shuffle", "true"}}) + sink_after("files"))
          .lines;
    };
    QCOMPARE(shuffled(1), shuffled(1));
  }

  // tf.data's list_files shuffles unless told not to (shuffle=None means True): a direct
  // translation of a program over class folders must not get the files, and so the classes, in
  // folder order. The default order is shuffle: true's with the pipeline's seed, new each epoch.
  void list_files_shuffles_by_default_as_tf_data_does() {
    QTemporaryDir dir;
    const std::string root = dir.path().toStdString();
    std::vector<std::string> sorted_paths;
    for (int i = 0; i < 24; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/f%02d.txt", i);
      write_file(root + name, "1");
      // jsonl_sink writes bytes as base64
      sorted_paths.push_back("{\"path\":\"" + QByteArray::fromStdString(root + name).toBase64().toStdString() + "\"}");
    }
    auto listed = [&](int seed, const std::string& shuffle, int epochs) {
      std::vector<std::pair<std::string, std::string>> params{{"patterns", root + "/*.txt"}};
      if (!shuffle.empty()) params.emplace_back("shuffle", shuffle);
      return run_ok("options { seed: " + std::to_string(seed) + " }\n" + stage("files", "list_files", "", params) +
                    stage("epochs", "repeat", "files", {{"count", std::to_string(epochs)}}) + sink_after("epochs"))
          .lines;
    };
    const auto by_default = listed(7, "", 2);
    QCOMPARE(by_default.size(), std::size_t(48));
    QCOMPARE(by_default, listed(7, "true", 2));
    const std::vector<std::string> first(by_default.begin(), by_default.begin() + 24), second(by_default.begin() + 24, by_default.end());
    QVERIFY2(first != sorted_paths, "list_files kept the sorted order by default");
    QVERIFY2(first != second, "list_files gave the same order in two epochs");
    QCOMPARE(std::multiset<std::string>(first.begin(), first.end()), std::multiset<std::string>(sorted_paths.begin(), sorted_paths.end()));
    const auto other_seed = listed(8, "", 1);
    QVERIFY2(other_seed != first, "list_files gave the same order for two seeds");
    QCOMPARE(listed(7, "false", 1), sorted_paths);
  }

  void csv_rows_types_quotes_and_errors() {
    QTemporaryDir dir;
    std::string path = dir.path().toStdString() + "/t.csv";
    write_file(path, "id,score,name\n1,0.5,\"Smith, J\"\n2,1.25,\"say \"\"hi\"\"\"\n");
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", path}}) + stage("csv", "csv_reader", "files") + sink_after("csv"));
    QCOMPARE(out.lines.size(), std::size_t(2));
    QCOMPARE(out.lines[0], std::string(R"({"id":1,"score":0.5,"name":"U21pdGgsIEo="})"));
    write_file(path, "id,score\n1,0.5\n2,oops\n3,1\n");
    auto bad = run_text(stage("files", "list_files", "", {{"patterns", path}}) + stage("csv", "csv_reader", "files") + stage("out", "null_sink", "csv"));
    QVERIFY2(bad.result.error.find(path + ":3: column 'score': 'oops' is not a number") != std::string::npos, bad.result.error.c_str());
    auto skipped = run_ok(stage("files", "list_files", "", {{"patterns", path}}) + stage("csv", "csv_reader", "files", {}, "error_policy: skip") +
                          sink_after("csv"));
    QCOMPARE(skipped.lines.size(), std::size_t(2));
  }

  // make_csv_dataset's select_columns, na_value and column_defaults.
  void csv_selected_columns_and_missing_values() {
    QTemporaryDir dir;
    const std::string path = dir.path().toStdString() + "/na.csv";
    write_file(path, "id,temp,site,count\n1,NA,north,5\n2,20.5,,\n3,,south,NA\n");
    const std::string files = stage("files", "list_files", "", {{"patterns", path}});
    const std::vector<std::pair<std::string, std::string>> base{
        {"schema", "id:int64,temp:float,site:bytes,count:int64"}, {"select_columns", "count,temp,site"}, {"na_values", "NA,\"\""}};
    auto with_defaults = base;
    with_defaults.push_back({"defaults", "count:-1,site:unknown"});
    auto out = run_ok(files + stage("csv", "csv_reader", "files", with_defaults) + sink_after("csv"));
    // Selected columns in the order asked; a missing float is NaN, others take their default.
    QCOMPARE(out.lines, (std::vector<std::string>{R"({"count":5,"temp":"nan","site":"bm9ydGg="})", R"({"count":-1,"temp":20.5,"site":"dW5rbm93bg=="})",
                                                  R"({"count":-1,"temp":"nan","site":"c291dGg="})"}));
    // A missing int64 without a default is the row's error, named; skipped alone under skip.
    auto failed = run_text(files + stage("csv", "csv_reader", "files", base) + stage("out", "null_sink", "csv"));
    QVERIFY2(failed.result.error.find(path + ":3: column 'count' is missing ('') and has no default") != std::string::npos, failed.result.error.c_str());
    auto skipped = run_ok(files + stage("csv", "csv_reader", "files", base, "error_policy: skip") + sink_after("csv"));
    QCOMPARE(skipped.lines.size(), std::size_t(1));
    QCOMPARE(skipped.snapshot.stage(1).errors_skipped(), std::uint64_t(2));
    auto unknown = run_text(files + stage("csv", "csv_reader", "files", {{"select_columns", "id,depth"}}) + stage("out", "null_sink", "csv"));
    QVERIFY2(unknown.result.error.find("select_columns names 'depth', which is not a column (columns: id, temp, site, count)") != std::string::npos,
             unknown.result.error.c_str());
  }

  void label_from_path_uses_parent_folders() {
    QTemporaryDir dir;
    std::string root = dir.path().toStdString();
    for (auto p : {"/cat/1.jpg", "/dog/2.jpg", "/dog/3.jpg"}) {
      fs::create_directories(fs::path(root + p).parent_path());
      write_file(root + p, "x");
    }
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", root + "/*/*.jpg"}}) +
                      stage("label", "label_from_path", "files", {{"root", root}}) + sink_after("label"));
    QCOMPARE(out.lines.size(), std::size_t(3));
    QVERIFY(out.lines[0].find("\"label\":0") != std::string::npos);
    QVERIFY(out.lines[2].find("\"label\":1") != std::string::npos);
  }
  // TFDS's split grammar against the boundaries TFDS computes (Python's round(b * n / 100.):
  // halves to even; pct1_dropremainder: b * trunc(n / 100)); the expected values were computed
  // with Python, not with the code under test.
  void tfds_splits_resolve_as_tfds_resolves_them_data() {
    QTest::addColumn<QString>("spec");
    QTest::addColumn<bool>("pct1");
    QTest::addColumn<QString>("expected");
    auto row = [](const char* spec, const char* expected, bool pct1 = false) {
      QTest::addRow("%s%s", spec, pct1 ? " pct1" : "") << QString(spec) << pct1 << QString(expected);
    };
    // MNIST's splits (tests/data/real/tfds): TFDS's documented forms.
    row("train", "train:0-60000");
    row("train[:4000]", "train:0-4000");
    row("train[-1000:]", "train:59000-60000");
    row("train[:75%]", "train:0-45000");
    row("train[25%:75%]", "train:15000-45000");
    row("train[1:-1]", "train:1-59999");
    row("train[:25%]+test", "train:0-15000,test:0-10000");
    row("test[:-5%]+train[40%:60%]", "test:0-9500,train:24000-36000");
    row("train[:10%] + test", "train:0-6000,test:0-10000");
    row("all", "train:0-60000,test:0-10000");
    row("train[10.5%:20.25%]", "train:6300-12150");
    // Sizes where rounding to the closest and truncation differ, exact halves among them.
    row("five[:50%]", "five:0-2");
    row("five[50%:]", "five:2-5");
    row("seven[:50%]", "seven:0-4");
    row("three[33%:67%]", "three:1-2");
    row("n199[:50%]", "n199:0-100");
    row("n199[:50%]", "n199:0-50", true);
    row("n250[:3%]", "n250:0-8");
    row("n250[:3%]", "n250:0-6", true);
    row("n1001[-1%:]", "n1001:991-1001");
    row("n1001[:-99.5%]", "n1001:0-5");
    row("n1001[:-99.5%]", "n1001:0-6", true);
    // Shards of 10, 20 and 30 examples.
    row("sharded[1shard]", "sharded:10-30");
    row("sharded[:2shard]", "sharded:0-30");
    row("sharded[-1shard:]", "sharded:30-60");
    row("sharded[:-1shard]", "sharded:0-30");
    row("sharded[1shard:3shard]", "sharded:10-60");
  }
  void tfds_splits_resolve_as_tfds_resolves_them() {
    QFETCH(QString, spec);
    QFETCH(bool, pct1);
    QFETCH(QString, expected);
    const std::vector<sluice::io::SplitShards> splits = {{"train", {60000}}, {"test", {10000}},   {"five", {5}},    {"seven", {7}},
                                                         {"three", {3}},      {"n199", {199}},     {"n250", {250}},  {"n1001", {1001}},
                                                         {"sharded", {10, 20, 30}}};
    // `all` is every split: ask it of MNIST's two alone.
    const auto used = spec == "all" ? std::vector<sluice::io::SplitShards>(splits.begin(), splits.begin() + 2) : splits;
    const auto ranges = sluice::io::resolve_split(spec.toStdString(), used,
                                                  pct1 ? sluice::io::SplitRounding::Pct1DropRemainder : sluice::io::SplitRounding::Closest);
    QStringList got;
    for (const auto& r : ranges) got << QString("%1:%2-%3").arg(QString::fromStdString(r.split)).arg(r.from).arg(r.to);
    QCOMPARE(got.join(","), expected);
  }

  void tfds_split_errors_name_what_is_wrong() {
    const std::vector<sluice::io::SplitShards> splits = {{"train", {60000}}, {"test", {10000}}, {"small", {50}}};
    auto refusal = [&](const std::string& spec, sluice::io::SplitRounding rounding = sluice::io::SplitRounding::Closest) {
      try {
        sluice::io::resolve_split(spec, splits, rounding);
      } catch (const sluice::ParamError& e) {
        return std::string(e.what());
      }
      return std::string("(accepted)");
    };
    auto expect = [&](const std::string& spec, const std::string& text, sluice::io::SplitRounding rounding = sluice::io::SplitRounding::Closest) {
      const std::string why = refusal(spec, rounding);
      QVERIFY2(why.find("split '" + spec + "'") != std::string::npos && why.find(text) != std::string::npos, (spec + ": " + why).c_str());
    };
    expect("train[:101%]", "between -100% and 100%");
    expect("train[70000:]", "exceeds its 60000 examples");
    expect("train[-60001:]", "exceeds its 60000 examples");
    expect("all[:10%]", "'all' takes no slice");
    expect("valid", "no split 'valid' (it has: train, test, small)");
    expect("train[5]", "a single index must be a shard");
    expect("train[:]", "selects nothing");
    expect("train[1.5:]", "only a percent may have a fraction");
    expect("train[1:2:3]", "more than one ':'");
    expect("train[a:]", "is not a boundary");
    expect("train[:10%", "is not SPLIT or SPLIT[SLICE]");
    expect("small[:10%]", "at least 100 examples (this one has 50)", sluice::io::SplitRounding::Pct1DropRemainder);
  }

  // Only the shards a range touches are read, each from where the range enters it.
  void tfds_split_ranges_open_only_their_shards() {
    const sluice::io::SplitShards sharded{"train", {10, 20, 30}};
    QStringList got;
    for (const auto& r : sluice::io::shard_reads({"train", 5, 45}, sharded)) got << QString("%1+%2:%3").arg(r.shard).arg(r.skip).arg(r.take);
    QCOMPARE(got.join(" "), QString("0+5:5 1+0:20 2+0:15"));
    got.clear();
    for (const auto& r : sluice::io::shard_reads({"train", 12, 14}, sharded)) got << QString("%1+%2:%3").arg(r.shard).arg(r.skip).arg(r.take);
    QCOMPARE(got.join(" "), QString("1+2:2"));
    QVERIFY(sluice::io::shard_reads({"train", 30, 30}, sharded).empty());
  }
  // A file cut while it is read (its footer read at the open, its chunks later, ahead of the
  // caller): the chunks before the cut are still read, each chunk after it named and skipped.
  void an_array_record_file_cut_while_read_keeps_the_chunks_before_the_cut() {
    const std::string path = (fs::temp_directory_path() / ("sluice-cut-" + std::to_string(::getpid()) + ".array_record")).string();
    sluice::io::ArrayRecordEncoder encoder(sluice::io::parse_array_record_options("group_size:1,uncompressed"));
    std::string bytes;
    for (int i = 0; i < 300; ++i) {
      const std::string record = "record " + std::to_string(i);
      encoder.add(record.data(), record.size());
      bytes += encoder.ready();
      encoder.ready().clear();
    }
    encoder.finish();
    write_file(path, bytes + encoder.ready());
    struct Skips final : sluice::DamageReport {
      std::vector<std::string> reasons;
      bool skip_damaged(const std::string& reason) override { return reasons.push_back(reason), true; }
    };
    for (const bool skip : {true, false}) {
      sluice::io::ArrayRecordStream stream(path, nullptr, true, 2048, nullptr);  // runs of a few dozen chunks
      const auto& chunks = stream.layout().chunks;
      QCOMPARE(chunks.size(), std::size_t(300));
      QVERIFY(chunks[100].offset - chunks[0].offset > 2048);  // the cut falls in a later run than the first
      fs::resize_file(path, chunks[100].offset + 10);
      Skips skips;
      sluice::io::Record record;
      int read = 0;
      try {
        while (stream.next(record, skip ? &skips : nullptr)) {
          QCOMPARE(std::string(reinterpret_cast<const char*>(record.data()), record.length), "record " + std::to_string(read));
          ++read;
        }
        QVERIFY(skip);
      } catch (const sluice::DataError& e) {
        QVERIFY(!skip);
        QVERIFY2(std::string(e.what()).find(path + " ends at byte " + std::to_string(chunks[100].offset + 10)) == 0, e.what());
      }
      QCOMPARE(read, 100);
      if (skip) {
        QCOMPARE(skips.reasons.size(), std::size_t(200));
        QVERIFY2(skips.reasons[0].find(path + " ends at byte") == 0 && skips.reasons[0].find("; its 1 records skipped") != std::string::npos,
                 skips.reasons[0].c_str());
      }
      write_file(path, bytes + encoder.ready());
    }
    fs::remove(path);
  }
};

QTEST_APPLESS_MAIN(TestIo)
#include "tst_io.moc"
