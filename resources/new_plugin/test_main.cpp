// The test of @NAME@: the SDK's harness runs the operator with given parameters, seed, epoch and
// element indices, without the engine. Each check throws sluice::testing::Failure with a message.
#include <cstdio>
#include <exception>

#include "@NAME@.hpp"
#include "sluice/testing.hpp"

namespace t = sluice::testing;

@TESTS@

int main() {
  try {
    run_tests();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("@NAME@: all checks passed\n");
  return 0;
}
