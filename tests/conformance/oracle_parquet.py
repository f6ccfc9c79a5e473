"""The oracle of test_parquet.py, with pyarrow (in the peers environment).

  oracle_parquet.py write FOLDER JPEG...   the cases of parquet_cases.py as pyarrow writes them:
      types-COMPRESSION.parquet (row groups of 7 rows), types-one-group.parquet, nulls.parquet,
      long-group.parquet (LONG_ROWS rows of lists in one row group),
      and a dataset as Hugging Face exports one (hf/data/train-0000K-of-00003.parquet).
  oracle_parquet.py write-huge FOLDER   huge.parquet: a uint64 column past int64's range.
  oracle_parquet.py read OUT.json FILE...  each file as pyarrow reads it: its Arrow schema, its
      row groups, and its rows (bytes as hex, floats as they are).
"""
import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parquet_cases import (COMPRESSIONS, DAMAGED_GROUP, GROUP_ROWS, GROUPS, HF_FILES, HF_ROWS_PER_FILE, LABELS, LONG_ROWS,  # noqa: E402
                           NULL_TYPES, NULLS, TYPES, VALUES, hf_rows, long_tokens)


def column(name, values, type_text):
    if name == "category":  # as pandas' categoricals are stored
        return pa.array(values).dictionary_encode()
    if name == "f16":
        return pa.array(np.array(values, dtype=np.float16), pa.float16())
    return pa.array(values, eval(type_text))


def write(folder, jpeg_paths):
    table = pa.table({name: column(name, VALUES[name], TYPES[name]) for name in VALUES})
    for compression in COMPRESSIONS:
        pq.write_table(table, os.path.join(folder, f"types-{compression}.parquet"), compression=compression, row_group_size=7)
    pq.write_table(table, os.path.join(folder, "types-one-group.parquet"))
    long = pa.table({"id": pa.array(range(LONG_ROWS), pa.int64()), "tokens": pa.array([long_tokens(i) for i in range(LONG_ROWS)], pa.list_(pa.int64())),
                     "words": pa.array([[str(t) for t in long_tokens(i)] for i in range(LONG_ROWS)], pa.list_(pa.string()))})
    pq.write_table(long, os.path.join(folder, "long-group.parquet"), row_group_size=LONG_ROWS)
    nulls = pa.table({name: pa.array(values, eval(NULL_TYPES[name])) for name, values in NULLS.items()})
    # Groups of 3: a group whose text has a null and two words (its dictionary more than one word).
    pq.write_table(nulls, os.path.join(folder, "nulls.parquet"), row_group_size=3)
    jpegs = {os.path.basename(p): open(p, "rb").read() for p in jpeg_paths}
    rows = hf_rows(jpegs)
    features = {"image": {"_type": "Image"}, "text": {"dtype": "string", "_type": "Value"},
                "label": {"names": LABELS, "_type": "ClassLabel"}}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("text", pa.string()), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    os.makedirs(os.path.join(folder, "hf", "data"))
    for k in range(HF_FILES):
        part = rows[k * HF_ROWS_PER_FILE:(k + 1) * HF_ROWS_PER_FILE]
        pq.write_table(pa.Table.from_pylist(part, schema=schema),
                       os.path.join(folder, "hf", "data", f"train-{k:05d}-of-{HF_FILES:05d}.parquet"), row_group_size=4)


def jsonable(value):
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, np.floating):
        return float(value)
    return value


def write_groups(folder):
    """groups.parquet: GROUPS row groups of GROUP_ROWS int64 ids, and damaged-groups.parquet, the
    same with the header of row group DAMAGED_GROUP's first data page overwritten (Arrow cannot
    read that group, and reads the others)."""
    path = os.path.join(folder, "groups.parquet")
    pq.write_table(pa.table({"id": pa.array(range(GROUPS * GROUP_ROWS), pa.int64())}), path, row_group_size=GROUP_ROWS,
                   use_dictionary=False)
    data = bytearray(open(path, "rb").read())
    page = pq.ParquetFile(path).metadata.row_group(DAMAGED_GROUP).column(0).data_page_offset
    data[page:page + 16] = b"\xff" * 16
    with open(os.path.join(folder, "damaged-groups.parquet"), "wb") as f:
        f.write(bytes(data))


def read(out, files):
    result = {}
    for path in files:
        f = pq.ParquetFile(path)
        table = f.read()
        result[path] = {"schema": {field.name: str(field.type) for field in table.schema},
                        "row_groups": f.metadata.num_row_groups,
                        "compression": f.metadata.row_group(0).column(0).compression if f.metadata.num_row_groups else None,
                        "rows": jsonable(table.to_pylist())}
    with open(out, "w") as fp:
        json.dump(result, fp)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "write-huge":
        pq.write_table(pa.table({"big": pa.array([1, 2**64 - 1], pa.uint64())}), os.path.join(sys.argv[2], "huge.parquet"))
    elif sys.argv[1] == "write-groups":
        write_groups(sys.argv[2])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"oracle_parquet.py: no mode {sys.argv[1]!r}")
