"""tf.data's combinations of datasets: zip, concatenate, sample_from_datasets,
choose_from_datasets."""
import builtins


from . import _param_text
from ._structure import ZippedStructure as _ZippedStructure
from ._dataset import Dataset


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
