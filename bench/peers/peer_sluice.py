"""The workloads written with sluice.data as a tf.data user writes them (the same operators,
AUTOTUNE where tf.data's guide puts it). Debian's Python, PYTHONPATH=BUILD/python.
Usage: peer_sluice.py WORKLOAD DATA EPOCHS [--interleave]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

import sluice  # noqa: E402

AUTOTUNE = sluice.AUTOTUNE


def image(data, epochs):
    ds = (sluice.data.list_files(f"{data}/../sample_data/tfrecord/*.tfrecord", shuffle=False).repeat(epochs)
          .tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=AUTOTUNE)
          .parse_example(features="image:bytes, label:int64")
          .decode_image(parallelism=AUTOTUNE)
          .resize(height=224, width=224, mode="crop", parallelism=AUTOTUNE)
          .normalize(parallelism=AUTOTUNE)
          .batch(64, drop_remainder=True).prefetch(AUTOTUNE))
    return ds, lambda batch: int(batch["image"].shape[0])


def tiny(data, epochs, interleave=False):
    # Files one after another (Sluice's way for small records: the reader hands chunks of records
    # on); `interleave` writes tf.data's guide instead, records alternating between 4 files one by
    # one, which Sluice hands on element by element today (the table shows what that costs).
    files = sluice.data.list_files(f"{data}/tiny/*.tfrecord", shuffle=False).repeat(epochs)
    records = files.tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=AUTOTUNE) if interleave else files.tfrecord_reader()
    ds = records.parse_example(features="id:int64, label:int64", parallelism=AUTOTUNE).batch(1024).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch["id"].shape[0])


def shuffle(data, epochs):
    # Every record once an epoch in a permutation of all of them, through the files' indexes.
    ds = (sluice.data.random_access(patterns=f"{data}/tiny/*.tfrecord", shuffle=True).repeat(epochs)
          .parse_example(features="id:int64, label:int64", parallelism=AUTOTUNE)
          .batch(1024).prefetch(AUTOTUNE).options(seed=7))
    return ds, lambda batch: int(batch["id"].shape[0])


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    interleaved = "--interleave" in sys.argv[4:]
    ds, count = {"image": lambda: image(data, epochs), "tiny": lambda: tiny(data, epochs, interleaved),
                 "shuffle": lambda: shuffle(data, epochs)}[workload]()
    name = "Sluice (Python, interleaved)" if interleaved else "Sluice (Python)"
    measure.report(name, workload, measure.consume(lambda: iter(ds), count))


if __name__ == "__main__":
    main()
