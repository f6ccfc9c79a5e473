#!/usr/bin/env bash
# Installs what is missing, configures and builds into $BUILD_DIR (default build/). Extra
# arguments go to CMake, after this script's own and so over them.
#
# The build made here is the demo's and the tests': optimised, with line tables only (-g1: a
# crash's stack still names file and line; full debug information costs a third of each compile)
# and unity batches of each target's sources (the heavy protobuf, Qt and OpenCV headers parsed
# once per batch, not once per file): 289 s for this tree on a 2-core machine, not 595 s. The
# suites' and fixture plugins' own code is compiled at -O0 (SLUICE_TEST_CODE_FLAGS): it is not what
# they test, the engine and plugins under test keep -O2, and it took a third of the suites' compile
# (249 job-seconds, 168 at -O0) for no shorter a run (the 28 suites: 215 s, 220 s at -O0). For a
# debugging build, configure CMake yourself: plain `cmake -S . -B DIR` gives one file per compile
# and full -g.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage.sh
stage "install packages (Debian, peers environment)" bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
configure_and_build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    -DCMAKE_UNITY_BUILD=ON -DSLUICE_TEST_CODE_FLAGS=-O0 "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
}
stage "build $BUILD_DIR" configure_and_build "$@"
