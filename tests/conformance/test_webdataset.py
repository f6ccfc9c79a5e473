"""WebDataset against webdataset itself: shards webdataset.TarWriter wrote (plain and gzip) read by
webdataset_reader as webdataset's own reader groups and gives them, and webdataset_writer's shards
read by webdataset.WebDataset with its default decoders (by extension: .cls an int, .txt a str,
.npy an array)."""
import base64
import io
import json
import os

import numpy as np
import pytest

import sluice.data
from peers import oracle_writes, run_oracle


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return oracle_writes(tmp_path_factory.mktemp("wds_written"), "oracle_webdataset.py")


def as_raw(name, value):
    """Sluice's field as the member's bytes: the reader parses .cls into an int64 and .npy into a
    tensor (its `integers` and `npy` parameters); the rest are the bytes themselves."""
    if name == "cls":
        return str(int(value)).encode()
    if name == "npy":
        return value
    return bytes(value)


@pytest.mark.parametrize("shard", ["plain.tar", "zipped.tar.gz"])
def test_shards_of_tar_writer_read_as_webdataset_reads_them(written, shard):
    folder, oracle = written
    expected = oracle[shard]
    got = list(sluice.data.list_files(str(folder / shard), shuffle=False).webdataset_reader())
    assert len(got) == len(expected) == 7
    for mine, theirs in zip(got, expected):
        # Keys with dots in their folders, members of two extensions (seg.png), an empty member.
        assert sorted(k for k in mine if k != "__url__") == sorted(theirs), (mine.keys(), theirs.keys())
        assert mine["__key__"].decode() == theirs["__key__"]
        for name, encoded in theirs.items():
            if name == "__key__":
                continue
            raw = base64.b64decode(encoded)
            if name == "npy":
                assert np.array_equal(mine["npy"], np.load(io.BytesIO(raw))) and mine["npy"].dtype == np.float32
            else:
                assert as_raw(name, mine[name]) == raw, (theirs["__key__"], name)


def test_shards_of_webdataset_writer_read_by_webdataset(tmp_path):
    classes = np.array([3, 1, 2], np.int64)
    captions = ["a", "bb", "é"]
    tensors = np.arange(18, dtype=np.float32).reshape(3, 2, 3)
    images = [b"\xff\xd8", b"\x00", b""]  # a member ending in NUL, an empty one
    (sluice.data.from_tensor_slices({"cls": classes, "txt": captions, "npy": tensors, "jpg": images})
     .webdataset_writer(prefix=str(tmp_path / "s"), max_records=2).pipeline().run())
    shards = sorted(str(tmp_path / n) for n in os.listdir(tmp_path))
    assert len(shards) == 2
    out = tmp_path / "read.json"
    run_oracle("oracle_webdataset.py", "read", *shards, out)
    read = json.loads(out.read_text())
    assert [s["__key__"] for s in read] == ["000000000", "000000001", "000000002"]
    assert [s["cls"] for s in read] == classes.tolist()
    assert [s["txt"] for s in read] == captions
    assert [s["npy"] for s in read] == [{"dtype": "float32", "shape": [2, 3], "values": t.reshape(-1).tolist()} for t in tensors]
    assert [base64.b64decode(s["jpg"]["bytes"]) for s in read] == images
