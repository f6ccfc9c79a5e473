// gpu_feed on emulated devices: what a training loop relies on. Every global batch arrives as one
// slice per device, contiguous, disjoint and complete (as the remainder policy says), in batch
// order; a slow device holds the pipeline back without losing anything; slices may be released
// in any order; stop joins; a steady state allocates nothing. Emulated device memory is host
// memory, so the test reads every slice back.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "pipeline_runner.hpp"
#include "sluice/core/report.hpp"

using namespace sluice::test;
using namespace std::chrono_literals;

namespace {

constexpr std::int64_t kWidth = 37;  // bytes per row of the 'row' field: words straddle rows

std::uint8_t pattern_byte(std::int64_t value, std::int64_t k) { return static_cast<std::uint8_t>(1 + (value * 131 + k * 7) % 250); }

struct Received {
  std::uint64_t batch = 0;
  int device = 0;
  std::int64_t first = 0, rows = 0, valid = 0;
  std::vector<std::int64_t> values;  // every row, padding included
  std::vector<std::uint8_t> bytes;   // the 'row' field, every row
};

// range(count) -> row_pattern -> batch -> gpu_feed (external consumer, emulated devices).
std::string feed_pipeline(int count, int batch, int devices, const std::string& split, int depth, const std::string& extra_feed = "",
                          bool drop_remainder = false, const std::string& consume = "external") {
  return stage("src", "range", "", {{"count", std::to_string(count)}}) + stage("rows", "row_pattern", "src") +
         stage("batch", "batch", "rows", {{"batch_size", std::to_string(batch)}, {"drop_remainder", drop_remainder ? "true" : "false"}}) +
         stage("feed", "gpu_feed", "batch",
               {{"emulate", std::to_string(devices)}, {"split", split}, {"depth", std::to_string(depth)}, {"consume", consume}}, extra_feed);
}

// One consumer thread per device: takes every slice, waits for its copies, reads it back,
// releases it. `hold` lets a test intervene per slice (returns false to stop consuming).
struct Consumers {
  std::mutex mutex;
  std::vector<Received> got;
  std::vector<sluice::FeedStatus> last_status;
  std::vector<std::thread> threads;

  void start(sluice::Feed& feed, std::function<void(int, const sluice::FeedSlice&)> before_release = {}) {
    last_status.assign(static_cast<std::size_t>(feed.devices()), sluice::FeedStatus::TimedOut);
    for (int d = 0; d < feed.devices(); ++d)
      threads.emplace_back([this, &feed, d, before_release] {
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        sluice::FeedSlice slice;
        for (;;) {
          auto status = feed.next(d, slice, 50ms);
          if (status == sluice::FeedStatus::TimedOut && std::chrono::steady_clock::now() < deadline) continue;
          if (status != sluice::FeedStatus::Ready) {
            std::lock_guard lock(mutex);
            last_status[static_cast<std::size_t>(d)] = status;
            return;
          }
          feed.wait_ready(slice);
          Received r{slice.batch, slice.device, slice.first_row, slice.rows, slice.valid_rows, {}, {}};
          for (const auto& f : slice.fields) {
            if (f.name == "value") {
              const auto* p = static_cast<const std::int64_t*>(f.data);
              r.values.assign(p, p + slice.rows);
            } else if (f.name == "row") {
              const auto* p = static_cast<const std::uint8_t*>(f.data);
              r.bytes.assign(p, p + f.nbytes);
            }
          }
          if (before_release) before_release(d, slice);
          feed.release(slice);
          std::lock_guard lock(mutex);
          got.push_back(std::move(r));
        }
      });
  }
  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }
};

