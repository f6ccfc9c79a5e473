"""The workloads as the tf.data performance guide writes them (interleave and map with
num_parallel_calls=AUTOTUNE, batch, prefetch(AUTOTUNE)). Peers environment.
Usage: peer_tfdata.py WORKLOAD DATA EPOCHS"""
import glob
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

import tensorflow as tf  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
MEAN = tf.constant([0.485, 0.456, 0.406])
STD = tf.constant([0.229, 0.224, 0.225])
# About 4,096 tokens a batch in every bucket (as peer_sluice.py).
BUCKET_BOUNDARIES = [16, 32, 64, 128, 256]
BUCKET_BATCH_SIZES = [256, 128, 64, 32, 16, 8]


def files(pattern):
    return tf.data.Dataset.from_tensor_slices(sorted(glob.glob(pattern)))


def parse_and_resize(record):
    f = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string),
                                            "label": tf.io.FixedLenFeature([], tf.int64)})
    img = tf.io.decode_jpeg(f["image"], channels=3)
    # The shorter side to 224, then the center 224x224 (Sluice's resize mode: crop).
    size = tf.cast(tf.shape(img)[:2], tf.float32)
    scaled = tf.cast(tf.math.round(size * 224.0 / tf.reduce_min(size)), tf.int32)
    return tf.image.resize_with_crop_or_pad(tf.image.resize(img, scaled), 224, 224), f["label"]


def normalize(img, label):
    return (img / 255.0 - MEAN) / STD, label


def image(data, epochs):
    ds = files(f"{data}/../sample_data/tfrecord/*.tfrecord").repeat(epochs)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    ds = ds.map(lambda r: normalize(*parse_and_resize(r)), num_parallel_calls=AUTOTUNE).batch(64, drop_remainder=True).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch[0].shape[0])


def checkpoint(data):
    # The image pipeline with a shuffle buffer of 1,000 prepared images before the batch (where
    # tf.data's guide puts shuffle), checkpointed as its guide does: tf.train.Checkpoint(iterator=...),
    # which saves the buffered elements.
    ds = files(f"{data}/../sample_data/tfrecord/*.tfrecord").repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE)
    ds = ds.map(lambda r: normalize(*parse_and_resize(r)), num_parallel_calls=AUTOTUNE).shuffle(1000, seed=7)
    ds = ds.batch(64, drop_remainder=True).prefetch(AUTOTUNE)
    first = {"iterator": iter(ds)}
    folder = tempfile.mkdtemp()
    saved = {}

    def save():
        saved["path"] = tf.train.Checkpoint(iterator=first["iterator"]).write(os.path.join(folder, "ck"))
        return measure.folder_bytes(folder)

    def resumed():
        again = iter(ds)
        tf.train.Checkpoint(iterator=again).read(saved["path"]).assert_consumed()
        return again
    try:
        return measure.checkpoint_figures(lambda step: next(first["iterator"]), save, first.clear, resumed)
    finally:
        shutil.rmtree(folder)


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


def text(data, epochs):
    # Lines split and converted a batch at a time (the guide's vectorized map: per line, the
    # same pipeline ran 1.5x longer here), back to single sequences, then
    # bucket_by_sequence_length (batches padded to their longest).
    def tokens(lines):
        return tf.strings.to_number(tf.strings.split(lines), tf.int64)
    ds = tf.data.TextLineDataset(sorted(glob.glob(f"{data}/text/*.txt"))).repeat(epochs)
    # (unbatch gives ragged tensors of ragged rank 0, which the padding refuses: a map makes them plain.)
    ds = ds.batch(1024).map(tokens, num_parallel_calls=AUTOTUNE).unbatch().map(tf.identity)
    ds = ds.bucket_by_sequence_length(lambda t: tf.shape(t)[0], BUCKET_BOUNDARIES, BUCKET_BATCH_SIZES).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch.shape[0])


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if workload == "service":
        import peer_service
        measure.report("tf.data", workload, peer_service.run("tf.data", data))
        os._exit(0)  # (a trainer thread stalled on a lost worker would hold the interpreter's exit)
    if workload == "checkpoint":
        measure.report("tf.data", workload, checkpoint(data), version=tf.__version__)
        return
    ds, count = {"image": image, "tiny": tiny, "shuffle": shuffle, "text": text}[workload](data, epochs)
    measure.report("tf.data", workload, measure.consume(lambda: iter(ds), count), version=tf.__version__)


if __name__ == "__main__":
    main()
