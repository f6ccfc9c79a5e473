#pragma once
// Learning what a plugin library offers without letting it harm the host: the file is checked
// before any loading, then loaded in a child process that reports the library's descriptor and
// operators (or why it is refused), so that no library in the plugin path can crash, hang or end
// the process that lists it. The host loads a library itself only when a pipeline uses one of its
// operators (registry.cpp).
#include <filesystem>
#include <string>
#include <vector>

#include "registry.pb.h"
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

// What the library is, by its content: its GNU build ID, or else a hash of its bytes. Empty if
// the file cannot be read.
std::string library_identity(const std::filesystem::path& file);

// Loads the library in a child process (dlopen, entry, ABI, registration, every operator built
// with its default parameters where it has them) and returns what it offers, or in `refusal` why
// it is refused: the checks' own words, or what the child's end says (a signal, an exit, a hang
// past SLUICE_PLUGIN_PROBE_TIMEOUT_MS). Where no child can be made, the same in this process.
// `path`, `size`, `mtime_ns` and `identity` are the caller's to fill.
registry::Library probe_library(const std::filesystem::path& file);

// The same checks in this process, on a library already loaded with dlopen (`handle`).
registry::Library describe_loaded_library(void* handle);

// `abi_minor`: of the SDK the library was built for (what of `info` it may be trusted to have set).
void describe_operator(const OperatorInfo& info, std::uint32_t abi_minor, registry::Operator& out);
// Everything but the factory, which the caller supplies.
OperatorInfo operator_from(const registry::Operator& described);

}  // namespace sluice