// Checks what arrived against what the pipeline produced: count values 0..count-1 in batches of
// `batch` rows, split across `devices` by `split`. The expectation is written out here, apart
// from the plugin's own slicing code.
void check_slices(const std::vector<Received>& got, int count, int batch, int devices, const std::string& split) {
  std::map<std::uint64_t, std::vector<const Received*>> by_batch;
  std::vector<std::vector<std::uint64_t>> order(static_cast<std::size_t>(devices));
  for (const auto& r : got) order[static_cast<std::size_t>(r.device)].push_back(r.batch);
  // Per device, batches in order. (Received is appended after release, per thread in order.)
  for (int d = 0; d < devices; ++d) {
    const auto& o = order[static_cast<std::size_t>(d)];
    QVERIFY2(std::is_sorted(o.begin(), o.end()) && std::adjacent_find(o.begin(), o.end()) == o.end(),
             qPrintable(QString("device %1 got batches out of order").arg(d)));
  }
  for (const auto& r : got) by_batch[r.batch].push_back(&r);
  std::set<std::int64_t> seen;
  const int batches = (count + batch - 1) / batch;
  for (int b = 0; b < batches; ++b) {
    const std::int64_t rows_here = std::min(batch, count - b * batch);
    const std::int64_t n = devices, base = rows_here / n, extra = rows_here % n;
    auto it = by_batch.find(static_cast<std::uint64_t>(b));
    if (split == "drop" && base == 0) {
      QVERIFY2(it == by_batch.end(), qPrintable(QString("batch %1 of %2 rows should be skipped on %3 devices").arg(b).arg(rows_here).arg(n)));
      continue;
    }
    QVERIFY2(it != by_batch.end(), qPrintable(QString("batch %1 never arrived").arg(b)));
    auto slices = it->second;
    QCOMPARE(int(slices.size()), devices);  // every device, once
    std::sort(slices.begin(), slices.end(), [](auto* a, auto* c) { return a->device < c->device; });
    std::int64_t next_first = 0;
    for (int d = 0; d < devices; ++d) {
      const Received& r = *slices[static_cast<std::size_t>(d)];
      QCOMPARE(r.device, d);
      QCOMPARE(r.first, next_first);  // contiguous, in device order
      std::int64_t want_rows = base, want_valid = base;
      if (split == "pad") {
        want_rows = base + (extra ? 1 : 0);
        want_valid = std::clamp<std::int64_t>(rows_here - d * want_rows, 0, want_rows);
      } else if (split == "uneven") {
        want_rows = want_valid = base + (d < extra ? 1 : 0);
      }
      QCOMPARE(r.rows, want_rows);
      QCOMPARE(r.valid, want_valid);
      QCOMPARE(std::int64_t(r.values.size()), r.rows);
      QCOMPARE(std::int64_t(r.bytes.size()), r.rows * kWidth);
      for (std::int64_t row = 0; row < r.rows; ++row) {
        const std::int64_t value = b * batch + r.first + row;
        if (row < r.valid) {
          QCOMPARE(r.values[static_cast<std::size_t>(row)], value);
          QVERIFY(seen.insert(value).second);  // disjoint
          for (std::int64_t k = 0; k < kWidth; ++k)
            if (r.bytes[static_cast<std::size_t>(row * kWidth + k)] != pattern_byte(value, k))
              QFAIL(qPrintable(QString("batch %1 device %2 row %3 byte %4 differs").arg(b).arg(d).arg(row).arg(k)));
        } else {  // padding: zeros
          QCOMPARE(r.values[static_cast<std::size_t>(row)], std::int64_t(0));
          for (std::int64_t k = 0; k < kWidth; ++k) QCOMPARE(int(r.bytes[static_cast<std::size_t>(row * kWidth + k)]), 0);
        }
      }
      next_first += r.valid;
    }
    if (split != "drop") QCOMPARE(next_first, rows_here);  // complete
    else QCOMPARE(next_first, base * n);                  // only the last rows_here mod n dropped
  }
  QVERIFY(by_batch.empty() || int(by_batch.rbegin()->first) < batches);  // nothing beyond the data
}

struct FeedRun {
  std::unique_ptr<sluice::Engine> engine;
  sluice::Feed* feed = nullptr;
  explicit FeedRun(const std::string& text) {
    engine = std::make_unique<sluice::Engine>(graph_of(text));
    engine->start();
    feed = engine->feed("feed");
  }
};

const sluice::metrics::StageMetrics& stage_of(const sluice::metrics::MetricsSnapshot& snap, const std::string& id) {
  for (const auto& s : snap.stage())
    if (s.id() == id) return s;
  throw std::runtime_error("no stage " + id);
}

}  // namespace

