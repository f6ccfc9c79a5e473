"""Pipelines built the tf.data way. Every source operator of the loaded plugins is a function of
this module, every other operator a method of the same name, each taking the operator's
parameters as keyword arguments; the methods tf.data has also take tf.data's positional
arguments, in tf.data's order, and its names (num_parallel_calls=, deterministic=,
cache(filename), list_files(file_pattern), TFRecordDataset, TextLineDataset, AUTOTUNE):

    ds = (sluice.data.list_files("data/*.tfrecord")
          .tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=sluice.AUTOTUNE)
          .parse_example(features="image:bytes,label:int64")
          .decode_image().resize(height=224, width=224)
          .shuffle(1000).batch(64, drop_remainder=True).prefetch(sluice.AUTOTUNE)
          .options(seed=42))
    for batch in ds: ...

Each call checks its parameters at once (sluice.SpecError, naming the method and parameter).
Any stage also takes parallelism= (tf.data's num_parallel_calls=), deterministic= (False: this
stage's outputs leave in completion order), buffer_size= (its output buffer; output_buffer= where
the operator has a buffer_size of its own, as shuffle and prefetch do), error_policy= ("fail" or
"skip"), name= (the stage's id, which also keys its random draws: the same ids and seed give the
same data as a pipeline file) and, for expand stages, interleave=dict(cycle_length=,
block_length=, deterministic=). per_input=True on the maps, filters and aggregates right after an
expand stage runs them once per input, on its readers (tf.data's
interleave(lambda f: TextLineDataset(f).map(...).padded_batch(...))): a batch never mixes two
files. Python functions
join through map(fn), filter(fn), from_generator(gen) and from_tensor_slices(arrays).
`ds.spec()` is the pipeline file's text: it opens in the studio and runs under `sluice run`
(stages calling Python functions run only from Python).
"""
import builtins
import difflib
import enum
import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import types
import weakref

import numpy

from . import AUTOTUNE, SpecError, _param_text, _sluice
from ._structure import Structure as _Structure, TensorSpec, ZippedStructure as _ZippedStructure
from ._tf_options import Options
from ._structure import as_tensors as _as_tensors, cast_to_spec as _cast_to_spec, is_plain_dict as _is_plain_dict

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
# Aggregates whose outputs several threads may assemble (their parallelism); the engine does not
# tune those threads, so tf.data's AUTOTUNE gives them one per core.
_ASSEMBLES_IN_PARALLEL = ("padded_batch", "ragged_batch", "bucket_by_sequence_length", "window")
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
        if method == "batch":
            # batch's copies are made where the rows are built (a map before it writes each row
            # into the batch's memory on its own workers): there is nothing to run in parallel.
            calls = None
        elif method in _ASSEMBLES_IN_PARALLEL and calls == AUTOTUNE:
            calls = os.cpu_count() or 1  # helpers woken only when the stage's thread has work for them
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

