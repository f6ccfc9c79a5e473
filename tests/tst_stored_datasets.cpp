// Datasets as other tools store them: tensorflow_datasets directories (the tfds source and
// tfds_reader), on TFDS's own metadata and on directories written here as TFDS writes them.
#include <QtTest>

#include <filesystem>
#include <fstream>
#include <functional>

#include "example_codec.hpp"
#include "pipeline_runner.hpp"
#include "tfds_info.hpp"
#include "tfrecord.hpp"
#include "webdataset_format.hpp"

using namespace sluice::test;
using Ints = std::vector<long long>;
namespace fs = std::filesystem;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string mnist_info() { return read_file(testdata_dir() + "/tfds/metadata/mnist/3.0.1/dataset_info.json"); }

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  if (at == std::string::npos) qFatal("'%s' is not in the text", from.c_str());
  return text.replace(at, from.size(), to);
}

// features.json of MNIST as TFDS 4.9 writes it.
const char* kMnistFeatures = R"({
  "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
  "featuresDict": {"features": {
    "image": {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
              "image": {"shape": {"dimensions": ["28", "28", "1"]}, "dtype": "uint8", "encodingFormat": "png"}},
    "label": {"pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
              "classLabel": {"numClasses": "10"}}}}})";

// A dataset with every feature kind the reader knows, in TFDS's JSON: "id" numbers the examples
// of each split (train from 0, test from 100) so that a slice's examples can be told apart.
const char* kToyFeatures = R"({
  "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
  "featuresDict": {"features": {
    "id": {"pythonClassName": "tensorflow_datasets.core.features.scalar.Scalar",
           "tensor": {"shape": {}, "dtype": "int64", "encoding": "none"}},
    "image": {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
              "image": {"shape": {"dimensions": ["-1", "-1", "3"]}, "dtype": "uint8", "encodingFormat": "png"}},
    "label": {"pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
              "classLabel": {"numClasses": "3"}},
    "caption": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
    "pose": {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
             "tensor": {"shape": {"dimensions": ["2", "3"]}, "dtype": "float64", "encoding": "none"}},
    "mask": {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
             "tensor": {"shape": {"dimensions": ["-1"]}, "dtype": "bool", "encoding": "none"}},
    "objects": {"pythonClassName": "tensorflow_datasets.core.features.sequence_feature.Sequence",
                "sequence": {"length": "-1", "feature": {
                  "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
                  "featuresDict": {"features": {
                    "bbox": {"pythonClassName": "tensorflow_datasets.core.features.bounding_boxes.BBoxFeature",
                             "boundingBox": {"shape": {"dimensions": ["4"]}, "dtype": "float32"}},
                    "kind": {"pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                             "classLabel": {"numClasses": "3"}}}}}}}}}})";

std::string toy_info(const std::string& name, const std::vector<std::pair<std::string, std::vector<int>>>& splits) {
  std::string text = "{\"name\": \"" + name + "\", \"version\": \"1.0.0\", \"fileFormat\": \"tfrecord\", \"splits\": [";
  for (std::size_t s = 0; s < splits.size(); ++s) {
    text += std::string(s ? "," : "") + "{\"name\": \"" + splits[s].first +
            "\", \"filepathTemplate\": \"{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}\", \"shardLengths\": [";
    for (std::size_t k = 0; k < splits[s].second.size(); ++k) text += (k ? ",\"" : "\"") + std::to_string(splits[s].second[k]) + "\"";
    text += "]}";
  }
  return text + "], \"supervisedKeys\": {\"tuple\": {\"items\": [{\"featureKey\": \"image\"}, {\"featureKey\": \"label\"}]}}}";
}

// The example numbered `id` of the toy dataset: its objects, mask and pose follow from the id.
sluice::Sample toy_example(long long id) {
  using sluice::Tensor;
  sluice::Sample s;
  s.set("id", Tensor::scalar<std::int64_t>(id));
  s.set("image", Tensor::from_string("png-bytes-" + std::to_string(id)));
  s.set("label", Tensor::scalar<std::int64_t>(id % 3));
  s.set("caption", Tensor::from_string("caption " + std::to_string(id)));
  s.set("pose", Tensor::from_vector<double>({0.5, 1, 2, 3, 4, static_cast<double>(id)}, {2, 3}));
  std::vector<std::int64_t> mask;
  for (long long k = 0; k < id % 4; ++k) mask.push_back(k % 2);
  s.set("mask", Tensor::from_vector<std::int64_t>(mask, {static_cast<std::int64_t>(mask.size())}));
  const std::int64_t objects = id % 3;
  std::vector<float> boxes;
  std::vector<std::int64_t> kinds;
  for (std::int64_t k = 0; k < objects; ++k) {
    boxes.insert(boxes.end(), {0.25f, 0.5f, 0.75f, static_cast<float>(k)});
    kinds.push_back((id + k) % 3);
  }
  s.set("objects/bbox", Tensor::from_vector<float>(boxes, {objects * 4}));
  s.set("objects/kind", Tensor::from_vector<std::int64_t>(kinds, {objects}));
  return s;
}

// Writes DIR/NAME/1.0.0 with the shards its dataset_info.json describes; returns the version folder.
std::string write_toy(const std::string& data_dir, const std::string& name,
                      const std::vector<std::pair<std::string, std::vector<int>>>& splits) {
  const std::string dir = data_dir + "/" + name + "/1.0.0";
  write_file(dir + "/dataset_info.json", toy_info(name, splits));
  write_file(dir + "/features.json", kToyFeatures);
  write_file(dir + "/label.labels.txt", "cat\ndog\nbird\n");
  write_file(dir + "/objects-kind.labels.txt", "small\r\nlarge\r\n\r\nhuge\r\n");  // names of the nested ClassLabel
  for (const auto& [split, lengths] : splits) {
    long long id = split == "train" ? 0 : 100;
    for (std::size_t shard = 0; shard < lengths.size(); ++shard) {
      std::string bytes;
      for (int k = 0; k < lengths[shard]; ++k) {
        const std::string example = sluice::io::encode_example(toy_example(id++));
        sluice::io::append_record(bytes, example.data(), example.size());
      }
      char numbered[32];
      std::snprintf(numbered, sizeof numbered, "%05zu-of-%05zu", shard, lengths.size());
      write_file(dir + "/" + name + "-" + split + ".tfrecord-" + numbered, bytes);
    }
  }
  return dir;
}

std::string tfds_chain(const std::string& data_dir, const std::string& name, const std::string& split,
                       std::vector<std::pair<std::string, std::string>> extra = {}, const std::string& reader_extra = "") {
  std::vector<std::pair<std::string, std::string>> params{{"name", name}, {"split", split}, {"data_dir", data_dir}};
  params.insert(params.end(), extra.begin(), extra.end());
  return stage("shards", "tfds", "", params) + stage("examples", "tfds_reader", "shards", {}, reader_extra);
}

RunOutput run_ok(const std::string& text) {
  auto out = run_text(text);
  if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
    qFatal("pipeline did not finish: %s %s", out.error.c_str(), out.result.error.c_str());
  return out;
}

Ints ids_of(const std::string& data_dir, const std::string& split, const std::string& reader_extra = "") {
  auto out = run_ok(tfds_chain(data_dir, "toy", split, {}, reader_extra) + stage("ids", "select_fields", "examples", {{"keep", "id"}}) +
                    sink_after("ids"));
  return all_integers(out.lines);
}

Ints span(long long from, long long to) {  // [from, to)
  Ints out;
  for (long long i = from; i < to; ++i) out.push_back(i);
  return out;
}
Ints joined(Ints a, const Ints& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string error_of(const std::string& text) {
  auto out = run_text(text);
  return out.error.empty() ? out.result.error : out.error;
}

}  // namespace

class TestStoredDatasets : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QVERIFY(data_.isValid());
    write_toy(data_.path().toStdString(), "toy", {{"train", {5, 7, 4}}, {"test", {6}}});
  }

  // TFDS's own description of MNIST: the splits and shards it lists, its supervised keys, and the
  // array_record format its shards are in (their names); a format Sluice does not read refused by
  // name; a copy saying tfrecord, with its shards written to match, read by slices.
  void mnist_metadata_is_read_as_tfds_wrote_it() {
    QTemporaryDir data;
    {
      const std::string dir = data.path().toStdString() + "/as_written/mnist/3.0.1";
      write_file(dir + "/dataset_info.json", mnist_info());
      write_file(dir + "/features.json", kMnistFeatures);
      const auto ds = sluice::io::read_tfds_dataset(dir);
      QCOMPARE(ds.file_format, std::string("array_record"));
      QCOMPARE(ds.shard_path("test", 0), dir + "/mnist-test.array_record-00000-of-00001");
      write_file(dir + "/dataset_info.json", replaced(mnist_info(), "\"array_record\"", "\"riegeli\""));
      try {
        sluice::io::read_tfds_dataset(dir);
        QFAIL("riegeli was accepted");
      } catch (const sluice::DataError& e) {
        const std::string what = e.what();
        QVERIFY2(what.find(dir + "/dataset_info.json") == 0, what.c_str());
        QVERIFY2(what.find("fileFormat \"riegeli\"") != std::string::npos, what.c_str());
        QVERIFY2(what.find("file_format='array_record'") != std::string::npos, what.c_str());
      }
    }

    const std::string dir = data.path().toStdString() + "/mnist/3.0.1";
    write_file(dir + "/dataset_info.json", replaced(mnist_info(), "\"array_record\"", "\"tfrecord\""));
    write_file(dir + "/features.json", kMnistFeatures);
    const auto ds = sluice::io::read_tfds_dataset(sluice::io::find_tfds_dataset(data.path().toStdString(), "mnist"));
    QCOMPARE(ds.name, std::string("mnist"));
    QCOMPARE(ds.version, std::string("3.0.1"));
    QCOMPARE(ds.splits.size(), std::size_t(2));
    QCOMPARE(ds.splits[0].shards.shard_lengths, (std::vector<std::uint64_t>{60000}));
    QCOMPARE(ds.splits[1].shards.shard_lengths, (std::vector<std::uint64_t>{10000}));
    QCOMPARE(ds.splits[0].num_bytes, std::uint64_t(18872042));
    QVERIFY(ds.supervised_keys.has_value());
    QCOMPARE(ds.supervised_keys->first, std::string("image"));
    QCOMPARE(ds.supervised_keys->second, std::string("label"));
    QCOMPARE(ds.shard_path("train", 0), dir + "/mnist-train.tfrecord-00000-of-00001");
    QCOMPARE(ds.features.size(), std::size_t(2));
    QCOMPARE(ds.features[0].name, std::string("image"));
    QCOMPARE(ds.features[0].shape, (sluice::Shape{28, 28, 1}));
    QCOMPARE(ds.features[1].num_classes, std::int64_t(10));

    // Shards as MNIST's metadata describes them: image bytes numbered by example, label k % 10.
    for (const auto& [split, count] : std::vector<std::pair<std::string, int>>{{"train", 60000}, {"test", 10000}}) {
      std::string bytes;
      for (int k = 0; k < count; ++k) {
        sluice::Sample s;
        s.set("image", sluice::Tensor::from_string(std::to_string(k)));
        s.set("label", sluice::Tensor::scalar<std::int64_t>(k % 10));
        const std::string example = sluice::io::encode_example(s);
        sluice::io::append_record(bytes, example.data(), example.size());
      }
      write_file(ds.shard_path(split, 0), bytes);
    }
    auto numbered = [&](const std::string& split) {
      auto out = run_ok(tfds_chain(data.path().toStdString(), "mnist:3.0.1", split) +
                        stage("num", "split_text", "examples", {{"field", "image"}, {"to", "int64"}}) +
                        stage("pick", "select_fields", "num", {{"keep", "image"}}) + sink_after("pick"));
      return all_integers(out.lines);
    };
    QCOMPARE(numbered("train[-1000:]"), span(59000, 60000));
    QCOMPARE(numbered("test[:1%]"), span(0, 100));
    QCOMPARE(numbered("test[33.33%:33.35%]"), span(3333, 3335));  // round(3333.0), round(3335.0)
    QCOMPARE(numbered("test[9998:]+train[:2]"), joined(span(9998, 10000), span(0, 2)));
    QCOMPARE(numbered("test[-3:]").size(), std::size_t(3));
  }

  void slices_read_the_examples_tfds_selects_data() {
    QTest::addColumn<QString>("split");
    QTest::addColumn<Ints>("ids");
    // train has shards of 5, 7 and 4 examples (ids 0-15), test one of 6 (ids 100-105); the
    // boundaries are TFDS's (round(16 * p / 100), halves to even).
    QTest::newRow("whole split") << "train" << span(0, 16);
    QTest::newRow("first examples") << "train[:4]" << span(0, 4);
    QTest::newRow("across shards") << "train[3:13]" << span(3, 13);
    QTest::newRow("negative start") << "train[-5:]" << span(11, 16);
    QTest::newRow("negative end") << "train[:-14]" << span(0, 2);
    QTest::newRow("percent") << "train[:25%]" << span(0, 4);
    QTest::newRow("percent range") << "train[33%:67%]" << span(5, 11);  // 5.28 -> 5, 10.72 -> 11
    QTest::newRow("fractional percent") << "train[12.5%:]" << span(2, 16);  // 2.0
    QTest::newRow("halves to even") << "test[:25%]" << span(100, 102);     // 1.5 -> 2
    QTest::newRow("halves to even below") << "test[:75%]" << span(100, 104);  // 4.5 -> 4
    QTest::newRow("one shard") << "train[1shard]" << span(5, 12);
    QTest::newRow("shard range") << "train[1shard:]" << span(5, 16);
    QTest::newRow("union") << "test[:50%]+train[15:]" << Ints{100, 101, 102, 15};
    QTest::newRow("all") << "all" << joined(span(0, 16), span(100, 106));
  }
  void slices_read_the_examples_tfds_selects() {
    QFETCH(QString, split);
    QFETCH(Ints, ids);
    QCOMPARE(ids_of(data_.path().toStdString(), split.toStdString()), ids);
    // Read as TFDS reads (16 shards at once, blocks of 16 examples): the same order here, as no
    // shard gives more than a block.
    QCOMPARE(ids_of(data_.path().toStdString(), split.toStdString(), "interleave { cycle_length: 16 block_length: 16 } parallelism: 2"), ids);
    // random_access over the same split: in file order the same examples, shuffled a permutation of them.
    auto at_random = [&](const char* shuffle) {
      auto out = run_ok("options { seed: 3 }\n" +
                        stage("src", "random_access", "",
                              {{"tfds", "toy"}, {"split", split.toStdString()}, {"data_dir", data_.path().toStdString()}, {"shuffle", shuffle},
                               {"index_dir", data_.path().toStdString() + "/index"}}) +
                        stage("ids", "select_fields", "src", {{"keep", "id"}}) + sink_after("ids"));
      return all_integers(out.lines);
    };
    QCOMPARE(at_random("false"), ids);
    Ints shuffled = at_random("true"), sorted_ids = ids;
    std::sort(shuffled.begin(), shuffled.end());
    std::sort(sorted_ids.begin(), sorted_ids.end());
    QCOMPARE(shuffled, sorted_ids);
  }

  // Each worker of a job reads its part of a split, through automatic sharding: by shard read
  // when there are as many as workers, by example otherwise; together, the split once.
  void workers_read_their_parts_of_a_split_data() {
    QTest::addColumn<QString>("split");
    QTest::addColumn<int>("workers");
    QTest::addColumn<QString>("how");
    QTest::newRow("by shard") << "train" << 3 << "by file";
    QTest::newRow("by example") << "train[2:9]" << 3 << "by record";  // 2 shard reads for 3 workers
  }
  void workers_read_their_parts_of_a_split() {
    QFETCH(QString, split);
    QFETCH(int, workers);
    QFETCH(QString, how);
    const std::string text = "options { seed: 4 }\n" + tfds_chain(data_.path().toStdString(), "toy", split.toStdString(), {{"shuffle_files", "true"}}) +
                             stage("ids", "select_fields", "examples", {{"keep", "id"}}) + sink_after("ids");
    Ints all;
    for (int w = 0; w < workers; ++w) {
      sluice::WorkerIdentity worker;
      worker.index = w;
      worker.count = workers;
      sluice::WorkerPlan plan;
      auto out = run_text_as_worker(text, worker, &plan);
      QVERIFY2(out.error.empty() && out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
      std::string notes;
      for (const auto& n : plan.notes) notes += n + "\n";
      QVERIFY2(notes.find(how.toStdString()) != std::string::npos, notes.c_str());
      const Ints mine = all_integers(out.lines);
      QVERIFY(!mine.empty());
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::sort(all.begin(), all.end());
    QCOMPARE(all, ids_of(data_.path().toStdString(), split.toStdString()));
  }

  void pct1_dropremainder_rounds_in_whole_percents() {
    QTemporaryDir data;
    write_toy(data.path().toStdString(), "toy", {{"train", {60, 90}}});
    auto out = run_ok(tfds_chain(data.path().toStdString(), "toy", "train[:33%]", {{"rounding", "pct1_dropremainder"}}) +
                      stage("ids", "select_fields", "examples", {{"keep", "id"}}) + sink_after("ids"));
    QCOMPARE(all_integers(out.lines), span(0, 33));  // 33 * trunc(150 / 100); closest would give 50 (49.5 to even)
    out = run_ok(tfds_chain(data.path().toStdString(), "toy", "train[:33%]") + stage("ids", "select_fields", "examples", {{"keep", "id"}}) +
                 sink_after("ids"));
    QCOMPARE(all_integers(out.lines), span(0, 50));
  }

  // Every field as features.json describes it: dtypes and shapes, sequences' open dimension,
  // nested names flattened with '/', class names on request.
  void fields_follow_features_json() {
    auto out = run_ok(tfds_chain(data_.path().toStdString(), "toy", "train[5:6]", {}, "params { key: \"class_names\" value: \"true\" }") +
                      sink_after("examples"));
    QCOMPARE(out.lines.size(), std::size_t(1));
    const std::string& line = out.lines[0];
    // id 5: label 2 (bird), 2 objects, mask of 1 value, pose ending in 5.
    for (const char* expected : {"\"id\":5", "\"label\":2", "\"label_name\":\"YmlyZA==\"", "\"caption\":\"Y2FwdGlvbiA1\"",
                                 "\"pose\":[[0.5,1,2],[3,4,5]]", "\"mask\":[0]", "\"objects/bbox\":[[0.25,0.5,0.75,0],[0.25,0.5,0.75,1]]",
                                 "\"objects/kind\":[2,0]", "\"objects/kind_name\":[\"aHVnZQ==\",\"c21hbGw=\"]", "\"image\":\"cG5nLWJ5dGVzLTU=\""})
      QVERIFY2(line.find(expected) != std::string::npos, (std::string(expected) + " not in " + line).c_str());

    const auto ds = sluice::io::read_tfds_dataset(data_.path().toStdString() + "/toy/1.0.0");
    std::map<std::string, std::pair<sluice::DType, sluice::Shape>> fields;
    for (const auto& f : ds.features) fields[f.name] = {f.dtype, f.shape};
    QCOMPARE(fields.size(), std::size_t(8));
    QCOMPARE(fields["pose"].first, sluice::DType::F64);
    QCOMPARE(fields["mask"].first, sluice::DType::U8);  // bool
    QCOMPARE(fields["objects/bbox"].second, (sluice::Shape{-1, 4}));
    QCOMPARE(fields["objects/kind"].second, (sluice::Shape{-1}));
    QCOMPARE(fields["id"].second, sluice::Shape{});
    QCOMPARE(fields["image"].first, sluice::DType::Bytes);
  }

  void shuffle_files_shuffles_shards_with_the_seed() {
    const std::string dir = data_.path().toStdString();
    auto ids = [&](const std::string& seed) {
      auto out = run_ok("options { seed: " + seed + " }\n" + tfds_chain(dir, "toy", "train", {{"shuffle_files", "true"}}) +
                        stage("ids", "select_fields", "examples", {{"keep", "id"}}) + sink_after("ids"));
      return all_integers(out.lines);
    };
    const Ints a = ids("1"), b = ids("1");
    QCOMPARE(a, b);
    Ints sorted = a;
    std::sort(sorted.begin(), sorted.end());
    QCOMPARE(sorted, span(0, 16));
    // Shards stay whole: each shard's examples in a row, in order.
    std::set<long long> starts;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (i == 0 || a[i] != a[i - 1] + 1) starts.insert(a[i]);
    QVERIFY(starts == (std::set<long long>{0, 5, 12}) || starts.size() < 3);
    bool differs = false;
    for (const char* seed : {"2", "3", "4", "5", "6"}) differs = differs || ids(seed) != a;
    QVERIFY(differs);
  }

  void refusals_name_the_file_and_what_to_do_data() {
    QTest::addColumn<QString>("setup");
    QTest::addColumn<QString>("name");
    QTest::addColumn<QString>("split");
    QTest::addColumn<QStringList>("expected");
    QTest::newRow("no dataset") << "" << "nothere" << "train" << QStringList{"no dataset 'nothere'", "download_and_prepare"};
    QTest::newRow("no such version") << "" << "toy:2.0.0" << "train" << QStringList{"version 2.0.0", "not prepared"};
    QTest::newRow("bad name") << "" << "toy::1" << "train" << QStringList{"name 'toy::1'", "NAME:VERSION"};
    QTest::newRow("no such split") << "" << "toy" << "validation" << QStringList{"validation", "train"};
    QTest::newRow("slice too long") << "" << "toy" << "train[:17]" << QStringList{"train[:17]"};
    QTest::newRow("missing shard") << "missing shard" << "toy" << "train[-2:]" << QStringList{"toy-train.tfrecord-00002-of-00003", "missing"};
    QTest::newRow("old format") << "old features" << "toy" << "train" << QStringList{"features.json", "before 4.0"};
    QTest::newRow("unknown feature") << "unknown feature" << "toy" << "train" << QStringList{"features.json", "'clip'", "parse_example"};
    QTest::newRow("encoded tensor") << "encoded tensor" << "toy" << "train" << QStringList{"'clip'", "encoding 'zlib'"};
    QTest::newRow("short shard") << "short shard" << "toy" << "train" << QStringList{"toy-train.tfrecord-00001-of-00003", "ends after 6 records"};
    // Metadata that shortens a split (shardLengths of 2 where the shard holds 7) would leave
    // examples out silently: the shard read to its end says it holds more.
    QTest::newRow("shortened metadata") << "shortened metadata" << "toy" << "train"
                                        << QStringList{"toy-train.tfrecord-00001-of-00003 holds more than the 2 records", "shardLengths"};
    // A template may not name files outside the version folder.
    QTest::newRow("template up") << "template ../" << "toy" << "train"
                                 << QStringList{"dataset_info.json", "split 'train' has filepathTemplate '../", "leaves the version folder"};
    QTest::newRow("template absolute") << "template /" << "toy" << "train"
                                       << QStringList{"dataset_info.json", "filepathTemplate '/etc/", "leaves the version folder"};
  }
  void refusals_name_the_file_and_what_to_do() {
    QFETCH(QString, setup);
    QFETCH(QString, name);
    QFETCH(QString, split);
    QFETCH(QStringList, expected);
    QTemporaryDir data;
    const std::string dir = write_toy(data.path().toStdString(), "toy", {{"train", {5, 7, 4}}});
    if (setup == "missing shard") fs::remove(dir + "/toy-train.tfrecord-00002-of-00003");
    if (setup == "old features")
      write_file(dir + "/features.json", R"({"type": "tensorflow_datasets.core.features.features_dict.FeaturesDict", "content": {}})");
    if (setup == "unknown feature")
      write_file(dir + "/features.json", replaced(kToyFeatures, "\"id\":", R"("clip": {"pythonClassName": "my.Clip", "jsonFeature": {"json": "{}"}}, "id":)"));
    if (setup == "encoded tensor")
      write_file(dir + "/features.json", replaced(kToyFeatures, "\"id\":", R"("clip": {"tensor": {"dtype": "float32", "encoding": "zlib"}}, "id":)"));
    if (setup == "shortened metadata") write_file(dir + "/dataset_info.json", toy_info("toy", {{"train", {5, 2, 4}}}));
    if (setup == "template ../")
      write_file(dir + "/dataset_info.json", replaced(toy_info("toy", {{"train", {5, 7, 4}}}), "\"{DATASET}-", "\"../../{DATASET}-"));
    if (setup == "template /")
      write_file(dir + "/dataset_info.json", replaced(toy_info("toy", {{"train", {5, 7, 4}}}), "\"{DATASET}-", "\"/etc/{DATASET}-"));
    if (setup == "short shard") {  // a shard with one example fewer than dataset_info.json says
      std::string bytes;
      for (long long id = 5; id < 11; ++id) {
        const std::string example = sluice::io::encode_example(toy_example(id));
        sluice::io::append_record(bytes, example.data(), example.size());
      }
      write_file(dir + "/toy-train.tfrecord-00001-of-00003", bytes);
    }
    const std::string error = error_of(tfds_chain(data.path().toStdString(), name.toStdString(), split.toStdString()) + sink_after("examples"));
    for (const QString& part : expected) QVERIFY2(error.find(part.toStdString()) != std::string::npos, error.c_str());
  }

  // The same pipeline under the skip policy steps over the shard that ends early.
  void a_short_shard_is_skipped_under_skip() {
    QTemporaryDir data;
    const std::string dir = write_toy(data.path().toStdString(), "toy", {{"train", {5, 7, 4}}});
    std::string bytes;
    for (long long id = 5; id < 11; ++id) {
      const std::string example = sluice::io::encode_example(toy_example(id));
      sluice::io::append_record(bytes, example.data(), example.size());
    }
    write_file(dir + "/toy-train.tfrecord-00001-of-00003", bytes);
    auto out = run_ok("options { error_policy: skip }\n" + tfds_chain(data.path().toStdString(), "toy", "train") +
                      stage("ids", "select_fields", "examples", {{"keep", "id"}}) + sink_after("ids"));
    QCOMPARE(all_integers(out.lines), joined(span(0, 11), span(12, 16)));
  }

  // tfds_writer's directory read back by the tfds source: the same values, split by split, with
  // the features described from the fields (class labels and supervised keys as asked).
  void tfds_writer_round_trips() {
    QTemporaryDir out;
    const std::string dir = out.path().toStdString();
    auto write = [&](const std::string& split, const std::string& extra) {
      run_ok(tfds_chain(data_.path().toStdString(), "toy", split) +
             stage("write", "tfds_writer", "examples",
                   {{"data_dir", dir}, {"name", "copy"}, {"split", split.substr(0, split.find('['))}, {"max_records", "5"},
                    {"class_labels", "label,objects/kind"}, {"supervised_keys", "image,label"}}, extra));
    };
    write("train", "");
    write("test", "");
    const std::string version = dir + "/copy/1.0.0";
    QVERIFY(fs::exists(version + "/copy-train.tfrecord-00003-of-00004"));  // 16 examples, 5 a shard
    QVERIFY(fs::exists(version + "/copy-test.tfrecord-00001-of-00002"));
    const auto ds = sluice::io::read_tfds_dataset(version);
    QCOMPARE(ds.splits.size(), std::size_t(2));
    QCOMPARE(ds.splits[0].shards.shard_lengths, (std::vector<std::uint64_t>{5, 5, 5, 1}));
    QCOMPARE(ds.splits[1].shards.shard_lengths, (std::vector<std::uint64_t>{5, 1}));
    QVERIFY(ds.splits[0].num_bytes > 0);
    QCOMPARE(ds.supervised_keys->second, std::string("label"));
    std::map<std::string, sluice::io::TfdsFeature> features;
    for (const auto& f : ds.features) features[f.name] = f;
    QCOMPARE(features["label"].kind, sluice::io::TfdsFeature::Kind::ClassLabel);
    QCOMPARE(features["label"].num_classes, std::int64_t(3));
    QCOMPARE(features["objects/kind"].num_classes, std::int64_t(3));
    QCOMPARE(features["caption"].kind, sluice::io::TfdsFeature::Kind::Text);
    QCOMPARE(features["pose"].shape, (sluice::Shape{2, 3}));
    QCOMPARE(features["objects/bbox"].shape, (sluice::Shape{-1, 4}));
    QCOMPARE(features["id"].shape, sluice::Shape{});

    for (const std::string split : {"train", "test", "all", "train[3:13]"}) {
      auto original = run_ok(tfds_chain(data_.path().toStdString(), "toy", split) + sink_after("examples"));
      auto copy = run_ok(tfds_chain(dir, "copy", split) + sink_after("examples"));
      QCOMPARE(copy.lines, original.lines);
    }

    // A split of one example (one class, one object) fits the others' description: their class
    // counts and open dimensions stay.
    write("test[:1]", "");
    const auto grown = sluice::io::read_tfds_dataset(version);
    QCOMPARE(grown.splits.size(), std::size_t(2));
    QCOMPARE(grown.splits[1].shards.shard_lengths, (std::vector<std::uint64_t>{1}));
    for (const auto& f : grown.features) {
      if (f.name == "label") QCOMPARE(f.num_classes, std::int64_t(3));
      if (f.name == "objects/bbox") QCOMPARE(f.shape, (sluice::Shape{-1, 4}));
    }
    write("test", "");

    // Another split of other features is refused, and what was written stays.
    const std::string info_before = read_file(version + "/dataset_info.json");
    const std::string error = error_of(tfds_chain(data_.path().toStdString(), "toy", "test") +
                                       stage("pick", "select_fields", "examples", {{"keep", "id,caption"}}) +
                                       stage("write", "tfds_writer", "pick", {{"data_dir", dir}, {"name", "copy"}, {"split", "extra"}}));
    QVERIFY2(error.find(version + "/features.json") != std::string::npos && error.find("other features") != std::string::npos, error.c_str());
    QCOMPARE(read_file(version + "/dataset_info.json"), info_before);
    QVERIFY(!fs::exists(version + "/copy-extra.tfrecord-00000-of-00001"));
  }

  // Images are described as TFDS describes them, from their headers: format, height, width,
  // channels, with -1 where they differ.
  void tfds_writer_describes_encoded_images() {
    QTemporaryDir out;
    const std::string dir = out.path().toStdString();
    run_ok(stage("img", "synthetic_images", "", {{"count", "6"}, {"height", "24"}, {"width", "32"}}) +
           stage("png", "encode_image", "img", {{"format", "png"}}) +
           stage("write", "tfds_writer", "png", {{"data_dir", dir}, {"name", "pictures"}}));
    const auto ds = sluice::io::read_tfds_dataset(dir + "/pictures/1.0.0");
    std::map<std::string, sluice::io::TfdsFeature> features;
    for (const auto& f : ds.features) features[f.name] = f;
    QCOMPARE(features["image"].kind, sluice::io::TfdsFeature::Kind::Image);
    QCOMPARE(features["image"].encoding_format, std::string("png"));
    QCOMPARE(features["image"].shape, (sluice::Shape{24, 32, 3}));
  }

  // A resumed run finds a sample again by its first member's offset, without reading the data
  // of the members before it; an offset where no sample starts is refused.
  void webdataset_shards_seek_to_a_sample() {
    struct Count final : sluice::DamageReport {
      bool skip_damaged(const std::string&) override { return false; }
    } damage;
    for (const char* name : {"sample.tgz", "testgz.tar"}) {
      sluice::io::WebDatasetShard shard(testdata_dir() + "/webdataset/" + name);
      std::vector<sluice::io::WebDatasetSample> all;
      for (sluice::io::WebDatasetSample s; shard.next(s, damage);) all.push_back(s);
      QVERIFY(all.size() == 90 || all.size() == 1000);
      for (std::size_t at : {std::size_t(0), std::size_t(37), all.size() - 1}) {
        QVERIFY(shard.seek(all[at].index, all[at].header_offset));
        sluice::io::WebDatasetSample again;
        QVERIFY(shard.next(again, damage));
        QCOMPARE(again.key, all[at].key);
        QCOMPARE(again.index, all[at].index);
        QCOMPARE(again.members.size(), all[at].members.size());
        QCOMPARE(again.members.back().data, all[at].members.back().data);
      }
      QVERIFY(!shard.seek(5, all[5].header_offset + 1));
    }
  }

  void npy_files_round_trip_and_refusals() {
    const auto t = sluice::Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    const auto back = sluice::io::parse_npy(sluice::io::encode_npy(t));
    QCOMPARE(back.shape(), (sluice::Shape{2, 3}));
    QCOMPARE(back.data<float>()[5], 6.0f);
    QCOMPARE(sluice::io::encode_npy(t).size() % 64, std::size_t(24));  // header to 64 bytes, then 24 data bytes
    const auto scalar = sluice::io::parse_npy(sluice::io::encode_npy(sluice::Tensor::scalar<std::int64_t>(7)));
    QCOMPARE(scalar.rank(), std::size_t(0));
    QCOMPARE(scalar.data<std::int64_t>()[0], std::int64_t(7));
    auto npy = [](const std::string& header, const std::string& data) {  // format 1.0 with this header
      std::string out("\x93NUMPY\x01\x00", 8);
      out += static_cast<char>(header.size());
      out += '\0';
      return out + header + data;
    };
    for (const auto& [bytes, why] : std::vector<std::pair<std::string, std::string>>{
             {"not npy", "magic"},
             {npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", "abcd"), "little-endian"},
             {npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }\n", "abcd"), "Fortran"},
             {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", "abcd"), "needs 8"},
             {npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", "").substr(0, 30), "cut short"}}) {
      try {
        sluice::io::parse_npy(bytes);
        QFAIL(("accepted: " + why).c_str());
      } catch (const sluice::DataError& e) {
        QVERIFY2(std::string(e.what()).find(why) != std::string::npos, e.what());
      }
    }
  }

 private:
  QTemporaryDir data_;
};

QTEST_APPLESS_MAIN(TestStoredDatasets)
#include "tst_stored_datasets.moc"
