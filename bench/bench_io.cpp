// Data-plugin benchmarks, each against a baseline measured in the same run on the same files
// (page cache warm):
//  1. tfrecord_reader with CRC checks against `cat FILES > /dev/null` (bytes/s);
//  2. the image pipeline list_files -> read_file -> decode -> resize 224 -> flip -> normalize ->
//     batch 64 on all cores against the ideal: a plain single-thread loop doing the same work on
//     the same files, times the number of cores.
// Usage: bench_io TFRECORD_GLOB JPEG_GLOB
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

#include "bench_clock.hpp"
#include "image_codec.hpp"
#include "pixel_ops.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace {
using sluice::bench::Clock;
using sluice::bench::since;

std::vector<std::string> expand(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  return out;
}
// The whole file with plain system calls, as read_file does.
std::string slurp(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    out.resize(static_cast<std::size_t>(st.st_size));
    std::size_t at = 0;
    for (ssize_t got; at < out.size() && (got = ::read(fd, out.data() + at, out.size() - at)) > 0;) at += static_cast<std::size_t>(got);
    out.resize(at);
  }
  ::close(fd);
  return out;
}

double run_pipeline(const sluice::Registry& registry, const std::string& text, std::uint64_t& elements) {
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench"), registry));
  auto t0 = Clock::now();
  engine.start();
  auto result = engine.wait();
  double s = since(t0);
  if (result.state != sluice::RunState::Finished) throw sluice::Error(result.error);
  auto snap = engine.snapshot();
  elements = snap.stage(snap.stage_size() - 1).elements_out();
  return s;
}

// One image the way the pipeline treats it, on the calling thread, normalized straight into its
// row of the batch (as the pipeline's normalize does when a batch follows it).
void ideal_one(const std::string& path, float* row, std::uint64_t n) {
  std::string bytes = slurp(path);
  sluice::vision::DecodeOptions o;
  o.target_height = o.target_width = 224;
  cv::Mat img = sluice::vision::decode_image(bytes, o);
  double s = std::max(224.0 / img.cols, 224.0 / img.rows);
  cv::Mat scaled, cropped, flipped;
  cv::resize(img, scaled, cv::Size(std::max(224, int(std::lround(img.cols * s))), std::max(224, int(std::lround(img.rows * s)))), 0, 0,
             cv::INTER_LINEAR);
  cropped = scaled(cv::Rect((scaled.cols - 224) / 2, (scaled.rows - 224) / 2, 224, 224));
  if (n % 2) cv::flip(cropped, flipped, 1);
  else flipped = cropped;
  // The same one-pass kernel as the normalize operator uses for a batch row.
  if (!flipped.isContinuous()) flipped = flipped.clone();
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  float mul[3], add[3];
  for (int c = 0; c < 3; ++c) {
    mul[c] = 1.0f / 255 / std[c];
    add[c] = -mean[c] / std[c];
  }
  sluice::vision::normalize_u8_to_cold(flipped.ptr<std::uint8_t>(), row, flipped.total(), 3, mul, add);
}
}  // namespace

