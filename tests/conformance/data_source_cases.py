"""What test_data_sources.py asks of a data source, the same in both interpreters: the reads of
Grain's ArrayRecordDataSource and of Hugging Face's load_dataset("parquet") shapes, and how their
answers are written down (bytes as hex, dates as ISO text) to compare them as JSON."""
import datetime

# Record keys of the array-record cases' 311 records: first, last, in between, repeated, backwards.
GRAIN_KEYS = [0, 310, 10, 10, 5, 299, 1, 0, 200, 150]
# Row keys of a 50-row table: single rows (negative ones too), slices, lists.
HF_ROWS = [0, 49, -1, -50, 7, 8, 13, 14]
HF_SLICES = [(0, 3), (5, 20), (45, 60), (-3, None), (10, 10)]
HF_LISTS = [[3, 1, 49, 0], [], [6, 6, 6]]
HF_SPLITS = ["train", "train[:5]", "train[10:20]", "train[-4:]", "train[10%:30%]"]


def jsonable(value):
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, (datetime.date, datetime.datetime)):
        return {"iso": value.isoformat()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):  # a NumPy scalar
        return jsonable(value.item())
    return value


def grain_reads(source, first_path, hexdigest):
    """What the Grain-shaped tests read of `source` (a data source over the cases' files)."""
    out = {"len": len(source), "items": [hexdigest(source[k]) for k in GRAIN_KEYS],
           "getitems": [hexdigest(r) for r in source.__getitems__(GRAIN_KEYS)],
           "all": [hexdigest(r) for r in source], "repr": repr(source)}
    for bad in (len(source), -1):
        try:
            source[bad]
            out[f"key {bad}"] = "read"
        except Exception as e:  # noqa: BLE001 (the kind of error is what is compared)
            out[f"key {bad}"] = f"{type(e).__name__}: {e}"
    return out


def hf_reads(ds):
    """What the Hugging Face-shaped tests read of a split."""
    out = {"len": len(ds), "num_rows": ds.num_rows, "column_names": list(ds.column_names),
           "rows": [jsonable(ds[k]) for k in HF_ROWS if -len(ds) <= k < len(ds)],
           "slices": [jsonable(ds[a:b]) for a, b in HF_SLICES],
           "lists": [jsonable(ds[[k for k in keys if k < len(ds)]]) for keys in HF_LISTS],
           "first_column": jsonable(list(ds[ds.column_names[0]])),
           "iterated": jsonable(list(ds))}
    for bad in (len(ds), -len(ds) - 1, "no_such_column"):
        try:
            ds[bad]
            out[f"key {bad}"] = "read"
        except Exception as e:  # noqa: BLE001
            out[f"key {bad}"] = f"{type(e).__name__}: {e}"
    return out