class TestGpuFeed : public QObject {
  Q_OBJECT
 private slots:
  void slices_are_disjoint_complete_and_in_order() {
    QFETCH(QString, split);
    QFETCH(int, devices);
    // 203 rows in batches of 20: the last batch has 3 rows, fewer than 8 devices.
    FeedRun run(feed_pipeline(203, 20, devices, split.toStdString(), 3));
    QCOMPARE(run.feed->devices(), devices);
    QVERIFY(run.feed->emulated());
    Consumers consumers;
    consumers.start(*run.feed);
    consumers.join();
    auto result = run.engine->wait();
    QCOMPARE(result.state, sluice::RunState::Finished);
    for (auto status : consumers.last_status) QCOMPARE(status, sluice::FeedStatus::End);
    check_slices(consumers.got, 203, 20, devices, split.toStdString());
  }
  void slices_are_disjoint_complete_and_in_order_data() {
    QTest::addColumn<QString>("split");
    QTest::addColumn<int>("devices");
    for (const char* split : {"drop", "pad", "uneven"})
      for (int devices : {1, 2, 3, 8}) QTest::addRow("%s/%d", split, devices) << QString(split) << devices;
  }

  void repeated_ordinals_are_separate_logical_devices() {
    FeedRun run(feed_pipeline(100, 10, 2, "uneven", 2, "params { key: \"devices\" value: \"1,1,0\" }"));
    QCOMPARE(run.feed->devices(), 3);
    Consumers consumers;
    consumers.start(*run.feed);
    consumers.join();
    QCOMPARE(run.engine->wait().state, sluice::RunState::Finished);
    check_slices(consumers.got, 100, 10, 3, "uneven");
    auto snap = run.engine->snapshot();
    const auto& feed = stage_of(snap, "feed");
    QCOMPARE(feed.devices_size(), 3);
    QCOMPARE(feed.devices(0).name(), std::string("emulated:1"));
    QCOMPARE(feed.devices(2).name(), std::string("emulated:0"));
  }

  void slow_device_back_pressures_without_loss() {
    // Device 1 takes its first `depth` slices and holds them: its ring is full, so the feed can
    // fill no more slots for it and the whole pipeline waits, device 0 included.
    constexpr int kDepth = 2, kRows = 20000, kBatches = kRows / 8;
    FeedRun run(feed_pipeline(kRows, 8, 2, "drop", kDepth));
    std::vector<sluice::FeedSlice> held(kDepth);
    for (auto& s : held) QCOMPARE(run.feed->next(1, s, 5s), sluice::FeedStatus::Ready);
    sluice::FeedSlice extra;
    QCOMPARE(run.feed->next(1, extra, 300ms), sluice::FeedStatus::TimedOut);
    int device0 = 0;
    for (sluice::FeedSlice s; run.feed->next(0, s, 300ms) == sluice::FeedStatus::Ready;) {
      ++device0;
      run.feed->release(s);
    }
    // Batches 0 and 1 on both devices, and batch 2 on device 0 before the feed waits for device 1.
    QCOMPARE(device0, kDepth + 1);
    auto snap = run.engine->snapshot();
    const auto& feed = stage_of(snap, "feed");
    QCOMPARE(feed.devices(1).ring_level(), std::uint32_t(kDepth));
    QCOMPARE(feed.devices(1).ring_capacity(), std::uint32_t(kDepth));
    // Bounded buffers: the source waits too (its buffer and the batches' hold a few thousand rows).
    QVERIFY(stage_of(snap, "src").elements_out() < kRows / 2);

    // Let go: everything else arrives, nothing lost.
    Consumers consumers;
    std::vector<Received> early;
    for (auto& s : held) {
      run.feed->wait_ready(s);
      Received r{s.batch, s.device, s.first_row, s.rows, s.valid_rows, {}, {}};
      for (const auto& f : s.fields) {
        if (f.name == "value") r.values.assign(static_cast<const std::int64_t*>(f.data), static_cast<const std::int64_t*>(f.data) + s.rows);
        if (f.name == "row") r.bytes.assign(static_cast<const std::uint8_t*>(f.data), static_cast<const std::uint8_t*>(f.data) + f.nbytes);
      }
      early.push_back(std::move(r));
      run.feed->release(s);
    }
    consumers.start(*run.feed);
    consumers.join();
    QCOMPARE(run.engine->wait().state, sluice::RunState::Finished);
    // Device 0's first three batches were released above without being read: check the rest.
    std::vector<Received> all = early;
    for (auto& r : consumers.got) all.push_back(r);
    std::set<std::pair<int, std::uint64_t>> delivered;
    for (auto& r : all) QVERIFY(delivered.insert({r.device, r.batch}).second);
    QCOMPARE(int(all.size()) + device0, 2 * kBatches);
    for (auto& r : all)
      for (std::int64_t row = 0; row < r.valid; ++row)
        QCOMPARE(r.values[static_cast<std::size_t>(row)], std::int64_t(r.batch * 8 + r.first + row));
  }

