"""The image and tiny workloads as NVIDIA DALI's documentation writes a CPU pipeline: its TFRecord
reader (over index files made by DALI's own tfrecord2idx, which prepare.py runs) parsing the
features, its image decoder, resize of the shorter side and crop_mirror_normalize, batches, one
thread per core; `device_id=None`, DALI's mode without a GPU or the CUDA runtime. Peers
environment, with bench/peers/requirements.txt.
Checkpoints with DALI's own (enable_checkpointing, Pipeline.checkpoint()).
Usage: peer_dali.py image|tiny|checkpoint DATA EPOCHS"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

try:
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001
    measure.fail("DALI", sys.argv[1], f"{type(e).__name__}: {e}")

BATCH = 64


def index_files(shards, folder):
    """DALI's TFRecord reader reads through an index per file (record offsets and sizes), which
    prepare.py makes with the tfrecord2idx script DALI's wheel installs."""
    indexes = [os.path.join(folder, os.path.basename(shard) + ".idx") for shard in shards]
    missing = [i for i in indexes if not os.path.exists(i)]
    if missing:
        measure.fail("DALI", sys.argv[1], f"no index file {missing[0]}: run bench/peers/prepare.py again with DALI installed "
                                      "(SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh)")
    return indexes


@pipeline_def
def images(shards, indexes, shuffle_buffer=0):
    # shuffle_buffer: DALI's way to shuffle, its reader's buffer of records (initial_fill), drawn from.
    shuffled = {"random_shuffle": True, "initial_fill": shuffle_buffer, "seed": 7} if shuffle_buffer else {}
    record = fn.readers.tfrecord(path=shards, index_path=indexes, name="reader", **shuffled,
                                 features={"image": tfrec.FixedLenFeature((), tfrec.string, ""),
                                           "label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
    image = fn.decoders.image(record["image"], device="cpu", output_type=types.RGB)
    # The shorter side to 224, then the center 224x224 (Sluice's resize mode: crop), normalized.
    image = fn.resize(image, resize_shorter=224, interp_type=types.INTERP_LINEAR)
    image = fn.crop_mirror_normalize(image, crop=(224, 224), dtype=types.FLOAT, output_layout="HWC",
                                     mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
    return image, record["label"]


def image(data, epochs):
    shards = sorted(glob.glob(f"{data}/../sample_data/tfrecord/*.tfrecord"))
    return epochs_of(images(shards, index_files(shards, f"{data}/dali_index/image"), batch_size=BATCH,
                            num_threads=os.cpu_count(), device_id=None), epochs, BATCH)


def checkpoint(data):
    """The image pipeline shuffled through a buffer of 1,000 (of records: DALI shuffles in its
    readers, before decoding), its state taken with DALI's own checkpointing (enable_checkpointing,
    Pipeline.checkpoint()) after step 40 and given to a new pipeline."""
    shards = sorted(glob.glob(f"{data}/../sample_data/tfrecord/*.tfrecord"))
    indexes = index_files(shards, f"{data}/dali_index/image")

    def make(state=None):
        pipe = images(shards, indexes, 1000, batch_size=BATCH, num_threads=os.cpu_count(), device_id=None,
                      enable_checkpointing=True, checkpoint=state)
        pipe.build()
        return pipe
    first = {"pipe": make()}
    saved = {}

    def save():
        saved["state"] = first["pipe"].checkpoint()
        return len(saved["state"])  # (bytes)

    def resumed():
        pipe = make(saved["state"])
        while True:
            yield pipe.run()
    return measure.checkpoint_figures(lambda step: first["pipe"].run(), save, first.clear, resumed)


@pipeline_def
def tiny_records(shards, indexes):
    # The reader parses the tf.Examples' features itself, and hands on batches of them.
    record = fn.readers.tfrecord(path=shards, index_path=indexes, name="reader",
                                 features={"id": tfrec.FixedLenFeature([1], tfrec.int64, -1),
                                           "label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
    return record["id"], record["label"]


def tiny(data, epochs):
    shards = sorted(glob.glob(f"{data}/tiny/*.tfrecord"))
    return epochs_of(tiny_records(shards, index_files(shards, f"{data}/dali_index/tiny"), batch_size=1024,
                                  num_threads=os.cpu_count(), device_id=None), epochs, 1024)


def epochs_of(pipe, epochs, batch):
    """`epochs` passes of the pipeline's reader in whole batches (as the others' drop_remainder)."""
    def batches():
        pipe.build()
        for _ in range(pipe.epoch_size("reader") // batch * epochs):
            yield tuple(np.asarray(out.as_tensor()) for out in pipe.run())
    return batches, lambda made: int(made[0].shape[0])


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if workload == "checkpoint":
        import importlib.metadata
        measure.report("DALI", workload, checkpoint(data), version=importlib.metadata.version("nvidia-dali-cuda120"))
        return
    if workload not in ("image", "tiny"):
        measure.fail("DALI", workload, "not measured: no counterpart among DALI's CPU operators (a global shuffle, batches by length)")
    import importlib.metadata
    make, count = image(data, epochs) if workload == "image" else tiny(data, epochs)
    measure.report("DALI", workload, measure.consume(make, count), version=importlib.metadata.version("nvidia-dali-cuda120"))


if __name__ == "__main__":
    main()
