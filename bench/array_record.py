"""ArrayRecord against its baselines, measured in one run, cases alternated over ROUNDS rounds
(best of each printed, with the range):

  sequential  the same N tf.Examples (an int64 each, about 20 bytes) read in order into a null sink
              (`sluice bench`): TFRecord shards (the baseline), ArrayRecord as the package writes by
              default (group_size:1, zstd:3) and in chunks of 65,536 (uncompressed and zstd).
  random      one shuffled epoch over ArrayRecord files of group_size:1, every record handed to a
              Python loop: Grain's MapDataset.source(ArrayRecordDataSource(files)).shuffle() (the
              baseline, in the peers environment), and sluice.data.random_access over the same files.
  source      the same epoch read through the data source itself, as a Grain user's sampler reads
              it: source[k] for each key of one permutation, and source.__getitems__(keys) 64 keys
              at a time (batched); Grain's ArrayRecordDataSource (the baseline) against
              sluice.data.ArrayRecordDataSource.

Usage (after the build; the peers environment in BUILD_DIR/peers):
  PYTHONPATH=build/python python3 bench/array_record.py [N] [ROUNDS]
"""
import os
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("BUILD_DIR", "build")
SLUICE = os.path.join(BUILD, "bin", "sluice")
PEERS_PYTHON = os.path.join(BUILD, "peers", "bin", "python")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SHARDS = 8


def run_pipeline(text, path):
    with open(path, "w") as f:
        f.write(text)
    subprocess.run([SLUICE, "run", path, "--quiet"], check=True, stdout=subprocess.DEVNULL)


def write_data(work):
    """N Examples as TFRecord shards and as ArrayRecord shards of each layout."""
    source = f'stage {{ id: "n" op: "range" params {{ key: "count" value: "{N}" }} }}\n'
    per_shard = (N + SHARDS - 1) // SHARDS
    run_pipeline(source + f'stage {{ id: "w" op: "tfrecord_writer" input: "n" params {{ key: "prefix" value: "{work}/tfrecord/t" }} '
                 f'params {{ key: "max_records" value: "{per_shard}" }} }}\n', f"{work}/w.txtpb")
    layouts = {"default": "", "chunks65536": "uncompressed,group_size:65536", "chunks65536_zstd": "zstd,group_size:65536"}
    for name, options in layouts.items():
        run_pipeline(source + f'stage {{ id: "w" op: "array_record_writer" input: "n" params {{ key: "prefix" value: "{work}/{name}/a" }} '
                     f'params {{ key: "field" value: "" }} params {{ key: "options" value: "{options}" }} '
                     f'params {{ key: "max_records" value: "{per_shard}" }} }}\n', f"{work}/w.txtpb")
    return ["default"] + [n for n in layouts if n != "default"]


def sequential_rate(work, form):
    reader = "tfrecord_reader" if form == "tfrecord" else "array_record_reader"
    text = (f'stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{work}/{form}/*" }} params {{ key: "shuffle" value: "false" }} }}\n'
            f'stage {{ id: "read" op: "{reader}" input: "files" }}\n'
            'stage { id: "out" op: "null_sink" input: "read" }\n')
    path = f"{work}/{form}.txtpb"
    with open(path, "w") as f:
        f.write(text)
    done = subprocess.run([SLUICE, "bench", path, "--warmup", "0.5", "--seconds", "20"], capture_output=True, text=True, check=True)
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("Pipeline: "):
            return float(line.split()[1])
    raise RuntimeError(f"no rate from {form}: {done.stdout}{done.stderr}")


GRAIN = """
import sys, time, glob
import grain
from array_record.python.array_record_data_source import ArrayRecordDataSource
files = sorted(glob.glob(sys.argv[1] + "/*"))
dataset = grain.MapDataset.source(ArrayRecordDataSource(files)).shuffle(seed=1)
start = time.perf_counter()
count = sum(1 for _ in dataset)
print(count, time.perf_counter() - start)
"""


SOURCE = """
import sys, time, glob
import numpy
files = sorted(glob.glob(sys.argv[1] + "/*"))
if sys.argv[2] == "grain":
    from array_record.python.array_record_data_source import ArrayRecordDataSource
else:
    from sluice.data import ArrayRecordDataSource
source = ArrayRecordDataSource(files)
keys = numpy.random.default_rng(1).permutation(len(source)).tolist()
start = time.perf_counter()
if sys.argv[3] == "batched":
    count = sum(len(source.__getitems__(keys[i:i + 64])) for i in range(0, len(keys), 64))
else:
    count = sum(1 for k in keys if source[k] is not None)
print(count, time.perf_counter() - start)
"""


def source_rate(work, form, batched):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if form == "grain":
        env.pop("PYTHONPATH", None)
    python = PEERS_PYTHON if form == "grain" else sys.executable
    done = subprocess.run([python, "-c", SOURCE, f"{work}/default", form, "batched" if batched else "single"], capture_output=True, text=True,
                          check=True, env=env)
    count, seconds = done.stdout.split()
    assert int(count) == N, done.stdout
    return N / float(seconds)


def grain_rate(work):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([PEERS_PYTHON, "-c", GRAIN, f"{work}/default"], capture_output=True, text=True, check=True, env=env)
    count, seconds = done.stdout.split()
    assert int(count) == N, done.stdout
    return N / float(seconds)


def sluice_random_rate(work):
    import sluice.data
    dataset = sluice.data.random_access(patterns=[f"{work}/default/*"], seed=1).map(lambda e: e["record"])
    start = time.perf_counter()
    count = sum(1 for _ in dataset)
    seconds = time.perf_counter() - start
    assert count == N, count
    return N / seconds


def main():
    work = tempfile.mkdtemp(prefix="sluice-array-record-bench-")
    try:
        layouts = write_data(work)
        rates = {}
        cases = ([("sequential", f) for f in ["tfrecord"] + layouts] + [("random", "grain"), ("random", "sluice")] +
                 [(kind, form) for kind in ("source", "batched") for form in ("grain", "sluice")])
        for _ in range(ROUNDS):
            for kind, form in cases:
                if kind in ("source", "batched"):
                    rate = source_rate(work, form, kind == "batched")
                else:
                    rate = (sequential_rate(work, form) if kind == "sequential" else grain_rate(work) if form == "grain" else sluice_random_rate(work))
                rates.setdefault((kind, form), []).append(rate)
        print(f"{N:,} records, {ROUNDS} rounds alternated; best (range) records/s")
        for kind, baseline in (("sequential", "tfrecord"), ("random", "grain"), ("source", "grain"), ("batched", "grain")):
            base = max(rates[(kind, baseline)])
            for (k, form), values in rates.items():
                if k == kind:
                    print(f"{kind:10} {form:18} {max(values):>12,.0f} ({min(values):,.0f}-{max(values):,.0f})  {max(values) / base:.2f}x {baseline}")
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