  void release_in_any_order() {
    constexpr int kDepth = 4;
    FeedRun run(feed_pipeline(160, 10, 1, "drop", kDepth));
    std::vector<Received> got;
    const int order[kDepth] = {2, 0, 3, 1};
    for (bool done = false; !done;) {
      std::vector<sluice::FeedSlice> hand;
      for (int i = 0; i < kDepth; ++i) {
        sluice::FeedSlice s;
        auto status = run.feed->next(0, s, 5s);
        if (status == sluice::FeedStatus::End) {
          done = true;
          break;
        }
        QCOMPARE(status, sluice::FeedStatus::Ready);
        hand.push_back(s);
      }
      if (hand.size() < kDepth) {
        for (auto& s : hand) run.feed->release(s);
        break;
      }
      for (int i : order) {
        auto& s = hand[static_cast<std::size_t>(i)];
        run.feed->wait_ready(s);
        Received r{s.batch, 0, s.first_row, s.rows, s.valid_rows, {}, {}};
        r.values.assign(static_cast<const std::int64_t*>(s.fields[0].data), static_cast<const std::int64_t*>(s.fields[0].data) + s.rows);
        got.push_back(r);
        run.feed->release(s);
      }
      // A slice is released once; the second time is an error, not a corrupted ring.
      QVERIFY_THROWS_EXCEPTION(sluice::Error, run.feed->release(hand[0]));
    }
    QCOMPARE(run.engine->wait().state, sluice::RunState::Finished);
    QCOMPARE(int(got.size()), 16);
    std::sort(got.begin(), got.end(), [](auto& a, auto& b) { return a.batch < b.batch; });
    for (std::size_t b = 0; b < got.size(); ++b) {
      QCOMPARE(got[b].batch, std::uint64_t(b));
      for (std::int64_t row = 0; row < 10; ++row) QCOMPARE(got[b].values[static_cast<std::size_t>(row)], std::int64_t(b * 10 + row));
    }
  }

  void stop_during_a_run_joins_cleanly() {
    // Nobody takes the slices: the feed waits for a free slot until stop() reaches it.
    FeedRun run(feed_pipeline(100000, 16, 2, "drop", 2));
    sluice::FeedSlice s;
    QCOMPARE(run.feed->next(0, s, 5s), sluice::FeedStatus::Ready);  // running, and then stuck
    std::this_thread::sleep_for(100ms);
    const auto t0 = std::chrono::steady_clock::now();
    run.engine->stop();
    auto result = run.engine->wait();
    QVERIFY(std::chrono::steady_clock::now() - t0 < 5s);
    QCOMPARE(result.state, sluice::RunState::Stopped);
    QCOMPARE(run.feed->next(1, s, 1s), sluice::FeedStatus::Stopped);
    run.engine.reset();  // every slot, thread and event freed (ASan checks)
  }

  void stop_while_consumers_run_joins_cleanly() {
    FeedRun run(feed_pipeline(1000000, 16, 3, "pad", 3));
    Consumers consumers;
    consumers.start(*run.feed);
    std::this_thread::sleep_for(200ms);
    run.engine->stop();
    consumers.join();
    QCOMPARE(run.engine->wait().state, sluice::RunState::Stopped);
    for (auto status : consumers.last_status) QCOMPARE(status, sluice::FeedStatus::Stopped);
    QVERIFY(!consumers.got.empty());
  }

