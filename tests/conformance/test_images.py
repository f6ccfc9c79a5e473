"""Images against tf.io and tf.image: every JPEG of tests/data/real/jpeg decoded by decode_image
as tf.io.decode_jpeg decodes it, and resize against tf.image.resize. Maximum differences per
pixel, in levels of 0..255, are printed (pytest -s) and bounded as stated here."""
import glob
import os

import numpy as np
import pytest

import sluice.data
from peers import SOURCE_DIR, run_oracle

JPEGS = sorted(glob.glob(os.path.join(SOURCE_DIR, "tests", "data", "real", "jpeg", "*", "*.jpg")))
# CMYK and YCCK JPEGs: libjpeg-turbo gives their four channels and the RGB conversion is each
# decoder's own (Sluice's and TensorFlow's differ by at most this many levels).
CMYK_BOUND = 2
RESIZE_SIZES = [(16, 24), (97, 61), (300, 200)]  # the oracle's SIZES (from 149 x 227: down, down, up and down)


def components(path):
    """The number of colour components the JPEG's frame header (SOFn) declares."""
    data = open(path, "rb").read()
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            at += 1
            continue
        marker, length = data[at + 1], int.from_bytes(data[at + 2:at + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            return data[at + 9]
        at += 2 + length
    return 0


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    out = tmp_path_factory.mktemp("images") / "decoded.npz"
    run_oracle("oracle_images.py", "decode", out, *JPEGS)
    with np.load(out) as arrays:
        return {name: arrays[name] for name in arrays.files}


def sluice_decode(path):
    """(image, None) or (None, the refusal)."""
    try:
        (element,) = list(sluice.data.list_files(path, shuffle=False).read_file().decode_image(channels=3, orientation=False))
        return element["image"], None
    except sluice.PipelineError as e:
        return None, str(e)


def test_every_jpeg_decodes_as_tensorflow_decodes_it(decoded):
    assert len(JPEGS) > 40
    compared, worst_fast = 0, 0
    for n, path in enumerate(JPEGS):
        name = os.path.relpath(path, os.path.dirname(os.path.dirname(path)))
        if f"skipped/{n}" in decoded:
            continue
        image, refusal = sluice_decode(path)
        if f"failed/{n}" in decoded:
            assert image is None, f"{name}: TensorFlow refuses it ({decoded[f'failed/{n}'].item()[-200:]}), Sluice decoded it"
            print(f"{name}: refused by both")
            continue
        assert image is not None, f"{name}: TensorFlow decodes it, Sluice refused it: {refusal}"
        accurate, fast = decoded[f"accurate/{n}"], decoded[f"fast/{n}"]
        assert image.shape == accurate.shape and image.dtype == np.uint8, name
        to_accurate = int(np.abs(accurate.astype(int) - image).max())
        to_fast = int(np.abs(fast.astype(int) - image).max())
        worst_fast = max(worst_fast, to_fast)
        print(f"{name}: {image.shape}, max difference {to_accurate} to dct_method=INTEGER_ACCURATE, {to_fast} to the default")
        # The same IDCT (libjpeg-turbo's accurate integer one): the same bytes.
        assert to_accurate <= (CMYK_BOUND if components(path) == 4 else 0), name
        compared += 1
    print(f"{compared} JPEGs compared; against tf.io.decode_jpeg's default (fast) DCT at most {worst_fast} levels apart")
    assert compared > 40


@pytest.fixture(scope="module")
def resized(decoded, tmp_path_factory):
    folder = tmp_path_factory.mktemp("resize")
    names = {"testorig": "libjpeg-turbo/testorig.jpg", "hopper": "pillow/hopper.jpg", "gray": "jpeg-decoder/tower_grayscale.jpg"}
    sources = {key: decoded[f"accurate/{JPEGS.index(os.path.join(SOURCE_DIR, 'tests', 'data', 'real', 'jpeg', rel))}"]
               for key, rel in names.items()}
    np.savez(folder / "sources.npz", **sources)
    run_oracle("oracle_images.py", "resize", folder / "sources.npz", folder / "resized.npz")
    with np.load(folder / "resized.npz") as arrays:
        return sources, {name: arrays[name] for name in arrays.files}


def sluice_resize(image, height, width, interpolation):
    (element,) = list(sluice.data.from_tensor_slices({"image": image[np.newaxis]}).resize(height=height, width=width,
                                                                                          interpolation=interpolation))
    return element["image"].astype(np.float64)


@pytest.mark.parametrize("size", RESIZE_SIZES)
def test_resize_against_tf_image_resize(resized, size):
    sources, tf_resized = resized
    height, width = size
    for key, image in sources.items():
        linear, area = sluice_resize(image, height, width, "linear"), sluice_resize(image, height, width, "area")
        differences = {
            "linear / bilinear": np.abs(tf_resized[f"bilinear/0/{height}/{width}/{key}"] - linear).max(),
            "linear / bilinear antialiased": np.abs(tf_resized[f"bilinear/1/{height}/{width}/{key}"] - linear).max(),
            "area / bilinear antialiased": np.abs(tf_resized[f"bilinear/1/{height}/{width}/{key}"] - area).max(),
            "area / area": np.abs(tf_resized[f"area/0/{height}/{width}/{key}"] - area).max(),
        }
        print(f"{key} {image.shape[:2]} -> {size}: " + ", ".join(f"{k} {v:.2f}" for k, v in differences.items()))
        # Bilinear without antialias is the same sampling: what is left is Sluice's rounding to
        # uint8 (tf.image gives floats) and OpenCV's fixed-point weights.
        assert differences["linear / bilinear"] <= 1.0
        # Area when shrinking both ways is the same average, rounded (and tf.image's float32 sums
        # a little off: 0.503 seen); when one side grows and the other shrinks, OpenCV's area
        # interpolates where tf.image's repeats (the README's difference table: 8.3 seen).
        shrinks = height <= image.shape[0] and width <= image.shape[1]
        grows = height >= image.shape[0] and width >= image.shape[1]
        assert differences["area / area"] <= (0.51 if shrinks else 1.0 if grows else 9.0)
        # tf.image's antialias has no Sluice counterpart (the table): measured above, not bounded.
