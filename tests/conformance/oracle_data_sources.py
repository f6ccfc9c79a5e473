"""The oracle of test_data_sources.py: Grain's ArrayRecordDataSource and Hugging Face's
load_dataset("parquet") (in the peers environment) read as data_source_cases says.

  oracle_data_sources.py grain OUT.json FILE...   Grain's source over the files, and over the
      first file's records 5..40 ('PATH[5:40]').
  oracle_data_sources.py hf OUT.json SPLIT_FILES_JSON [COLUMNS]   load_dataset("parquet",
      data_files=...) with each of data_source_cases.HF_SPLITS (images undecoded:
      Image(decode=False), as Sluice hands them on).
"""
import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_source_cases import HF_SPLITS, grain_reads, hf_reads  # noqa: E402


def digest(record):
    return hashlib.sha256(record).hexdigest()


def grain(out, files):
    from grain.python import ArrayRecordDataSource
    result = {"whole": grain_reads(ArrayRecordDataSource(files), files[0], digest),
              "part": grain_reads(ArrayRecordDataSource([files[0] + "[5:40]"] + files[1:]), files[0], digest)}
    with open(out, "w") as f:
        json.dump(result, f)


def hf(out, data_files, columns):
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=tempfile.mkdtemp(prefix="hf-home-"))
    import datasets
    datasets.disable_progress_bars()
    result = {}
    whole = datasets.load_dataset("parquet", data_files=data_files, columns=columns)
    result["splits"] = {name: ds.num_rows for name, ds in whole.items()}
    for split in HF_SPLITS:
        ds = datasets.load_dataset("parquet", data_files=data_files, split=split, columns=columns)
        if "image" in ds.column_names:
            ds = ds.cast_column("image", datasets.Image(decode=False))
        result[split] = hf_reads(ds)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if sys.argv[1] == "grain":
        grain(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "hf":
        hf(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4].split(",") if len(sys.argv) > 4 else None)
    else:
        sys.exit(f"oracle_data_sources.py: no mode {sys.argv[1]!r}")
