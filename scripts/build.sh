#!/usr/bin/env bash
# Installs what is missing, configures and builds into $BUILD_DIR (default build/). Extra
# arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage.sh
stage "install Debian packages" bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
configure_and_build() {
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
}
stage "build $BUILD_DIR" configure_and_build "$@"