class Dataset:
    """A pipeline being built: each method returns a new Dataset with one more stage.

    Iterating a dataset again gives its next epoch (the next shuffles), as in tf.data."""

    def __init__(self, stages=(), options=None, held=(), structure=None):
        self._stages = list(stages)
        self._options = dict(options or {})
        self._held = list(held)
        self._structure = structure  # a _Structure when elements are tuples or nested dicts
        self._iterated = None  # the Pipeline that `for` and torch() run: it counts the epochs
        self._element_spec = None

    # -- building ------------------------------------------------------------------------------

    def _with_stage(self, op, params, engine, held=()):
        schema = _schemas().get(op)
        if schema is not None:
            known = {p["name"] for p in schema["params"]}
            for name in params:
                if name not in known:
                    near = difflib.get_close_matches(name, sorted(known | set(_ENGINE_ARGUMENTS)), n=1)
                    hint = f" (did you mean '{near[0]}'?)" if near else ""
                    raise TypeError(f"{op}(): unknown parameter '{name}'{hint}; its parameters: {', '.join(sorted(known)) or 'none'}")
            _check_parameters(op, {k: _param_text(v) for k, v in params.items()}, params)
        taken = {s["id"] for s in self._stages}
        stage_id = engine.pop("name", None)
        if stage_id is not None:
            if stage_id in taken:
                raise ValueError(f"{op}(): a stage is already named {stage_id!r}")
        else:
            stage_id, n = op, 2
            while stage_id in taken:
                stage_id, n = f"{op}_{n}", n + 1
        stage = {"id": stage_id, "op": op, "params": {k: _param_text(v) for k, v in params.items()}}
        if self._stages:
            stage["input"] = [self._stages[-1]["id"]]
        for name, value in engine.items():
            if value is None:
                continue
            if name == "interleave":
                stage["interleave"] = {k: v for k, v in dict(value).items()}
            elif name in ("per_input", "deterministic"):
                stage[name] = bool(value)
            elif name == "error_policy":
                if value not in ("fail", "skip"):
                    raise ValueError(f"{op}(): error_policy is 'fail' or 'skip', not {value!r}")
                stage["error_policy"] = value
            else:
                stage[name] = int(value)
        structure = self._structure
        if structure is not None and structure.select and op not in _KEEPS_FIELDS:
            structure = None  # TextLineDataset's line, say, once a stage made other fields of its elements
        return Dataset(self._stages + [stage], self._options, self._held + list(held), structure)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        schema = _schemas().get(name)
        if schema is None or schema["kind"] in ("source", "combine"):
            raise _unknown_operator(name, "operator")

        def add_stage(*args, **kwargs):
            return self._with_stage(name, *_split_arguments(schema, _tf_data_call(name, args, kwargs)))

        add_stage.__name__ = name
        add_stage.__doc__ = _docstring(schema)
        return add_stage

    def __dir__(self):
        return sorted(set(super().__dir__()) | {n for n, s in _schemas().items() if s["kind"] not in ("source", "combine")})

    def map(self, fn, num_parallel_calls=None, deterministic=None, *, parallelism=None, buffer_size=None, error_policy=None,
            name=None):
        """Calls fn(element) on each element, as the dataset holds it (a scalar, a tuple whose items
        are fn's arguments, a dict; a dict of numpy arrays for Sluice's own operators); fn
        returns the new element, in any of those structures. It runs on the engine's workers, holding the GIL.
        num_parallel_calls (or parallelism) workers, sluice.AUTOTUNE to let the engine choose;
        deterministic=False lets results leave in the order they finish."""
        given, returned = self._structure, _Structure()

        def call(element):
            # fn sees the element as the dataset holds it (a tuple's items as its arguments, as
            # tf.data's map); a tuple or nested dict it returns goes on as fields.
            arguments = given.unflatten(element) if given is not None else element
            result = fn(*arguments) if isinstance(arguments, tuple) else fn(arguments)
            fields, template = _Structure.flatten(result)
            if fields is None:
                returned.template = "value"  # one value, field "value", given back alone as in tf.data
                return result
            if _is_plain_dict(template):
                return result  # a plain dict of fields
            if returned.template is None:
                returned.template = template
            return fields

        held = _Held(call, named_by=fn)
        dataset = self._with_stage("python_map", {"function": held.handle},
                                   {"parallelism": _one_of_two("map", "num_parallel_calls", num_parallel_calls, "parallelism",
                                                               parallelism),
                                    "deterministic": deterministic, "buffer_size": buffer_size, "error_policy": error_policy,
                                    "name": name},
                                   [held])
        dataset._structure = returned
        return dataset

    def filter(self, predicate, *, parallelism=None, buffer_size=None, error_policy=None, name=None):
        """Keeps the elements for which predicate(element) is true; the element is given as map()
        gives it (a tuple's items as the predicate's arguments)."""
        given = self._structure

        def keep(element):
            arguments = given.unflatten(element) if given is not None else element
            return predicate(*arguments) if isinstance(arguments, tuple) else predicate(arguments)

        held = _Held(keep, named_by=predicate)
        return self._with_stage("python_filter", {"function": held.handle},
                                {"parallelism": parallelism, "buffer_size": buffer_size, "error_policy": error_policy, "name": name},
                                [held])

    def cache(self, filename="", *, path=None, name=None, buffer_size=None, error_policy=None):
        """Records the first iteration and replays it afterwards (tf.data's cache): into the file
        `filename` (or path=), kept across runs, or, by default, for as long as this dataset
        lives, across `for` loops (in a file of the temporary folder, removed with the dataset)."""
        if path is not None:
            if filename:
                raise TypeError("cache() got both filename and path=; they are the same parameter")
            filename = path
        engine = {"name": name, "buffer_size": buffer_size, "error_policy": error_policy}
        if filename:
            return self._with_stage("cache", {"path": os.fspath(filename)}, engine)
        keeper = _MemoryCache()
        dataset = self._with_stage("cache", {}, engine, [keeper])
        dataset._stages[-1] = dict(dataset._stages[-1], _memory_cache=keeper.path)
        return dataset

    def interleave(self, map_func, cycle_length=None, block_length=None, num_parallel_calls=None, deterministic=None):
        """tf.data's interleave with a function that reads each input: map_func is called once,
        now, with a stand-in for one input, and must start from TFRecordDataset(f) or
        TextLineDataset(f); what it builds becomes this dataset's reader (cycle_length inputs
        open at once, block_length elements from each in turn, num_parallel_calls readers) and
        the stages it chains after the reader run once per input on those readers (per_input):
        interleave(lambda f: TextLineDataset(f).map(split).padded_batch(32)) never mixes two
        files in a batch."""
        built = map_func(*_stand_ins(map_func, self._structure))
        if not isinstance(built, Dataset):
            raise TypeError(f"interleave(): the function returned {type(built).__name__}, not a sluice.data.Dataset")
        if not built._stages or not built._stages[0].get("_reads_the_input"):
            raise TypeError("interleave(): the function must start from sluice.data.TFRecordDataset(f), "
                            "TextLineDataset(f) or Dataset.from_tensors(x) of its input")
        reader, after = built._stages[0], built._stages[1:]
        if reader["op"] == "repeat_each":
            # from_tensors(x).repeat(k): the copies are the reader's, k of each input in a row.
            count = int(reader["params"]["count"])
            while after and after[0]["op"] == "repeat":
                times = int(after[0].get("params", {}).get("count", "-1"))
                count = -1 if -1 in (count, times) and 0 not in (count, times) else count * times
                after = after[1:]
            reader = dict(reader, params={"count": str(count)})
        cycle = (os.cpu_count() or 1) if cycle_length in (None, AUTOTUNE) else int(cycle_length)
        settings = {"interleave": dict(cycle_length=cycle, block_length=int(block_length or 1))}
        if deterministic is not None:
            settings["interleave"]["deterministic"] = bool(deterministic)
        settings["parallelism"] = num_parallel_calls if num_parallel_calls is not None else reader.get("parallelism")
        params = dict(reader.get("params", {}))
        # from_tensor_slices(file_names): each element's one field is "value", not list_files' "path".
        if ("field" not in params and reader["op"] != "repeat_each" and self._stages and
                self._stages[-1]["op"] == "python_tensor_slices" and
                (self._structure is None or self._structure.template == "value")):
            params["field"] = "value"
        dataset = self._with_stage(reader["op"], params, settings, built._held)
        for st in after:
            # per_input stages run on the readers: their own worker counts do not apply.
            engine = {k: st[k] for k in ("buffer_size", "error_policy") if k in st}
            dataset = dataset._with_stage(st["op"], dict(st.get("params", {})), dict(engine, per_input=True))
            extra = {k: v for k, v in st.items() if k.startswith("_")}
            if extra:
                dataset._stages[-1] = dict(dataset._stages[-1], **extra)
        dataset._structure = built._structure
        return dataset

    def padded_batch(self, batch_size, padded_shapes=None, padding_values=None, drop_remainder=False, **settings):
        """tf.data's padded_batch: padded_shapes a shape (or a structure of shapes like the
        elements': [5], ([None], [])), padding_values a value (or such a structure); or Sluice's
        FIELD:DIMS and FIELD:VALUE entries. See padded_batch's parameters for the rest."""
        template = self._structure.template if self._structure is not None else None
        if padded_shapes is not None and template is not None and not _are_field_entries(padded_shapes):
            padded_shapes = [f"{field}:{'x'.join(str(-1 if d is None else int(d)) for d in shape)}"
                             for field, shape in _by_field(template, padded_shapes, "padded_shapes") if len(shape)]
        if padding_values is not None and not isinstance(padding_values, (tuple, list, dict)):
            padding_values = _padding_text(padding_values)  # one value for every field, as tf.data's
        elif padding_values is not None and template is not None and not _are_field_entries(padding_values):
            padding_values = [f"{field}:{_padding_text(value)}" for field, value in _by_field(template, padding_values, "padding_values",
                                                                                               leaf_is_scalar=True)]
        add = Dataset.__getattr__(self, "padded_batch")
        return add(batch_size, padded_shapes if padded_shapes is not None else "", padding_values if padding_values is not None else "0",
                   drop_remainder, **settings)

    def flat_map(self, map_func):
        """tf.data's flat_map: interleave(map_func) one input after another. After window(), whose
        windows are stacked already, flat_map(lambda w: w.batch(n)) (n at least the window's size)
        is the window itself, as tf.data's window(...).flat_map(...) idiom gives it."""
        if self._stages and self._stages[-1]["op"] == "window":
            size = int(self._stages[-1]["params"]["size"])
            if map_func(_WindowStandIn(size)) is _WindowStandIn.WHOLE:
                return self
            raise TypeError("flat_map() after window(): Sluice's windows are stacked already (tf.data's window(n).flat_map("
                            "lambda w: w.batch(n))); the function may only batch the whole window")
        return self.interleave(map_func, cycle_length=1, block_length=1)

    def apply(self, transformation_func):
        """transformation_func(self): a whole transformation as one call (tf.data's apply), e.g.
        ds.apply(sluice.data.experimental.ignore_errors())."""
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise TypeError(f"apply(): {transformation_func!r} returned {type(result).__name__}, not a sluice.data.Dataset")
        return result

    def ignore_errors(self):
        """Elements that fail anywhere upstream are dropped, counted and listed in the report
        instead of ending the run (tf.data's ignore_errors): every stage so far that sets no error
        policy of its own skips."""
        stages = [dict(st, error_policy="skip") if "error_policy" not in st else st for st in self._stages]
        return Dataset(stages, self._options, self._held, self._structure)

    def cardinality(self):
        """The number of elements one iteration gives, as tf.data's cardinality(), when the stages
        say it without running: sources that know their size (range, tensors,
        from_tensor_slices), maps, batch and padded_batch, take, skip, shard with its count and
        index, repeat, shuffle, cache, concatenate, zip. INFINITE_CARDINALITY (-1) for an endless
        repeat, UNKNOWN_CARDINALITY (-2) otherwise (files, filters)."""
        sizes = {}
        for st in self._stages:
            inputs = [sizes[i] for i in st.get("input", [])]
            sizes[st["id"]] = _stage_cardinality(st, inputs)
        return sizes[self._stages[-1]["id"]] if self._stages else 0

    def __len__(self):
        size = self.cardinality()
        if size == INFINITE_CARDINALITY:
            raise TypeError("The dataset is infinite.")
        if size == UNKNOWN_CARDINALITY:
            raise TypeError("The dataset length is unknown.")
        return size

    @property
    def element_spec(self):
        """The structure of an element with a TensorSpec(shape, dtype, name) for each field, as
        tf.data's element_spec. Sluice's stages do not declare shapes, so they are read from the
        first elements (up to 8, made once per dataset object, in a run of their own): a dimension
        that differs between them is None, as is the first one after a batch that keeps its
        remainder (as in tf.data)."""
        if self._element_spec is None:
            self._element_spec = self._read_element_spec(8)
        return self._element_spec

    def _read_element_spec(self, elements):
        if not self._stages:
            raise ValueError("element_spec: the dataset has no stages")
        if _schemas().get(self._stages[-1]["op"], {}).get("kind") == "sink":
            raise TypeError(f"element_spec: the dataset ends in the sink '{self._stages[-1]['id']}', which gives no elements")
        shapes, dtypes = {}, {}
        for element in Dataset(self._stages, self._options, self._held).take(elements).pipeline():
            for field, value in element.items():
                shape = tuple(getattr(value, "shape", ()))
                known = shapes.setdefault(field, shape)
                shapes[field] = (tuple(a if a == b else None for a, b in builtins.zip(known, shape))
                                 if len(known) == len(shape) else None)
                dtypes.setdefault(field, _spec_dtype(value))
        if not shapes:
            raise ValueError("element_spec: the dataset gave no element to read the shapes from")
        batching = [st for st in self._stages if st["op"] in ("batch", "padded_batch", "ragged_batch", "bucket_by_sequence_length")]
        after_batch = self._stages[self._stages.index(batching[-1]) + 1:] if batching else []
        keeps_remainder = (batching and batching[-1].get("params", {}).get("drop_remainder") != "true" and
                           not any(st["op"] == "unbatch" for st in after_batch))
        specs = {}
        for field, shape in shapes.items():
            if shape is not None and keeps_remainder and shape:
                shape = (None,) + shape[1:]
            specs[field] = TensorSpec(shape, dtypes[field])  # unnamed, as tf.data's
        return self._structure.unflatten(specs) if self._structure is not None else specs

    def as_numpy_iterator(self):
        """An iterator over the elements as NumPy arrays (what iterating the dataset gives)."""
        return iter(self)

    def concatenate(self, *others, name=None):
        """All of this dataset's elements, then all of each of `others` (tf.data's concatenate)."""
        return concatenate(self, *others, name=name)

    def distribute(self, service, processing_mode="dynamic", job_name=None, *, consumer_index=None, num_consumers=None, split_size=None,
                   splits_in_flight=None, compression=None, token_file=None, tls_ca=None):
        """Runs this dataset (every stage so far) on the Sluice service's workers and reads its
        elements from them; the stages added after this one run here. As tf.data's
        `ds.apply(tf.data.experimental.service.distribute(processing_mode, service, job_name))`.

        service: the dispatcher, "grpc://HOST:PORT". processing_mode: "dynamic" (splits of the
        source handed to whichever worker is free; every element exactly once, even when workers
        die), "off" (every worker makes the whole dataset with its own seed), or static sharding
        over the dispatcher's fixed worker list: "file", "data" or "file_or_data" (tf.data's
        ShardingPolicy names and its "distributed_epoch" and "parallel_epochs" are taken too).
        job_name: trainers naming one job share its elements; None: this run's own job.
        consumer_index, num_consumers: coordinated reads (tf.data's): the job is read by exactly
        num_consumers trainers, this one consumer_index among them; each round gives every one of
        them one element, all from one worker's consecutive output.
        split_size: source elements per split in dynamic mode (default 1: a file of list_files).
        splits_in_flight: splits this trainer reads at once, each from the worker making it (4).
        compression: of the elements the workers send, None, "zstd" or "snappy" (tf.data's "AUTO"
        is none here).
        token_file, tls_ca: the service's shared token and the authority to trust, off loopback."""
        if not self._stages:
            raise ValueError("distribute(): the dataset has no stages to send to the service")
        for st in self._stages:
            if st["op"].startswith("python_"):
                raise ValueError(f"distribute(): stage '{st['id']}' ({st['op']}) calls Python code, which the service's workers "
                                 f"cannot run (they run pipeline files); apply it after distribute(), or use Sluice operators "
                                 f"(`sluice plugins`)")
        mode = _processing_mode(processing_mode)
        distribute = {"service": str(service), "processing_mode": mode}
        if compression is not None and str(compression).upper() not in ("AUTO", "NONE"):
            if str(compression).upper() not in ("ZSTD", "SNAPPY"):
                raise ValueError(f"distribute(): compression is None, 'zstd' or 'snappy', not {compression!r}")
            distribute["compression"] = str(compression).upper()
        for key, value in (("job_name", job_name), ("token_file", token_file), ("tls_ca", tls_ca)):
            if value is not None:
                distribute[key] = os.fspath(value) if key != "job_name" else str(value)
        if (consumer_index is None) != (num_consumers is None):
            raise ValueError("distribute(): consumer_index and num_consumers go together (coordinated reads)")
        if num_consumers is not None:
            if job_name is None:
                raise ValueError("distribute(): coordinated reads (num_consumers) need the job_name the trainers share")
            if int(num_consumers) < 1 or not 0 <= int(consumer_index) < int(num_consumers):
                raise ValueError(f"distribute(): consumer_index is 0 to num_consumers - 1, not {consumer_index!r} of {num_consumers!r}")
            distribute["num_consumers"] = int(num_consumers)
            distribute["consumer_index"] = int(consumer_index)
        for key, value in (("split_size", split_size), ("splits_in_flight", splits_in_flight)):
            if value is not None:
                if int(value) < 1:
                    raise ValueError(f"distribute(): {key} is at least 1, not {value!r}")
                distribute[key] = int(value)
        stages = self._stages[:-1] + [dict(self._stages[-1], distribute=distribute)]
        return Dataset(stages, self._options, self._held, self._structure)

    def options(self, *, seed=None, deterministic=None, error_policy=None, fuse_stages=None):
        """The pipeline's options: the seed of every random stage, whether parallel stages keep
        order, the default error policy, whether neighbouring maps share workers. Called without
        arguments, as tf.data's options(), it gives them back as a sluice.data.Options."""
        if seed is None and deterministic is None and error_policy is None and fuse_stages is None:
            given = Options()
            for key in ("seed", "deterministic"):
                if key in self._options:
                    setattr(given, key, self._options[key])
            return given
        options = dict(self._options)
        for key, value in (("seed", seed), ("deterministic", deterministic), ("error_policy", error_policy),
                           ("fuse_stages", fuse_stages)):
            if value is not None:
                options[key] = value
        return Dataset(self._stages, options, self._held, self._structure)

    def with_options(self, options):
        """tf.data's with_options: a sluice.data.Options's settings as this pipeline's options."""
        if not isinstance(options, Options):
            raise TypeError(f"with_options(): {options!r} is not a sluice.data.Options")
        return Dataset(self._stages, dict(self._options, **options._pipeline_options()), self._held, self._structure)

    def enumerate(self, start=0, name=None):
        """(index, element) pairs, the index an int64 counted from `start` (tf.data's enumerate)."""
        counter = range(int(start), int(start) + 2**62, name=None if name is None else f"{name}_index")
        return zip((counter, self), name=name)

    def rebatch(self, batch_size, drop_remainder=False, name=None):
        """The batches' rows in batches of batch_size (tf.data's rebatch with one batch size)."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool):
            raise TypeError(f"rebatch(): batch_size is one int here, not {batch_size!r} (a list of sizes is tf.data's alone)")
        return self.unbatch().batch(batch_size, drop_remainder=drop_remainder, name=name)

    def reduce(self, initial_state, reduce_func):
        """reduce_func(state, element) over every element, from initial_state (tf.data's reduce):
        the final state. Runs the dataset once, in this thread."""
        state = initial_state
        for element in self:
            state = reduce_func(state, element)
        return state

    # -- using ---------------------------------------------------------------------------------

    def spec(self):
        """The pipeline file's text (protobuf text format, a line per stage)."""
        spec = {"stage": [{k: v for k, v in st.items() if not k.startswith("_")} for st in self._stages]}
        if self._options:
            spec["options"] = self._options
        return _sluice.spec_from_json(json.dumps(spec))

    def save(self, path):
        """Writes this dataset as a pipeline file that `sluice run` runs and the studio opens: its
        relative paths made relative to the file's folder (as a pipeline file reads them), and a
        `null_sink` at the end when it has no sink. A dataset that calls Python functions cannot
        be saved (the file could not hold them): ValueError naming the stage. Returns the path."""
        path = os.path.abspath(os.fspath(path))
        for st in self._stages:
            if st["op"].startswith("python_"):
                raise ValueError(f"save(): stage '{st['id']}' ({st['op']}) calls Python code, which a pipeline file cannot "
                                 f"hold; run it from Python, or replace it with Sluice operators (`sluice plugins`)")
        if not self._stages:
            raise ValueError("save(): the dataset has no stages")
        folder = os.path.dirname(path)
        stages = []
        for st in self._stages:
            st = {k: v for k, v in st.items() if not k.startswith("_")}
            schema = _schemas().get(st["op"], {"params": []})
            kinds = {p["name"]: p["type"] for p in schema["params"]}
            params = dict(st.get("params", {}))
            for name, value in params.items():
                if kinds.get(name) in ("path", "path-list", "output-path") and value:
                    params[name] = ",".join(v if os.path.isabs(v) or _is_remote_uri(v) else os.path.relpath(os.path.abspath(v), folder)
                                            for v in value.split(","))
            stages.append(dict(st, params=params))
        last = stages[-1]
        if _schemas().get(last["op"], {}).get("kind") != "sink":
            taken = {st["id"] for st in stages}
            sink_id, n = "out", 2
            while sink_id in taken:
                sink_id, n = f"out_{n}", n + 1
            stages.append({"id": sink_id, "op": "null_sink", "input": [last["id"]], "params": {}})
        spec = {"stage": stages}
        if self._options:
            spec["options"] = self._options
        text = _sluice.spec_from_json(json.dumps(spec))
        # Whole or absent: a temporary beside it, then a rename.
        handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".partial-", dir=folder or ".")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        return path

    def pipeline(self, **options):
        """A new sluice.Pipeline of this dataset (set=, seed=, plugin_dirs=, metrics_addr=), at
        epoch 0, whose elements have the dataset's structure (scalars, tuples, dicts)."""
        from . import Pipeline

        # In-memory caches record into their dataset's file, which outlives each run.
        sets = {f"{st['id']}.path": st["_memory_cache"] for st in self._stages if "_memory_cache" in st}
        sets.update(options.pop("set", None) or {})
        return Pipeline(_text=self.spec(), _file=os.path.join(os.getcwd(), "pipeline.txtpb"), _keep=self._held, set=sets or None,
                        _structure=self._structure, **options)

    def _pipeline_to_iterate(self):
        if self._iterated is None:
            self._iterated = self.pipeline()
        return self._iterated

    def __iter__(self):
        return iter(self._pipeline_to_iterate())

    def torch(self):
        """Iterates with each field a torch.Tensor (see Pipeline.torch)."""
        return iter(self._pipeline_to_iterate().torch())


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


