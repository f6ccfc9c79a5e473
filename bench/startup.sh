#!/usr/bin/env bash
# What starting costs, against baselines measured in the same run (bench/README.md, "startup"):
#   - `sluice run` of one element (resources/pipelines/startup.txtpb) against GStreamer's
#     `gst-launch-1.0 -q fakesrc num-buffers=1 ! fakesink`;
#   - `python3 -c "import sluice; sluice.Pipeline(P)"` against `python3 -c "import numpy"` (sluice
#     imports NumPy: the difference is what Sluice adds);
#   - `sluice run` of the demo pipeline (train_tfrecord.txtpb) up to its first batch;
#   - the studio, from its start until its window is shown (on Xvfb).
# Each figure is the median wall time of N runs (default 20), with a warm registry cache and page
# cache, as a user's second start is. Needs SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh
# (GStreamer's tools, xdotool) and the sample data (bash scripts/demo.sh makes it).
# Usage: bench/startup.sh [BUILD_DIR] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-20}
sluice=$build/bin/sluice
python=/usr/bin/python3
for tool in gst-launch-1.0 xdotool Xvfb; do
  command -v "$tool" > /dev/null || { echo "startup.sh: $tool is missing: SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh" >&2; exit 1; }
done
[ -x "$sluice" ] || { echo "startup.sh: no $sluice: build first (bash scripts/build.sh)" >&2; exit 1; }
ls build/sample_data/tfrecord/*.tfrecord > /dev/null 2>&1 || { echo "startup.sh: no sample data: run bash scripts/demo.sh once" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${xvfb:-}" ] && kill "$xvfb" 2> /dev/null || true' EXIT

# The median wall time, in ms, of running the command N times (output discarded).
median_ms() {
  "$python" - "$runs" "$@" <<'PY'
import statistics, subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
times = []
for _ in range(runs + 2):  # two first runs warm the caches and are dropped
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {done.stderr.decode()[-500:]}")
    times.append(time.perf_counter() - start)
print(f"{statistics.median(times[2:]) * 1000:.1f}")
PY
}

# Two commands run N times in alternation (a machine's slower moments fall on both): each one's
# median wall time in ms, and the median and range of their ratio within a round.
against_ms() {  # against_ms "SLUICE COMMAND" "BASELINE COMMAND"
  "$python" - "$runs" "$1" "$2" <<'PY'
import shlex, statistics, subprocess, sys, time
runs, commands = int(sys.argv[1]), [shlex.split(c) for c in sys.argv[2:]]
times = [[], []]
for _ in range(runs + 2):  # two first rounds warm the caches and are dropped
    for which, cmd in enumerate(commands):
        start = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {done.stderr.decode()[-500:]}")
        times[which].append(time.perf_counter() - start)
ours, theirs = times[0][2:], times[1][2:]
ratios = sorted(a / b for a, b in zip(ours, theirs))
print(f"{statistics.median(ours) * 1000:.1f} {statistics.median(theirs) * 1000:.1f} "
      f"{statistics.median(ratios):.2f}x ({ratios[len(ratios) // 10]:.2f}-{ratios[-1 - len(ratios) // 10]:.2f})")
PY
}

# A registry cache of this build's plugins alone, made by the first start: the user's own may
# hold the descriptions of every build they ever ran (a developer's, hundreds of libraries).
export SLUICE_REGISTRY=$work/registry.bin
"$sluice" run -q resources/pipelines/startup.txtpb > /dev/null

# The demo pipeline up to its first batch: a take(1) before its sink, over the sample shards.
sed -e 's|stage { id: "train"   op: "null_sink"       input: "prefetch" }|stage { id: "first" op: "take" input: "prefetch" params { key: "count" value: "1" } }\nstage { id: "train" op: "null_sink" input: "first" }|' \
    -e "s|../../build/sample_data|$PWD/build/sample_data|" resources/pipelines/train_tfrecord.txtpb > "$work/first_batch.txtpb"
grep -q '"first"' "$work/first_batch.txtpb" || { echo "startup.sh: train_tfrecord.txtpb no longer ends as this script expects" >&2; exit 1; }

read -r sluice_ms gst_ms run_ratio < <(against_ms "$sluice run -q resources/pipelines/startup.txtpb" \
  "gst-launch-1.0 -q fakesrc num-buffers=1 ! fakesink")
read -r import_ms numpy_ms import_ratio < <(PYTHONPATH=$build/python against_ms \
  "$python -c \"import sluice; sluice.Pipeline('resources/pipelines/startup.txtpb')\"" "$python -c 'import numpy'")
first_batch_ms=$(median_ms "$sluice" run -q "$work/first_batch.txtpb")

# The studio: from its start until xdotool finds its window mapped.
display=:$(( 90 + RANDOM % 100 ))
Xvfb "$display" -screen 0 1600x1000x24 -nolisten tcp > /dev/null 2>&1 &
xvfb=$!
sleep 1
studio_ms=$(DISPLAY=$display "$python" - "$runs" "$build/bin/sluice-studio" <<'PY'
import os, statistics, subprocess, sys, time
runs, studio = int(sys.argv[1]), sys.argv[2]
times = []
for _ in range(min(runs, 10) + 1):
    start = time.perf_counter()
    app = subprocess.Popen([studio, "resources/pipelines/startup.txtpb"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while subprocess.run(["xdotool", "search", "--onlyvisible", "--pid", str(app.pid)], stdout=subprocess.DEVNULL).returncode != 0:
        if time.perf_counter() - start > 30:
            sys.exit("the studio showed no window within 30 s")
        time.sleep(0.002)
    times.append(time.perf_counter() - start)
    app.terminate()
    app.wait()
print(f"{statistics.median(times[1:]) * 1000:.1f}")
PY
)

printf '%-58s %10s %10s  %s\n' "start" "Sluice ms" "baseline" "ratio in a round (range)"
printf '%-58s %10s %10s  %s\n' "sluice run startup.txtpb vs gst-launch-1.0 fakesrc!fakesink" "$sluice_ms" "$gst_ms" "$run_ratio"
printf '%-58s %10s %10s  %s\n' "import sluice; sluice.Pipeline(P) vs import numpy" "$import_ms" "$numpy_ms" "$import_ratio"
printf '%-58s %10s %10s  %s\n' "sluice run of the demo pipeline to its first batch" "$first_batch_ms" "-" "-"
printf '%-58s %10s %10s  %s\n' "sluice-studio until its window shows (Xvfb)" "$studio_ms" "-" "-"
echo "phases of the one-element run (sluice run --timings):"
"$sluice" run -q resources/pipelines/startup.txtpb --timings 2>&1 >/dev/null | sed 's/^/  /'