  void steady_state_allocates_nothing() {
    // The batch is assembled straight into the feed's pinned pool (nothing staged), each device
    // slot is allocated once, and pinned blocks are reused: what is ever allocated is bounded by
    // the buffers between source and devices, not by the length of the run (300 batches, two
    // fields each).
    constexpr int kBatches = 300, kDepth = 3, kDevices = 2, kBuffer = 4;
    auto text = stage("src", "range", "", {{"count", std::to_string(kBatches * 64)}}) + stage("rows", "row_pattern", "src") +
                stage("batch", "batch", "rows", {{"batch_size", "64"}, {"drop_remainder", "true"}},
                      "buffer_size: " + std::to_string(kBuffer)) +
                stage("feed", "gpu_feed", "batch",
                      {{"emulate", std::to_string(kDevices)}, {"depth", std::to_string(kDepth)}, {"consume", "external"}});
    FeedRun run(text);
    for (int b = 0; b < kBatches; ++b)
      for (int d = 0; d < kDevices; ++d) {
        sluice::FeedSlice s;
        QCOMPARE(run.feed->next(d, s, 10s), sluice::FeedStatus::Ready);
        run.feed->release(s);
      }
    QCOMPARE(run.engine->wait().state, sluice::RunState::Finished);
    auto a = run.feed->allocations();
    QCOMPARE(a.staged_batches, std::uint64_t(0));
    QCOMPARE(a.device_buffers, std::uint64_t(kDevices * kDepth));
    // Batches alive at once, at most: those the map builds ahead into their rows (the batch's
    // limit, 8), the batch's output buffer, the chunk in the feed's hand (at most the buffer), and
    // those the ring's slots keep until their copies end (depth, plus the one being split).
    const std::uint64_t bound = 2 * (8 + kBuffer + kBuffer + kDepth + 1);
    QVERIFY2(a.pinned_fresh <= bound, qPrintable(QString("%1 pinned blocks made, bound %2").arg(a.pinned_fresh).arg(bound)));
    QCOMPARE(a.pinned_fresh + a.pinned_reused, std::uint64_t(kBatches * 2));
  }

