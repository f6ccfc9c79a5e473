"""The oracle of test_tfds.py, with tensorflow_datasets (in the peers environment).

  oracle_tfds.py build DATA_DIR OUT.json SPLIT...   (as_supervised:SPLIT for pairs) prepares `conformance_set` (this file's builder:
      Image, ClassLabel, Tensor, Text, Sequence and a nested FeaturesDict; train and test; tfrecord
      files) in DATA_DIR with TFDS itself; OUT.json: for each SPLIT, the examples
      tfds.load(split=SPLIT, shuffle_files=False) gives and the absolute instructions TFDS's
      ReadInstruction makes of it (split, from, to).
  oracle_tfds.py read DIRECTORY OUT.json SPLIT...   a directory Sluice's tfds_writer wrote, loaded by
      tfds.builder_from_directory: its features' kinds and each split's examples.
"""
import base64
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
import numpy as np  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

SIZES = {"train": 37, "test": 11}


class ConformanceSet(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.2.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(names=["cat", "dog", "emu"]),
                "vector": tfds.features.Tensor(shape=(3,), dtype=np.float32),
                "caption": tfds.features.Text(),
                "tokens": tfds.features.Sequence(np.int64),
                "meta": tfds.features.FeaturesDict({"id": np.int64, "source": {"name": tfds.features.Text()}}),
            }),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split, n) for split, n in SIZES.items()}

    def _generate_examples(self, split, count):
        for i in range(count):
            rng = np.random.default_rng(i + (1000 if split == "test" else 0))
            yield f"{split}-{i:03d}", {
                "image": rng.integers(0, 256, size=(2 + i % 5, 3 + i % 4, 3), dtype=np.uint8),
                "label": i % 3,
                "vector": np.array([i, -i / 2, i * 0.125], np.float32),
                "caption": f"{split} example {i}: ü",
                "tokens": list(range(i % 6)),
                "meta": {"id": i, "source": {"name": f"src{i % 2}"}},
            }


def encode(value):
    if isinstance(value, dict):
        return {"dict": {k: encode(v) for k, v in sorted(value.items())}}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    array = np.asarray(value)
    if array.dtype.kind in ("O", "S"):
        return {"dtype": "string", "shape": list(array.shape),
                "values": [base64.b64encode(bytes(v)).decode() for v in array.reshape(-1)]}
    return {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.reshape(-1).tolist()}


def build(data_dir, splits):
    builder = ConformanceSet(data_dir=data_dir, file_format="tfrecord")
    # Four shards a split, so that shard slices ("train[1shard]") and reads across shards happen.
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
    results = {"version_dir": builder.data_dir, "splits": {}}
    for split in splits:
        supervised = split.startswith("as_supervised:")
        split = split[len("as_supervised:"):] if supervised else split
        instructions = tfds.core.ReadInstruction.from_spec(split).to_absolute(builder.info.splits)
        result = {"instructions": [[i.splitname, i.from_, i.to] for i in instructions]}
        try:
            examples = tfds.load("conformance_set", split=split, data_dir=data_dir, shuffle_files=False, as_supervised=supervised)
            result["examples"] = [encode(e) for e in tfds.as_numpy(examples)]
        except ValueError as e:  # a split that takes no example
            result["error"] = str(e)
        results["splits"][("as_supervised:" if supervised else "") + split] = result
    every = tfds.load("conformance_set", split=None, data_dir=data_dir)  # Sluice refuses it (the difference table)
    results["split_none"] = {"type": type(every).__name__, "keys": sorted(every)}
    return results


def read(directory, splits):
    builder = tfds.builder_from_directory(directory)
    kinds = {name: type(feature).__name__ for name, feature in builder.info.features.items()}
    return {"features": kinds, "splits": {split: [encode(e) for e in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))]
                                          for split in splits}}


if __name__ == "__main__":
    mode, where, out, splits = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    results = build(where, splits) if mode == "build" else read(where, splits)
    with open(out + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(out + ".partial", out)
