#include "std_plugin.hpp"

SLUICE_PLUGIN("std", "0.1.0", "Structural operators: sources, shuffle, batch, repeat, cache, sinks") {
  using namespace sluice::std_ops;
  register_sources(registrar);
  register_elementwise(registrar);
  register_iteration(registrar);
  register_sharding(registrar);
  register_shuffle(registrar);
  register_batching(registrar);
  register_cache(registrar);
  register_sinks(registrar);
  register_combinators(registrar);
  register_sequences(registrar);
  register_field_ops(registrar);
}
