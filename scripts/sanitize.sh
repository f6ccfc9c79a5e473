#!/usr/bin/env bash
# The sanitizer runs of CI: the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# the core tests under ThreadSanitizer. Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# intercept_tls_get_addr=0: with the plugins' many thread-local modules, glibc 2.36 resizes the
# thread-local vector, and the leak check of GCC 12's sanitizer then crashed at exit on a stale
# entry ("Tracer caught signal 11") in a run that had done nothing wrong.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"

BUILD_DIR=build-asan bash scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=address,undefined -DSLUICE_BUILD_BENCH=OFF
ctest --test-dir build-asan --output-on-failure -j "${JOBS:-2}" --timeout 900

BUILD_DIR=build-tsan bash scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=thread -DSLUICE_BUILD_BENCH=OFF
ctest --test-dir build-tsan --output-on-failure -j "${JOBS:-2}" --timeout 900 -L core
