#!/usr/bin/env bash
# What lineage and the delivery ledger cost on the image pipeline (the README's, over the sample
# data: 2,048 JPEGs decoded and resized to 224, batches of 64): `sluice run` without and with
# --ledger (which follows lineage: every record stamped, every batch naming its rows, the sink's
# ledger), alternated, ROUNDS rounds. The small-records figures are bench_small_records' lineage1.
#   bash bench/lineage_cost.sh [ROUNDS]      (after scripts/demo.sh made build/sample_data)
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=build/bin/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/rounds.sh
rounds=${1:-5}
pipeline=resources/pipelines/train_tfrecord.txtpb
set_files=(--set "files.patterns=build/sample_data/tfrecord/*.tfrecord")
off=() on=()
for _ in $(seq "$rounds"); do
  off+=("$(seconds "$pipeline" "${set_files[@]}")")
  on+=("$(seconds "$pipeline" "${set_files[@]}" --ledger "$work/run.ledger")")
done
echo "image pipeline, $rounds alternated rounds (seconds for 2,048 images): without $(printf '%s\n' "${off[@]}" | median)" \
     "($(printf '%s\n' "${off[@]}" | range)), with lineage and the ledger $(printf '%s\n' "${on[@]}" | median) ($(printf '%s\n' "${on[@]}" | range))"
"$sluice" ledger "$work/run.ledger" | head -1
