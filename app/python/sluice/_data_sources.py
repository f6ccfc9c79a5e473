"""Data sources read at the places the caller chooses, shaped as the libraries their users come
from: Grain's (and array_record's) ArrayRecordDataSource, and Hugging Face's
load_dataset("parquet", ...). Both stand on a source of the plugins opened for reads by position
(_sluice.PositionedRecords): random_access, parquet_rows."""
import hashlib
import os
import re
import threading

import numpy

from . import _sluice


class _Records:
    """Records of several files (each a range of its records) as one sequence 0 .. len - 1,
    read through a source opened once, when first needed (after unpickling too)."""

    def __init__(self, op, params, ranges):
        self._op, self._params = op, params
        self._native = None
        self._lock = threading.Lock()
        self._ranges = ranges  # [(path, start, end or None)], filled in by _open(); None: every file whole

    def _open(self):
        with self._lock:
            if self._native is not None:
                return self._native
            native = _sluice.PositionedRecords(self._op, self._params)
            first, counts = {}, {}
            total = 0
            for where, begin, end in native.files():
                first[where], counts[where] = total, end - begin
                total += end - begin
            if self._ranges is None:  # every file whole, in order
                self._ends, self._bases = numpy.array([total], dtype=numpy.int64), numpy.zeros(1, dtype=numpy.int64)
                self._native = native
                return native
            ranges = []
            for path, start, end in self._ranges:
                if path not in counts:
                    raise ValueError(f"{path} does not name one file (read: {', '.join(counts)})")
                end = counts[path] if end is None else end
                if not 0 <= start <= end <= counts[path]:
                    raise ValueError(f"{path}[{start}:{end}] is outside its {counts[path]} records")
                ranges.append((path, start, end))
            self._ranges = ranges
            lengths = numpy.array([end - start for _, start, end in ranges], dtype=numpy.int64)
            self._ends = numpy.cumsum(lengths)
            self._bases = numpy.array([first[path] + start for path, start, _ in ranges], dtype=numpy.int64) - (self._ends - lengths)
            self._native = native
            return native

    def __len__(self):
        self._open()
        return int(self._ends[-1]) if len(self._ends) else 0

    def places(self, keys):
        """The source's places of these keys (0 <= key < len, checked by the caller)."""
        self._open()
        keys = numpy.asarray(keys, dtype=numpy.int64)
        return self._bases[numpy.searchsorted(self._ends, keys, side="right")] + keys

    def read_field(self, keys, field):
        return self._open().read_field(self.places(keys), field)

    def read(self, keys):
        return self._open().read(self.places(keys))

    def stored_fields(self):
        return self._open().stored_fields()

    def __getstate__(self):
        return {"op": self._op, "params": self._params, "ranges": self._ranges}

    def __setstate__(self, state):
        self.__init__(state["op"], state["params"], state["ranges"])


def _path_and_range(path):
    """A path as ArrayRecordDataSource takes one: a path, 'PATH[start:end]', or a FileInstruction
    (filename, skip, take)."""
    if hasattr(path, "filename") and hasattr(path, "skip") and hasattr(path, "take"):
        return os.fspath(path.filename), int(path.skip), int(path.skip) + int(path.take)
    path = os.fspath(path)
    m = re.fullmatch(r"(.*)\[(\d+):(\d+)\]", path)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(3))
    return path, 0, None


_GLOB = re.compile(r"[*?\[\]{}]")


