"""state_dict() bytes and milliseconds on the README's main pipeline (train_tfrecord.txtpb, 224 px,
batches of 64 images as float32) over the built-in sample data: one call after each of the first
12 batches, as a training loop saving its state every step would make them; then the size of the
state over a long run, at steps 100, 1,000 and 10,000; and of the README's pipeline repeated, at steps
100 and 1,000.

    bash scripts/demo.sh    # builds and makes build/sample_data once
    PYTHONPATH=build/python python3 bench/python_state.py

PYTHONPATH may name another build's python folder (an older commit's) to compare in one session.
"""
import os
import pickle
import subprocess
import sys
import tempfile
import time

import sluice

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
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

# The README's pipeline (files listed, sharded and read interleaved, images shuffled and batched)
# with its epochs repeated after the batches: a state every step, at steps 100 and 1,000.
text = open(os.path.join(ROOT, "resources", "pipelines", "train_tfrecord.txtpb")).read()
text = text.replace("../../build/sample_data", os.path.join(ROOT, "build", "sample_data"))
text = text.replace('input: "batch"   params { key: "buffer_size"', 'input: "epochs"  params { key: "buffer_size"')
if 'input: "epochs"' not in text:
    sys.exit("bench/python_state.py: train_tfrecord.txtpb's prefetch stage changed: put the repeat before it again")
repeated = sluice.Pipeline.from_spec(text + 'stage { id: "epochs" op: "repeat" input: "batch" }\n')
steps = iter(repeated)
at = {}
for step in range(1, 1001):
    next(steps)
    state = repeated.state_dict()
    if step in (100, 1000):
        at[step] = len(pickle.dumps(state))
repeated.close()
print("the README's pipeline repeated, state_dict() every step: " + ", ".join(f"{size // 1024} KB at step {step:,}" for step, size in at.items()))
sys.exit(0)
