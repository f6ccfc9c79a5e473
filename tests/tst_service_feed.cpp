// The service's trainer side in this process (core/service/): a dispatcher and a worker of the
// library itself, and a pipeline whose distributed batch goes straight into a gpu_feed (emulated
// devices). What the worker sends is received into the feed's pinned pool, never staged again,
// and every batch of the epoch arrives, half on each device.
#include <QtTest>

#include <set>

#include "pipeline_runner.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/feed.hpp"
#include "sluice/service/service.hpp"

using sluice::test::stage;

class TestServiceFeed : public QObject {
  Q_OBJECT
 private slots:
  void batches_arrive_in_the_feeds_pinned_memory() {
    sluice::Registry registry;
    registry.load_search_path({std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"});
    sluice::service::add_service_operators(registry);
    sluice::service::Dispatcher dispatcher(sluice::service::DispatcherOptions{});
    sluice::service::WorkerOptions worker_options;
    worker_options.dispatcher = dispatcher.address();
    worker_options.registry = &registry;
    for (const auto& op : registry.operators()) worker_options.operators.push_back(op->info.name);
    sluice::service::Worker worker(worker_options);

    constexpr int kBatches = 40, kRows = 64, kDevices = 2;
    std::string batch = stage("batch", "batch", "rows", {{"batch_size", std::to_string(kRows)}, {"drop_remainder", "true"}});
    batch.insert(batch.rfind('}'), " distribute { service: \"grpc://" + dispatcher.address() + "\" job_name: \"feed\" split_size: 640 } ");
    sluice::PipelineDocument doc = sluice::parse_pipeline(
        stage("src", "range", "", {{"count", std::to_string(kBatches * kRows)}}) + stage("rows", "row_pattern", "src") + batch +
            stage("feed", "gpu_feed", "batch", {{"emulate", std::to_string(kDevices)}, {"depth", "3"}, {"consume", "external"}}),
        "feed.txtpb");
    sluice::service::split_at_service(doc);
    sluice::Engine engine(sluice::build_graph(doc, registry));
    engine.start();
    sluice::Feed* feed = engine.feed("feed");
    QVERIFY(feed);
    std::multiset<std::uint64_t> batches;
    for (int b = 0; b < kBatches; ++b)
      for (int d = 0; d < kDevices; ++d) {
        sluice::FeedSlice slice;
        QCOMPARE(feed->next(d, slice, std::chrono::seconds(30)), sluice::FeedStatus::Ready);
        QCOMPARE(slice.rows, std::int64_t(kRows / kDevices));
        batches.insert(slice.batch);
        feed->release(slice);
      }
    const auto result = engine.wait();
    QVERIFY2(result.state == sluice::RunState::Finished, result.error.c_str());
    const auto a = feed->allocations();
    QCOMPARE(a.staged_batches, std::uint64_t(0));  // every batch was received where the feed copies from
    QVERIFY(a.pinned_fresh > 0);
    QCOMPARE(a.pinned_fresh + a.pinned_reused, std::uint64_t(kBatches * 2));  // two fields a batch, each a pinned block
    for (int b = 0; b < kBatches; ++b) QCOMPARE(batches.count(static_cast<std::uint64_t>(b)), std::size_t(kDevices));
  }
};

QTEST_GUILESS_MAIN(TestServiceFeed)
#include "tst_service_feed.moc"
