"""The oracle of test_random.py: what tf.data's random transformations give, with TensorFlow (in
the peers environment). Usage: oracle_random.py OUT.json"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from random_cases import CASES, FRESH_CASES  # noqa: E402

results = {}
for name, build in CASES.items():
    ds = build(tf.data)
    # Three iterations of one dataset object: tf.data's epochs.
    results[name] = [[int(v) for v in ds.as_numpy_iterator()] for _ in range(3)]
for name, build in FRESH_CASES.items():
    results[name] = [[int(v) for v in build(tf.data).as_numpy_iterator()] for _ in range(2)]
out = sys.argv[1]
with open(out + ".partial", "w") as f:
    json.dump(results, f)
os.replace(out + ".partial", out)
