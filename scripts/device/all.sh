#!/usr/bin/env bash
# What a lent GPU machine runs, as one command (the device tool, `carry: ["device_bundle"]`, after
# scripts/device/prepare.sh here): the GPU checks (gpu_feed.sh), then, when the bundle holds
# bench_io (SLUICE_DEVICE_SCALING=1), the image pipeline on 1 to 16 cores (scaling.sh). Each
# writes its file under $OUT; the exit status is 0 only if all that ran passed.
cd "$(dirname "$0")/../.."
status=0
bash scripts/device/gpu_feed.sh || status=1
if [ -x device_bundle/bin/bench_io ]; then bash scripts/device/scaling.sh || status=1; fi
exit "$status"
