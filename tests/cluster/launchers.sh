#!/usr/bin/env bash
# Sluice under the real launchers, started on this machine on loopback only:
#   launchers.sh BUILD_DIR mpi     Open MPI's mpirun --oversubscribe -np 3
#   launchers.sh BUILD_DIR slurm   a one-node Slurm cluster of our own (slurm_cluster.sh), srun -n 3
#                                  and sbatch; it is torn down at the end, whatever happens
# For each: the workers' outputs are pairwise disjoint and together the whole dataset, sharded by
# file and by record; the same seed gives each worker the same output twice; equal_steps gives
# every worker the same number of batches from files of unequal sizes. Under Slurm also: the
# preprocessing job (resources/pipelines/preprocess_sensors.txtpb) writes shards that read back
# to exactly the input rows, and a worker killed mid-run leaves no shard that looks complete; the
# service's script (resources/slurm/service.sbatch) gives its trainers every row once.
# Exits 77 (ctest: skipped) when the launcher cannot run here (Slurm needs root).
set -euo pipefail

build=$(realpath "${1:?usage: launchers.sh BUILD_DIR mpi|slurm}")
launcher=${2:?usage: launchers.sh BUILD_DIR mpi|slurm}
repo=$(cd "$(dirname "$0")/../.." && pwd)
sluice="$build/bin/sluice"
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-$launcher.XXXXXX")
export SLUICE_PLUGIN_PATH=""

cleanup() {
  if [ "$launcher" = slurm ]; then bash "$repo/tests/cluster/slurm_cluster.sh" stop "$work/cluster" || true; fi
  if [ "${KEEP_WORK:-0}" = 1 ]; then echo "work folder kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

case "$launcher" in
  mpi)
    command -v mpirun >/dev/null || fail "mpirun is not installed (scripts/install-deps.sh installs openmpi-bin)"
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
    # Loopback only, no daemons left behind; --oversubscribe: 3 workers on a 2-core machine.
    launch() {
      local n=$1
      shift
      mpirun --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np "$n" "$@"
    }
    ;;
  slurm)
    if [ "$(id -u)" != 0 ]; then
      echo "SKIP: a Slurm cluster of our own needs root (slurmd)"
      exit 77
    fi
    SLURM_CONF=$(bash "$repo/tests/cluster/slurm_cluster.sh" start "$work/cluster")
    export SLURM_CONF
    launch() {
      local n=$1
      shift
      srun --quiet -n "$n" "$@"
    }
    ;;
  *) fail "unknown launcher '$launcher' (mpi or slurm)" ;;
esac

# ---- data: TFRecord files of unequal sizes, {"value": 0..N-1} in order across the files ----
write_records() {  # folder, then the size of each file
  local folder=$1 start=0 k=0
  shift
  for size in "$@"; do
    "$sluice" run -q "$work/make.txtpb" --set "src.count=$size" --set "src.start=$start" --set "w.prefix=$folder/part" \
      --set "w.worker=$k" >/dev/null
    start=$((start + size))
    k=$((k + 1))
  done
  echo "$start"
}
cat > "$work/make.txtpb" <<'EOF'
stage { id: "src" op: "range" }
stage { id: "w" op: "tfrecord_writer" input: "src" params { key: "naming" value: "worker" } params { key: "prefix" value: "x" } }
EOF
many_total=$(write_records "$work/many" 5 1 7 3 4 2 6)  # 7 files: by file for 3 workers
few_total=$(write_records "$work/few" 11 6)               # 2 files: by record

