// Broken plugin libraries are refused with their path and the reason; the others still load.
#include <QtTest>

#include <fstream>

#include "pipeline_runner.hpp"

namespace {
const std::string kBroken = std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/broken";

std::string reason_for(const sluice::Registry& registry, const std::string& library) {
  for (const auto& r : registry.refused())
    if (r.path.find(library) != std::string::npos) return r.reason;
  return "";
}
}  // namespace

class TestPluginLoading : public QObject {
  Q_OBJECT
 private slots:
  void bundled_plugins_load_without_configuration() {
    sluice::Registry registry;
    registry.load_search_path();
    QVERIFY(registry.find("range"));
    QVERIFY(registry.find("jsonl_sink"));
    QVERIFY(registry.refused().empty());
    std::vector<std::string> names;
    for (const auto& p : registry.plugins()) names.push_back(p.name);
    QVERIFY(std::find(names.begin(), names.end(), "std") != names.end());
    QVERIFY(std::find(names.begin(), names.end(), "io") != names.end());
  }

  void each_broken_library_is_refused_with_its_reason() {
    sluice::Registry registry;
    registry.load_search_path({kBroken});
    QVERIFY(registry.find("range"));  // std still loaded, first
    QVERIFY(registry.find("fixture_noop"));  // the fine library among the broken ones loaded
    // The ABI promise: a plugin built for an earlier minor of this major loads.
    QVERIFY2(registry.find("fixture_older_minor"), reason_for(registry, "libfixture_abi_minor_older.so").c_str());
    QVERIFY(reason_for(registry, "libfixture_not_a_library.so").find("not a shared library") != std::string::npos);
    QVERIFY(reason_for(registry, "libfixture_no_entry.so").find("has no entry symbol 'sluice_plugin_entry'") != std::string::npos);
    QVERIFY(reason_for(registry, "libfixture_abi_major.so").find("major versions differ") != std::string::npos);
    QVERIFY(reason_for(registry, "libfixture_abi_minor_newer.so").find("newer than this host") != std::string::npos);
    auto no_inputs = reason_for(registry, "libfixture_combine_no_inputs.so");
    QVERIFY2(no_inputs.find("combine operator 'fixture_no_inputs' takes 0 to 0 inputs; min_inputs must be 1 or more") !=
                 std::string::npos,
             no_inputs.c_str());
    auto dup = reason_for(registry, "libfixture_duplicate_name.so");
    QVERIFY2(dup.find("registers operator 'range', already registered by plugin 'std'") != std::string::npos, dup.c_str());
    auto ctor = reason_for(registry, "libfixture_ctor_throws.so");
    QVERIFY2(ctor.find("failed to construct") != std::string::npos &&
                 ctor.find("cannot allocate the fixture's resources") != std::string::npos,
             ctor.c_str());
    QVERIFY(reason_for(registry, "libfixture_register_throws.so").find("registration failed on purpose") != std::string::npos);
    QCOMPARE(registry.refused().size(), std::size_t(8));
    for (const auto& r : registry.refused()) QVERIFY(r.path.rfind(kBroken, 0) == 0);
  }

  void a_plugin_built_for_an_older_minor_gets_no_ragged_chunks() {
    // Since 6.3 a chunk may hold Ragged columns, which a plugin built for 6.2 knows nothing of:
    // split_text's chunks of tokens reach that plugin's chunked map as elements, while text_lines
    // still hands split_text chunks, and every line arrives.
    QTemporaryDir dir;
    const std::string file = dir.path().toStdString() + "/tokens.txt";
    std::ofstream(file) << "1 2\n3\n\n4 5 6\n";
    sluice::Registry registry;
    registry.load_search_path({kBroken});
    const std::string text = sluice::test::stage("files", "list_files", "", {{"patterns", file}}) +
                             sluice::test::stage("lines", "text_lines", "files") +
                             sluice::test::stage("split", "split_text", "lines", {{"to", "int64"}}) +
                             sluice::test::stage("older", "fixture_older_minor", "split") + sluice::test::stage("out", "null_sink", "older");
    sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(text, "older.txtpb"), registry));
    engine.start();
    const auto result = engine.wait();
    QVERIFY2(result.state == sluice::RunState::Finished, result.error.c_str());
    const auto snap = engine.snapshot();
    QVERIFY(snap.stage(1).chunks_out() > 0);
    QCOMPARE(snap.stage(2).chunks_out(), std::uint64_t(0));
    QCOMPARE(snap.stage(3).elements_in(), std::uint64_t(4));
  }

  void plugin_path_environment_and_order() {
    qputenv("SLUICE_PLUGIN_PATH", QByteArray::fromStdString(std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good"));
    auto dirs = sluice::Registry::search_path({"/extra"});
    qunsetenv("SLUICE_PLUGIN_PATH");
    QCOMPARE(dirs.size(), std::size_t(3));
    QVERIFY(dirs[0].string().find("lib/sluice/plugins") != std::string::npos);
    QCOMPARE(dirs[1].string(), std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good");
    QCOMPARE(dirs[2].string(), std::string("/extra"));
  }

  void operators_outlive_nothing_they_need() {
    // A registry destroyed while an engine built from it still runs must not unload its code.
    std::unique_ptr<sluice::Engine> engine;
    {
      sluice::Registry registry;
      registry.load_search_path();
      auto doc = sluice::parse_pipeline(sluice::test::stage("src", "range", "", {{"count", "1000"}}) +
                                            sluice::test::stage("out", "null_sink", "src"),
                                        "p");
      engine = std::make_unique<sluice::Engine>(sluice::build_graph(doc, registry));
    }
    engine->start();
    QCOMPARE(engine->wait().state, sluice::RunState::Finished);
  }
};

QTEST_APPLESS_MAIN(TestPluginLoading)
#include "tst_plugin_loading.moc"
