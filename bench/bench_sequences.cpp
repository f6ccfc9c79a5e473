// Sequence batching against a plain loop doing the same work, in the same run: token lines read
// from text files, split into int64 token ids, then (a) padded batches of 32, (b) batches of 32
// bucketed by length (boundaries 16, 32, 64) and padded, (c) packed first-fit into rows of 128
// tokens (8 rows open) with segment ids and positions, then batched by 32. Tokens per second on
// one core and on every core, and the padding share of each layout on one length distribution.
// On every core the padded and bucketed batches are also assembled on every core (the layout
// stage's parallelism), beside the run where one thread assembles them. A second loop ("handing")
// also hands each batch to a consumer thread, as any pipeline must: what that alone costs.
// Usage: bench_sequences [LINES_PER_FILE] [RUNS] [ONLY] (ONLY: padded, bucketed or packed, and
// optionally :1 or :N for one worker count, e.g. packed:2, and then :A for one assembly, e.g.
// padded:2:input; for profiling one case)
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "bench_clock.hpp"
#include "plain_integers.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"

namespace fs = std::filesystem;

namespace {
using sluice::bench::Clock;
using sluice::bench::cpu_seconds;
using sluice::bench::since;

constexpr int kBatch = 32, kRow = 128, kOpenRows = 8;
const std::vector<std::int64_t> kBoundaries{16, 32, 64};

enum class Layout { Padded, Bucketed, Packed };
const char* name(Layout l) { return l == Layout::Padded ? "padded" : l == Layout::Bucketed ? "bucketed" : "packed"; }

// What one layout wrote: tokens (data) and padding slots, and a checksum the loop and the
// pipeline can be compared by.
struct Tally {
  std::uint64_t tokens = 0, padding = 0;
};

// A finished batch, when the loop hands its batches on.
struct Batch {
  std::vector<std::int64_t> tokens;
  std::vector<std::int32_t> segments, positions;
};

// A single-producer single-consumer ring of batches: no lock, no system call on either side.
class BatchRing {
 public:
  bool push(Batch& b) {
    const auto head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) == kSlots) return false;
    slots_[head % kSlots] = std::move(b);
    head_.store(head + 1, std::memory_order_release);
    return true;
  }
  bool pop(Batch& b) {
    const auto tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) return false;
    b = std::move(slots_[tail % kSlots]);
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

 private:
  static constexpr std::size_t kSlots = 64;
  Batch slots_[kSlots];
  alignas(64) std::atomic<std::size_t> head_{0};
  alignas(64) std::atomic<std::size_t> tail_{0};
};

// What any pipeline does with a batch and the plain loop does not: hand it to a consumer on
// another thread, and write the next one into memory the last is not in, since the consumer may
// still be reading it. Made as cheap as we know how, so that it bounds what any pipeline's
// hand-off costs: a lock-free ring 64 batches deep (a stage's output buffer), a consumer that
// polls it (no wake-up calls on the producer's side), and batch memory the consumer returns
// through a second ring, so the producer writes into recycled, not fresh, memory.
class HandOff {
 public:
  HandOff() : consumer_([this] { consume(); }) {}
  ~HandOff() {
    closed_.store(true, std::memory_order_release);
    consumer_.join();
  }
  // Memory of a batch the consumer is done with (its vectors' capacity), or none.
  Batch recycled() {
    for (Batch b; returned_.pop(b);) spare_.push_back(std::move(b));
    if (spare_.empty()) return {};
    Batch b = std::move(spare_.back());  // the last returned: the likeliest still in this core's cache
    spare_.pop_back();
    return b;
  }
  void push(Batch b) {
    while (!queue_.push(b)) std::this_thread::yield();
  }

