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
from . import AUTOTUNE  # noqa: F401 (sluice.data.AUTOTUNE, as tf.data.AUTOTUNE)
from ._structure import TensorSpec  # noqa: F401
from ._tf_options import Options  # noqa: F401
from ._ops import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, _docstring, _schemas, _split_arguments, _tf_data_call, _unknown_operator, load_plugins  # noqa: F401
from ._dataset import Dataset  # noqa: F401
from ._combinations import choose_from_datasets, concatenate, sample_from_datasets, zip  # noqa: F401
from ._sources import ArrayRecordDataset, ParquetDataset, TFRecordDataset, TextLineDataset, from_generator, from_tensor_slices, from_tensors, list_files, range  # noqa: F401
from ._faces import experimental, tfds  # noqa: F401
from ._data_sources import ArrayRecordDataSource, DatasetDict, ParquetDataSource, load_dataset  # noqa: F401


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
    public = {n for n in globals() if not n.startswith("_")}
    return sorted(public | {n for n, s in _schemas().items() if s["kind"] == "source"})


# tf.data writes its sources as Dataset's static methods (tf.data.Dataset.from_tensor_slices(...)):
# the same functions, under those names too.
for _name in ("from_tensor_slices", "from_tensors", "from_generator", "range", "list_files", "sample_from_datasets", "zip",
              "choose_from_datasets"):
    setattr(Dataset, _name, staticmethod(globals()[_name]))
del _name

# What the submodules define is sluice.data's, as users import and read it (help(), tracebacks).
for _value in list(globals().values()):
    if getattr(_value, "__module__", "").startswith("sluice._") and _value is not TensorSpec and _value is not Options:
        _value.__module__ = __name__
del _value
