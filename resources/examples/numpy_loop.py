#!/usr/bin/python3
"""A training loop with NumPy only: logistic regression (softmax) on the sample data's images,
shrunk to 16x16 by the pipeline, with hand-written gradients. Shows what a loop gets from Sluice
without any framework: dicts of numpy.ndarray views over each batch's memory.

    bash scripts/demo.sh
    PYTHONPATH=build/python python3 resources/examples/numpy_loop.py --epochs 3
"""
import argparse
import os

import numpy as np

import sluice

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data", default=os.path.join(ROOT, "build", "sample_data", "tfrecord", "*.tfrecord"))
    args = parser.parse_args()

    # The same stages as the main job's file, built the tf.data way.
    ds = (sluice.data.list_files(patterns=args.data, shuffle=True)
          .tfrecord_reader(parallelism=2, interleave=dict(cycle_length=4))
          .parse_example(features="image:bytes, label:int64")
          .decode_image(parallelism=2).resize(height=16, width=16, mode="crop", parallelism=2)
          .normalize(parallelism=2).shuffle(buffer_size=256).batch(batch_size=64, drop_remainder=True)
          .options(seed=42))
    classes, features = 10, 16 * 16 * 3
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.01, size=(features, classes)).astype(np.float32)
    bias = np.zeros(classes, dtype=np.float32)
    for epoch in range(args.epochs):
        losses, correct, seen = [], 0, 0
        for batch in ds:
            x = batch["image"].reshape(len(batch["label"]), -1)
            y = batch["label"].ravel()
            logits = x @ weights + bias
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            losses.append(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
            correct += int((p.argmax(1) == y).sum())
            seen += len(y)
            p[np.arange(len(y)), y] -= 1  # d loss / d logits
            weights -= 0.01 * (x.T @ p) / len(y)
            bias -= 0.01 * p.mean(axis=0)
        print(f"epoch {epoch + 1}: loss {np.mean(losses):.3f}, accuracy {correct / seen:.1%} over {seen} images")


if __name__ == "__main__":
    main()
