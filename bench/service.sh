#!/usr/bin/env bash
# What the Sluice service costs and what its compression buys, in one run (issue 47). A dispatcher
# and one worker run on this machine (loopback); the trainer reads from the worker (OFF mode: the
# worker runs the stages whole, as the trainer would), against the same pipeline run in the
# trainer's process:
#  1. transport alone, a source of tensors batched and nothing else: batches of 256 224x224x3 u8
#     images (38.5 MB each) and batches of 64 int64 values with their int64 index (1 KB each), in
#     GB/s and microseconds per batch, the worker read through its Unix socket (as trainers on its
#     machine read it) and over TCP on loopback (as other machines do, less the wire);
#  2. the image pipeline (bench/checkpoint_image.txtpb: decode, resize, flip, shuffle, batches of
#     64), through the worker against in the trainer, in images/s and the overhead in %;
#  3. compression (zstd level 1, snappy) against none, on image batches from the sample JPEGs
#     (the pipeline of 2.) and on token batches (lines of int64 token ids drawn from a Zipf law
#     over 32,000 ids, split and padded to the longest of 64): bytes on the wire (the worker's
#     /metrics) and batches/s.
# The same machine runs the worker and the trainer, so the service costs CPU on both sides that a
# separate CPU node would take on its own. Rounds alternate the cases; each figure is the median
# of the rounds, with their range.
#   bench/service.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
build=$(realpath "${2:-$repo/build}")
sluice="$build/bin/sluice"
[ -f "$build/sample_data/complete" ] || bash "$repo/scripts/demo.sh" > /dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-service.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Two services, each a dispatcher and one worker: one that trainers on this machine read through
# its Unix socket (--unix-socket), one read over TCP on loopback (the default).
start_service() {  # NAME [worker options]: its dispatcher's address in $work/NAME.address, the worker's /metrics in $work/NAME.metrics
  local name=$1
  shift
  "$sluice" dispatcher --port 0 > "$work/$name-dispatcher.out" 2> "$work/$name-dispatcher.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$work/$name-dispatcher.out" 2> /dev/null && break; sleep 0.1; done
  sed -n 's/.*listening on //p' "$work/$name-dispatcher.out" > "$work/$name.address"
  "$sluice" worker --dispatcher "$(cat "$work/$name.address")" --metrics-addr 0 "$@" > "$work/$name-worker.out" 2> "$work/$name-worker.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "metrics at" "$work/$name-worker.log" 2> /dev/null && grep -q "listening on" "$work/$name-worker.out" && break; sleep 0.1; done
  sed -n 's/.*metrics at http:\/\/\([^/]*\)\/metrics/\1/p' "$work/$name-worker.log" > "$work/$name.metrics"
}
start_service local --unix-socket
start_service tcp
dispatcher=$(cat "$work/local.address")
metrics=$(cat "$work/local.metrics")
worker_counter() {  # the value of a series of the worker's /metrics
  exec 3<> "/dev/tcp/${metrics%:*}/${metrics##*:}"
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  awk -v name="$1" '$1 == name { print $2 }' <&3
  exec 3>&-
}

# shellcheck source=bench/rounds.sh
source "$repo/bench/rounds.sh"
job=0
through_service() {  # the --set options that send stage $1 (and those before it) to the worker, compressed with $2, of service $3
  job=$((job + 1))
  echo "--set $1.distribute.service=grpc://$(cat "$work/${3:-local}.address") --set $1.distribute.processing_mode=OFF" \
    "--set $1.distribute.job_name=bench-$job --set $1.distribute.compression=${2:-NONE}"
}

# ---- pipelines ----
big_batches=24 small_batches=20000
cat > "$work/big.txtpb" <<EOF
stage { id: "images" op: "tensors" params { key: "count" value: "$((256 * big_batches))" } params { key: "shape" value: "224,224,3" } params { key: "dtype" value: "u8" } }
stage { id: "batch" op: "batch" input: "images" params { key: "batch_size" value: "256" } }
stage { id: "train" op: "null_sink" input: "batch" }
EOF
cat > "$work/small.txtpb" <<EOF
stage { id: "values" op: "tensors" params { key: "count" value: "$((64 * small_batches))" } params { key: "shape" value: "1" } params { key: "dtype" value: "i64" } }
stage { id: "batch" op: "batch" input: "values" params { key: "batch_size" value: "64" } }
stage { id: "train" op: "null_sink" input: "batch" }
EOF
sed "s|\.\./build/sample_data|$build/sample_data|" "$repo/bench/checkpoint_image.txtpb" > "$work/image.txtpb"
images=$((8 * 2048))
python3 - "$work/tokens.txt" <<'EOF'
import random, sys
random.seed(1)
ids = list(range(1, 32001))
weights = [1.0 / rank for rank in ids]  # Zipf: a few ids are most of the text, as in real corpora
with open(sys.argv[1], "w") as out:
    for _ in range(64 * 300):
        out.write(" ".join(map(str, random.choices(ids, weights, k=random.randint(16, 512)))) + "\n")