# A reader of FILES into OUT (a path holding {worker}); EXTRA stages after parse end in "last".
reader() {  # name, options, extra stages
  cat > "$work/$1.txtpb" <<EOF
options { $2 }
stage { id: "files" op: "list_files" params { key: "patterns" value: "x" } params { key: "shuffle" value: "true" } }
stage { id: "read" op: "tfrecord_reader" input: "files" parallelism: 2 interleave { cycle_length: 2 } }
stage { id: "parse" op: "parse_example" input: "read" params { key: "features" value: "value:int64" } }
$3
stage { id: "out" op: "jsonl_sink" input: "last" params { key: "path" value: "x" } }
EOF
}
reader plain "seed: 7" 'stage { id: "last" op: "identity" input: "parse" }'
reader shuffled "seed: 7" 'stage { id: "last" op: "shuffle" input: "parse" params { key: "buffer_size" value: "16" } }'
reader drop "seed: 7 equal_steps: drop" 'stage { id: "last" op: "batch" input: "parse" params { key: "batch_size" value: "2" } }'
reader pad "seed: 7 equal_steps: pad" 'stage { id: "last" op: "batch" input: "parse" params { key: "batch_size" value: "2" } }'

# run NAME FILES OUT_FOLDER [more sluice options]: 3 workers, each writing OUT_FOLDER/out-W.jsonl
run3() {
  local name=$1 files=$2 out=$3
  shift 3
  mkdir -p "$out"
  launch 3 "$sluice" run -q "$work/$name.txtpb" --set "files.patterns=$files" --set "out.path=$out/out-{worker}.jsonl" "$@" \
    > "$out/report.txt" 2> "$out/log.txt" || { cat "$out/log.txt" >&2; fail "$launcher: $name did not run"; }
  for w in 0 1 2; do [ -f "$out/out-$w.jsonl" ] || { cat "$out/log.txt" >&2; fail "$launcher: $name: worker $w wrote nothing"; }; done
}

# check_partition OUT TOTAL: disjoint, complete
check_partition() {
  python3 - "$1" "$2" <<'EOF' || fail "$launcher: $1 is not a partition of the data"
import json, sys, glob
folder, total = sys.argv[1], int(sys.argv[2])
seen = {}
for path in sorted(glob.glob(folder + "/out-*.jsonl")):
    for line in open(path):
        v = json.loads(line)["value"]
        for x in (v if isinstance(v, list) else [v]):
            if x in seen:
                sys.exit(f"{x} is in {seen[x]} and {path}")
            seen[x] = path
missing = set(range(total)) - set(seen)
if missing or len(seen) != total:
    sys.exit(f"{len(missing)} records missing (e.g. {sorted(missing)[:5]}), {len(seen)} seen of {total}")
print(f"  {folder}: {total} records, disjoint and complete")
EOF
}

grep_log() {  # folder, text
  grep -q -- "$2" "$1/log.txt" || { cat "$1/log.txt" >&2; fail "$launcher: '$2' not in the workers' notes"; }
}

echo "$launcher: sharding by file (7 files, 3 workers)"
run3 plain "$work/many/*.tfrecord" "$work/by-file"
check_partition "$work/by-file" "$many_total"
grep_log "$work/by-file" "sharded by file"
for w in 0 1 2; do grep_log "$work/by-file" "worker $w of 3"; done

echo "$launcher: sharding by record (2 files, 3 workers)"
run3 plain "$work/few/*.tfrecord" "$work/by-record"
check_partition "$work/by-record" "$few_total"
grep_log "$work/by-record" "sharded by record"

echo "$launcher: the same seed gives each worker the same output twice"
run3 shuffled "$work/many/*.tfrecord" "$work/seed-1"
run3 shuffled "$work/many/*.tfrecord" "$work/seed-2"
check_partition "$work/seed-1" "$many_total"
for w in 0 1 2; do cmp -s "$work/seed-1/out-$w.jsonl" "$work/seed-2/out-$w.jsonl" || fail "$launcher: worker $w differs between two runs"; done
run3 shuffled "$work/many/*.tfrecord" "$work/seed-3" --seed 8
cmp -s "$work/seed-1/out-0.jsonl" "$work/seed-3/out-0.jsonl" && fail "$launcher: another seed gave worker 0 the same output"

