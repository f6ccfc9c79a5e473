"""Rows of Parquet files read at random by their place, as a PyTorch or Grain sampler reads a
map-style dataset: Hugging Face's load_dataset("parquet", split="train") (the baseline, in the
peers environment) against sluice.data.load_dataset, on the same files, cases alternated over
ROUNDS rounds (best of each printed, with the range), each in a fresh interpreter.

The data: N rows in 4 files written by pyarrow (snappy, row groups of 131,072 rows): an int64 id,
a float32 score, a text of 10 to 60 characters and 0 to 20 int32 tokens. Each case opens the
dataset, then reads K keys of one permutation of all rows:

  single    ds[k] for each key (a dict of Python values)
  batched   ds.__getitems__(keys) 64 keys at a time (what a DataLoader asks of a dataset that has it)

`open` is the time load_dataset takes first: Hugging Face converts the files into its Arrow
cache the first time (timed in a first, cold call, in a cache folder of its own) and memory-maps
it after; Sluice converts nothing (rows are decoded from the files' row groups when read, and the
groups read are kept, up to cache_bytes).

Usage (after the build; the peers environment in BUILD_DIR/peers):
  PYTHONPATH=build/python python3 bench/parquet_source.py [N] [K] [ROUNDS]
"""
import os
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD_DIR", "build")
PEERS_PYTHON = os.path.join(BUILD, "peers", "bin", "python")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
K = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2

WRITE = """
import sys, random
import pyarrow as pa, pyarrow.parquet as pq
n, folder = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
per = n // 4
for f in range(4):
    ids = range(f * per, (f + 1) * per)
    table = pa.table({"id": pa.array(ids, pa.int64()),
                      "score": pa.array([rng.random() for _ in ids], pa.float32()),
                      "text": pa.array(["w" * rng.randint(10, 60) for _ in ids], pa.string()),
                      "tokens": pa.array([[rng.randrange(30000) for _ in range(rng.randint(0, 20))] for _ in ids], pa.list_(pa.int32()))})
    pq.write_table(table, f"{folder}/part-{f}.parquet", row_group_size=131072)
"""

READ = """
import sys, time, glob, os
import numpy
folder, form, mode, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
files = sorted(glob.glob(folder + "/*.parquet"))
start = time.perf_counter()
if form == "hf":
    import datasets
    datasets.disable_progress_bars()
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=os.environ["HF_CACHE"])
else:
    import sluice.data
    ds = sluice.data.load_dataset("parquet", data_files=files, split="train")
opened = time.perf_counter() - start
keys = numpy.random.default_rng(1).permutation(len(ds))[:k].tolist()
start = time.perf_counter()
if mode == "batched":
    count = sum(len(ds.__getitems__(keys[i:i + 64])) for i in range(0, len(keys), 64))
else:
    count = sum(1 for key in keys if ds[key]["id"] == key)
print(count, time.perf_counter() - start, opened)
"""


def run(folder, form, mode, cache):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HF_CACHE=cache, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=os.path.join(cache, "home"))
    if form == "hf":
        env.pop("PYTHONPATH", None)
    python = PEERS_PYTHON if form == "hf" else sys.executable
    done = subprocess.run([python, "-c", READ, folder, form, mode, str(K)], capture_output=True, text=True, check=True, env=env)
    count, seconds, opened = done.stdout.split()
    assert int(count) == K, done.stdout + done.stderr
    return K / float(seconds), float(opened)


def main():
    work = tempfile.mkdtemp(prefix="sluice-parquet-source-bench-")
    try:
        subprocess.run([PEERS_PYTHON, "-c", WRITE, str(N), work], check=True)
        cache = os.path.join(work, "hf-cache")
        cold = run(work, "hf", "single", cache)[1]  # (the first load converts the files)
        rates, opens = {}, {}
        for _ in range(ROUNDS):
            for mode in ("single", "batched"):
                for form in ("hf", "sluice"):
                    rate, opened = run(work, form, mode, cache)
                    rates.setdefault((mode, form), []).append(rate)
                    opens.setdefault(form, []).append(opened)
        print(f"{N:,} rows in 4 files, {K:,} keys of one permutation, {ROUNDS} rounds alternated; best (range) rows/s")
        print(f"open     hf       first load (conversion into its cache) {cold:.1f} s, then {min(opens['hf']):.2f} s; "
              f"sluice {min(opens['sluice']):.2f} s")
        for mode in ("single", "batched"):
            base = max(rates[(mode, "hf")])
            for form in ("hf", "sluice"):
                values = rates[(mode, form)]
                print(f"{mode:8} {form:8} {max(values):>12,.0f} ({min(values):,.0f}-{max(values):,.0f})  {max(values) / base:.2f}x hf")
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
