"""sluice.data.Dataset: a pipeline under construction, one stage per method; tf.data's
transformations and every loaded operator as methods."""
import builtins
import difflib
import json
import os
import tempfile


from . import AUTOTUNE, _param_text, _sluice
from ._structure import Structure as _Structure, TensorSpec
from ._tf_options import Options
from ._structure import is_plain_dict as _is_plain_dict
from ._ops import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, _ENGINE_ARGUMENTS, _Held, _KEEPS_FIELDS, _MemoryCache, _are_field_entries, _by_field, _check_parameters, _docstring, _is_remote_uri, _one_of_two, _padding_text, _processing_mode, _schemas, _spec_dtype, _split_arguments, _stage_cardinality, _tf_data_call, _unknown_operator


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


# Functions that build Datasets, which some methods call: imported once Dataset exists (a cycle
# Python resolves so).
from ._combinations import concatenate, zip  # noqa: E402
from ._sources import _WindowStandIn, _stand_ins, range  # noqa: E402