def _combine(op, datasets, params, name):
    """A stage reading several datasets, in order. Their stages join one pipeline; a stage id that
    is taken already gets a number, so a dataset given twice (or one built from another) is read
    twice, each from its own source, as tf.data iterates each input on its own."""
    datasets = list(datasets)
    if len(datasets) < 2:
        raise TypeError(f"{op}() takes two or more datasets, got {len(datasets)}")
    for d in datasets:
        if not isinstance(d, Dataset):
            raise TypeError(f"{op}(): {d!r} is not a sluice.data.Dataset")
        if not d._stages:
            raise ValueError(f"{op}(): a dataset has no stages")
    stages, options, held, ends = [], {}, [], []
    taken = set()
    for d in datasets:
        renamed = {}
        for st in d._stages:
            new_id, n = st["id"], 2
            while new_id in taken:
                new_id, n = f"{st['id']}_{n}", n + 1
            renamed[st["id"]] = new_id
            taken.add(new_id)
            copy = dict(st, id=new_id)
            if "input" in st:
                copy["input"] = [renamed.get(i, i) for i in st["input"]]
            stages.append(copy)
        ends.append(renamed[d._stages[-1]["id"]])
        for key, value in d._options.items():
            options.setdefault(key, value)
        held += d._held
    stage_id, n = name or op, 2
    if name is not None and name in taken:
        raise ValueError(f"{op}(): a stage is already named {name!r}")
    while stage_id in taken:
        stage_id, n = f"{op}_{n}", n + 1
    stage = {"id": stage_id, "op": op, "input": ends,
             "params": {k: _param_text(v) for k, v in params.items() if v is not None}}
    return Dataset(stages + [stage], options, held)


