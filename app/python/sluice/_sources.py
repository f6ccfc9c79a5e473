"""tf.data's sources: from_generator, from_tensor_slices, from_tensors, list_files, range,
TFRecordDataset, TextLineDataset, and the stand-ins interleave's and flat_map's functions read."""
import builtins
import inspect
import os


from . import AUTOTUNE
from ._structure import Structure as _Structure, TensorSpec
from ._structure import as_tensors as _as_tensors, cast_to_spec as _cast_to_spec
from ._dataset import Dataset
from ._ops import _Held, _schemas, _split_arguments, _tf_data_call, _unknown_operator


def from_generator(generator, output_types=None, output_shapes=None, args=None, output_signature=None, name=None, *,
                   buffer_size=None, error_policy=None):
    """Elements from a Python generator function (called again, with `args`, for each pass) or
    an iterable, as tf.data's from_generator: with output_signature (a TensorSpec, or a tuple or
    dict of them) each value is converted to its spec's dtype and the elements keep that
    structure; without it each element is a dict of fields or one value."""
    if output_types is not None or output_shapes is not None:
        raise TypeError("from_generator(): output_types and output_shapes are deprecated in tf.data and not taken here; "
                        "give output_signature=sluice.data.TensorSpec(shape, dtype) (or a tuple or dict of them)")
    arguments = tuple(args or ())

    def values():
        return generator(*arguments) if callable(generator) else iter(generator)

    structure = _Structure("value")
    elements = values if arguments else generator
    if output_signature is not None:
        specs, structure = _Structure.of(output_signature)
        for spec in specs.values():
            if not isinstance(spec, TensorSpec):
                raise TypeError(f"from_generator(): output_signature holds {spec!r}, not a sluice.data.TensorSpec")

        def elements():
            for value in values():
                try:
                    fields = structure.fields_of(value)
                except (TypeError, KeyError, IndexError) as e:
                    raise ValueError(f"from_generator(): the generator yielded {value!r}, whose structure is not output_signature's "
                                     f"({output_signature!r})") from e
                yield {k: _cast_to_spec(v, specs[k]) for k, v in fields.items()}

    held = _Held(elements, named_by=generator)
    dataset = Dataset()._with_stage("python_generator", {"function": held.handle},
                                    {"buffer_size": buffer_size, "error_policy": error_policy, "name": name}, [held])
    dataset._structure = structure
    return dataset


def from_tensor_slices(arrays, *, name=None):
    """Element i is row i of every array of `arrays`, over the arrays' own memory (tf.data's
    from_tensor_slices): one array (a list is one, converted as tf.data converts it: ints to
    int32, floats to float32), a dict of name -> array, or a tuple (or nested dicts) of them,
    whose elements keep that structure: from_tensor_slices((images, labels)) gives
    (image, label) pairs, and `for images, labels in ds.batch(32)` works."""
    fields, structure = _Structure.of(_as_tensors(arrays))
    # NumPy's fixed-width text ('<U30', '|S8') goes in as text, one str or bytes per row.
    def text_as_rows(value):
        is_text = getattr(getattr(value, "dtype", None), "kind", "") in ("U", "S") and getattr(value, "ndim", 0) == 1
        return value.tolist() if is_text else value

    arrays = {k: text_as_rows(v) for k, v in fields.items()}
    held = _Held(dict(arrays))
    dataset = Dataset()._with_stage("python_tensor_slices", {"tensors": held.handle}, {"name": name}, [held])
    dataset._structure = structure
    rows = {len(a) for a in arrays.values() if hasattr(a, "__len__")}
    if len(rows) == 1:  # for cardinality(); the source itself refuses arrays of different lengths
        dataset._stages[-1] = dict(dataset._stages[-1], _rows=rows.pop())
    return dataset


def list_files(file_pattern=None, shuffle=None, seed=None, *, name=None, **kwargs):
    """The files matching file_pattern (a glob, or a list of them; '**' for any depth) as
    elements with a field 'path', shuffled with the pipeline's seed (or `seed`) and again each
    epoch unless shuffle=False, as tf.data's list_files. patterns= is the same argument."""
    if file_pattern is not None:
        if "patterns" in kwargs:
            raise TypeError("list_files() got both file_pattern and patterns=; they are the same parameter")
        kwargs["patterns"] = [os.fspath(p) for p in file_pattern] if isinstance(file_pattern, (list, tuple)) else os.fspath(file_pattern)
    return _picking(_source("list_files", dict(kwargs, shuffle=shuffle, seed=seed, name=name)), "path")