 private:
  void consume() {
    for (;;) {
      const bool closed = closed_.load(std::memory_order_acquire);
      Batch b;
      bool any = false;
      while (queue_.pop(b)) {
        any = true;
        returned_.push(b);  // dropped when the return ring is full
      }
      if (!any) {
        if (closed) return;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  BatchRing queue_, returned_;
  std::vector<Batch> spare_;  // the producer's
  std::atomic<bool> closed_{false};
  std::thread consumer_;
};

// Pads rows (each a token sequence) to the longest into one [rows, longest] batch.
void pad_batch(const std::vector<std::vector<std::int64_t>>& rows, std::vector<std::int64_t>& batch, Tally& t) {
  std::size_t longest = 0;
  for (const auto& r : rows) longest = std::max(longest, r.size());
  batch.assign(rows.size() * longest, 0);
  std::uint64_t data = 0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (!rows[k].empty()) std::memcpy(batch.data() + k * longest, rows[k].data(), rows[k].size() * sizeof(std::int64_t));
    data += rows[k].size();
  }
  t.tokens += data;
  t.padding += rows.size() * longest - data;
}

struct PackedRow {
  std::vector<std::int64_t> tokens = std::vector<std::int64_t>(kRow, 0);
  std::vector<std::int32_t> segments = std::vector<std::int32_t>(kRow, 0), positions = std::vector<std::int32_t>(kRow, 0);
  int used = 0, count = 0;
};

// The plain loop: one thread, the given files, one layout. Without a hand-off every batch is
// written into one buffer, reused; with one, each batch goes to the consumer and the next is
// written into memory the consumer has given back.
Tally loop(const std::vector<std::string>& files, Layout layout, HandOff* hand_off = nullptr) {
  Tally t;
  std::vector<std::int64_t> batch;
  auto padded = [&](const std::vector<std::vector<std::int64_t>>& held) {
    pad_batch(held, batch, t);
    if (hand_off) hand_off->push({std::exchange(batch, hand_off->recycled().tokens), {}, {}});
  };
  std::vector<std::vector<std::int64_t>> rows;
  std::vector<std::vector<std::vector<std::int64_t>>> buckets(kBoundaries.size() + 1);
  std::deque<PackedRow> open;
  std::vector<std::int64_t> packed_tokens(kBatch * kRow);
  std::vector<std::int32_t> packed_segments(kBatch * kRow), packed_positions(kBatch * kRow);
  int packed_rows = 0;
  auto emit_packed = [&](PackedRow& r) {
    std::memcpy(packed_tokens.data() + packed_rows * kRow, r.tokens.data(), kRow * sizeof(std::int64_t));
    std::memcpy(packed_segments.data() + packed_rows * kRow, r.segments.data(), kRow * sizeof(std::int32_t));
    std::memcpy(packed_positions.data() + packed_rows * kRow, r.positions.data(), kRow * sizeof(std::int32_t));
    t.tokens += static_cast<std::uint64_t>(r.used);
    t.padding += static_cast<std::uint64_t>(kRow - r.used);
    if (++packed_rows == kBatch) {
      packed_rows = 0;
      if (hand_off) {
        Batch next = hand_off->recycled();
        next.tokens.resize(kBatch * kRow), next.segments.resize(kBatch * kRow), next.positions.resize(kBatch * kRow);
        hand_off->push({std::exchange(packed_tokens, std::move(next.tokens)), std::exchange(packed_segments, std::move(next.segments)),
                        std::exchange(packed_positions, std::move(next.positions))});
      }
    }
  };
  std::vector<std::int64_t> seq;
  auto take = [&](std::vector<std::int64_t>& s) {
    if (layout == Layout::Padded) {
      rows.push_back(s);
      if (rows.size() == kBatch) {
        padded(rows);
        rows.clear();
      }
    } else if (layout == Layout::Bucketed) {
      const auto b = static_cast<std::size_t>(std::upper_bound(kBoundaries.begin(), kBoundaries.end(), static_cast<std::int64_t>(s.size())) - kBoundaries.begin());
      buckets[b].push_back(s);
      if (buckets[b].size() == kBatch) {
        padded(buckets[b]);
        buckets[b].clear();
      }
    } else {
      for (std::size_t from = 0; from < s.size(); from += kRow) {
        const int n = static_cast<int>(std::min<std::size_t>(kRow, s.size() - from));
        PackedRow* row = nullptr;
        for (auto& r : open)
          if (kRow - r.used >= n) {
            row = &r;
            break;
          }
        if (!row) {
          if (open.size() == kOpenRows) {
            emit_packed(open.front());
            open.pop_front();
          }
          open.emplace_back();
          row = &open.back();
        }
        std::memcpy(row->tokens.data() + row->used, s.data() + from, static_cast<std::size_t>(n) * sizeof(std::int64_t));
        ++row->count;
        for (int j = 0; j < n; ++j) {
          row->segments[static_cast<std::size_t>(row->used + j)] = row->count;
          row->positions[static_cast<std::size_t>(row->used + j)] = j;
        }
        row->used += n;
      }
    }
  };
  std::vector<char> chunk(1 << 20);
  std::string carry;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    carry.clear();
    for (;;) {
      const ssize_t got = ::read(fd, chunk.data(), chunk.size());
      if (got <= 0) break;
      carry.append(chunk.data(), static_cast<std::size_t>(got));
      std::size_t at = 0;
      for (std::size_t nl; (nl = carry.find('\n', at)) != std::string::npos; at = nl + 1) {
        seq.clear();
        // The fastest reading we have, split_text's own (a sign, digits read 8 bytes at a time, a
        // check that the token ends there): strtoll costs several times more per token.
        if (!sluice::std_ops::read_plain_integers(std::string_view(carry.data() + at, nl - at), [&seq](std::int64_t v) { seq.push_back(v); }))
          throw std::runtime_error("the token file is damaged");
        take(seq);
      }
      carry.erase(0, at);
    }
    ::close(fd);
  }
  // The iteration's end: what is held leaves.
  if (!rows.empty()) padded(rows);
  for (auto& b : buckets)
    if (!b.empty()) padded(b);
  for (auto& r : open) emit_packed(r);
  if (hand_off && packed_rows > 0) hand_off->push({std::move(packed_tokens), std::move(packed_segments), std::move(packed_positions)});
  return t;
}

// `assembly`: the layout stage's parallelism (threads padding its batches; packing has one), or
// kPerInput: split and layout run per input on the interleave's readers (Stage.per_input), each
// file read, split and batched on one thread as the loop on every core does.
constexpr unsigned kPerInput = 0;
std::string pipeline(const std::string& pattern, Layout layout, unsigned workers, unsigned assembly) {
  const bool per_input = assembly == kPerInput;
  // Per input, a block is one batch of an input; across inputs, 256 lines.
  std::string text = fmt::format(
      "options {{ seed: 1 deterministic: true }}\n"
      "stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
      "stage {{ id: \"lines\" op: \"text_lines\" input: \"files\" parallelism: {w} interleave {{ cycle_length: {w} block_length: {block} }} }}\n"
      "stage {{ id: \"split\" op: \"split_text\" input: \"lines\" {how} params {{ key: \"to\" value: \"int64\" }} }}\n",
      pattern, fmt::arg("w", workers), fmt::arg("block", per_input ? 1 : 256),
      fmt::arg("how", per_input ? "per_input: true" : fmt::format("parallelism: {}", workers)));
  const std::string layout_how = per_input ? "per_input: true" : fmt::format("parallelism: {}", assembly);
  if (layout == Layout::Padded)
    text += fmt::format("stage {{ id: \"layout\" op: \"padded_batch\" input: \"split\" {} params {{ key: \"batch_size\" value: \"{}\" }} }}\n",
                        layout_how, kBatch);
  else if (layout == Layout::Bucketed)
    text += fmt::format(
        "stage {{ id: \"layout\" op: \"bucket_by_sequence_length\" input: \"split\" {how} params {{ key: \"length_field\" value: \"line\" }} "
        "params {{ key: \"boundaries\" value: \"16,32,64\" }} params {{ key: \"batch_sizes\" value: \"{b},{b},{b},{b}\" }} }}\n",
        fmt::arg("b", kBatch), fmt::arg("how", layout_how));
  else
    text += fmt::format(
        "stage {{ id: \"layout\" op: \"pack_sequences\" input: \"split\" {how} params {{ key: \"fields\" value: \"line\" }} "
        "params {{ key: \"length\" value: \"{}\" }} params {{ key: \"open_rows\" value: \"{}\" }} }}\n"
        "stage {{ id: \"batch\" op: \"batch\" input: \"layout\" {how} params {{ key: \"batch_size\" value: \"{}\" }} }}\n",
        kRow, kOpenRows, kBatch, fmt::arg("how", per_input ? "per_input: true" : ""));
  text += fmt::format("stage {{ id: \"out\" op: \"null_sink\" input: \"{}\" }}\n", layout == Layout::Packed ? "batch" : "layout");
  return text;
}

// Runs the pipeline; returns seconds and what its layout stage wrote.
double run_pipeline(const sluice::Registry& registry, const std::string& text, Tally& t) {
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench_sequences"), registry));
  const auto t0 = Clock::now();
  engine.start();
  const auto result = engine.wait();
  const double s = since(t0);
  if (result.state != sluice::RunState::Finished) throw sluice::Error(result.error);
  const auto snap = engine.snapshot();
  for (const auto& st : snap.stage())
    if (st.id() == "layout") t = {st.data_values(), st.padding_values()};
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  const long lines_per_file = argc > 1 ? std::atol(argv[1]) : 200000;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string only = argc > 3 ? argv[3] : "";
  sluice::tune_process_for_streaming();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  sluice::Registry registry;
  registry.load_search_path();

  // One file per core; lengths 1..400, exponential with mean 32 (a long tail past the packed row).
  const fs::path dir = fs::temp_directory_path() / fmt::format("sluice_bench_sequences_{}", ::getpid());
  fs::create_directories(dir);
  std::vector<std::string> files;
  std::uint64_t state = 7, tokens = 0;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (static_cast<double>(state >> 11) + 0.5) / 9007199254740992.0;
  };
  for (unsigned f = 0; f < cores; ++f) {
    files.push_back((dir / fmt::format("tokens{}.txt", f)).string());
    std::ofstream out(files.back());
    std::string line;
    for (long l = 0; l < lines_per_file; ++l) {
      const int n = std::min(400, 1 + static_cast<int>(-std::log(uniform()) * 31));
      line.clear();
      for (int k = 0; k < n; ++k) line += (k ? " " : "") + std::to_string(static_cast<int>(uniform() * 50000));
      out << line << '\n';
      tokens += static_cast<std::uint64_t>(n);
    }
  }
  const std::string pattern = (dir / "tokens*.txt").string();
  fmt::print("{} files of {} lines, {} tokens, {:.1f} MB; batches of {}, packed rows of {} ({} open); best of {} runs\n", cores,
             lines_per_file, tokens, static_cast<double>(fs::file_size(files[0]) * cores) / 1e6, kBatch, kRow, kOpenRows, runs);
  fmt::print("{:<9} {:>6} {:>9} {:>14} {:>14} {:>9} {:>9} {:>9} {:>8} {:>9} {:>14} {:>10} {:>12}\n", "layout", "cores", "assembly",
             "pipeline tok/s", "loop tok/s", "vs loop", "padding", "cpu s", "loop cpu", "per cpu", "handing tok/s", "vs handing",
             "handing/loop");
  for (Layout layout : {Layout::Padded, Layout::Bucketed, Layout::Packed}) {
    for (unsigned workers : {1u, cores}) {
      if (!only.empty() && only != name(layout) && only.rfind(fmt::format("{}:{}", name(layout), workers), 0) != 0) continue;
      // On every core, padding and bucketing also run with their batches assembled on every core
      // (the stage's parallelism), beside the one-thread stage.
      // On every core, every layout also runs per input (each file read, split and batched on one
      // of the interleave's readers: the loop's batches exactly).
      std::vector<unsigned> assemblies{1};
      if (workers > 1 && layout != Layout::Packed) assemblies.push_back(workers);
      if (workers > 1) assemblies.push_back(kPerInput);
      for (unsigned assembly : assemblies) {
      // ONLY may name one assembly too (padded:2:input, bucketed:2:1), for profiling one run.
      const std::string assembly_name = assembly == kPerInput ? std::string("input") : std::to_string(assembly);
      if (std::count(only.begin(), only.end(), ':') == 2 && only != fmt::format("{}:{}:{}", name(layout), workers, assembly_name)) continue;
      double best_loop = 1e9, best_handing = 1e9, best_ours = 1e9, loop_cpu = 1e9, ours_cpu = 1e9;
      Tally ours, mine, handed;
      // A loop per core, each on its own file; with hand_off, each with its consumer thread.
      auto run_loops = [&](bool hand_off, Tally& total) {
        std::vector<Tally> parts(workers);
        std::vector<std::thread> threads;
        for (unsigned c = 0; c < workers; ++c)
          threads.emplace_back([&, c] {
            std::optional<HandOff> consumer;
            if (hand_off) consumer.emplace();
            parts[c] = loop(workers == 1 ? files : std::vector<std::string>{files[c]}, layout, consumer ? &*consumer : nullptr);
          });
        for (auto& th : threads) th.join();
        total = {};
        for (auto& p : parts) total.tokens += p.tokens, total.padding += p.padding;
      };
      for (int r = 0; r < runs; ++r) {
        auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        run_loops(false, mine);
        best_loop = std::min(best_loop, since(t0));
        loop_cpu = std::min(loop_cpu, cpu_seconds() - c0);
        t0 = Clock::now();
        run_loops(true, handed);
        best_handing = std::min(best_handing, since(t0));
        const double c1 = cpu_seconds();
        best_ours = std::min(best_ours, run_pipeline(registry, pipeline(pattern, layout, workers, assembly), ours));
        ours_cpu = std::min(ours_cpu, cpu_seconds() - c1);
      }
      if (ours.tokens != tokens || mine.tokens != tokens || handed.tokens != tokens)
        fmt::print(stderr, "token counts differ: {} written, pipeline {}, loop {}, handing loop {}\n", tokens, ours.tokens, mine.tokens,
                   handed.tokens);
      // Per input, the pipeline makes the loop's batches: the same padding, value for value.
      if (assembly == kPerInput && ours.padding != mine.padding)
        fmt::print(stderr, "padding differs per input: pipeline {}, loop {}\n", ours.padding, mine.padding);
      const double padding = static_cast<double>(ours.padding) / static_cast<double>(ours.padding + ours.tokens);
      fmt::print("{:<9} {:>6} {:>9} {:>14.0f} {:>14.0f} {:>8.0f}% {:>8.1f}% {:>9.2f} {:>8.2f} {:>8.0f}% {:>14.0f} {:>9.0f}% {:>11.0f}%\n",
                 name(layout), workers, assembly_name, tokens / best_ours, tokens / best_loop, 100 * best_loop / best_ours, 100 * padding,
                 ours_cpu, loop_cpu, 100 * loop_cpu / ours_cpu, tokens / best_handing, 100 * best_handing / best_ours,
                 100 * best_loop / best_handing);
      }
    }
  }
  fs::remove_all(dir);
  return 0;
}
