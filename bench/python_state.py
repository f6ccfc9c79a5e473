"""state_dict() bytes and milliseconds on the README's main pipeline (train_tfrecord.txtpb, 224 px,
batches of 64 images as float32) over the built-in sample data: one call after each of the first
12 batches, as a training loop saving its state every step would make them.

    bash scripts/demo.sh    # builds and makes build/sample_data once
    PYTHONPATH=build/python python3 bench/python_state.py

PYTHONPATH may name another build's python folder (an older commit's) to compare in one session.
"""
import os
import pickle
import sys
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
sys.exit(0)