EOF
cat > "$work/tokens.txtpb" <<EOF
stage { id: "files" op: "list_files" params { key: "patterns" value: "$work/tokens.txt" } }
stage { id: "lines" op: "text_lines" input: "files" }
stage { id: "ids" op: "split_text" input: "lines" params { key: "to" value: "int64" } }
stage { id: "batch" op: "padded_batch" input: "ids" params { key: "batch_size" value: "64" } }
stage { id: "train" op: "null_sink" input: "batch" }
EOF
token_batches=300
cat "$build"/sample_data/tfrecord/*.tfrecord "$work/tokens.txt" > /dev/null  # page-cached
seconds "$work/small.txtpb" > /dev/null  # plugins described once

: > "$work/times"
for round in $(seq "$rounds"); do
  for case in big small image; do
    echo "$case here $(seconds "$work/$case.txtpb")" >> "$work/times"
    # shellcheck disable=SC2046
    echo "$case service $(seconds "$work/$case.txtpb" $(through_service batch))" >> "$work/times"
    # shellcheck disable=SC2046
    [ "$case" = image ] || echo "$case tcp $(seconds "$work/$case.txtpb" $(through_service batch NONE tcp))" >> "$work/times"
  done
  for data in image tokens; do
    for compression in NONE ZSTD SNAPPY; do
      sent=$(worker_counter sluice_worker_bytes_sent_total) raw=$(worker_counter sluice_worker_bytes_raw_total)
      # shellcheck disable=SC2046
      t=$(seconds "$work/$data.txtpb" $(through_service batch $compression))
      echo "$data-$compression $t $(( $(worker_counter sluice_worker_bytes_sent_total) - sent )) $(( $(worker_counter sluice_worker_bytes_raw_total) - raw ))" >> "$work/compression"
    done
  done
done

figure() {  # case: median seconds and their range
  awk -v c="$1" -v w="$2" '$1 == c && $2 == w { print $3 }' "$work/times"
}
echo
echo "1. transport alone ($rounds rounds; median, range):"
for case in big small; do
  if [ "$case" = big ]; then batches=$big_batches bytes=$((256 * 224 * 224 * 3 + 256 * 8)); else batches=$small_batches bytes=$((64 * 16)); fi
  for where in here service tcp; do
    gbs=$(figure "$case" "$where" | awk -v n="$batches" -v b="$bytes" '{ printf "%.3f\n", n * b / $1 / 1e9 }')
    us=$(figure "$case" "$where" | awk -v n="$batches" '{ printf "%.1f\n", $1 / n * 1e6 }')
    printf "   %-5s batches (%s B), %-16s: %s GB/s (%s), %s us per batch (%s)\n" "$case" "$bytes" \
      "$([ "$where" = here ] && echo "in the trainer" || { [ "$where" = tcp ] && echo "worker over TCP" || echo "worker, Unix socket"; })" \
      "$(echo "$gbs" | median)" "$(echo "$gbs" | range)" "$(echo "$us" | median)" "$(echo "$us" | range)"
  done
done
echo "2. the image pipeline ($images images):"
for where in here service; do
  rates=$(figure image "$where" | awk -v n="$images" '{ printf "%.0f\n", n / $1 }')
  printf "   %-7s: %s images/s (%s)\n" "$where" "$(echo "$rates" | median)" "$(echo "$rates" | range)"
done
here=$(figure image here | median) there=$(figure image service | median)
echo "   overhead through one local worker: $(echo "$there $here" | awk '{ printf "%.1f", ($1 / $2 - 1) * 100 }')% of the time"
echo "3. compression (bytes on the wire / before compression; batches/s median, range):"
for data in image tokens; do
  if [ "$data" = image ]; then batches=$((images / 64)); else batches=$token_batches; fi
  for compression in NONE ZSTD SNAPPY; do
    ratio=$(awk -v c="$data-$compression" '$1 == c { s += $3; r += $4 } END { printf "%.3f", s / r }' "$work/compression")
    rates=$(awk -v c="$data-$compression" -v n="$batches" '$1 == c { printf "%.1f\n", n / $2 }' "$work/compression")
    printf "   %-6s %-6s: %s of the bytes, %s batches/s (%s)\n" "$data" "$compression" "$ratio" "$(echo "$rates" | median)" "$(echo "$rates" | range)"
  done
done
