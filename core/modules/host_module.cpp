#include "host_module.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <vector>

#include <boost/dll/runtime_symbol_info.hpp>

#include <fmt/format.h>

#include "sluice/error.hpp"

namespace fs = std::filesystem;

namespace sluice {
namespace {

// lib/sluice/ beside bin/ (the CLI, the tests), or as the Python package finds its plugins
// (build/python/sluice, an installed dist-packages/sluice).
std::vector<fs::path> module_candidates(const char* module_name) {
  std::error_code ec;
  const fs::path self = boost::dll::this_line_location(ec);
  if (ec) return {};
  const fs::path folder = self.parent_path();
  std::vector<fs::path> out;
  for (const char* up : {"../lib/sluice", "../../lib/sluice", "../../../sluice"})
    out.push_back((folder / up / module_name).lexically_normal());
  return out;
}

}  // namespace

void* host_module_symbol(const char* module_name, const char* symbol, const std::string& purpose) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::string tried;
  for (const auto& candidate : module_candidates(module_name)) {
    tried += (tried.empty() ? "" : ", ") + candidate.string();
    if (!fs::exists(candidate)) continue;
    // Kept loaded for the process's life: its threads may outlast what uses them by moments.
    // dlopen of a loaded library only counts a reference, so a second call costs little.
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle) {
      const char* why = ::dlerror();
      throw Error(fmt::format("{}: {} did not load: {}", purpose, candidate.string(), why ? why : "unknown reason"));
    }
    void* address = ::dlsym(handle, symbol);
    if (!address) throw Error(fmt::format("{}: {} is not Sluice's module (reinstall Sluice)", purpose, candidate.string()));
    return address;
  }
  throw Error(fmt::format("{}: Sluice's module {} is missing (looked at {}); reinstall Sluice", purpose, module_name, tried));
}

}  // namespace sluice
