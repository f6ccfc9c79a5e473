#!/usr/bin/env bash
# The sanitizer runs of CI: the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# the core tests under ThreadSanitizer. Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# intercept_tls_get_addr=0: with the plugins' many thread-local modules, glibc 2.36 resizes the
# thread-local vector, and the leak check of GCC 12's sanitizer then crashed at exit on a stale
# entry ("Tracer caught signal 11") in a run that had done nothing wrong.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0
# tests/lsan.supp: leaks of system libraries (libdbus under Qt's xcb platform), each with its reason.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"

BUILD_DIR=build-asan bash scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=address,undefined -DSLUICE_BUILD_BENCH=OFF
ctest --test-dir build-asan --output-on-failure -j "${JOBS:-2}" --timeout 900

# Only what the core tests run is built (their programs depend on the plugins and the CLI): the
# studio, the Python module and the other suites would add minutes of compiling to CI for
# nothing this run looks at.
bash scripts/install-deps.sh
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=thread -DSLUICE_BUILD_BENCH=OFF > /dev/null
mapfile -t core_tests < <(ctest --test-dir build-tsan -N -L core | sed -n 's/^ *Test *#[0-9]*: //p')
[ "${#core_tests[@]}" -gt 0 ] || { echo "sanitize.sh: ctest lists no test labelled core in build-tsan" >&2; exit 1; }
cmake --build build-tsan -j "${JOBS:-2}" --target "${core_tests[@]}"
ctest --test-dir build-tsan --output-on-failure -j "${JOBS:-2}" --timeout 900 -L core