def zip(*datasets, prefixes=None, name=None):
    """One element from each dataset; it ends with the shortest. As tf.data: zip(a, b) and
    zip((a, b)) give (a's element, b's element) tuples, zip({"x": a, "y": b}) dicts. With
    prefixes=["a", "b"], zip(a, b) merges their fields into one element instead, named a/FIELD,
    b/FIELD (Sluice's own elements, as a pipeline file's zip stage gives them)."""
    if prefixes is not None:
        if len(datasets) == 1 and isinstance(datasets[0], (tuple, list, dict)):
            raise TypeError("zip((a, b)) gives tuples; prefixes= names the merged fields of zip(a, b)")
        return _combine("zip", datasets, {"prefixes": prefixes}, name)
    keys = None
    if len(datasets) == 1 and isinstance(datasets[0], (tuple, list)):
        parts = list(datasets[0])
    elif len(datasets) == 1 and isinstance(datasets[0], dict):
        keys, parts = list(datasets[0]), list(datasets[0].values())
    else:
        parts = list(datasets)
    zipped = _combine("zip", parts, {"prefixes": [str(i) for i in builtins.range(len(parts))]}, name)
    zipped._structure = _ZippedStructure([getattr(d, "_structure", None) for d in parts], keys)
    return zipped


def _common_structure(datasets):
    """The structure of datasets whose elements all have the same one (concatenate, sampling)."""
    first = datasets[0]._structure
    return first if first is not None and all(first == d._structure for d in datasets[1:]) else None


