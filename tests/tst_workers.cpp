// Many workers: the identity from every launcher's variables, automatic sharding, equal steps,
// copies with per-worker seeds, and {worker} in paths. The real launchers (mpirun, srun) are
// exercised by tests/cluster/.
#include <QtTest>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "pipeline_runner.hpp"
#include "sluice/core/resources.hpp"
#include "sluice/core/workers.hpp"

using namespace sluice::test;
using sluice::WorkerIdentity;
using Ints = std::vector<long long>;
namespace fs = std::filesystem;

namespace {

sluice::Environment env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

WorkerIdentity detect(std::map<std::string, std::string> vars, sluice::WorkerRequest request = {}) {
  return sluice::detect_worker_identity(env_of(std::move(vars)), request);
}

// The message of the WorkerIdentityError that detecting throws, or "" when it throws none.
std::string refusal(std::map<std::string, std::string> vars, sluice::WorkerRequest request = {}) {
  try {
    detect(std::move(vars), request);
  } catch (const sluice::WorkerIdentityError& e) {
    return e.what();
  }
  return "";
}

WorkerIdentity worker(int index, int count) { return {index, count, "test", ""}; }

Ints sorted(Ints v) {
  std::sort(v.begin(), v.end());
  return v;
}

// TFRecord files of tf.Examples {value: int64} holding `sizes[k]` consecutive integers each.
struct RecordFiles {
  QTemporaryDir dir;
  long long total = 0;
  std::string pattern() const { return dir.path().toStdString() + "/part-*.tfrecord"; }
  explicit RecordFiles(const std::vector<int>& sizes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      auto out = run_text(stage("src", "range", "", {{"count", std::to_string(sizes[k])}, {"start", std::to_string(total)}}) +
                          stage("w", "tfrecord_writer", "src",
                                {{"prefix", dir.path().toStdString() + "/part"},
                                 {"naming", "worker"},
                                 {"worker", std::to_string(k)}}));
      if (out.result.state != sluice::RunState::Finished) qFatal("writing test records failed: %s", out.error.c_str());
      total += sizes[k];
    }
  }
};

std::string read_records(const std::string& pattern, const std::string& options = "", const std::string& after_parse = "") {
  std::string text = options + stage("files", "list_files", "", {{"patterns", pattern}}) + stage("read", "tfrecord_reader", "files") +
                     stage("parse", "parse_example", "read", {{"features", "value:int64"}});
  return text + after_parse + sink_after(after_parse.empty() ? "parse" : "last");
}

// What each of `count` workers gives, run one after another in this process.
std::vector<Ints> run_workers(const std::string& text, int count, std::vector<sluice::WorkerPlan>* plans = nullptr) {
  std::vector<Ints> outputs;
  for (int i = 0; i < count; ++i) {
    sluice::WorkerPlan plan;
    auto out = run_text_as_worker(text, worker(i, count), &plan);
    if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
      qFatal("worker %d did not finish: %s %s", i, out.error.c_str(), out.result.error.c_str());
    outputs.push_back(all_integers(out.lines));
    if (plans) plans->push_back(plan);
  }
  return outputs;
}

// The workers' outputs are pairwise disjoint and together hold 0..total-1 once each.
void check_partition(const std::vector<Ints>& outputs, long long total) {
  Ints all;
  for (const auto& o : outputs) all.insert(all.end(), o.begin(), o.end());
  Ints expected(static_cast<std::size_t>(total));
  std::iota(expected.begin(), expected.end(), 0);
  QCOMPARE(sorted(all), expected);
}

// The reader of `text` with two workers reading two files at once, blocks of three records.
std::string interleaved(std::string text) {
  const std::string reader = "op: \"tfrecord_reader\"";
  text.replace(text.find(reader), reader.size(), reader + " parallelism: 2 interleave { cycle_length: 2 block_length: 3 }");
  return text;
}

bool mentions(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

}  // namespace

class TestWorkers : public QObject {
  Q_OBJECT
 private slots:
  // ---- identity ----

  void a_process_without_launcher_variables_is_the_only_worker() {
    auto id = detect({});
    QCOMPARE(id.index, 0);
    QCOMPARE(id.count, 1);
    QCOMPARE(id.source, std::string("single process"));
  }

