"""Pipelines built the tf.data way. Every source operator of the loaded plugins is a function of
this module, every other operator a method of the same name, each taking the operator's
parameters as keyword arguments:

    ds = (sluice.data.list_files(patterns="data/*.tfrecord", shuffle=True)
          .tfrecord_reader(interleave=dict(cycle_length=4), parallelism=4)
          .parse_example(features="image:bytes,label:int64")
          .decode_image().resize(height=224, width=224)
          .shuffle(buffer_size=1000).batch(batch_size=64).prefetch()
          .options(seed=42))
    for batch in ds: ...

Any stage also takes parallelism=, buffer_size= (its output buffer; output_buffer= where the
operator has a buffer_size of its own, as shuffle and prefetch do), error_policy= ("fail" or
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
import difflib
import json

from . import _param_text, _sluice

_ENGINE_ARGUMENTS = ("parallelism", "buffer_size", "error_policy", "interleave", "output_buffer", "name", "per_input")


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


class _Held:
    """A Python object a stage uses, under a handle the spec names; forgotten with the datasets."""

    def __init__(self, obj):
        self.handle = _sluice.hold(obj)

    def __del__(self):
        try:
            _sluice.forget(self.handle)
        except Exception:
            pass


class Dataset:
    """A pipeline being built: each method returns a new Dataset with one more stage.

    Iterating a dataset again gives its next epoch (the next shuffles), as in tf.data."""

    def __init__(self, stages=(), options=None, held=()):
        self._stages = list(stages)
        self._options = dict(options or {})
        self._held = list(held)
        self._iterated = None  # the Pipeline that `for` and torch() run: it counts the epochs

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
            elif name == "per_input":
                stage["per_input"] = bool(value)
            elif name == "error_policy":
                if value not in ("fail", "skip"):
                    raise ValueError(f"{op}(): error_policy is 'fail' or 'skip', not {value!r}")
                stage["error_policy"] = value
            else:
                stage[name] = int(value)
        return Dataset(self._stages + [stage], self._options, self._held + list(held))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        schema = _schemas().get(name)
        if schema is None or schema["kind"] in ("source", "combine"):
            raise _unknown_operator(name, "operator")

        def add_stage(**kwargs):
            return self._with_stage(name, *_split_arguments(schema, kwargs))

        add_stage.__name__ = name
        add_stage.__doc__ = _docstring(schema)
        return add_stage

    def __dir__(self):
        return sorted(set(super().__dir__()) | {n for n, s in _schemas().items() if s["kind"] not in ("source", "combine")})

    def map(self, fn, *, parallelism=None, buffer_size=None, error_policy=None, name=None):
        """Calls fn(element) on each element (a dict of numpy arrays); fn returns the new element
        (a dict, or one value as field "value"). It runs on the engine's workers, holding the GIL."""
        held = _Held(fn)
        return self._with_stage("python_map", {"function": held.handle},
                                {"parallelism": parallelism, "buffer_size": buffer_size, "error_policy": error_policy, "name": name},
                                [held])

    def filter(self, predicate, *, parallelism=None, buffer_size=None, error_policy=None, name=None):
        """Keeps the elements for which predicate(element) is true."""
        held = _Held(predicate)
        return self._with_stage("python_filter", {"function": held.handle},
                                {"parallelism": parallelism, "buffer_size": buffer_size, "error_policy": error_policy, "name": name},
                                [held])

    def concatenate(self, *others, name=None):
        """All of this dataset's elements, then all of each of `others` (tf.data's concatenate)."""
        return _combine("concatenate", (self,) + others, {}, name)

    def options(self, *, seed=None, deterministic=None, error_policy=None, fuse_stages=None):
        """The pipeline's options: the seed of every random stage, whether parallel stages keep
        order, the default error policy, whether neighbouring maps share workers."""
        options = dict(self._options)
        for key, value in (("seed", seed), ("deterministic", deterministic), ("error_policy", error_policy),
                           ("fuse_stages", fuse_stages)):
            if value is not None:
                options[key] = value
        return Dataset(self._stages, options, self._held)

    # -- using ---------------------------------------------------------------------------------

    def spec(self):
        """The pipeline file's text (protobuf text format, a line per stage)."""
        spec = {"stage": self._stages}
        if self._options:
            spec["options"] = self._options
        return _sluice.spec_from_json(json.dumps(spec))

    def pipeline(self, **options):
        """A new sluice.Pipeline of this dataset (set=, seed=, plugin_dirs=, metrics_addr=), at
        epoch 0."""
        from . import Pipeline
        import os

        return Pipeline(_text=self.spec(), _file=os.path.join(os.getcwd(), "pipeline.txtpb"), _keep=self._held, **options)

    def _pipeline_to_iterate(self):
        if self._iterated is None:
            self._iterated = self.pipeline()
        return self._iterated

    def __iter__(self):
        return iter(self._pipeline_to_iterate())

    def torch(self):
        """Iterates with each field a torch.Tensor (see Pipeline.torch)."""
        return self._pipeline_to_iterate().torch()


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
    """One element from each dataset, their fields merged (tf.data's Dataset.zip); it ends with
    the shortest. prefixes=["a", "b"] names the fields a/FIELD, b/FIELD (needed when they clash)."""
    return _combine("zip", datasets, {"prefixes": prefixes}, name)


def concatenate(*datasets, name=None):
    """All elements of the first dataset, then of the second, and so on."""
    return _combine("concatenate", datasets, {}, name)


def sample_from_datasets(datasets, weights=None, *, stop_on_empty_dataset=False, name=None):
    """Each element from one of `datasets`, picked at random with `weights` (equal by default),
    the same for the same seed at any parallelism (tf.data's sample_from_datasets)."""
    return _combine("sample_from_datasets", datasets,
                    {"weights": weights, "stop_on_empty_dataset": stop_on_empty_dataset}, name)


def choose_from_datasets(datasets, choice_dataset, *, field="value", stop_on_empty_dataset=True, name=None):
    """Element i from datasets[c], c being the integer `field` of choice_dataset's element i
    (tf.data's choose_from_datasets; sluice.data.range gives the field "value")."""
    return _combine("choose_from_datasets", list(datasets) + [choice_dataset],
                    {"field": field, "stop_on_empty_dataset": stop_on_empty_dataset}, name)


def from_generator(generator, *, buffer_size=None, error_policy=None, name=None):
    """Elements from a Python generator function (called again for each pass) or an iterable;
    each element is a dict of fields or one value (field "value")."""
    held = _Held(generator)
    return Dataset()._with_stage("python_generator", {"function": held.handle},
                                 {"buffer_size": buffer_size, "error_policy": error_policy, "name": name}, [held])


def from_tensor_slices(arrays, *, name=None):
    """Element i is row i of every array of `arrays` (a dict of name -> array), over the arrays'
    own memory (tf.data's from_tensor_slices)."""
    if not isinstance(arrays, dict):
        arrays = {"value": arrays}
    held = _Held(dict(arrays))
    return Dataset()._with_stage("python_tensor_slices", {"tensors": held.handle}, {"name": name}, [held])


def __getattr__(name):
    schema = _schemas().get(name)
    if schema is None or schema["kind"] != "source":
        raise _unknown_operator(name, "source")

    def make_source(**kwargs):
        return Dataset()._with_stage(name, *_split_arguments(schema, kwargs))

    make_source.__name__ = name
    make_source.__doc__ = _docstring(schema)
    return make_source


def __dir__():
    public = {n for n in globals() if not n.startswith("_")} - {"difflib", "json"}
    return sorted(public | {n for n, s in _schemas().items() if s["kind"] == "source"})