def concatenate(*datasets, name=None):
    """All elements of the first dataset, then of the second, and so on."""
    combined = _combine("concatenate", datasets, {}, name)
    combined._structure = _common_structure(list(datasets))
    return combined


def sample_from_datasets(datasets, weights=None, seed=None, stop_on_empty_dataset=False, rerandomize_each_iteration=None, *,
                         name=None):
    """Each element from one of `datasets`, picked at random with `weights` (equal by default),
    the same for the same seed at any parallelism (tf.data's sample_from_datasets): `seed` this
    stage's (else the pipeline's), every epoch the same mixture unless rerandomize_each_iteration."""
    combined = _combine("sample_from_datasets", datasets,
                        {"weights": weights, "stop_on_empty_dataset": stop_on_empty_dataset, "seed": seed,
                         "rerandomize_each_iteration": bool(rerandomize_each_iteration) if rerandomize_each_iteration is not None else None},
                        name)
    combined._structure = _common_structure(list(datasets))
    return combined


def choose_from_datasets(datasets, choice_dataset, *, field="value", stop_on_empty_dataset=True, name=None):
    """Element i from datasets[c], c being the integer `field` of choice_dataset's element i
    (tf.data's choose_from_datasets; sluice.data.range gives the field "value")."""
    combined = _combine("choose_from_datasets", list(datasets) + [choice_dataset],
                        {"field": field, "stop_on_empty_dataset": stop_on_empty_dataset}, name)
    combined._structure = _common_structure(list(datasets))
    return combined


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
    if buffer_size is not None and op == "tfrecord_reader":
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