  void each_launcher_is_read_from_its_own_variables() {
    struct Case {
      std::map<std::string, std::string> vars;
      int index, count;
      std::string source;
    };
    const std::vector<Case> cases{
        {{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_ID", "0"}}, 2, 3, "Slurm"},
        {{{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "4"}, {"SLURM_STEPID", "0"}}, 1, 4, "Slurm"},
        {{{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"PMIX_RANK", "5"}}, 5, 8, "Open MPI"},
        {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, 0, 2, "PMI"},
        {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}, 3, 4, "torchrun"},
        {{{"HOROVOD_RANK", "1"}, {"HOROVOD_SIZE", "2"}}, 1, 2, "Horovod"},
        // srun --mpi=pmi2 sets PMI's variables too, and they agree.
        {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, 1, 2, "Slurm"},
    };
    for (const auto& c : cases) {
      auto id = detect(c.vars);
      QCOMPARE(id.index, c.index);
      QCOMPARE(id.count, c.count);
      QCOMPARE(id.source, c.source);
    }
    auto slurm = detect({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_ID", "0"}});
    QCOMPARE(slurm.describe(), std::string("worker 2 of 3 (Slurm: SLURM_PROCID=2, SLURM_NTASKS=3)"));
    // sbatch's batch script itself (no step): one process, which must not take itself for task 0.
    auto message = refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}});
    QVERIFY2(message.find("batch script") != std::string::npos && message.find("srun") != std::string::npos, message.c_str());
    QCOMPARE(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).count, 1);
    QVERIFY(refusal({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("batch script") != std::string::npos);
  }

  void index_only_launchers_take_the_count_from_the_command_line() {
    auto k8s = detect({{"JOB_COMPLETION_INDEX", "4"}}, {std::nullopt, 6, "--num-workers"});
    QCOMPARE(k8s.index, 4);
    QCOMPARE(k8s.count, 6);
    QCOMPARE(k8s.source, std::string("Kubernetes indexed job"));
    auto pmix = detect({{"PMIX_RANK", "1"}}, {std::nullopt, 2, "--num-workers"});
    QCOMPARE(pmix.index, 1);
    QCOMPARE(pmix.source, std::string("PMIx"));
    // The command line's count comes before a later launcher's: one that says otherwise disagrees.
    auto other = refusal({{"PMIX_RANK", "1"}, {"RANK", "1"}, {"WORLD_SIZE", "8"}}, {std::nullopt, 4, "--num-workers"});
    QVERIFY2(other.find("disagree") != std::string::npos && other.find("RANK=1, WORLD_SIZE=8") != std::string::npos, other.c_str());
    // Without it: an error naming the variable and what to give.
    auto message = refusal({{"JOB_COMPLETION_INDEX", "4"}});
    QVERIFY2(message.find("JOB_COMPLETION_INDEX=4") != std::string::npos && message.find("--num-workers") != std::string::npos,
             message.c_str());
  }

  void tf_config_counts_the_chief_as_worker_zero() {
    const std::string cluster = R"("cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1", "w2:1"], "ps": ["p:1"]})";
    auto w1 = detect({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "worker", "index": 1}})"}});
    QCOMPARE(w1.index, 2);
    QCOMPARE(w1.count, 4);
    QCOMPARE(w1.source, std::string("TF_CONFIG"));
    auto chief = detect({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "chief", "index": 0}})"}});
    QCOMPARE(chief.index, 0);
    QCOMPARE(chief.count, 4);
    // Without a chief, worker k is k.
    auto plain = detect({{"TF_CONFIG", R"({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}})"}});
    QCOMPARE(plain.index, 1);
    QCOMPARE(plain.count, 2);
    // The legacy name of the chief.
    auto master = detect({{"TF_CONFIG", R"({"cluster": {"master": ["m"], "worker": ["a"]}, "task": {"type": "worker", "index": 0}})"}});
    QCOMPARE(master.index, 1);
    QCOMPARE(master.count, 2);
  }

  void malformed_tf_config_is_refused_with_what_is_wrong() {
    struct Case {
      std::string value, expected;
    };
    const std::vector<Case> cases{
        {"not json", "is not JSON"},
        {R"({"cluster": {"worker": ["a"]}})", "has no \"task\""},
        {R"({"cluster": {"worker": ["a"]}, "task": "worker"})", "not an object"},
        {R"({"cluster": {"worker": ["a"]}, "task": {"index": 0}})", "\"type\""},
        {R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 1}})", "lists 1 worker"},
        {R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": -1}})", "not a whole number"},
        {R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0.5}})", "not a whole number"},
        {R"({"cluster": {"worker": "a"}, "task": {"type": "worker", "index": 0}})", "not a list"},
        {R"({"task": {"type": "worker", "index": 0}})", "no \"cluster\""},
        {R"({"cluster": {"worker": ["a"], "evaluator": ["e"]}, "task": {"type": "evaluator", "index": 0}})", "'evaluator'"},
        {R"({"cluster": {"worker": ["a"], "ps": ["p"]}, "task": {"type": "ps", "index": 0}})", "'ps'"},
        // A chief index past the chiefs listed would collide with worker 0's share.
        {R"({"cluster": {"chief": ["c"], "worker": ["a", "b"]}, "task": {"type": "chief", "index": 1}})", "says this is chief 1 but its cluster lists 1"},
    };
    for (const auto& c : cases) {
      auto message = refusal({{"TF_CONFIG", c.value}});
      QVERIFY2(message.find("TF_CONFIG") != std::string::npos && message.find(c.expected) != std::string::npos,
               (c.value + " -> " + message).c_str());
    }
  }

  void malformed_and_incomplete_variables_name_the_variable() {
    struct Case {
      std::map<std::string, std::string> vars;
      std::vector<std::string> expected;
    };
    const std::vector<Case> cases{
        {{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "3"}}, {"SLURM_PROCID='x'", "not a worker index"}},
        {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "0"}}, {"SLURM_NTASKS='0'", "not a number of workers"}},
        {{{"SLURM_PROCID", "-1"}, {"SLURM_NTASKS", "2"}}, {"SLURM_PROCID='-1'"}},
        {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_ID", "0"}}, {"SLURM_PROCID=3", "not below the number of workers 3"}},
        {{{"OMPI_COMM_WORLD_RANK", "1 "}, {"OMPI_COMM_WORLD_SIZE", "2"}}, {"OMPI_COMM_WORLD_RANK='1 '"}},
        {{{"WORLD_SIZE", "4"}}, {"WORLD_SIZE=4", "index is not"}},
        {{{"RANK", "2"}}, {"RANK=2", "not the number of workers"}},
        {{{"HOROVOD_RANK", "99999999999"}, {"HOROVOD_SIZE", "2"}}, {"HOROVOD_RANK='99999999999'"}},
    };
    for (const auto& c : cases) {
      auto message = refusal(c.vars);
      for (const auto& e : c.expected) QVERIFY2(message.find(e) != std::string::npos, message.c_str());
    }
  }

  void contradictory_launchers_are_an_error_naming_both() {
    auto message = refusal({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
    QVERIFY2(message.find("SLURM_PROCID=1") != std::string::npos && message.find("PMI_RANK=0") != std::string::npos &&
                 message.find("disagree") != std::string::npos,
             message.c_str());
    // Agreeing on the index is not enough: the counts must agree too.
    message = refusal({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "8"}});
    QVERIFY2(message.find("disagree") != std::string::npos && message.find("of 8 workers") != std::string::npos, message.c_str());
    message = refusal({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});
    QVERIFY2(message.find("OMPI_COMM_WORLD_RANK=1") != std::string::npos && message.find("RANK=0") != std::string::npos,
             message.c_str());
  }

  // The CPU quota and memory limit are read from the process's own cgroup v2 entry and its
  // parents (the tightest wins), not only from the hierarchy's root: a Slurm job step or a
  // systemd unit sets them on its own cgroup.
  void the_cpu_quota_of_the_process_own_cgroup_counts() {
    QTemporaryDir tree;
    auto write = [&](const QString& path, const QByteArray& text) {
      QDir().mkpath(QFileInfo(tree.filePath(path)).path());
      QFile f(tree.filePath(path));
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(text);
    };
    write("proc/self/cgroup", "0::/system.slice/job_42/step_0\n");
    write("sys/fs/cgroup/cpu.max", "max 100000\n");
    write("sys/fs/cgroup/system.slice/cpu.max", "max 100000\n");
    write("sys/fs/cgroup/system.slice/job_42/step_0/cpu.max", "50000 100000\n");
    write("sys/fs/cgroup/system.slice/job_42/memory.max", "1073741824\n");
    write("sys/fs/cgroup/system.slice/job_42/step_0/memory.max", "max\n");
    const sluice::CgroupFiles files{tree.filePath("proc/self/cgroup").toStdString(), tree.filePath("sys/fs/cgroup").toStdString()};
    const auto cores = sluice::usable_cores(files);
    QCOMPARE(cores.cores, 0.5);
    QVERIFY2(cores.why.find("cgroup's CPU quota of 0.5") != std::string::npos, cores.why.c_str());
    const auto memory = sluice::usable_memory(files);
    QCOMPARE(memory.bytes, std::uint64_t{1} << 30);
    // The parent's quota when it is the tighter one.
    write("sys/fs/cgroup/system.slice/cpu.max", "25000 100000\n");
    QCOMPARE(sluice::usable_cores(files).cores, 0.25);
  }

  void a_launcher_inside_a_slurm_allocation_decides_over_its_step() {
    // mpirun in an sbatch script: its processes inherit the batch step's SLURM_PROCID=0.
    auto id = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
    QCOMPARE(id.index, 2);
    QCOMPARE(id.count, 3);
    QCOMPARE(id.source, std::string("Open MPI"));
    QVERIFY(id.variables.find("inside Slurm") != std::string::npos);
    auto torch = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}});
    QCOMPARE(torch.index, 3);
    QCOMPARE(torch.source, std::string("torchrun"));
    // horovodrun (gloo: Horovod's variables alone) in a Slurm step of 4 tasks.
    auto horovod = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}, {"HOROVOD_RANK", "5"}, {"HOROVOD_SIZE", "8"}});
    QCOMPARE(horovod.index, 5);
    QCOMPARE(horovod.count, 8);
    QCOMPARE(horovod.source, std::string("Horovod"));
    QVERIFY(horovod.variables.find("inside Slurm") != std::string::npos);
  }

  void the_command_line_decides_over_the_environment() {
    auto id = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, {0, 5, "--worker-index/--num-workers"});
    QCOMPARE(id.index, 0);
    QCOMPARE(id.count, 5);
    QCOMPARE(id.source, std::string("--worker-index/--num-workers"));
    // A count alone must match the launcher's.
    auto agreeing = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}, {std::nullopt, 2, "--num-workers"});
    QCOMPARE(agreeing.index, 1);
    auto message = refusal({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}, {std::nullopt, 3, "--num-workers"});
    QVERIFY2(message.find("--num-workers says 3") != std::string::npos && message.find("SLURM_NTASKS=2") != std::string::npos,
             message.c_str());
    QVERIFY(refusal({}, {1, std::nullopt, "--worker-index"}).find("not the number of workers") != std::string::npos);
    QVERIFY(refusal({}, {2, 2, "--worker-index"}).find("not below") != std::string::npos);
    QVERIFY(refusal({}, {std::nullopt, 3, "--num-workers"}).find("--worker-index") != std::string::npos);
  }

  void worker_fields_are_filled_in_paths() {
    QCOMPARE(sluice::substitute_worker_fields("out/{worker}-of-{num_workers}.jsonl", worker(2, 8)), std::string("out/2-of-8.jsonl"));
    QCOMPARE(sluice::substitute_worker_fields("a{b}{worker", worker(1, 2)), std::string("a{b}{worker"));
  }

  void path_parameters_hold_the_worker() {
    QTemporaryDir dir;
    const std::string path = dir.path().toStdString() + "/out-{worker}-of-{num_workers}.jsonl";
    auto text = stage("src", "range", "", {{"count", "4"}}) + stage("out", "jsonl_sink", "src", {{"path", path}});
    auto out = run_text_as_worker(text, worker(1, 2));
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QCOMPARE(read_file(dir.path().toStdString() + "/out-1-of-2.jsonl"), std::string("{\"value\":1}\n{\"value\":3}\n"));
  }

  void workers_writing_one_path_are_refused() {
    // Each would replace the others' file when it finishes: nothing but the last would remain.
    QTemporaryDir dir;
    auto out = run_text_as_worker(stage("src", "range", "", {{"count", "4"}}) +
                                      stage("out", "jsonl_sink", "src", {{"path", dir.path().toStdString() + "/all.jsonl"}}),
                                  worker(0, 2));
    QVERIFY2(out.error.find("stage 'out': parameter 'path': all 2 workers would write") != std::string::npos &&
                 out.error.find("{worker}") != std::string::npos,
             out.error.c_str());
    // Shards numbered "-of-N" by every worker would too; naming: worker is the way.
    const std::string writer = stage("src", "range", "", {{"count", "4"}}) +
                               stage("w", "tfrecord_writer", "src", {{"prefix", dir.path().toStdString() + "/part"}});
    out = run_text_as_worker(writer, worker(1, 2));
    QVERIFY2(out.error.find("stage 'w'") != std::string::npos && out.error.find("set naming to worker") != std::string::npos,
             out.error.c_str());
    out = run_text_as_worker(writer.substr(0, writer.size() - 3) + " params { key: \"naming\" value: \"worker\" } }\n", worker(1, 2));
    QVERIFY2(out.error.empty(), out.error.c_str());
    QVERIFY(fs::exists(dir.path().toStdString() + "/part-worker-1-00000.tfrecord"));
    // A single process writes where it is told.
    QCOMPARE(run_text_as_worker(writer, worker(0, 1)).error, std::string());
  }

  // ---- sharding ----

  void enough_files_are_sharded_by_file_right_after_the_list() {
    RecordFiles files({5, 1, 7, 3, 4, 2});
    std::vector<sluice::WorkerPlan> plans;
    // Files in name order, to know which worker gets which (every worker shuffles them alike).
    const std::string sorted_files = stage("files", "list_files", "", {{"patterns", files.pattern()}, {"shuffle", "false"}}) +
                                     stage("read", "tfrecord_reader", "files") +
                                     stage("parse", "parse_example", "read", {{"features", "value:int64"}}) + sink_after("parse");
    auto outputs = run_workers(sorted_files, 3, &plans);
    check_partition(outputs, files.total);
    QVERIFY2(mentions(plans[0].notes, "sharded by file") && mentions(plans[0].notes, "after 'files'"), plans[0].notes[0].c_str());
    QVERIFY(plans[0].warnings.empty());
    // File sharding keeps whole files: worker 0 reads files 0 and 3 (sorted names).
    QCOMPARE(sorted(outputs[0]), (Ints{0, 1, 2, 3, 4, 13, 14, 15}));
    // As many files as workers: still one file each, by file.
    RecordFiles three({4, 5, 6});
    plans.clear();
    check_partition(run_workers(read_records(three.pattern()), 3, &plans), three.total);
    QVERIFY2(mentions(plans[0].notes, "sharded by file"), plans[0].notes[0].c_str());
  }

  void fewer_files_than_workers_are_sharded_by_record_with_a_warning() {
    RecordFiles files({10, 7});
    std::vector<sluice::WorkerPlan> plans;
    auto outputs = run_workers(read_records(files.pattern()), 3, &plans);
    check_partition(outputs, files.total);
    QVERIFY(mentions(plans[1].notes, "sharded by record (2 files for 3 workers)"));
    QVERIFY(mentions(plans[1].notes, "after 'read'"));
    QVERIFY(mentions(plans[1].warnings, "every worker reads all the files"));
    // Forced by file, the workers beyond the files get nothing, and are told so.
    plans.clear();
    auto forced = run_workers("options { sharding: by_file }\n" + read_records(files.pattern()), 3, &plans);
    check_partition(forced, files.total);
    QVERIFY(forced[2].empty());
    QVERIFY(mentions(plans[2].warnings, "2 files for 3 workers sharded by file: worker 2 reads nothing"));
  }

  void interleaved_parallel_reading_shards_the_same_as_plain_reading() {
    RecordFiles files({9, 4, 6});
    const auto text = interleaved(read_records(files.pattern()));
    const std::vector<std::string> modes{"by_record", "by_file"};
    for (const auto& sharding : modes) {
      const std::string options = "options { sharding: " + sharding + " }\n";
      auto outputs = run_workers(options + text, 2);
      check_partition(outputs, files.total);
      QCOMPARE(run_workers(options + text, 2), outputs);  // same twice
    }
  }

  void sharded_shuffled_runs_repeat_and_partition_every_record() {
    RecordFiles files({6, 6, 6, 6});
    const std::string text = read_records(files.pattern(), "options { seed: 17 }\n",
                                          stage("last", "shuffle", "parse", {{"buffer_size", "8"}}));
    auto first = run_workers(text, 2);
    check_partition(first, files.total);
    QCOMPARE(run_workers(text, 2), first);
    QVERIFY(first[0] != sorted(first[0]));  // shuffled
  }

  void a_pipeline_with_its_own_shard_keeps_it_and_gets_the_worker() {
    auto text = stage("src", "range", "", {{"count", "10"}}) + stage("mine", "shard", "src") + sink_after("mine");
    sluice::WorkerPlan plan;
    auto out = run_text_as_worker(text, worker(1, 4), &plan);
    QCOMPARE(all_integers(out.lines), (Ints{1, 5, 9}));
    QVERIFY(plan.notes.empty());
    QCOMPARE(out.snapshot.stage_size(), 3);  // no second shard
    // Its own values stay its own.
    auto fixed = stage("src", "range", "", {{"count", "10"}}) +
                 stage("mine", "shard", "src", {{"num_shards", "2"}, {"index", "0"}}) + sink_after("mine");
    QCOMPARE(all_integers(run_text_as_worker(fixed, worker(1, 4)).lines), (Ints{0, 2, 4, 6, 8}));
  }

  void sharding_off_copies_the_data_with_a_seed_per_worker() {
    auto text = "options { seed: 3 sharding: off }\n" + stage("src", "range", "", {{"count", "40"}}) +
                stage("mix", "shuffle", "src", {{"buffer_size", "40"}}) + sink_after("mix");
    auto outputs = run_workers(text, 2);
    Ints all(40);
    std::iota(all.begin(), all.end(), 0);
    QCOMPARE(sorted(outputs[0]), all);
    QCOMPARE(sorted(outputs[1]), all);
    QVERIFY(outputs[0] != outputs[1]);     // each its own shuffle
    QCOMPARE(run_workers(text, 2), outputs);  // the same seed, the same copies
  }

  void sharding_by_file_without_a_file_list_is_refused() {
    auto out = run_text_as_worker("options { sharding: by_file }\n" + stage("src", "range", "", {{"count", "4"}}) + sink_after("src"),
                                  worker(0, 2));
    QVERIFY2(out.error.find("by_file") != std::string::npos && out.error.find("'src'") != std::string::npos, out.error.c_str());
  }

  // ---- equal steps ----

  void equal_steps_drop_gives_every_worker_the_fewest() {
    RecordFiles files({5, 1, 7, 3, 4, 2});  // 22 records
    auto text = read_records(files.pattern(), "options { equal_steps: drop }\n");
    std::vector<sluice::WorkerPlan> plans;
    auto outputs = run_workers(text, 3, &plans);
    for (const auto& o : outputs) QCOMPARE(o.size(), std::size_t(7));  // 22 / 3
    Ints all;
    for (const auto& o : outputs) all.insert(all.end(), o.begin(), o.end());
    QCOMPARE(std::set<long long>(all.begin(), all.end()).size(), std::size_t(21));  // disjoint; one left out
    QVERIFY(mentions(plans[0].notes, "balanced_shard"));
  }

  void equal_steps_pad_gives_every_worker_the_most_in_batches() {
    RecordFiles files({5, 1, 7, 3, 4, 2});  // 22 records: 8, 7, 7 by record
    auto text = read_records(files.pattern(), "options { equal_steps: pad }\n",
                             stage("last", "batch", "parse", {{"batch_size", "3"}}));
    std::vector<Ints> outputs;
    for (int i = 0; i < 3; ++i) {
      auto out = run_text_as_worker(text, worker(i, 3));
      QCOMPARE(out.lines.size(), std::size_t(3));  // ceil(8 / 3) batches each
      outputs.push_back(all_integers(out.lines));
    }
    Ints all;
    for (const auto& o : outputs) all.insert(all.end(), o.begin(), o.end());
    QCOMPARE(std::set<long long>(all.begin(), all.end()).size(), std::size_t(22));  // nothing lost
    QCOMPARE(all.size(), std::size_t(24));                                           // two repeats
  }

  void balanced_shard_evens_every_epoch() {
    // 10 elements, 4 shards: positions give 3, 3, 2, 2; per epoch of repeat(2) after it.
    for (const char* mode : {"drop", "pad"}) {
      for (int i = 0; i < 4; ++i) {
        auto text = stage("src", "range", "", {{"count", "10"}}) +
                    stage("even", "balanced_shard", "src", {{"num_shards", "4"}, {"index", std::to_string(i)}, {"equal_steps", mode}}) +
                    stage("again", "repeat", "even", {{"count", "2"}}) + sink_after("again");
        auto got = all_integers(run_text(text).lines);
        const std::size_t per_epoch = std::string(mode) == "drop" ? 2 : 3;
        QCOMPARE(got.size(), 2 * per_epoch);
        for (long long v : got) QCOMPARE(v % 4, static_cast<long long>(i));
      }
    }
    // A count that divides evenly: every shard gets exactly its own positions, the last shard's
    // last element included (it ends its round: released at once, not held past the end).
    for (const char* mode : {"drop", "pad"})
      for (int i = 0; i < 4; ++i) {
        auto text = stage("src", "range", "", {{"count", "12"}}) +
                    stage("even", "balanced_shard", "src", {{"num_shards", "4"}, {"index", std::to_string(i)}, {"equal_steps", mode}}) +
                    sink_after("even");
        QCOMPARE(all_integers(run_text(text).lines), (Ints{i, i + 4, i + 8}));
      }
    // A shard that would get nothing is padded with the iteration's first element.
    auto tiny = stage("src", "range", "", {{"count", "1"}, {"start", "7"}}) +
                stage("even", "balanced_shard", "src", {{"num_shards", "3"}, {"index", "2"}, {"equal_steps", "pad"}}) + sink_after("even");
    QCOMPARE(all_integers(run_text(tiny).lines), (Ints{7}));
  }

  void equal_steps_warn_about_stages_that_drop_elements_after_the_shard() {
    auto text = "options { equal_steps: drop }\n" + stage("src", "range", "", {{"count", "10"}}) +
                stage("some", "filter_random", "src", {{"p", "0.5"}}) + sink_after("some");
    sluice::WorkerPlan plan;
    auto out = run_text_as_worker(text, worker(0, 2), &plan);
    QCOMPARE(out.result.state, sluice::RunState::Finished);
    QVERIFY2(mentions(plan.warnings, "filter 'some'"), plan.warnings.empty() ? "no warning" : plan.warnings[0].c_str());
  }

  void the_snapshot_and_report_say_which_worker_ran() {
    auto out = run_text_as_worker(stage("src", "range", "", {{"count", "4"}}) + sink_after("src"),
                                  WorkerIdentity{1, 2, "Slurm", "SLURM_PROCID=1, SLURM_NTASKS=2"});
    QCOMPARE(out.snapshot.worker().index(), 1);
    QCOMPARE(out.snapshot.worker().count(), 2);
    QCOMPARE(out.snapshot.worker().source(), std::string("Slurm: SLURM_PROCID=1, SLURM_NTASKS=2"));
    QVERIFY(out.snapshot.worker().notes_size() > 0);
  }
};

QTEST_GUILESS_MAIN(TestWorkers)
#include "tst_workers.moc"
