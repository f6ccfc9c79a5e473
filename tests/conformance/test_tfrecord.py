"""TFRecord files against TensorFlow: files tf.io.TFRecordWriter wrote (no compression, GZIP,
ZLIB) read bit for bit by Sluice's TFRecordDataset, their tf.train.Examples and
SequenceExamples parsed by parse_example to what tf.io.parse_single_(sequence_)example gives, and
the files Sluice's tfrecord_writer writes read back by tf.data.TFRecordDataset."""
import base64
import json
import os

import numpy as np
import pytest

import sluice.data
from peers import oracle_writes, run_oracle
from tf_programs import encode

EXAMPLE_FEATURES = "ids:int64[],pair:float[2]=0,name:bytes=none,big:int64=-1"  # the oracle's EXAMPLE_SPEC
COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return oracle_writes(tmp_path_factory.mktemp("tf_written"), "oracle_tfrecord.py")


def b64(records):
    return [base64.b64encode(bytes(r)).decode() for r in records]


@pytest.mark.parametrize("name", ["examples-none.tfrecord", "examples-gzip.tfrecord", "examples-zlib.tfrecord", "sequences.tfrecord"])
def test_records_tensorflow_wrote_are_read_bit_for_bit(written, name):
    folder, oracle = written
    expected = oracle[name]
    path = str(folder / name)
    assert b64(sluice.data.TFRecordDataset(path, expected["compression"])) == expected["records"]
    # Sluice's default (compression_type=None) detects the compression, where tf.data's reads a
    # compressed file as plain and fails (the README's difference table).
    assert b64(sluice.data.TFRecordDataset(path)) == expected["records"]
    if name.startswith("examples"):
        undeclared = expected["undeclared"]
        assert ("DataLossError" in undeclared) if expected["compression"] else undeclared == "read", undeclared


@pytest.mark.parametrize("compression", sorted(COMPRESSION))
def test_examples_parse_as_tensorflow_parses_them(written, compression):
    folder, oracle = written
    name = f"examples-{compression}.tfrecord"
    ds = (sluice.data.list_files(str(folder / name), shuffle=False).tfrecord_reader()
          .parse_example(features=EXAMPLE_FEATURES))
    got = [{field: encode(e[field]) for field in ("ids", "pair", "name", "big")} for e in ds]
    # Every feature kind, an empty list (Example 0), a missing feature (every fifth has no name:
    # its default), an int64 past 32 bits, and an Example without features (the last).
    assert got == oracle[name]["parsed"]


def test_sequence_examples_parse_as_tensorflow_parses_them(written):
    folder, oracle = written
    ds = (sluice.data.list_files(str(folder / "sequences.tfrecord"), shuffle=False).tfrecord_reader()
          .parse_example(features="length:int64", sequence_features="frames:int64[3],scores:float[1]"))
    got = [{field: encode(e[field]) for field in ("length", "frames", "scores")} for e in ds]
    assert got == oracle["sequences.tfrecord"]["parsed"]  # a SequenceExample of no frames included


@pytest.mark.parametrize("compression", sorted(COMPRESSION))
def test_what_tfrecord_writer_writes_tensorflow_reads(tmp_path, compression):
    ids = np.arange(12, dtype=np.int64).reshape(4, 3) - 5
    scores = np.array([0.5, 1.5, -2.25, 3e38], dtype=np.float32)
    names = np.array([b"a", b"bb", b"", b"\xff\x00d"])
    (sluice.data.from_tensor_slices({"ids": ids, "score": scores, "name": names})
     .tfrecord_writer(prefix=str(tmp_path / compression), compression=compression).pipeline().run())
    (path,) = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path)]
    out = tmp_path / "read.json"
    run_oracle("oracle_tfrecord.py", "read", path, out)
    read = json.loads(out.read_text())[os.path.basename(path)]
    expected = [{"ids": {"kind": "int64_list", "values": ids[i].tolist()},
                 "score": {"kind": "float_list", "values": [float(scores[i])]},
                 "name": {"kind": "bytes_list", "values": [base64.b64encode(names[i]).decode()]}} for i in range(4)]
    assert read == expected
