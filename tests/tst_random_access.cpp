// Random access (issue 46): TFRecord index files (written, reused, refused when stale, DALI's
// form), the computed permutation, and the random_access source's epochs, shards and order.
#include <QtTest>

#include <QJsonDocument>
#include <QJsonObject>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "crc32c.hpp"
#include "index_shuffle.hpp"
#include "pipeline_runner.hpp"
#include "tfrecord_index.hpp"
#include "webdataset_format.hpp"

using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

// A TFRecord file of `count` records "F:R" (its number and the record's), framed as TensorFlow does.
void write_records(const std::string& path, int file, int count) {
  std::string bytes;
  auto put = [&](const void* data, std::size_t size) { bytes.append(static_cast<const char*>(data), size); };
  for (int r = 0; r < count; ++r) {
    const std::string payload = std::to_string(file) + ":" + std::to_string(r) + std::string(static_cast<std::size_t>(r % 7), '.');
    const std::uint64_t length = payload.size();
    const std::uint32_t length_crc = sluice::io::mask_crc(sluice::io::crc32c(&length, 8));
    const std::uint32_t data_crc = sluice::io::mask_crc(sluice::io::crc32c(payload.data(), payload.size()));
    put(&length, 8);
    put(&length_crc, 4);
    put(payload.data(), payload.size());
    put(&data_crc, 4);
  }
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Read {
  std::string path;
  long long index;
  bool operator<(const Read& o) const { return std::tie(path, index) < std::tie(o.path, o.index); }
  bool operator==(const Read& o) const { return path == o.path && index == o.index; }
};

std::vector<Read> reads_of(const std::vector<std::string>& lines) {
  std::vector<Read> out;
  for (const auto& line : lines) {
    const QJsonObject o = QJsonDocument::fromJson(QByteArray::fromStdString(line)).object();
    out.push_back({QByteArray::fromBase64(o["path"].toString().toUtf8()).toStdString(), o["index"].toInteger()});
  }
  return out;
}

std::string source(const std::string& patterns, std::vector<std::pair<std::string, std::string>> more = {}, const std::string& extra = "") {
  more.insert(more.begin(), {"patterns", patterns});
  return stage("src", "random_access", "", more, extra);
}

}  // namespace

