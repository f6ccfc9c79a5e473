#include "sluice/core/registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <fmt/format.h>

#include "sluice/core/param_parse.hpp"
#include "sluice/core/text.hpp"
#include "plugin_probe.hpp"
#include "registry_cache.hpp"
#include "sluice/plugin.hpp"

namespace fs = std::filesystem;

namespace sluice {

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

// A plugin library as the registry knows it: described (from the registry cache or a probe), and
// loaded into this process only when one of its operators is first built.
class PluginLibrary {
 public:
  PluginLibrary(std::string path, const registry::Library& described)
      : path_(std::move(path)), size_(described.size()), mtime_ns_(described.mtime_ns()), identity_(described.identity()) {}

  // Builds operator `name` with the library's own factory, loading the library the first time.
  std::unique_ptr<Operator> create(const std::string& name, const Params& params) {
    OperatorFactory* factory = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!library_.is_loaded()) load();
      auto it = factories_.find(name);
      if (it == factories_.end())
        throw Error(fmt::format("plugin library {} no longer registers operator '{}' (it changed since it was described; "
                                "run again)",
                                path_, name));
      factory = &it->second;
    }
    return (*factory)(params);
  }

  bool loaded() const {
    std::lock_guard lock(mutex_);
    return library_.is_loaded();
  }

 private:
  using OperatorFactory = std::function<std::unique_ptr<Operator>(const Params&)>;

  void load() {
    // The description vouches for the file as it was probed: another file at the path since then
    // has not been through a probe, and is not loaded.
    registry::Library now;
    if (!describe_file_key(path_, now) || now.size() != size_ || now.mtime_ns() != mtime_ns_ || now.identity() != identity_)
      throw Error(fmt::format("plugin library {} changed since its operators were listed; run again to describe it anew", path_));
    boost::dll::fs::error_code ec;
    library_.load(path_, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
    if (ec) throw Error(fmt::format("plugin library {} cannot be loaded: {}", path_, loader_error(path_)));
    CollectingRegistrar registrar;
    try {
      const PluginDescriptor* descriptor = nullptr;
      if (library_.has(SLUICE_PLUGIN_ENTRY_SYMBOL)) descriptor = library_.get<const PluginDescriptor*()>(SLUICE_PLUGIN_ENTRY_SYMBOL)();
      if (!descriptor || !descriptor->register_operators) throw Error("it has no entry or no registration function");
      descriptor->register_operators(registrar);
    } catch (const std::exception& e) {
      factories_.clear();
      library_.unload();
      throw Error(fmt::format("plugin library {} failed to register its operators in this process: {}", path_, e.what()));
    }
    for (auto& info : registrar.operators) factories_.emplace(info.name, std::move(info.create));
  }

  mutable std::mutex mutex_;
  // Declared before the factories, so destroyed after them: their code is in the library.
  boost::dll::shared_library library_;
  std::map<std::string, OperatorFactory> factories_;
  const std::string path_;
  const std::uint64_t size_;
  const std::int64_t mtime_ns_;
  const std::string identity_;
};

Registry::Registry() { add_core_operators(*this); }

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
    if (it->path().extension() == ".left-out" && it->is_regular_file(kind_error)) {
      std::ifstream in(it->path());
      std::string note(4096, '\0');
      in.read(note.data(), static_cast<std::streamsize>(note.size()));
      note.resize(static_cast<std::size_t>(in.gcount()));
      while (!note.empty() && (note.back() == '\n' || note.back() == ' ')) note.pop_back();
      left_out_.push_back({it->path().string(), note});
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) add_library(f);
  save_cache();
}

const LeftOutPlugin* Registry::left_out_with(std::string_view name) const {
  for (const auto& plugin : left_out_) {
    // The note begins with the operators it would register: "parquet_reader, parquet_writer: ...".
    const std::string_view head = std::string_view(plugin.note).substr(0, plugin.note.find(':'));
    for (std::size_t at = head.find(name); at != std::string_view::npos; at = head.find(name, at + 1)) {
      const bool starts = at == 0 || head[at - 1] == ' ' || head[at - 1] == ',';
      const std::size_t end = at + name.size();
      if (starts && (end == head.size() || head[end] == ',')) return &plugin;
    }
  }
  return nullptr;
}

RegistryCache& Registry::cache() {
  if (!cache_) cache_ = std::make_unique<RegistryCache>(cache_file_ ? *cache_file_ : RegistryCache::default_file());
  return *cache_;
}

void Registry::set_cache_file(fs::path file) {
  cache_file_ = std::move(file);
  cache_.reset();
}

fs::path Registry::cache_file() { return cache().file(); }

bool Registry::load_library(const fs::path& file) {
  const bool loaded = add_library(file);
  save_cache();
  return loaded;
}

void Registry::save_cache() {
  cache().save();
  if (auto warning = cache().take_warning(); !warning.empty()) warnings_.push_back(std::move(warning));
}

registry::Library Registry::describe(const fs::path& file, std::string& described_by) {
  registry::Library key;
  if (!describe_file_key(file, key)) {  // cannot be examined: probed every time
    described_by = "probed (not cached: the file could not be read whole)";
    return probe_library(file);
  }
  if (const registry::Library* kept = cache().find(key)) {
    described_by = "registry cache " + cache().file().string();
    return *kept;
  }
  registry::Library described = probe_library(file);
  described.MergeFrom(key);  // the key's fields, which the probe leaves empty
  described_by = "probed";
  if (described.refusal().empty() || described.refusal_depends_on_file_only()) cache().remember(described);
  return described;
}

bool Registry::add_library(const fs::path& file) {
  const std::string path = file.string();
  auto refuse = [&](std::string reason) {
    refused_.push_back({path, std::move(reason)});
    return false;
  };
  for (const auto& p : plugins_)
    if (p.path == path) return true;

  if (auto problem = check_plugin_file(file); !problem.empty()) return refuse(problem);
  std::string described_by;
  const registry::Library described = describe(file, described_by);
  if (!described.refusal().empty()) return refuse(described.refusal());
  for (const auto& op : described.operators())
    if (auto existing = find(op.name()))
      return refuse(fmt::format("registers operator '{}', already registered by plugin '{}' ({})", op.name(),
                                existing->plugin_name, existing->library_path));

  auto library = std::make_shared<PluginLibrary>(path, described);
  for (const auto& op : described.operators()) {
    auto registered = std::make_shared<RegisteredOperator>();
    registered->library = library;
    registered->info = operator_from(op);
    registered->info.create = [library, name = op.name()](const Params& params) { return library->create(name, params); };
    registered->plugin_name = described.plugin_name();
    registered->library_path = path;
    registered->abi_minor = described.abi_minor();
    operators_.push_back(std::move(registered));
  }
  plugins_.push_back({described.plugin_name(), described.version(), described.summary(), path, described_by});
  libraries_.emplace(path, std::move(library));
  return true;
}

bool Registry::library_loaded(const std::string& path) const {
  auto it = libraries_.find(path);
  return it != libraries_.end() && it->second->loaded();
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

std::shared_ptr<const RegisteredOperator> Registry::with_role(OperatorRole role) const {
  std::shared_ptr<const RegisteredOperator> chosen;
  for (const auto& op : operators_)
    if (op->info.traits.role == role && (!chosen || op->info.name < chosen->info.name)) chosen = op;
  return chosen;
}

bool Registry::has_role(std::string_view name, OperatorRole role) const {
  const auto op = find(name);
  return op && op->info.traits.role == role;
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
