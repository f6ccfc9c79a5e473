"""The workloads as the tf.data performance guide writes them (interleave and map with
num_parallel_calls=AUTOTUNE, batch, prefetch(AUTOTUNE)). Peers environment.
Usage: peer_tfdata.py WORKLOAD DATA EPOCHS"""
import glob
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

import tensorflow as tf  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
MEAN = tf.constant([0.485, 0.456, 0.406])
STD = tf.constant([0.229, 0.224, 0.225])


def files(pattern):
    return tf.data.Dataset.from_tensor_slices(sorted(glob.glob(pattern)))


def image(data, epochs):
    def prepare(record):
        f = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string),
                                                "label": tf.io.FixedLenFeature([], tf.int64)})
        img = tf.io.decode_jpeg(f["image"], channels=3)
        # The shorter side to 224, then the center 224x224 (Sluice's resize mode: crop).
        size = tf.cast(tf.shape(img)[:2], tf.float32)
        scaled = tf.cast(tf.math.round(size * 224.0 / tf.reduce_min(size)), tf.int32)
        img = tf.image.resize_with_crop_or_pad(tf.image.resize(img, scaled), 224, 224)
        return (img / 255.0 - MEAN) / STD, f["label"]
    ds = files(f"{data}/../sample_data/tfrecord/*.tfrecord").repeat(epochs)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    ds = ds.map(prepare, num_parallel_calls=AUTOTUNE).batch(64, drop_remainder=True).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch[0].shape[0])


def tiny(data, epochs):
    # Batched before parsing: the guide's vectorized map.
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = files(f"{data}/tiny/*.tfrecord").repeat(epochs)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(1024).map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch["id"].shape[0])


def shuffle(data, epochs):
    # TFRecord files have no random access in tf.data: its way to every record in a permutation of
    # all is a shuffle buffer as large as the dataset (the guide: buffer_size >= the dataset's size).
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    ds = files(f"{data}/tiny/*.tfrecord").interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    ds = ds.shuffle(1_000_000, seed=7).repeat(epochs)
    ds = ds.batch(1024).map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch["id"].shape[0])


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ds, count = {"image": image, "tiny": tiny, "shuffle": shuffle}[workload](data, epochs)
    measure.report("tf.data", workload, measure.consume(lambda: iter(ds), count), version=tf.__version__)


if __name__ == "__main__":
    main()
