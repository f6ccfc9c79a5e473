"""The oracle of test_tfds.py, with tensorflow_datasets (in the peers environment).

  oracle_tfds.py build DATA_DIR OUT.json SPLIT...   (as_supervised:SPLIT for pairs) prepares `conformance_set` (this file's builder:
      Image, ClassLabel, Tensor, Text, Sequence and a nested FeaturesDict; train and test; tfrecord
      files) in DATA_DIR with TFDS itself; OUT.json: for each SPLIT, the examples
      tfds.load(split=SPLIT, shuffle_files=False) gives and the absolute instructions TFDS's
      ReadInstruction makes of it (split, from, to); and `dtypes_set` (a Tensor feature of each
      dtype the engine has none of its own for: bool, int8, uint16, uint32, uint64, float16),
      its examples as tfds.load gives them.
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


class DtypesSet(tfds.core.GeneratorBasedBuilder):
    """A Tensor feature of each dtype the engine has no type of its own for (bfloat16 too, but
    TFDS cannot write it into tf.train.Example)."""
    VERSION = tfds.core.Version("1.0.0")
    DTYPES = {"flag": np.bool_, "tiny": np.int8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "half": np.float16}

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {name: tfds.features.Tensor(shape=(2,), dtype=dtype) for name, dtype in self.DTYPES.items()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(5):
            yield i, {"flag": [i % 2 == 0, True], "tiny": [-128 + i, 127 - i], "u16": [65535 - i, i], "u32": [2**32 - 1 - i, i],
                      "u64": [2**40 + i, i], "half": [0.5 * i, -1.25]}


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
    # The dtypes the engine has no type of its own for: their examples as TFDS gives them, with
    # TFDS's dtype names.
    DtypesSet(data_dir=data_dir, file_format="tfrecord").download_and_prepare()
    results["dtypes"] = [{name: {"dtype": str(np.asarray(value).dtype), "values": np.asarray(value, np.float64).tolist()}
                          for name, value in example.items()}
                         for example in tfds.as_numpy(tfds.load("dtypes_set", split="train", data_dir=data_dir, shuffle_files=False))]
    return results


def read(directory, splits):
    builder = tfds.builder_from_directory(directory)
    kinds = {name: type(feature).__name__ for name, feature in builder.info.features.items()}
    return {"features": kinds, "splits": {split: [encode(e) for e in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))]
                                          for split in splits}}


def build_array_record(data_dir):
    """The same dataset prepared by TFDS as ArrayRecord (its shards written by the array-record
    package): what it wrote, file by file."""
    builder = ConformanceSet(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
    return {"version_dir": builder.data_dir, "files": sorted(os.listdir(builder.data_dir))}


if __name__ == "__main__":
    mode, where, out, splits = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    results = build(where, splits) if mode == "build" else build_array_record(where) if mode == "build-array-record" else read(where, splits)
    with open(out + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(out + ".partial", out)
