#include "sluice/core/workers.hpp"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "sluice/core/text.hpp"
#include "sluice/rng.hpp"

namespace sluice {

std::string WorkerIdentity::origin() const { return variables.empty() ? source : source + ": " + variables; }

std::string WorkerIdentity::describe() const { return fmt::format("worker {} of {} ({})", index, count, origin()); }

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

namespace {

constexpr int kMaxWorkers = 1 << 20;

// One launcher's reading: index and count when it gives both, the variables it read.
struct Reading {
  std::string source;
  std::optional<int> index;
  std::optional<int> count;
  std::vector<std::string> variables;  // "NAME=value"
  std::string joined() const { return fmt::format("{}", fmt::join(variables, ", ")); }
};

int parse_number(const std::string& name, const std::string& value, int min, const char* what) {
  int number = 0;
  const char* end = value.data() + value.size();
  auto [at, error] = std::from_chars(value.data(), end, number);
  if (error != std::errc() || at != end || number < min || number >= kMaxWorkers)
    throw WorkerIdentityError(fmt::format("{}='{}' is not {}; fix or unset the variable, or give --worker-index and "
                                          "--num-workers",
                                          name, printable(value), what));
  return number;
}

// A pair of variables (index, count); either may be absent from a launcher that sets only one.
std::optional<Reading> read_pair(const Environment& env, std::string source, const std::string& index_name,
                                 const std::vector<std::string>& count_names) {
  auto index = env(index_name);
  std::optional<std::string> count;
  std::string count_name;
  for (const auto& name : count_names)
    if (!count && (count = env(name))) count_name = name;
  if (!index && !count) return std::nullopt;
  Reading r;
  r.source = std::move(source);
  if (index) {
    r.index = parse_number(index_name, *index, 0, "a worker index (0 or more)");
    r.variables.push_back(index_name + "=" + printable(*index));
  }
  if (count) {
    r.count = parse_number(count_name, *count, 1, "a number of workers (1 or more)");
    r.variables.push_back(count_name + "=" + printable(*count));
  }
  return r;
}

std::string json_kind(const google::protobuf::Value& v) {
  switch (v.kind_case()) {
    case google::protobuf::Value::kNumberValue: return "a number";
    case google::protobuf::Value::kStringValue: return "a string";
    case google::protobuf::Value::kBoolValue: return "a boolean";
    case google::protobuf::Value::kStructValue: return "an object";
    case google::protobuf::Value::kListValue: return "a list";
    default: return "null";
  }
}

// TF_CONFIG: {"cluster": {"chief": [...], "worker": [...], "ps": [...]}, "task": {"type": "worker",
// "index": 1}}. Counted as TensorFlow's MultiWorkerMirroredStrategy counts its input pipelines:
// the chief trains and reads data too, as worker 0, and worker k is then k + 1.
std::optional<Reading> read_tf_config(const Environment& env) {
  auto text = env("TF_CONFIG");
  if (!text) return std::nullopt;
  auto fail = [&](const std::string& why) {
    return WorkerIdentityError(fmt::format("TF_CONFIG {}; it should read like {{\"cluster\": {{\"worker\": [\"host:port\", ...]}}, "
                                           "\"task\": {{\"type\": \"worker\", \"index\": 0}}}} (or give --worker-index and "
                                           "--num-workers)",
                                           why));
  };
  if (const std::size_t depth = json_nesting_depth(*text); depth > kDeepestJson)
    throw fail(fmt::format("nests {} levels of arrays and objects (more than {})", depth, kDeepestJson));
  google::protobuf::Struct config;
  auto status = google::protobuf::util::JsonStringToMessage(*text, &config);
  if (!status.ok()) throw fail(fmt::format("is not JSON ({})", printable(std::string(status.message()))));
  const auto& fields = config.fields();
  auto task_it = fields.find("task");
  if (task_it == fields.end()) throw fail("has no \"task\"");
  if (!task_it->second.has_struct_value()) throw fail(fmt::format("has a \"task\" that is {}, not an object", json_kind(task_it->second)));
  const auto& task = task_it->second.struct_value().fields();
  auto type_it = task.find("type");
  if (type_it == task.end() || !type_it->second.has_string_value()) throw fail("has no \"task\": {\"type\": ...} string");
  const std::string type = type_it->second.string_value();
  int task_index = 0;
  if (auto index_it = task.find("index"); index_it != task.end()) {
    const auto& v = index_it->second;
    if (!v.has_number_value() || v.number_value() < 0 || v.number_value() != std::floor(v.number_value()) ||
        v.number_value() >= kMaxWorkers)
      throw fail(fmt::format("has a task index that is not a whole number of 0 or more ({})", json_kind(v)));
    task_index = static_cast<int>(v.number_value());
  }
  auto count_of = [&](const std::string& job) -> int {
    auto cluster_it = fields.find("cluster");
    if (cluster_it == fields.end() || !cluster_it->second.has_struct_value()) return 0;
    const auto& cluster = cluster_it->second.struct_value().fields();
    auto job_it = cluster.find(job);
    if (job_it == cluster.end()) return 0;
    if (!job_it->second.has_list_value()) throw fail(fmt::format("has a cluster \"{}\" that is {}, not a list of addresses", job, json_kind(job_it->second)));
    return job_it->second.list_value().values_size();
  };
  if (fields.find("cluster") == fields.end()) throw fail("has no \"cluster\"");
  const int chiefs = count_of("chief") + count_of("master");
  const int workers = count_of("worker");
  Reading r;
  r.source = "TF_CONFIG";
  if (type == "worker") {
    if (task_index >= workers)
      throw fail(fmt::format("says this is worker {} but its cluster lists {} worker{}", task_index, workers, workers == 1 ? "" : "s"));
    r.index = chiefs + task_index;
  } else if (type == "chief" || type == "master") {
    if (task_index >= chiefs) throw fail(fmt::format("says this is {} {} but its cluster lists {}", type, task_index, chiefs));
    r.index = task_index;
  } else {
    throw WorkerIdentityError(fmt::format(
        "TF_CONFIG says this task is a '{}', which trains on no input of its own (only the chief and the workers read "
        "data); run the pipeline on the chief and workers, or give --worker-index and --num-workers to read a shard here",
        printable(type)));
  }
  r.count = chiefs + workers;
  r.variables.push_back(fmt::format("task {} {} of {} chief{} and {} worker{}", printable(type), task_index, chiefs,
                                    chiefs == 1 ? "" : "s", workers, workers == 1 ? "" : "s"));
  return r;
}

}  // namespace

WorkerIdentity detect_worker_identity(const Environment& env, const WorkerRequest& request) {
  if (request.index && !request.count)
    throw WorkerIdentityError(fmt::format("{} gives the worker index {} but not the number of workers; give both",
                                          request.given_by, *request.index));
  if (request.count && *request.count < 1)
    throw WorkerIdentityError(fmt::format("{}: the number of workers is {}; it must be 1 or more", request.given_by, *request.count));
  if (request.index && *request.index < 0)
    throw WorkerIdentityError(fmt::format("{}: the worker index is {}; it must be 0 or more", request.given_by, *request.index));
  if (request.index && *request.index >= *request.count)
    throw WorkerIdentityError(fmt::format("{}: worker index {} is not below the number of workers {} (indices count from 0)",
                                          request.given_by, *request.index, *request.count));
  if (request.index) return {*request.index, *request.count, request.given_by, ""};

  std::vector<Reading> readings;
  auto add = [&](std::optional<Reading> r) {
    if (r) readings.push_back(std::move(*r));
  };
  add(read_pair(env, "Slurm", "SLURM_PROCID", {"SLURM_NTASKS", "SLURM_NPROCS"}));
  add(read_pair(env, "Open MPI", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}));
  add(read_pair(env, "PMI", "PMI_RANK", {"PMI_SIZE"}));
  add(read_pair(env, "PMIx", "PMIX_RANK", {}));
  add(read_tf_config(env));
  add(read_pair(env, "torchrun", "RANK", {"WORLD_SIZE"}));
  add(read_pair(env, "Horovod", "HOROVOD_RANK", {"HOROVOD_SIZE"}));
  add(read_pair(env, "Kubernetes indexed job", "JOB_COMPLETION_INDEX", {}));

