#!/usr/bin/env bash
# The test command: installs what it needs, builds into $BUILD_DIR (default build/), runs every
# ctest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage.sh
export BUILD_DIR=${BUILD_DIR:-build}
bash scripts/build.sh
# (The tests' own runs of the scripts, the README's demo, are not CI stages.)
stage "tests in $BUILD_DIR" env -u SLUICE_STAGE_LOG ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}" --timeout 600