echo "$launcher: equal steps from files of unequal sizes"
for mode in drop pad; do
  run3 "$mode" "$work/many/*.tfrecord" "$work/equal-$mode"
  counts=$(for w in 0 1 2; do wc -l < "$work/equal-$mode/out-$w.jsonl"; done | sort -u)
  [ "$(echo "$counts" | wc -l)" = 1 ] || fail "$launcher: equal_steps $mode gave batch counts $(echo $counts)"
  echo "  equal_steps $mode: $(echo "$counts") batches on every worker"
done

if [ "$launcher" = slurm ]; then
  echo "slurm: the preprocessing job writes shards that read back to exactly the input rows"
  launch 3 "$sluice" run -q "$repo/resources/pipelines/preprocess_sensors.txtpb" --set "write.prefix=$work/sensors/sensors" \
    > /dev/null 2> "$work/preprocess.log" || { cat "$work/preprocess.log" >&2; fail "slurm: preprocessing failed"; }
  check_sensors() {  # folder of shards
    cat > "$work/read_sensors.txtpb" <<EOF
stage { id: "files" op: "list_files" params { key: "patterns" value: "$1/*.tfrecord" } }
stage { id: "read" op: "tfrecord_reader" input: "files" }
stage { id: "parse" op: "parse_example" input: "read" params { key: "features" value: "asset:int64,step:int64,temperature:float,pressure:float,vibration:float" } }
stage { id: "out" op: "jsonl_sink" input: "parse" params { key: "path" value: "$1/rows.jsonl" } }
EOF
    "$sluice" run -q "$work/read_sensors.txtpb" > /dev/null
    python3 - "$repo/resources/examples/sensors" "$1/rows.jsonl" "$repo/resources/pipelines/preprocess_sensors.txtpb" <<'EOF' || fail "slurm: the shards of $1 do not hold the input rows"
import csv, glob, json, re, sys
sensors, rows_path, pipeline = sys.argv[1:]
text = open(pipeline).read()
mean = [float(x) for x in re.search(r'key: "mean" value: "([^"]+)"', text).group(1).split(",")]
std = [float(x) for x in re.search(r'key: "std" value: "([^"]+)"', text).group(1).split(",")]
expected = {}
for path in glob.glob(sensors + "/asset-*.csv"):
    for r in csv.DictReader(open(path)):
        values = [float(r[c]) for c in ("temperature", "pressure", "vibration")]
        expected[(int(r["asset"]), int(r["step"]))] = [(v - m) / s for v, m, s in zip(values, mean, std)]
got = {}
for line in open(rows_path):
    r = json.loads(line)
    key = (r["asset"], r["step"])
    if key in got:
        sys.exit(f"row {key} written twice")
    got[key] = [r["temperature"], r["pressure"], r["vibration"]]
if set(got) != set(expected):
    sys.exit(f"{len(set(expected) - set(got))} rows lost, {len(set(got) - set(expected))} rows not in the input")
worst = max(abs(a - b) for k in got for a, b in zip(got[k], expected[k]))
if worst > 1e-4:
    sys.exit(f"standardized values differ by up to {worst}")
print(f"  {len(got)} rows, each once, standardized (largest difference {worst:.2g})")
EOF
  }
  check_sensors "$work/sensors"
  ls "$work/sensors" | grep -q -- "-worker-2-" || fail "slurm: worker 2 wrote no shard"

  echo "slurm: the ready sbatch script"
  (cd "$repo" && SLUICE="$sluice" sbatch --quiet --wait --output="$work/sbatch.out" resources/slurm/preprocess_sensors.sbatch \
    --set "write.prefix=$work/sbatch/sensors") || { cat "$work/sbatch.out" >&2; fail "slurm: the sbatch job failed"; }
  check_sensors "$work/sbatch"

  echo "slurm: a worker killed mid-run leaves no shard that looks complete"
  sed -e 's/stage { id: "write"/stage { id: "slow" op: "simulate_work" input: "scale" params { key: "us" value: "30000" } }\nstage { id: "write"/' \
      -e 's/op: "tfrecord_writer" input: "scale"/op: "tfrecord_writer" input: "slow"/' \
      "$repo/resources/pipelines/preprocess_sensors.txtpb" > "$work/slow.txtpb"
  sed -i "s|\.\./examples/sensors|$repo/resources/examples/sensors|" "$work/slow.txtpb"
  launch 3 "$sluice" run -q "$work/slow.txtpb" --set "write.prefix=$work/killed/sensors" --set "write.max_records=20" \
    > /dev/null 2> "$work/killed.log" &
  job=$!
  victim=""
  for _ in $(seq 100); do
    for pid in $(pgrep -f "run -q $work/slow.txtpb" || true); do
      if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_PROCID=1" && [ "$(cat /proc/$pid/comm)" = sluice ]; then
        victim=$pid
      fi
    done
    # Mid-run: the worker has written records into its first shard.
    if [ -n "$victim" ] && ls "$work/killed" 2>/dev/null | grep -q -- "-worker-1-.*partial"; then break; fi
    sleep 0.1
  done
  [ -n "$victim" ] || fail "slurm: worker 1 of the slow job was not found"
  ls "$work/killed" | grep -q -- "-worker-1-.*partial" || fail "slurm: worker 1 never started writing"
  kill -9 "$victim"
  # The other two workers would go on for seconds of simulated work nobody checks: the step ends
  # once the victim is gone.
  for _ in $(seq 50); do kill -0 "$victim" 2>/dev/null || break; sleep 0.1; done
  pkill -TERM -f -- "run -q $work/slow.txtpb" || true
  wait "$job" || true
  if ls "$work/killed" | grep -E -- "-worker-1-[0-9]+\.tfrecord$"; then fail "slurm: the killed worker left a shard that looks complete"; fi
  echo "  worker 1 killed mid-run: $(ls "$work/killed" | grep -c -- "-worker-1-") .partial file(s), no complete-looking shard"
