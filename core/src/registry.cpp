#include "sluice/core/registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <fmt/format.h>

#include "sluice/core/param_parse.hpp"
#include "sluice/core/text.hpp"
#include "plugin_probe.hpp"
#include "sluice/plugin.hpp"

namespace fs = std::filesystem;

namespace sluice {

class PluginLibrary {
 public:
  boost::dll::shared_library library;
};

namespace {

// Boost.DLL discards dlerror()'s text; a second dlopen of a library that failed to load has no
// side effect and gives the loader's own explanation (missing dependency, wrong architecture).
std::string loader_error(const fs::path& file) {
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle) {
    ::dlclose(handle);
    return "the dynamic loader refused it";
  }
  const char* text = ::dlerror();
  return text ? text : "the dynamic loader refused it";
}

}  // namespace

Registry::Registry() = default;

Registry::~Registry() {
  // Operators (whose factories live in the libraries) go before the libraries they came from;
  // RegisteredOperator's member order already guarantees it for each one.
  operators_.clear();
}

fs::path Registry::bundled_plugin_dir() {
  std::error_code ec;
  fs::path exe = boost::dll::program_location(ec);
  if (ec || exe.empty()) return {};
  return (exe.parent_path() / ".." / "lib" / "sluice" / "plugins").lexically_normal();
}

