"""Parquet against pyarrow itself: files pyarrow wrote (every column type parquet_reader reads,
snappy, zstd, gzip and none, one and many row groups, nulls, a dataset as Hugging Face exports
one) read by Sluice value for value; the files parquet_writer writes read by pyarrow equal;
damage named by file."""
import json
import os

import numpy as np
import pytest

import sluice
import sluice.data
from parquet_cases import (COMPRESSIONS, DAMAGED_GROUP, GROUP_ROWS, GROUPS, HF_FILES, HF_ROWS_PER_FILE, LONG_ROWS, NULLS, ROWS, VALUES, as_python,
                           expected_rows, hf_rows, long_tokens)
from peers import damaged_copy, SOURCE_DIR, run_oracle

JPEGS = [os.path.join(SOURCE_DIR, "tests", "data", "real", "jpeg", name)
         for name in ("libjpeg-turbo/testorig.jpg", "libjpeg-turbo/testimgint.jpg", "pillow/hopper.jpg", "pillow/flower.jpg")]


@pytest.fixture(scope="module")
def pyarrow_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parquet_written")
    run_oracle("oracle_parquet.py", "write", folder, *JPEGS)
    return folder


def rows_of(dataset):
    return [as_python(e) for e in dataset]


@pytest.mark.parametrize("case", [f"types-{c}" for c in COMPRESSIONS] + ["types-one-group"])
def test_files_of_pyarrow_read_value_for_value(pyarrow_files, case):
    path = str(pyarrow_files / (case + ".parquet"))
    assert rows_of(sluice.data.ParquetDataset(path)) == expected_rows()


def test_columns_reads_only_those_and_struct_members_by_path(pyarrow_files):
    path = str(pyarrow_files / "types-zstd.parquet")
    got = rows_of(sluice.data.ParquetDataset(path, columns=["tokens", "meta/source/name", "u64"]))
    want = [{"tokens": r["tokens"], "meta/source/name": r["meta/source/name"], "u64": r["u64"]} for r in expected_rows()]
    assert got == want and list(got[0]) == ["tokens", "meta/source/name", "u64"]  # (the file's order of columns)
    with pytest.raises(sluice.PipelineError, match=r"types-zstd.parquet has no column 'nope' \(it has: i8, i16"):
        rows_of(sluice.data.ParquetDataset(path, columns=["nope"]))
    with pytest.raises(sluice.PipelineError, match=r"'meta/id/x': 'id' of .* is not a struct"):
        rows_of(sluice.data.ParquetDataset(path, columns=["meta/id/x"]))


def test_rows_batched_in_chunks_are_the_rows_read_one_by_one(pyarrow_files):
    """A batch takes the reader's rows as chunks (columns viewing Arrow's buffers): the same values."""
    path = str(pyarrow_files / "types-snappy.parquet")
    columns = ["i32", "f64", "vector", "text", "u16"]
    batches = list(sluice.data.ParquetDataset(path, columns=columns).batch(8))
    rows = expected_rows(columns)
    assert len(batches) == 7
    for name in columns:
        got = [v for b in batches for v in (b[name].tolist() if b[name].dtype != object else [bytes(x) for x in b[name]])]
        assert got == [r[name] for r in rows], name


def test_lists_of_a_row_group_longer_than_one_conversion(pyarrow_files):
    """20,000 rows in one row group, converted 8,192 at a time: every slice's lists are its own rows'."""
    got = rows_of(sluice.data.ParquetDataset(str(pyarrow_files / "long-group.parquet")))
    assert len(got) == LONG_ROWS
    assert got == [{"id": i, "tokens": long_tokens(i), "words": [str(t).encode() for t in long_tokens(i)]} for i in range(LONG_ROWS)]


def test_nulls_are_refused_by_file_column_and_row_or_given_their_defaults(pyarrow_files):
    path = str(pyarrow_files / "nulls.parquet")
    with pytest.raises(sluice.PipelineError, match=r"nulls.parquet: column 'count' holds a null at row 1; read it with nulls: default"):
        rows_of(sluice.data.ParquetDataset(path))
    with pytest.raises(sluice.PipelineError, match=r"column 'where/x' holds a null at row 2"):
        rows_of(sluice.data.ParquetDataset(path, columns=["where"]))
    with pytest.raises(sluice.PipelineError, match=r"column 'scores' holds a null at row 1"):
        rows_of(sluice.data.ParquetDataset(path, columns=["scores"]))
    got = rows_of(sluice.data.ParquetDataset(path, nulls="default", null_defaults={"count": -1, "name": "unknown"}))
    assert [r["count"] for r in got] == [-1 if v is None else v for v in NULLS["count"]]
    assert [r["name"] for r in got] == [b"unknown" if v is None else v.encode() for v in NULLS["name"]]
    assert [r["scores"] for r in got] == [[] if v is None else v for v in NULLS["scores"]]
    assert [r["where/x"] for r in got] == [0 if v is None else v["x"] for v in NULLS["where"]]
    with pytest.raises(sluice.PipelineError, match=r"null_defaults: 'count=many' is not a number"):
        rows_of(sluice.data.ParquetDataset(path, nulls="default", null_defaults={"count": "many"}))


