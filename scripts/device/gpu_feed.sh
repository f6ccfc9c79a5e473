#!/usr/bin/env bash
# On the GPU machine (device tool, with `carry: ["device_bundle"]`, after scripts/device/prepare.sh
# here): gpu_feed's checks on real devices, written to $OUT (and printed):
#  1. correctness: consume: checksum for 1 and 4 logical devices (every slice's device checksum
#     must match the host's; a mismatch fails the run), split: pad with a batch that does not
#     divide evenly, so that padding is checked too;
#  2. bench_feed for 1 and 4 logical devices: H2D bytes/s against cudaMemcpyAsync from pinned
#     memory (both timed on the device with CUDA events, then end to end), and step time with
#     simulate_step_us against the kernels alone.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
bundle=device_bundle
export LD_LIBRARY_PATH="$PWD/$bundle/lib:${LD_LIBRARY_PATH:-}"
export SLUICE_PLUGIN_PATH=
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
  status=0
  for devices in 0 0,0,0,0; do
    echo "== consume: checksum on devices $devices"
    "$bundle/bin/sluice" run resources/pipelines/gpu_feed_checksum.txtpb --quiet --set "feed.devices=$devices" || status=1
  done
  for devices in 0 0,0,0,0; do
    echo "== bench_feed on devices $devices"
    "$bundle/bin/bench_feed" --devices "$devices" --batch 64 --step-us 2000 || status=1
  done
  echo "gpu_feed.sh: exit $status"
  exit "$status"
} 2>&1 | tee "$out/gpu_feed.txt"  # pipefail: the script exits with the block's status
