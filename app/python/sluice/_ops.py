"""sluice.data's plumbing: the operators' schemas, tf.data's argument names and positions, the
checks of each call's parameters, and what the Dataset methods share (cardinality, padding
values, Python objects held for the engine)."""
import builtins
import functools
import hashlib
import os
import shutil
import tempfile
import types
import weakref

import numpy

from . import AUTOTUNE, SpecError, _param_text, _sluice
from ._structure import Structure as _Structure


_ENGINE_ARGUMENTS = ("parallelism", "buffer_size", "error_policy", "interleave", "output_buffer", "name", "per_input",
                     "deterministic")


# tf.data's methods that have an operator of the same name: their positional arguments, in
# tf.data's order (the names are tf.data's; _TF_DATA_NAMES maps those the operator calls otherwise).
_TF_DATA_POSITIONAL = {
    "shuffle": ("buffer_size", "seed", "reshuffle_each_iteration"),
    "batch": ("batch_size", "drop_remainder", "num_parallel_calls", "deterministic"),
    "padded_batch": ("batch_size", "padded_shapes", "padding_values", "drop_remainder"),
    "ragged_batch": ("batch_size", "drop_remainder"),
    "repeat": ("count",),
    "take": ("count",),
    "skip": ("count",),
    "shard": ("num_shards", "index"),
    "prefetch": ("buffer_size",),
    "window": ("size", "shift", "stride", "drop_remainder"),
    "unbatch": (),
    "bucket_by_sequence_length": ("element_length_func", "bucket_boundaries", "bucket_batch_sizes", "padded_shapes", "padding_values",
                                  "pad_to_bucket_boundary", "no_padding", "drop_remainder"),
}


# The operators whose elements have their input's fields (a structure that picks some of them
# still holds after them).
_KEEPS_FIELDS = {"shuffle", "batch", "padded_batch", "ragged_batch", "repeat", "take", "skip", "shard", "prefetch", "cache", "unbatch",
                 "window", "balanced_shard", "filter_random", "python_filter", "identity"}


_TF_DATA_NAMES = {
    "bucket_by_sequence_length": {"element_length_func": "length_field", "bucket_boundaries": "boundaries",
                                  "bucket_batch_sizes": "batch_sizes"},
}


# tf.data's arguments whose value Sluice cannot take as tf.data does, and what to write instead.
_TF_DATA_INSTEAD = {
    ("bucket_by_sequence_length", "element_length_func"):
        "name the field whose length decides the bucket instead of a function: element_length_func=\"tokens\"",
    ("bucket_by_sequence_length", "no_padding"): "use ragged_batch for batches without padding",
}


def _is_remote_uri(path):
    """s3://, gs://, http:// and https:// name remote objects (read through the engine's storage)."""
    return path.startswith(("s3://", "gs://", "http://", "https://"))