class ArrayRecordDataSource:
    """The records of ArrayRecord files, read at the places asked, as Grain's
    ArrayRecordDataSource (array_record's) reads them: paths is a path, a 'PATH[start:end]' or a
    FileInstruction (filename, skip, take), or a sequence of them; record_key k is the k-th record
    of them all, file after file. len(source), source[k] (bytes), source.__getitems__(keys) (a
    list; Grain's batched read), iteration in order, pickling (the files are opened again where
    it is unpickled). Read through the random_access source: positioned reads of each record's
    chunk, every chunk's hash checked; files in remote storage (s3://, gs://, http(s)://) too."""

    def __init__(self, paths, reader_options=None):
        if isinstance(paths, (str, os.PathLike)) or hasattr(paths, "filename"):
            paths = [paths]
        elif isinstance(paths, (list, tuple)):
            if not paths:
                raise ValueError("Paths sequence can not be of 0 length")
        else:
            raise ValueError("Unsupported path format was used. Path format must be a Sequence, String, pathlib.Path or FileInstruction.")
        for key, value in (reader_options or {}).items():
            # (Sluice keeps every file's index in memory: both of array_record's choices read the same.)
            if key != "index_storage_option" or value not in ("in_memory", "offloaded"):
                raise ValueError(f"reader_options: {key}:{value} is not an option Sluice reads; it takes index_storage_option "
                                 "(in_memory or offloaded)")
        ranges = [_path_and_range(p) for p in paths]
        self._paths = [path for path, _, _ in ranges]
        files = list(dict.fromkeys(self._paths))
        for path in files:
            if _GLOB.search(path):
                raise ValueError(f"{path}: a path with wildcard characters (* ? [ ] {{ }}) is not read as one file; rename it")
        self._records = _Records("random_access", {"patterns": ",".join(files), "format": "array_record", "shuffle": "false"}, ranges)
        self._length = len(self._records)

    @property
    def paths(self):
        return self._paths

    def __len__(self):
        return self._length

    def __iter__(self):
        for start in range(0, self._length, 256):
            yield from self._records.read_field(numpy.arange(start, min(start + 256, self._length)), "record")

    def _key(self, record_key):
        key = record_key.__index__()
        if key < 0 or key >= self._length:
            raise ValueError("Record key should be in [0, num_records)")
        return key

    def __getitem__(self, record_key):
        return self._records.read_field([self._key(record_key)], "record")[0]

    def __getitems__(self, record_keys):
        return self._records.read_field([self._key(k) for k in record_keys], "record")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self._records = _Records(self._records._op, self._records._params, self._records._ranges)  # (files closed; opened again if read)

    def __repr__(self):
        h = hashlib.sha1()
        for p in self._paths:
            h.update(p.encode())
        return f"ArrayRecordDataSource(hash_of_paths={h.hexdigest()})"


def _tolist(value):
    return value.tolist() if type(value) is numpy.ndarray else value


def _from_stored(kind):
    """How a field's value becomes the Python value Hugging Face's datasets gives for its Arrow
    type (its default, "python" format)."""
    import datetime
    if kind in ("string", "large_string", "string_view"):
        return lambda v: v.decode("utf-8")
    if kind.startswith(("binary", "large_binary", "fixed_size_binary")):
        return bytes
    if kind == "bool":
        return lambda v: bool(v)
    if kind.startswith("date32"):
        epoch = datetime.date(1970, 1, 1)
        return lambda v: epoch + datetime.timedelta(days=int(v))
    m = re.fullmatch(r"timestamp\[(s|ms|us)(?:, tz=(UTC|\+00:00))?\]", kind)
    if m:
        scale = {"s": 1_000_000, "ms": 1_000, "us": 1}[m.group(1)]
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc if m.group(2) else None)
        return lambda v: epoch + datetime.timedelta(microseconds=int(v) * scale)
    if kind.startswith(("list", "large_list", "fixed_size_list")) and re.search(r"\b(large_)?string\b", kind):
        def texts(v):
            return [texts(x) if isinstance(x, (list, numpy.ndarray)) and not isinstance(x, (bytes, str)) else x.decode("utf-8") for x in v]
        return texts
    return _tolist