def TextLineDataset(filenames, compression_type=None, buffer_size=None, num_parallel_reads=None, *, name=None):
    """The lines of text files (field 'line', without its line end), as tf.data.TextLineDataset."""
    return _picking(_file_reader("TextLineDataset", "text_lines", filenames, compression_type, buffer_size, num_parallel_reads,
                                 {"name": name}), "line")


def _picking(dataset, field):
    """The dataset with tf.data's elements, `field` alone (a scalar string), until a stage makes
    other fields of them; its stages still see every field (the file, the record's index)."""
    dataset._structure = _Structure(field, select=True)
    return dataset


_TFDS_NAME = r"^([\w.-]+)(/[\w.-]+)?(?::(\d+\.\d+\.\d+))?$"


def _tfds_version_folder(name, data_dir):
    """The folder the tfds source reads for `name` (the same rule as its: the newest prepared
    version when none is named), or None when there is none (the source then says why). A
    data_dir in a bucket (s3://, gs://) is listed through the engine's remote storage."""
    import re
    match = re.match(_TFDS_NAME, name)
    if match is None:
        return None
    base = os.path.join(data_dir, match.group(1) + (match.group(2) or ""))
    if match.group(3):
        return os.path.join(base, match.group(3))
    try:
        if _is_remote_uri(base):
            infos = [uri[len(base) + 1:] for uri in _sluice.list_remote(base + "/") if uri.endswith("/dataset_info.json")]
            versions = [v.split("/")[0] for v in infos if v.count("/") == 1 and re.match(r"^\d+\.\d+\.\d+$", v.split("/")[0])]
        else:
            versions = [v for v in os.listdir(base) if re.match(r"^\d+\.\d+\.\d+$", v) and os.path.exists(os.path.join(base, v, "dataset_info.json"))]
    except (OSError, ValueError, RuntimeError):
        return None
    return os.path.join(base, max(versions, key=lambda v: tuple(int(p) for p in v.split(".")))) if versions else None