fi

if [ "$launcher" = slurm ]; then
  # The one-node cluster never starts a heterogeneous job whose components share its one node
  # (backfill plans component 0 and never places component 1), so the script runs as the one
  # allocation it also supports: its `hetjob` directives removed, 2 of its 4 tasks workers.
  echo "slurm: the service's sbatch script: a dispatcher, 2 workers and 2 trainers, over TLS with the job's token"
  sed '/^#SBATCH hetjob/,/^[^#]/{/^#SBATCH/d}' "$repo/resources/slurm/service.sbatch" > "$work/service.sbatch"
  (cd "$repo" && SLUICE="$sluice" WORK_DIR="$work/service" WORKERS=2 sbatch --quiet --wait --cpus-per-task=1 --output="$work/service.out" \
    "$work/service.sbatch" --set "out.path=$work/service/trainer-{worker}.jsonl") ||
    { cat "$work/service.out" "$work/service/"*.log >&2; fail "slurm: the service job failed"; }
  grep -q "workers, 2 trainers" "$work/service.out" || { cat "$work/service.out" >&2; fail "slurm: the service job did not start its processes"; }
  python3 - "$repo/resources/examples/sensors" "$work/service" <<'EOF' || { cat "$work/service.out" "$work/service/"*.log >&2; fail "slurm: the trainers did not get every row once"; }
import csv, glob, json, sys
sensors, folder = sys.argv[1:]
expected = {(int(r["asset"]), int(r["step"])) for path in glob.glob(sensors + "/asset-*.csv") for r in csv.DictReader(open(path))}
got, per_trainer = [], []
for path in sorted(glob.glob(folder + "/trainer-*.jsonl")):
    rows = [(a, s) for line in open(path) for batch in [json.loads(line)] for a, s in zip(batch["asset"], batch["step"])]
    per_trainer.append(len(rows))
    got += rows
if len(per_trainer) != 2 or min(per_trainer) == 0:
    sys.exit(f"rows per trainer: {per_trainer}")
if len(got) != len(set(got)) or set(got) != expected:
    sys.exit(f"{len(got)} rows, {len(set(got))} distinct, {len(expected)} expected")