  // Launchers started inside a Slurm allocation: their processes inherit the Slurm variables of
  // the step that started the launcher, which describe the launcher, not this process.
  bool nested_in_slurm = false;
  for (const auto& r : readings)
    if (r.source == "Open MPI" || r.source == "torchrun" || r.source == "Horovod") nested_in_slurm = true;
  std::string slurm_note;
  if (nested_in_slurm && !readings.empty() && readings.front().source == "Slurm") {
    slurm_note = fmt::format(", inside Slurm ({} ignored: they describe the launcher's job step)", readings.front().joined());
    readings.erase(readings.begin());
  }

  // The batch script of an sbatch job has the job's SLURM_PROCID=0 and SLURM_NTASKS but no step:
  // a pipeline run there directly (not through srun) is one process, not task 0 of N, and taking
  // it for task 0 would read 1/N of the data without a word.
  if (!readings.empty() && readings.front().source == "Slurm" && !env("SLURM_STEP_ID") && !env("SLURM_STEPID")) {
    const auto& slurm = readings.front();
    if (slurm.count && *slurm.count > 1)
      throw WorkerIdentityError(fmt::format(
          "{} without SLURM_STEP_ID: this is the job's batch script, not one of its {} tasks; start the workers with "
          "`srun sluice run ...`, or give --worker-index 0 --num-workers 1 to run this one process alone",
          slurm.joined(), *slurm.count));
  }

