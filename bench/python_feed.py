#!/usr/bin/python3
"""The Python face against its baselines, in one run (best of 3 rounds, the variants alternating
within each round so that a slow spell of a shared machine hits all of them):

1. bench_io's image pipeline (list_files -> read_file -> decode_image -> resize 224 crop ->
   random_flip -> normalize -> batch 64, 2 workers) consumed in C++ (null_sink, Pipeline.run())
   and consumed from Python as torch tensors (Pipeline.torch()); and PyTorch's DataLoader with 2
   workers over the same files (bench/pytorch_loader.py's Dataset).
2. The cost of the Python iteration itself: range -> batch of 1 consumed from Python against the
   same pipeline ending in null_sink, per batch in microseconds.
3. A Python function as a stage: map(fn) with 2 workers against the same fn in a DataLoader's 2
   worker processes, on 64x64x3 images (fn normalises one image with NumPy).

Usage (after scripts/demo.sh has made build/sample_data, and with SLUICE_BENCH_DEPS=1
scripts/install-deps.sh for torchvision and PIL):
    PYTHONPATH=build/python python3 bench/python_feed.py 'build/sample_data/jpeg/*/*.jpg'
"""
import glob
import os
import sys
import time

import numpy as np
import torch

import sluice

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_loader import Files  # noqa: E402  (the DataLoader baseline's Dataset)

ROUNDS = 3


def image_pipeline(pattern, sink=True):
    ds = (sluice.data.list_files(patterns=pattern, name="files")
          .read_file(parallelism=2, name="read").decode_image(parallelism=2, name="decode")
          .resize(height=224, width=224, mode="crop", parallelism=2, name="resize")
          .random_flip(parallelism=2, name="flip").normalize(parallelism=2, name="norm")
          .batch(batch_size=64, name="batch"))
    return ds.null_sink(name="out") if sink else ds


def timed(fn):
    start = time.perf_counter()
    count = fn()
    return count, time.perf_counter() - start


def consume_cpp(pattern, images):
    def run():
        image_pipeline(pattern).pipeline().run()
        return images
    return run


def images_in(batches):
    return sum(batch["image"].shape[0] for batch in batches)


def consume_torch(pattern):
    return lambda: images_in(image_pipeline(pattern, sink=False).torch())


def consume_dataloader(paths):
    def run():
        loader = torch.utils.data.DataLoader(Files(paths), batch_size=64, num_workers=2)
        return sum(batch.shape[0] for batch, _ in loader)
    return run


def tiny_batches(n, from_python):
    ds = sluice.data.range(count=n, name="src").batch(batch_size=1, name="batch")

    def run():
        if from_python:
            count = 0
            for _ in ds:
                count += 1
            return count
        ds.null_sink(name="out").pipeline().run()
        return n
    return run


def normalise(element):
    image = element["image"].astype(np.float32)
    return {"image": (image - 127.5) / 58.0}


class Images(torch.utils.data.Dataset):
    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return normalise({"image": self.images[i]})["image"]


def map_sluice(images):
    return lambda: images_in(sluice.data.from_tensor_slices({"image": images}).map(normalise, parallelism=2).batch(batch_size=64))


def map_dataloader(images):
    def run():
        loader = torch.utils.data.DataLoader(Images(images), batch_size=64, num_workers=2)
        return sum(batch.shape[0] for batch in loader)
    return run


def main():
    pattern = sys.argv[1] if len(sys.argv) > 1 else "build/sample_data/jpeg/*/*.jpg"
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"no files match {pattern}: run scripts/demo.sh first (it makes build/sample_data)")
    torch.set_num_threads(1)
    images = np.random.default_rng(1).integers(0, 255, size=(4096, 64, 64, 3), dtype=np.uint8)
    tiny = 200_000
    variants = {
        "image pipeline, consumed in C++ (null_sink)": consume_cpp(pattern, len(paths)),
        "image pipeline, consumed in Python as torch": consume_torch(pattern),
        "PyTorch DataLoader, 2 workers": consume_dataloader(paths),
        "batches of 1, from Python": tiny_batches(tiny, True),
        "batches of 1, null_sink": tiny_batches(tiny, False),
        "map(fn), 2 workers": map_sluice(images),
        "fn in DataLoader, 2 workers": map_dataloader(images),
    }
    consume_torch(pattern)()  # warm-up: page cache, pools
    best = {}
    for _ in range(ROUNDS):
        for name, run in variants.items():
            count, seconds = timed(run)
            best[name] = max(best.get(name, 0.0), count / seconds)
    cpp, python, loader = (best[k] for k in list(variants)[:3])
    per_batch_us = (1 / best["batches of 1, from Python"] - 1 / best["batches of 1, null_sink"]) * 1e6
    print(f"Image pipeline: {len(paths)} JPEGs, decode -> resize 224 -> flip -> normalize -> batch 64, 2 workers "
          f"(best of {ROUNDS})")
    print(f"  consumed in C++ (null_sink)          {cpp:8.0f} images/s")
    print(f"  consumed in Python as torch tensors  {python:8.0f} images/s  ({100 * python / cpp:.0f}% of C++)")
    print(f"  PyTorch DataLoader, 2 workers        {loader:8.0f} images/s  (Python-fed sluice is {python / loader:.1f}x)")
    print(f"Iteration cost: {tiny} batches of one int64")
    print(f"  from Python                          {best['batches of 1, from Python']:8.0f} batches/s")
    print(f"  null_sink                            {best['batches of 1, null_sink']:8.0f} batches/s")
    print(f"  Python's cost per batch              {per_batch_us:8.1f} us")
    print(f"A Python function as a stage: {len(images)} images 64x64x3, normalised with NumPy, batch 64")
    print(f"  sluice map(fn), 2 workers            {best['map(fn), 2 workers']:8.0f} images/s")
    print(f"  DataLoader, fn in 2 workers          {best['fn in DataLoader, 2 workers']:8.0f} images/s")


if __name__ == "__main__":
    main()