class TestRandomAccess : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  std::string data() const { return dir_.path().toStdString() + "/data"; }
  // FILES files of RECORDS records each, data/part-NNN.tfrecord.
  void make_dataset(int files, int records) {
    fs::remove_all(data());
    for (int f = 0; f < files; ++f) {
      char name[32];
      std::snprintf(name, sizeof name, "/part-%03d.tfrecord", f);
      write_records(data() + name, f, records);
    }
  }
  std::vector<Read> run_reads(const std::string& text) {
    auto out = run_text(text);
    if (!out.error.empty()) qWarning("%s", out.error.c_str());
    return reads_of(out.lines);
  }

  // One worker of a job over the dataset (random_access as shard `index` of `shards`, a slow map
  // and a shuffle buffer after it, so that a cut finds records held), writing OUT: stopped at a
  // checkpoint once its sink took `stop_after` elements (-1: to the end), or resuming `earlier`,
  // the checkpoint of a job of another number of workers.
  struct Worker {
    std::vector<std::string> lines;
    std::shared_ptr<const sluice::checkpoint::Checkpoint> checkpoint;
  };
  std::string job_pipeline(int shards, int index, const std::string& out, bool shuffled = true) const {
    return "options { seed: 5 }\n" +
           source(data() + "/*.tfrecord", {{"num_shards", std::to_string(shards)}, {"index", std::to_string(index)}}, "buffer_size: 2") +
           stage("pick", "select_fields", "src", {{"keep", "path,index"}}, "buffer_size: 2") +
           stage("slow", "simulate_work", "pick", {{"us", "150"}}, "buffer_size: 2") +
           (shuffled ? stage("mix", "shuffle", "slow", {{"buffer_size", "16"}}, "buffer_size: 2") : "") +
           stage("out", "jsonl_sink", shuffled ? "mix" : "slow", {{"path", out}});
  }
  // `killed`: the checkpoint is taken and the run goes on past it until it is stopped, its output
  // left partial (as a node lost after its last checkpoint leaves it).
  Worker run_worker(int shards, int index, const std::string& name, long stop_after,
                    const std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>>& earlier = {}, bool killed = false) {
    const std::string out = dir_.path().toStdString() + "/" + name;
    sluice::EngineOptions options;
    options.resume_workers = earlier;
    options.worker_count = shards;
    options.worker_index = index;
    sluice::Engine engine(graph_of(job_pipeline(shards, index, out)), options);
    engine.start();
    Worker w;
    if (stop_after >= 0) {
      auto taken = [&] {
        std::uint64_t n = 0;
        const auto snapshot = engine.snapshot();
        for (const auto& s : snapshot.stage())
          if (s.kind() == "sink") n += s.elements_in();
        return n;
      };
      while (taken() < static_cast<std::uint64_t>(stop_after) && !engine.wait_for(std::chrono::milliseconds(0)))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (auto c = engine.checkpoint(/*then_stop=*/!killed)) w.checkpoint = std::make_shared<const sluice::checkpoint::Checkpoint>(*c);
      if (killed) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        engine.stop();
      }
    }
    const auto result = engine.wait();
    if (!result.error.empty()) qWarning("%s", result.error.c_str());
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) w.lines.push_back(line);
    return w;
  }
  // A job of `shards` workers cut after each had delivered its `stops` (a different number each).
  std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>> cut_job(int shards, const std::vector<long>& stops, const std::string& name,
                                                                            std::vector<Read>& delivered,
                                                                            const std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>>& earlier = {}) {
    std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>> files;
    for (int w = 0; w < shards; ++w) {
      Worker worker = run_worker(shards, w, name + "-" + std::to_string(w) + "-of-" + std::to_string(shards) + ".jsonl", stops[w], earlier);
      if (!worker.checkpoint) return {};
      files.push_back(worker.checkpoint);
      auto reads = reads_of(worker.lines);
      delivered.insert(delivered.end(), reads.begin(), reads.end());
    }
    return files;
  }
  // A job of `workers` resuming `earlier` and running to the end, what it delivers added.
  void finish_job(int workers, const std::string& name, const std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>>& earlier,
                  std::vector<Read>& delivered) {
    for (int w = 0; w < workers; ++w) {
      auto rest = reads_of(run_worker(workers, w, name + "-" + std::to_string(w) + ".jsonl", -1, earlier).lines);
      delivered.insert(delivered.end(), rest.begin(), rest.end());
    }
  }
  static int held_records(const std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>>& job) {
    int n = 0;
    for (const auto& c : job)
      for (const auto& stage : c->stages()) n += stage.elements_size();
    return n;
  }
  // Every record delivered exactly once, and, put in the order of their places in the epoch, the
  // order one worker gives.
  static void check_one_epoch(std::vector<Read> delivered, const std::vector<Read>& one_worker, const char* what) {
    std::map<Read, std::size_t> place;
    for (std::size_t p = 0; p < one_worker.size(); ++p) place[one_worker[p]] = p;
    std::vector<std::size_t> places;
    for (const auto& r : delivered) {
      auto it = place.find(r);
      QVERIFY2(it != place.end(), what);
      places.push_back(it->second);
    }
    std::sort(places.begin(), places.end());
    QVERIFY2(std::adjacent_find(places.begin(), places.end()) == places.end(), qPrintable(QString("%1: a record delivered twice").arg(what)));
    QVERIFY2(places.size() == one_worker.size(), qPrintable(QString("%1: %2 of %3 records delivered").arg(what).arg(places.size()).arg(one_worker.size())));
  }

 private slots:
  void the_permutation_is_a_bijection_of_every_size() {
    for (std::uint64_t n : {1ull, 2ull, 3ull, 5ull, 64ull, 1000ull, 65537ull, (1ull << 20) + 3}) {
      sluice::io::IndexShuffle order(n, 42);
      std::vector<bool> seen(n);
      for (std::uint64_t p = 0; p < n; ++p) {
        const auto x = order(p);
        QVERIFY2(x < n && !seen[x], qPrintable(QString("n %1: %2 at %3").arg(n).arg(x).arg(p)));
        QCOMPARE(order.position_of(x), p);  // and its inverse
        seen[x] = true;
      }
    }
    // Another key, another order.
    sluice::io::IndexShuffle a(1000, 1), b(1000, 2);
    int same = 0;
    for (std::uint64_t p = 0; p < 1000; ++p) same += a(p) == b(p);
    QVERIFY2(same < 20, qPrintable(QString::number(same)));
  }

  void index_files_are_written_reused_and_refused_when_stale() {
    make_dataset(3, 40);
    const std::string text = source(data() + "/*.tfrecord") + sink_after("src");
    auto first = run_reads(text);
    QCOMPARE(first.size(), std::size_t(120));
    const std::string index = data() + "/part-001.tfrecord.idx";
    QVERIFY(fs::exists(index));
    const auto written = fs::last_write_time(index);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    QCOMPARE(run_reads(text), first);  // the same order from the same seed, the index read back
    QCOMPARE(fs::last_write_time(index), written);
    // The file grows by a record: its index no longer describes it, and says so by name.
    write_records(data() + "/part-001.tfrecord", 1, 41);
    auto stale = run_text(text);
    QVERIFY2(stale.error.find("index " + index + " does not describe " + data() + "/part-001.tfrecord") != std::string::npos, stale.error.c_str());
    QVERIFY(stale.error.find("sluice index --rebuild") != std::string::npos);
    // tfrecord_index writes it again; then the 121 records read.
    auto rebuilt = run_text(stage("files", "list_files", "", {{"patterns", data() + "/part-001.tfrecord"}}) +
                            stage("ix", "tfrecord_index", "files", {{"rebuild", "true"}}) + sink_after("ix"));
    QVERIFY2(rebuilt.error.empty(), rebuilt.error.c_str());
    QCOMPARE(run_reads(text).size(), std::size_t(121));
    // Without build_index, a missing index is named with the command that writes it.
    fs::remove(data() + "/part-002.tfrecord.idx");
    auto missing = run_text(source(data() + "/*.tfrecord", {{"build_index", "false"}}) + sink_after("src"));
    QVERIFY2(missing.error.find("no index for " + data() + "/part-002.tfrecord") != std::string::npos, missing.error.c_str());
  }

  void dali_indexes_are_read_and_written() {
    make_dataset(2, 25);
    const std::string idx = dir_.path().toStdString() + "/dali";
    // DALI's tfrecord2idx: "OFFSET SIZE" per record, SIZE with the framing.
    for (int f = 0; f < 2; ++f) {
      const std::string file = data() + "/part-00" + std::to_string(f) + ".tfrecord";
      const auto built = sluice::io::build_tfrecord_index(file);
      std::string text;
      for (std::size_t i = 0; i < built.offsets.size(); ++i)
        text += std::to_string(built.offsets[i]) + " " + std::to_string(built.framed_size(i)) + "\n";
      fs::create_directories(idx);
      std::ofstream(sluice::io::index_path_for(file, idx)) << text;
    }
    auto reads = run_reads(source(data() + "/*.tfrecord", {{"index_dir", idx}, {"build_index", "false"}, {"shuffle", "false"}}) + sink_after("src"));
    QCOMPARE(reads.size(), std::size_t(50));
    QCOMPARE(reads[26].index, 1LL);  // file order: the second file's second record
    // Written on request, the same text.
    const std::string file = data() + "/part-000.tfrecord";
    const std::string written = dir_.path().toStdString() + "/written.idx";
    sluice::io::write_tfrecord_index(sluice::io::build_tfrecord_index(file), written, sluice::io::IndexFormat::Dali);
    QCOMPARE(read_file(written), read_file(sluice::io::index_path_for(file, idx)));
    // A DALI index of another file is refused: its records do not end where this file does.
    std::ofstream(sluice::io::index_path_for(data() + "/part-001.tfrecord", idx)) << "0 20\n20 20\n";
    auto refused = run_text(source(data() + "/*.tfrecord", {{"index_dir", idx}, {"build_index", "false"}}) + sink_after("src"));
    QVERIFY2(refused.error.find("does not describe " + data() + "/part-001.tfrecord") != std::string::npos, refused.error.c_str());
  }

  void gzip_files_are_refused_for_random_access() {
    make_dataset(1, 5);
    const std::string gz = data() + "/zipped.tfrecord";
    std::ofstream(gz, std::ios::binary) << std::string("\x1f\x8b\x08\x00 not really", 15);
    auto out = run_text(source(gz) + sink_after("src"));
    QVERIFY2(out.error.find(gz + " is gzip-compressed") != std::string::npos, out.error.c_str());
    // On request, read through a decompressed copy in index_dir: the records of the file it holds.
    const std::string plain = data() + "/part-000.tfrecord", zipped = dir_.path().toStdString() + "/real.tfrecord.gz";
    QCOMPARE(std::system(("gzip -c " + plain + " > " + zipped).c_str()), 0);
    auto no_folder = run_text(source(zipped, {{"gzip", "decompress"}}) + sink_after("src"));
    QVERIFY2(no_folder.error.find("needs index_dir") != std::string::npos, no_folder.error.c_str());
    const std::string copies = dir_.path().toStdString() + "/copies";
    auto indexes = [](const std::vector<Read>& reads) {
      std::vector<long long> out;
      for (const auto& r : reads) out.push_back(r.index);
      return out;
    };
    auto through_copy = run_reads("options { seed: 4 }\n" + source(zipped, {{"gzip", "decompress"}, {"index_dir", copies}}) + sink_after("src"));
    auto direct = run_reads("options { seed: 4 }\n" + source(plain, {{"index_dir", copies}}) + sink_after("src"));
    QCOMPARE(through_copy.size(), std::size_t(5));
    QCOMPARE(indexes(through_copy), indexes(direct));
    QCOMPARE(through_copy.front().path, zipped);  // named as listed, read from the copy
  }

  // Each epoch is a permutation of all records, another each epoch and for each seed, the same
  // for the same seed, and the same whatever the parallelism of the stages after it.
  void every_epoch_is_a_permutation_of_all_records() {
    make_dataset(7, 30);
    const std::string pattern = data() + "/*.tfrecord";
    auto epochs = run_reads("options { seed: 3 }\n" + source(pattern) + stage("twice", "repeat", "src", {{"count", "2"}}) + sink_after("twice"));
    QCOMPARE(epochs.size(), std::size_t(420));
    std::vector<Read> first(epochs.begin(), epochs.begin() + 210), second(epochs.begin() + 210, epochs.end());
    auto sorted = [](std::vector<Read> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    QCOMPARE(sorted(first), sorted(second));
    QCOMPARE(std::set<Read>(first.begin(), first.end()).size(), std::size_t(210));
    QVERIFY(first != second);
    auto other_seed = run_reads("options { seed: 4 }\n" + source(pattern) + sink_after("src"));
    QVERIFY(other_seed != first);
    QCOMPARE(sorted(other_seed), sorted(first));
    for (int parallelism : {1, 2, 8}) {  // readers in the source, and workers after it
      const std::string n = std::to_string(parallelism);
      auto again = run_reads("options { seed: 3 }\n" + source(pattern, {{"num_parallel_reads", n}}) +
                             stage("m", "identity", "src", {}, "parallelism: " + n) + sink_after("m"));
      QCOMPARE(again, first);
    }
    auto in_order = run_reads(source(pattern, {{"shuffle", "false"}}) + sink_after("src"));
    QCOMPARE(in_order, sorted(first));
  }

  // A run cut inside its second epoch and resumed goes on with that epoch's permutation: its
  // output is the uninterrupted run's, line for line (not the first epoch's order again).
  void a_run_resumed_inside_a_later_epoch_continues_that_epochs_order() {
    make_dataset(3, 70);
    auto pipeline = [&](const std::string& out) {
      return "options { seed: 3 }\n" + source(data() + "/*.tfrecord", {}, "buffer_size: 2") +
             stage("twice", "repeat", "src", {{"count", "2"}}, "buffer_size: 2") +
             // slow enough that the poll below sees the sink between 300 and 420 (a fast machine ran past it)
             stage("slow", "simulate_work", "twice", {{"us", "300"}}, "buffer_size: 2") + stage("out", "jsonl_sink", "slow", {{"path", out}});
    };
    auto lines_of = [](const std::string& path) {
      std::vector<std::string> lines;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) lines.push_back(line);
      return lines;
    };
    const std::string whole = dir_.path().toStdString() + "/whole.jsonl", cut = dir_.path().toStdString() + "/cut.jsonl";
    {
      sluice::Engine engine(graph_of(pipeline(whole)), {});
      engine.start();
      QVERIFY(engine.wait().error.empty());
    }
    std::shared_ptr<const sluice::checkpoint::Checkpoint> checkpoint;
    {
      sluice::Engine engine(graph_of(pipeline(cut)), {});
      engine.start();
      for (;;) {
        std::uint64_t taken = 0;
        const auto snapshot = engine.snapshot();
        for (const auto& st : snapshot.stage())
          if (st.kind() == "sink") taken = st.elements_in();
        if (taken >= 300 || engine.wait_for(std::chrono::milliseconds(0))) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      auto c = engine.checkpoint(/*then_stop=*/true);
      QVERIFY(c);
      checkpoint = std::make_shared<const sluice::checkpoint::Checkpoint>(*c);
      engine.wait();
    }
    QVERIFY2(lines_of(cut).size() > 210 && lines_of(cut).size() < 420, "cut inside the second epoch");
    sluice::EngineOptions options;
    options.resume_from = checkpoint;
    sluice::Engine resumed(graph_of(pipeline(cut)), options);
    resumed.start();
    const auto result = resumed.wait();
    QVERIFY2(result.error.empty(), result.error.c_str());
    const auto expected = lines_of(whole), got = lines_of(cut);
    QCOMPARE(expected.size(), std::size_t(420));
    QCOMPARE(got.size(), expected.size());
    QVERIFY2(got == expected, "the resumed second epoch is in the uninterrupted run's order");
  }

  // Where the first 1,000 records of 100 files land in an epoch's order of 10,000: in 10 equal
  // spans of positions, 100 expected in each; chi-square with 9 degrees of freedom under 21.67
  // (the 1% point), for several seeds.
  void the_order_spreads_as_a_random_permutation() {
    make_dataset(100, 100);
    for (int seed : {1, 2, 3}) {
      auto reads = run_reads("options { seed: " + std::to_string(seed) + " }\n" + source(data() + "/*.tfrecord") + sink_after("src"));
      QCOMPARE(reads.size(), std::size_t(10000));
      std::vector<int> bins(10);
      for (std::size_t position = 0; position < reads.size(); ++position) {
        const auto& path = reads[position].path;
        const int file = std::stoi(path.substr(path.size() - 12, 3));
        if (file < 10) ++bins[position / 1000];  // files 0-9: the first 1,000 records
      }
      double chi2 = 0;
      for (int observed : bins) chi2 += (observed - 100.0) * (observed - 100.0) / 100.0;
      QVERIFY2(chi2 < 21.67, qPrintable(QString("seed %1: chi-square %2").arg(seed).arg(chi2)));
    }
  }

  void shards_split_the_positions_equally() {
    make_dataset(4, 250);  // 1,000 records for 3 shards: 334, 333, 333
    std::vector<Read> all;
    std::vector<std::size_t> counts;
    for (int shard = 0; shard < 3; ++shard) {
      auto reads = run_reads("options { seed: 9 }\n" + source(data() + "/*.tfrecord", {{"num_shards", "3"}, {"index", std::to_string(shard)}}) +
                             sink_after("src"));
      counts.push_back(reads.size());
      all.insert(all.end(), reads.begin(), reads.end());
    }
    QCOMPARE(counts, (std::vector<std::size_t>{334, 333, 333}));
    QCOMPARE(std::set<Read>(all.begin(), all.end()).size(), std::size_t(1000));
    // As the workers of a job: the source shards itself; no shard stage is added after it.
    sluice::WorkerPlan plan;
    auto worker = run_text_as_worker("options { seed: 9 }\n" + source(data() + "/*.tfrecord") + sink_after("src"), sluice::WorkerIdentity{1, 3}, &plan);
    QCOMPARE(reads_of(worker.lines).size(), std::size_t(333));
    QVERIFY(std::any_of(plan.notes.begin(), plan.notes.end(), [](const std::string& n) { return n.find("shards itself") != std::string::npos; }));
    // Equal steps: every shard 333 (the last partial round not read), or 334 (a shard short of
    // one reads its first record again); the job's option sets them.
    for (const char* equal : {"drop", "pad"}) {
      std::vector<std::size_t> equal_counts;
      for (int shard = 0; shard < 3; ++shard) {
        auto reads = run_reads("options { seed: 9 }\n" +
                               source(data() + "/*.tfrecord", {{"num_shards", "3"}, {"index", std::to_string(shard)}, {"equal_steps", equal}}) +
                               sink_after("src"));
        equal_counts.push_back(reads.size());
        const std::vector<Read> own(all.begin() + (shard == 0 ? 0 : shard == 1 ? 334 : 667), all.begin() + (shard == 0 ? 334 : shard == 1 ? 667 : 1000));
        if (std::string(equal) == "drop") {
          QCOMPARE(reads, std::vector<Read>(own.begin(), own.begin() + 333));
        } else {
          auto expected = own;
          if (expected.size() < 334) expected.push_back(own.front());
          QCOMPARE(reads, expected);
        }
      }
      QCOMPARE(equal_counts, (std::vector<std::size_t>(3, std::string(equal) == "drop" ? 333 : 334)));
    }
    sluice::WorkerPlan equal_plan;
    auto equal_worker = run_text_as_worker("options { seed: 9 equal_steps: drop }\n" + source(data() + "/*.tfrecord") + sink_after("src"),
                                           sluice::WorkerIdentity{0, 3}, &equal_plan);
    QCOMPARE(reads_of(equal_worker.lines).size(), std::size_t(333));
    QVERIFY(std::any_of(equal_plan.notes.begin(), equal_plan.notes.end(),
                        [](const std::string& n) { return n.find("same number of records (equal_steps: drop)") != std::string::npos; }));
  }
  // Elastic resume onto fewer workers after the earlier ones were lost past their checkpoint (their
  // outputs left partial): the resumed job publishes every earlier worker's output as it stood at
  // the cut (worker w's by worker w mod 2), and with what the new job delivers they are one epoch.
  void fewer_workers_publish_every_lost_workers_output() {
    make_dataset(10, 300);
    const std::vector<Read> one_worker = run_reads("options { seed: 5 }\n" + source(data() + "/*.tfrecord", {}, "") + sink_after("src"));
    for (int attempt = 1;; ++attempt) {
      std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>> three;
      const std::vector<long> stops{40, 10, 70};
      std::vector<std::string> earlier_outputs;
      for (int w = 0; w < 3; ++w) {
        const std::string name = "lost-" + std::to_string(attempt) + "-" + std::to_string(w) + ".jsonl";
        Worker worker = run_worker(3, w, name, stops[static_cast<std::size_t>(w)], {}, /*killed=*/true);
        if (!worker.checkpoint) break;
        QVERIFY2(worker.lines.empty(), "a run stopped past its checkpoint leaves its output partial");
        three.push_back(worker.checkpoint);
        earlier_outputs.push_back(dir_.path().toStdString() + "/" + name);
      }
      if (three.size() < 3) {
        QVERIFY2(attempt < 5, "the runs ended before their checkpoints");
        continue;
      }
      std::vector<Read> delivered;
      finish_job(2, "after-lost-" + std::to_string(attempt), three, delivered);
      for (const auto& path : earlier_outputs) {
        QVERIFY2(fs::exists(path), qPrintable(QString::fromStdString(path + " was not published by the resumed job")));
        std::ifstream in(path);
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        auto reads = reads_of(lines);
        delivered.insert(delivered.end(), reads.begin(), reads.end());
      }
      check_one_epoch(delivered, one_worker, "3 lost workers -> 2");
      break;
    }
  }

  // Elastic resume: a job of 2 workers cut mid-epoch and resumed by 3, and that job cut again and
  // resumed by 2; a job of 3 resumed by 2. Whatever the workers held at the cut is given back: the
  // union of everything delivered is one epoch, each record once.
  void a_job_resumes_on_another_number_of_workers() {
    make_dataset(10, 300);  // (every share far longer than what a worker's buffers hold ahead of its sink)
    const std::vector<Read> one_worker = run_reads("options { seed: 5 }\n" + source(data() + "/*.tfrecord", {}, "") + sink_after("src"));
    QCOMPARE(one_worker.size(), std::size_t(3000));
    // (the job's pipeline without its shuffle gives one worker's order too)
    QCOMPARE(reads_of(run_text(job_pipeline(1, 0, "$OUT", false)).lines), one_worker);
    for (int attempt = 1;; ++attempt) {
      std::vector<Read> delivered;
      auto two = cut_job(2, {60, 100}, "a", delivered);
      auto three = two.empty() ? two : cut_job(3, {30, 50, 20}, "b", delivered, two);
      if (three.empty()) {
        QVERIFY2(attempt < 5, "the runs ended before their checkpoints");
        continue;
      }
      finish_job(2, "c", three, delivered);
      QVERIFY(held_records(two) > 0 && held_records(three) > 0);  // given back, or the check below fails
      check_one_epoch(delivered, one_worker, "2 -> 3 -> 2 workers");
      break;
    }
    for (int attempt = 1;; ++attempt) {
      std::vector<Read> delivered;
      auto three = cut_job(3, {40, 10, 70}, "d", delivered);
      if (three.empty()) {
        QVERIFY2(attempt < 5, "the runs ended before their checkpoints");
        continue;
      }
      finish_job(2, "e", three, delivered);
      check_one_epoch(delivered, one_worker, "3 -> 2 workers");
      break;
    }
  }
  // What cannot be split among other workers is refused, naming the stage; so is an output of
  // the resumed job that is one of the earlier job's (it would replace what they wrote).
  void what_cannot_resume_on_other_workers_is_refused() {
    make_dataset(4, 500);
    std::vector<std::shared_ptr<const sluice::checkpoint::Checkpoint>> two;
    for (int attempt = 1; two.empty() && attempt <= 5; ++attempt) {
      std::vector<Read> delivered;
      two = cut_job(2, {20, 30}, "r", delivered);
    }
    QCOMPARE(two.size(), std::size_t(2));
    auto refusal = [&](const std::string& text) -> std::string {
      sluice::EngineOptions options;
      options.resume_workers = two;
      options.worker_count = 3;
      try {
        sluice::Engine engine(graph_of(text), options);
        engine.start();
        engine.wait();
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    };
    const std::string out = dir_.path().toStdString() + "/refused.jsonl";
    std::string with_take = job_pipeline(3, 0, out);
    with_take.replace(with_take.find("\"mix\""), 5, "\"first\"");
    with_take = with_take.substr(0, with_take.find("stage { id: \"first\"")) + stage("first", "take", "slow", {{"count", "100"}}) +
                stage("out", "jsonl_sink", "first", {{"path", out}});
    const std::string take = refusal(with_take);
    QVERIFY2(take.find("stage 'first' (take) keeps state of its own") != std::string::npos && take.find("resume it on 2 workers") != std::string::npos,
             take.c_str());
    const std::string same_output = refusal(job_pipeline(3, 0, dir_.path().toStdString() + "/r-1-of-2.jsonl"));
    QVERIFY2(same_output.find("would write the output worker 1 of 2 wrote before the cut (path=" + dir_.path().toStdString() + "/r-1-of-2.jsonl)") != std::string::npos, same_output.c_str());
    QVERIFY(!fs::exists(out));
  }
  // A damaged record (a byte changed after indexing) fails the run naming the file and record, or
  // is skipped at its turn with error_policy: skip, whichever reader of a group read it; the
  // others come in the same order as without it.
  void a_damaged_record_is_named_or_skipped_at_its_turn() {
    make_dataset(3, 40);
    const std::string file = data() + "/part-001.tfrecord";
    const std::string pattern = data() + "/*.tfrecord";
    auto whole = run_reads("options { seed: 6 }\n" + source(pattern) + sink_after("src"));
    const auto indexed_at = fs::last_write_time(file);  // (the same time: the index still looks fresh)
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(12);  // the first byte of record 0's data
      f.put('#');
    }
    fs::last_write_time(file, indexed_at);
    auto failed = run_text("options { seed: 6 }\n" + source(pattern) + sink_after("src"));
    QCOMPARE(failed.result.state, sluice::RunState::Failed);
    QVERIFY2(failed.result.error.find(file + ", record 0 (byte 0): its CRC does not match") != std::string::npos, failed.result.error.c_str());
    for (const char* readers : {"1", "4"}) {
      auto skipped = run_text("options { seed: 6 }\n" + source(pattern, {{"num_parallel_reads", readers}}, "error_policy: skip") + sink_after("src"));
      QCOMPARE(skipped.result.state, sluice::RunState::Finished);
      auto expected = whole;
      expected.erase(std::find(expected.begin(), expected.end(), Read{file, 0}));
      QCOMPARE(reads_of(skipped.lines), expected);
      QCOMPARE(skipped.snapshot.stage(0).errors_skipped(), std::uint64_t(1));
    }
  }
  // WebDataset shards: plain tars read at random, a sample per key (several members each), the
  // fields webdataset_reader gives, in its order when not shuffled; a compressed shard refused.
  void webdataset_samples_are_read_at_random() {
    const std::string dir = dir_.path().toStdString() + "/wds";
    fs::create_directories(dir);
    const std::string real = sluice::test::testdata_dir() + "/webdataset";
    fs::copy_file(real + "/testgz.tar", dir + "/a-testgz.tar");
    fs::copy_file(real + "/compressed.tar", dir + "/b-compressed.tar");
    std::ifstream tgz(real + "/sample.tgz", std::ios::binary);
    const std::string packed((std::istreambuf_iterator<char>(tgz)), std::istreambuf_iterator<char>());
    std::ofstream(dir + "/c-sample.tar", std::ios::binary) << sluice::io::gunzip(packed);
    const std::string pattern = dir + "/*.tar";
    auto sequential = run_text(stage("files", "list_files", "", {{"patterns", pattern}, {"shuffle", "false"}}) +
                               stage("read", "webdataset_reader", "files") + sink_after("read"));
    QCOMPARE(sequential.lines.size(), std::size_t(1000 + 3 + 90));
    auto at_random = [&](const char* shuffle) {
      auto out = run_text("options { seed: 2 }\n" + source(pattern, {{"shuffle", shuffle}, {"index_dir", dir + "/index"}}) + sink_after("src"));
      if (!out.error.empty() || !out.result.error.empty()) qWarning("%s %s", out.error.c_str(), out.result.error.c_str());
      return out.lines;
    };
    QCOMPARE(at_random("false"), sequential.lines);
    auto shuffled = at_random("true"), expected = sequential.lines;
    QVERIFY(shuffled != expected);
    std::sort(shuffled.begin(), shuffled.end());
    std::sort(expected.begin(), expected.end());
    QCOMPARE(shuffled, expected);
    fs::copy_file(real + "/sample.tgz", dir + "/d-sample.tar");  // gzip under a .tar name
    auto refused = run_text(source(pattern, {{"index_dir", dir + "/index"}}) + sink_after("src"));
    const std::string error = refused.error + refused.result.error;
    QVERIFY2(error.find(dir + "/d-sample.tar is a compressed tar: its samples cannot be read at random") != std::string::npos, error.c_str());
  }
};

QTEST_GUILESS_MAIN(TestRandomAccess)
#include "tst_random_access.moc"
