// Small records against a plain loop doing the same work, in the same run: one TFRecord file of
// tf.Examples, read -> parse_example -> batch 1024 -> null_sink, and a single-thread C++ loop that
// reads the file, checks both masked CRC-32C of every record, walks the Example wire format for
// the features and appends them to batch arrays of 1024 (the loop also on every core, each thread
// over its share of the records). Two schemas: `ints` (id and label, int64: 49-byte Examples)
// and `wide` (20 float features and one 100-byte bytes feature). The pipeline runs with chunks
// (the default) on one worker and on every core, and element by element on one worker for
// reference. Prints records/s, CPU seconds and the ratios.
// Usage: bench_small_records [RECORDS] [RUNS] [ONLY]; ONLY (for profiling) names the contenders
// to run, comma-separated: loop1, loopn, ours1, oursn, element1.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "crc32c.hpp"
#include "bench_clock.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/spec.hpp"
#include "tfrecord.hpp"

namespace fs = std::filesystem;

namespace {
using sluice::bench::Clock;
using sluice::bench::cpu_seconds;
using sluice::bench::since;

constexpr std::size_t kBatch = 1024, kFloats = 20, kPayload = 100;

enum class Schema { Ints, Wide };
const char* name(Schema s) { return s == Schema::Ints ? "ints" : "wide"; }

// ---- writing the file (protobuf wire format by hand) ----
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_len(std::string& out, int field, const std::string& payload) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | 2);
  put_varint(out, payload.size());
  out += payload;
}
std::string entry(const std::string& key, const std::string& feature) {
  std::string e;
  put_len(e, 1, key);
  put_len(e, 2, feature);
  return e;
}
std::string int64_feature(std::int64_t v) {
  std::string packed, list, feature;
  put_varint(packed, static_cast<std::uint64_t>(v));
  put_len(list, 1, packed);
  put_len(feature, 3, list);
  return feature;
}
std::string float_feature(float v) {
  std::string packed(4, '\0'), list, feature;
  std::memcpy(packed.data(), &v, 4);
  put_len(list, 1, packed);
  put_len(feature, 2, list);
  return feature;
}
std::string bytes_feature(const std::string& v) {
  std::string list, feature;
  put_len(list, 1, v);
  put_len(feature, 1, list);
  return feature;
}
std::string example(Schema schema, std::uint64_t i) {
  std::string features;
  if (schema == Schema::Ints) {
    // Hashed 64-bit ids and labels (negative: 10-byte varints), which make 49-byte Examples as
    // in the file.
    std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    put_len(features, 1, entry("id", int64_feature(static_cast<std::int64_t>(h | (1ull << 63)))));
    put_len(features, 1, entry("label", int64_feature(-static_cast<std::int64_t>(i % 1000) - 1)));
  } else {
    for (std::size_t k = 0; k < kFloats; ++k)
      put_len(features, 1, entry("f" + std::to_string(k), float_feature(static_cast<float>(i % 997) * 0.5f + static_cast<float>(k))));
    std::string payload(kPayload, static_cast<char>('a' + i % 26));
    put_len(features, 1, entry("payload", bytes_feature(payload)));
  }
  std::string out;
  put_len(out, 1, features);
  return out;
}

// Writes the file; returns the byte offsets where each thread's share of the records starts.
std::vector<std::uint64_t> write_file(const std::string& path, Schema schema, std::uint64_t records, unsigned shares,
                                      std::size_t& example_bytes) {
  std::ofstream out(path, std::ios::binary);
  std::string block;
  std::vector<std::uint64_t> starts;
  std::uint64_t at = 0;
  for (std::uint64_t i = 0; i < records; ++i) {
    if (starts.size() < shares && i >= records * starts.size() / shares) starts.push_back(at + block.size());
    const std::string e = example(schema, i);
    example_bytes = e.size();
    sluice::io::append_record(block, e.data(), e.size());
    if (block.size() > (1u << 20)) {
      out << block;
      at += block.size();
      block.clear();
    }
  }
  out << block;
  at += block.size();
  starts.push_back(at);
  return starts;
}

