// The `sluice` command: run, validate and inspect pipelines headless.
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "sluice/core/engine.hpp"
#include "sluice/core/param_parse.hpp"
#include "sluice/core/process.hpp"
#include "sluice/core/registry.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/spec.hpp"
#include "sluice/core/text.hpp"

namespace {

constexpr int kExitRunFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInterrupted = 130;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

struct CommonOptions {
  std::vector<std::string> plugin_dirs;
};

void load_plugins(sluice::Registry& registry, const CommonOptions& common, bool warn) {
  std::vector<std::filesystem::path> dirs(common.plugin_dirs.begin(), common.plugin_dirs.end());
  registry.load_search_path(dirs);
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
  std::string s = t.stateless ? "stateless (parallel workers allowed)" : "stateful (one worker)";
  if (t.random) s += ", random (per-element generator)";
  if (t.keeps_shape) s += ", keeps shapes (size hints pass through)";
  return s;
}

void print_operator_json(std::string& out, const sluice::RegisteredOperator& op) {
  const auto& info = op.info;
  out += fmt::format("{{\"name\":{},\"kind\":{},\"summary\":{},\"plugin\":{},\"library\":{},\"stateless\":{},\"random\":{},\"params\":[",
                     json_string(info.name), json_string(sluice::operator_kind_name(info.kind)), json_string(info.summary),
                     json_string(op.plugin_name), json_string(op.library_path), info.traits.stateless, info.traits.random);
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
  } else {
    const auto& op = *ops.front();
    const auto& info = op.info;
    fmt::print("{}\n  {}\n\n  kind:    {}\n  traits:  {}\n  plugin:  {} ({})\n\nParameters:\n", info.name, info.summary,
               sluice::operator_kind_name(info.kind), traits_text(info.traits), op.plugin_name, op.library_path);
    if (info.params.empty()) fmt::print("  (none)\n");
    for (const auto& p : info.params)
      fmt::print("  {:<24} {}\n  {:<24} {}\n", p.name, sluice::describe_param_constraints(p), "", p.doc);
  }
  if (verbose || registry.refused().size()) {
    if (verbose) {
      fmt::print("\nPlugins loaded:\n");
      for (const auto& p : registry.plugins()) fmt::print("  {} {} ({})\n", p.name, p.version, p.path);
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

// Reads, overrides and validates; prints every problem and returns nullopt when invalid.
std::optional<sluice::Graph> load_graph(const sluice::Registry& registry, const std::string& file,
                                        const std::vector<std::string>& sets, std::optional<std::uint64_t> seed) {
  try {
    auto doc = sluice::read_pipeline_file(file);
    sluice::apply_overrides(doc, sets);
    if (seed) doc.spec.mutable_options()->set_seed(*seed);
    return sluice::build_graph(doc, registry);
  } catch (const sluice::SpecError& e) {
    for (const auto& p : e.problems()) fmt::print(stderr, "error: {}\n", p.to_string());
    if (e.problems().size() > 1) fmt::print(stderr, "{} problems; the pipeline was not run.\n", e.problems().size());
    return std::nullopt;
  }
}

int cmd_validate(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  auto graph = load_graph(registry, file, sets, std::nullopt);
  if (!graph) return kExitBadInput;
  fmt::print("{}: valid, {} stages\n", file, graph->stages.size());
  for (const auto& st : graph->stages)
    for (const auto& note : st.notes) fmt::print("  stage '{}': {}\n", st.id, note);
  return 0;
}

int cmd_run(const CommonOptions& common, const std::string& file, const std::vector<std::string>& sets,
            std::optional<std::uint64_t> seed) {
  sluice::Registry registry;
  load_plugins(registry, common, true);
  auto graph = load_graph(registry, file, sets, seed);
  if (!graph) return kExitBadInput;

  for (const auto& st : graph->stages)
    for (const auto& note : st.notes) fmt::print(stderr, "note: stage '{}': {}\n", st.id, note);
  std::unique_ptr<sluice::Engine> engine;
  try {
    engine = std::make_unique<sluice::Engine>(std::move(*graph));
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    engine->start();
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitRunFailed;
  }
  bool interrupted = false;
  while (!engine->wait_for(std::chrono::milliseconds(50))) {
    if (g_interrupted && !interrupted) {
      interrupted = true;
      fmt::print(stderr, "\ninterrupted: stopping the pipeline...\n");
      engine->stop();
    }
  }
  auto result = engine->wait();
  fmt::print("{}", sluice::format_report(engine->snapshot()));
  std::fflush(stdout);
  if (result.state == sluice::RunState::Failed) {
    fmt::print(stderr, "error: {}\n", result.error);
    return kExitRunFailed;
  }
  if (interrupted || g_interrupted) return kExitInterrupted;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sluice::tune_process_for_streaming();
  CLI::App app{"Sluice: machine-learning input pipelines, headless"};
  app.require_subcommand(1);
  CommonOptions common;
  std::string file, op_name;
  std::vector<std::string> sets;
  std::optional<std::uint64_t> seed;
  bool json = false, verbose = false;

  auto add_plugin_dir = [&](CLI::App* cmd) {
    cmd->add_option("--plugin-dir", common.plugin_dirs, "extra folder of plugin libraries (repeatable)");
  };
  auto* run = app.add_subcommand("run", "run a pipeline and print a per-stage report");
  run->add_option("pipeline", file, "pipeline file (.txtpb, or .json)")->required();
  run->add_option("--set", sets, "override a parameter: STAGE.PARAM=VALUE (repeatable)");
  run->add_option("--seed", seed, "override the pipeline's seed");
  add_plugin_dir(run);
  auto* validate = app.add_subcommand("validate", "check a pipeline without running it");
  validate->add_option("pipeline", file, "pipeline file")->required();
  validate->add_option("--set", sets, "override a parameter: STAGE.PARAM=VALUE (repeatable)");
  add_plugin_dir(validate);
  auto* plugins = app.add_subcommand("plugins", "list operators, or describe one");
  plugins->add_option("operator", op_name, "operator to describe");
  plugins->add_flag("--json", json, "machine-readable output");
  plugins->add_flag("--verbose", verbose, "also list plugin libraries, the search path, and refused libraries");
  add_plugin_dir(plugins);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadInput;
  }
  try {
    if (*run) return cmd_run(common, file, sets, seed);
    if (*validate) return cmd_validate(common, file, sets);
    if (*plugins) return cmd_plugins(common, op_name, json, verbose);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return kExitRunFailed;
  }
  return kExitBadInput;
}
