// The plugin library's entry point: what the host reads first (ABI version, name) and the
// operators it registers. The operator itself is in @NAME@.hpp, where its test can reach it.
#include "@NAME@.hpp"

SLUICE_PLUGIN("@NAME@", "0.1.0", "@SUMMARY@") {
  registrar.add<@CLASS@>();
}
