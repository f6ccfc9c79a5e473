#!/usr/bin/env bash
# Builds the libFuzzer targets (TFRecord framing, ArrayRecord files, Example parsing, CSV rows, pipeline files as
# text and JSON, image headers through decode_image) with clang (ASan + UBSan) and runs each for a bounded time,
# seeded from the real files in tests/data/real. A crash fails the run and leaves the
# input under build-fuzz/crashes/. Usage: scripts/fuzz.sh [build|run] [SECONDS_PER_TARGET]
# (default 60): `build` only builds the targets, `run` only runs them; without either, both.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage.sh
steps=(build run)
case ${1:-} in
  build|run) steps=("$1"); shift ;;
esac
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz.sh: '$seconds' is not a number of seconds (usage: scripts/fuzz.sh [build|run] [SECONDS_PER_TARGET])" >&2; exit 2; }
testdata=${SLUICE_TESTDATA:-tests/data/real}
out=build-fuzz
build_targets() {
  # fuzz_parquet takes Arrow C++ from the build's peers environment (left out without one).
  CXX=clang++-14 cmake -S tests/fuzz -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON \
    "-DSLUICE_PEERS_DIR=$(realpath -m "${BUILD_DIR:-build}")/peers" > /dev/null
  cmake --build "$out" -j "${JOBS:-2}"
}
if [[ " ${steps[*]} " == *" build "* ]]; then
  SLUICE_PEERS=0 bash scripts/install-deps.sh
  stage "build build-fuzz" build_targets
fi
[[ " ${steps[*]} " == *" run "* ]] || exit 0
targets=(fuzz_tfrecord fuzz_array_record fuzz_example fuzz_csv fuzz_pipeline fuzz_image fuzz_stored)
if [ -x "$out/fuzz_parquet" ]; then targets+=(fuzz_parquet); else echo "fuzz.sh: fuzz_parquet was left out of the build (no pyarrow in the peers environment)"; fi
for target in "${targets[@]}"; do
  [ -x "$out/$target" ] || { echo "fuzz.sh: $out/$target is not built: run scripts/fuzz.sh build first" >&2; exit 1; }
done

