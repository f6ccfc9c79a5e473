// The plugins the module describes and loads (bundled, SLUICE_PLUGIN_PATH, plugin_dirs=), the
// errors it raises (sluice.SpecError, sluice.PipelineError), and a pipeline file read with its
// overrides.
#include "native.hpp"

namespace sluice::python {

// ---- plugins -----------------------------------------------------------------------------------

std::mutex g_registry_mutex;
Registry& registry() {
  static auto* r = new Registry;  // operators' code lives in the plugin libraries: never unloaded
  return *r;
}
std::set<std::string>& loaded_dirs() {
  static auto* dirs = new std::set<std::string>;
  return *dirs;
}

// The plugins built or installed with this module: ../../lib/sluice/plugins from the build tree's
// python/sluice/, ../../../sluice/plugins from an installed lib/python3/dist-packages/sluice/.
std::vector<fs::path> bundled_plugin_dirs() {
  std::error_code ec;
  fs::path self = boost::dll::this_line_location(ec);
  if (ec) return {};
  const fs::path folder = self.parent_path();
  return {(folder / ".." / ".." / "lib" / "sluice" / "plugins").lexically_normal(),
          (folder / ".." / ".." / ".." / "sluice" / "plugins").lexically_normal()};
}

// Describes the bundled plugins, SLUICE_PLUGIN_PATH and `extra` (once each) through the registry
// cache, and adds the host operators; a plugin library's code is loaded when a pipeline uses it.
Registry& loaded_registry(const std::vector<std::string>& extra) {
  std::lock_guard lock(g_registry_mutex);
  Registry& r = registry();
  static bool first = true;
  std::vector<fs::path> dirs;
  if (first) {
    first = false;
    add_host_operators(r);
    for (const auto& d : bundled_plugin_dirs())
      if (fs::is_directory(d)) {
        dirs.push_back(d);
        break;
      }
    for (const auto& d : Registry::search_path({}))
      if (d != Registry::bundled_plugin_dir()) dirs.push_back(d);  // python's own folder has no plugins
  }
  for (const auto& d : extra) {
    if (!fs::is_directory(d)) throw Error("plugin folder '" + d + "' does not exist");
    dirs.emplace_back(d);
  }
  for (const auto& d : dirs) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(d, ec).string();
    if (!loaded_dirs().insert(key).second) continue;
    r.load_directory(d);
  }
  // A damaged registry cache (rebuilt) is worth a warning, once per process.
  static std::size_t warned = 0;
  for (; warned < r.warnings().size(); ++warned)
    if (PyErr_WarnEx(PyExc_RuntimeWarning, r.warnings()[warned].c_str(), 1) != 0) throw py::error_already_set();
  return r;
}

// ---- errors ------------------------------------------------------------------------------------

py::object g_spec_error, g_pipeline_error;

[[noreturn]] void raise_spec_error(const SpecError& e) {
  py::list problems;
  for (const auto& p : e.problems()) {
    py::dict d;
    d["file"] = p.file;
    d["line"] = p.line;
    d["column"] = p.column;
    d["stage"] = p.stage;
    d["param"] = p.param;
    d["message"] = p.message;
    d["text"] = p.to_string();
    problems.append(d);
  }
  py::object error = g_spec_error(py::str(e.what()));
  error.attr("problems") = problems;
  PyErr_SetObject(g_spec_error.ptr(), error.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_pipeline_error(const std::string& message, const std::string& stage) {
  py::gil_scoped_acquire hold;
  py::object error = g_pipeline_error(py::str(message));
  error.attr("stage") = stage;
  PyErr_SetObject(g_pipeline_error.ptr(), error.ptr());
  throw py::error_already_set();
}

// This process's place among the job's workers (torchrun's RANK and WORLD_SIZE, Slurm, MPI, ...),
// or the one asked for; the same rules as the CLI's --worker-index/--num-workers.
WorkerIdentity worker_of(std::optional<int> index, std::optional<int> count) {
  try {
    return detect_worker_identity(process_environment(), {index, count, "worker_index/num_workers"});
  } catch (const WorkerIdentityError& e) {
    throw py::value_error(e.what());
  }
}

PrepareOptions prepare_options(const std::map<std::string, std::string>& sets, std::optional<std::uint64_t> seed) {
  PrepareOptions options;
  for (const auto& [key, value] : sets) options.sets.push_back(key + "=" + value);
  options.seed = seed;
  options.split_distributed = service::split_at_service;  // a `distribute` stage and those before it run on the Sluice service
  return options;
}

PipelineDocument document_of(const std::string& text, const std::string& file, const std::map<std::string, std::string>& sets,
                             std::optional<std::uint64_t> seed) {
  try {
    PipelineDocument doc = parse_pipeline(text, file);
    prepare_document(doc, prepare_options(sets, seed));
    return doc;
  } catch (const SpecError& e) {
    raise_spec_error(e);
  }
}

}  // namespace sluice::python
