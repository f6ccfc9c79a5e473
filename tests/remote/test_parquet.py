"""Parquet objects in a bucket: Arrow's reader reads the footer and the column chunks it needs
through Sluice's ranged requests (signed, retried, counted), as it reads the local copies; a
Parquet output published to the bucket whole reads back the same."""
import os

import numpy as np

from conftest import DATA

import sluice
import sluice.data

BUCKET = "sluice-parquet"


def rows(dataset):
    return [{k: (v if isinstance(v, bytes) else v.tolist()) for k, v in e.items()} for e in dataset]


def test_parquet_objects_read_as_the_local_files_and_an_output_published_whole(s3, tmp_path):
    os.environ.update(s3.env())
    s3.client.create_bucket(Bucket=BUCKET)
    local = tmp_path / "local"
    (sluice.data.TFRecordDataset(os.path.join(DATA, "tfrecord", "tfx_mnist.tfrecord"))
     .map(lambda r: {"record": r, "size": np.int64(len(r)), "pair": np.array([len(r), 1], np.int32)})
     .parquet_writer(prefix=str(local / "mnist"), max_records=400, row_group_rows=64, compression="zstd").pipeline().run())
    names = sorted(os.listdir(local))
    assert len(names) == 3
    for n in names:
        s3.client.upload_file(str(local / n), BUCKET, f"tables/{n}")

    def read(pattern, **kwargs):
        return rows(sluice.data.ParquetDataset(sluice.data.list_files(pattern, shuffle=False), **kwargs))

    expected = read(str(local / "*.parquet"))
    assert len(expected) == 1000 and read(f"s3://{BUCKET}/tables/*.parquet") == expected
    # One column: only its chunks are asked for.
    assert read(f"s3://{BUCKET}/tables/*.parquet", columns=["size"]) == [{"size": r["size"]} for r in expected]
    (sluice.data.ParquetDataset(str(local / names[0])).parquet_writer(prefix=f"s3://{BUCKET}/written/copy").pipeline().run())
    listed = [o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix="written/")["Contents"]]
    assert listed == ["written/copy-00000-of-00001.parquet"]
    assert read(f"s3://{BUCKET}/written/copy-00000-of-00001.parquet") == expected[:400]


def test_data_sources_read_objects_at_random_as_the_local_files(s3, tmp_path):
    """load_dataset("parquet") and ArrayRecordDataSource over objects in the bucket: rows and
    records read at the places asked, by ranged requests, as from the local copies."""
    os.environ.update(s3.env())
    s3.client.create_bucket(Bucket=BUCKET + "-sources")
    local = tmp_path / "local"
    records = sluice.data.TFRecordDataset(os.path.join(DATA, "tfrecord", "tfx_mnist.tfrecord"))
    records.map(lambda r: {"record": r, "size": np.int64(len(r))}).parquet_writer(
        prefix=str(local / "rows"), max_records=600, row_group_rows=64).pipeline().run()
    records.map(lambda r: {"record": r}).array_record_writer(prefix=str(local / "records"), max_records=600,
                                                             options="group_size:1").pipeline().run()
    names = sorted(os.listdir(local))
    for n in names:
        s3.client.upload_file(str(local / n), BUCKET + "-sources", n)
    keys = [999, 0, 600, 599, 64, 63, 512]
    rows_here = sluice.data.load_dataset("parquet", data_files=str(local / "rows-*.parquet"), split="train")
    rows_there = sluice.data.load_dataset("parquet", data_files=f"s3://{BUCKET}-sources/rows-*.parquet", split="train")
    assert len(rows_there) == len(rows_here) == 1000 and [rows_there[k] for k in keys] == [rows_here[k] for k in keys]
    shards = [n for n in names if n.endswith(".array_record")]
    here = sluice.data.ArrayRecordDataSource([str(local / n) for n in shards])
    there = sluice.data.ArrayRecordDataSource([f"s3://{BUCKET}-sources/{n}" for n in shards])
    assert len(there) == 1000 and there.__getitems__(keys) == here.__getitems__(keys)
