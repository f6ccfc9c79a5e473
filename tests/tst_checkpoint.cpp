// Checkpoints and exact resume: a run stopped at a checkpoint and resumed makes, together, exactly
// what one uninterrupted run makes, at any parallelism and wherever the cut falls; the checkpoint
// names buffered elements instead of holding them and a resumed run reads only those again;
// checkpoints of another pipeline, seed or file list, and damaged files, are refused.
#include <QtTest>

#include <numeric>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>

#include "pipeline_runner.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/engine.hpp"

using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

struct Run {
  std::vector<std::string> lines;
  std::optional<sluice::checkpoint::Checkpoint> checkpoint;
  sluice::RunResult result;
  sluice::metrics::MetricsSnapshot snapshot;
};

std::uint64_t sink_elements(const sluice::metrics::MetricsSnapshot& snap) {
  std::uint64_t n = 0;
  for (const auto& s : snap.stage())
    if (s.kind() == "sink") n += s.elements_in();
  return n;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// One run of `text` (see run()).
Run run_once(const std::string& text, const std::string& out, long stop_after, std::shared_ptr<const sluice::checkpoint::Checkpoint> resume) {
  std::string resolved = text;
  for (std::size_t at; (at = resolved.find("$OUT")) != std::string::npos;) resolved.replace(at, 4, out);
  sluice::EngineOptions options;
  options.resume_from = std::move(resume);
  sluice::Engine engine(graph_of(resolved), options);
  engine.start();
  Run r;
  if (stop_after >= 0) {
    while (sink_elements(engine.snapshot()) < static_cast<std::uint64_t>(stop_after) && !engine.wait_for(std::chrono::milliseconds(0)))
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    r.checkpoint = engine.checkpoint(/*then_stop=*/true);
  }
  r.result = engine.wait();
  r.snapshot = engine.snapshot();
  r.lines = lines_of(out);
  return r;
}

// Runs `text` (its jsonl_sink writes $OUT) to the end, or, with stop_after >= 0, until the sinks
// took that many elements, then checkpoints and stops there. `resume`: continue that checkpoint.
// A short pipeline on a loaded machine (sanitizers, suites in parallel) can finish before this
// thread next looks at the sink; that says nothing about the engine, so such a run is tried again,
// up to five times in all (the callers check that a checkpoint came).
Run run(const std::string& text, const QTemporaryDir& dir, const std::string& name, long stop_after,
        std::shared_ptr<const sluice::checkpoint::Checkpoint> resume = {}) {
  const std::string out = dir.filePath(QString::fromStdString(name)).toStdString();
  Run r = run_once(text, out, stop_after, resume);
  for (int attempt = 2; stop_after >= 0 && !r.checkpoint && attempt <= 5; ++attempt) {
    qInfo("the run ended before the checkpoint after %ld elements was asked for; attempt %d", stop_after, attempt);
    r = run_once(text, out, stop_after, resume);
  }
  return r;
}

std::uint64_t reread(const sluice::metrics::MetricsSnapshot& snap) {
  std::uint64_t n = 0;
  for (const auto& s : snap.stage()) n += s.elements_reread();
  return n;
}

std::uint64_t referenced(const sluice::checkpoint::Checkpoint& c) {
  std::uint64_t n = 0;
  for (const auto& s : c.stages())
    for (const auto& e : s.elements()) n += e.has_ref();
  return n;
}

std::uint64_t open_inputs(const sluice::checkpoint::Checkpoint& c) {
  std::uint64_t n = 0;
  for (const auto& s : c.stages()) n += s.open_inputs_to_seek();
  return n;
}

const sluice::checkpoint::StageState& state_of(const sluice::checkpoint::Checkpoint& c, const std::string& id) {
  for (const auto& s : c.stages())
    if (s.id() == id) return s;
  throw std::runtime_error("no stage " + id);
}

// 8 TFRecord shards of 300 small JPEG images with labels, written by the pipeline itself.
std::string make_shards(const QTemporaryDir& dir) {
  const std::string prefix = dir.filePath("shards/train").toStdString();
  fs::create_directories(dir.filePath("shards").toStdString());
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "2400"}, {"height", "8"}, {"width", "8"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {{"quality", "95"}}) +
                       stage("w", "tfrecord_writer", "enc", {{"prefix", prefix}, {"max_records", "300"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing shards failed: " + made.result.error);
  return dir.filePath("shards").toStdString();
}

// The same 2400 images as 8 ArrayRecord shards of 300 (tf.Examples in chunks of 7, zstd).
std::string make_array_record_shards(const QTemporaryDir& dir) {
  const std::string prefix = dir.filePath("array_records/train").toStdString();
  fs::create_directories(dir.filePath("array_records").toStdString());
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "2400"}, {"height", "8"}, {"width", "8"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {{"quality", "95"}}) +
                       stage("w", "array_record_writer", "enc", {{"prefix", prefix}, {"max_records", "300"}, {"field", ""}, {"options", "group_size:7"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing ArrayRecord shards failed: " + made.result.error);
  return dir.filePath("array_records").toStdString();
}

#ifdef SLUICE_HAVE_PARQUET
// The same 2400 images as 8 Parquet shards of 300 rows (image bytes and label columns), in row
// groups of 64 rows.
std::string make_parquet_shards(const QTemporaryDir& dir) {
  const std::string prefix = dir.filePath("parquet/train").toStdString();
  fs::create_directories(dir.filePath("parquet").toStdString());
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "2400"}, {"height", "8"}, {"width", "8"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {{"quality", "95"}}) +
                       stage("w", "parquet_writer", "enc", {{"prefix", prefix}, {"max_records", "300"}, {"row_group_rows", "64"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing Parquet shards failed: " + made.result.error);
  return dir.filePath("parquet").toStdString();
}
#endif

#ifdef SLUICE_HAVE_PARQUET
// The rows of the Parquet shards under OUT/parquet, in shard order, as lines of JSON; and no
// .partial file left there.
std::vector<std::string> parquet_rows(const std::string& out) {
  for (const auto& entry : fs::directory_iterator(out + "/parquet"))
    if (entry.path().filename().string().find(".partial") != std::string::npos) throw std::runtime_error("left behind: " + entry.path().string());
  QTemporaryDir dir;
  const Run read = run("options { seed: 1 }\n" + stage("files", "list_files", "", {{"patterns", out + "/parquet/train-*.parquet"}, {"shuffle", "false"}}) +
                           stage("read", "parquet_reader", "files") + sink_after("read"),
                       dir, "rows.jsonl", -1);
  if (read.result.state != sluice::RunState::Finished) throw std::runtime_error("reading " + out + "/parquet: " + read.result.error);
  return read.lines;
}
#endif

// 600 images of 8x8 and 60 of 16x16 (the z-big shard, which decode_image's max_pixels of 100
// refuses) as TFRecord shards in DIR/mixed.
std::string make_mixed_shards(const QTemporaryDir& dir) {
  const std::string mixed = dir.filePath("mixed").toStdString();
  fs::create_directories(mixed);
  for (const auto& [name, count, side] : {std::tuple{"small", "600", "8"}, std::tuple{"z-big", "60", "16"}}) {
    const auto made = run_text("options { seed: 3 }\n" +
                               stage("img", "synthetic_images", "", {{"count", count}, {"height", side}, {"width", side}, {"classes", "10"}}) +
                               stage("enc", "encode_image", "img", {{"quality", "95"}}) +
                               stage("w", "tfrecord_writer", "enc", {{"prefix", mixed + "/" + name}, {"max_records", "200"}}));
    if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing the mixed shards failed: " + made.result.error);
  }
  return mixed;
}

// 480 of the images as a tensorflow_datasets directory (DIR/tfds/pics/1.0.0), 8 shards of 60.
std::string make_tfds(const QTemporaryDir& dir) {
  const std::string data_dir = dir.filePath("tfds").toStdString();
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "480"}, {"height", "8"}, {"width", "8"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {{"quality", "95"}}) +
                       stage("w", "tfds_writer", "enc", {{"data_dir", data_dir}, {"name", "pics"}, {"max_records", "60"}, {"class_labels", "label"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing the tfds directory failed: " + made.result.error);
  return data_dir;
}

// 480 of the images as WebDataset tar shards (DIR/wds/train-00000N.tar, 8 of 60 samples).
std::string make_webdataset(const QTemporaryDir& dir) {
  const std::string prefix = dir.filePath("wds/train").toStdString();
  auto made = run_text("options { seed: 3 }\n" +
                       stage("img", "synthetic_images", "", {{"count", "480"}, {"height", "8"}, {"width", "8"}, {"classes", "10"}}) +
                       stage("enc", "encode_image", "img", {{"quality", "95"}, {"output", "jpg"}}) +
                       stage("pick", "select_fields", "enc", {{"keep", "jpg,label"}}) +
                       stage("w", "webdataset_writer", "pick", {{"prefix", prefix}, {"max_records", "60"}}));
  if (made.result.state != sluice::RunState::Finished) throw std::runtime_error("writing the tar shards failed: " + made.result.error);
  return dir.filePath("wds").toStdString();
}

// Tar shards read interleaved, decoded, shuffled, batched, three epochs: a cut between two samples
// of a shard, found again by its first member's offset.
std::string webdataset_pipeline(const std::string& shards, int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 11 deterministic: true }\n" +
         stage("files", "list_files", "", {{"patterns", shards + "/train-{000000..000007}.tar"}}) +
         stage("read", "webdataset_reader", "files", {{"integers", "label"}}, p + " buffer_size: 32 interleave { cycle_length: 4 block_length: 2 }") +
         stage("decode", "decode_image", "read", {{"field", "jpg"}}, p) + stage("flip", "random_flip", "decode", {}, p + " buffer_size: 32") +
         stage("shuffle", "shuffle", "flip", {{"buffer_size", "200"}}) + stage("batch", "batch", "shuffle", {{"batch_size", "16"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "batch", {{"count", "3"}}, "buffer_size: 2") + sink_after("epochs");
}

// The shards' records in a permutation of all of them each epoch (random_access), repeated, parsed,
// decoded, randomly flipped, batched: the rows a cut finds in the batch are named by their records
// (the source reads them again), and the flips drawn for their places again. (Its index files
// apart: the other pipelines read every file of the folder.) `shuffled`: a shuffle of 200 parsed
// records before the decode and the flips.
std::string random_access_pipeline(const std::string& shards, int parallelism, bool shuffled = false) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  const std::string decoded = shuffled ? "shuffle" : "parse";
  return "options { seed: 11 deterministic: true }\n" + stage("src", "random_access", "", {{"patterns", shards + "/*"}, {"index_dir", shards + "/../random-access-indexes"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "src", {{"count", "2"}}, "buffer_size: 2") +
         stage("parse", "parse_example", "epochs", {{"features", "image:bytes, label:int64"}}, p + " buffer_size: 2") +
         (shuffled ? stage("shuffle", "shuffle", "parse", {{"buffer_size", "200"}}, "buffer_size: 2") : std::string()) +
         stage("decode", "decode_image", decoded, {}, p + " buffer_size: 2") + stage("flip", "random_flip", "decode", {}, p + " buffer_size: 2") +
         stage("batch", "batch", "flip", {{"batch_size", "50"}}, "buffer_size: 2") + sink_after("batch");
}

// A slice of a tfds split across shards, shuffled shards read as TFDS reads them (interleaved),
// decoded, shuffled, batched, three epochs: a cut inside a shard read that skips and takes.
std::string tfds_pipeline(const std::string& data_dir, int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 11 deterministic: true }\n" +
         stage("split", "tfds", "", {{"name", "pics"}, {"split", "train[10%:-6%]"}, {"data_dir", data_dir}, {"shuffle_files", "true"}}) +
         stage("read", "tfds_reader", "split", {}, p + " buffer_size: 32 interleave { cycle_length: 4 block_length: 2 }") +
         stage("decode", "decode_image", "read", {}, p) + stage("flip", "random_flip", "decode", {}, p + " buffer_size: 32") +
         stage("shuffle", "shuffle", "flip", {{"buffer_size", "200"}}) + stage("batch", "batch", "shuffle", {{"batch_size", "16"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "batch", {{"count", "3"}}, "buffer_size: 2") + sink_after("epochs");
}

// The pipeline: shards read interleaved by parallel readers, parsed, decoded, randomly
// flipped, shuffled through 1000, batched, three epochs. Small buffers keep the cut close to where
// the test asks for it (the barrier follows every batch already made) and the reader close behind
// the sink: a cut needs a reader still reading (in a run's tail, once every reader has ended,
// nothing is left to cut and the run finishes instead).
std::string tfrecord_pipeline(const std::string& shards, int parallelism, const std::string& reader = "tfrecord_reader") {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  // Parquet's rows are the image and label fields already.
  const std::string parse = reader == "parquet_reader" ? stage("parse", "select_fields", "read", {{"keep", "image, label"}}, p)
                                                       : stage("parse", "parse_example", "read", {{"features", "image:bytes, label:int64"}}, p);
  return "options { seed: 11 deterministic: true }\n" +
         stage("files", "list_files", "", {{"patterns", shards + "/*"}, {"shuffle", "true"}}) +
         stage("read", reader, "files", {}, p + " buffer_size: 32 interleave { cycle_length: 4 block_length: 2 }") + parse +
         stage("decode", "decode_image", "parse", {}, p) + stage("flip", "random_flip", "decode", {}, p + " buffer_size: 32") +
         stage("shuffle", "shuffle", "flip", {{"buffer_size", "1000"}}) + stage("batch", "batch", "shuffle", {{"batch_size", "16"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "batch", {{"count", "3"}}, "buffer_size: 2") + sink_after("epochs");
}

// tf.data's guide's order: the records shuffled, then parsed, decoded and randomly flipped, batched,
// three epochs. The buffer holds records, and the rows of the batch being gathered, past maps
// after the shuffle, are named by their records too, with the places the maps saw.
std::string map_after_shuffle_pipeline(const std::string& shards, int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 11 deterministic: true }\n" +
         stage("files", "list_files", "", {{"patterns", shards + "/*"}, {"shuffle", "true"}}) +
         stage("read", "tfrecord_reader", "files", {}, p + " buffer_size: 32 interleave { cycle_length: 4 block_length: 2 }") +
         stage("shuffle", "shuffle", "read", {{"buffer_size", "500"}}, "buffer_size: 8") +
         stage("parse", "parse_example", "shuffle", {{"features", "image:bytes, label:int64"}}, p + " buffer_size: 8") +
         stage("decode", "decode_image", "parse", {}, p + " buffer_size: 8") + stage("flip", "random_flip", "decode", {}, p + " buffer_size: 8") +
         stage("batch", "batch", "flip", {{"batch_size", "16"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "batch", {{"count", "3"}}, "buffer_size: 2") + sink_after("epochs");
}

// Records read one file after another in chunks, parsed in chunks, batched from chunks (the
// small-record path): a cut falls between two chunks, with a batch partly gathered.
std::string chunked_pipeline(const std::string& shards, int parallelism) {
  return "options { seed: 3 deterministic: true }\n" + stage("files", "list_files", "", {{"patterns", shards + "/*"}}) +
         stage("read", "tfrecord_reader", "files", {}, "buffer_size: 2") +
         stage("parse", "parse_example", "read", {{"features", "label:int64"}, {"keep", "index"}},
               "parallelism: " + std::to_string(parallelism) + " buffer_size: 2") +
         stage("batch", "batch", "parse", {{"batch_size", "13"}}, "buffer_size: 2") +
         stage("epochs", "repeat", "batch", {{"count", "2"}}, "buffer_size: 2") + sink_after("epochs");
}

// A cache of a randomly augmented first pass, replayed for the next two, shuffled each epoch.
// Small buffers keep the cache close behind the sink: a cut soon after the start is in its first pass.
std::string cached_pipeline(int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 5 deterministic: true }\n" +
         stage("img", "synthetic_images", "", {{"count", "3000"}, {"height", "4"}, {"width", "4"}}) +
         stage("flip", "random_flip", "img", {}, p) + stage("cache", "cache", "flip", {}, "buffer_size: 8") +
         stage("epochs", "repeat", "cache", {{"count", "3"}}, "buffer_size: 8") +
         stage("shuffle", "shuffle", "epochs", {{"buffer_size", "200"}}, "buffer_size: 8") + stage("batch", "batch", "shuffle", {{"batch_size", "10"}}, "buffer_size: 2") +
         sink_after("batch");
}

// sample_from_datasets of a source and a filtered, augmented branch of another, with the mixture
// shuffled, then two epochs: the combine is cut between two outputs, or in the middle of one
// while it waits for the input it drew.
std::string mixture_pipeline(int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 8 deterministic: true }\n" + stage("a", "range", "", {{"count", "700"}}) +
         stage("b0", "range", "", {{"start", "100000"}, {"count", "800"}}) + stage("b", "filter_random", "b0", {{"p", "0.6"}}, p) +
         stage("bw", "simulate_work", "b", {{"us", "0"}, {"jitter_us", "30"}}, p) +
         stage("mix", "sample_from_datasets", "", {{"weights", "0.6,0.4"}}, "input: \"a\" input: \"bw\" buffer_size: 8") +
         stage("shuffle", "shuffle", "mix", {{"buffer_size", "50"}}, "buffer_size: 8") + stage("epochs", "repeat", "shuffle", {{"count", "2"}}, "buffer_size: 2") +
         sink_after("epochs");
}

std::string zip_pipeline(int parallelism) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  return "options { seed: 4 deterministic: true }\n" + stage("a", "range", "", {{"count", "600"}}) +
         stage("b0", "range", "", {{"start", "5000"}, {"count", "900"}}) + stage("b", "simulate_work", "b0", {{"us", "300"}}, p + " buffer_size: 2") +
         stage("z", "zip", "", {{"prefixes", "a,b"}}, "input: \"a\" input: \"b\" buffer_size: 2") + sink_after("z");
}

// 6 text files of 400 lines of 0 to 30 token ids each, the lines' lengths varying.
std::string make_token_files(const QTemporaryDir& dir) {
  const std::string folder = dir.filePath("text").toStdString();
  fs::create_directories(folder);
  std::uint64_t state = 12345;
  for (int f = 0; f < 6; ++f) {
    std::ofstream out(folder + "/tokens" + std::to_string(f) + ".txt");
    for (int line = 0; line < 400; ++line) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const int n = static_cast<int>((state >> 33) % 31);
      for (int k = 0; k < n; ++k) out << (k ? " " : "") << (f * 100000 + line * 100 + k);
      out << "\n";
    }
  }
  return folder;
}

// Token lines read interleaved by parallel readers, split in parallel and shuffled (the held
// elements are named by file, line and byte offset), then one of the sequence aggregates.
std::string token_pipeline(const std::string& folder, int parallelism, const std::string& tail, bool shuffled = true) {
  const std::string p = "parallelism: " + std::to_string(parallelism);
  if (!shuffled)
    return "options { seed: 21 deterministic: true }\n" + stage("files", "list_files", "", {{"patterns", folder + "/*.txt"}}) +
           stage("lines", "text_lines", "files", {}, p + " buffer_size: 2 interleave { cycle_length: 3 block_length: 2 }") +
           stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "tokens"}}, p + " buffer_size: 2") +
           stage("only", "select_fields", "split", {{"keep", "tokens"}}, p + " buffer_size: 2") + tail;
  return "options { seed: 21 deterministic: true }\n" +
         stage("files", "list_files", "", {{"patterns", folder + "/*.txt"}, {"shuffle", "true"}}) +
         stage("lines", "text_lines", "files", {}, p + " buffer_size: 16 interleave { cycle_length: 3 block_length: 2 }") +
         stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "tokens"}}, p + " buffer_size: 16") +
         stage("only", "select_fields", "split", {{"keep", "tokens"}}, p + " buffer_size: 16") +
         stage("shuffle", "shuffle", "only", {{"buffer_size", "100"}}, "buffer_size: 4") + tail;
}
std::string sequences_pipeline(const std::string& folder, const std::string& which, int parallelism) {
  // The batching stages assemble their batches on `parallelism` threads: batches in flight when
  // the checkpoint is cut must be in it, or in what the resumed run gives, exactly once.
  const std::string assembly = "buffer_size: 2 parallelism: " + std::to_string(parallelism);
  if (which == "buckets")
    return token_pipeline(folder, parallelism,
                          stage("bucket", "bucket_by_sequence_length", "shuffle",
                                {{"length_field", "tokens"}, {"boundaries", "8,16"}, {"batch_sizes", "6,4,3"}, {"lengths", "tokens"}}, assembly) +
                              stage("epochs", "repeat", "bucket", {{"count", "2"}}, "buffer_size: 2") + sink_after("epochs"));
  if (which == "packed")
    return token_pipeline(folder, parallelism,
                          stage("pack", "pack_sequences", "shuffle", {{"fields", "tokens"}, {"length", "40"}, {"open_rows", "4"}}, "buffer_size: 2") +
                              stage("win", "window", "pack", {{"size", "3"}, {"shift", "2"}}, "buffer_size: 2") + sink_after("win"));
  if (which == "per input")  // each file split and batched on the reader that reads it; the batches shuffled
    return "options { seed: 21 deterministic: true }\n" +
           stage("files", "list_files", "", {{"patterns", folder + "/*.txt"}, {"shuffle", "true"}}) +
           stage("lines", "text_lines", "files", {}, "parallelism: " + std::to_string(parallelism) + " interleave { cycle_length: 3 block_length: 2 }") +
           stage("split", "split_text", "lines", {{"to", "int64"}, {"output", "tokens"}}, "per_input: true") +
           stage("pb", "padded_batch", "split", {{"batch_size", "7"}, {"masks", "tokens"}}, "per_input: true buffer_size: 2") +
           stage("shuffle", "shuffle", "pb", {{"buffer_size", "20"}}, "buffer_size: 2") +
           stage("epochs", "repeat", "shuffle", {{"count", "2"}}, "buffer_size: 2") + sink_after("epochs");
  if (which == "padded chunks")  // no shuffle: lines, tokens and the held rows go in chunks, through the repeat
    return token_pipeline(folder, parallelism, "", false) + stage("epochs", "repeat", "only", {{"count", "2"}}, "buffer_size: 2") +
           stage("pb", "padded_batch", "epochs", {{"batch_size", "5"}, {"masks", "tokens"}}, assembly) + sink_after("pb");
  return token_pipeline(folder, parallelism,
                        stage("pb", "padded_batch", "shuffle", {{"batch_size", "5"}, {"masks", "tokens"}}, assembly) +
                            stage("epochs", "repeat", "pb", {{"count", "2"}}, "buffer_size: 2") + sink_after("epochs"));
}

// Every file under `root`, by its path relative to it, with its bytes.
std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

class TestCheckpoint : public QObject {
  Q_OBJECT
  QTemporaryDir data_;
  std::string shards_;
  std::string array_record_shards_;
  std::string parquet_shards_;
  std::string tfds_;
  std::string webdataset_;
  std::string token_files_;
  int cuts_inside_a_shard_ = 0;

 private slots:
  void initTestCase() {
    shards_ = make_shards(data_);
    array_record_shards_ = make_array_record_shards(data_);
#ifdef SLUICE_HAVE_PARQUET
    parquet_shards_ = make_parquet_shards(data_);
#endif
    tfds_ = make_tfds(data_);
    webdataset_ = make_webdataset(data_);
    token_files_ = make_token_files(data_);
  }

  void resume_is_exact_data() {
    QTest::addColumn<QString>("pipeline");
    QTest::addColumn<int>("parallelism");
    QTest::addColumn<int>("stop_after");
#ifdef SLUICE_SANITIZED
    // Under the sanitizers, the cuts with 4 workers only: the races and memory they look for are in
    // the code that runs with several, and every row one worker takes runs in the plain build.
    // With both, this test alone took 202 s of the ThreadSanitizer stage's 260 s in CI.
    const std::vector<int> worker_counts{4};
#else
    const std::vector<int> worker_counts{1, 4};
#endif
    for (int p : worker_counts) {
      // 450 batches in all, 150 per epoch: the first, mid-epoch, the end of the first epoch, the third.
      for (int k : {1, 60, 150, 310}) QTest::addRow("tfrecord p%d k%d", p, k) << "tfrecord" << p << k;
      // The same pipeline over ArrayRecord shards: cuts inside a chunk of 7 records.
      for (int k : {60, 310}) QTest::addRow("array record p%d k%d", p, k) << "array record" << p << k;
#ifdef SLUICE_HAVE_PARQUET
      // And over Parquet shards: cuts inside a row group of 64 rows.
      for (int k : {60, 310}) QTest::addRow("parquet p%d k%d", p, k) << "parquet" << p << k;
#endif
      // 900 batches, 300 per epoch; the cache's first pass is the first epoch.
      for (int k : {1, 100, 400}) QTest::addRow("cached p%d k%d", p, k) << "cached" << p << k;
      for (int k : {1, 40, 120}) QTest::addRow("chunked p%d k%d", p, k) << "chunked" << p << k;
      // A weighted mixture of two branches, one after a filter, 1150 elements in two epochs.
      for (int k : {1, 300, 700}) QTest::addRow("mixture p%d k%d", p, k) << "mixture" << p << k;
      // zip of a fast input and a slow one: the stage waits for the slow one in the middle of
      // nearly every output, so the cut reaches it there.
      for (int k : {1, 150, 400}) QTest::addRow("zip p%d k%d", p, k) << "zip" << p << k;
      // The sequence aggregates, holding rows between outputs: buckets (about 600 batches in two
      // epochs), packed rows windowed (about 170 windows), padded batches (960 in two epochs).
      for (int k : {1, 200, 450}) QTest::addRow("buckets p%d k%d", p, k) << "buckets" << p << k;
      for (int k : {1, 60}) QTest::addRow("packed p%d k%d", p, k) << "packed" << p << k;
      for (int k : {1, 300, 700}) QTest::addRow("padded p%d k%d", p, k) << "padded" << p << k;
      for (int k : {1, 300}) QTest::addRow("padded chunks p%d k%d", p, k) << "padded chunks" << p << k;
      // Batches made per input (each reader splits and batches its own files), about 700 in two
      // epochs: a cut finds rows held inside the open inputs' batches, made again on resume.
      for (int k : {1, 100, 400}) QTest::addRow("per input p%d k%d", p, k) << "per input" << p << k;
      // 403 images of a tfds split in 26 batches per epoch.
      for (int k : {1, 40}) QTest::addRow("tfds p%d k%d", p, k) << "tfds" << p << k;
      // 480 images in tar shards, 30 batches per epoch.
      for (int k : {1, 40}) QTest::addRow("webdataset p%d k%d", p, k) << "webdataset" << p << k;
      // 2400 images twice in batches of 50, 96 batches: cuts in the first epoch and the second.
      for (int k : {5, 60}) QTest::addRow("random access p%d k%d", p, k) << "random access" << p << k;
      // The shuffle before the maps: 450 batches (tfrecord's), 96 (random access's). Under the
      // sanitizers one cut each: their code is the random access rows' and the tfrecord rows'
      // but for the places after the shuffle (these rows added 40 s to ThreadSanitizer's suites).
#ifdef SLUICE_SANITIZED
      const std::vector<int> after_shuffle_cuts{60}, random_access_cuts{60};
#else
      const std::vector<int> after_shuffle_cuts{1, 60, 310}, random_access_cuts{5, 60};
#endif
      for (int k : after_shuffle_cuts) QTest::addRow("map after shuffle p%d k%d", p, k) << "map after shuffle" << p << k;
      for (int k : random_access_cuts) QTest::addRow("random access shuffled p%d k%d", p, k) << "random access shuffled" << p << k;
    }
  }
  void resume_is_exact() {
    QFETCH(QString, pipeline);
    QFETCH(int, parallelism);
    QFETCH(int, stop_after);
    const std::string text = pipeline == "tfrecord"  ? tfrecord_pipeline(shards_, parallelism)
                             : pipeline == "array record" ? tfrecord_pipeline(array_record_shards_, parallelism, "array_record_reader")
                             : pipeline == "parquet" ? tfrecord_pipeline(parquet_shards_, parallelism, "parquet_reader")
                             : pipeline == "cached"  ? cached_pipeline(parallelism)
                             : pipeline == "chunked" ? chunked_pipeline(shards_, parallelism)
                             : pipeline == "zip"     ? zip_pipeline(parallelism)
                             : pipeline == "mixture" ? mixture_pipeline(parallelism)
                             : pipeline == "tfds"    ? tfds_pipeline(tfds_, parallelism)
                             : pipeline == "webdataset" ? webdataset_pipeline(webdataset_, parallelism)
                             : pipeline == "random access" ? random_access_pipeline(shards_, parallelism)
                             : pipeline == "map after shuffle" ? map_after_shuffle_pipeline(shards_, parallelism)
                             : pipeline == "random access shuffled" ? random_access_pipeline(shards_, parallelism, true)
                                                     : sequences_pipeline(token_files_, pipeline.toStdString(), parallelism);
    QTemporaryDir dir;
    const Run whole = run(text, dir, "whole.jsonl", -1);
    QCOMPARE(whole.result.state, sluice::RunState::Finished);
    const bool records = pipeline == "tfrecord" || pipeline == "array record" || pipeline == "parquet";
    if (records || pipeline == "cached")
      QCOMPARE(whole.lines.size(), std::size_t(pipeline == "cached" ? 900 : 450));
    if (pipeline == "zip") QCOMPARE(whole.lines.size(), std::size_t(600));
    if (pipeline == "tfds") QCOMPARE(whole.lines.size(), std::size_t(3 * 26));  // 480 - 48 - round(28.8) = 403 images
    if (pipeline == "webdataset") QCOMPARE(whole.lines.size(), std::size_t(3 * 30));
    if (pipeline == "padded chunks")  // lines, tokens and kept fields went on in chunks, and through the repeat
      for (int k : {1, 2, 3, 4}) QVERIFY(whole.snapshot.stage(k).chunks_out() > 0);
    if (pipeline == "chunked") {  // the reader and the parser handed on chunks
      QCOMPARE(whole.lines.size(), std::size_t(2 * 185));
      QVERIFY(whole.snapshot.stage(1).chunks_out() > 0 && whole.snapshot.stage(2).chunks_out() > 0);
    }

    Run first = run(text, dir, "first.jsonl", stop_after);
    // A small run on a loaded machine can have made all its output by the time the cut reaches the
    // sink (the sources read ahead of it): a checkpoint after the last element tests no resume.
    for (int attempt = 2; first.checkpoint && first.lines.size() >= whole.lines.size() && attempt <= 5; ++attempt) {
      qInfo("the checkpoint asked for after %d elements fell after the last one; attempt %d", stop_after, attempt);
      first = run(text, dir, "first.jsonl", stop_after);
    }
    QVERIFY2(first.checkpoint.has_value(), "the run ended before the checkpoint, five times");
    QCOMPARE(first.result.state, sluice::RunState::Stopped);
    QVERIFY(first.result.stopped_at_checkpoint);
    QCOMPARE(first.checkpoint->sink_elements(), std::uint64_t(first.lines.size()));
    QVERIFY(first.lines.size() >= std::size_t(stop_after) && first.lines.size() < whole.lines.size());

    // Through the file, as a resumed process would read it.
    const fs::path file = dir.filePath("ck/checkpoint.sluice").toStdString();
    sluice::write_checkpoint(file, *first.checkpoint);
    auto saved = std::make_shared<const sluice::checkpoint::Checkpoint>(sluice::read_checkpoint(file));
    const Run rest = run(text, dir, "rest.jsonl", -1, saved);
    QCOMPARE(rest.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(first.lines, rest.lines), whole.lines);

    if (pipeline == "map after shuffle" || pipeline == "random access shuffled") {
      // The shuffle buffer holds records, named by where they were read; the batch's rows, made
      // by maps after the shuffle, too, with the places those maps saw.
      QCOMPARE(whole.lines.size(), std::size_t(pipeline == "map after shuffle" ? 450 : 96));
      QCOMPARE(referenced(*saved), std::uint64_t(state_of(*saved, "shuffle").elements_size() + state_of(*saved, "batch").elements_size()));
      for (const auto& e : state_of(*saved, "batch").elements()) QVERIFY(e.ref().has_made());
      QCOMPARE(reread(rest.snapshot), referenced(*saved) + open_inputs(*saved));
    } else if (records) {
      // The shuffle buffer is named, not held, and only it and the last record of each open
      // input are read again (one seek each), not the records before the cut.
      // A cut inside an epoch finds the shuffle holding the rest of it (nothing is in flight at a
      // cut: what it emitted is in the batches the sink got, and in the batch being gathered).
      // One asked for late in an epoch may land at the epoch's end instead, when the readers had
      // read the whole epoch before it: the barrier then comes after the end of the shuffle's
      // input, behind its drain, and the buffer is rightly empty (seen once under ASan).
      if (first.lines.size() % 150 != 0)
        QVERIFY2(state_of(*saved, "shuffle").elements_size() > 0,
                 ("the cut fell after " + std::to_string(first.lines.size()) + " batches, inside an epoch, with the shuffle buffer empty").c_str());
      // The rows of the batch being gathered, behind the shuffle, are named by their records too.
      QCOMPARE(referenced(*saved), std::uint64_t(state_of(*saved, "shuffle").elements_size() + state_of(*saved, "batch").elements_size()));
      QCOMPARE(reread(rest.snapshot), referenced(*saved) + open_inputs(*saved));
    } else if (pipeline == "random access") {
      // The batch being gathered names its rows by their records, which the source read again (a
      // cut between two batches, one time in 50, finds none).
      QCOMPARE(whole.lines.size(), std::size_t(2 * 2400 / 50));
      QCOMPARE(referenced(*saved), std::uint64_t(state_of(*saved, "batch").elements_size()));
      QCOMPARE(reread(rest.snapshot), referenced(*saved));
    } else if (pipeline == "cached" && stop_after < 300) {
      // Inside the cache's first pass the cache is recording: what it recorded is in the checkpoint.
      QVERIFY2(first.lines.size() < 300, "the cut fell after the first epoch");
      QVERIFY(state_of(*saved, "cache").operator_summary().find("recording") != std::string::npos);
    }
  }

  // Resuming with the same output paths continues the outputs the interrupted run wrote, so that
  // together they are the uninterrupted run's files, byte for byte: whether that run stopped at
  // the checkpoint (and published what it had) or went on past it and was cut off (its partial
  // files holding more than the checkpoint knows of, dropped on resume).
  // A checkpoint closes webdataset_writer's open shard; the resumed run numbers on from there and
  // writes again what the cut run wrote after the checkpoint: read back, every sample once, in
  // order, and no partial shard left.
  void webdataset_writer_resumes_without_losing_or_repeating_a_sample() {
    QTemporaryDir dir;
    const std::string out = dir.filePath("wds").toStdString();
    const std::string text = "options { seed: 5 }\n" + stage("src", "range", "", {{"count", "400"}}, "buffer_size: 2") +
                             stage("work", "simulate_work", "src", {{"us", "1000"}}, "buffer_size: 2") +
                             stage("w", "webdataset_writer", "work", {{"prefix", out + "/s"}, {"max_records", "64"}});
    std::optional<sluice::checkpoint::Checkpoint> saved;
    {
      sluice::Engine engine(graph_of(text));
      engine.start();
      while (sink_elements(engine.snapshot()) < 100 && !engine.wait_for(std::chrono::milliseconds(0)))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      saved = engine.checkpoint(/*then_stop=*/false);
      QVERIFY2(saved.has_value(), "the run ended before the checkpoint");
      // On past the checkpoint, then cut off: samples written after it are in a partial shard.
      while (sink_elements(engine.snapshot()) < saved->sink_elements() + 90 && !engine.wait_for(std::chrono::milliseconds(0)))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      engine.stop();
      QCOMPARE(engine.wait().state, sluice::RunState::Stopped);
    }
    {
      sluice::EngineOptions options;
      options.resume_from = std::make_shared<const sluice::checkpoint::Checkpoint>(*saved);
      sluice::Engine engine(graph_of(text), options);
      engine.start();
      const auto result = engine.wait();
      QVERIFY2(result.state == sluice::RunState::Finished, result.error.c_str());
    }
    auto back = run_text(stage("files", "list_files", "", {{"patterns", out + "/s-*.tar"}, {"shuffle", "false"}}) +
                         stage("read", "webdataset_reader", "files", {{"integers", "value"}}) +
                         stage("pick", "select_fields", "read", {{"keep", "value"}}) + sink_after("pick"));
    std::vector<long long> expected(400);
    std::iota(expected.begin(), expected.end(), 0);
    QCOMPARE(all_integers(back.lines), expected);
    for (const auto& entry : fs::directory_iterator(out))
      QVERIFY2(entry.path().string().find(".partial-") == std::string::npos, entry.path().c_str());
  }

  void resume_with_the_same_outputs_gives_the_uninterrupted_files_data() {
    QTest::addColumn<int>("stop_after");
    QTest::addColumn<bool>("past_the_checkpoint");
    // 37 records per shard: 37 ends a shard, the others fall inside one.
    for (int k : {5, 37, 130}) {
      QTest::addRow("stopped at %d", k) << k << false;
      QTest::addRow("cut off after %d", k) << k << true;
    }
  }
  void resume_with_the_same_outputs_gives_the_uninterrupted_files() {
    QFETCH(int, stop_after);
    QFETCH(bool, past_the_checkpoint);
    QTemporaryDir dir;
    auto text = [&](const std::string& out) {
      return "options { seed: 5 }\n" +
             // Small buffers keep the source producing until the cut (see tfrecord_pipeline).
             stage("img", "synthetic_images", "", {{"count", "400"}, {"height", "8"}, {"width", "8"}, {"classes", "3"}}, "buffer_size: 2") +
             stage("enc", "encode_image", "img", {{"quality", "90"}}, "buffer_size: 2") +
             stage("work", "simulate_work", "enc", {{"us", "1500"}}, "buffer_size: 2") +
             stage("lines", "jsonl_sink", "work", {{"path", out + "/out.jsonl"}}) +
             stage("shards", "tfrecord_writer", "work", {{"prefix", out + "/shards/train"}, {"max_records", "37"}}) +
             // ArrayRecord in chunks of one record (the package's default): a cut ends no chunk early.
             stage("arrays", "array_record_writer", "work", {{"prefix", out + "/arrays/train"}, {"max_records", "37"}, {"field", ""}}) +
             stage("files", "write_files", "work", {{"folder", out + "/files"}}) +
             stage("tfds", "tfds_writer", "work", {{"data_dir", out + "/tfds"}, {"name", "pics"}, {"max_records", "37"}, {"class_labels", "label"}})
#ifdef SLUICE_HAVE_PARQUET
             // A Parquet shard cannot be continued (its footer is last): a checkpoint ends it, so
             // its rows, not its bytes, are the uninterrupted run's (compared below).
             + stage("parquet", "parquet_writer", "work", {{"prefix", out + "/parquet/train"}, {"max_records", "37"}, {"row_group_rows", "10"}})
#endif
        ;
    };
#ifdef SLUICE_HAVE_PARQUET
    const std::uint64_t sinks = 6;
#else
    const std::uint64_t sinks = 5;
#endif
    const std::string whole = dir.filePath("whole").toStdString(), cut = dir.filePath("cut").toStdString();
    fs::create_directories(whole);
    fs::create_directories(cut);
    {
      sluice::Engine engine(graph_of(text(whole)));
      engine.start();
      QCOMPARE(engine.wait().state, sluice::RunState::Finished);
    }
    std::optional<sluice::checkpoint::Checkpoint> saved;
    {
      sluice::Engine engine(graph_of(text(cut)));
      engine.start();
      // Every sink reads every element.
      while (sink_elements(engine.snapshot()) < sinks * static_cast<std::uint64_t>(stop_after) && !engine.wait_for(std::chrono::milliseconds(0)))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      saved = engine.checkpoint(/*then_stop=*/!past_the_checkpoint);
      QVERIFY2(saved.has_value(), "the run ended before the checkpoint");
      if (past_the_checkpoint) {
        // On, past the checkpoint (its lines file 8 KiB longer than then), then cut off as by a
        // lost node: the outputs stay partial, holding more than the checkpoint knows of.
        auto lines_file_size = [&]() -> std::uintmax_t {
          for (const auto& entry : fs::directory_iterator(cut))
            if (entry.path().filename().string().rfind("out.jsonl.partial-", 0) == 0) return fs::file_size(entry.path());
          return 0;
        };
        const std::uintmax_t at_checkpoint = lines_file_size();
        while (lines_file_size() < at_checkpoint + 8192 && !engine.wait_for(std::chrono::milliseconds(0)))
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        engine.stop();
      }
      const auto ended = engine.wait();
      QVERIFY2(ended.state == sluice::RunState::Stopped, ("the run ended before it could be cut off (make it longer): " +
                                                          std::string(sluice::run_state_name(ended.state)) + " " + ended.error).c_str());
    }
    // The cut falls behind what was in flight when it was asked for.
    const std::uint64_t cut_at = saved->sink_elements() / sinks;
    // (400 elements, 0.6 s of simulated work: on a loaded machine a checkpoint asked for after 130
    // once fell at 200, the end of a run of 240.)
    QVERIFY2(cut_at >= std::uint64_t(stop_after) && cut_at < 360, std::to_string(cut_at).c_str());
    if (cut_at % 37 != 0) ++cuts_inside_a_shard_;
    QCOMPARE(fs::exists(cut + "/out.jsonl"), !past_the_checkpoint);  // published only when it stopped at the checkpoint
    {
      sluice::EngineOptions options;
      options.resume_from = std::make_shared<const sluice::checkpoint::Checkpoint>(*saved);
      sluice::Engine engine(graph_of(text(cut)), options);
      engine.start();
      const auto result = engine.wait();
      QVERIFY2(result.state == sluice::RunState::Finished, result.error.c_str());
    }
#ifdef SLUICE_HAVE_PARQUET
    QCOMPARE(parquet_rows(cut), parquet_rows(whole));
    fs::remove_all(whole + "/parquet");
    fs::remove_all(cut + "/parquet");
#endif
    const auto expected = files_under(whole), got = files_under(cut);
    QCOMPARE(expected.size(), std::size_t(1 + 11 + 11 + 400 + 11 + 2));  // the lines, 11 and 11 shards, 400 files, 11 tfds shards and their metadata
    for (const auto& [name, bytes] : expected) {
      QVERIFY2(got.count(name), ("missing after the resume: " + name).c_str());
      QVERIFY2(got.at(name) == bytes, ("differs from the uninterrupted run's: " + name).c_str());
    }
    QCOMPARE(got.size(), expected.size());  // no .partial left beside them
  }
  // A map that skips a damaged element (here an image over decode_image's max_pixels) gives the
  // stages after it other places than the reader gave: a random map there drew for its place, not
  // the record's. A shuffle buffer named by references made its elements again with the reader's
  // places (other flips: found so); what went past a skip is now kept by value, and resumes exact.
  // After a shuffle, the maps' places are the batch's inputs' until one of them skips: from then
  // to the epoch's end the batch keeps its rows by value.
  void a_skip_before_a_random_map_keeps_the_shifted_elements_by_value_data() {
    QTest::addColumn<bool>("after_the_shuffle");
    QTest::newRow("maps before the shuffle") << false;
    QTest::newRow("maps after the shuffle") << true;
  }
  void a_skip_before_a_random_map_keeps_the_shifted_elements_by_value() {
    QFETCH(bool, after_the_shuffle);
    QTemporaryDir dir;
    const std::string mixed = make_mixed_shards(dir);
    const std::string batch_size = after_the_shuffle ? "7" : "8";
    const std::string maps = stage("parse", "parse_example", after_the_shuffle ? "shuffle" : "read", {{"features", "image:bytes, label:int64"}}, "buffer_size: 2") +
                             stage("decode", "decode_image", "parse", {{"max_pixels", "100"}}, "buffer_size: 2 error_policy: skip") +
                             stage("flip", "random_flip", "decode", {}, "buffer_size: 2");
    const std::string shuffle = stage("shuffle", "shuffle", after_the_shuffle ? "read" : "flip", {{"buffer_size", "40"}}, "buffer_size: 2");
    // Separate stages (fuse_stages: false): stages fused into one take the place of the chain's input.
    const std::string text =
        "options { seed: 5 deterministic: true fuse_stages: false }\n" +
        stage("files", "list_files", "", {{"patterns", mixed + "/*"}, {"shuffle", "false"}}) +
        stage("read", "tfrecord_reader", "files", {}, "buffer_size: 2 interleave { cycle_length: 4 block_length: 1 }") +
        (after_the_shuffle ? shuffle + maps : maps + shuffle) +
        stage("batch", "batch", after_the_shuffle ? "flip" : "shuffle", {{"batch_size", batch_size}}, "buffer_size: 2") + sink_after("batch");
    const Run whole = run(text, dir, "whole.jsonl", -1);
    QCOMPARE(whole.result.state, sluice::RunState::Finished);
    QCOMPARE(whole.lines.size(), std::size_t((600 + std::stoi(batch_size) - 1) / std::stoi(batch_size)));
    int cuts_with_rows = 0;
    for (int stop_after : {10, 30, 50}) {
      const Run first = run(text, dir, "first.jsonl", stop_after);
      QVERIFY2(first.checkpoint && first.lines.size() < whole.lines.size(), "the run ended before the checkpoint");
      const int decode = after_the_shuffle ? 4 : 3;
      QCOMPARE(first.snapshot.stage(decode).id(), std::string("decode"));
      QVERIFY2(first.snapshot.stage(decode).errors_skipped() > 0, "no image was skipped before the cut");
      const auto& holder = state_of(*first.checkpoint, after_the_shuffle ? "batch" : "shuffle");
      int by_value = 0;
      for (const auto& e : holder.elements()) by_value += e.has_value();
      if (after_the_shuffle) QVERIFY2(by_value == holder.elements_size(), "a row after a skip was named by a place the maps did not see");
      else QVERIFY2(by_value > 0, "the shuffle buffer holds no element by value: none went past a skip?");
      cuts_with_rows += holder.elements_size() > 0;
      auto saved = std::make_shared<const sluice::checkpoint::Checkpoint>(*first.checkpoint);
      const Run rest = run(text, dir, "rest.jsonl", -1, saved);
      QCOMPARE(rest.result.state, sluice::RunState::Finished);
      QCOMPARE(joined(first.lines, rest.lines), whole.lines);
    }
    QVERIFY2(cuts_with_rows > 0, "no cut found elements held");
  }

  // `list_files(...).repeat()` before an interleave (the benchmark's image pipeline, tf.data's
  // endless epochs): the names waiting for the reader are saved with each cut, so only a few may
  // wait. Buffers of the default 256 held 1,260 of them in every state (305 KB of 347 KB).
  void an_endless_file_list_before_an_interleave_keeps_few_names_waiting() {
    const std::string text = "options { seed: 3 deterministic: true }\n" +
                             stage("files", "list_files", "", {{"patterns", shards_ + "/*"}}) +
                             stage("epochs", "repeat", "files", {{"count", "-1"}}) +
                             stage("read", "tfrecord_reader", "epochs", {}, "interleave { cycle_length: 4 }") +
                             stage("parse", "parse_example", "read", {{"features", "label:int64"}}) +
                             stage("batch", "batch", "parse", {{"batch_size", "16"}}) + sink_after("batch");
    QTemporaryDir dir;
    const Run first = run(text, dir, "first.jsonl", 200);
    QVERIFY2(first.checkpoint.has_value(), "the run ended before the checkpoint");
    const auto& read = state_of(*first.checkpoint, "read");
    QVERIFY2(read.elements_size() <= 100, ("the interleave's state holds " + std::to_string(read.elements_size()) + " names").c_str());
  }

  void resume_with_the_same_outputs_cut_inside_shards() {
    QVERIFY2(cuts_inside_a_shard_ >= 2, "fewer than two cuts fell inside a shard: make the shards longer");
  }

  // A cut asked for while a zip, in the middle of its first output, waits for an input that holds
  // back (a shuffle filling its buffer from a slow source): the barrier reaches the zip there, and
  // the element it was given from the other input goes back in front of it, not lost.
  void cut_in_the_middle_of_a_combine_output() {
    const std::string text = "options { seed: 6 deterministic: true }\n" + stage("a", "range", "", {{"count", "300"}}) +
                             stage("b0", "range", "", {{"start", "5000"}, {"count", "600"}}, "buffer_size: 2") +
                             stage("bw", "simulate_work", "b0", {{"us", "400"}}, "buffer_size: 2") +
                             stage("bs", "shuffle", "bw", {{"buffer_size", "300"}}, "buffer_size: 2") +
                             stage("z", "zip", "", {{"prefixes", "a,b"}}, "input: \"a\" input: \"bs\" buffer_size: 2") + sink_after("z");
    QTemporaryDir dir;
    const Run whole = run(text, dir, "whole.jsonl", -1);
    QCOMPARE(whole.lines.size(), std::size_t(300));
    auto stage_out = [](const sluice::metrics::MetricsSnapshot& snap, const std::string& id) {
      for (const auto& m : snap.stage())
        if (m.id() == id) return m.elements_out();
      return std::uint64_t(0);
    };
    std::string resolved = text;
    const std::string first_out = dir.filePath("first.jsonl").toStdString();
    for (std::size_t at; (at = resolved.find("$OUT")) != std::string::npos;) resolved.replace(at, 4, first_out);
    sluice::Engine engine(graph_of(resolved), {});
    engine.start();
    // The zip has taken a's first element (a is far ahead) and waits for b: its shuffle is filling
    // (300 elements of 0.4 ms each), nothing of b has come.
    for (int i = 0; i < 20000; ++i) {
      const auto snap = engine.snapshot();
      if (stage_out(snap, "a") >= 1 && stage_out(snap, "bw") >= 20 && stage_out(snap, "bs") == 0) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const auto before = engine.snapshot();
    QVERIFY2(stage_out(before, "bs") == 0 && stage_out(before, "z") == 0, "the shuffle had filled before the cut was asked for");
    const auto taken = engine.checkpoint(/*then_stop=*/true);
    QVERIFY2(taken.has_value(), "no checkpoint was taken");
    auto cut = std::make_shared<const sluice::checkpoint::Checkpoint>(*taken);
    QCOMPARE(engine.wait().state, sluice::RunState::Stopped);
    const auto first = lines_of(first_out);
    QVERIFY2(first.empty(), qPrintable(QString("%1 outputs before the cut").arg(first.size())));
    // The zip's saved inputs: a's element it was given is among them.
    QVERIFY2(state_of(*cut, "z").elements_size() >= 1, "the zip saved no element of a");
    const Run rest = run(text, dir, "rest.jsonl", -1, cut);
    QCOMPARE(rest.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(first, rest.lines), whole.lines);
  }

  // A resumed run can itself be checkpointed and resumed: three pieces make the whole.
  void chain_of_resumes_is_exact() {
    const std::string text = tfrecord_pipeline(shards_, 4);
    QTemporaryDir dir;
    const Run whole = run(text, dir, "whole.jsonl", -1);
    // The second cut in the same epoch as the first: the shuffle then holds elements the resumed
    // reader handed on, named by their place after the first cut.
    const Run a = run(text, dir, "a.jsonl", 20);
    auto first = std::make_shared<const sluice::checkpoint::Checkpoint>(*a.checkpoint);
    const Run b = run(text, dir, "b.jsonl", 60, first);
    QVERIFY(b.checkpoint.has_value());
    QCOMPARE(b.checkpoint->sequence(), std::uint64_t(2));
    QCOMPARE(b.checkpoint->sink_elements(), std::uint64_t(a.lines.size() + b.lines.size()));
    const Run c = run(text, dir, "c.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*b.checkpoint));
    QCOMPARE(joined(joined(a.lines, b.lines), c.lines), whole.lines);
  }

  // A checkpoint taken while the run goes on changes nothing in its output.
  void checkpoint_without_stopping_changes_nothing() {
    const std::string text = tfrecord_pipeline(shards_, 4);
    QTemporaryDir dir;
    const Run whole = run(text, dir, "whole.jsonl", -1);
    std::string resolved = text;
    const std::string out = dir.filePath("on.jsonl").toStdString();
    resolved.replace(resolved.find("$OUT"), 4, out);
    sluice::Engine engine(graph_of(resolved));
    engine.start();
    int taken = 0;
    for (int i = 0; i < 5; ++i)
      if (engine.checkpoint(false)) ++taken;
    QVERIFY(taken > 0);
    QCOMPARE(engine.wait().state, sluice::RunState::Finished);
    QCOMPARE(lines_of(out), whole.lines);
  }

  // A file list that runs far ahead of a slow reader is cut where its buffer stands: after the
  // first end of a pass waiting there (saved as before the next pass: what follows is listed
  // again), or inside a long pass after what waits, with the names it had listed and not handed
  // over kept. The checkpoint holds at most a pass or a buffer of names however far ahead the list
  // ran, and the resumed run gives the rest of the uninterrupted one.
  void a_source_far_ahead_is_cut_where_its_buffer_stands_data() {
    QTest::addColumn<bool>("short_passes");
    QTest::addColumn<int>("stop_after");
    for (int k : {5, 3000, 20000}) QTest::addRow("12 passes of 6 files, k%d", k) << true << k;
    for (int k : {5, 200, 700}) QTest::addRow("one pass of 240 files, k%d", k) << false << k;
  }
  void a_source_far_ahead_is_cut_where_its_buffer_stands() {
    QFETCH(bool, short_passes);
    QFETCH(int, stop_after);
    QTemporaryDir dir;
    const std::string many = dir.filePath("many").toStdString();
    fs::create_directories(many);
    for (int f = 0; f < 240; ++f) std::ofstream(many + "/f" + std::to_string(1000 + f) + ".txt") << f << " a\n" << f << " b\n" << f << " c\n" << f << " d\n";
    const std::string text =
        short_passes ? "options { seed: 21 deterministic: true }\n" +
                           stage("files", "list_files", "", {{"patterns", token_files_ + "/*.txt"}, {"shuffle", "true"}}, "buffer_size: 40") +
                           stage("lines", "text_lines", "files", {}, "interleave { cycle_length: 2 block_length: 3 }") +
                           stage("epochs", "repeat", "lines", {{"count", "12"}}, "buffer_size: 2") + sink_after("epochs")
                     : "options { seed: 21 deterministic: true }\n" + stage("files", "list_files", "", {{"patterns", many + "/*.txt"}}, "buffer_size: 4") +
                           stage("lines", "text_lines", "files", {}, "interleave { cycle_length: 2 block_length: 3 } buffer_size: 2") +
                           stage("slow", "simulate_work", "lines", {{"us", "200"}}, "buffer_size: 2") + sink_after("slow");
    const Run whole = run(text, dir, "whole.jsonl", -1);
    QVERIFY2(whole.result.state == sluice::RunState::Finished, whole.result.error.c_str());
    QCOMPARE(whole.lines.size(), std::size_t(short_passes ? 12 * 2400 : 960));
    const Run first = run(text, dir, "first.jsonl", stop_after);
    QVERIFY(first.checkpoint.has_value());
    const auto& files = state_of(*first.checkpoint, "files");
    const auto& lines = state_of(*first.checkpoint, "lines");
    if (short_passes) {
      // Passes of 6 names, 40 waiting: the list is saved before a pass, the reader holds the rest
      // of one pass (6 names at most) and its 2 open inputs. (A list that had ended, late in the
      // run, left the reader all that waited: no barrier comes after an end.)
      QVERIFY2(files.ended() || files.summary().rfind("before pass", 0) == 0, files.summary().c_str());
      QCOMPARE(files.elements_size(), 0);
      QVERIFY2(lines.elements_size() <= (files.ended() ? 40 + 2 : 8), std::to_string(lines.elements_size()).c_str());
    } else if (stop_after <= 200) {
      // Inside the pass the list, behind a slow consumer, waits for room, mostly with names it made:
      // those are kept (how many depends on the moment). The reader holds what waited (4), what it
      // took in its last take (4) and its 2 open inputs.
      const bool kept = files.summary().find("made and not yet handed over (kept)") != std::string::npos;
      QVERIFY2(kept == (files.elements_size() > 0), files.summary().c_str());
      QVERIFY2(lines.elements_size() <= 4 + 4 + 2, std::to_string(lines.elements_size()).c_str());
    }
    const Run rest = run(text, dir, "rest.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*first.checkpoint));
    QCOMPARE(rest.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(first.lines, rest.lines), whole.lines);
  }

  // A file list's shard runs on the list's thread, before the reader (fuse_stages): the same
  // files each pass as apart, counted from 0 in each pass, and a resumed run the rest of the
  // uninterrupted one wherever the cut fell. 302 files a pass, every 7th kept: a pass's count and
  // a resumed place inside a pass both show in which files are read; a buffer of 3 after the
  // shard, so that the list is still listing at the cut.
  void a_file_list_and_its_shard_run_as_one_data() {
    QTest::addColumn<int>("stop_after");
    for (int k : {5, 60, 120}) QTest::addRow("k%d", k) << k;
  }
  void a_file_list_and_its_shard_run_as_one() {
    QFETCH(int, stop_after);
    QTemporaryDir dir;
    const std::string files = dir.filePath("files").toStdString();
    fs::create_directories(files);
    for (int f = 0; f < 302; ++f) std::ofstream(files + "/g" + std::to_string(1000 + f) + ".txt") << "g" << f << " x\n";
    const auto text = [&](bool fuse) {
      return std::string("options { seed: 21 deterministic: true fuse_stages: ") + (fuse ? "true" : "false") + " }\n" +
             stage("files", "list_files", "", {{"patterns", files + "/*.txt"}, {"shuffle", "true"}}) +
             stage("shard", "shard", "files", {{"num_shards", "7"}, {"index", "1"}}, "buffer_size: 3") +
             stage("lines", "text_lines", "shard", {}, "interleave { cycle_length: 2 block_length: 3 } buffer_size: 2") +
             stage("slow", "simulate_work", "lines", {{"us", "300"}}, "buffer_size: 2") + stage("epochs", "repeat", "slow", {{"count", "4"}}) +
             sink_after("epochs");
    };
    const Run apart = run(text(false), dir, "apart.jsonl", -1);
    const Run whole = run(text(true), dir, "whole.jsonl", -1);
    QVERIFY2(whole.result.state == sluice::RunState::Finished, whole.result.error.c_str());
    QCOMPARE(whole.snapshot.stage(1).fused_with(), std::string("files"));
    QCOMPARE(apart.snapshot.stage(1).fused_with(), std::string());
    QCOMPARE(whole.lines, apart.lines);
    QCOMPARE(whole.lines.size(), std::size_t(4 * 43));
    const Run first = run(text(true), dir, "first.jsonl", stop_after);
    QVERIFY(first.checkpoint.has_value());
    const Run rest = run(text(true), dir, "rest.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*first.checkpoint));
    QCOMPARE(rest.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(first.lines, rest.lines), whole.lines);
    // A checkpoint of the stages apart (fuse_stages: false, or a Sluice before they were fused)
    // goes on fused, each from its own place; one taken fused is refused apart, saying why.
    const Run first_apart = run(text(false), dir, "first_apart.jsonl", stop_after);
    QVERIFY(first_apart.checkpoint.has_value());
    const Run rest_fused = run(text(true), dir, "rest_fused.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*first_apart.checkpoint));
    QCOMPARE(rest_fused.result.state, sluice::RunState::Finished);
    QCOMPARE(joined(first_apart.lines, rest_fused.lines), whole.lines);
    const Run refused = run(text(false), dir, "refused.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*first.checkpoint));
    QCOMPARE(refused.result.state, sluice::RunState::Failed);
    QVERIFY2(refused.result.error.find("fuse_stages") != std::string::npos, refused.result.error.c_str());
  }

  // A random-access source saves its place in the epoch's order: the resumed run gives the rest
  // of that order and the next epoch's, the output the uninterrupted run's, nothing twice.
  void a_global_shuffle_resumes_at_its_place_in_the_order() {
    QTemporaryDir dir;
    for (const char* name : {"pets_examples.record", "tfx_mnist.tfrecord", "torchdata_example.tfrecord"})
      fs::copy_file(testdata_dir() + "/tfrecord/" + name, dir.filePath(name).toStdString());
    const std::string text = "options { seed: 11 }\n" +
                             stage("src", "random_access", "", {{"patterns", dir.filePath("*.*record").toStdString()}}, "buffer_size: 2") +
                             stage("pick", "select_fields", "src", {{"keep", "path,index"}}, "buffer_size: 2") +
                             stage("slow", "simulate_work", "pick", {{"us", "300"}}, "buffer_size: 2") +
                             stage("again", "repeat", "slow", {{"count", "2"}}, "buffer_size: 2") + sink_after("again");
    const Run whole = run(text, dir, "whole.jsonl", -1);
    QVERIFY2(whole.lines.size() >= 100, std::to_string(whole.lines.size()).c_str());
    const Run cut = run(text, dir, "cut.jsonl", static_cast<long>(whole.lines.size() / 3));
    QVERIFY2(cut.checkpoint.has_value(), "the run ended before the checkpoint");
    QVERIFY(cut.lines.size() < whole.lines.size());
    const Run rest = run(text, dir, "cut.jsonl", -1, std::make_shared<const sluice::checkpoint::Checkpoint>(*cut.checkpoint));
    QCOMPARE(rest.lines, whole.lines);
  }

  void refuses_other_pipelines_seeds_and_files() {
    QTemporaryDir dir;
    const std::string text = tfrecord_pipeline(shards_, 2);
    const Run first = run(text, dir, "first.jsonl", 10);
    auto saved = std::make_shared<const sluice::checkpoint::Checkpoint>(*first.checkpoint);
    auto refusal = [&](const std::string& other) -> std::string {
      std::string resolved = other;
      resolved.replace(resolved.find("$OUT"), 4, dir.filePath("x.jsonl").toStdString());
      sluice::EngineOptions options;
      options.resume_from = saved;
      try {
        sluice::Engine engine(graph_of(resolved), options);
        engine.start();
        engine.wait();
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    };
    auto replaced = [&](std::string s, const std::string& from, const std::string& to) {
      s.replace(s.find(from), from.size(), to);
      return s;
    };
    const std::string seed = refusal(replaced(text, "seed: 11", "seed: 12"));
    QVERIFY2(seed.find("seed 11") != std::string::npos && seed.find("seed is 12") != std::string::npos, seed.c_str());
    const std::string param = refusal(replaced(text, "\"buffer_size\" value: \"1000\"", "\"buffer_size\" value: \"999\""));
    QVERIFY2(param.find("stage 'shuffle'") != std::string::npos && param.find("buffer_size=999") != std::string::npos, param.c_str());
    const std::string stages = refusal(replaced(text, "op: \"random_flip\"", "op: \"identity\""));
    QVERIFY2(stages.find("another pipeline") != std::string::npos && stages.find("'flip' (random_flip)") != std::string::npos, stages.c_str());
    // The sink's parameters do not change the data: allowed.
    QCOMPARE(refusal(text), std::string());

    // Another file list: one more shard, then a shard of another size (each put back after).
    const std::string extra = shards_ + "/zz-extra";
    fs::copy_file(fs::directory_iterator(shards_)->path(), extra);  // a copy of some shard
    const std::string added = refusal(text);
    fs::remove(extra);
    QVERIFY2(added.find("zz-extra is new") != std::string::npos && added.find("resume over the same files") != std::string::npos, added.c_str());
    std::vector<fs::path> shards;
    for (const auto& entry : fs::directory_iterator(shards_)) shards.push_back(entry.path());
    const fs::path shard = *std::min_element(shards.begin(), shards.end());
    const fs::path kept = dir.filePath("kept").toStdString();
    fs::copy_file(shard, kept);
    fs::resize_file(shard, fs::file_size(shard) - 100);
    const std::string shorter = refusal(text);
    fs::copy_file(kept, shard, fs::copy_options::overwrite_existing);
    QVERIFY2(shorter.find(shard.filename().string()) != std::string::npos && shorter.find("bytes in the checkpoint's run") != std::string::npos,
             shorter.c_str());
    QCOMPARE(refusal(text), std::string());
  }

  void refuses_what_cannot_be_checkpointed() {
    QTemporaryDir dir;
    std::string text = "options { deterministic: false }\n" + stage("n", "range", "", {{"count", "10"}}) + sink_after("n");
    text.replace(text.find("$OUT"), 4, dir.filePath("x.jsonl").toStdString());
    sluice::Engine nondeterministic(graph_of(text));
    const auto refusals = nondeterministic.checkpoint_refusals();
    QCOMPARE(refusals.size(), std::size_t(1));
    QVERIFY(refusals[0].find("deterministic: false") != std::string::npos);
    nondeterministic.start();
    QVERIFY_THROWS_EXCEPTION(sluice::Error, nondeterministic.checkpoint());
    nondeterministic.wait();

    // A third-party source that keeps its place and does not save it.
    std::string unsaved = stage("n", "unsaved_counter", "", {{"count", "10"}}) + sink_after("n");
    unsaved.replace(unsaved.find("$OUT"), 4, dir.filePath("u.jsonl").toStdString());
    sluice::Engine third_party(graph_of(unsaved));
    const auto why = third_party.checkpoint_refusals();
    QCOMPARE(why.size(), std::size_t(1));
    QVERIFY2(why[0].find("stage 'n' (unsaved_counter)") != std::string::npos && why[0].find("libfixture_good.so") != std::string::npos &&
                 why[0].find("OperatorTraits::saves_state") != std::string::npos,
             why[0].c_str());
  }

  void damaged_checkpoint_files_are_refused() {
    QTemporaryDir dir;
    const Run first = run(cached_pipeline(1), dir, "first.jsonl", 5);
    const fs::path file = sluice::checkpoint_file(dir.filePath("ck").toStdString());
    QCOMPARE(file.filename().string(), std::string("checkpoint.sluice"));
    sluice::write_checkpoint(file, *first.checkpoint);
    QCOMPARE(sluice::read_checkpoint(file).sink_elements(), first.checkpoint->sink_elements());
    std::string bytes = read_file(file.string());
    auto refused = [&](const std::string& content) -> std::string {
      const fs::path bad = dir.filePath("bad.sluice").toStdString();
      std::ofstream(bad, std::ios::binary | std::ios::trunc) << content;
      try {
        sluice::read_checkpoint(bad);
      } catch (const sluice::Error& e) {
        return e.what();
      }
      return "";
    };
    QVERIFY(refused(bytes.substr(0, bytes.size() - 7)).find("damaged") != std::string::npos);
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x20;
    QVERIFY(refused(flipped).find("checksum") != std::string::npos);
    QVERIFY(refused("not a checkpoint at all").find("is not a Sluice checkpoint") != std::string::npos);
    // Another format, older or newer, whole and with a right checksum: refused, saying so; and as
    // the bytes of a Python state written to a file, not taken for one.
    for (const std::uint32_t other : {sluice::kCheckpointFormat - 1, sluice::kCheckpointFormat + 1}) {
      auto foreign = *first.checkpoint;
      foreign.set_format(other);
      const fs::path written = dir.filePath("foreign.sluice").toStdString();
      sluice::write_checkpoint(written, foreign);
      try {
        sluice::read_checkpoint(written);
        QFAIL("a checkpoint of another format was read");
      } catch (const sluice::Error& e) {
        QVERIFY2(std::string(e.what()).find("has format " + std::to_string(other)) != std::string::npos, e.what());
      }
      std::string state_bytes;
      foreign.SerializeToString(&state_bytes);
      QVERIFY(refused(state_bytes).find("is not a Sluice checkpoint") != std::string::npos);
    }
    QVERIFY(refused("").find("is not a Sluice checkpoint") != std::string::npos);
    try {
      sluice::read_checkpoint(dir.filePath("nowhere/checkpoint.sluice").toStdString());
      QFAIL("a missing checkpoint was read");
    } catch (const sluice::Error& e) {
      QVERIFY(std::string(e.what()).find("no checkpoint at") != std::string::npos);
    }
    // What `sluice checkpoint info` prints names every stage and where it stood.
    const std::string info = sluice::describe_checkpoint(*first.checkpoint, bytes.size());
    for (const char* id : {"img", "flip", "cache", "epochs", "shuffle", "batch", "out"}) QVERIFY2(info.find(id) != std::string::npos, info.c_str());
  }
};

QTEST_GUILESS_MAIN(TestCheckpoint)
#include "tst_checkpoint.moc"
