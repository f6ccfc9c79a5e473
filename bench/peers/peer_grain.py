"""The workloads as Grain's documentation writes them: its ArrayRecord data source (the same
records as the TFRecord shards, written by bench/peers/prepare.py with the array-record package),
an IndexSampler, MapTransforms and Batch in a DataLoader with one worker process per core; tf.Examples
parsed with protobuf (without TensorFlow), images with Pillow. Peers environment.
Usage: peer_grain.py WORKLOAD DATA EPOCHS"""
import glob
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

try:
    import grain.python as grain
    import numpy as np
except Exception as e:  # noqa: BLE001
    measure.fail("Grain", sys.argv[1], f"{type(e).__name__}: {e}")

TINY_RECORDS = 20_000
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


class PrepareImage(grain.MapTransform):
    def map(self, record):
        import io
        from PIL import Image
        from example_proto import Example
        features = Example.FromString(record).features.feature
        with Image.open(io.BytesIO(features["image"].bytes_list.value[0])) as img:
            img = img.convert("RGB")
            # The shorter side to 224, then the center 224x224 (Sluice's resize mode: crop).
            scale = 224 / min(img.size)
            w, h = round(img.size[0] * scale), round(img.size[1] * scale)
            img = img.resize((w, h), Image.BILINEAR)
            left, top = (w - 224) // 2, (h - 224) // 2
            pixels = np.asarray(img.crop((left, top, left + 224, top + 224)), np.float32)
        return {"image": (pixels / 255.0 - MEAN) / STD, "label": features["label"].int64_list.value[0]}


class ParseTiny(grain.MapTransform):
    def map(self, record):
        from example_proto import Example
        features = Example.FromString(record).features.feature
        return {"id": features["id"].int64_list.value[0], "label": features["label"].int64_list.value[0]}


def loader(pattern, transform, batch, epochs, records=None, shuffle=False):
    source = grain.ArrayRecordDataSource(sorted(glob.glob(pattern)))
    sampler = grain.IndexSampler(num_records=min(len(source), records or len(source)), shard_options=grain.NoSharding(), shuffle=shuffle,
                                 num_epochs=epochs, seed=7)
    return grain.DataLoader(data_source=source, sampler=sampler, operations=[transform, grain.Batch(batch, drop_remainder=True)],
                            worker_count=os.cpu_count())


def checkpoint(data):
    # Grain shuffles through random access (no buffer): its iterator state is the sampler's
    # position and the workers'; the image pipeline, shuffled, its state saved after step 40.
    made = loader(f"{data}/image_ar/*.array_record", PrepareImage(), 64, 2, shuffle=True)
    first = {"iterator": iter(made)}

    def save():
        with open(path, "wb") as f:
            f.write(first["iterator"].get_state())
        return os.path.getsize(path)

    def resumed():
        again = iter(made)
        with open(path, "rb") as f:
            again.set_state(f.read())
        return again
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "state")
        return measure.checkpoint_figures(lambda step: next(first["iterator"]), save, first.clear, resumed)


def main():
    workload, data, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if workload == "checkpoint":
        import importlib.metadata
        measure.report("Grain", workload, checkpoint(data), version=importlib.metadata.version("grain"))
        return
    if workload == "image":
        made = loader(f"{data}/image_ar/*.array_record", PrepareImage(), 64, epochs)
        count = lambda batch: int(batch["image"].shape[0])  # noqa: E731
    else:
        # Its first TINY_RECORDS only: a Python call per record makes the whole million take minutes.
        # (shuffle: a permutation of those, Grain's global shuffle through its random access.)
        made = loader(f"{data}/tiny_ar/*.array_record", ParseTiny(), 1024, epochs, TINY_RECORDS, shuffle=workload == "shuffle")
        count = lambda batch: int(batch["id"].shape[0])  # noqa: E731
    import importlib.metadata
    measure.report("Grain", workload, measure.consume(lambda: iter(made), count), version=importlib.metadata.version("grain"))


if __name__ == "__main__":
    main()
