"""How long replaying one step takes, by step: a shuffled (random_access), augmented random-access
pipeline replays step N directly, which should take as long at N = 10 as at N = 100,000; the
README's pipeline (a shuffle buffer after an interleave) runs its epoch to the step, which grows
with N. Alternated rounds, the median of each reported.

    PYTHONPATH=build/python python3 bench/replay_steps.py [--rounds 5] [--data DIR]

The data (200,100 tiny JPEG records in 16 TFRecord shards) is made once in DIR (default
/tmp/sluice_replay_bench) by `sluice run` of the sample-data pipeline."""
import argparse
import os
import statistics
import subprocess
import sys
import time

import sluice

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLI = os.path.join(ROOT, "build", "bin", "sluice")
RECORDS, BATCH = 200_100, 2


def make_data(folder):
    done = os.path.join(folder, "complete")
    if os.path.exists(done):
        return
    os.makedirs(folder, exist_ok=True)
    subprocess.run([CLI, "run", "--quiet", os.path.join(ROOT, "resources", "pipelines", "sample_data_tfrecord.txtpb"),
                    "--set", f"images.count={RECORDS}", "--set", "images.height=8", "--set", "images.width=8",
                    "--set", f"shards.prefix={folder}/train", "--set", f"shards.max_records={RECORDS // 16 + 1}"],
                   check=True, stdout=subprocess.DEVNULL)
    open(done, "w").close()


def augmented(folder):
    return (sluice.data.random_access(patterns=f"{folder}/*.tfrecord", seed=3)
            .parse_example(features="image:bytes,label:int64").decode_image()
            .random_resized_crop(height=8, width=8).random_flip().random_brightness(max_delta=0.3)
            .batch(BATCH).options(seed=11)).pipeline()


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", default="/tmp/sluice_replay_bench")
    args = parser.parse_args()
    make_data(args.data)
    pipeline = augmented(args.data)
    steps = [10, 1_000, 100_000]
    direct = {n: [] for n in steps}
    pipeline.replay(0)  # (the indexes read once, as by any first run)
    for _ in range(args.rounds):
        for n in steps:
            direct[n].append(timed(lambda: pipeline.replay(n)))
    print(f"random-access pipeline, {RECORDS:,} records, batches of {BATCH}: replay(step) made directly, median of {args.rounds}")
    for n in steps:
        print(f"  step {n:>7,}: {1000 * statistics.median(direct[n]):7.2f} ms  (min {1000 * min(direct[n]):.2f}, max {1000 * max(direct[n]):.2f})")
    # By running: the same pipeline with a shuffle buffer before its batch cannot start anywhere.
    buffered = (sluice.data.random_access(patterns=f"{args.data}/*.tfrecord", seed=3)
                .parse_example(features="image:bytes,label:int64").decode_image().shuffle(100)
                .batch(BATCH).options(seed=11)).pipeline()
    print("the same with shuffle(100) before the batch: made by running the epoch to the step")
    for n in [10, 1_000, 10_000]:
        seconds = [timed(lambda: buffered.replay(n)) for _ in range(3)]
        print(f"  step {n:>7,}: {1000 * statistics.median(seconds):9.1f} ms", file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