def _tf_data_call(method, args, kwargs):
    """The keyword arguments of a call written as tf.data writes it: positional arguments named in
    tf.data's order, tf.data's names turned into the operator's and the stage's, tf.data's None
    (the default) left out, AUTOTUNE where tf.data takes it."""
    names = _TF_DATA_POSITIONAL.get(method)
    if args:
        if names is None:
            raise TypeError(f"{method}() takes its parameters by name, as {method}(name=value); "
                            f"help(ds.{method}) lists them")
        if len(args) > len(names):
            raise TypeError(f"{method}() takes at most {len(names)} positional arguments ({', '.join(names)}), "
                            f"got {len(args)}")
        for name, value in builtins.zip(names, args):
            if name in kwargs:
                raise TypeError(f"{method}() got multiple values for argument '{name}'")
            kwargs[name] = value
    for name, value in list(kwargs.items()):
        if (method, name) in _TF_DATA_INSTEAD and (callable(value) or value is True):
            raise TypeError(f"{method}(): {name}={value!r} cannot be taken here: {_TF_DATA_INSTEAD[(method, name)]}")
    for tf_name, own in _TF_DATA_NAMES.get(method, {}).items():
        if tf_name in kwargs:
            if own in kwargs:
                raise TypeError(f"{method}() got both {tf_name}= and {own}=; they are the same parameter")
            kwargs[own] = kwargs.pop(tf_name)
    if "num_parallel_calls" in kwargs:
        if kwargs.get("parallelism") is not None:
            raise TypeError(f"{method}() got both num_parallel_calls= and parallelism=; they are the same setting")
        calls = kwargs.pop("num_parallel_calls")
        schema = _schemas().get(method)
        if schema and schema["kind"] == "aggregate":
            own = {p["name"] for p in schema["params"]}
            if not _sluice.takes_workers(method, {k: _param_text(v) for k, v in kwargs.items() if k in own and v is not None}):
                # An aggregate that assembles on its own thread (batch: its copies are made where
                # the rows are built, by the map before it): there is nothing to run in parallel.
                calls = None
            elif calls == AUTOTUNE:
                # The engine does not tune an aggregate's assembly threads: one per core, helpers
                # woken only when the stage's thread has work for them.
                calls = os.cpu_count() or 1
        kwargs["parallelism"] = calls
    if method == "prefetch" and kwargs.get("buffer_size") == AUTOTUNE:
        # prefetch(AUTOTUNE): the stage's buffer is tuned while the pipeline runs.
        del kwargs["buffer_size"]
        kwargs["output_buffer"] = AUTOTUNE
    if method == "bucket_by_sequence_length" and kwargs.get("no_padding") is False:
        del kwargs["no_padding"]
    return {k: v for k, v in kwargs.items() if v is not None}


def _split_arguments(schema, kwargs):
    """(operator parameters, engine settings). An operator's own parameter wins over the engine's
    name (shuffle's and prefetch's buffer_size); output_buffer= always sets the stage's buffer."""
    own = {p["name"] for p in schema["params"]}
    engine = {k: kwargs.pop(k) for k in _ENGINE_ARGUMENTS if k in kwargs and k not in own}
    if "output_buffer" in engine:
        engine["buffer_size"] = engine.pop("output_buffer")
    return kwargs, engine


_operators = None


def _schemas():
    global _operators
    if _operators is None:
        _operators = {op["name"]: op for op in _sluice.operators()}
    return _operators


def load_plugins(*folders):
    """Loads plugins from more folders (as --plugin-dir); their operators join this module."""
    global _operators
    _sluice.operators([str(f) for f in folders])
    _operators = None


def _unknown_operator(name, kind):
    near = _sluice.closest(name)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    return AttributeError(f"unknown {kind} '{name}'{hint}; dir(sluice.data) lists the sources, "
                          f"dir(a dataset) the other operators, `sluice plugins` all of them")


def _check_parameters(op, texts, values):
    """Raises SpecError from the builder's call when a value is refused, as validation would
    refuse it later: the method, the parameter and why, with no pipeline file to look for."""
    if op.startswith("python_"):
        return  # their one parameter is a handle the builder made
    problems = _sluice.check_parameters(op, texts)
    if not problems:
        return
    lines = [f"{op}(): {name}={values[name]!r}: {message}" if name else f"{op}(): {message}" for name, message in problems]
    error = SpecError("\n".join(lines))
    error.problems = [{"file": "", "line": 0, "column": 0, "stage": "", "param": name, "message": message, "text": line}
                      for (name, message), line in builtins.zip(problems, lines)]
    raise error


