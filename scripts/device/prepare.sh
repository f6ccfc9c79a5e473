#!/usr/bin/env bash
# On this (GPU-less) machine: builds what the GPU machine runs and gathers it into
# device_bundle/ (ignored by git, carried by the device tool): the sluice CLI, bench_feed, the
# std and cuda plugins, and the shared libraries they need that a bare CUDA image lacks
# (protobuf, fmt...). The GPU machine has nvcc and CMake but no protobuf or Qt headers, so the
# build happens here. Then run scripts/device/gpu_feed.sh there with `carry: ["device_bundle"]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=build-device bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF > /dev/null
if ! grep -q "SLUICE_HAVE_CUDA" build-device/build.ninja; then
  echo "prepare.sh: no CUDA backend was built (nvcc not found?): nothing to run on a GPU" >&2
  exit 1
fi
rm -rf device_bundle && mkdir -p device_bundle/bin device_bundle/lib/sluice/plugins
cp build-device/bin/sluice build-device/bin/bench_feed device_bundle/bin/
cp build-device/lib/sluice/plugins/libsluice_std.so build-device/lib/sluice/plugins/libsluice_cuda.so device_bundle/lib/sluice/plugins/
# Every library they load except the C and C++ runtimes, which the GPU machine has (newer).
for f in device_bundle/bin/* device_bundle/lib/sluice/plugins/*; do
  ldd "$f" | awk '/=> \// { print $3 }'
done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" device_bundle/lib/; done
du -sh device_bundle
