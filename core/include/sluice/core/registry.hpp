#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/abi.hpp"
#include "sluice/operator.hpp"

namespace sluice {

class PluginLibrary;  // a plugin library, loaded when first used (Boost.DLL); kept alive by what came from it
class RegistryCache;
namespace registry {
class Library;
}

struct PluginRecord {
  std::string name;
  std::string version;
  std::string summary;
  std::string path;
  // Where its description came from: "registry cache FILE", or "probed" (loaded in a child
  // process by this one, because it is new, changed, or there is no cache).
  std::string described_by;
};

// An operator as the registry holds it. `library` is declared first so that it is destroyed
// last: the operator's factory is code inside that library.
struct RegisteredOperator {
  std::shared_ptr<PluginLibrary> library;
  OperatorInfo info;
  std::string plugin_name;
  std::string library_path;
  std::uint32_t abi_minor = kAbiMinor;  // of the SDK the plugin was built against (host operators: this one)
};

struct RefusedLibrary {
  std::string path;
  std::string reason;
};

// A plugin the build left out, as a NAME.left-out note in a plugin folder says (what it would
// register, why it is missing, how to get it): the Parquet plugin of a build without Arrow C++.
struct LeftOutPlugin {
  std::string path;
  std::string note;
};

// Finds and checks plugin libraries, and knows every operator they register. A library is
// described by a probe in a child process (plugin_probe.hpp) or by the registry cache
// (registry_cache.hpp), and its code is loaded into this process only when one of its operators
// is first built (`info.create`): a pipeline of `std` operators never loads the vision library.
// A library is refused as a whole (with the reason kept) when it is not a shared library, lacks
// the entry symbol, was built for another ABI, registers a name already taken, or an operator
// fails to construct with its default parameters; the others still load.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The bundled plugin folder next to the executable (../lib/sluice/plugins), then each folder of
  // SLUICE_PLUGIN_PATH (colon-separated), then `extra_dirs` (--plugin-dir), in that order.
  static std::vector<std::filesystem::path> search_path(const std::vector<std::filesystem::path>& extra_dirs);
  static std::filesystem::path bundled_plugin_dir();

  // The registry cache to read and write: RegistryCache::default_file() ($SLUICE_REGISTRY, else
  // $XDG_CACHE_HOME/sluice/registry.bin) unless set; an empty path: none (--no-registry-cache).
  // Set before loading.
  void set_cache_file(std::filesystem::path file);
  std::filesystem::path cache_file();

  void load_search_path(const std::vector<std::filesystem::path>& extra_dirs = {});
  // Loads every *.so in the folder (sorted by name), and keeps its *.left-out notes. A missing
  // folder is not an error.
  void load_directory(const std::filesystem::path& dir);
  // Returns false (and records why) if the library is refused.
  bool load_library(const std::filesystem::path& file);

  // Registers an operator the host program provides itself (the Python face's python_map, its
  // iterator sink), listed under plugin `provider`. Throws Error when the name is taken.
  void add_host_operator(OperatorInfo info, const std::string& provider);

  std::shared_ptr<const RegisteredOperator> find(std::string_view name) const;
  // The operator that declares `role` (OperatorTraits::role; the first by name when several do),
  // or null.
  std::shared_ptr<const RegisteredOperator> with_role(OperatorRole role) const;
  // Whether operator `name` is registered and declares `role`.
  bool has_role(std::string_view name, OperatorRole role) const;
  // Up to `count` registered names closest to `name`, for "did you mean" messages.
  std::vector<std::string> closest(std::string_view name, std::size_t count = 3) const;
  // Sorted by name.
  std::vector<std::shared_ptr<const RegisteredOperator>> operators() const;
  const std::vector<PluginRecord>& plugins() const { return plugins_; }
  const std::vector<RefusedLibrary>& refused() const { return refused_; }
  const std::vector<LeftOutPlugin>& left_out() const { return left_out_; }
  // The note of a left-out plugin that names operator `name`, or null.
  const LeftOutPlugin* left_out_with(std::string_view name) const;
  // What went wrong with the registry cache (a damaged file, rebuilt), for the host to show.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Whether a described library's code is in this process (one of its operators was built).
  bool library_loaded(const std::string& path) const;

 private:
  bool add_library(const std::filesystem::path& file);
  registry::Library describe(const std::filesystem::path& file, std::string& described_by);
  RegistryCache& cache();
  void save_cache();

  std::vector<std::shared_ptr<RegisteredOperator>> operators_;
  std::vector<PluginRecord> plugins_;
  std::vector<RefusedLibrary> refused_;
  std::vector<LeftOutPlugin> left_out_;
  std::vector<std::string> warnings_;
  std::map<std::string, std::shared_ptr<PluginLibrary>> libraries_;  // by path
  std::optional<std::filesystem::path> cache_file_;
  std::unique_ptr<RegistryCache> cache_;
};

// The host's own operators every registry has (drop_records: core/src/pipeline/record_skipping.cpp).
void add_core_operators(Registry& registry);

}  // namespace sluice