def _read_metadata(path):
    """A small file of a dataset's folder, local or in a bucket, as text."""
    if _is_remote_uri(path):
        try:
            return _sluice.read_remote_text(path)
        except (ValueError, RuntimeError) as e:
            raise OSError(str(e)) from None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _metadata_exists(path):
    if _is_remote_uri(path):
        try:
            return path in _sluice.list_remote(path)
        except (ValueError, RuntimeError):
            return False
    return os.path.exists(path)


def _tfds_features(feature, name=""):
    """(field, kind, channels) of each feature of features.json, nested names joined with '/';
    kind 'image' only for a single (not sequence) image, which decode_image can decode."""
    if not isinstance(feature, dict):
        return []
    if "featuresDict" in feature:
        found = []
        for key, inner in feature["featuresDict"].get("features", {}).items():
            found += _tfds_features(inner, f"{name}/{key}" if name else key)
        return found
    if "sequence" in feature:
        return [(field, "other" if kind == "image" else kind, channels)
                for field, kind, channels in _tfds_features(feature["sequence"].get("feature"), name)]
    if "image" in feature:
        dims = feature["image"].get("shape", {}).get("dimensions", [])
        last = int(dims[-1]) if dims else 3
        return [(name, "image", str(last) if last in (1, 3) else "0")]
    return [(name, "class_label" if "classLabel" in feature else "other", None)]