std::vector<fs::path> Registry::search_path(const std::vector<fs::path>& extra_dirs) {
  std::vector<fs::path> dirs;
  if (auto bundled = bundled_plugin_dir(); !bundled.empty()) dirs.push_back(bundled);
  if (const char* env = std::getenv("SLUICE_PLUGIN_PATH")) {
    std::string_view rest = env;
    while (!rest.empty()) {
      auto colon = rest.find(':');
      auto part = rest.substr(0, colon);
      if (!part.empty()) dirs.emplace_back(std::string(part));
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  dirs.insert(dirs.end(), extra_dirs.begin(), extra_dirs.end());
  return dirs;
}

void Registry::load_search_path(const std::vector<fs::path>& extra_dirs) {
  std::set<fs::path> seen;
  for (const auto& dir : search_path(extra_dirs)) {
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(dir, ec);
    if (!seen.insert(ec ? dir : canonical).second) continue;
    load_directory(dir);
  }
}

void Registry::load_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> files;
  // Error codes throughout: an entry that cannot be examined (a symlink loop) is refused by
  // load_library with its reason, never an exception out of the directory walk.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind_error;
    if (it->path().extension() == ".so" && !it->is_directory(kind_error)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) load_library(f);
}

bool Registry::load_library(const fs::path& file) {
  const std::string path = file.string();
  auto refuse = [&](std::string reason) {
    refused_.push_back({path, std::move(reason)});
    return false;
  };
  for (const auto& p : plugins_)
    if (p.path == path) return true;

  if (auto problem = check_plugin_file(file); !problem.empty()) return refuse(problem);
  if (auto problem = probe_plugin_in_child(file); !problem.empty()) return refuse(problem);

  auto lib = std::make_shared<PluginLibrary>();
  boost::dll::fs::error_code ec;
  lib->library.load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
  if (ec) return refuse("cannot be loaded: " + loader_error(file));
  if (!lib->library.has(SLUICE_PLUGIN_ENTRY_SYMBOL))
    return refuse("has no entry symbol '" SLUICE_PLUGIN_ENTRY_SYMBOL "' (was it declared with SLUICE_PLUGIN?)");

  const PluginDescriptor* descriptor = nullptr;
  try {
    descriptor = lib->library.get<const PluginDescriptor*()>(SLUICE_PLUGIN_ENTRY_SYMBOL)();
  } catch (const std::exception& e) {
    return refuse(fmt::format("its entry function threw: {}", e.what()));
  }
  if (!descriptor) return refuse("its entry function returned no descriptor");
  if (descriptor->abi_major != kAbiMajor)
    return refuse(fmt::format("built for plugin ABI {}.{}, this host has ABI {}.{} (major versions differ: rebuild the "
                              "plugin against this SDK)",
                              descriptor->abi_major, descriptor->abi_minor, kAbiMajor, kAbiMinor));
  if (descriptor->abi_minor > kAbiMinor)
    return refuse(fmt::format("built for plugin ABI {}.{}, newer than this host's {}.{} (upgrade Sluice or rebuild the "
                              "plugin against this SDK)",
                              descriptor->abi_major, descriptor->abi_minor, kAbiMajor, kAbiMinor));
  const std::string plugin_name = descriptor->name ? descriptor->name : "";
  if (plugin_name.empty()) return refuse("its descriptor has no plugin name");
  if (!descriptor->register_operators) return refuse("its descriptor has no registration function");

  CollectingRegistrar registrar;
  try {
    descriptor->register_operators(registrar);
  } catch (const std::exception& e) {
    return refuse(fmt::format("registering its operators threw: {}", e.what()));
  } catch (...) {
    return refuse("registering its operators threw a non-standard exception");
  }

  std::set<std::string> names_in_library;
  for (const auto& info : registrar.operators) {
    if (info.name.empty()) return refuse("registers an operator with no name");
    if (!info.create) return refuse(fmt::format("operator '{}' has no factory", info.name));
    if (info.kind == OperatorKind::Combine &&
        (info.min_inputs < 1 || (info.max_inputs != kAnyNumberOfInputs && info.max_inputs < info.min_inputs)))
      return refuse(fmt::format("combine operator '{}' takes {} to {} inputs; min_inputs must be 1 or more and max_inputs "
                                "at least min_inputs (or kAnyNumberOfInputs)",
                                info.name, info.min_inputs, info.max_inputs));
    if (!names_in_library.insert(info.name).second)
      return refuse(fmt::format("registers operator '{}' twice", info.name));
    if (auto existing = find(info.name))
      return refuse(fmt::format("registers operator '{}', already registered by plugin '{}' ({})", info.name,
                                existing->plugin_name, existing->library_path));
    // Build one with default parameters where every parameter has one: a plugin whose operators
    // cannot even be constructed is refused now, not in the middle of someone's run.
    bool all_defaults = std::all_of(info.params.begin(), info.params.end(), [](const auto& p) { return !p.required(); });
    if (all_defaults) {
      try {
        Params defaults = parse_params(info.params, {});
        auto probe = info.create(defaults);
        if (!probe) return refuse(fmt::format("operator '{}' factory returned nothing", info.name));
      } catch (const std::exception& e) {
        return refuse(fmt::format("operator '{}' failed to construct with default parameters: {}", info.name, e.what()));
      } catch (...) {
        return refuse(fmt::format("operator '{}' failed to construct with default parameters", info.name));
      }
    }
  }

  for (auto& info : registrar.operators) {
    auto op = std::make_shared<RegisteredOperator>();
    op->library = lib;
    op->info = std::move(info);
    op->plugin_name = plugin_name;
    op->library_path = path;
    op->abi_minor = descriptor->abi_minor;
    operators_.push_back(std::move(op));
  }
  plugins_.push_back({plugin_name, descriptor->version ? descriptor->version : "", descriptor->summary ? descriptor->summary : "", path});
  return true;
}

void Registry::add_host_operator(OperatorInfo info, const std::string& provider) {
  if (info.name.empty() || !info.create) throw Error("a host operator needs a name and a factory");
  if (auto existing = find(info.name))
    throw Error(fmt::format("operator '{}' is already registered by plugin '{}'", info.name, existing->plugin_name));
  auto op = std::make_shared<RegisteredOperator>();
  op->info = std::move(info);
  op->plugin_name = provider;
  op->library_path = "(built into " + provider + ")";
  operators_.push_back(std::move(op));
}

std::shared_ptr<const RegisteredOperator> Registry::find(std::string_view name) const {
  for (const auto& op : operators_)
    if (op->info.name == name) return op;
  return nullptr;
}

std::vector<std::string> Registry::closest(std::string_view name, std::size_t count) const {
  std::vector<std::string> names;
  for (const auto& op : operators_) names.push_back(op->info.name);
  return closest_names(name, names, count);
}

std::vector<std::shared_ptr<const RegisteredOperator>> Registry::operators() const {
  std::vector<std::shared_ptr<const RegisteredOperator>> out(operators_.begin(), operators_.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->info.name < b->info.name; });
  return out;
}

}  // namespace sluice