def test_a_dataset_as_hugging_face_exports_it(pyarrow_files):
    files = sluice.data.list_files(str(pyarrow_files / "hf" / "data" / "train-*.parquet"), shuffle=False)
    expected = hf_rows({os.path.basename(p): open(p, "rb").read() for p in JPEGS})
    got = rows_of(sluice.data.ParquetDataset(files))
    assert len(got) == HF_FILES * HF_ROWS_PER_FILE
    assert got == [{"image/bytes": r["image"]["bytes"], "image/path": r["image"]["path"].encode(), "text": r["text"].encode(),
                    "label": r["label"]} for r in expected]
    # Read three files at once, decoded and batched as a training loop takes them.
    parallel = sluice.data.ParquetDataset(files, num_parallel_reads=3)
    images = (parallel.decode_image(field="image/bytes").resize(height=32, width=32).batch(9))
    shapes = [b["image"].shape for b in images]
    assert shapes == [(9, 32, 32, 3)] * 3
    assert sorted(r["text"] for r in rows_of(parallel)) == sorted(r["text"].encode() for r in expected)


def oracle_read(tmp_path, files):
    out = tmp_path / "read.json"
    run_oracle("oracle_parquet.py", "read", out, *files)
    return json.loads(out.read_text())


def from_json(value):
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def flattened(row, prefix=""):
    out = {}
    for k, v in row.items():
        out.update(flattened(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_files_of_parquet_writer_read_by_pyarrow(pyarrow_files, tmp_path, compression):
    (sluice.data.ParquetDataset(str(pyarrow_files / "types-none.parquet"))
     .parquet_writer(prefix=str(tmp_path / "out"), compression=compression, row_group_rows=16).pipeline().run())
    written = str(tmp_path / "out-00000-of-00001.parquet")
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(written)]
    read = oracle_read(tmp_path, [written])[written]
    assert read["row_groups"] == 4 and read["compression"] == ("UNCOMPRESSED" if compression == "none" else compression.upper())
    assert [flattened(from_json(r)) for r in read["rows"]] == expected_rows()
    # The Arrow schema is stored: types Sluice holds read back as themselves, structs as structs.
    assert read["schema"]["f16"] == "halffloat" and read["schema"]["u8"] == "uint8"
    assert read["schema"]["tokens"] == "list<element: int64>"
    assert read["schema"]["meta"].startswith("struct<id: int32 not null, source: struct<name: binary")
    # And Sluice reads its own file back as it read pyarrow's.
    assert rows_of(sluice.data.ParquetDataset(written)) == expected_rows()


def test_fixed_lists_and_shards_of_parquet_writer(pyarrow_files, tmp_path):
    columns = ["i64", "vector", "matrix", "blob"]
    (sluice.data.ParquetDataset(str(pyarrow_files / "types-snappy.parquet"), columns=columns)
     .parquet_writer(prefix=str(tmp_path / "fixed"), lists="fixed", max_records=20).pipeline().run())
    shards = sorted(str(p) for p in tmp_path.glob("fixed-*.parquet"))
    assert [os.path.basename(s) for s in shards] == [f"fixed-0000{k}-of-00003.parquet" for k in range(3)]
    read = oracle_read(tmp_path, shards)
    assert read[shards[0]]["schema"]["matrix"] == "fixed_size_list<element: fixed_size_list<element: int32>[2]>[3]"
    assert [flattened(from_json(r)) for s in shards for r in read[s]["rows"]] == expected_rows(columns)
    # A ragged field cannot be written with lists: fixed; the error names the field and shapes.
    with pytest.raises(sluice.PipelineError, match=r"field 'tokens' of element \d+ is i64 \[\d+\], and the shard's first element's was"):
        (sluice.data.ParquetDataset(str(pyarrow_files / "types-snappy.parquet"), columns=["tokens"])
         .parquet_writer(prefix=str(tmp_path / "ragged"), lists="fixed").pipeline().run())


def test_truncated_and_damaged_files_are_named(pyarrow_files, tmp_path):
    source = str(pyarrow_files / "types-snappy.parquet")
    size = os.path.getsize(source)
    for cut in (0, 4, 12, size // 2, size - 1):
        broken = damaged_copy(source, tmp_path, cut=cut)
        with pytest.raises(sluice.PipelineError, match=rf"{broken}"):
            rows_of(sluice.data.ParquetDataset(broken))
    # A damaged footer (the schema's bytes, just before its 4-byte length and the magic).
    broken = damaged_copy(source, tmp_path, flip=size - 40)
    try:
        rows = rows_of(sluice.data.ParquetDataset(broken))
    except sluice.PipelineError as e:
        assert broken in str(e)
    else:  # a flip Arrow cannot see reads other values, never a crash
        assert len(rows) <= ROWS


def test_padded_batch_of_the_readers_rows_pads_fixed_lists_and_ragged_ones(pyarrow_files):
    """padded_batch takes the reader's chunks (a fixed list's rows one block, the tokens ragged):
    the values pyarrow wrote, each padded with -1 to its padded shape or its batch's longest."""
    path = str(pyarrow_files / "types-snappy.parquet")
    columns = ["vector", "tokens"]
    batches = list(sluice.data.ParquetDataset(path, columns=columns).padded_batch(8, padded_shapes=["vector:5"], padding_values=-1))
    rows = expected_rows(columns)
    assert [len(b["vector"]) for b in batches] == [8] * 6 + [2]
    for k, b in enumerate(batches):
        part = rows[8 * k:8 * k + 8]
        assert b["vector"].tolist() == [r["vector"] + [-1] * 2 for r in part]
        longest = max(len(r["tokens"]) for r in part)
        assert b["tokens"].tolist() == [r["tokens"] + [-1] * (longest - len(r["tokens"])) for r in part]


def test_padded_batch_refuses_each_row_of_a_file_whose_column_has_another_type(pyarrow_files, tmp_path):
    # The second file's i32 is a float64: each of its rows is refused (the first of its chunk too),
    # and under skip the batches hold the first file's rows only.
    path = str(pyarrow_files / "types-snappy.parquet")
    (sluice.data.ParquetDataset(path, columns=["f64"]).map(lambda e: {"i32": e["f64"]})
     .parquet_writer(prefix=str(tmp_path / "floats")).pipeline().run())
    files = [path, str(tmp_path / "floats-00000-of-00001.parquet")]
    read = sluice.data.list_files(files, shuffle=False).parquet_reader(columns=["i32"])
    with pytest.raises(sluice.PipelineError, match=r"field 'i32' is f64"):
        list(read.padded_batch(8))
    batches = list(read.padded_batch(8, error_policy="skip"))
    assert [v for b in batches for v in b["i32"].tolist()] == [r["i32"] for r in expected_rows(["i32"])]


@pytest.mark.parametrize("ahead_bytes", [None, 0], ids=["whole-groups-ahead", "a-batch-ahead"])
def test_a_damaged_row_group_is_named_and_skipped_under_skip_the_others_read_in_order(tmp_path, ahead_bytes):
    # What comes next is decoded ahead while the rows before are handed on (whole row groups, or
    # with decode_ahead_bytes below a group's size the next record batch): the damage found ahead
    # is reported after every row before it, and reading goes on after it.
    run_oracle("oracle_parquet.py", "write-groups", tmp_path)
    whole, broken = str(tmp_path / "groups.parquet"), str(tmp_path / "damaged-groups.parquet")
    ahead = {} if ahead_bytes is None else {"decode_ahead_bytes": ahead_bytes}

    def read(path, **policy):
        return sluice.data.list_files([path], shuffle=False).parquet_reader(**ahead, **policy)

    ids = [int(e["id"]) for e in read(whole)]
    assert ids == list(range(GROUPS * GROUP_ROWS))
    with pytest.raises(sluice.PipelineError, match=rf"{broken}: row group {DAMAGED_GROUP}"):
        rows_of(read(broken))
    kept = [int(e["id"]) for e in read(broken, error_policy="skip")]
    damaged = range(DAMAGED_GROUP * GROUP_ROWS, (DAMAGED_GROUP + 1) * GROUP_ROWS)
    assert kept == [i for i in range(GROUPS * GROUP_ROWS) if i not in damaged]


def test_a_value_past_int64_is_named(tmp_path):
    run_oracle("oracle_parquet.py", "write-huge", tmp_path)
    with pytest.raises(sluice.PipelineError, match=r"huge.parquet: column 'big' holds 18446744073709551615 at row 1, past int64"):
        rows_of(sluice.data.ParquetDataset(str(tmp_path / "huge.parquet")))


def test_the_values_sluice_gives_are_numpy_arrays_a_loop_can_use(pyarrow_files):
    first = next(iter(sluice.data.ParquetDataset(str(pyarrow_files / "types-gzip.parquet"), columns=["matrix", "boxes"])))
    assert first["matrix"].shape == (3, 2) and first["boxes"].shape[1:] == (2,)
    assert np.array_equal(first["matrix"], np.array(VALUES["matrix"][0], dtype=np.int32))
