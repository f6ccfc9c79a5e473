#!/usr/bin/env bash
# The main job on built-in data: installs what it needs, builds, runs the demo pipeline headless
# and prints its per-stage report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR
bash scripts/build.sh
mkdir -p "$BUILD_DIR/demo"
"$BUILD_DIR/bin/sluice" run resources/pipelines/demo.txtpb --set "out.path=$BUILD_DIR/demo/batches.jsonl" "$@"
echo "Batches written to $BUILD_DIR/demo/batches.jsonl"
