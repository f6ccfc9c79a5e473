#!/usr/bin/env bash
# On this (GPU-less) machine: builds what the GPU machine runs and gathers it into
# device_bundle/ (ignored by git, carried by the device tool): the sluice CLI, bench_feed, the
# std and cuda plugins, and the shared libraries they need that a bare CUDA image lacks
# (protobuf, fmt...). The GPU machine has nvcc and CMake but no protobuf or Qt headers, so the
# build happens here. Then run scripts/device/gpu_feed.sh there with `carry: ["device_bundle"]`.
# With SLUICE_DEVICE_SCALING=1 the bundle also holds what scripts/device/scaling.sh runs
# (bench_io, the io and vision plugins, OpenCV and what it loads); it then says whether the bundle
# fits in what a device run carries (64 MiB): with Debian's OpenCV, whose image codecs load GDAL,
# x265 and ICU, it does not (177 MiB on 2026-11-30), and scaling.sh runs on a machine with the
# cores instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=build-device bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF > /dev/null
if ! grep -q "SLUICE_HAVE_CUDA" build-device/build.ninja; then
  echo "prepare.sh: no CUDA backend was built (nvcc not found?): nothing to run on a GPU" >&2
  exit 1
fi
rm -rf device_bundle && mkdir -p device_bundle/bin device_bundle/lib/sluice/plugins
programs=(sluice bench_feed) plugins=(std cuda)
[ "${SLUICE_DEVICE_SCALING:-0}" = 1 ] && programs+=(bench_io) plugins+=(io vision)
for program in "${programs[@]}"; do cp "build-device/bin/$program" device_bundle/bin/; done
for plugin in "${plugins[@]}"; do cp "build-device/lib/sluice/plugins/libsluice_$plugin.so" device_bundle/lib/sluice/plugins/; done
# Every library they load except the C and C++ runtimes, which the GPU machine has (newer).
for f in device_bundle/bin/* device_bundle/lib/sluice/plugins/*; do
  ldd "$f" | awk '/=> \// { print $3 }'
done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" device_bundle/lib/; done
mib=$(( $(du -sb device_bundle | cut -f1) / 1048576 ))
echo "device_bundle: $mib MiB"
if [ "$mib" -ge 64 ]; then
  echo "prepare.sh: device_bundle is $mib MiB, more than a device run carries (64 MiB in all)" >&2
  exit 1
fi
