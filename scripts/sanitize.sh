#!/usr/bin/env bash
# The sanitizer runs of CI, each limited to what it can find. Any report fails the run.
#  - AddressSanitizer + UndefinedBehaviorSanitizer: every suite whose code runs in Sluice's own
#    processes. Not the two SDK suites that compile plugin projects with the system's compiler (a
#    sanitized build spends their minutes in the compiler, whose memory is not ours to check;
#    their `sluice` calls are the CLI paths tst_cli covers), nor the screenshot script (the
#    studio's code runs under tst_studio and tst_studio_xcb).
#  - ThreadSanitizer: the suites labelled `threads`, whose code runs on several threads (the
#    engine, its stages, AUTOTUNE, checkpoints, the metrics endpoint); the single-threaded ones
#    (pipeline files, plugin loading, worker identity) cannot race.
# Usage: scripts/sanitize.sh [STEP...]: without an argument, each build and its suites in turn;
# STEP is build-asan, test-asan, build-tsan or test-tsan, or build and test for both of a kind.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage.sh
# intercept_tls_get_addr=0: with the plugins' many thread-local modules, glibc 2.36 resizes the
# thread-local vector, and the leak check of GCC 12's sanitizer then crashed at exit on a stale
# entry ("Tracer caught signal 11") in a run that had done nothing wrong.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0
# tests/lsan.supp: leaks of system libraries (libdbus under Qt's xcb platform), each with its reason.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"

# Line tables only (-g1): a report's stack still names file and line, and the compiler no longer
# spends a sixth of each translation unit on debug information nobody reads here. -O1, as
# AddressSanitizer's own documentation advises: the suites' byte loops (a 256 MiB line, a 40 MB
# CSV) ran several times slower at -O0, and the suites took longer than the optimisation costs
# to compile. Assertions stay on (a Debug build).
not_under_asan='^(sdk_plugin_authoring|sdk_external_plugin|studio_screenshots)$'
# The suites' own code at -O0 (SLUICE_TEST_CODE_FLAGS, from scripts/build.sh): a quarter less to
# compile, and it is not what these runs check. Compiled by clang (14, Debian's, already there for
# the fuzz targets): a third faster than GCC at -O1 with these sanitizers (the core's largest unity
# batch 40 s -> 27 s, a suite's 12.3 s -> 8.9 s), and its UndefinedBehaviorSanitizer checks what
# GCC's does not (a call into a half-destroyed object, through its vtable, was found so).
# ThreadSanitizer stays with GCC: clang built its 11 suites no faster (235 s against 215 s on the
# same 2-core machine). (Protobuf 3.21's headers would not stand in the way: the one that reads
# the sanitizer, map_field.h, reads __SANITIZE_THREAD__, which clang 14 does not define.)
# (No peers environment: the suites that use it are Python ones, not built under sanitizers.)
build_asan() {
  SLUICE_PEERS=0 BUILD_DIR=build-asan bash scripts/build.sh -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DSLUICE_SANITIZE=address,undefined -DSLUICE_BUILD_BENCH=OFF
}
test_asan() {
  stage "tests in build-asan (ASan+UBSan)" ctest --test-dir build-asan --output-on-failure -j "${JOBS:-2}" --timeout 900 -E "$not_under_asan"
}

# Only what the suites labelled `threads` run is built (their programs depend on the plugins and
# the CLI): the studio, the Python module and the other suites would add minutes of compiling to
# CI for nothing this run looks at.
# Unity batches as in scripts/build.sh. -O1, as ThreadSanitizer's documentation allows: against -O2
# it compiled in 302 CPU-seconds, not 420, and its suites ran in 186 s, not 229 (the same machine,
# one after the other). The suites' own code is not lowered further: at -O0 under ThreadSanitizer
# they ran 17% longer (457 s of suites, not 391) and compiled no faster.
threaded_tests() {
  mapfile -t threaded < <(ctest --test-dir build-tsan -N -L threads | sed -n 's/^ *Test *#[0-9]*: //p')
  [ "${#threaded[@]}" -gt 0 ] || { echo "sanitize.sh: ctest lists no test labelled threads in build-tsan" >&2; exit 1; }
}
build_tsan() {
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DCMAKE_UNITY_BUILD=ON -DSLUICE_SANITIZE=thread -DSLUICE_BUILD_BENCH=OFF > /dev/null
  threaded_tests
  stage "build build-tsan (${#threaded[@]} suites)" cmake --build build-tsan -j "${JOBS:-2}" --target "${threaded[@]}"
}
test_tsan() {
  threaded_tests
  stage "tests in build-tsan (TSan)" ctest --test-dir build-tsan --output-on-failure -j "${JOBS:-2}" --timeout 900 -L threads
}

[ $# -gt 0 ] || set -- build-asan test-asan build-tsan test-tsan
for step in "$@"; do
  case $step in
    build|test|build-asan|test-asan|build-tsan|test-tsan) ;;
    *) echo "sanitize.sh: no step '$step': give build-asan, test-asan, build-tsan, test-tsan, build or test" >&2; exit 2 ;;
  esac
done
for step in "$@"; do
  case $step in
    build) build_asan; build_tsan ;;
    test) test_asan; test_tsan ;;
    *) "${step/-/_}" ;;  # build-asan: build_asan
  esac
done
