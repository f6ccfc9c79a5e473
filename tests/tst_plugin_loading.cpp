// Broken plugin libraries are refused with their path and the reason; the others still load.
#include <QtTest>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "pipeline_runner.hpp"
#include "sluice/core/param_parse.hpp"
#include "../core/src/registry/registry_cache.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kBroken = std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/broken";

std::string reason_for(const sluice::Registry& registry, const std::string& library) {
  for (const auto& r : registry.refused())
    if (r.path.find(library) != std::string::npos) return r.reason;
  return "";
}

// How the registry came to know the library whose file name is `library`; empty if refused or absent.
std::string described_by(const sluice::Registry& registry, const std::string& library) {
  for (const auto& p : registry.plugins())
    if (fs::path(p.path).filename() == library) return p.described_by;
  return "";
}

bool from_cache(const sluice::Registry& registry, const std::string& library) {
  return described_by(registry, library).rfind("registry cache ", 0) == 0;
}

// A registry over `dir` alone (no bundled plugins), with `cache` as its registry cache.
std::unique_ptr<sluice::Registry> registry_over(const std::string& dir, const std::string& cache) {
  auto registry = std::make_unique<sluice::Registry>();
  registry->set_cache_file(cache);
  registry->load_directory(dir);
  return registry;
}

sluice::registry::Cache decoded(const std::string& file) {
  sluice::registry::Cache cache;
  std::string problem;
  bool ours = false;
  if (!sluice::decode_registry_cache(sluice::test::read_file(file), cache, problem, ours))
    throw std::runtime_error(file + " " + problem);
  return cache;
}

void encode_to(const std::string& file, const sluice::registry::Cache& cache) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << sluice::encode_registry_cache(cache);
}