def _code_digest(code, digest):
    digest.update(code.co_code)
    digest.update(repr((code.co_name, code.co_names, code.co_varnames)).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _code_digest(constant, digest)
        else:
            digest.update(repr(constant).encode())


def _identity_of(obj):
    """What names a stage's Python object in the pipeline (and so in its states): for a function,
    its name and a digest of its code, so that a script started again, which may build its
    datasets in another order, gives the same names; for data, a digest of its contents."""
    digest = hashlib.blake2b(digest_size=8)
    target = obj
    while isinstance(target, functools.partial):
        digest.update(repr((target.args, sorted(target.keywords))).encode())
        target = target.func
    code = getattr(target, "__code__", None) or getattr(getattr(target, "__call__", None), "__code__", None)
    if code is not None:
        _code_digest(code, digest)
        name = getattr(target, "__qualname__", None) or type(target).__qualname__
    elif isinstance(target, dict):
        for key in sorted(target):
            value = target[key]
            digest.update(repr((key, getattr(value, "dtype", None), getattr(value, "shape", None))).encode())
            if isinstance(value, numpy.ndarray) and value.dtype.kind in "biufc":
                digest.update(memoryview(numpy.ascontiguousarray(value)).cast("B"))  # the rows as they are, not copied
            else:
                digest.update(repr(value).encode())
        name = "tensors"
    else:  # a builtin (abs), or another callable: by its module and name
        name = getattr(target, "__qualname__", None) or type(target).__qualname__
        digest.update(f"{getattr(target, '__module__', None) or type(target).__module__}.{name}".encode())
    name = "".join(c if c.isalnum() or c in "._" else "_" for c in name.replace("<locals>.", "").replace("<lambda>", "lambda"))
    return f"{name}-{digest.hexdigest()}"


class _Held:
    """A Python object a stage uses, under a handle the spec names; forgotten with the datasets.
    The handle is named by `named_by` (the user's function or data, the object itself when not
    given): the same in every run of the script, whatever else it built first."""

    def __init__(self, obj, named_by=None):
        self.handle = _sluice.hold(obj, _identity_of(obj if named_by is None else named_by))

    def __del__(self):
        try:
            _sluice.forget(self.handle)
        except Exception:
            pass


class _MemoryCache:
    """Where an in-memory cache() keeps what it recorded so that it lasts as long as the datasets
    holding it, across `for` loops (each a run of the engine), as tf.data's does: a file in a
    folder of its own under the temporary folder, removed with the last dataset or at exit."""

    def __init__(self):
        folder = tempfile.mkdtemp(prefix="sluice-cache-")
        self.path = os.path.join(folder, "cache.bin")
        weakref.finalize(self, shutil.rmtree, folder, True)


def _spec_dtype(value):
    """The NumPy dtype a TensorSpec gives a value: text (bytes, str, arrays of them) is
    numpy.bytes_'s, as TensorSpec(dtype=numpy.bytes_) names it; NumPy's otherwise."""
    import numpy
    if isinstance(value, (bytes, str)):
        return numpy.dtype(numpy.bytes_)
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return numpy.asarray(value).dtype
    return numpy.dtype(numpy.bytes_) if dtype.kind in ("O", "S", "U") else dtype


# Dataset.cardinality()'s answers where it is not a count, as tf.data's.
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2


_PROCESSING_MODES = {"dynamic": "DYNAMIC", "distributed_epoch": "DYNAMIC", "off": "OFF", "parallel_epochs": "OFF", "file": "FILE",
                     "data": "DATA", "file_or_data": "FILE_OR_DATA"}


def _processing_mode(mode):
    """The pipeline file's processing_mode of distribute()'s: a name (any case) or a ShardingPolicy."""
    name = getattr(mode, "name", mode)
    if isinstance(name, str) and name.lower() in _PROCESSING_MODES:
        return _PROCESSING_MODES[name.lower()]
    raise ValueError(f"distribute(): processing_mode {mode!r} is none of {', '.join(repr(k) for k in _PROCESSING_MODES)} "
                     f"(or a sluice.data.experimental.service.ShardingPolicy)")


def _stage_cardinality(st, inputs):
    """Elements per iteration of one stage, from its inputs' (see Dataset.cardinality)."""
    schema = _schemas().get(st["op"], {"kind": "", "params": []})
    defaults = {p["name"]: p["default"] for p in schema["params"]}

    def number(name):
        value = st.get("params", {}).get(name, defaults.get(name))
        return int(value) if value not in (None, "") else None

    op, kind = st["op"], schema["kind"]
    if kind == "source":
        if op in ("range", "tensors"):
            return number("count")
        return st.get("_rows", UNKNOWN_CARDINALITY)
    if UNKNOWN_CARDINALITY in inputs:
        return UNKNOWN_CARDINALITY
    if kind == "combine":
        if op == "concatenate":
            return INFINITE_CARDINALITY if INFINITE_CARDINALITY in inputs else sum(inputs)
        if op == "zip":
            finite = [n for n in inputs if n != INFINITE_CARDINALITY]
            return min(finite) if finite else INFINITE_CARDINALITY
        return UNKNOWN_CARDINALITY
    n = inputs[0] if inputs else UNKNOWN_CARDINALITY
    endless = n == INFINITE_CARDINALITY
    if kind in ("map", "sink") or op in ("shuffle", "cache"):
        return n
    if op == "take":
        count = number("count")
        return n if count < 0 else (count if endless else min(n, count))
    if op == "skip":
        return n if endless else max(0, n - number("count"))
    if op == "shard":
        shards, index = number("num_shards"), number("index")
        if shards is None or shards < 1 or index is None or index < 0:
            return UNKNOWN_CARDINALITY  # this worker's shard, known when the job runs
        return n if endless else len(builtins.range(index, n, shards))
    if op == "repeat":
        count = number("count")
        if n == 0 or count == 0:
            return 0
        return INFINITE_CARDINALITY if count < 0 or endless else n * count
    if op == "repeat_each":
        count = number("count")
        if n == 0 or count == 0:
            return 0
        return INFINITE_CARDINALITY if count < 0 or endless else n * count
    if op in ("batch", "padded_batch", "ragged_batch"):
        if endless:
            return n
        size = number("batch_size")
        return n // size if st.get("params", {}).get("drop_remainder") == "true" else -(-n // size)
    return UNKNOWN_CARDINALITY


def _are_field_entries(value):
    """Sluice's own FIELD:DIMS / FIELD:VALUE entries (text), not tf.data's shapes and values."""
    items = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
    return bool(items) and all(isinstance(v, str) and ":" in v for v in items)


def _by_field(template, given, what, leaf_is_scalar=False):
    """(field, given's part) for each leaf of the template, given in the element's structure; a
    scalar given for a structured template applies to every field (padding_values=0)."""
    if isinstance(template, str):
        return [(template, given)]
    if leaf_is_scalar and not isinstance(given, (tuple, list, dict)):
        return [(field, given) for field in _Structure(template).leaves()]
    if isinstance(template, tuple) and isinstance(given, (tuple, list)) and len(given) == len(template):
        return [pair for t, g in builtins.zip(template, given) for pair in _by_field(t, g, what, leaf_is_scalar)]
    if isinstance(template, dict) and isinstance(given, dict) and set(given) == set(template):
        return [pair for key, t in template.items() for pair in _by_field(t, given[key], what, leaf_is_scalar)]
    raise ValueError(f"padded_batch(): {what}={given!r} does not have the elements' structure")


def _padding_text(value):
    value = value.item() if hasattr(value, "item") else value
    return value.decode() if isinstance(value, bytes) else str(value)


def _one_of_two(method, tf_name, tf_value, own_name, own_value):
    if tf_value is not None and own_value is not None:
        raise TypeError(f"{method}() got both {tf_name}= and {own_name}=; they are the same setting")
    return own_value if own_value is not None else tf_value


def _docstring(schema):
    lines = [schema["summary"], "", "Parameters:"]
    for p in schema["params"]:
        default = "required" if p["default"] is None else f"default {p['default']!r}"
        choices = f", one of {', '.join(p['choices'])}" if p["choices"] else ""
        lines.append(f"  {p['name']} ({p['type']}, {default}{choices}): {p['doc']}")
    lines.append("  parallelism, buffer_size, error_policy" + (", interleave" if schema["kind"] == "expand" else "") +
                 (", per_input" if schema["kind"] in ("map", "filter", "aggregate") else "") +
                 ": how the engine runs the stage")
    return "\n".join(lines)

