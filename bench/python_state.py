"""state_dict() bytes and milliseconds on the README's main pipeline (train_tfrecord.txtpb, 224 px,
batches of 64 images as float32) over the built-in sample data: one call after each of the first
12 batches, as a training loop saving its state every step would make them; then the size of the
state over a long run, at steps 100, 1,000 and 10,000; and of the README's pipeline repeated, at steps
100 and 1,000; then the images/s of the README's pipeline with no state, a state every 10 steps and
every step.

    bash scripts/demo.sh    # builds and makes build/sample_data once
    PYTHONPATH=build/python python3 bench/python_state.py

PYTHONPATH may name another build's python folder (an older commit's) to compare in one session;
`--costs` measures only the last part (what taking states costs the loop).
"""
import os
import pickle
import subprocess
import sys
import tempfile
import time

import sluice

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
costs_only = sys.argv[1:] == ["--costs"]


def first_states():
    """state_dict() after each of the README pipeline's first 12 batches."""
    pipeline = sluice.Pipeline(os.path.join(ROOT, "resources", "pipelines", "train_tfrecord.txtpb"),
                               set={"files.patterns": os.path.join(ROOT, "build", "sample_data", "tfrecord", "*.tfrecord")})
    batches = iter(pipeline)
    sizes, milliseconds = [], []
    for _ in range(12):
        next(batches)
        start = time.perf_counter()
        state = pipeline.state_dict()
        milliseconds.append(1000 * (time.perf_counter() - start))
        sizes.append(len(pickle.dumps(state)))
    pipeline.close()
    print(f"{os.path.dirname(sluice.__file__)}")
    print(f"state_dict(): {min(sizes)} to {max(sizes)} bytes, {min(milliseconds):.1f} to {max(milliseconds):.1f} ms")
    print("per call: " + " ".join(f"{b // 1024}K/{m:.0f}ms" for b, m in zip(sizes, milliseconds)))


def long_run():
    # A long run: state_dict() after every step of tf.data-style code (files interleaved, epochs
    # repeated after the batches) over 8 small shards of 32 tiny images, at steps 100, 1,000 and 10,000.
    with tempfile.TemporaryDirectory() as shards:
        subprocess.run([os.path.join(ROOT, "build", "bin", "sluice"), "run", "--quiet",
                        os.path.join(ROOT, "resources", "pipelines", "sample_data_tfrecord.txtpb"), "--set", "images.count=256",
                        "--set", "images.height=24", "--set", "images.width=32", "--set", f"shards.prefix={shards}/train",
                        "--set", "shards.max_records=32"], check=True, stdout=subprocess.DEVNULL)
        ds = (sluice.data.list_files(f"{shards}/*.tfrecord")
              .tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=2)
              .parse_example(features="image:bytes, label:int64")
              .batch(8, drop_remainder=True).repeat().prefetch(sluice.AUTOTUNE).options(seed=5))
        long_run = ds.pipeline()
        steps = iter(long_run)
        at = {}
        for step in range(1, 10001):
            next(steps)
            state = long_run.state_dict()
            if step in (100, 1000, 10000):
                at[step] = len(pickle.dumps(state))
        long_run.close()
    print("state_dict() every step: " + ", ".join(f"{size // 1024} KB at step {step:,}" for step, size in at.items()))


def readme_pipeline_repeated():
    """The README's pipeline with its epochs repeated after the batches, as text."""
    text = open(os.path.join(ROOT, "resources", "pipelines", "train_tfrecord.txtpb")).read()
    text = text.replace("../../build/sample_data", os.path.join(ROOT, "build", "sample_data"))
    text = text.replace('input: "batch"   params { key: "buffer_size"', 'input: "epochs"  params { key: "buffer_size"')
    if 'input: "epochs"' not in text:
        sys.exit("bench/python_state.py: train_tfrecord.txtpb's prefetch stage changed: put the repeat before it again")
    text += 'stage { id: "epochs" op: "repeat" input: "batch" }\n'
    return text


def readme_repeated_states():
    # The README's pipeline (files listed, sharded and read interleaved, images shuffled and batched)
    # with its epochs repeated after the batches: a state every step, at steps 100 and 1,000.
    text = readme_pipeline_repeated()
    repeated = sluice.Pipeline.from_spec(text)
    steps = iter(repeated)
    at = {}
    for step in range(1, 1001):
        next(steps)
        state = repeated.state_dict()
        if step in (100, 1000):
            at[step] = len(pickle.dumps(state))
    repeated.close()
    print("the README's pipeline repeated, state_dict() every step: " + ", ".join(f"{size // 1024} KB at step {step:,}" for step, size in at.items()))


# What taking states costs the loop: images/s over 120 batches (after 20 that fill the buffers)
# with no state, a state every 10 steps and every step, in rounds that alternate the three; of the
# README's pipeline (its epochs repeated) and of bench/peers' checkpoint pipeline (AUTOTUNE
# everywhere and a shuffle of 1,000 prepared images: deeper buffers, longer cuts).
def peers_checkpoint_pipeline():
    files = sluice.data.list_files(os.path.join(ROOT, "build", "sample_data", "tfrecord", "*.tfrecord"), shuffle=False).repeat()
    return (files.tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=sluice.AUTOTUNE)
            .parse_example(features="image:bytes, label:int64").decode_image(parallelism=sluice.AUTOTUNE)
            .resize(height=224, width=224, mode="crop", parallelism=sluice.AUTOTUNE).normalize(parallelism=sluice.AUTOTUNE)
            .shuffle(1000).batch(64, drop_remainder=True).prefetch(sluice.AUTOTUNE).options(seed=7)).pipeline()


def images_per_second(make, every):
    run = make()
    batches = iter(run)
    for _ in range(20):
        next(batches)
    start = time.perf_counter()
    images = 0
    for step in range(1, 121):
        images += len(next(batches)["label"])
        if every and step % every == 0:
            run.state_dict()
    seconds = time.perf_counter() - start
    run.close()
    return images / seconds


def costs():
    names = {0: "no state", 10: "a state every 10 steps", 1: "a state every step"}
    for label, make in (("the README's pipeline", lambda: sluice.Pipeline.from_spec(readme_pipeline_repeated())), ("bench/peers' checkpoint pipeline", peers_checkpoint_pipeline)):
        rates = {0: [], 10: [], 1: []}
        for _ in range(3):
            for every in rates:
                rates[every].append(images_per_second(make, every))
        print(f"{label}, images/s (median and range of 3 alternated rounds): " + "; ".join(
            f"{names[every]} {sorted(r)[1]:,.0f} ({min(r):,.0f}-{max(r):,.0f})" for every, r in rates.items()))


if not costs_only:
    first_states()
    long_run()
    readme_repeated_states()
costs()
sys.exit(0)