# Seeds: TFRecord files as they are; single serialized Examples extracted by sluice itself.
corpus="$out/corpus"
rm -rf "$corpus" && mkdir -p "$corpus/tfrecord" "$corpus/array_record" "$corpus/parquet" "$corpus/example" "$corpus/csv" "$corpus/pipeline" "$corpus/image" "$corpus/stored" "$out/crashes"
for f in "$testdata"/tfrecord/*.tfrecord "$testdata"/tfrecord/*.gz "$testdata"/tfrecord/corrupt/*; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 1000000 ] && cp "$f" "$corpus/tfrecord/"
done
cp tests/fuzz/seeds/csv/* "$corpus/csv/"
# Pipeline and image targets read an options byte first: each seed goes in with two of them.
prefixed() {  # prefixed DEST_DIR FILE...
  local dest=$1; shift
  for f in "$@"; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 200000 ] || continue
    for b in 00 1d; do { printf "\\x$b"; cat "$f"; } > "$dest/$b-$(basename "$f")"; done
  done
}
prefixed "$corpus/pipeline" resources/pipelines/*.txtpb tests/fuzz/seeds/pipeline/*
prefixed "$corpus/image" "$testdata"/jpeg/*/*.jpg tests/fuzz/seeds/image/*
# fuzz_stored: byte 0 picks tfds metadata (info NUL features NUL split), .npy, or a tar shard.
{ printf '\x00'; sed 's/"array_record"/"tfrecord"/' "$testdata"/tfds/metadata/mnist/3.0.1/dataset_info.json; printf '\0'; cat tests/fuzz/seeds/stored/features.json; printf '\0train[:10%%]+test[1shard]'; } > "$corpus/stored/mnist"
cp tests/fuzz/seeds/stored/*.npy.seed "$corpus/stored/" 2>/dev/null || true
for f in "$testdata"/webdataset/*; do { printf '\x02'; cat "$f"; } > "$corpus/stored/$(basename "$f")"; done
sluice=${BUILD_DIR:-build}/bin/sluice
# Paths written in a pipeline file are relative to its folder ($out here): write them absolute.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
if [ -x "$sluice" ]; then
  for f in torchdata_example.tfrecord torchdata_sequence_example.tfrecord tfx_penguin_eval.tfrecord.gz; do
    cat > "$out/extract.txtpb" <<PIPE
stage { id: "files" op: "list_files" params { key: "patterns" value: "$(absolute "$testdata")/tfrecord/$f" } }
stage { id: "read" op: "tfrecord_reader" input: "files" }
stage { id: "take" op: "take" input: "read" params { key: "count" value: "8" } }
stage { id: "out" op: "write_files" input: "take" params { key: "folder" value: "$(absolute "$corpus")/example/${f%%.*}" } params { key: "field" value: "record" } params { key: "class_field" value: "" } params { key: "extension" value: ".pb" } }
PIPE
    "$sluice" run "$out/extract.txtpb" > /dev/null
  done
  # ArrayRecord files of each compression, 40 small Examples in chunks of 1 and of 7.
  for options in uncompressed,group_size:1 zstd,group_size:7 brotli:1,group_size:7 snappy,group_size:7; do
    cat > "$out/array_record.txtpb" <<PIPE
stage { id: "img" op: "synthetic_images" params { key: "count" value: "40" } params { key: "height" value: "2" } params { key: "width" value: "2" } }
stage { id: "out" op: "array_record_writer" input: "img" params { key: "prefix" value: "$(absolute "$corpus")/array_record/${options//[:,]/-}" } params { key: "field" value: "" } params { key: "options" value: "$options" } }
PIPE
    "$sluice" run "$out/array_record.txtpb" > /dev/null
  done
  # Parquet files of each compression, 40 small images (bytes, labels, pixels as lists of fixed
  # size and of varying length) in row groups of 7; the target reads an options byte first.
  for compression in snappy zstd gzip none; do
    for lists in fixed varying; do
      cat > "$out/parquet.txtpb" <<PIPE
stage { id: "img" op: "synthetic_images" params { key: "count" value: "40" } params { key: "height" value: "2" } params { key: "width" value: "2" } }
stage { id: "out" op: "parquet_writer" input: "img" params { key: "prefix" value: "$(absolute "$corpus")/parquet/$compression-$lists" } params { key: "compression" value: "$compression" } params { key: "lists" value: "$lists" } params { key: "row_group_rows" value: "7" } }
PIPE
      "$sluice" run "$out/parquet.txtpb" > /dev/null 2>&1 || echo "fuzz.sh: no Parquet seeds of $compression (is the Parquet plugin built?)"
    done
  done
  for f in "$corpus"/parquet/*.parquet; do
    [ -f "$f" ] || continue
    for b in 00 03; do { printf "\\x$b"; cat "$f"; } > "$f.$b"; done
    rm "$f"
  done
  # The fuzz target reads a spec selector byte, then the record.
  find "$corpus/example" -name '*.pb' | while read -r f; do
    for s in 0 1 2; do { printf "\\x0$s"; cat "$f"; } > "$corpus/example/$(basename "$f").$s"; done
    rm "$f"
  done
fi

# The targets run side by side, as many at once as there are build jobs: each still gets its
# full time, and CI waits for half as long on two cores.
run_target() {  # run_target NAME: 0, or 1 and the end of its log when it found a crash
  local target=$1 dir="$corpus/${1#fuzz_}"
  if ! "$out/$target" -max_total_time="$seconds" -max_len=1048576 -rss_limit_mb=2048 -artifact_prefix="$out/crashes/$target-" \
       -print_final_stats=1 "$dir" > "$out/$target.log" 2>&1; then
    echo "$target found a crash:"; tail -40 "$out/$target.log"; return 1
  fi
  echo "== $target for ${seconds}s ($(find "$dir" -type f | wc -l) seeds): $(grep -E "stat::number_of_executed_units" "$out/$target.log" | tail -1)"
}
export -f run_target
export out corpus seconds
status=0
run_all_targets() {
  printf '%s\n' "${targets[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c 'run_target {}'
}
stage "fuzzing (${#targets[@]} targets, ${seconds} s each)" run_all_targets || status=1
exit $status