std::vector<std::pair<std::string, std::string>> refusals(const sluice::Registry& registry) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& r : registry.refused()) out.emplace_back(r.path, r.reason);
  return out;
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
    // Roles (6.8) are read only from plugins built for 6.8 on: the host finds the shard by its role.
    QVERIFY(registry.find("fixture_older_minor")->info.traits.role == sluice::OperatorRole::None);
    QVERIFY(registry.with_role(sluice::OperatorRole::Shards));
    QCOMPARE(registry.with_role(sluice::OperatorRole::Shards)->info.name, std::string("shard"));
    QVERIFY(registry.has_role("balanced_shard", sluice::OperatorRole::ShardsEvenly) && !registry.has_role("shard", sluice::OperatorRole::Takes));
    // The same when the libraries are probed now (a fresh registry cache), not described from a
    // cache written before.
    QTemporaryDir fresh;
    const auto probed = registry_over(kBroken, fresh.filePath("registry.bin").toStdString());
    QVERIFY(probed->find("fixture_older_minor"));
    QVERIFY(probed->find("fixture_older_minor")->info.traits.role == sluice::OperatorRole::None);
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

  // The registry cache: made by the first registry, read by the next; a library rebuilt (another
  // size, or only another time), removed, or described for another ABI is not taken from it.
  void the_registry_cache_is_made_reused_and_invalidated() {
    QTemporaryDir dir;
    const std::string plugins = dir.filePath("plugins").toStdString(), cache = dir.filePath("cache/registry.bin").toStdString();
    fs::create_directories(plugins);
    const std::string good = plugins + "/libfixture_good.so", fine = plugins + "/libfixture_fine.so";
    fs::copy_file(std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good/libfixture_good.so", good);
    fs::copy_file(kBroken + "/libfixture_fine.so", fine);
    auto first = registry_over(plugins, cache);
    QCOMPARE(described_by(*first, "libfixture_good.so"), std::string("probed"));
    QVERIFY(fs::is_regular_file(cache));
    QVERIFY(first->warnings().empty());
    auto second = registry_over(plugins, cache);
    QVERIFY2(from_cache(*second, "libfixture_good.so"), described_by(*second, "libfixture_good.so").c_str());
    QVERIFY(from_cache(*second, "libfixture_fine.so"));
    QVERIFY(second->find("fixture_noop"));
    QCOMPARE(second->operators().size(), first->operators().size());
    // Nothing was loaded to list them; building an operator loads its library, and only that one.
    QVERIFY(!second->library_loaded(good) && !second->library_loaded(fine));
    QVERIFY(second->find("fixture_noop")->info.create(sluice::parse_params(second->find("fixture_noop")->info.params, {})));
    QVERIFY(second->library_loaded(fine) && !second->library_loaded(good));

    // Rebuilt to another size.
    std::ofstream(good, std::ios::binary | std::ios::app) << std::string(64, '\0');
    QCOMPARE(described_by(*registry_over(plugins, cache), "libfixture_good.so"), std::string("probed"));
    QVERIFY(from_cache(*registry_over(plugins, cache), "libfixture_good.so"));
    // Rebuilt to the same size: only its time differs.
    fs::last_write_time(good, fs::last_write_time(good) + std::chrono::seconds(5));
    QCOMPARE(described_by(*registry_over(plugins, cache), "libfixture_good.so"), std::string("probed"));
    QVERIFY(from_cache(*registry_over(plugins, cache), "libfixture_good.so"));
    // Removed: its operators go, and so does its entry.
    fs::remove(fine);
    auto without = registry_over(plugins, cache);
    QVERIFY(!without->find("fixture_noop"));
    QVERIFY(without->find("fail_when"));
    const auto kept = decoded(cache);
    for (const auto& library : kept.libraries()) QVERIFY2(library.path() != fine, library.path().c_str());
    // Described by a host of another ABI.
    auto other_abi = decoded(cache);
    for (auto& library : *other_abi.mutable_libraries()) library.set_host("abi 99.0 format 1");
    encode_to(cache, other_abi);
    auto after = registry_over(plugins, cache);
    QCOMPARE(described_by(*after, "libfixture_good.so"), std::string("probed"));
    QVERIFY(after->warnings().empty());
    QVERIFY(from_cache(*registry_over(plugins, cache), "libfixture_good.so"));
  }

  // Plugins are loaded when an operator of theirs is first built: a library swapped after the
  // listing for another build with the same size and modification time (its GNU build ID differs)
  // is refused then, not loaded.
  void a_library_swapped_after_listing_is_refused_when_used() {
    QTemporaryDir dir;
    const std::string plugins = dir.filePath("plugins").toStdString(), cache = dir.filePath("registry.bin").toStdString();
    fs::create_directories(plugins);
    const std::string fine = plugins + "/libfixture_fine.so";
    fs::copy_file(kBroken + "/libfixture_fine.so", fine);
    auto registry = registry_over(plugins, cache);
    const auto noop = registry->find("fixture_noop");
    QVERIFY(noop);
    // Another build: one byte of the build ID changed, size and time kept (as `cp -p` of a rebuild
    // whose size happened to match would leave them).
    const auto when = fs::last_write_time(fine);
    std::string bytes = sluice::test::read_file(fine);
    const std::string note_header("\x04\0\0\0\x14\0\0\0\x03\0\0\0GNU\0", 16);
    const auto at = bytes.find(note_header);
    QVERIFY2(at != std::string::npos, "the fixture library has a GNU build ID");
    bytes[at + note_header.size()] = static_cast<char>(bytes[at + note_header.size()] ^ 0x5a);
    std::ofstream(fine, std::ios::binary | std::ios::trunc) << bytes;
    fs::last_write_time(fine, when);
    QCOMPARE(fs::file_size(fine), bytes.size());
    try {
      noop->info.create(sluice::parse_params(noop->info.params, {}));
      QFAIL("a library swapped since the listing was loaded");
    } catch (const sluice::Error& e) {
      QVERIFY2(std::string(e.what()).find("changed since its operators were listed") != std::string::npos, e.what());
    }
    QVERIFY(!registry->library_loaded(fine));
  }

  // A damaged or truncated cache is never trusted: it is rebuilt with a warning. A file that is
  // not a registry cache is not written over. A cache that cannot be written costs only time.
  void a_damaged_cache_is_rebuilt_and_an_unwritable_one_is_done_without() {
    QTemporaryDir dir;
    const std::string plugins = std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good", cache = dir.filePath("registry.bin").toStdString();
    registry_over(plugins, cache);
    const std::string whole = sluice::test::read_file(cache);
    auto expect_rebuilt = [&](const std::string& content, const std::string& problem) {
      std::ofstream(cache, std::ios::binary | std::ios::trunc) << content;
      auto registry = registry_over(plugins, cache);
      QCOMPARE(described_by(*registry, "libfixture_good.so"), std::string("probed"));
      QCOMPARE(registry->warnings().size(), std::size_t(1));
      const auto& warning = registry->warnings().front();
      QVERIFY2(warning.find(cache) != std::string::npos && warning.find(problem) != std::string::npos &&
                   warning.find("rebuilt") != std::string::npos,
               warning.c_str());
      QCOMPARE(sluice::test::read_file(cache), whole);
    };
    expect_rebuilt(whole.substr(0, whole.size() / 2), "truncated");
    expect_rebuilt(whole.substr(0, 10), "truncated");
    expect_rebuilt("", "empty");
    std::string flipped = whole;
    flipped[flipped.size() - 3] ^= 0x55;
    expect_rebuilt(flipped, "damaged");
    expect_rebuilt(whole + "x", "damaged");

    std::ofstream(cache, std::ios::trunc) << "someone's notes\n";
    auto foreign = registry_over(plugins, cache);
    QVERIFY(foreign->find("fail_when"));
    QVERIFY(!foreign->warnings().empty() && foreign->warnings().front().find("not a Sluice registry cache") != std::string::npos);
    QCOMPARE(sluice::test::read_file(cache), std::string("someone's notes\n"));

    // Where nothing can be written: under a regular file (for everyone, root included), and in a
    // folder without write permission (where the test does not run as root).
    const std::string blocker = dir.filePath("a-file").toStdString();
    std::ofstream(blocker) << "x";
    auto under_file = registry_over(plugins, blocker + "/registry.bin");
    QVERIFY(under_file->find("fail_when"));
    QCOMPARE(described_by(*under_file, "libfixture_good.so"), std::string("probed"));
    QVERIFY(under_file->warnings().empty());
    if (::geteuid() != 0) {
      const std::string locked = dir.filePath("locked").toStdString();
      fs::create_directories(locked);
      ::chmod(locked.c_str(), 0555);
      auto read_only = registry_over(plugins, locked + "/registry.bin");
      QVERIFY(read_only->find("fail_when"));
      QVERIFY(!fs::exists(locked + "/registry.bin"));
      ::chmod(locked.c_str(), 0755);
    }
    // No cache at all.
    auto none = registry_over(plugins, "");
    QVERIFY(none->find("fail_when"));
    QCOMPARE(described_by(*none, "libfixture_good.so"), std::string("probed"));
  }

  // A library that crashed its probe is probed again at the next start, never remembered as
  // refused: the crash may have come from the machine (memory, a missing device), not the file.
  void a_crashing_probe_is_not_remembered() {
    QTemporaryDir dir;
    const std::string plugins = dir.filePath("plugins").toStdString(), cache = dir.filePath("registry.bin").toStdString();
    fs::create_directories(plugins);
    fs::copy_file(std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/hostile/libhostile_register_segfaults.so", plugins + "/libcrashes.so");
    fs::copy_file(std::string(SLUICE_FIXTURE_PLUGIN_DIR) + "/good/libfixture_good.so", plugins + "/libfixture_good.so");
    for (int start = 0; start < 2; ++start) {
      auto registry = registry_over(plugins, cache);
      QVERIFY2(reason_for(*registry, "libcrashes.so").find("killed the probe process") != std::string::npos,
               reason_for(*registry, "libcrashes.so").c_str());
      QCOMPARE(described_by(*registry, "libfixture_good.so"), std::string(start == 0 ? "probed" : "registry cache " + cache));
    }
    const auto kept = decoded(cache);
    for (const auto& library : kept.libraries()) QVERIFY2(library.path().find("libcrashes.so") == std::string::npos, library.path().c_str());
  }

  // Processes that start at once with no cache all work, and leave one valid cache that describes
  // every library.
  void processes_starting_at_once_share_one_valid_cache() {
    QTemporaryDir dir;
    const QString cache = dir.filePath("registry.bin");
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SLUICE_REGISTRY", cache);
    for (int round = 0; round < 3; ++round) {
      QFile::remove(cache);
      std::vector<std::unique_ptr<QProcess>> processes;
      for (int i = 0; i < 4; ++i) {
        auto p = std::make_unique<QProcess>();
        p->setProcessEnvironment(env);
        p->start(SLUICE_CLI, {"plugins", "--json", "--plugin-dir", QString::fromStdString(kBroken)});
        processes.push_back(std::move(p));
      }
      for (auto& p : processes) {
        QVERIFY(p->waitForFinished(60000));
        QCOMPARE(p->exitCode(), 0);
        const QByteArray out = p->readAllStandardOutput();
        QVERIFY(out.contains("\"name\":\"range\"") && out.contains("\"name\":\"fixture_noop\""));
        QVERIFY2(!p->readAllStandardError().contains("registry cache"), "a process met a damaged cache");
      }
      const auto kept = decoded(cache.toStdString());  // throws if damaged
      QVERIFY(kept.libraries_size() >= 4);
      sluice::Registry registry;
      registry.set_cache_file(cache.toStdString());
      registry.load_search_path({kBroken});
      QVERIFY(registry.warnings().empty());
      QVERIFY(from_cache(registry, "libsluice_std.so"));
      QVERIFY(from_cache(registry, "libfixture_fine.so"));
    }
  }

  // Every broken fixture is refused in the same words whether it was probed now, described by the
  // cache, or loaded with no cache at all.
  void refusals_are_the_same_with_and_without_a_cache() {
    QTemporaryDir dir;
    const std::string cache = dir.filePath("registry.bin").toStdString();
    auto refused_with = [&](const std::string& file) {
      sluice::Registry registry;
      registry.set_cache_file(file);
      registry.load_search_path({kBroken});
      return refusals(registry);
    };
    const auto without = refused_with("");
    QCOMPARE(without.size(), std::size_t(8));
    QCOMPARE(refused_with(cache), without);  // probed, and cached
    QCOMPARE(refused_with(cache), without);  // from the cache
    // The refusals that depend on the file alone are kept; a name taken by another library is
    // the host's finding, made again at every start.
    const auto kept = decoded(cache);
    int kept_refusals = 0;
    for (const auto& library : kept.libraries()) kept_refusals += !library.refusal().empty();
    QCOMPARE(kept_refusals, 6);
  }

  // A pipeline of `std` operators loads the std library and no other: by the registry's own
  // record, and by what the process has mapped.
  void a_pipeline_loads_only_the_libraries_it_uses() {
    QTemporaryDir dir;
    sluice::Registry registry;
    registry.set_cache_file(dir.filePath("registry.bin").toStdString());
    registry.load_search_path();
    const auto doc = sluice::parse_pipeline(sluice::test::stage("src", "range", "", {{"count", "10"}}) +
                                                sluice::test::stage("out", "null_sink", "src"),
                                            "p");
    sluice::Engine engine(sluice::build_graph(doc, registry));
    engine.start();
    QCOMPARE(engine.wait().state, sluice::RunState::Finished);
    std::string vision, io;
    for (const auto& p : registry.plugins()) {
      if (p.name == "vision") vision = p.path;
      if (p.name == "io") io = p.path;
    }
    QVERIFY(!vision.empty() && !io.empty());
    QVERIFY(registry.library_loaded(registry.find("range")->library_path));
    QVERIFY(!registry.library_loaded(vision));
    QVERIFY(!registry.library_loaded(io));
    const std::string maps = sluice::test::read_file("/proc/self/maps");
    QVERIFY(maps.find("libsluice_std.so") != std::string::npos);
    // (Valid while no slot before this one builds a vision operator: slots run in their order.)
    QVERIFY2(maps.find(fs::path(vision).filename().string()) == std::string::npos, "the vision library is mapped");
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

  void a_source_of_an_older_minor_is_cut_at_its_own_place() {
    // Since 6.9 a cut may put the barrier of a source read by an interleave after the first end of
    // a pass waiting in its buffer, and resume the source before the next pass with the state it
    // had later. A source built before may number its passes itself (this file list does): it is
    // cut where it stands, and its resumed run is the rest of the uninterrupted one.
    QTemporaryDir dir;
    for (int f = 0; f < 10; ++f) std::ofstream(dir.filePath(QString("f%1.txt").arg(f)).toStdString()) << "f" << f << " a\nf" << f << " b\n";
    sluice::Registry registry;
    registry.load_search_path({kBroken});
    const std::string text = sluice::test::stage("older", "fixture_older_source", "", {{"folder", dir.path().toStdString()}}) +
                             sluice::test::stage("lines", "text_lines", "older", {}, "buffer_size: 2") +
                             sluice::test::stage("slow", "simulate_work", "lines", {{"us", "300"}}, "buffer_size: 2") +
                             sluice::test::stage("epochs", "repeat", "slow", {{"count", "200"}}, "buffer_size: 2") +
                             sluice::test::stage("out", "jsonl_sink", "epochs", {{"path", "$OUT"}});
    const auto run = [&](const std::string& name, std::shared_ptr<const sluice::checkpoint::Checkpoint> resume, bool cut) {
      std::string resolved = text;
      resolved.replace(resolved.find("$OUT"), 4, dir.filePath(QString::fromStdString(name)).toStdString());
      sluice::EngineOptions options;
      options.resume_from = std::move(resume);
      sluice::Engine engine(sluice::build_graph(sluice::parse_pipeline(resolved, "older.txtpb"), registry), options);
      engine.start();
      std::optional<sluice::checkpoint::Checkpoint> taken;
      if (cut) {
        while (engine.snapshot().stage(4).elements_in() < 13 && !engine.wait_for(std::chrono::milliseconds(0)))
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        taken = engine.checkpoint(true);
      }
      const auto result = engine.wait();
      if (result.state != (cut ? sluice::RunState::Stopped : sluice::RunState::Finished)) throw std::runtime_error(result.error);
      return std::make_pair(sluice::test::read_file(dir.filePath(QString::fromStdString(name)).toStdString()), taken);
    };
    const auto whole = run("whole.jsonl", {}, false).first;
    const auto [first, checkpoint] = run("first.jsonl", {}, true);
    QVERIFY(checkpoint.has_value());
    const auto rest = run("rest.jsonl", std::make_shared<const sluice::checkpoint::Checkpoint>(*checkpoint), false).first;
    QCOMPARE(QString::fromStdString(first + rest), QString::fromStdString(whole));
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
