"""parquet_reader against pyarrow's ParquetFile.iter_batches, measured in one run, cases alternated
over ROUNDS rounds (best of each printed, with the range, and the median of each round's ratio:
on a machine whose rates move by a third between runs, the pairs measured side by side).

The data: N rows in 4 files written by pyarrow (snappy, its defaults, row groups of 131,072 rows):
an int64 id, a float32 score, a text of 10 to 60 characters, a 16-float embedding (a list of fixed
size) and 0 to 20 int32 tokens (a list of varying length). Each case reads the same columns of the
same files in order:

  pyarrow     for batch in ParquetFile(f).iter_batches(batch_size=B, columns=...): rows counted
              (the baseline: Arrow's record batches of B rows, decoded with its threads as
              pyarrow's default use_threads=True has it, nothing made of them)
  sluice      `sluice bench` of list_files -> parquet_reader(columns=...) -> batch(B) -> null_sink:
              the rows handed on as chunks whose columns are Sluice tensors (views of Arrow's
              buffers for numbers, spans for strings), each batch of B rows assembled into one
              tensor per column; the tokens, whose lists differ in length, by ragged_batch (their
              values one after another and each row's length, as Arrow's list array holds them)
              and, in the "padded" cases, by padded_batch (padded to the longest of the batch,
              work pyarrow's loop does not do)

Both read the files REPEATS times over (the files stay in the page cache). B is 1,024, a training
batch; a third argument sets it (65,536 is iter_batches' default; see bench/README.md for both).

Usage (after the build; the peers environment in BUILD_DIR/peers):
  python3 bench/parquet.py [N] [ROUNDS] [B]
"""
import os
import statistics
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD_DIR", "build")
SLUICE = os.path.join(BUILD, "bin", "sluice")
PEERS_PYTHON = os.path.join(BUILD, "peers", "bin", "python")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
FILES = 4
REPEATS = 3
# Column sets, and the batching stage that takes Sluice's rows: the tokens batched ragged (their
# values one after another and each row's length, what an Arrow list array of a record batch
# is), or padded to the longest row of their batch (more than pyarrow's loop makes of them).
ALL = ["id", "score", "text", "embedding", "tokens"]
RAGGED = ("ragged_batch", {"fields": "tokens"})
COLUMN_SETS = {"numbers": (["id", "score"], ("batch", {})), "text": (["text"], ("batch", {})), "embedding": (["embedding"], ("batch", {})),
               "tokens": (["tokens"], RAGGED), "all": (ALL, RAGGED),
               "tokens padded": (["tokens"], ("padded_batch", {})), "all padded": (ALL, ("padded_batch", {}))}

WRITE = """
import sys, random
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
folder, n, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(5)
per = n // files
words = [("word%d " % i) * (1 + i % 6) for i in range(200)]
for k in range(files):
    lengths = rng.integers(0, 21, per)
    table = pa.table({
        "id": pa.array(np.arange(k * per, (k + 1) * per, dtype=np.int64)),
        "score": pa.array(rng.random(per, dtype=np.float32)),
        "text": pa.array([words[i] for i in rng.integers(0, 200, per)]),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(per * 16, dtype=np.float32)), 16),
        "tokens": pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
                                           pa.array(rng.integers(0, 30000, int(lengths.sum()), dtype=np.int32))),
    })
    pq.write_table(table, f"{folder}/part-{k}.parquet", row_group_size=131072)
"""

ITER_BATCHES = """
import sys, time, glob
import pyarrow.parquet as pq
columns = sys.argv[2].split(",")
batch_size, repeats = int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
rows = 0
for _ in range(repeats):
    for path in sorted(glob.glob(sys.argv[1] + "/*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
            rows += batch.num_rows
print(rows, time.perf_counter() - start)
"""


def peers(script, *args):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run([PEERS_PYTHON, "-c", script, *map(str, args)], capture_output=True, text=True, check=True, env=env).stdout


def pyarrow_rate(work, columns):
    rows, seconds = peers(ITER_BATCHES, work, ",".join(columns), BATCH, REPEATS).split()
    assert int(rows) == N // FILES * FILES * REPEATS, rows
    return int(rows) / float(seconds)


def sluice_rate(work, columns, batching):
    op, extra = batching
    listed = f' params {{ key: "columns" value: "{", ".join(columns)}" }}' if columns else ""
    more = "".join(f' params {{ key: "{k}" value: "{v}" }}' for k, v in extra.items())
    text = (f'stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{work}/*.parquet" }} params {{ key: "shuffle" value: "false" }} }}\n'
            f'stage {{ id: "again" op: "repeat" input: "files" params {{ key: "count" value: "{REPEATS}" }} }}\n'
            f'stage {{ id: "read" op: "parquet_reader" input: "again"{listed} }}\n'
            f'stage {{ id: "batch" op: "{op}" input: "read" params {{ key: "batch_size" value: "{BATCH}" }}{more} }}\n'
            'stage { id: "out" op: "null_sink" input: "batch" }\n')
    path = f"{work}/read.txtpb"
    with open(path, "w") as f:
        f.write(text)
    done = subprocess.run([SLUICE, "bench", path, "--warmup", "0.5", "--seconds", "10"], capture_output=True, text=True, check=True)
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("read "):  # rows out of the reader (the pipeline's own rate counts batches)
            return float(line.split()[1])
    raise RuntimeError(f"no rate: {done.stdout}{done.stderr}")


def main():
    work = tempfile.mkdtemp(prefix="sluice-parquet-bench-")
    try:
        peers(WRITE, work, N, FILES)
        rates = {}
        for _ in range(ROUNDS):
            for name, (columns, batching) in COLUMN_SETS.items():
                rates.setdefault((name, "pyarrow"), []).append(pyarrow_rate(work, columns))
                rates.setdefault((name, "sluice"), []).append(sluice_rate(work, columns, batching))
        print(f"{N // FILES * FILES:,} rows in {FILES} files read {REPEATS} times in batches of {BATCH}, {ROUNDS} rounds alternated; "
              "best (range) rows/s; best over best, and the median (range) of each round's Sluice rate over that round's pyarrow rate")
        for name, (columns, _) in COLUMN_SETS.items():
            base = rates[(name, "pyarrow")]
            paired = sorted(s / p for s, p in zip(rates[(name, "sluice")], base))
            for reader in ("pyarrow", "sluice"):
                values = rates[(name, reader)]
                rounds = f"  median {statistics.median(paired):.2f}x ({paired[0]:.2f}-{paired[-1]:.2f})" if reader == "sluice" else ""
                print(f"{name:13} {reader:8} {max(values):>14,.0f} ({min(values):,.0f}-{max(values):,.0f})  {max(values) / max(base):.2f}x pyarrow"
                      f"{rounds} [{', '.join(columns)}]")
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