  // Every launcher read must give what it gives completely: an index needs a count from it, from
  // another launcher or from the request (PMIx and Kubernetes give no count).
  for (const auto& r : readings)
    if (r.count && !r.index)
      throw WorkerIdentityError(fmt::format("{} is set but its worker index is not ({} sets both); set it or unset the other",
                                            r.joined(), r.source));

  if (readings.empty()) {
    if (request.count)
      throw WorkerIdentityError(fmt::format(
          "{} gives {} workers but not this one's index, and no launcher variable gives it (SLURM_PROCID, "
          "OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, TF_CONFIG, RANK, HOROVOD_RANK, JOB_COMPLETION_INDEX); give "
          "--worker-index too",
          request.given_by, *request.count));
    return {};
  }

  const Reading& decider = readings.front();
  WorkerIdentity id;
  id.index = *decider.index;
  id.source = decider.source;
  id.variables = decider.joined();
  if (decider.count) {
    id.count = *decider.count;
  } else {
    // The count from the request, else from a later launcher that agrees on the index.
    std::optional<int> count = request.count;
    std::string from = request.given_by;
    for (const auto& r : readings)
      if (!count && r.count) count = r.count, from = r.joined();
    if (!count)
      throw WorkerIdentityError(fmt::format("{} gives this worker's index but not the number of workers; give --num-workers "
                                            "(for a Kubernetes indexed job: the Job's completions)",
                                            decider.joined()));
    id.count = *count;
    id.variables += ", " + (from == request.given_by ? fmt::format("{} {}", from, *count) : from);
  }
  if (request.count && *request.count != id.count)
    throw WorkerIdentityError(fmt::format("{} says {} workers but {} says {}; drop the option or run with {} processes",
                                          request.given_by, *request.count, id.variables, id.count, *request.count));
  if (id.index >= id.count)
    throw WorkerIdentityError(fmt::format("{}: the worker index {} is not below the number of workers {}", id.variables, id.index, id.count));
  for (std::size_t k = 1; k < readings.size(); ++k) {
    const auto& r = readings[k];
    if ((r.index && *r.index != id.index) || (r.count && *r.count != id.count))
      throw WorkerIdentityError(fmt::format(
          "the launchers' variables disagree: {} ({}) makes this worker {} of {}, but {} ({}) says {}{}; unset the stale "
          "ones, or give --worker-index and --num-workers",
          id.source, id.variables, id.index, id.count, r.source, r.joined(), r.index ? fmt::format("index {}", *r.index) : "",
          r.count ? fmt::format("{}{} workers", r.index ? " of " : "", *r.count) : ""));
  }
  id.variables += slurm_note;
  return id;
}

std::string substitute_worker_fields(const std::string& text, const WorkerIdentity& worker) {
  static const std::string kWorker = "{worker}", kCount = "{num_workers}";
  std::string out;
  for (std::size_t at = 0; at < text.size();) {
    if (text.compare(at, kWorker.size(), kWorker) == 0) {
      out += std::to_string(worker.index);
      at += kWorker.size();
    } else if (text.compare(at, kCount.size(), kCount) == 0) {
      out += std::to_string(worker.count);
      at += kCount.size();
    } else {
      out += text[at++];
    }
  }
  return out;
}

std::uint64_t worker_seed(std::uint64_t seed, int index) {
  // A stage hash no stage id gives ("sluice.worker"), so that a worker's seed is unrelated to
  // any stream a stage draws from.
  return Rng(seed, 0x736c756963652e77ULL, 0, static_cast<std::uint64_t>(index)).next_u64();
}

}  // namespace sluice
