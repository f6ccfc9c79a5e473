"""The oracle of test_images.py, with TensorFlow (in the peers environment).

  oracle_images.py decode OUT.npz JPEG...   each JPEG as tf.io.decode_jpeg decodes it to RGB, with
      its default DCT and with dct_method="INTEGER_ACCURATE" (arrays "fast/N" and "accurate/N";
      "failed/N" holds TensorFlow's refusal when it has one, "skipped/N" why it was left out).
  oracle_images.py resize IN.npz OUT.npz     every image of IN.npz through tf.image.resize to each
      size of SIZES, bilinear and area, with and without antialias ("METHOD/ANTIALIAS/H/W/N").
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZES = [(16, 24), (97, 61), (300, 200)]  # down in both, down and up, up in both (from 227 x 149)


def decode(out, paths):
    arrays = {}
    for n, path in enumerate(paths):
        data = tf.io.read_file(path)
        try:
            height, width = tf.image.extract_jpeg_shape(data).numpy()[:2]
            if height * width > 4_000_000:  # (6000 x 6000 black: 216 MB of arrays for nothing)
                arrays[f"skipped/{n}"] = np.array(b"over 4 million pixels")
                continue
            arrays[f"fast/{n}"] = tf.io.decode_jpeg(data, channels=3).numpy()
            arrays[f"accurate/{n}"] = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        except tf.errors.OpError as e:
            arrays[f"failed/{n}"] = np.array(e.message.encode())
    np.savez(out, **arrays)


def resize(source, out):
    arrays = {}
    with np.load(source) as images:
        for name in images.files:
            image = images[name]
            for height, width in SIZES:
                for method in ("bilinear", "area"):
                    for antialias in (False, True):
                        resized = tf.image.resize(image, (height, width), method=method, antialias=antialias).numpy()
                        arrays[f"{method}/{int(antialias)}/{height}/{width}/{name}"] = resized
    np.savez(out, **arrays)


if __name__ == "__main__":
    if sys.argv[1] == "decode":
        decode(sys.argv[2], sys.argv[3:])
    else:
        resize(sys.argv[2], sys.argv[3])