  void checksum_mode_checks_every_slice() {
    auto out = run_text(feed_pipeline(500, 32, 3, "pad", 2, "", false, "checksum"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    const auto& feed = stage_of(out.snapshot, "feed");
    QCOMPARE(feed.devices_size(), 3);
    for (const auto& d : feed.devices()) {
      QCOMPARE(d.slices(), std::uint64_t(16));
      QCOMPARE(d.checked_slices(), std::uint64_t(16));
      QCOMPARE(d.ring_capacity(), std::uint32_t(2));
    }
    // Bytes copied: every valid row of both fields (value i64, row 37 bytes).
    std::uint64_t bytes = 0;
    for (const auto& d : feed.devices()) bytes += d.bytes();
    QCOMPARE(bytes, std::uint64_t(500 * (8 + kWidth)));
    // Every copy timed on its device (the emulated stream's clock): all of its bytes, in less time
    // than the run took.
    for (const auto& d : feed.devices()) {
      QVERIFY2(d.copy_seconds() > 0 && d.copy_seconds() < out.snapshot.elapsed_s(), qPrintable(QString::number(d.copy_seconds())));
      QVERIFY(std::abs(d.copy_bytes_per_s() * d.copy_seconds() - double(d.bytes())) < 1e-6 * double(d.bytes()));
    }
    auto report = sluice::format_report(out.snapshot);
    QVERIFY2(report.find("emulated:2") != std::string::npos, report.c_str());
  }

  void device_check_pipeline_runs_emulated() {
    // The pipeline scripts/device/gpu_feed.sh runs on GPUs: here on 4 emulated devices.
    auto doc = sluice::read_pipeline_file(std::string(SLUICE_SOURCE_DIR) + "/resources/pipelines/gpu_feed_checksum.txtpb");
#ifdef SLUICE_SANITIZED
    // A quarter of its 32 batches under the sanitizers: the same code runs, and checksumming 300 MB
    // took 47 s under ThreadSanitizer.
    const std::uint64_t batches = 8;
#else
    const std::uint64_t batches = 32;  // 1984 images in batches of 62, as the file says
#endif
    auto out = run_document(doc, {"feed.emulate=4", "feed.devices=0,1,2,3", "src.count=" + std::to_string(batches * 62)});
    QVERIFY2(out.result.state == sluice::RunState::Finished, (out.error + out.result.error).c_str());
    const auto& feed = stage_of(out.snapshot, "feed");
    QCOMPARE(feed.devices_size(), 4);
    for (const auto& d : feed.devices()) {
      QCOMPARE(d.slices(), batches);
      QCOMPARE(d.checked_slices(), batches);
    }
  }

  void simulated_steps_run_on_every_device() {
    auto out = run_text(feed_pipeline(64 * 20, 64, 2, "drop", 2, "params { key: \"step_us\" value: \"2000\" }", true, "simulate_step_us"));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    const auto& feed = stage_of(out.snapshot, "feed");
    for (const auto& d : feed.devices()) {
      QCOMPARE(d.slices(), std::uint64_t(20));
      // The copies' time is their own: a slot's next copies wait for the step reading it (the
      // ring is 2 deep, the steps 40 ms in all), and that wait is not counted.
      QVERIFY2(d.copy_seconds() > 0 && d.copy_seconds() < 20 * 2000e-6 / 2, qPrintable(QString::number(d.copy_seconds())));
    }
    // The steps ran, in order, on each device: all but the ring's last 2, which the feed's finish
    // waits for after the run's clock stopped.
    QVERIFY2(out.snapshot.elapsed_s() >= (20 - 2) * 2000e-6, qPrintable(QString::number(out.snapshot.elapsed_s())));
  }

  void missing_gpu_is_a_clear_error() {
    auto out = run_text(stage("src", "range", "", {{"count", "8"}}) + stage("batch", "batch", "src", {{"batch_size", "4"}}) +
                        stage("feed", "gpu_feed", "batch"));
    if (out.result.state == sluice::RunState::Finished) QSKIP("this machine has a CUDA device");
    const std::string& e = out.error.empty() ? out.result.error : out.error;
    QVERIFY2(e.find("stage 'feed' (gpu_feed) could not start") != std::string::npos, e.c_str());
    QVERIFY2(e.find("emulate: N") != std::string::npos, e.c_str());
  }

  void bad_devices_are_named() {
    auto out = run_text(stage("src", "range", "", {{"count", "8"}}) + stage("batch", "batch", "src", {{"batch_size", "4"}}) +
                        stage("feed", "gpu_feed", "batch", {{"devices", "0,x"}, {"emulate", "2"}}));
    QVERIFY2(out.error.find("feed") != std::string::npos && out.error.find("devices") != std::string::npos &&
                 out.error.find("'x' is not a device ordinal") != std::string::npos,
             out.error.c_str());
    out = run_text(stage("src", "range", "", {{"count", "8"}}) + stage("batch", "batch", "src", {{"batch_size", "4"}}) +
                   stage("feed", "gpu_feed", "batch", {{"devices", "0,5"}, {"emulate", "2"}}));
    const std::string& e = out.error.empty() ? out.result.error : out.error;
    QVERIFY2(e.find("device 5 does not exist") != std::string::npos && e.find("emulate") != std::string::npos, e.c_str());
  }

  void batches_without_numeric_fields_are_refused() {
    auto out = run_text(stage("src", "from_list", "", {{"values", "a,b,c,d"}, {"dtype", "bytes"}}) +
                        stage("batch", "batch", "src", {{"batch_size", "2"}}) + stage("feed", "gpu_feed", "batch", {{"emulate", "1"}}));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("no numeric field") != std::string::npos, out.result.error.c_str());
    out = run_text(stage("src", "range", "", {{"count", "8"}}) + stage("feed", "gpu_feed", "src", {{"emulate", "1"}}));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("put a `batch` stage before the feed") != std::string::npos, out.result.error.c_str());
  }

  void feed_of_another_stage_is_an_error() {
    FeedRun run(feed_pipeline(40, 10, 1, "drop", 2, "", false, "none"));
    QVERIFY_THROWS_EXCEPTION(sluice::Error, run.engine->feed("batch"));
    QVERIFY_THROWS_EXCEPTION(sluice::Error, run.engine->feed("nope"));
    sluice::FeedSlice s;
    QVERIFY_THROWS_EXCEPTION(sluice::Error, run.feed->next(0, s, 10ms));  // consume: none reads its own slices
    QCOMPARE(run.engine->wait().state, sluice::RunState::Finished);
  }
};

QTEST_APPLESS_MAIN(TestGpuFeed)
#include "tst_gpu_feed.moc"
