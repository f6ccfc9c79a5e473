#!/usr/bin/env bash
# Mutation check before a large refactoring: each fault listed in tests/mutants.txt is put into
# the code in turn, the build folder is rebuilt incrementally, the tests that should catch it are
# run, and the file is restored. Prints the score and the survivors; exits 1 if any survived.
# Not part of CI: it takes tens of minutes. Options: --only TEXT, --all-tests, --list,
# --build-dir DIR (default build; configure it first with scripts/build.sh), --jobs N.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -f "${BUILD_DIR:-build}/CMakeCache.txt" && " $* " != *" --build-dir "* ]]; then
  echo "no configured build folder at ${BUILD_DIR:-build}: building it first (scripts/build.sh)"
  bash scripts/build.sh
fi
exec python3 scripts/mutate.py "$@"
