"""tensorflow_datasets against TFDS itself: a dataset TFDS prepared (oracle_tfds.py's builder:
Image, ClassLabel, Tensor, Text, Sequence and a nested FeaturesDict in four tfrecord shards a
split) read by sluice.data.tfds as tfds.load reads it, for every split form of the README, with
TFDS's ReadInstruction saying which examples each takes; and a directory Sluice's tfds_writer
wrote loaded by tfds.builder_from_directory."""
import json

import numpy as np
import pytest

import sluice.data
from peers import run_oracle
from tf_programs import encode

# The README's split forms, on a train split of 37 examples and a test split of 11.
SPLITS = ["train", "test", "train[:10]", "train[-7:]", "train[25%:75%]", "train[:0.5%]", "train[:2shard]", "train[1shard]",
          "train[:25%]+test", "train[:10%]+test[-5:]", "all", "as_supervised:test"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    out = data_dir / "oracle.json"
    run_oracle("oracle_tfds.py", "build", data_dir / "data", out, *SPLITS)
    return data_dir / "data", json.loads(out.read_text())


@pytest.mark.parametrize("split", SPLITS)
def test_a_split_reads_as_tfds_load_reads_it(prepared, split):
    data_dir, oracle = prepared
    expected = oracle["splits"][split]
    supervised = split.startswith("as_supervised:")
    name = split[len("as_supervised:"):] if supervised else split
    dataset = sluice.data.tfds("conformance_set", split=name, data_dir=str(data_dir), shuffle_files=False, as_supervised=supervised)
    if "error" in expected:
        print(f"{split}: TFDS refuses it: {expected['error']}")
        with pytest.raises(sluice.PipelineError, match="takes no example"):
            list(dataset)
        return
    got = [encode(e) for e in dataset]
    print(f"{split}: TFDS reads {expected['instructions']} (split, from, to): {len(expected['examples'])} examples")
    assert len(got) == len(expected["examples"])
    assert got == expected["examples"]


@pytest.fixture(scope="module")
def prepared_as_array_record(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds_array_record")
    out = data_dir / "oracle.json"
    run_oracle("oracle_tfds.py", "build-array-record", data_dir / "data", out)
    return data_dir / "data", json.loads(out.read_text())


@pytest.mark.parametrize("split", SPLITS)
def test_a_split_prepared_as_array_record_reads_as_the_tfrecord_copy(prepared, prepared_as_array_record, split):
    """TFDS's fileFormat array_record: the shards the array-record package wrote for TFDS, read
    by tfds (through tfds_reader) and by random_access, equal to what tfds.load gives of the
    tfrecord copy."""
    data_dir, oracle = prepared_as_array_record
    assert [f for f in oracle["files"] if ".array_record-" in f] and not [f for f in oracle["files"] if ".tfrecord-" in f]
    supervised = split.startswith("as_supervised:")
    name = split[len("as_supervised:"):] if supervised else split
    dataset = sluice.data.tfds("conformance_set", split=name, data_dir=str(data_dir), shuffle_files=False, as_supervised=supervised)
    if "error" in prepared[1]["splits"][split]:
        with pytest.raises(sluice.PipelineError, match="takes no example"):
            list(dataset)
        return
    expected = prepared[1]["splits"][split]["examples"]
    assert [encode(e) for e in dataset] == expected
    if not supervised:  # read at random: the tfrecord copy's examples (as features.json describes them) in the same permutation
        def shuffled(directory):
            return [encode(e) for e in sluice.data.random_access(tfds="conformance_set", split=name, data_dir=str(directory), seed=1)]
        assert shuffled(data_dir) == shuffled(prepared[0])


def test_split_none_is_refused_where_tfds_gives_every_split(prepared):
    data_dir, oracle = prepared
    assert oracle["split_none"] == {"type": "dict", "keys": ["test", "train"]}
    with pytest.raises(TypeError, match="give split="):
        sluice.data.tfds("conformance_set", split=None, data_dir=str(data_dir))


# TFDS's dtypes the engine has no type of its own for, and what Sluice gives instead (the README's
# difference table): the same values, in the engine's nearest dtype.
SLUICE_DTYPES = {"bool": "uint8", "int8": "int16", "uint16": "int32", "uint32": "int64", "uint64": "int64", "float16": "float32"}


def test_tfds_dtypes_without_an_engine_type_read_as_the_difference_table_says(prepared):
    data_dir, oracle = prepared
    expected = oracle["dtypes"]
    got = list(sluice.data.tfds("dtypes_set", split="train", data_dir=str(data_dir), shuffle_files=False))
    assert len(got) == len(expected) == 5
    for ours, theirs in zip(got, expected):
        assert sorted(ours) == sorted(theirs)
        for name, value in ours.items():
            assert str(value.dtype) == SLUICE_DTYPES[theirs[name]["dtype"]], (name, value.dtype, theirs[name]["dtype"])
            assert np.asarray(value, np.float64).tolist() == theirs[name]["values"], (name, value, theirs[name])


def test_what_tfds_writer_writes_tfds_loads(tmp_path):
    images = np.stack([np.full((4, 6, 3), i * 40, np.uint8) + np.arange(6, dtype=np.uint8)[None, :, None] for i in range(5)])
    labels = np.array([2, 0, 1, 2, 0], np.int64)
    vectors = np.arange(15, dtype=np.float32).reshape(5, 3) / 4
    captions = [f"caption {i}" for i in range(5)]
    for split, rows in (("train", slice(0, 3)), ("test", slice(3, 5))):
        (sluice.data.from_tensor_slices({"image": images[rows], "label": labels[rows], "vector": vectors[rows], "caption": captions[rows]})
         .encode_image(format="png")
         .tfds_writer(data_dir=str(tmp_path), name="written_here", version="2.0.0", split=split, class_labels=["label:3"],
                      supervised_keys=["image,label"]).pipeline().run())
    out = tmp_path / "read.json"
    run_oracle("oracle_tfds.py", "read", tmp_path / "written_here" / "2.0.0", out, "train", "test")
    read = json.loads(out.read_text())
    assert read["features"] == {"image": "Image", "label": "ClassLabel", "vector": "Tensor", "caption": "Text"}
    for split, rows in (("train", range(0, 3)), ("test", range(3, 5))):
        examples = [{"image": images[i], "label": labels[i], "vector": vectors[i], "caption": captions[i].encode()} for i in rows]
        # TFDS reads in its own order within a split (as tfds_writer wrote it): compare as sets.
        key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
        assert sorted(map(key, read["splits"][split])) == sorted(key(encode(e)) for e in examples)
