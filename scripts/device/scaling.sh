#!/usr/bin/env bash
# On a machine with more cores than this one, from a build folder (or a lent GPU machine, from a
# bundle of SLUICE_DEVICE_SCALING=1 scripts/device/prepare.sh, where it fits in what a run
# carries: with Debian's OpenCV it does not, see prepare.sh): the image pipeline at 1, 2, 4, 8 and 16
# workers (those the machine has cores for), each run under `taskset` on that many cores:
#  1. bench_io's image pipeline (JPEG files -> decode -> resize 224 -> flip -> normalize -> batch
#     64) against the ideal (its 1-thread loop times the cores) and that loop really run on them;
#  2. bench/peers' image workload (TFRecord shards, AUTOTUNE) from `sluice run`, and tf.data's
#     (bench/peers/peer_tfdata.py) at the same cores where the machine has TensorFlow: the peers
#     environment (2 GB) cannot travel with a run (64 MiB), so a bare GPU machine says so instead.
# Writes $OUT/scaling.txt (every run's output) and $OUT/scaling.tsv (one line per core count).
# Usage: scripts/device/scaling.sh [BUNDLE_OR_BUILD_DIR] (default device_bundle)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
bundle=${1:-device_bundle}
mkdir -p "$out"
[ -x "$bundle/bin/sluice" ] && [ -x "$bundle/bin/bench_io" ] ||
  { echo "scaling.sh: $bundle/bin has no sluice and bench_io: run scripts/device/prepare.sh first" >&2; exit 1; }
[ -d "$bundle/lib" ] && export LD_LIBRARY_PATH="$PWD/$bundle/lib:${LD_LIBRARY_PATH:-}"
export SLUICE_PLUGIN_PATH=
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SLUICE_REGISTRY=$work/registry.bin
sample=$work/sample_data
# TensorFlow from a build folder's peers environment, else the machine's python3.
python=$bundle/peers/bin/python
[ -x "$python" ] || python=$(command -v python3 || true)
status=0
{
  echo "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  # The demo's 2,048 images, made here by the command itself (a bundle carries no data).
  "$bundle/bin/sluice" run -q resources/pipelines/sample_data_tfrecord.txtpb --set "shards.prefix=$sample/tfrecord/train" > /dev/null &&
    "$bundle/bin/sluice" run -q resources/pipelines/sample_data_jpeg.txtpb --set "files.folder=$sample/jpeg" > /dev/null ||
    { echo "scaling.sh: the sample data could not be made"; exit 1; }
  has_tf=0
  [ -n "$python" ] && "$python" -c "import tensorflow" > /dev/null 2>&1 && has_tf=1
  [ "$has_tf" = 1 ] || echo "tf.data: not measured: no TensorFlow for $python here (the peers environment cannot travel with a run)"
  printf 'cores\tideal\tloop\tbench_io pipeline\tpercent of ideal\tsluice run (peers image)\ttf.data\n' > "$out/scaling.tsv"
  for cores in 1 2 4 8 16; do
    if [ "$cores" -gt "$(nproc)" ]; then echo "== $cores cores: skipped (this machine has $(nproc))"; continue; fi
    pin=(taskset -c "0-$((cores - 1))")
    echo "== $cores cores (${pin[*]})"
    io=$("${pin[@]}" "$bundle/bin/bench_io" "$sample/tfrecord/*.tfrecord" "$sample/jpeg/*/*.jpg" "$cores" 2>&1) || status=1
    echo "$io"
    ideal=$(sed -n 's/^  ideal (1-thread loop x [0-9]*) *\([0-9]*\) images\/s.*/\1/p' <<< "$io")
    loop=$(sed -n 's/^  the loop run on [0-9]* threads\{0,1\} *\([0-9]*\) images\/s.*/\1/p' <<< "$io")
    ours=$(sed -n 's/^  sluice pipeline  *\([0-9]*\) images\/s  (\([0-9]*\)% of ideal.*/\1\t\2/p' <<< "$io")
    # The peers' image workload: 3 epochs of the shards, AUTOTUNE choosing within the pinned cores.
    report=$("${pin[@]}" "$bundle/bin/sluice" run bench/peers/image.txtpb --set "files.patterns=$sample/tfrecord/*.tfrecord" 2>&1) || status=1
    echo "$report" | head -12
    run_rate=$(awk '$1 == "norm" { print $5 }' <<< "$report")
    tfdata=-
    if [ "$has_tf" = 1 ]; then
      mkdir -p "$work/bench_peers"
      tf_out=$("${pin[@]}" "$python" bench/peers/peer_tfdata.py image "$work/bench_peers" 3 2>&1) || status=1
      echo "$tf_out" | tail -3
      # its last line: measure.report's JSON (items, seconds, ...): items per second
      tfdata=$("$python" -c 'import json, sys; r = json.loads(sys.argv[1]); print(round(r["items"] / r["seconds"]))' "$(tail -1 <<< "$tf_out")" 2>/dev/null || echo "failed")
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$cores" "${ideal:--}" "${loop:--}" "${ours:--	-}" "${run_rate:--}" "$tfdata" >> "$out/scaling.tsv"
  done
  echo "scaling.sh: exit $status"
  exit "$status"
} 2>&1 | tee "$out/scaling.txt"
