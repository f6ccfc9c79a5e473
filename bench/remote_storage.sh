#!/usr/bin/env bash
# Reading from an S3 server on loopback (s3rver, as the tests start it), against curl fetching the
# same objects with the same number of parallel connections (one curl process, --parallel, its
# connections reused, requests signed with --aws-sigv4), in one run:
#   - TFRecord shards (the sample's 8 shards, each stored COPIES times: 256 objects, 1.2 GB by
#     default): MB/s, and curl's with twice the connections (an interleave of CONNECTIONS readers
#     has up to as many more objects opened ahead, their first ranges in flight);
#   - the sample's 2,048 JPEGs as 2,048 objects, read with read_file: objects/s;
#   - the TFRecord read through tests/remote/s3_proxy.py, without and with 20 ms before every
#     answer: what read-ahead keeps of the throughput;
#   - the TFRecord read again from a filled --remote-cache, against the same files read from
#     local disk (both from the page cache).
# The cases alternate over ROUNDS rounds; medians are printed. Wall-clock time of whole
# runs (a Sluice run's start included, 60-70 ms).
# Usage (after scripts/demo.sh): bash bench/remote_storage.sh [ROUNDS] [CONNECTIONS] [COPIES]
set -euo pipefail
cd "$(dirname "$0")/.."
sluice=$PWD/${BUILD_DIR:-build}/bin/sluice
sample=$PWD/${BUILD_DIR:-build}/sample_data
rounds=${1:-5}
connections=${2:-4}
copies=${3:-32}  # of the sample's 8 shards: 32 make 256 objects, 1.2 GB, and a run's start a few percent of it
[ -f "$sample/complete" ] || { echo "run scripts/demo.sh first (it makes $sample)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

port=$(free_port)
node --openssl-legacy-provider tests/servers/node_modules/s3rver/bin/s3rver.js --directory "$work/s3" --port "$port" --silent >/dev/null &
pids+=($!)
wait_port "$port"
proxy_port=$(free_port)
echo '[{"action": "delay", "seconds": 0.02, "times": -1}]' > "$work/delay.json"
echo '[]' > "$work/none.json"
cp "$work/none.json" "$work/faults.json"
python3 tests/remote/s3_proxy.py "$proxy_port" "http://127.0.0.1:$port" S3RVER "$work/faults.json" /dev/null &
pids+=($!)
wait_port "$proxy_port"
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1

python3 - "$sample" "$AWS_ENDPOINT_URL" "$copies" > "$work/objects.txt" <<'PY'
import glob, os, sys
COPIES = int(sys.argv[3])
from concurrent.futures import ThreadPoolExecutor
import boto3
sample, endpoint = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint)
s3.create_bucket(Bucket="bench")
jobs = [(p, f"tfr/copy{c}-{os.path.basename(p)}") for c in range(COPIES) for p in sorted(glob.glob(sample + "/tfrecord/*.tfrecord"))]
jobs += [(p, "jpeg/" + os.path.relpath(p, sample + "/jpeg")) for p in sorted(glob.glob(sample + "/jpeg/**/*.jpg", recursive=True))]
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda j: s3.upload_file(j[0], "bench", j[1]), jobs))
for path, key in jobs:
    print(key, os.path.getsize(path))
PY
tfr_bytes=$(awk '$1 ~ /^tfr\// {s += $2} END {print s}' "$work/objects.txt")
jpeg_count=$(grep -c '^jpeg/' "$work/objects.txt")

curl_config() {  # $1: prefix of the keys, $2: endpoint
  grep "^$1" "$work/objects.txt" | while read -r key _; do printf 'url = "%s/bench/%s"\noutput = "/dev/null"\n' "$2" "$key"; done
}
curl_config tfr/ "$AWS_ENDPOINT_URL" > "$work/curl_tfr.cfg"
curl_config jpeg/ "$AWS_ENDPOINT_URL" > "$work/curl_jpeg.cfg"

cat > "$work/tfr.txtpb" <<PIPE
stage { id: "files" op: "list_files" params { key: "patterns" value: "s3://bench/tfr/*.tfrecord" } }
stage { id: "records" op: "tfrecord_reader" input: "files" parallelism: $connections interleave { cycle_length: $connections block_length: 16 } }
stage { id: "out" op: "null_sink" input: "records" }
PIPE
mkdir -p "$work/local"
for c in $(seq 0 $((copies - 1))); do for f in "$sample"/tfrecord/*.tfrecord; do cp "$f" "$work/local/copy$c-$(basename "$f")"; done; done
sed "s|s3://bench/tfr/\*.tfrecord|$work/local/*.tfrecord|" "$work/tfr.txtpb" > "$work/local.txtpb"
"$sluice" run -q --remote-cache "$work/cache" "$work/tfr.txtpb" > /dev/null  # fills the cache
cat > "$work/jpeg.txtpb" <<PIPE
stage { id: "files" op: "list_files" params { key: "patterns" value: "s3://bench/jpeg/**/*.jpg" } }
stage { id: "read" op: "read_file" input: "files" parallelism: $connections }
stage { id: "out" op: "null_sink" input: "read" }
PIPE

