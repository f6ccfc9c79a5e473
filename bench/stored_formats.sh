#!/usr/bin/env bash
# The same 2048 JPEGs (the built-in sample, 320x240) read from three stored forms through one
# image pipeline (read -> decode -> resize 224 -> batch 64, 5 epochs, 2 readers, 2 decoders):
# TFRecord shards (the baseline), WebDataset tar shards, a tensorflow_datasets directory. The
# cases alternate, 3 rounds; the best images/s of each is printed with its ratio to TFRecord.
# Usage (after scripts/demo.sh): bash bench/stored_formats.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=${BUILD_DIR:-build}/bin/sluice
sample=${BUILD_DIR:-build}/sample_data
rounds=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$sample/complete_tfds" ] || { echo "run scripts/demo.sh first (it makes $sample)" >&2; exit 1; }

# The TFRecord sample's examples as tar shards of 256 samples: image.jpg-like members 'image', 'label'.
cat > "$work/to_wds.txtpb" <<PIPE
stage { id: "files" op: "list_files" params { key: "patterns" value: "$PWD/$sample/tfrecord/*.tfrecord" } params { key: "shuffle" value: "false" } }
stage { id: "read" op: "tfrecord_reader" input: "files" }
stage { id: "parse" op: "parse_example" input: "read" params { key: "features" value: "image:bytes, label:int64" } }
stage { id: "write" op: "webdataset_writer" input: "parse" params { key: "prefix" value: "$work/wds/train" } params { key: "max_records" value: "256" } }
PIPE
"$sluice" run "$work/to_wds.txtpb" --quiet > /dev/null

tail='stage { id: "decode" op: "decode_image" input: "read" parallelism: 2 }
stage { id: "resize" op: "resize" input: "decode" parallelism: 2 params { key: "height" value: "224" } params { key: "width" value: "224" } }
stage { id: "batch" op: "batch" input: "resize" params { key: "batch_size" value: "64" } }
stage { id: "epochs" op: "repeat" input: "batch" params { key: "count" value: "5" } }
stage { id: "out" op: "null_sink" input: "epochs" }'
cat > "$work/tfrecord.txtpb" <<PIPE
options { seed: 1 }
stage { id: "files" op: "list_files" params { key: "patterns" value: "$PWD/$sample/tfrecord/*.tfrecord" } }
stage { id: "records" op: "tfrecord_reader" input: "files" parallelism: 2 interleave { cycle_length: 4 block_length: 1 } }
stage { id: "read" op: "parse_example" input: "records" params { key: "features" value: "image:bytes, label:int64" } }
$tail
PIPE
cat > "$work/webdataset.txtpb" <<PIPE
options { seed: 1 }
stage { id: "files" op: "list_files" params { key: "patterns" value: "$work/wds/train-{000000..000007}.tar" } }
stage { id: "read" op: "webdataset_reader" input: "files" parallelism: 2 interleave { cycle_length: 4 block_length: 1 } params { key: "integers" value: "label" } }
$tail
PIPE
cat > "$work/tfds.txtpb" <<PIPE
options { seed: 1 }
stage { id: "files" op: "tfds" params { key: "name" value: "sample_images" } params { key: "split" value: "all" } params { key: "data_dir" value: "$PWD/$sample/tensorflow_datasets" } params { key: "shuffle_files" value: "true" } }
stage { id: "read" op: "tfds_reader" input: "files" parallelism: 2 interleave { cycle_length: 4 block_length: 1 } }
$tail
PIPE

declare -A best
for ((r = 0; r < rounds; r++)); do
  for form in tfrecord webdataset tfds; do
    rate=$("$sluice" bench "$work/$form.txtpb" --warmup 0.5 --seconds 60 2>&1 | sed -n 's/^Pipeline: \([0-9.]*\) elements\/s.*/\1/p')
    [ -n "$rate" ] || { echo "no rate from $form" >&2; exit 1; }
    if [ -z "${best[$form]:-}" ] || awk "BEGIN{exit !($rate > ${best[$form]})}"; then best[$form]=$rate; fi
  done
done
printf '%-12s %10s %10s\n' form images/s "vs tfrecord"
for form in tfrecord webdataset tfds; do
  printf '%-12s %10.0f %10.2fx\n' "$form" "${best[$form]}" "$(awk "BEGIN{print ${best[$form]} / ${best[tfrecord]}}")"
done