print(f"  {len(got)} rows, each once, shared by the trainers ({per_trainer[0]} and {per_trainer[1]})")
EOF
  grep -q "registered: .*(host" "$work/service/dispatcher.log" || fail "slurm: no worker registered"
  if grep -rqF -- "$(cat "$work/service/token")" "$work/service.out" "$work/service/"*.log "$work/service/"*.out; then fail "slurm: the token was printed"; fi
fi

if [ "$launcher" = slurm ]; then
  echo "slurm: a job preempted twice (scontrol requeue: SIGTERM, then requeued) resumes exactly, into the same file"
  cat > "$work/resumable.txtpb" <<EOF
options { seed: 9 }
stage { id: "src" op: "range" params { key: "count" value: "150000" } }
stage { id: "work" op: "simulate_work" input: "src" parallelism: 2 params { key: "us" value: "60" } }
stage { id: "mix" op: "shuffle" input: "work" params { key: "buffer_size" value: "500" } }
stage { id: "b" op: "batch" input: "mix" buffer_size: 2 params { key: "batch_size" value: "8" } }
stage { id: "out" op: "jsonl_sink" input: "b" params { key: "path" value: "$work/resumable.jsonl" } }
EOF
  # The uninterrupted output, without the simulated work (which passes elements through as they are).
  "$sluice" run -q "$work/resumable.txtpb" --set "out.path=$work/whole.jsonl" --set work.us=0 > /dev/null
  job_state() { scontrol show job "$1" | grep -o "JobState=[A-Z_]*" | cut -d= -f2; }
  restarts() { scontrol show job "$1" | grep -o "Restarts=[0-9]*" | cut -d= -f2; }
  wait_for() {  # job state [restarts]
    for _ in $(seq 300); do
      if [ "$(job_state "$1")" = "$2" ] && { [ -z "${3:-}" ] || [ "$(restarts "$1")" = "$3" ]; }; then return 0; fi
      sleep 0.1
    done
    fail "slurm: job $1 never reached $2 (it is $(job_state "$1"))"
  }
  # About 5 s of work: each of the first two runs is preempted after about a second.
  job=$(cd "$repo" && SLUICE="$sluice" PIPELINE="$work/resumable.txtpb" CHECKPOINT_DIR="$work/resumable-ck" \
    sbatch --parsable --output="$work/resumable.out" resources/slurm/resumable.sbatch)
  lines=()
  for part in 0 1; do
    wait_for "$job" RUNNING "$part"
    sleep 1.2
    scontrol requeue "$job"
    wait_for "$job" PENDING  # the run stopped at its checkpoint and the job is queued again
    [ -f "$work/resumable.jsonl" ] || { cat "$work/resumable.out" >&2; fail "slurm: run $part left no output"; }
    # What the run wrote up to its checkpoint; the next run goes on with the same file.
    lines[$part]=$(wc -l < "$work/resumable.jsonl")
    scontrol update jobid="$job" StartTime=now  # a requeued job otherwise waits before it may start
  done
  wait_for "$job" COMPLETED
  grep -q "checkpoint 2 written" "$work/resumable.out" || { cat "$work/resumable.out" >&2; fail "slurm: the second preemption wrote no checkpoint"; }
  [ "${lines[0]}" -gt 0 ] && [ "${lines[1]}" -gt "${lines[0]}" ] ||
    fail "slurm: the resumed run did not go on with the first run's output (${lines[0]}, then ${lines[1]} batches)"
  cmp -s "$work/resumable.jsonl" "$work/whole.jsonl" ||
    { cat "$work/resumable.out" >&2; fail "slurm: the resumed job's output differs from the uninterrupted run's"; }
  echo "  3 runs (to ${lines[0]}, to ${lines[1]}, to $(wc -l < "$work/resumable.jsonl") batches) make exactly the uninterrupted output, in one file"
fi

echo "$launcher: all checks passed"