seconds() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); awk "BEGIN{print $t1 - $t0}"; }
# curl 7.88 signs but does not send the payload hash S3 requires: the empty body's, given.
curl_run() {  # $1: config, $2: connections (default: $connections)
  curl -s --fail --no-progress-meter --parallel --parallel-max "${2:-$connections}" --aws-sigv4 "aws:amz:us-east-1:s3" --user S3RVER:S3RVER \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" -K "$1"
}
# Each round measures the cases of a comparison one right after the other; a comparison's ratio
# is the median of its rounds' ratios (this machine's speed drifts between rounds more than
# within one: the server shares its cores with the client).
measure() { echo "$r $1 $2" >> "$work/rounds.txt"; }
for ((r = 0; r < rounds; r++)); do
  measure curl_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds curl_run "$work/curl_tfr.cfg") / 1e6}")"
  measure sluice_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds "$sluice" run -q "$work/tfr.txtpb") / 1e6}")"
  measure curl_tfr_wide "$(awk "BEGIN{print $tfr_bytes / $(seconds curl_run "$work/curl_tfr.cfg" $((2 * connections))) / 1e6}")"
  measure curl_jpeg "$(awk "BEGIN{print $jpeg_count / $(seconds curl_run "$work/curl_jpeg.cfg")}")"
  measure sluice_jpeg "$(awk "BEGIN{print $jpeg_count / $(seconds "$sluice" run -q "$work/jpeg.txtpb")}")"
  cp "$work/none.json" "$work/faults.json"
  measure proxy_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds env AWS_ENDPOINT_URL=http://127.0.0.1:$proxy_port "$sluice" run -q "$work/tfr.txtpb") / 1e6}")"
  cp "$work/delay.json" "$work/faults.json"
  measure delayed_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds env AWS_ENDPOINT_URL=http://127.0.0.1:$proxy_port "$sluice" run -q "$work/tfr.txtpb") / 1e6}")"
  measure local_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds "$sluice" run -q "$work/local.txtpb") / 1e6}")"
  measure cached_tfr "$(awk "BEGIN{print $tfr_bytes / $(seconds "$sluice" run -q --remote-cache "$work/cache" "$work/tfr.txtpb") / 1e6}")"
done
python3 - "$work/rounds.txt" "$connections" "$rounds" "$((copies * 8))" "$((tfr_bytes / 1000000))" "$jpeg_count" <<'PY'
import statistics, sys
path, connections, rounds, objects, megabytes, jpegs = sys.argv[1:]
runs = {}
for line in open(path):
    r, case, value = line.split()
    runs.setdefault(case, {})[int(r)] = float(value)
def median(case):
    return statistics.median(runs[case].values())
def ratio(case, base):
    ratios = sorted(runs[case][r] / runs[base][r] for r in runs[case])
    return f"{statistics.median(ratios):7.2f}x  ({ratios[0]:.2f}-{ratios[-1]:.2f})"
print(f"s3rver on loopback, {connections} connections, medians of {rounds} rounds (ratio: median of the rounds' ratios, and their range)")
print(f"{'case':<44} {'curl':>10} {'sluice':>10}   ratio")
print(f"{f'TFRecord, {objects} objects, {megabytes} MB (MB/s)':<44} {median('curl_tfr'):10.1f} {median('sluice_tfr'):10.1f} {ratio('sluice_tfr', 'curl_tfr')}")
print(f"{f'  curl with {2 * int(connections)} connections (MB/s)':<44} {median('curl_tfr_wide'):10.1f} {'-':>10} {ratio('sluice_tfr', 'curl_tfr_wide')}")
print(f"{f'JPEGs, {jpegs} objects (objects/s)':<44} {median('curl_jpeg'):10.0f} {median('sluice_jpeg'):10.0f} {ratio('sluice_jpeg', 'curl_jpeg')}")
print(f"{'TFRecord through the proxy (MB/s)':<44} {'-':>10} {median('proxy_tfr'):10.1f}")
print(f"{'  with 20 ms before every answer (MB/s)':<44} {'-':>10} {median('delayed_tfr'):10.1f} {ratio('delayed_tfr', 'proxy_tfr')}")
print(f"{'TFRecord, local files (MB/s)':<44} {'-':>10} {median('local_tfr'):10.1f}")
print(f"{'  from the remote cache s copies (MB/s)':<44} {'-':>10} {median('cached_tfr'):10.1f} {ratio('cached_tfr', 'local_tfr')}".replace("cache s", "cache's"))
PY
