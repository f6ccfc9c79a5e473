"""Data sources read at the caller's places, against the libraries whose shape they take: Grain's
ArrayRecordDataSource over files the array-record package wrote (whole, and 'PATH[5:40]'), and
Hugging Face's load_dataset("parquet") over files pyarrow wrote (every column type, a dataset as
Hugging Face exports one, several files, split slices): the same reads give the same answers,
errors included (data_source_cases.py says which)."""
import hashlib
import json
import pickle

import pytest

import sluice.data
from array_record_cases import OPTIONS
from data_source_cases import HF_SPLITS, grain_reads, hf_reads
from peers import run_oracle
from test_parquet import JPEGS


def digest(record):
    return hashlib.sha256(record).hexdigest()


@pytest.fixture(scope="module")
def array_record_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("array_record_sources")
    run_oracle("oracle_array_record.py", "write", folder)
    return [str(folder / (case + ".array_record")) for case in ("uncompressed-1", "zstd-1", "default")]


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parquet_sources")
    run_oracle("oracle_parquet.py", "write", folder, *JPEGS)
    return folder


def oracle(tmp_path, *args):
    out = tmp_path / "oracle.json"
    run_oracle("oracle_data_sources.py", args[0], out, *args[1:])
    return json.loads(out.read_text())


def test_array_record_data_source_reads_as_grains(array_record_files, tmp_path):
    expected = oracle(tmp_path, "grain", *array_record_files)
    assert grain_reads(sluice.data.ArrayRecordDataSource(array_record_files), array_record_files[0], digest) == expected["whole"]
    part = sluice.data.ArrayRecordDataSource([array_record_files[0] + "[5:40]"] + array_record_files[1:])
    assert grain_reads(part, array_record_files[0], digest) == expected["part"]


def test_array_record_data_source_pickles_and_reopens(array_record_files):
    source = sluice.data.ArrayRecordDataSource(array_record_files[1:])
    first = source[7]
    with source:
        pass  # (closes its files: the next read opens them again)
    assert source[7] == first
    again = pickle.loads(pickle.dumps(source))  # (as Grain's worker processes receive it)
    assert len(again) == len(source) and again.__getitems__([7, 0]) == [first, source[0]]


def test_array_record_data_source_refuses_what_grain_refuses(array_record_files, tmp_path):
    with pytest.raises(ValueError, match="0 length"):
        sluice.data.ArrayRecordDataSource([])
    with pytest.raises(ValueError, match=r"\[900:901\] is outside its 311 records"):
        len(sluice.data.ArrayRecordDataSource([array_record_files[0] + "[900:901]"]))
    with pytest.raises(OSError, match="matches no file"):
        sluice.data.ArrayRecordDataSource(str(tmp_path / "missing.array_record"))
    with pytest.raises(ValueError, match="reader_options: readahead_buffer_size:0 is not an option"):
        sluice.data.ArrayRecordDataSource(array_record_files[0], reader_options={"readahead_buffer_size": "0"})


def sluice_splits(files, columns=None):
    out = {}
    whole = sluice.data.load_dataset("parquet", data_files=files, columns=columns)
    out["splits"] = {name: ds.num_rows for name, ds in whole.items()}
    for split in HF_SPLITS:
        out[split] = hf_reads(sluice.data.load_dataset("parquet", data_files=files, split=split, columns=columns))
    return out


@pytest.mark.parametrize("case", ["types-snappy", "types-one-group"])
def test_parquet_rows_read_as_hugging_face_loads_them(parquet_files, tmp_path, case):
    files = [str(parquet_files / (case + ".parquet"))]
    assert sluice_splits(files) == oracle(tmp_path, "hf", json.dumps(files))


def test_a_hugging_face_export_of_several_files_and_some_columns(parquet_files, tmp_path):
    files = sorted(str(p) for p in (parquet_files / "hf" / "data").glob("*.parquet"))
    assert sluice_splits(files) == oracle(tmp_path, "hf", json.dumps(files))
    assert sluice_splits(files, ["label", "image"]) == oracle(tmp_path, "hf", json.dumps(files), "label,image")
    # Splits by name, read from the files of each.
    splits = {"train": files[:2], "test": files[2:]}
    assert sluice_splits(splits)["splits"] == oracle(tmp_path, "hf", json.dumps(splits))["splits"] == {"train": 18, "test": 9}


def test_load_dataset_refusals_name_what_to_do(parquet_files):
    path = str(parquet_files / "types-snappy.parquet")
    with pytest.raises(ValueError, match="Unknown split \"validation\". Should be one of \\['train'\\]"):
        sluice.data.load_dataset("parquet", data_files=path, split="validation")
    with pytest.raises(ValueError, match="reads Parquet files"):
        sluice.data.load_dataset("csv", data_files=path)
    with pytest.raises(OSError, match="nulls.parquet.*null"):
        sluice.data.load_dataset("parquet", data_files=str(parquet_files / "nulls.parquet"), split="train")[0]


def test_rows_read_at_random_equal_rows_read_in_order(parquet_files):
    """Rows of a long row group read out of order, past the group cache and back: each the row
    the same source gives in order."""
    ds = sluice.data.load_dataset("parquet", data_files=str(parquet_files / "long-group.parquet"), split="train", cache_bytes=0)
    keys = [19999, 0, 8191, 8192, 12345, 1, 19998]
    in_order = {k: row for k, row in enumerate(ds) if k in keys}
    assert [ds[k] for k in keys] == [in_order[k] for k in keys]


def test_the_sources_beneath_refuse_a_place_past_their_records(array_record_files, parquet_files):
    """What the data sources stand on (sluice._sluice.PositionedRecords over random_access and
    parquet_rows) names a place past the end instead of reading past it."""
    from sluice import _sluice
    records = _sluice.PositionedRecords("random_access", {"patterns": array_record_files[0], "shuffle": "false"})
    with pytest.raises(OSError, match=r"record 311 is past the 311 records of .*uncompressed-1.array_record"):
        records.read([310, 311])
    rows = _sluice.PositionedRecords("parquet_rows", {"patterns": str(parquet_files / "types-*.parquet")})
    assert len(rows) == 5 * 50
    with pytest.raises(OSError, match=r"row 250 is past the 250 rows of 5 files"):
        rows.read([250])


def test_parquet_rows_in_a_pipeline_gives_each_shard_a_run_of_rows(parquet_files):
    path = str(parquet_files / "types-snappy.parquet")
    ids = [int(e["i64"]) for e in sluice.data.ParquetDataset(path, columns=["i64"])]
    assert [int(e["i64"]) for e in sluice.data.parquet_rows(patterns=[path], columns=["i64"])] == ids
    shards = [[int(e["i64"]) for e in sluice.data.parquet_rows(patterns=[path], columns=["i64"], num_shards=3, index=k)] for k in range(3)]
    assert [len(s) for s in shards] == [17, 17, 16] and shards[0] + shards[1] + shards[2] == ids


def test_a_parquet_split_pickles_and_reads_the_same_rows(parquet_files):
    """As a DataLoader's worker processes receive it: the files opened again where it is unpickled."""
    ds = sluice.data.load_dataset("parquet", data_files=str(parquet_files / "types-zstd.parquet"), split="train[10:20]")
    again = pickle.loads(pickle.dumps(ds))
    assert len(again) == 10 and again[[0, 9]] == ds[[0, 9]] and again.column_names == ds.column_names