// ---- the plain loop ----
struct Wire {
  const std::uint8_t* p;
  const std::uint8_t* end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      const std::uint8_t b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("bad varint");
  }
  // A length-delimited field: its number, and its bytes in [data, data + size).
  bool next(std::uint32_t& field, const std::uint8_t*& data, std::size_t& size) {
    if (p >= end) return false;
    const std::uint64_t key = varint();
    if ((key & 7) != 2) throw std::runtime_error("unexpected wire type");
    field = static_cast<std::uint32_t>(key >> 3);
    size = static_cast<std::size_t>(varint());
    if (size > static_cast<std::size_t>(end - p)) throw std::runtime_error("field past the end");
    data = p;
    p += size;
    return true;
  }
};

struct LoopBatch {
  std::vector<std::int64_t> id, label;
  std::vector<float> floats;            // [batch, 20]
  std::vector<char> payload;            // concatenated
  std::vector<std::uint64_t> offsets;   // [batch + 1]
  std::size_t rows = 0;
  std::uint64_t batches = 0, records = 0, checksum = 0;
  LoopBatch() : id(kBatch), label(kBatch), floats(kBatch * kFloats), payload(kBatch * kPayload), offsets(kBatch + 1) {}
  void emit() {
    checksum += rows;
    ++batches;
    rows = 0;
  }
};

// The Example's features for one record into row `b.rows`.
void loop_example(Schema schema, const std::uint8_t* data, std::size_t size, LoopBatch& b) {
  Wire top{data, data + size};
  std::uint32_t field;
  const std::uint8_t* body;
  std::size_t length;
  const std::size_t row = b.rows;
  if (schema == Schema::Wide) b.offsets[row + 1] = b.offsets[row];
  while (top.next(field, body, length)) {
    if (field != 1) continue;
    Wire features{body, body + length};
    const std::uint8_t* e;
    std::size_t e_size;
    while (features.next(field, e, e_size)) {
      Wire entry{e, e + e_size};
      std::string_view key;
      const std::uint8_t* value = nullptr;
      std::size_t value_size = 0;
      const std::uint8_t* d;
      std::size_t n;
      while (entry.next(field, d, n)) {
        if (field == 1) key = {reinterpret_cast<const char*>(d), n};
        else if (field == 2) value = d, value_size = n;
      }
      Wire feature{value, value + value_size};
      std::uint32_t kind;
      const std::uint8_t* list;
      std::size_t list_size;
      if (!feature.next(kind, list, list_size)) throw std::runtime_error("empty feature");
      Wire values{list, list + list_size};
      const std::uint8_t* v;
      std::size_t v_size;
      if (!values.next(field, v, v_size)) throw std::runtime_error("empty list");
      if (kind == 3) {  // int64 list, packed
        Wire packed{v, v + v_size};
        const auto x = static_cast<std::int64_t>(packed.varint());
        if (key == "id") b.id[row] = x;
        else if (key == "label") b.label[row] = x;
      } else if (kind == 2) {  // float list, packed
        if (key.size() < 2 || key.size() > 3 || key[0] != 'f' || v_size != 4) throw std::runtime_error("unexpected float feature");
        std::size_t k = 0;
        for (char c : key.substr(1)) k = k * 10 + static_cast<std::size_t>(c - '0');
        if (k >= kFloats) throw std::runtime_error("unexpected float feature");
        std::memcpy(&b.floats[row * kFloats + k], v, 4);
      } else if (kind == 1) {  // bytes list
        std::memcpy(b.payload.data() + b.offsets[row], v, v_size);
        b.offsets[row + 1] = b.offsets[row] + v_size;
      }
    }
  }
  ++b.records;
  if (++b.rows == kBatch) {
    b.emit();
    b.offsets[0] = 0;
  }
}

