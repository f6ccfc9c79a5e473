#!/usr/bin/env bash
# A global shuffle (random_access: every record of every file in a permutation computed per
# epoch, read with positioned reads) against reading the same files in order, in one run:
#  1. records/s over 1,000,000 small records in 100 TFRecord files (page-cached): random_access
#     shuffled, random_access in file order, and list_files -> tfrecord_reader (sequential reads);
#  2. images/s of the image pipeline (bench/checkpoint_image.txtpb, a 10,000-element shuffle
#     buffer) against the same pipeline with a global shuffle instead (global_shuffle_image.txtpb);
#  3. the bytes of a checkpoint of each image pipeline, taken once batches flow (SIGTERM);
#  4. the memory the index takes per million records (peak RSS over 100 files against 1 file).
# Rounds alternate the cases; each figure is the median of the rounds, with their range.
#   bench/global_shuffle.sh [ROUNDS] [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
build=$(realpath "${2:-$repo/build}")
sluice="$build/bin/sluice"
[ -f "$build/sample_data/complete" ] || bash "$repo/scripts/demo.sh" > /dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-global-shuffle.XXXXXX")
trap 'rm -rf "$work"' EXIT

stage() {  # ID OP INPUT PARAMS...
  local id=$1 op=$2 input=$3 text
  shift 3
  text="stage { id: \"$id\" op: \"$op\""
  [ -n "$input" ] && text+=" input: \"$input\""
  while [ $# -gt 0 ]; do text+=" params { key: \"$1\" value: \"$2\" }"; shift 2; done
  echo "$text }"
}
# shellcheck source=bench/rounds.sh
source "$repo/bench/rounds.sh"

# 1,000,000 tf.Examples of one int64 (about 30 bytes each), 10,000 per file.
{
  echo "options { seed: 1 }"
  stage ids range "" count 1000000
  stage shards tfrecord_writer ids prefix "$work/small/part" max_records 10000
} > "$work/make.txtpb"
"$sluice" run -q "$work/make.txtpb" > /dev/null 2>&1
"$sluice" index -q "$work"/small/part-*.tfrecord
echo "data: $(ls "$work"/small/*.tfrecord | wc -l) files, $(du -sb "$work/small" | awk '{print $1}') bytes with their indexes"
{ echo "options { seed: 1 }"; stage src random_access "" patterns "$work/small/*.tfrecord" build_index false; stage out null_sink src; } > "$work/shuffled.txtpb"
{ echo "options { seed: 1 }"; stage src random_access "" patterns "$work/small/*.tfrecord" build_index false shuffle false; stage out null_sink src; } > "$work/in_order.txtpb"
{ echo "options { seed: 1 }"; stage files list_files "" patterns "$work/small/*.tfrecord" shuffle false; stage read tfrecord_reader files; stage out null_sink read; } > "$work/sequential.txtpb"
cat "$work"/small/*.tfrecord > /dev/null  # page-cached
seconds "$work/sequential.txtpb" > /dev/null

: > "$work/records"
for round in $(seq "$rounds"); do
  for case in sequential in_order shuffled; do echo "$case $(seconds "$work/$case.txtpb")" >> "$work/records"; done
done
echo
echo "1. records/s, 1,000,000 records in 100 files (median of $rounds rounds, range):"
for case in sequential in_order shuffled; do
  rates=$(awk -v c="$case" '$1 == c { printf "%.0f\n", 1000000 / $2 }' "$work/records")
  printf "   %-42s %9s  (%s)\n" "$(case $case in sequential) echo "list_files -> tfrecord_reader (sequential)";;
      in_order) echo "random_access, shuffle: false (file order)";; shuffled) echo "random_access, global shuffle";; esac)" \
    "$(echo "$rates" | median)" "$(echo "$rates" | range)"
done
seq_rate=$(awk '$1 == "sequential" { printf "%.0f\n", 1000000 / $2 }' "$work/records" | median)
shuf_rate=$(awk '$1 == "shuffled" { printf "%.0f\n", 1000000 / $2 }' "$work/records" | median)
echo "   global shuffle / sequential: $(echo "scale=2; $shuf_rate / $seq_rate" | bc)x"

# 2. The image pipelines: 2,048 sample images read 8 times (16,384 images each run).
"$sluice" index -q --index-dir "$build/sample_data/index" "$build"/sample_data/tfrecord/*.tfrecord
buffer="$repo/bench/checkpoint_image.txtpb" global="$repo/bench/global_shuffle_image.txtpb"
: > "$work/images"
for round in $(seq "$rounds"); do
  echo "buffer $(cd "$repo" && seconds "$buffer")" >> "$work/images"
  echo "global $(cd "$repo" && seconds "$global")" >> "$work/images"
done
echo
echo "2. images/s of the image pipeline, 16,384 images (median of $rounds rounds, range):"
for case in buffer global; do
  rates=$(awk -v c="$case" '$1 == c { printf "%.0f\n", 16384 / $2 }' "$work/images")
  printf "   %-42s %9s  (%s)\n" "$([ $case = buffer ] && echo "10,000-element shuffle buffer" || echo "global shuffle (random_access)")" \
    "$(echo "$rates" | median)" "$(echo "$rates" | range)"
done

# 3. A checkpoint of each, once batches reach the sink (the shuffle buffer is full then).
checkpoint_bytes() {  # PIPELINE NAME
  (cd "$repo" && "$sluice" run "$1" --checkpoint "$work/ck-$2" --progress-every 0.1 > /dev/null 2> "$work/$2.err") &
  local pid=$! code=0
  for _ in $(seq 600); do
    grep -qE "[0-9]+ elements, [1-9][0-9]* batches" "$work/$2.err" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.5
  pkill -TERM -P "$pid" sluice 2>/dev/null || true
  wait "$pid" || code=$?
  [ "$code" = 75 ] || { cat "$work/$2.err" >&2; echo "the $2 run did not stop at a checkpoint (exit $code)" >&2; exit 1; }
  stat -c %s "$work/ck-$2/checkpoint.sluice"
}
echo
echo "3. checkpoint bytes, taken once batches flow:"
echo "   10,000-element shuffle buffer: $(checkpoint_bytes "$buffer" buffer) B"
echo "   global shuffle:                $(checkpoint_bytes "$global" global) B"
"$sluice" checkpoint info "$work/ck-global" | grep -E "records|epoch" | head -3 | sed 's/^/     /'

# 4. The index's memory: peak RSS reading 1 record through random_access over the 100 files
# (1,000,000 records' offsets) against over one file (10,000).
peak_kb() {
  { echo "options { seed: 1 }"; stage src random_access "" patterns "$1" build_index false; stage one take src count 1; stage out null_sink one; } > "$work/peak.txtpb"
  /usr/bin/time -f %M "$sluice" run -q "$work/peak.txtpb" 2>&1 > /dev/null | tail -1
}
all=$(peak_kb "$work/small/*.tfrecord") one=$(peak_kb "$work/small/part-00000-of-00100.tfrecord")
echo
echo "4. index memory: peak RSS $all KB over 1,000,000 records, $one KB over 10,000:" \
  "$(echo "scale=1; ($all - $one) / 1024 / 0.99" | bc) MB per million records"
