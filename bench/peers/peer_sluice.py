"""The workloads written with sluice.data as a tf.data user writes them (the same operators,
AUTOTUNE where tf.data's guide puts it). Debian's Python, PYTHONPATH=BUILD/python.
Usage: peer_sluice.py WORKLOAD DATA EPOCHS [--interleave]"""
import glob
import os
import pickle
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

import sluice  # noqa: E402

AUTOTUNE = sluice.AUTOTUNE
# About 4,096 tokens a batch in every bucket.
BUCKET_BOUNDARIES = [16, 32, 64, 128, 256]
BUCKET_BATCH_SIZES = [256, 128, 64, 32, 16, 8]


def decoded(records):
    return (records.parse_example(features="image:bytes, label:int64")
            .decode_image(parallelism=AUTOTUNE)
            .resize(height=224, width=224, mode="crop", parallelism=AUTOTUNE))


def decoded_images(files):
    return decoded(files.tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=AUTOTUNE))


def image(data, epochs):
    files = sluice.data.list_files(f"{data}/../sample_data/tfrecord/*.tfrecord", shuffle=False).repeat(epochs)
    ds = decoded_images(files).normalize(parallelism=AUTOTUNE).batch(64, drop_remainder=True).prefetch(AUTOTUNE)
    return ds, lambda batch: int(batch["image"].shape[0])


def checkpoint(data, map_after_shuffle=False, global_shuffle=False, records_shuffle=False):
    # The image pipeline with a shuffle buffer of 1,000 prepared images before the batch (as
    # peer_tfdata.py); state_dict() every 10 steps, as a training loop that checkpoints does (a
    # state is taken from the engine's latest cut behind the loop), the one after step 40
    # measured. `--map-after-shuffle` normalizes after the shuffle instead; `--global-shuffle`
    # shuffles through random access instead of a buffer; `--records-shuffle` shuffles the records
    # before parsing and decoding them, as tf.data's guide orders it and as DALI's reader buffers.
    files = sluice.data.list_files(f"{data}/../sample_data/tfrecord/*.tfrecord", shuffle=False).repeat()
    if global_shuffle:
        # As Grain shuffles: a permutation of all records through the files' indexes, no buffer.
        ds = decoded(sluice.data.random_access(patterns=f"{data}/image_tfr/*.tfrecord", shuffle=True).repeat()).normalize(parallelism=AUTOTUNE)
    elif records_shuffle:
        ds = decoded(files.tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=AUTOTUNE).shuffle(1000)).normalize(parallelism=AUTOTUNE)
    elif map_after_shuffle:
        ds = decoded_images(files).shuffle(1000).normalize(parallelism=AUTOTUNE)
    else:
        ds = decoded_images(files).normalize(parallelism=AUTOTUNE).shuffle(1000)
    ds = ds.batch(64, drop_remainder=True).prefetch(AUTOTUNE).options(seed=7)
    pipeline = ds.pipeline()
    iterator = iter(pipeline)

    def take(step):
        next(iterator)
        if step % 10 == 0:
            pipeline.state_dict()

    def save():
        with open(path, "wb") as f:
            pickle.dump(pipeline.state_dict(), f)
        return os.path.getsize(path)

    def resumed():
        again = ds.pipeline()
        with open(path, "rb") as f:
            again.load_state_dict(pickle.load(f))
        return iter(again)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "state.pickle")
        return measure.checkpoint_figures(take, save, pipeline.close, resumed)


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


def text(data, epochs):
    # Lines of token ids -> int64 tokens -> batches of similar lengths, padded to each batch's
    # longest (tf.data's bucket_by_sequence_length, its length function naming the field).
    ds = (sluice.data.TextLineDataset(sorted(glob.glob(f"{data}/text/*.txt"))).repeat(epochs)
          .split_text(to="int64", parallelism=AUTOTUNE)
          .bucket_by_sequence_length("line", BUCKET_BOUNDARIES, BUCKET_BATCH_SIZES)
          .prefetch(AUTOTUNE))
    return ds, lambda batch: int(batch["line"].shape[0])


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    interleaved = "--interleave" in sys.argv[4:]
    if workload == "service":
        import peer_service
        measure.report("Sluice (Python)", workload, peer_service.run("sluice", data))
        os._exit(0)  # (a trainer thread stalled on a lost worker would hold the interpreter's exit)
    if workload == "checkpoint":
        global_shuffle, records_shuffle = "--global-shuffle" in sys.argv[4:], "--records-shuffle" in sys.argv[4:]
        name = "Sluice (Python, random_access)" if global_shuffle else "Sluice (Python, records shuffled)" if records_shuffle else "Sluice (Python)"
        measure.report(name, workload, checkpoint(data, "--map-after-shuffle" in sys.argv[4:], global_shuffle, records_shuffle))
        return
    ds, count = {"image": lambda: image(data, epochs), "tiny": lambda: tiny(data, epochs, interleaved),
                 "shuffle": lambda: shuffle(data, epochs), "text": lambda: text(data, epochs)}[workload]()
    name = "Sluice (Python, interleaved)" if interleaved else "Sluice (Python)"
    measure.report(name, workload, measure.consume(lambda: iter(ds), count))


if __name__ == "__main__":
    main()
