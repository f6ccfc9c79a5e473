#!/usr/bin/env bash
# Checkpoint size and time for the image pipeline with a 10,000-element shuffle buffer
# (bench/checkpoint_image.txtpb), against the bytes tf.data's iterator checkpoint would hold (the
# buffered elements themselves). Stops the run with SIGTERM once the buffer is full (the first
# batch has reached the sink), then resumes it to the end.
#   bench/checkpoint.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$repo/build}")
sluice="$build/bin/sluice"
[ -f "$build/sample_data/complete" ] || bash "$repo/scripts/demo.sh" > /dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-checkpoint-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
pipeline="$repo/bench/checkpoint_image.txtpb"

start=$(date +%s.%N)
"$sluice" run -q "$pipeline" --metrics-log "$work/whole.jsonl" > /dev/null 2>&1
whole=$(echo "$(date +%s.%N) - $start" | bc)

"$sluice" run "$pipeline" --checkpoint "$work/ck" --progress-every 0.1 > /dev/null 2> "$work/first.err" &
pid=$!
# The buffer is full once batches reach the sink: watch the progress lines for the first ones.
for _ in $(seq 600); do
  if grep -qE "[0-9]+ elements, [1-9][0-9]* batches" "$work/first.err"; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
sleep 0.5
kill -TERM "$pid"
code=0
wait "$pid" || code=$?
[ "$code" = 75 ] || { cat "$work/first.err" >&2; echo "the run did not stop at a checkpoint (exit $code)" >&2; exit 1; }
grep "checkpoint 1 written" "$work/first.err"
"$sluice" checkpoint info "$work/ck"
held=$("$sluice" checkpoint info "$work/ck" | awk '$2 == "shuffle" {print $3}')
bytes=$(stat -c %s "$work/ck/checkpoint.sluice")
element=$((224 * 224 * 3 + 8))  # a decoded image and its label
echo "tf.data's checkpoint would hold the buffered elements: $held x $element B = $((held * element)) B"
echo "this checkpoint: $bytes B ($(echo "scale=5; $bytes * 100 / ($held * $element)" | bc)% of that)"
start=$(date +%s.%N)
"$sluice" run -q "$pipeline" --resume "$work/ck" > /dev/null 2> "$work/rest.err"
echo "resume to the end: $(echo "$(date +%s.%N) - $start" | bc) s; the uninterrupted run: $whole s"
grep "resumed from" "$work/rest.err"
