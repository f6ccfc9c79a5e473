"""The Parquet cases, shared by the oracle (pyarrow, in the peers environment) and the tests
(Sluice's Python, without pyarrow): the values of each column as Python data, the pyarrow type the
oracle writes them with, and the values Sluice gives for them (numbers in the nearest Sluice type,
strings as bytes, structs flattened as "a/b")."""
import random

ROWS = 50
COMPRESSIONS = ["snappy", "zstd", "gzip", "none"]
# groups.parquet: row groups read in order, one of them damaged in its copy.
GROUPS, GROUP_ROWS, DAMAGED_GROUP = 6, 1000, 3


def _values():
    rng = random.Random(66)
    text = ["", "a", "Grüße", "数据", "x" * 300, "line\nbreak"]
    return {
        "i8": [rng.randint(-128, 127) for _ in range(ROWS)],
        "i16": [rng.randint(-2**15, 2**15 - 1) for _ in range(ROWS)],
        "i32": [rng.randint(-2**31, 2**31 - 1) for _ in range(ROWS)],
        "i64": [rng.randint(-2**63, 2**63 - 1) for _ in range(ROWS)],
        "u8": [rng.randint(0, 255) for _ in range(ROWS)],
        "u16": [rng.randint(0, 2**16 - 1) for _ in range(ROWS)],
        "u32": [rng.randint(0, 2**32 - 1) for _ in range(ROWS)],
        "u64": [rng.randint(0, 2**63 - 1) for _ in range(ROWS)],
        "f16": [rng.choice([0.0, 0.5, -1.25, 2048.0, 0.0999755859375]) for _ in range(ROWS)],
        "f32": [rng.randint(-10**6, 10**6) / 8 for _ in range(ROWS)],
        "f64": [rng.uniform(-1e300, 1e300) for _ in range(ROWS)],
        "flag": [rng.random() < 0.5 for _ in range(ROWS)],
        "text": [rng.choice(text) for _ in range(ROWS)],
        "blob": [bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))) for _ in range(ROWS)],
        "large_text": [rng.choice(text) for _ in range(ROWS)],
        "fixed_blob": [bytes(rng.randrange(256) for _ in range(4)) for _ in range(ROWS)],
        "day": [rng.randint(-20000, 30000) for _ in range(ROWS)],
        "when": [rng.randint(0, 2**50) for _ in range(ROWS)],
        "vector": [[rng.randint(-100, 100) / 4 for _ in range(3)] for _ in range(ROWS)],
        "matrix": [[[rng.randint(-9, 9) for _ in range(2)] for _ in range(3)] for _ in range(ROWS)],
        "tokens": [[rng.randint(0, 30000) for _ in range(rng.randint(0, 6))] for _ in range(ROWS)],
        "words": [[rng.choice(text) for _ in range(rng.randint(0, 3))] for _ in range(ROWS)],
        "boxes": [[[rng.randint(0, 64) / 2, rng.randint(0, 64) / 2] for _ in range(rng.randint(0, 4))] for _ in range(ROWS)],
        "meta": [{"id": rng.randint(0, 99), "source": {"name": rng.choice(text), "tags": [rng.randint(-5, 5) for _ in range(rng.randint(0, 3))]}}
                 for _ in range(ROWS)],
        "category": [rng.choice(["cat", "dog", "bird"]) for _ in range(ROWS)],
    }


VALUES = _values()

# The pyarrow type of each column (evaluated by the oracle with `pa` in scope).
TYPES = {
    "i8": "pa.int8()", "i16": "pa.int16()", "i32": "pa.int32()", "i64": "pa.int64()",
    "u8": "pa.uint8()", "u16": "pa.uint16()", "u32": "pa.uint32()", "u64": "pa.uint64()",
    "f16": "pa.float16()", "f32": "pa.float32()", "f64": "pa.float64()", "flag": "pa.bool_()",
    "text": "pa.string()", "blob": "pa.binary()", "large_text": "pa.large_string()", "fixed_blob": "pa.binary(4)",
    "day": "pa.date32()", "when": "pa.timestamp('us')",
    "vector": "pa.list_(pa.float32(), 3)", "matrix": "pa.list_(pa.list_(pa.int32(), 2), 3)",
    "tokens": "pa.list_(pa.int64())", "words": "pa.list_(pa.string())", "boxes": "pa.list_(pa.list_(pa.float32(), 2))",
    "meta": "pa.struct([('id', pa.int32()), ('source', pa.struct([('name', pa.string()), ('tags', pa.list_(pa.int16()))]))])",
    "category": "pa.dictionary(pa.int32(), pa.string())",
}

# The NumPy dtype Sluice gives each column's values in (strings: bytes).
DTYPES = {
    "i8": "int16", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "int32", "u32": "int64", "u64": "int64",
    "f16": "float16", "f32": "float32", "f64": "float64", "flag": "uint8", "day": "int32", "when": "int64",
    "vector": "float32", "matrix": "int32", "tokens": "int64", "boxes": "float32", "meta/id": "int32", "meta/source/tags": "int16",
}


def _as_sluice(value):
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list):
        return [_as_sluice(v) for v in value]
    return value


def _flatten(name, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{name}/{k}", v, out)
    else:
        out[name] = _as_sluice(value)


def expected_rows(columns=None):
    """Each row as Sluice gives it: {field: value} with structs flattened, strings as bytes."""
    names = columns or list(VALUES)
    rows = []
    for r in range(ROWS):
        row = {}
        for name in names:
            _flatten(name, VALUES[name][r], row)
        rows.append(row)
    return rows


def as_python(element):
    """A Sluice element ({field: numpy array or bytes}) as plain Python values, with each
    numeric field's dtype checked against DTYPES."""
    out = {}
    for name, value in element.items():
        if isinstance(value, bytes):
            out[name] = value
            continue
        if name in DTYPES:
            assert str(value.dtype) == DTYPES[name], f"{name}: {value.dtype}, expected {DTYPES[name]}"
        out[name] = value.tolist() if value.dtype != object else [bytes(v) for v in value]
    return out


# A row group longer than the reader converts at once (8,192 rows): its later slices' lists start
# past the group's first value.
LONG_ROWS = 20000


def long_tokens(i):
    return [i * 7 + k for k in range(i % 5)]


# Nulls: a column of each kind with some rows null.
NULLS = {
    "count": [1, None, 3, None, 5],
    "name": ["a", None, "c", "d", None],
    "scores": [[1, 2], None, [], [3], None],
    "where": [{"x": 1}, {"x": 2}, None, {"x": 4}, {"x": 5}],
}
NULL_TYPES = {"count": "pa.int64()", "name": "pa.string()", "scores": "pa.list_(pa.int64())", "where": "pa.struct([('x', pa.int32())])"}

# A dataset as Hugging Face exports one (data/train-0000K-of-00003.parquet): images as
# {bytes, path} structs, text, a class label.
HF_FILES = 3
HF_ROWS_PER_FILE = 9
LABELS = ["cat", "dog", "bird"]


def hf_rows(jpegs):
    """The rows of the dataset, given the JPEG files' bytes (name -> bytes)."""
    names = sorted(jpegs)
    rows = []
    for i in range(HF_FILES * HF_ROWS_PER_FILE):
        name = names[i % len(names)]
        rows.append({"image": {"bytes": jpegs[name], "path": name}, "text": f"picture {i}: {name}", "label": i % len(LABELS)})
    return rows
