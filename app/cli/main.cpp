// The `sluice` command: run, validate and inspect pipelines headless.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "sluice/core/bench.hpp"
#include "sluice/core/checkpoint.hpp"
#include "sluice/core/engine.hpp"
#include "sluice/core/metrics_log.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/prepare.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/core/text.hpp"
#include "cli.hpp"
#include "new_plugin.hpp"

namespace sluice_cli {

volatile std::sig_atomic_t g_interrupted = 0;
volatile std::sig_atomic_t g_checkpoint_and_stop = 0;
// The first Ctrl-C (or SIGTERM, as Slurm sends before its kill) stops the pipeline cleanly; a
// second one ends the process at once, whatever a stage is blocked in. Outputs stay .partial.
extern "C" void on_interrupt(int) {
  if (g_interrupted) {
    static const char message[] = "\ninterrupted again: exiting now; outputs stay .partial\n";
    [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    ::_exit(130);
  }
  g_interrupted = 1;
}

// How long a checkpoint asked for by a signal may still take once the signal comes again: then
// the process ends (130, outputs .partial). Slurm's default KillWait is 30 s, after which its
// SIGKILL ends the job anyway.
constexpr unsigned kCheckpointPatienceSeconds = 30;
static_assert(kCheckpointPatienceSeconds == 30, "the handlers' messages say 30 s");

extern "C" void on_checkpoint_taking_too_long(int) {
  static const char message[] = "\nthe checkpoint asked for did not end within 30 s of the repeated signal: exiting now; outputs stay .partial\n";
  [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  ::_exit(kExitInterrupted);
}

// With --checkpoint, SIGTERM (Slurm's warning before its kill) and SIGUSR1 (`sbatch --signal`)
// ask for a checkpoint at the next batch and a stop there. The same signal again (a launcher that
// signals the process and its group, `scancel` repeated) waits for that checkpoint rather than
// abandoning it, bounded by kCheckpointPatienceSeconds; Ctrl-C twice still ends the run at once.
extern "C" void on_checkpoint_signal(int) {
  if (g_checkpoint_and_stop) {
    if (g_checkpoint_and_stop == 1) {
      g_checkpoint_and_stop = 2;
      static const char message[] = "\nsignal received again: still writing the checkpoint (at most 30 s more)\n";
      [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
      ::alarm(kCheckpointPatienceSeconds);
    }
    return;
  }
  g_checkpoint_and_stop = 1;
}

void install_interrupt_handler(bool checkpoint_on_term) {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  struct sigaction term {};
  term.sa_handler = checkpoint_on_term ? on_checkpoint_signal : on_interrupt;
  sigemptyset(&term.sa_mask);
  sigaction(SIGTERM, &term, nullptr);
  sigaction(SIGUSR1, &term, nullptr);
  struct sigaction too_long {};
  too_long.sa_handler = on_checkpoint_taking_too_long;
  sigemptyset(&too_long.sa_mask);
  sigaction(SIGALRM, &too_long, nullptr);
}

void load_plugins(sluice::Registry& registry, const CommonOptions& common, bool warn) {
  std::vector<std::filesystem::path> dirs(common.plugin_dirs.begin(), common.plugin_dirs.end());
  if (common.no_registry_cache) registry.set_cache_file({});
  registry.load_search_path(dirs);
  add_service_operators(registry);  // what reads a `distribute` stage's output
  for (const auto& w : registry.warnings()) fmt::print(stderr, "warning: {}\n", sluice::printable(w));
  if (warn)
    for (const auto& r : registry.refused())
      fmt::print(stderr, "warning: plugin library {} was not loaded: {}\n", r.path, r.reason);
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) out += fmt::format("\\u{:04x}", c);
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string traits_text(const sluice::OperatorTraits& t) {
  std::string s = t.stateless ? "stateless (parallel workers allowed)" : "stateful (one thread takes its inputs in order)";
  if (t.random) s += ", random (per-element generator)";
  if (t.keeps_shape) s += ", keeps shapes (size hints pass through)";
  if (t.saves_state) s += ", saves its state (checkpoints)";
  if (t.role != sluice::OperatorRole::None) s += fmt::format("; to the host, it {}", sluice::role_name(t.role));
  return s;
}

void print_operator_json(std::string& out, const sluice::RegisteredOperator& op) {
  const auto& info = op.info;
  out += fmt::format("{{\"name\":{},\"kind\":{},\"summary\":{},\"plugin\":{},\"library\":{},\"stateless\":{},\"random\":{},",
                     json_string(info.name), json_string(sluice::operator_kind_name(info.kind)), json_string(info.summary),
                     json_string(op.plugin_name), json_string(op.library_path), info.traits.stateless, info.traits.random);
  if (info.traits.role != sluice::OperatorRole::None) out += fmt::format("\"role\":{},", json_string(sluice::role_name(info.traits.role)));
  if (info.kind == sluice::OperatorKind::Combine)  // -1: any number
    out += fmt::format("\"min_inputs\":{},\"max_inputs\":{},", info.min_inputs, info.max_inputs);
  out += "\"params\":[";
  for (std::size_t i = 0; i < info.params.size(); ++i) {
    const auto& p = info.params[i];
    out += fmt::format("{}{{\"name\":{},\"type\":{},\"doc\":{},\"required\":{}", i ? "," : "", json_string(p.name),
                       json_string(sluice::param_type_name(p.type)), json_string(p.doc), p.required());
    if (p.default_value) out += ",\"default\":" + json_string(*p.default_value);
    if (p.min) out += fmt::format(",\"min\":{}", *p.min);
    if (p.max) out += fmt::format(",\"max\":{}", *p.max);
    if (p.hint_role != sluice::ParamSpec::HintRole::None)
      out += fmt::format(",\"{}\":{}", p.hint_role == sluice::ParamSpec::HintRole::Offers ? "offers_hint" : "takes_hint", json_string(p.hint));
    if (!p.choices.empty()) {
      out += ",\"choices\":[";
      for (std::size_t k = 0; k < p.choices.size(); ++k) out += (k ? "," : "") + json_string(p.choices[k]);
      out += "]";
    }
    out += "}";
  }
  out += "]}";
}

int cmd_plugins(const CommonOptions& common, const std::string& name, bool json, bool verbose) {
  sluice::Registry registry;
  load_plugins(registry, common, false);
  std::vector<std::shared_ptr<const sluice::RegisteredOperator>> ops;
  if (!name.empty()) {
    auto op = registry.find(name);
    if (!op && registry.left_out_with(name)) {
      fmt::print(stderr, "error: operator '{}' is not in this build: {}\n", name, registry.left_out_with(name)->note);
      return kExitBadInput;
    }
    if (!op) {
      fmt::print(stderr, "error: no operator '{}'{}\n", name, sluice::did_you_mean(registry.closest(name)));
      return kExitBadInput;
    }
    ops.push_back(op);
  } else {
    ops = registry.operators();
  }
  if (json) {
    std::string out = "{\"operators\":[";
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (i) out += ",";
      print_operator_json(out, *ops[i]);
    }
    out += "],\"left_out\":[";
    for (std::size_t i = 0; i < registry.left_out().size(); ++i)
      out += fmt::format("{}{{\"path\":{},\"note\":{}}}", i ? "," : "", json_string(registry.left_out()[i].path),
                         json_string(registry.left_out()[i].note));
    out += "],\"refused\":[";
    for (std::size_t i = 0; i < registry.refused().size(); ++i)
      out += fmt::format("{}{{\"path\":{},\"reason\":{}}}", i ? "," : "", json_string(registry.refused()[i].path),
                         json_string(registry.refused()[i].reason));
    out += "]}\n";
    fmt::print("{}", out);
    return 0;
  }
  if (name.empty()) {
    fmt::print("{} operators from {} plugin{}:\n", ops.size(), registry.plugins().size(), registry.plugins().size() == 1 ? "" : "s");
    for (const auto& op : ops) {
      fmt::print("  {:<18} {:<10} {}\n", op->info.name, sluice::operator_kind_name(op->info.kind), op->info.summary);
      for (const auto& p : op->info.params)
        fmt::print("      {:<26} {}: {}\n", p.name, sluice::describe_param_constraints(p), p.doc);
    }
    fmt::print("\n`sluice plugins NAME` describes one operator.\n");
    for (const auto& plugin : registry.left_out()) fmt::print("\nLeft out of this build ({}):\n  {}\n", plugin.path, plugin.note);
  } else {
    const auto& op = *ops.front();
    const auto& info = op.info;
    std::string kind = sluice::operator_kind_name(info.kind);
    if (info.kind == sluice::OperatorKind::Combine)
      kind += info.max_inputs == sluice::kAnyNumberOfInputs ? fmt::format(", {} or more inputs, in order", info.min_inputs)
              : info.min_inputs == info.max_inputs       ? fmt::format(", {} inputs, in order", info.min_inputs)
                                                          : fmt::format(", {} to {} inputs, in order", info.min_inputs, info.max_inputs);
    fmt::print("{}\n  {}\n\n  kind:    {}\n  traits:  {}\n  plugin:  {} ({})\n\nParameters:\n", info.name, info.summary, kind,
               traits_text(info.traits), op.plugin_name, op.library_path);
    if (info.params.empty()) fmt::print("  (none)\n");
    for (const auto& p : info.params)
      fmt::print("  {:<24} {}\n  {:<24} {}\n", p.name, sluice::describe_param_constraints(p), "", p.doc);
  }
  if (verbose || registry.refused().size()) {
    if (verbose) {
      fmt::print("\nPlugins (a library's code is loaded when a pipeline uses one of its operators):\n");
      for (const auto& p : registry.plugins())
        fmt::print("  {} {} ({})\n    described by: {}\n", p.name, p.version, p.path, sluice::printable(p.described_by));
      const auto cache = registry.cache_file();
      fmt::print("Registry cache: {}\n", cache.empty() ? "none (--no-registry-cache, or SLUICE_REGISTRY=off)" : cache.string());
      fmt::print("Search path:\n");
      for (const auto& d : sluice::Registry::search_path({common.plugin_dirs.begin(), common.plugin_dirs.end()}))
        fmt::print("  {}\n", d.string());
      fmt::print("Libraries refused:{}\n", registry.refused().empty() ? " none" : "");
      for (const auto& r : registry.refused()) fmt::print("  {}\n    {}\n", r.path, r.reason);
    } else {
      fmt::print("\n{} plugin librar{} refused; `sluice plugins --verbose` says why.\n", registry.refused().size(),
                 registry.refused().size() == 1 ? "y was" : "ies were");
    }
  }
  return 0;
}

std::optional<sluice::Graph> load_graph(const sluice::Registry& registry, const std::string& file,
                                        const std::vector<std::string>& sets, std::optional<std::uint64_t> seed,
                                        const WorkerArgs& worker_args, sluice::spec::PipelineSpec* as_run,
                                        std::function<void(sluice::PipelineDocument&)> adapt, const std::string& skip_records) {
  try {
    sluice::PrepareOptions options;
    options.sets = sets;
    options.seed = seed;
    options.worker = {worker_args.index, worker_args.count, "--worker-index/--num-workers"};
    // a `distribute` stage and those before it run on the service
    options.split_distributed = [&registry](sluice::PipelineDocument& doc) { split_at_service(registry, doc); };
    options.adapt = std::move(adapt);
    options.skip_records = skip_records;
    sluice::PreparedPipeline prepared;
    try {
      prepared = sluice::prepare_pipeline(sluice::read_pipeline_file(file), registry, options);
    } catch (const sluice::WorkerIdentityError& e) {
      fmt::print(stderr, "error: {}: {}\n", sluice::printable(file), sluice::printable(e.what()));
      return std::nullopt;
    }
    if (prepared.worker.count > 1) fmt::print(stderr, "note: {}\n", sluice::printable(prepared.worker.describe()));
    for (const auto& note : prepared.plan.notes) fmt::print(stderr, "note: {}\n", sluice::printable(note));
    for (const auto& warning : prepared.plan.warnings) fmt::print(stderr, "warning: {}\n", sluice::printable(warning));
    if (as_run) *as_run = prepared.doc.spec;
    return std::move(prepared.graph);
  } catch (const sluice::SpecError& e) {
    for (const auto& p : e.problems()) fmt::print(stderr, "error: {}\n", p.to_string());
    if (e.problems().size() > 1) fmt::print(stderr, "{} problems; the pipeline was not run.\n", e.problems().size());
    return std::nullopt;
  }
}

int cmd_validate(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets,
                 const WorkerArgs& worker_args) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  auto graph = load_graph(registry, file, sets, std::nullopt, worker_args);
  if (!graph) return kExitBadInput;
  fmt::print("{}: valid, {} stages\n", file, graph->stages.size());
  for (const auto& st : graph->stages)
    for (const auto& note : st.notes) fmt::print("  stage '{}': {}\n", st.id, note);
  return 0;
}

int cmd_bench(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets, bool ablate,
              const sluice::BenchOptions& options) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  try {
    auto doc = sluice::read_pipeline_file(file);
    sluice::PrepareOptions prepare;  // one process, the pipeline as written with its overrides
    prepare.sets = sets;
    sluice::prepare_document(doc, prepare);
    auto graph = sluice::build_graph(doc, registry);
    if (!ablate) {
      fmt::print(stderr, "warming up for {:.1f} s, then measuring for {:.1f} s...\n", options.warmup_s, options.measure_s);
      fmt::print("{}", sluice::format_bench(sluice::run_bench(std::move(graph), options)));
      return 0;
    }
    fmt::print(stderr, "running the pipeline as written and without each feature, {:.1f} s + {:.1f} s each...\n", options.warmup_s,
               options.measure_s);
    fmt::print("{}", sluice::format_ablation(sluice::run_ablation(doc, registry, options)));
    return 0;
  } catch (const sluice::SpecError& e) {
    for (const auto& p : e.problems()) fmt::print(stderr, "error: {}\n", p.to_string());
    return kExitBadInput;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitRunFailed;
  }
}

int cmd_checkpoint_info(const std::string& path) {
  try {
    const auto file = sluice::checkpoint_file(path);
    std::error_code ec;
    // A job's folder: every worker's file, each described.
    if (!std::filesystem::exists(file, ec) && std::filesystem::is_directory(path, ec)) {
      const auto found = sluice::checkpoints_in_folder(path);
      if (!found.empty()) {
        for (const auto& f : found) {
          const auto worker_file = std::filesystem::path(path) / f.name;
          fmt::print("{}: worker {} of {}\n{}", worker_file.string(), f.index, f.count,
                     sluice::describe_checkpoint(sluice::read_checkpoint(worker_file), std::filesystem::file_size(worker_file)));
        }
        return 0;
      }
    }
    const auto checkpoint = sluice::read_checkpoint(file);
    fmt::print("{}", sluice::describe_checkpoint(checkpoint, std::filesystem::file_size(file)));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

// `sluice ledger`: exit 0 when every epoch delivered each record once, 1 when one delivered a
// record twice or missed one (named), 2 when a path holds no ledger.
int cmd_ledger(const std::vector<std::string>& paths) {
  try {
    sluice::DeliveryLedger merged;
    bool ended = true;
    for (const auto& path : paths) {
      const sluice::DeliveryLedger one = sluice::read_ledgers(path);
      ended = ended && one.run_ended();
      merged.merge(one);
    }
    merged.set_run_ended(ended);
    const auto verdicts = merged.verdicts();
    fmt::print("{}", sluice::printable(sluice::format_verdicts(verdicts, ended), true));
    return sluice::verdicts_clean(verdicts) ? 0 : kExitRunFailed;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

int cmd_report(const std::string& file) {
  try {
    auto snapshots = sluice::read_metrics_log(file);
    fmt::print("{}", sluice::format_report(snapshots.back()));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
}

}  // namespace sluice_cli

using namespace sluice_cli;

int cmd_new_plugin(const CommonOptions& common, const NewPluginRequest& request) {
  sluice::Registry registry;
  load_plugins(registry, common, false);
  std::string dir;
  try {
    dir = write_new_plugin(request, registry);
  } catch (const sluice::Error& e) {
    fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
    return kExitBadInput;
  }
  fmt::print("wrote a {} plugin project in {}/: CMakeLists.txt, {}.hpp (the operator), {}.cpp (the entry point), {}_test.cpp, "
             "README.md, pipeline.txtpb\n",
             request.kind, dir, request.name, request.name, request.name);
  fmt::print("build and test it against this Sluice's installed SDK (cmake --install <build> --prefix P):\n"
             "  cmake -S {0} -B {0}/build -DCMAKE_PREFIX_PATH=P && cmake --build {0}/build && ctest --test-dir {0}/build\n"
             "  sluice run {0}/pipeline.txtpb --plugin-dir {0}/build\n",
             dir);
  return 0;
}

namespace {

// The command line: each subcommand's options (add_<command>), and what runs when it is given.
class CommandLine {
 public:
  CommandLine() {
    app_.require_subcommand(1);
    add_run();
    add_bench();
    add_report();
    add_checkpoint();
    add_ledger();
    add_replay();
    add_lineage();
    add_validate();
    add_plugins();
    add_index();
    add_new_plugin();
    add_dispatcher();
    add_worker();
    add_service();
  }

  int run(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app_.exit(e) == 0 ? 0 : kExitBadInput;
    }
    try {
      for (const auto& [command, action] : actions_)
        if (*command) return action();
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", sluice::printable(e.what(), true));
      return kExitRunFailed;
    }
    return kExitBadInput;
  }

 private:
  void on(const CLI::App* command, std::function<int()> action) { actions_.emplace_back(command, std::move(action)); }

  void add_plugin_dir(CLI::App* cmd) {
    cmd->add_option("--plugin-dir", common_.plugin_dirs, "extra folder of plugin libraries (repeatable)");
    cmd->add_flag("--no-registry-cache", common_.no_registry_cache,
                  "describe every plugin library by loading it in a child process, without reading or writing the registry "
                  "cache ($SLUICE_REGISTRY, else $XDG_CACHE_HOME/sluice/registry.bin)");
  }
  void add_worker_options(CLI::App* cmd) {
    cmd->add_option("--worker-index", worker_args_.index,
                    "this process's index among the job's workers (default: from Slurm, MPI, TF_CONFIG, torchrun, ...)");
    cmd->add_option("--num-workers", worker_args_.count,
                    "the job's number of workers (with JOB_COMPLETION_INDEX: the Kubernetes Job's completions)");
  }
  void add_sets(CLI::App* cmd) { cmd->add_option("--set", sets_, "override a parameter: STAGE.PARAM=VALUE (repeatable)"); }
  // The service's processes: TLS and the token.
  static void add_security(CLI::App* cmd, sluice::service::Security& security, bool serves) {
    if (serves) {
      cmd->add_option("--tls-cert", security.tls_cert, "PEM certificate this process serves TLS with (with --tls-key)");
      cmd->add_option("--tls-key", security.tls_key, "PEM private key of --tls-cert");
      cmd->add_flag("--insecure", security.insecure,
                    "serve an address off loopback without TLS and a token (anyone who reaches it may use it; the log says so)");
    }
    cmd->add_option("--tls-ca", security.tls_ca, "PEM authority to trust when talking to the service over TLS");
    cmd->add_option("--token-file", security.token_file,
                    "file holding the service's shared token (required off loopback; on loopback without it the dispatcher makes "
                    "its own, which its user's processes find)");
  }

  void add_run() {
    auto* run = app_.add_subcommand("run", "run a pipeline and print a per-stage report");
    run->add_option("pipeline", file_, "pipeline file (.txtpb, or .json)")->required();
    add_sets(run);
    run->add_option("--seed", seed_, "override the pipeline's seed");
    run->add_flag("--quiet,-q", run_options_.quiet, "no progress line (the report is still printed)");
    run->add_option("--progress-every", run_options_.progress_every,
                    "seconds between progress updates (default 0.5 on a terminal, 10 otherwise)")
        ->check(CLI::PositiveNumber);
    run->add_flag("--explain-autotune", run_options_.explain_autotune,
                  "print each decision of the autotuner (parallelism: -1, buffer_size: -1) as it is made, with its reason");
    run->add_option("--remote-cache", run_options_.remote_cache,
                    "keep local copies of the remote objects read in this folder (options.remote_cache.dir): later epochs and runs read them");
    run->add_option("--metrics-log", run_options_.metrics_log, "append every snapshot to this JSON-lines file (`sluice report` reads it)");
    run->add_option("--metrics-addr", run_options_.metrics_addr,
                    "serve /metrics, /snapshot, /stream and /pipeline over HTTP at [HOST:]PORT; loopback unless HOST is given");
    run->add_option("--checkpoint", run_options_.checkpoint_dir,
                    "write checkpoints to this folder (checkpoint.sluice, replaced atomically); SIGTERM or SIGUSR1 then writes one "
                    "and stops with exit code 75");
    run->add_option("--checkpoint-every", run_options_.checkpoint_every,
                    "also write one every N batches (elements reaching the sinks) or every time span (30s, 5m, 1h)");
    run->add_option("--resume", run_options_.resume, "continue from the checkpoint in this folder (or file) exactly where it was");
    run->add_option("--ledger", run_options_.ledger,
                    "keep the delivery ledger (which records each epoch delivered, carried by checkpoints) and write it to this file at "
                    "the end; `sluice ledger FILE` reads it");
    run->add_option("--skip-records", run_options_.skip_records,
                    "skip the records this file names (\"RECORD SOURCE\" per line, as `sluice lineage` prints them) wherever they "
                    "come; every other element keeps its place and random draws")
        ->check(CLI::ExistingFile);
    run->add_flag("--timings", run_options_.timings,
                  "print what the start cost, by phase (plugins described, pipeline checked, engine started, ...), and which plugin "
                  "libraries the run loaded");
    add_plugin_dir(run);
    add_worker_options(run);
    on(run, [this] { return cmd_run(common_, file_, sets_, seed_, worker_args_, run_options_); });
  }

  void add_bench() {
    auto* bench = app_.add_subcommand("bench", "measure steady-state throughput per stage; --ablate: what each feature brings");
    bench->add_option("pipeline", file_, "pipeline file")->required();
    add_sets(bench);
    bench->add_option("--seconds", bench_options_.measure_s, "measuring window per run (default 5)")->check(CLI::PositiveNumber);
    bench->add_option("--warmup", bench_options_.warmup_s, "seconds run before measuring (default 1)")->check(CLI::NonNegativeNumber);
    bench->add_flag("--ablate", ablate_, "also run it without parallelism, interleave, cache and prefetch, and tabulate the speed-ups");
    add_plugin_dir(bench);
    on(bench, [this] { return cmd_bench(common_, file_, sets_, ablate_, bench_options_); });
  }

  void add_report() {
    auto* report = app_.add_subcommand("report", "print the end-of-run report again from a metrics log");
    report->add_option("log", log_file_, "JSON-lines file written by `sluice run --metrics-log`")->required();
    on(report, [this] { return cmd_report(log_file_); });
  }

  void add_checkpoint() {
    auto* checkpoint = app_.add_subcommand("checkpoint", "inspect checkpoints written by `sluice run --checkpoint`");
    checkpoint->require_subcommand(1);
    auto* info = checkpoint->add_subcommand("info", "print where each stage stood, what the checkpoint holds and its size");
    info->add_option("checkpoint", checkpoint_path_, "checkpoint folder or file")->required();
    on(info, [this] { return cmd_checkpoint_info(checkpoint_path_); });
  }

  void add_ledger() {
    auto* ledger = app_.add_subcommand("ledger", "say whether each epoch delivered every record once, from ledger files or checkpoints");
    ledger->add_option("ledgers", ledger_paths_,
                       "ledger files (`sluice run --ledger`), checkpoints or their folders, Python states' bytes: all merged (give every "
                       "worker's)")
        ->required();
    on(ledger, [this] { return cmd_ledger(ledger_paths_); });
  }

  void add_replay() {
    auto* replay = app_.add_subcommand("replay", "make one step of a run again, exactly as the run made it, and write it to a file");
    replay->add_option("pipeline", file_, "pipeline file, or a checkpoint (file or folder) of the run: its pipeline file and seed")->required();
    replay->add_option("--step", replay_.step, "the step: the sink's input's output number in its epoch, from 0")->required();
    replay->add_option("--epoch", replay_.epoch, "the epoch (default 0)");
    replay->add_option("--out", replay_.out, "JSON-lines file the step is written to (as jsonl_sink writes it), in place of the sink")->required();
    add_sets(replay);
    replay->add_option("--seed", seed_, "override the pipeline's seed, as the run did");
    add_plugin_dir(replay);
    add_worker_options(replay);
    on(replay, [this] { return cmd_replay(common_, file_, sets_, seed_, worker_args_, replay_); });
  }

  void add_lineage() {
    auto* lineage = app_.add_subcommand("lineage", "print the records one step of a run is made of (the step made again, as replay makes it)");
    lineage->add_option("pipeline", file_, "pipeline file, or a checkpoint (file or folder) of the run: its pipeline file and seed")->required();
    lineage->add_option("--step", replay_.step, "the step: the sink's input's output number in its epoch, from 0")->required();
    lineage->add_option("--epoch", replay_.epoch, "the epoch (default 0)");
    lineage->add_flag("--json", lineage_json_, "JSON lines (row, source, record, byte_offset, epoch) rather than \"RECORD SOURCE\" lines");
    add_sets(lineage);
    lineage->add_option("--seed", seed_, "override the pipeline's seed, as the run did");
    add_plugin_dir(lineage);
    add_worker_options(lineage);
    on(lineage, [this] { return cmd_lineage(common_, file_, sets_, seed_, worker_args_, replay_, lineage_json_); });
  }

  void add_validate() {
    auto* validate = app_.add_subcommand("validate", "check a pipeline without running it");
    validate->add_option("pipeline", file_, "pipeline file")->required();
    add_sets(validate);
    add_plugin_dir(validate);
    add_worker_options(validate);
    on(validate, [this] { return cmd_validate(common_, file_, sets_, worker_args_); });
  }

  void add_plugins() {
    auto* plugins = app_.add_subcommand("plugins", "list operators, or describe one");
    plugins->add_option("operator", op_name_, "operator to describe");
    plugins->add_flag("--json", json_, "machine-readable output");
    plugins->add_flag("--verbose", verbose_, "also list plugin libraries, the search path, and refused libraries");
    add_plugin_dir(plugins);
    on(plugins, [this] { return cmd_plugins(common_, op_name_, json_, verbose_); });
  }

  void add_index() {
    auto* index = app_.add_subcommand("index", "write the index files of TFRecord files (the offset of every record), which random_access reads");
    index->add_option("files", index_request_.files, "TFRecord files (not gzip)")->required();
    index->add_option("--index-dir", index_request_.index_dir, "write the indexes into this folder (default: FILE.idx beside each file)");
    index->add_option("--format", index_request_.format, "sluice (checked against the file's size and time) or dali (tfrecord2idx's text)")
        ->check(CLI::IsMember({"sluice", "dali"}));
    index->add_flag("--rebuild", index_request_.rebuild, "write every index again, even one that is up to date");
    index->add_option("--parallelism,-j", index_request_.parallelism, "files indexed at once (default 2)")->check(CLI::PositiveNumber);
    index->add_flag("--quiet,-q", index_request_.quiet, "print nothing but errors (no progress line, no list of what was written)");
    add_plugin_dir(index);
    on(index, [this] { return cmd_index(common_, index_request_); });
  }

  void add_new_plugin() {
    auto* scaffold = app_.add_subcommand("new-plugin", "write a ready out-of-tree plugin project (operator, test, CMake, README)");
    scaffold->add_option("name", new_plugin_.name, "the plugin's and its operator's name (lower-case, digits, underscores)")->required();
    scaffold->add_option("--kind", new_plugin_.kind, "the operator's kind")->required()->check(CLI::IsMember(new_plugin_kinds()));
    scaffold->add_option("--dir", new_plugin_.dir, "the project's folder (default: ./NAME); must be new or empty");
    add_plugin_dir(scaffold);
    on(scaffold, [this] { return cmd_new_plugin(common_, new_plugin_); });
  }

  void add_dispatcher() {
    auto& options = dispatcher_request_.options;
    auto* dispatcher = app_.add_subcommand("dispatcher", "run the service's dispatcher: it knows the workers and hands out the work");
    dispatcher->add_option("--port", options.port, "port to listen on (0: any free one, printed)")->required();
    dispatcher->add_option("--bind", options.bind, "address to listen on (default 127.0.0.1; off loopback needs TLS and a token)");
    dispatcher->add_option("--work-dir", options.work_dir,
                           "folder of its journal: a dispatcher restarted on it continues its jobs (without: a restart forgets them)");
    dispatcher->add_option("--worker-addresses", options.worker_addresses,
                           "the fixed worker list static sharding needs (HOST:PORT,...; worker i makes shard i; others are refused)")
        ->delimiter(',');
    dispatcher->add_option("--metrics-addr", dispatcher_request_.metrics_addr,
                           "serve /metrics (workers, jobs, splits) over HTTP at [HOST:]PORT; loopback unless HOST is given");
    add_security(dispatcher, options.security, true);
    on(dispatcher, [this] { return cmd_dispatcher(dispatcher_request_); });
  }

  void add_worker() {
    auto& options = worker_request_.options;
    auto* worker = app_.add_subcommand("worker", "run a service worker: registers with the dispatcher and runs pipelines for trainers");
    worker->add_option("--dispatcher", options.dispatcher, "the dispatcher, HOST:PORT or grpc://HOST:PORT")->required();
    worker->add_option("--port", options.port, "port to listen on (default 0: any free one, printed)");
    worker->add_option("--bind", options.bind, "address to listen on (default 127.0.0.1; off loopback needs TLS and a token)");
    worker->add_option("--host", options.host, "the name trainers reach this worker by (default: the bind address, or this machine's name)");
    worker->add_option("--metrics-addr", worker_request_.metrics_addr,
                       "serve /metrics (splits made, elements and bytes sent) over HTTP at [HOST:]PORT; loopback unless HOST is given");
    worker->add_flag("--unix-socket", worker_request_.unix_socket,
                     "also listen on a Unix socket, which trainers on this machine then read instead of TCP");
    add_security(worker, options.security, true);
    add_plugin_dir(worker);
    on(worker, [this] { return cmd_worker(common_, worker_request_); });
  }

  void add_service() {
    auto* service = app_.add_subcommand("service", "ask a running service");
    service->require_subcommand(1);
    auto* workers = service->add_subcommand("workers", "list the workers the dispatcher knows, alive or lost");
    workers->add_option("--dispatcher", service_dispatcher_, "the dispatcher, HOST:PORT or grpc://HOST:PORT")->required();
    add_security(workers, service_security_, false);
    on(workers, [this] { return cmd_service_workers(service_dispatcher_, service_security_); });
  }

  CLI::App app_{"Sluice: machine-learning input pipelines, headless"};
  std::vector<std::pair<const CLI::App*, std::function<int()>>> actions_;
  // What the options fill in (shared by the subcommands that take them).
  CommonOptions common_;
  WorkerArgs worker_args_;
  std::string file_, op_name_, log_file_, checkpoint_path_, service_dispatcher_;
  std::vector<std::string> ledger_paths_;
  bool lineage_json_ = false;
  ReplayRequest replay_;
  std::vector<std::string> sets_;
  std::optional<std::uint64_t> seed_;
  bool json_ = false, verbose_ = false, ablate_ = false;
  RunOptions run_options_;
  sluice::BenchOptions bench_options_;
  IndexRequest index_request_;
  NewPluginRequest new_plugin_;
  DispatcherRequest dispatcher_request_;
  WorkerRequest worker_request_;
  sluice::service::Security service_security_;
};

}  // namespace

int main(int argc, char** argv) {
  sluice::tune_process_for_streaming();
  remember_command_line(argc, argv);
  return CommandLine().run(argc, argv);
}
