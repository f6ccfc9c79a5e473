#pragma once
// Checks made before a plugin library is loaded into the host, so that no library in the plugin
// path can crash, hang or end the process that loads it.
#include <filesystem>
#include <string>
#include <vector>

#include "sluice/plugin.hpp"

namespace sluice {

// Keeps what a library's registration function registers, for the loader and the probe alike.
class CollectingRegistrar final : public Registrar {
 public:
  void add_operator(OperatorInfo info) override { operators.push_back(std::move(info)); }
  std::vector<OperatorInfo> operators;
};

// A regular, complete ELF shared library for this machine's class and architecture; otherwise the
// reason it is not (a FIFO, a symlink loop, a 32-bit or ARM build, a truncated file).
std::string check_plugin_file(const std::filesystem::path& file);

// Loads the library in a child process first (dlopen, entry, registration, default construction):
// empty when that ended normally, else what went wrong (a signal, an exit, a hang past
// SLUICE_PLUGIN_PROBE_TIMEOUT_MS). Libraries that passed are remembered by path, size,
// modification time and content (the GNU build ID, or a hash of the bytes) in a regular file
// (SLUICE_PLUGIN_PROBE_CACHE names it, or "off"), so a start-up probes only what changed.
std::string probe_plugin_in_child(const std::filesystem::path& file);

}  // namespace sluice