// Reads bytes [begin, end) of the file record by record, CRCs checked.
LoopBatch plain_loop(const std::string& path, Schema schema, std::uint64_t begin, std::uint64_t end) {
  LoopBatch b;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::vector<std::uint8_t> buffer(4u << 20);
  std::size_t have = 0, at = 0;
  std::uint64_t offset = begin;
  while (offset < end) {
    if (have - at < 12 || have - at < 16 + [&] { std::uint64_t n; std::memcpy(&n, &buffer[at], 8); return n; }()) {
      std::memmove(buffer.data(), buffer.data() + at, have - at);
      have -= at;
      at = 0;
      const ssize_t got = ::pread(fd, buffer.data() + have, buffer.size() - have, static_cast<off_t>(offset + have));
      if (got <= 0) throw std::runtime_error("file ends early");
      have += static_cast<std::size_t>(got);
      continue;
    }
    std::uint64_t length;
    std::memcpy(&length, &buffer[at], 8);
    std::uint32_t length_crc, data_crc;
    std::memcpy(&length_crc, &buffer[at + 8], 4);
    std::memcpy(&data_crc, &buffer[at + 12 + length], 4);
    if (sluice::io::mask_crc(sluice::io::crc32c(&buffer[at], 8)) != length_crc ||
        sluice::io::mask_crc(sluice::io::crc32c(&buffer[at + 12], length)) != data_crc)
      throw std::runtime_error("CRC mismatch");
    loop_example(schema, &buffer[at + 12], length, b);
    at += 16 + length;
    offset += 16 + length;
  }
  ::close(fd);
  if (b.rows > 0) b.emit();
  return b;
}

std::string pipeline(const std::string& path, Schema schema, unsigned workers) {
  std::string features = "id:int64, label:int64";
  if (schema == Schema::Wide) {
    features.clear();
    for (std::size_t k = 0; k < kFloats; ++k) features += fmt::format("f{}:float, ", k);
    features += "payload:bytes";
  }
  return fmt::format(
      "options {{ seed: 1 deterministic: true }}\n"
      "stage {{ id: \"files\" op: \"list_files\" params {{ key: \"patterns\" value: \"{}\" }} }}\n"
      "stage {{ id: \"read\" op: \"tfrecord_reader\" input: \"files\" }}\n"
      "stage {{ id: \"parse\" op: \"parse_example\" input: \"read\" parallelism: {} params {{ key: \"features\" value: \"{}\" }} }}\n"
      "stage {{ id: \"batch\" op: \"batch\" input: \"parse\" params {{ key: \"batch_size\" value: \"{}\" }} }}\n"
      "stage {{ id: \"out\" op: \"null_sink\" input: \"batch\" }}\n",
      path, workers, features, kBatch);
}

struct Run {
  double seconds = 0, cpu = 0;
};

Run run_pipeline(const sluice::Registry& registry, const std::string& text, bool chunks, std::uint64_t records, bool lineage = false) {
  sluice::EngineOptions options;
  options.chunks = chunks;
  options.lineage = lineage;  // every record stamped, every batch naming its rows, the sink's ledger
  sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "bench_small_records"), registry), options);
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  engine.start();
  const auto result = engine.wait();
  Run r{since(t0), cpu_seconds() - c0};
  if (result.state != sluice::RunState::Finished) throw sluice::Error(result.error);
  const auto snapshot = engine.snapshot();
  for (const auto& st : snapshot.stage())
    if (st.id() == "batch" && st.elements_in() != records)
      throw std::runtime_error(fmt::format("the batch stage took {} records of {}", st.elements_in(), records));
  return r;
}

