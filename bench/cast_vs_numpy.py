"""cast u8 -> f32 with a scale, per 320x240 RGB image, against NumPy's astype(np.float32) * scale on
the same images in the same process, on one core (issue 40: placed where the reference places
tf.image.convert_image_dtype, before the resize, cast was the pipeline's bottleneck).

    PYTHONPATH=build/python taskset -c 0 python3 bench/cast_vs_numpy.py [IMAGES] [ROUNDS]

Sluice's figure is what the cast adds to a pipeline that hands the images to Python: the time per
image of from_tensor_slices -> cast -> the loop, less that of from_tensor_slices -> the loop (both
on the one core taskset gives, so every thread's work counts). NumPy's is its loop's time per
image. Best of ROUNDS each, alternated.
"""
import sys
import time

import numpy as np

import sluice

count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
rng = np.random.default_rng(0)
images = rng.integers(0, 256, size=(count, 240, 320, 3), dtype=np.uint8)
scale = 1.0 / 255



def per_image(dataset):
    start = time.perf_counter()
    for element in dataset:
        pass
    return 1e6 * (time.perf_counter() - start) / count


numpy_us, sluice_us = [], []
for _ in range(rounds):
    start = time.perf_counter()
    for image in images:
        converted = image.astype(np.float32) * scale
    numpy_us.append(1e6 * (time.perf_counter() - start) / count)
    source = sluice.data.from_tensor_slices({"image": images})
    plain = per_image(source)
    cast = per_image(source.cast(field="image", dtype="f32", scale=scale))
    sluice_us.append(cast - plain)
print(f"{count} images of 240x320x3, best of {rounds}: numpy {min(numpy_us):.1f} us per image, "
      f"sluice cast {min(sluice_us):.1f} us per image, ratio {min(sluice_us) / min(numpy_us):.2f}")