int main(int argc, char** argv) {
  // WORKERS: the pipeline's workers, the loop's threads, the ideal's multiple and the DataLoader's
  // workers (default: every core); on a large machine, run under `taskset` with as many cores.
  const int workers = argc > 3 ? std::atoi(argv[3]) : 0;
  if (argc < 3 || argc > 4 || (argc == 4 && workers < 1)) {
    fmt::print(stderr, "usage: bench_io TFRECORD_GLOB JPEG_GLOB [WORKERS] (scripts/demo.sh makes build/sample_data; WORKERS: 1 or more, "
                       "default every core)\n");
    return 2;
  }
  sluice::tune_process_for_streaming();
  const std::string tfrecords = argv[1], jpegs = argv[2];
  const unsigned cores = workers > 0 ? static_cast<unsigned>(workers) : std::max(1u, std::thread::hardware_concurrency());
  sluice::Registry registry;
  registry.load_search_path();

  // 1. Reading TFRecords.
  // The file set is read 40 times over in both (a few tens of MB alone would mostly measure
  // process and pipeline start-up).
  constexpr int kPasses = 40;
  auto files = expand(tfrecords);
  std::uint64_t bytes = 0;
  for (auto& f : files) bytes += kPasses * slurp(f).size();  // also warms the page cache
  std::string cat = "cat", patterns;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (auto& f : files) cat += " '" + f + "'";
    patterns += (pass ? "," : "") + tfrecords;
  }
  double best_cat = 1e9, best_read = 1e9;
  std::uint64_t records = 0;
  std::string reader = fmt::format(
      "stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
      "stage {{ id: \"read\" op: \"tfrecord_reader\" input: \"files\" }}\n"
      "stage {{ id: \"out\" op: \"null_sink\" input: \"read\" }}\n",
      patterns);
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    if (std::system((cat + " > /dev/null").c_str()) != 0) return 1;
    best_cat = std::min(best_cat, since(t0));
    best_read = std::min(best_read, run_pipeline(registry, reader, records));
  }
  fmt::print("TFRecord reading: {} files read {} times, {:.1f} MB, {} records (best of 5)\n", files.size(), kPasses, bytes / 1e6, records);
  fmt::print("  {:<34} {:>10.0f} MB/s\n", "cat FILES > /dev/null", bytes / 1e6 / best_cat);
  fmt::print("  {:<34} {:>10.0f} MB/s  ({:.0f}% of cat)\n\n", "tfrecord_reader, CRC checked", bytes / 1e6 / best_read,
             100 * best_cat / best_read);

  // 2. The image pipeline against the ideal.
  auto images = expand(jpegs);
  auto image_pipeline = [&](unsigned workers) {
    return fmt::format(
      "stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
      "stage {{ id: \"read\" op: \"read_file\" input: \"files\" parallelism: {c} }}\n"
      "stage {{ id: \"decode\" op: \"decode_image\" input: \"read\" parallelism: {c} params {{ key: \"field\" value: \"data\" }} }}\n"
      "stage {{ id: \"resize\" op: \"resize\" input: \"decode\" parallelism: {c} params {{ key: \"height\" value: \"224\" }} "
      "params {{ key: \"width\" value: \"224\" }} params {{ key: \"mode\" value: \"crop\" }} }}\n"
      "stage {{ id: \"flip\" op: \"random_flip\" input: \"resize\" parallelism: {c} }}\n"
      "stage {{ id: \"norm\" op: \"normalize\" input: \"flip\" parallelism: {c} }}\n"
      "stage {{ id: \"batch\" op: \"batch\" input: \"norm\" params {{ key: \"batch_size\" value: \"64\" }} }}\n"
      "stage {{ id: \"out\" op: \"null_sink\" input: \"batch\" }}\n",
      jpegs, fmt::arg("c", workers));
  };
  const std::string pipeline = image_pipeline(cores), single = image_pipeline(1);
  // Each round runs the 1-thread loop, the loop on every core, the pipeline and the pipeline with
  // one worker back to back, so that a slow spell of this shared machine hits all of them; the
  // best of each is kept. Every loop has a batch buffer of its own, allocated once (as the
  // pipeline's pooled batches are), and normalizes each image straight into its row.
  constexpr int kImageRuns = 7;
  double best_ideal = 1e9, best_threads = 1e9, best_ours = 1e9, best_single = 1e9;
  std::uint64_t batches = 0;
  const std::size_t image_floats = 224 * 224 * 3;
  std::vector<std::vector<float>> batch_buffers(cores, std::vector<float>(64 * image_floats));
  auto loop_over = [&](std::size_t first, std::size_t step, std::vector<float>& batch) {
    std::uint64_t n = 0;
    for (std::size_t i = first; i < images.size(); i += step) ideal_one(images[i], batch.data() + (n++ % 64) * image_floats, i);
  };
  for (int rep = 0; rep < kImageRuns; ++rep) {
    auto t0 = Clock::now();
    loop_over(0, 1, batch_buffers[0]);
    best_ideal = std::min(best_ideal, since(t0));
    t0 = Clock::now();
    std::vector<std::thread> threads;
    for (unsigned c = 0; c < cores; ++c) threads.emplace_back([&, c] { loop_over(c, cores, batch_buffers[c]); });
    for (auto& t : threads) t.join();
    best_threads = std::min(best_threads, since(t0));
    best_ours = std::min(best_ours, run_pipeline(registry, pipeline, batches));
    best_single = std::min(best_single, run_pipeline(registry, single, batches));
  }
  const double ideal_rate = images.size() / best_ideal * cores, ours = images.size() / best_ours;
  const double threads_rate = images.size() / best_threads;
  fmt::print("Image pipeline: {} JPEGs, decode -> resize 224 -> flip -> normalize -> batch 64, {} worker{} (best of {})\n", images.size(), cores,
             cores == 1 ? "" : "s", kImageRuns);
  fmt::print("  {:<34} {:>10.0f} images/s\n", fmt::format("ideal (1-thread loop x {})", cores), ideal_rate);
  fmt::print("  {:<34} {:>10.0f} images/s  ({:.0f}% of ideal)\n", fmt::format("the loop run on {} thread{}", cores, cores == 1 ? "" : "s"),
             threads_rate, 100 * threads_rate / ideal_rate);
  fmt::print("  {:<34} {:>10.0f} images/s  ({:.0f}% of ideal, {:.0f}% of the loop on as many threads)\n", "sluice pipeline", ours,
             100 * ours / ideal_rate, 100 * ours / threads_rate);
  // The engine's own overhead, without scaling over cores: one worker against the 1-thread loop.
  const double single_rate = images.size() / best_single, loop_rate = images.size() / best_ideal;
  fmt::print("  {:<34} {:>10.0f} images/s  ({:.0f}% of the 1-thread loop's {:.0f})\n", "sluice pipeline, 1 worker", single_rate,
             100 * single_rate / loop_rate, loop_rate);

  // 3. PyTorch's DataLoader on the same files and operations, when Debian's torch is installed.
  const std::string script = std::string(SLUICE_SOURCE_DIR) + "/bench/pytorch_loader.py";
  if (std::system("/usr/bin/python3 -c 'import torch, torchvision, PIL' > /dev/null 2>&1") != 0) {
    fmt::print("  PyTorch DataLoader: skipped (apt-get install python3-torch python3-torchvision python3-pil)\n");
    return 0;
  }
  std::string command = "/usr/bin/python3 '" + script + "' '" + jpegs + "' " + std::to_string(cores);
  std::FILE* pipe = ::popen(command.c_str(), "r");
  char line[512] = {};
  double torch_rate = 0;
  while (pipe && std::fgets(line, sizeof line, pipe))
    if (const char* colon = std::strstr(line, "): ")) torch_rate = std::atof(colon + 3);
  if (pipe) ::pclose(pipe);
  if (torch_rate > 0)
    fmt::print("  {:<34} {:>10.0f} images/s  (sluice is {:.1f}x)\n", fmt::format("PyTorch DataLoader, {} worker{}", cores, cores == 1 ? "" : "s"), torch_rate,
               ours / torch_rate);
  return 0;
}
