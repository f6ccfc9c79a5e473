#!/usr/bin/env bash
# Takes the pictures of the studio in docs/studio.md again, from the current build, with the studio's own
# --screenshot, on a 1600x1000 X server (Xvfb, Qt's xcb platform): the Verdict and Monitor of
# studio_showcase.txtpb after 8 s, studio_graph.txtpb after 19 s, and the Workers tab following
# three headless workers of one job (worker 1 given five times the work).
#   scripts/screenshots.sh [OUT_DIR]       (default: resources/screenshots)
# SLUICE_SCREENSHOT_SECONDS=N runs each for N seconds instead (the test suite's check that this
# script still works); BUILD_DIR names the build (default: build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${1:-$root/resources/screenshots}
studio=$build/bin/sluice-studio
sluice=$build/bin/sluice
for program in "$studio" "$sluice"; do
  [ -x "$program" ] || { echo "no $program: build first (scripts/test.sh, or cmake --build build)" >&2; exit 1; }
done
command -v Xvfb >/dev/null || { echo "Xvfb is not installed: scripts/install-deps.sh installs it" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
children=()
cleanup() {
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A screen of its own; the studio's remembered window size and docks are not the user's.
Xvfb -displayfd 3 -screen 0 1600x1000x24 -nolisten tcp 3>"$work/display" 2>"$work/xvfb.log" &
children+=($!)
for _ in $(seq 100); do [ -s "$work/display" ] && break; sleep 0.1; done
[ -s "$work/display" ] || { echo "Xvfb did not start:" >&2; cat "$work/xvfb.log" >&2; exit 1; }
export DISPLAY=":$(head -n1 "$work/display")" QT_QPA_PLATFORM=xcb XDG_CONFIG_HOME="$work/config" SLUICE_PLUGIN_PATH=
seconds() { echo "${SLUICE_SCREENSHOT_SECONDS:-$1}"; }
shoot() {  # shoot FILE ARGS...: one picture, checked to be a PNG
  local file=$1
  shift
  "$studio" --screenshot "$out/$file" "$@"
  [ "$(head -c 8 "$out/$file" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "$out/$file is not a PNG" >&2; exit 1; }
}

# The pipelines from a copy of their folder: what they write (studio_graph's sample copy, in
# ../../build) goes to this run's scratch folder, not into a build tree that may not exist.
pipelines=$work/resources/pipelines
mkdir -p "$pipelines" "$work/build"
cp "$root"/resources/pipelines/studio_*.txtpb "$pipelines/"
shoot studio.png --run-seconds "$(seconds 8)" "$pipelines/studio_showcase.txtpb"
shoot studio_monitor.png --tab Monitor --run-seconds "$(seconds 8)" "$pipelines/studio_showcase.txtpb"
shoot studio_graph.png --run-seconds "$(seconds 19)" "$pipelines/studio_graph.txtpb"

# Three workers of one job, each serving its metrics on a free port it prints.
cat >"$work/workers.txtpb" <<'PIPELINE'
options { seed: 4 }
stage { id: "numbers" op: "range" params { key: "count" value: "100000000" } }
stage { id: "work" op: "simulate_work" input: "numbers" params { key: "us" value: "300" } }
stage { id: "drain" op: "null_sink" input: "work" }
PIPELINE
addresses=()
for i in 0 1 2; do
  work_us=300
  [ "$i" = 1 ] && work_us=1500
  "$sluice" run --quiet --metrics-addr 127.0.0.1:0 --num-workers 3 --worker-index "$i" --set "work.us=$work_us" \
    "$work/workers.txtpb" >"$work/worker$i.out" 2>"$work/worker$i.log" &
  children+=($!)
  address=""
  for _ in $(seq 100); do
    address=$(grep -o 'metrics: http://[0-9.:]*' "$work/worker$i.log" | head -n1 | cut -d' ' -f2 || true)
    [ -n "$address" ] && break
    sleep 0.1
  done
  [ -n "$address" ] || { echo "worker $i gave no metrics address:" >&2; cat "$work/worker$i.log" >&2; exit 1; }
  addresses+=("$address")
done
shoot studio_workers.png --tab Workers --run-seconds "$(seconds 6)" --attach "$(IFS=,; echo "${addresses[*]}")"
echo "pictures in $out"
