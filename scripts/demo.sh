#!/usr/bin/env bash
# The main job on built-in data: installs what it needs, builds, makes the sample data once
# (2048 photo-like 320x240 JPEGs as 8 TFRecord shards, as a folder of class subfolders and as a
# tensorflow_datasets directory), then
# runs the image training pipeline headless and prints its per-stage report.
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-build}
# The peers environment (the tests' oracles) is not needed to build or run Sluice.
SLUICE_PEERS=${SLUICE_PEERS:-0} bash scripts/build.sh
sluice="$BUILD_DIR/bin/sluice"
sample="$BUILD_DIR/sample_data"
if [ ! -f "$sample/complete" ]; then
  echo "Making the sample data in $sample (once)..."
  rm -rf "$sample"
  "$sluice" run resources/pipelines/sample_data_tfrecord.txtpb --set "shards.prefix=$sample/tfrecord/train" > /dev/null
  "$sluice" run resources/pipelines/sample_data_jpeg.txtpb --set "files.folder=$sample/jpeg" > /dev/null
  touch "$sample/complete"
fi
if [ ! -f "$sample/complete_tfds" ]; then  # added after the first two: made where they are already
  tfds_sample=(resources/pipelines/sample_data_tfds.txtpb --set "files.patterns=$sample/tfrecord/*.tfrecord"
               --set "write.data_dir=$sample/tensorflow_datasets")
  "$sluice" run "${tfds_sample[@]}" > /dev/null
  "$sluice" run "${tfds_sample[@]}" --set part.from=0.9 --set part.to=1 --set write.split=test > /dev/null
  touch "$sample/complete_tfds"
fi
"$sluice" run resources/pipelines/train_tfrecord.txtpb --set "files.patterns=$sample/tfrecord/*.tfrecord" "$@"