def range(*args, count=None, start=None, step=None, name=None, **kwargs):
    """int64 scalars (field 'value'): range(stop), range(start, stop) and range(start, stop, step)
    as tf.data's (and Python's) range; or count=, start=, step= as the operator's parameters."""
    if args:
        if count is not None or start is not None:
            raise TypeError("range() takes either positional (start, stop, step) or count=/start=, not both")
        if len(args) > 3:
            raise TypeError(f"range() takes at most 3 positional arguments (start, stop, step), got {len(args)}")
        first, stop, every = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if every == 0:
            raise ValueError("range(): step must not be zero")
        count = max(0, -((first - stop) // every)) if every > 0 else max(0, -((stop - first) // -every))
        start, step = (first if first != 0 else None), (every if every != 1 else None)  # defaults stay unwritten
    dataset = _source("range", dict(kwargs, count=count, start=start, step=step, name=name))
    dataset._structure = _Structure("value")  # int64 scalars, as tf.data's
    return dataset


_COMPRESSION_TYPES = {None: None, "": "none", "GZIP": "gzip", "ZLIB": "zlib"}


def _file_reader(method, op, filenames, compression_type, buffer_size, num_parallel_reads, extra):
    """A reader over `filenames` (a path, a list of paths, or a dataset of 'path' elements) in
    their order, as tf.data's TFRecordDataset and TextLineDataset: num_parallel_reads files read
    at once, interleaved one element at a time."""
    if compression_type not in _COMPRESSION_TYPES:
        raise ValueError(f"{method}(): compression_type is None, \"\", \"GZIP\" or \"ZLIB\", not {compression_type!r}")
    if isinstance(filenames, _Input):
        files = None  # inside interleave()'s function: the reader of one input, placed by interleave()
        if filenames._position is not None:  # one item of a tuple: its field
            template = filenames._structure.template if filenames._structure is not None else None
            item = template[filenames._position] if isinstance(template, tuple) else str(filenames._position)
            if not isinstance(item, str):
                raise TypeError(f"{method}(): item {filenames._position} of the input is a structure, not file names")
            extra = dict(extra, field=item)
    elif isinstance(filenames, Dataset):
        files = filenames
    else:
        paths = [os.fspath(f) for f in filenames] if isinstance(filenames, (list, tuple)) else [os.fspath(filenames)]
        if not paths:
            raise ValueError(f"{method}(): filenames is empty")
        files = list_files(paths, shuffle=False)
    params = dict(extra)
    if _COMPRESSION_TYPES[compression_type] is not None:
        params["compression"] = _COMPRESSION_TYPES[compression_type]
    if buffer_size is not None and op in ("tfrecord_reader", "array_record_reader"):
        params["buffer_bytes"] = max(4096, int(buffer_size))
    if num_parallel_reads is not None and num_parallel_reads != 1:
        cycle = (os.cpu_count() or 1) if num_parallel_reads == AUTOTUNE else int(num_parallel_reads)
        params["interleave"] = dict(cycle_length=cycle, block_length=1)
        params["parallelism"] = num_parallel_reads
    if files is None:
        reader = Dataset()._with_stage(op, *_split_arguments(_schemas()[op], params))
        reader._stages[0] = dict(reader._stages[0], _reads_the_input=True)
        return reader
    return getattr(files, op)(**params)


class _Input:
    """What interleave() and flat_map() give their function: one input of the dataset (or, when
    its elements are tuples and the function takes their items, one item), which the function may
    only hand to TFRecordDataset, TextLineDataset or Dataset.from_tensors (the reader is built
    once, when the pipeline is, and reads every input). Anything that looks at its value is
    refused."""

    def __init__(self, structure=None, position=None):
        self._structure = structure  # the outer dataset's, for what from_tensors(x) gives
        self._position = position    # the tuple item it stands for; None: the whole element

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("interleave()/flat_map(): the function looked at its input's value; it may only pass it to "
                        "sluice.data.TFRecordDataset(f), TextLineDataset(f) or Dataset.from_tensors(x) and chain stages "
                        "after that. Compute file names before (a map on the list), or write the reader and "
                        "per_input=True stages yourself")

    __getattr__ = __add__ = __radd__ = __getitem__ = __iter__ = __len__ = __fspath__ = __str__ = __format__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __int__ = __float__ = __index__ = _refuse
    __mul__ = __rmul__ = __sub__ = __rsub__ = __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __pow__ = _refuse
    __matmul__ = __neg__ = __abs__ = __and__ = __or__ = __contains__ = __call__ = __array__ = _refuse
    __hash__ = None


class _WindowStandIn:
    """What flat_map() after window() gives its function: a window, whose batch(n) for n at least
    the window's size is the stacked window Sluice's window stage makes."""
    WHOLE = object()

    def __init__(self, size):
        self._size = size

    def batch(self, batch_size, drop_remainder=False, *_args, **_kwargs):
        return self.WHOLE if int(batch_size) >= self._size and not drop_remainder else None


def _stand_ins(map_func, structure):
    """The arguments interleave() calls its function with: one stand-in for the element, or, as
    tf.data unpacks a tuple into the function's arguments, one per item when the function takes
    more than one (lambda x, y, z: ...). The items are counted from the structure when it is
    known, else from the function's parameters (a map's result is known only when it runs)."""
    template = structure.template if structure is not None else None
    if isinstance(template, tuple):
        count = len(template)
    else:
        try:
            parameters = inspect.signature(map_func).parameters.values()
        except (TypeError, ValueError):
            return [_Input(structure)]
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        count = len(positional)
        if count <= 1:
            return [_Input(structure)]
    if count == 1:
        return [_Input(structure)]
    return [_Input(structure, i) for i in builtins.range(count)]


def _whole_input(tensors):
    """The stand-in of interleave()'s function when `tensors` is its whole element (x, or the
    items (x, y, z) in the order the function received them); None when no stand-in is in it."""
    refusal = ("from_tensors(): inside interleave()/flat_map() it takes the function's arguments whole and in order, "
               "as from_tensors((x, y, z)); rearrange the items with a map() before the interleave")
    if isinstance(tensors, _Input):
        if tensors._position is not None:
            raise TypeError(refusal)
        return tensors
    if isinstance(tensors, (tuple, list)) and any(isinstance(t, _Input) for t in tensors):
        if [getattr(t, "_position", None) if isinstance(t, _Input) else None for t in tensors] != list(builtins.range(len(tensors))):
            raise TypeError(refusal)
        return tensors[0]
    return None


def from_tensors(tensors, *, name=None):
    """A dataset of one element, `tensors` (tf.data's from_tensors): an array, or a tuple or dict
    of them. Inside interleave()'s or flat_map()'s function, from_tensors(x).repeat(k) of the
    function's input gives each input k times in a row (the repeat_each stage), as tf.data's
    interleave(lambda *x: from_tensors(x).repeat(k)) does."""
    whole = _whole_input(tensors)
    if whole is not None:
        reader = Dataset(structure=whole._structure)._with_stage("repeat_each", {"count": 1}, {"name": name})
        reader._stages[0] = dict(reader._stages[0], _reads_the_input=True)
        return reader
    import numpy

    def one_row(value):  # as tf.data: tuples and dicts are structure, a list is one array
        if isinstance(value, tuple):
            return tuple(one_row(v) for v in value)
        if isinstance(value, dict):
            return {k: one_row(v) for k, v in value.items()}
        return numpy.asarray(value)[numpy.newaxis]

    return from_tensor_slices(one_row(tensors), name=name)


def TFRecordDataset(filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, *, name=None):
    """The records of TFRecord files (field 'record', with 'path', 'index', 'offset'), as
    tf.data.TFRecordDataset: filenames is a path, a list of paths or a dataset of paths
    (list_files); compression_type None detects gzip and zlib."""
    return _picking(_file_reader("TFRecordDataset", "tfrecord_reader", filenames, compression_type, buffer_size, num_parallel_reads,
                                 {"name": name}), "record")


def ArrayRecordDataset(filenames, buffer_size=None, num_parallel_reads=None, *, name=None):
    """The records of ArrayRecord files (Grain's and TFDS's format; field 'record', with 'path',
    'index', 'offset'), as TFRecordDataset gives TFRecord's: filenames is a path, a list of paths
    or a dataset of paths, read in their order (num_parallel_reads at once). For reads at random,
    sluice.data.random_access(patterns=...) over the same files."""
    return _picking(_file_reader("ArrayRecordDataset", "array_record_reader", filenames, None, buffer_size, num_parallel_reads,
                                 {"name": name}), "record")


def ParquetDataset(filenames, columns=None, num_parallel_reads=None, *, nulls=None, null_defaults=None, name=None):
    """The rows of Parquet files, one element per row: a dict with a field per column (a struct's
    members as 'a/b'; lists of fixed size as arrays, of varying length as 1-D arrays of their own
    length), as Hugging Face's load_dataset("parquet", data_files=...) gives its rows. filenames is
    a path, a list of paths or a dataset of paths, read in their order (num_parallel_reads at
    once); columns reads only those. A null is refused, naming file, column and row, unless
    nulls="default": then it becomes null_defaults' value for its field ({"label": -1}), else 0,
    b"" or an empty array."""
    extra = {"name": name}
    if columns is not None:
        extra["columns"] = [columns] if isinstance(columns, str) else list(columns)
    if nulls is not None:
        extra["nulls"] = nulls
    if null_defaults is not None:
        extra["null_defaults"] = [f"{k}={v}" for k, v in dict(null_defaults).items()]
    return _file_reader("ParquetDataset", "parquet_reader", filenames, None, None, num_parallel_reads, extra)


def TextLineDataset(filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, *, name=None):
    """The lines of text files (field 'line', without its line end), as tf.data.TextLineDataset."""
    return _picking(_file_reader("TextLineDataset", "text_lines", filenames, compression_type, buffer_size, num_parallel_reads,
                                 {"name": name}), "line")


def _picking(dataset, field):
    """The dataset with tf.data's elements, `field` alone (a scalar string), until a stage makes
    other fields of them; its stages still see every field (the file, the record's index)."""
    dataset._structure = _Structure(field, select=True)
    return dataset


def _source(op, kwargs):
    schema = _schemas().get(op)
    if schema is None:
        raise _unknown_operator(op, "source")
    return Dataset()._with_stage(op, *_split_arguments(schema, _tf_data_call(op, (), kwargs)))