Run run_loop(const std::string& path, Schema schema, const std::vector<std::uint64_t>& starts, unsigned threads, std::uint64_t records) {
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  std::vector<LoopBatch> results(threads);
  std::vector<std::thread> pool;
  const std::size_t shares = starts.size() - 1;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const std::size_t first = shares * t / threads, last = shares * (t + 1) / threads;
      results[t] = plain_loop(path, schema, starts[first], starts[last]);
    });
  for (auto& th : pool) th.join();
  Run r{since(t0), cpu_seconds() - c0};
  std::uint64_t seen = 0;
  for (const auto& b : results) seen += b.records;
  if (seen != records) throw std::runtime_error(fmt::format("the loop read {} records of {}", seen, records));
  return r;
}
}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t records = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1'000'000;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string only = argc > 3 ? argv[3] : "loop1,loopn,ours1,oursn,element1,lineage1";
  auto wanted = [&](const char* what) { return ("," + only + ",").find(std::string(",") + what + ",") != std::string::npos; };
  sluice::tune_process_for_streaming();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  sluice::Registry registry;
  registry.load_search_path();
  const fs::path dir = fs::temp_directory_path() / fmt::format("sluice_bench_small_records_{}", ::getpid());
  fs::create_directories(dir);
  fmt::print("{} records per file, {} cores, CRC-32C with SSE4.2: {}, best of {} runs each\n", records, cores,
             sluice::io::crc32c_uses_sse42() ? "yes" : "no", runs);
  fmt::print("{:<6} {:<28} {:>10} {:>12} {:>9} {:>14}\n", "schema", "what", "seconds", "records/s", "cpu s", "vs loop");
  int status = 0;
  for (Schema schema : {Schema::Ints, Schema::Wide}) {
    const std::string path = (dir / fmt::format("{}.tfrecord", name(schema))).string();
    std::size_t example_bytes = 0;
    const auto starts = write_file(path, schema, records, std::max(cores, 1u) * 4, example_bytes);
    // Read once so that every contender finds the file in the page cache.
    run_loop(path, schema, starts, 1, records);
    Run loop1{1e9, 0}, loopn{1e9, 0}, ours1{1e9, 0}, oursn{1e9, 0}, element1{1e9, 0}, lineage1{1e9, 0};
    auto best = [](Run& b, Run r) {
      if (r.seconds < b.seconds) b = r;
    };
    for (int k = 0; k < runs; ++k) {
      if (wanted("loop1")) best(loop1, run_loop(path, schema, starts, 1, records));
      if (wanted("loopn")) best(loopn, run_loop(path, schema, starts, cores, records));
      if (wanted("ours1")) best(ours1, run_pipeline(registry, pipeline(path, schema, 1), true, records));
      if (wanted("oursn")) best(oursn, run_pipeline(registry, pipeline(path, schema, cores), true, records));
      if (wanted("element1")) best(element1, run_pipeline(registry, pipeline(path, schema, 1), false, records));
      if (wanted("lineage1")) best(lineage1, run_pipeline(registry, pipeline(path, schema, 1), true, records, true));
    }
    auto row = [&](const std::string& what, const Run& r, const Run* base) {
      if (r.seconds >= 1e9) return;  // not run (ONLY)
      if (base && base->seconds >= 1e9) base = nullptr;
      const double rate = static_cast<double>(records) / r.seconds;
      fmt::print("{:<6} {:<28} {:>10.3f} {:>12.0f} {:>9.3f} {:>14}\n", name(schema), what, r.seconds, rate, r.cpu,
                 base ? fmt::format("{:.1f}%", 100.0 * base->seconds / r.seconds) : std::string("-"));
    };
    fmt::print("{:<6} ({}-byte Examples, {:.1f} MB file)\n", name(schema), example_bytes, static_cast<double>(fs::file_size(path)) / 1e6);
    row("plain loop, 1 core", loop1, nullptr);
    row(fmt::format("plain loop, {} cores", cores), loopn, nullptr);
    row("pipeline, 1 worker", ours1, &loop1);
    row(fmt::format("pipeline, {} workers", cores), oursn, &loopn);
    row("pipeline element-wise, 1 w.", element1, &loop1);
    row("pipeline + lineage, 1 w.", lineage1, &loop1);
    if (ours1.seconds < 1e9 && lineage1.seconds < 1e9)
      fmt::print("{:<6} lineage and ledger on: {:.1f}% of the pipeline's rate without\n", name(schema), 100.0 * ours1.seconds / lineage1.seconds);
    fs::remove(path);
  }
  fs::remove_all(dir);
  return status;
}