def tfds(name, *, split=None, data_dir=None, shuffle_files=False, as_supervised=False, read_config=None,
         class_names=False, decode_images=True, seed=None):
    """A prepared tensorflow_datasets dataset, as tfds.load(name, split=..., data_dir=...,
    shuffle_files=..., as_supervised=...) gives it: elements are dicts of its features (nested
    dicts as TFDS nests them), images decoded (decode_images=False keeps the encoded bytes),
    or (input, target) pairs with as_supervised=True. split is TFDS's grammar ('train[:10%]',
    'train[:4shard]+test', 'all'); data_dir defaults to $TFDS_DATA_DIR, else
    ~/tensorflow_datasets. The shards are read as TFDS reads them: 16 at once, in blocks of 16
    (read_config={'interleave_cycle_length': C, 'interleave_block_length': B} changes it).
    class_names=True adds FEATURE_name beside each ClassLabel whose names the dataset holds."""
    if split is None:
        raise TypeError("tfds(): give split= (tfds.load(split=None) returns a dict of every split; name one, or 'all', "
                        "or a union such as 'train+test')")
    read_config = dict(read_config or {})
    unknown = set(read_config) - {"interleave_cycle_length", "interleave_block_length", "shuffle_seed"}
    if unknown:
        raise TypeError(f"tfds(): read_config takes interleave_cycle_length, interleave_block_length and shuffle_seed, "
                        f"not {', '.join(sorted(unknown))}")
    folder_base = os.fspath(data_dir) if data_dir is not None else (
        os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))
    if seed is None:
        seed = read_config.get("shuffle_seed")
    shards = _source("tfds", {"name": name, "split": split, "data_dir": folder_base if data_dir is not None else None,
                              "shuffle_files": shuffle_files, "seed": seed})
    cycle = int(read_config.get("interleave_cycle_length", 16))
    block = int(read_config.get("interleave_block_length", 16))
    dataset = shards.tfds_reader(class_names=class_names or None,
                                 interleave={"cycle_length": cycle, "block_length": block}, parallelism=AUTOTUNE)
    folder = _tfds_version_folder(name, folder_base)
    features = []
    if folder is not None:
        try:
            features = _tfds_features(json.loads(_read_metadata(os.path.join(folder, "features.json"))))
        except (OSError, ValueError):
            features = []  # the source refuses the dataset when it starts, naming the file
    if decode_images:
        for field, kind, channels in features:
            if kind == "image":
                dataset = dataset.decode_image(field=field, output=field, channels=channels)
    fields = [field for field, _, _ in features]
    if class_names:
        fields += [f"{field}_name" for field, kind, _ in features
                   if kind == "class_label" and _metadata_exists(os.path.join(folder, field.replace("/", "-") + ".labels.txt"))]
    if as_supervised:
        keys = json.loads(_read_metadata(os.path.join(folder, "dataset_info.json"))).get("supervisedKeys", {})
        pair = ([keys["input"], keys["output"]] if "input" in keys else
                [item.get("featureKey") for item in keys.get("tuple", {}).get("items", [])])
        if len(pair) != 2 or None in pair:
            raise ValueError(f"tfds(): {name} has no supervised keys (a pair of features) in its dataset_info.json; "
                             "use as_supervised=False and pick the fields yourself")
        dataset = dataset.select_fields(keep=pair)
        dataset._structure = _Structure(tuple(pair))
    elif any("/" in field for field in fields):
        template = {}
        for field in fields:
            *outer, last = field.split("/")
            level = template
            for key in outer:
                level = level.setdefault(key, {})
            level[last] = field
        dataset._structure = _Structure(template)
    return dataset


class _ShardingPolicy(enum.Enum):
    """tf.data.experimental.service.ShardingPolicy: how the service's workers share a dataset."""
    OFF = "off"
    DYNAMIC = "dynamic"
    FILE = "file"
    DATA = "data"
    FILE_OR_DATA = "file_or_data"


class _Service:
    """tf.data.experimental.service's names that Sluice has: distribute() and ShardingPolicy."""
    ShardingPolicy = _ShardingPolicy

    @staticmethod
    def distribute(processing_mode, service, job_name=None, consumer_index=None, num_consumers=None, **options):
        """For ds.apply(): Dataset.distribute(service, processing_mode, job_name, ...), in
        tf.data's argument order."""
        return lambda dataset: dataset.distribute(service, processing_mode, job_name, consumer_index=consumer_index,
                                                  num_consumers=num_consumers, **options)


class experimental:
    """tf.data.experimental's names that Sluice has: AUTOTUNE, ignore_errors(), parallel_interleave(),
    service.distribute()."""
    AUTOTUNE = AUTOTUNE
    service = _Service

    @staticmethod
    def ignore_errors():
        """For ds.apply(): the dataset with every stage so far skipping what fails (Dataset.ignore_errors)."""
        return lambda dataset: dataset.ignore_errors()

    @staticmethod
    def parallel_interleave(map_func, cycle_length, block_length=1, sloppy=False, buffer_output_elements=None,
                            prefetch_input_elements=None, num_parallel_calls=None):
        """For ds.apply(): Dataset.interleave(map_func, cycle_length, block_length, num_parallel_calls
        (else cycle_length readers), deterministic=not sloppy), as tf.data.experimental's.
        buffer_output_elements and prefetch_input_elements are the engine's to choose."""
        readers = cycle_length if num_parallel_calls is None else num_parallel_calls
        return lambda dataset: dataset.interleave(map_func, cycle_length, block_length, readers, False if sloppy else None)


def _source(op, kwargs):
    schema = _schemas().get(op)
    if schema is None:
        raise _unknown_operator(op, "source")
    return Dataset()._with_stage(op, *_split_arguments(schema, _tf_data_call(op, (), kwargs)))


def __getattr__(name):
    schema = _schemas().get(name)
    if schema is None or schema["kind"] != "source":
        raise _unknown_operator(name, "source")

    def make_source(*args, **kwargs):
        return Dataset()._with_stage(name, *_split_arguments(schema, _tf_data_call(name, args, kwargs)))

    make_source.__name__ = name
    make_source.__doc__ = _docstring(schema)
    return make_source


def __dir__():
    public = {n for n in globals() if not n.startswith("_")} - {"builtins", "collections", "difflib", "enum", "inspect", "json", "os", "shutil", "tempfile", "weakref", "SpecError"}
    return sorted(public | {n for n, s in _schemas().items() if s["kind"] == "source"})


# tf.data writes its sources as Dataset's static methods (tf.data.Dataset.from_tensor_slices(...)):
# the same functions, under those names too.
for _name in ("from_tensor_slices", "from_tensors", "from_generator", "range", "list_files", "sample_from_datasets", "zip",
              "choose_from_datasets"):
    setattr(Dataset, _name, staticmethod(globals()[_name]))
del _name
