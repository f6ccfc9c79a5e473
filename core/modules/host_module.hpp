#pragma once
// Modules of the host that only some runs need (the metrics endpoint's HTTP server, remote
// storage): shared libraries in lib/sluice/, beside the plugin folder, loaded on first use so
// that what they link costs nothing to a run that does not use them.
#include <string>

namespace sluice {

// The address of `symbol` in the module `module_name` (libsluice_NAME.so), loaded once for the
// process's life. Throws an Error that starts with `purpose` ("cannot serve metrics") and names
// the module, where it was looked for and what to do.
void* host_module_symbol(const char* module_name, const char* symbol, const std::string& purpose);

}  // namespace sluice