class ParquetDataSource:
    """The rows of Parquet files read at the places asked, as Hugging Face's datasets gives the
    rows of load_dataset("parquet", ...): len(ds), ds[i] (a dict: a column per key, structs as
    dicts, lists as lists, text as str, binary as bytes), ds[i:j], ds[[i, j]] (a dict of lists),
    ds["column"] (its values), iteration, column_names, num_rows. Read through the parquet_rows
    source: a row's whole row group is read once and kept for the next reads (cache_bytes)."""

    def __init__(self, files, columns=None, split="train", cache_bytes=None, _records=None):
        self.split = split
        if _records is not None:
            self._records = _records
        else:
            params = {"patterns": ",".join(files)}
            if columns is not None:
                params["columns"] = ",".join([columns] if isinstance(columns, str) else columns)
            if cache_bytes is not None:
                params["cache_bytes"] = str(int(cache_bytes))
            self._records = _Records("parquet_rows", params, None)
        self._stored = self._records.stored_fields()
        # Per field, once: where its value goes in a row (a struct's members nested) and how it
        # becomes a Python value.
        self._plan = [(name, name.split("/")[:-1], name.split("/")[-1], _from_stored(kind)) for name, kind in self._stored]
        self.column_names = list(dict.fromkeys(name.split("/")[0] for name, _ in self._stored))
        self._rows = range(len(self._records))

    @property
    def num_rows(self):
        return len(self._rows)

    def __len__(self):
        return len(self._rows)

    def _row(self, fields):
        row = {}
        for name, outer, last, convert in self._plan:
            place = row
            for part in outer:
                place = place.setdefault(part, {})
            place[last] = convert(fields[name])
        return row

    def _read(self, keys):
        return [self._row(f) for f in self._records.read([self._rows[k] for k in keys])]

    def _index(self, key):
        n = len(self._rows)
        if not -n <= key < n:
            raise IndexError(f"Invalid key: {key} is out of bounds for size {n}")
        return key % n

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self.column_names:
                raise ValueError(f"Column '{key}' doesn't exist.")
            return [row[key] for row in self]
        if isinstance(key, slice):
            return self._columns(self._read(range(*key.indices(len(self._rows)))))
        if isinstance(key, (list, tuple, numpy.ndarray, range)):
            return self._columns(self._read([self._index(int(k)) for k in key]))
        return self._read([self._index(key.__index__())])[0]

    def _columns(self, rows):
        return {name: [row[name] for row in rows] for name in self.column_names}

    def __getitems__(self, keys):
        return self._read([self._index(int(k)) for k in keys])

    def __iter__(self):
        for start in range(0, len(self._rows), 256):
            yield from self._read(range(start, min(start + 256, len(self._rows))))

    def select(self, indices):
        """The rows at these places, as datasets' Dataset.select."""
        out = ParquetDataSource(None, split=self.split, _records=self._records)
        out._rows = [self._rows[self._index(int(k))] for k in indices]
        return out

    def __getstate__(self):  # (a DataLoader's worker processes receive it pickled)
        return {"split": self.split, "records": self._records, "rows": self._rows}

    def __setstate__(self, state):
        self.__init__(None, split=state["split"], _records=state["records"])
        self._rows = state["rows"]

    def __repr__(self):
        return f"Dataset({{\n    features: {self.column_names},\n    num_rows: {self.num_rows}\n}})"


class DatasetDict(dict):
    """Splits by name, as datasets' DatasetDict."""

    def __repr__(self):
        inner = ",\n".join(f"    {name}: " + repr(ds).replace("\n", "\n    ") for name, ds in self.items())
        return f"DatasetDict({{\n{inner}\n}})"


def _files_of(data_files):
    if isinstance(data_files, (str, os.PathLike)):
        return [os.fspath(data_files)]
    return [os.fspath(f) for f in data_files]


def load_dataset(path, name=None, data_dir=None, data_files=None, split=None, *, columns=None, cache_bytes=None):
    """Parquet files as Hugging Face's load_dataset("parquet", data_files=...) loads them: a
    DatasetDict of splits (data_files a path, a glob or a list: split "train"; a dict: its
    splits), or with split="train" (or "train[:1000]", "train[10%:20%]") that split's rows as a
    ParquetDataSource. Nothing is converted or copied first: rows are read from the files when
    asked for. columns= reads only those."""
    if path != "parquet":
        raise ValueError(f"sluice.data.load_dataset reads Parquet files (load_dataset(\"parquet\", data_files=...)), not '{path}': "
                         "for TFDS datasets use sluice.data.tfds, for other files the readers of sluice.data")
    if name is not None:
        raise ValueError("load_dataset(\"parquet\") takes no config name")
    if data_files is None:
        raise ValueError("load_dataset(\"parquet\") needs data_files: a path, a glob, a list of them, or a dict of splits")
    splits = {str(k): v for k, v in data_files.items()} if isinstance(data_files, dict) else {"train": data_files}
    if data_dir is not None:
        splits = {k: [f if os.path.isabs(f) or "://" in f else os.path.join(data_dir, f) for f in _files_of(v)] for k, v in splits.items()}
    if split is None:
        return DatasetDict({k: ParquetDataSource(_files_of(v), columns, k, cache_bytes) for k, v in splits.items()})
    m = re.fullmatch(r"(\w+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?", str(split))
    if not m:
        raise ValueError(f"split '{split}': Sluice reads NAME, NAME[start:end] and NAME[start%:end%]")
    if m.group(1) not in splits:
        raise ValueError(f"Unknown split \"{m.group(1)}\". Should be one of {list(splits)}.")
    ds = ParquetDataSource(_files_of(splits[m.group(1)]), columns, m.group(1), cache_bytes)
    if m.group(0) == m.group(1):
        return ds

    def bound(text, default):
        if text is None:
            return default
        return round(len(ds) * int(text[:-1]) / 100) if text.endswith("%") else int(text)
    return ds.select(range(len(ds))[slice(bound(m.group(2), 0), bound(m.group(3), len(ds)))])
