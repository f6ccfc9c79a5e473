"""Sluice from Python: run pipeline files, build pipelines the tf.data way (sluice.data), and feed
a training loop with NumPy arrays or DLPack tensors (PyTorch, JAX, CuPy) over the batches' own
memory.

    import sluice
    for batch in sluice.Pipeline("train.txtpb", set={"files.patterns": "data/*.tfrecord"}):
        images, labels = batch["image"], batch["label"]   # numpy.ndarray views, no copy

The engine is the CLI's: the same validation and messages (sluice.SpecError), the same output,
the same metrics (snapshot(), report(), metrics_addr= for the studio to attach to).
"""
import atexit
import collections
import operator
import os
import sys
import time
import weakref

from . import _sluice
from ._sluice import PipelineError, SpecError, Tensor

__all__ = ["AUTOTUNE", "Pipeline", "SpecError", "PipelineError", "Tensor", "data", "delivery_ledger", "nested", "ragged_rows", "validate"]

# tf.data's name for "let the engine choose": parallelism=sluice.AUTOTUNE, buffer_size=sluice.AUTOTUNE.
AUTOTUNE = -1

# Every run not yet closed: closed before the interpreter tears itself down, so that no engine
# thread is left running Python code (or waiting for the GIL) while the interpreter goes away.
# Elements queued for a Python function are not mapped first; a call that is stuck holds the exit
# for at most _EXIT_PATIENCE seconds, and is then left behind, named.
_live_runners = weakref.WeakSet()
_EXIT_PATIENCE = 2.0


@atexit.register
def _close_live_runners():
    for runner in list(_live_runners):
        runner.close(_EXIT_PATIENCE)


def _string_map(values):
    return {str(k): _param_text(v) for k, v in (values or {}).items()}


def _param_text(value):
    """A Python value as the text a pipeline file's parameter holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_param_text(v) for v in value)
    return str(value)


def ragged_rows(batch, field):
    """The rows of a ragged field of a batch made by ragged_batch (or bucket/pack stages' ragged
    output): its values split by FIELD_row_lengths or FIELD_row_splits, as a list of views of the
    values (NumPy arrays or torch tensors, whichever the batch holds), nothing copied."""
    values = batch[field]
    if field + "_row_splits" in batch:
        splits = [int(v) for v in batch[field + "_row_splits"]]
    elif field + "_row_lengths" in batch:
        splits = [0]
        for length in batch[field + "_row_lengths"]:
            splits.append(splits[-1] + int(length))
    else:
        raise KeyError(f"the batch has no {field}_row_lengths or {field}_row_splits: is '{field}' a ragged field "
                       f"(ragged_batch)? its fields: {', '.join(batch)}")
    if splits[-1] != len(values):
        raise ValueError(f"'{field}' holds {len(values)} rows of values, its partition says {splits[-1]}")
    return [values[splits[k]:splits[k + 1]] for k in range(len(splits) - 1)]


def nested(batch, field):
    """A ragged field as a torch nested tensor (torch.nested.nested_tensor), what PyTorch's
    variable-length models take; its rows are copied once, into the nested tensor."""
    import numpy
    import torch

    rows = ragged_rows(batch, field)
    return torch.nested.nested_tensor([row if isinstance(row, torch.Tensor) else torch.from_numpy(numpy.ascontiguousarray(row))
                                       for row in rows])


def _read_pipeline_file(path):
    """The file's text, or SpecError with the CLI's message."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except OSError:
        raise SpecError(f"{path}: cannot open the pipeline file (does it exist and is it readable?)") from None


def validate(path, *, set=None, seed=None, plugin_dirs=None):
    """Checks a pipeline file as `sluice validate` does; returns its text with `set=` and `seed=`
    applied, or raises SpecError listing every problem (the CLI's messages, word for word)."""
    path = os.fspath(path)
    return _sluice.validate(_read_pipeline_file(path), path, _string_map(set), seed, [os.fspath(d) for d in (plugin_dirs or [])], False)


def _named_records(records):
    """Pipeline(skip_records=): "RECORD SOURCE" lines from lineage() rows (a zipped row's parts
    each) or (source, record) pairs."""
    lines = []
    for item in records:
        if isinstance(item, dict) and "parts" in item:
            lines += [f"{int(part['record'])} {part['source']}" for part in item["parts"]]
        elif isinstance(item, dict):
            lines.append(f"{int(item['record'])} {item['source']}")
        else:
            source, record = item
            lines.append(f"{int(record)} {os.fspath(source)}")
    return "\n".join(lines) + "\n"


class Pipeline:
    """A pipeline to run: from a file (`Pipeline(path)`), from a file's text
    (`Pipeline.from_spec(text)`) or from `sluice.data`.

    Iterating runs it once and yields each element reaching its end (the input of its sink, which
    is not run) as a dict of field -> numpy.ndarray, a view of the batch's memory; a bytes field
    is bytes, or a NumPy array of bytes objects in its shape (as tf.data gives it). `torch()` yields torch.Tensors (through DLPack), `tensors()` yields
    sluice.Tensor objects for any DLPack consumer. A pipeline ending in `gpu_feed` yields, per
    step, a list with one dict of device tensors per device. `run()` runs it as it is, sinks
    included, like `sluice run`. A pipeline that ends in several stages (a tee) iterates the one
    named by `output=` (a sink's input, or any stage as one more reader of it), the other
    branches running as written.

    Each run (an iteration, or `run()`) is the pipeline's next epoch: a new `iter()` gets the next
    epoch's shuffles and random draws, as the same pipeline with a `repeat` at its end would give
    in one run. `epoch` is the epoch the next run starts at; set it to continue where an earlier
    process stopped. Upstream of a `repeat(count=k)`, one run is k epochs of its input.

    `state_dict()` says where an iteration stands, to save with the model (torch.save takes it);
    `load_state_dict(state)` on a Pipeline of the same file makes the next `iter()` continue
    exactly there, with the same shuffles and random draws, after a preempted job restarts.

    Run as one of several workers (under torchrun, srun, mpirun, or with `worker_index=` and
    `num_workers=`), each run reads this worker's shard as `sluice run` does: `worker` says which
    worker this is, as (index, count, who said so).

    `skip_records=` (rows `lineage()` gave, or (source, record) pairs) drops those records
    wherever they come, before the first batch: the other elements keep their order and draws.

    With `lineage=True`, `lineage(batch)` says which records made an output the loop was given
    (each row's file, record and the epoch it was read in), for the last 4,096 outputs, and
    `ledger()` whether each epoch gave every record once: the delivery ledger, kept across
    iterations and carried by `state_dict()` (`sluice.delivery_ledger(states)` merges a job's).
    """

    def __init__(self, path=None, *, set=None, seed=None, plugin_dirs=None, metrics_addr=None, worker_index=None,
                 num_workers=None, output=None, lineage=False, skip_records=None, _text=None, _file=None, _keep=None,
                 _structure=None):
        if path is not None:
            _file = os.path.abspath(os.fspath(path))
            _text = _read_pipeline_file(os.fspath(path))  # named as given in the message
        if _text is None:
            raise TypeError("Pipeline() needs a pipeline file (or use Pipeline.from_spec(text) or sluice.data)")
        self._text = _text
        self._file = _file or os.path.join(os.getcwd(), "pipeline.txtpb")
        self._sets = _string_map(set)
        self._seed = seed
        self._plugin_dirs = [os.fspath(d) for d in (plugin_dirs or [])]
        if skip_records:
            # Dropped before the first batch: every other element keeps its place and random draws.
            self._text = _sluice.skip_named_records(self._text, self._file, _named_records(skip_records), self._plugin_dirs)
        self._metrics_addr = metrics_addr or ""
        self._keep = _keep  # Python functions and arrays the stages use
        self._structure = _structure  # sluice.data's: how the fields make the elements (tuples, scalars)
        self._runner = None
        self._resume = None  # a state from load_state_dict(), for the next run
        self._resume_job = []  # or the states of every worker of a job of another size
        self.epoch = 0
        # Which of the job's workers this process is (torchrun's RANK and WORLD_SIZE, Slurm, MPI,
        # TF_CONFIG, ...; or as given): with several, each run reads this worker's shard.
        self._worker_index = worker_index
        self._num_workers = num_workers
        # A pipeline that ends in several stages (a tee) says which one Python iterates.
        self._output = output or ""
        self._lineage = bool(lineage)
        self._ledgers = []  # what earlier runs delivered (lineage=True), which the next run goes on with
        self._given = collections.deque(maxlen=4096)  # (a weak reference to an output's first array, its step)
        self.worker = _sluice.worker_identity(worker_index, num_workers)
        # The same validation as `sluice validate`: every problem, before anything runs.
        self._checked = _sluice.validate(self._text, self._file, self._sets, self._seed, self._plugin_dirs, True, self._output)

    @classmethod
    def from_spec(cls, text, *, base_dir=None, **options):
        """A pipeline from the text of a pipeline file; its relative paths are taken from
        `base_dir` (default: the current directory)."""
        folder = os.path.abspath(base_dir or os.getcwd())
        return cls(_text=text, _file=os.path.join(folder, "pipeline.txtpb"), **options)

    def spec(self):
        """The pipeline file's text, with `set=` and `seed=` applied."""
        return self._checked

    def _start(self, iterate):
        epoch = operator.index(self.epoch)
        if epoch < 0:
            raise ValueError(f"Pipeline.epoch must be 0 or more, not {epoch}")
        resume, self._resume = self._resume, None
        resume_job, self._resume_job = self._resume_job, []
        if (resume is not None or resume_job) and not iterate:
            raise RuntimeError("run() cannot continue a state from load_state_dict(): iterate the pipeline instead")
        runner = _sluice.Runner(self._text, self._file, self._sets, self._seed, self._plugin_dirs, self._metrics_addr, iterate,
                                epoch, self._worker_index, self._num_workers, self._output, resume or b"", resume_job,
                                self._lineage, self._ledgers)
        self._given.clear()
        self.epoch = epoch + 1
        _live_runners.add(runner)
        self._runner = runner
        return runner

    def _iterate(self, arrays, convert=None):
        runner = self._start(True)
        structure = self._structure
        try:
            while True:
                try:
                    item = runner.next(arrays)
                except StopIteration:
                    return
                if convert is not None:
                    item = convert(item)
                if structure is not None:
                    item = structure.unflatten(item)
                if self._lineage:
                    self._remember(item, runner.steps_given - 1)
                yield item
        finally:
            runner.close()
            if self._lineage:
                self._ledgers = [runner.ledger_bytes()]

    def __iter__(self):
        return self._iterate(True)

    def tensors(self):
        """Iterates like the pipeline itself, with each field a sluice.Tensor (DLPack)."""
        return self._iterate(False)

    def torch(self):
        """Iterates with each field a torch.Tensor over the batch's memory (through DLPack)."""
        from torch.utils.dlpack import from_dlpack

        def convert(value):
            if isinstance(value, Tensor):
                return from_dlpack(value)
            if isinstance(value, dict):
                return {k: convert(v) for k, v in value.items()}
            if isinstance(value, list) and value and isinstance(value[0], dict):
                return [convert(v) for v in value]
            return value

        return self._iterate(False, convert)

    def _remember(self, item, step):
        leaf = _first_weak_leaf(item)
        if leaf is not None:
            self._given.append((weakref.ref(leaf), step))

    def lineage(self, batch=None, *, step=None):
        """Which records made an output of the current iteration: `batch` as the loop was given
        it (the same object), or its `step` (0: the iteration's first output), or, with neither,
        the last one given. A list with one dict per row (one for an unbatched element): its
        "source" (the file or object read), "record" (its index there), "byte_offset" and
        "epoch" (the epoch it was read in); a row of a zip has "parts", one such dict per
        input. Needs `lineage=True`; the last 4,096 outputs are kept."""
        runner = self._runner
        if not self._lineage:
            raise ValueError("lineage(): make the Pipeline with lineage=True to follow which records make each output")
        if runner is None:
            raise RuntimeError("lineage(): the pipeline has not run yet")
        if step is None and batch is not None:
            leaf = _first_weak_leaf(batch)
            step = next((s for ref, s in reversed(self._given) if leaf is not None and ref() is leaf), None)
            if step is None:
                raise ValueError("lineage(): this batch is not one of the last outputs the current iteration gave (pass the object the loop "
                                 "was given, or step=)")
        if step is None:
            step = runner.steps_given - 1
        return runner.lineage(operator.index(step))

    def replay(self, step, *, epoch=None):
        """Output `step` of an epoch (0: its first; default: the current or last iteration's) made
        again, exactly as the iteration gave it: the same records, the same random draws. A
        pipeline whose source starts anywhere (random_access) through maps and a batch makes it
        directly, in a time that does not grow with the step; any other (a shuffle buffer, a
        reader that reads in order) runs the epoch to it, and says so on stderr."""
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"replay(): step must be 0 or more, not {step}")
        if epoch is None:
            epoch = self.epoch - 1 if self._runner is not None else self.epoch
        epoch = operator.index(epoch)
        runner = _sluice.Runner(self._text, self._file, self._sets, self._seed, self._plugin_dirs, "", True, epoch, self._worker_index,
                                self._num_workers, self._output, b"", [], self._lineage, [], step)
        started = time.perf_counter()
        try:
            try:
                item = runner.next(True)
                if runner.replay_why:
                    print(f"sluice: replay(step={step}): {runner.replay_why}; made by running epoch {epoch} to it (the {step} outputs "
                          f"before it made again in {time.perf_counter() - started:.2f} s)", file=sys.stderr)
            except StopIteration:
                raise IndexError(f"replay(): epoch {epoch} has no step {step}: its outputs end before") from None
            except PipelineError as e:
                if f"epoch {epoch} has no step {step}" in str(e):  # (said by a direct replay)
                    raise IndexError(f"replay(): epoch {epoch} has no step {step}: its outputs end before") from None
                raise
        finally:
            runner.close()
        return item if self._structure is None else self._structure.unflatten(item)

    def state_dict(self):
        """Where the pipeline stands, as a dict to save with the model: during an iteration,
        positions only (the engine's latest cut behind the loop, with the elements held in
        buffers named by where they were read, and how many outputs the loop took after it,
        which a restored run makes again and drops); between iterations, the next epoch. Taking
        it does not disturb the iteration, and asks for the next cut in the background. Raises
        ValueError when a stage cannot save its state (a Python generator source, a stage with
        `deterministic: false`)."""
        runner = self._runner
        if runner is not None and runner.running:
            return {"epoch": self.epoch - 1, "checkpoint": runner.checkpoint()}
        if self._lineage:
            return {"epoch": self.epoch, "ledger": runner.ledger_bytes() if runner is not None else _sluice.merged_ledgers(self._ledgers)}
        return {"epoch": self.epoch}

    def ledger(self):
        """The delivery ledger of this pipeline's iterations (lineage=True): a dict per epoch with
        "records" (distinct records given), "deliveries", "expected" (the records of the files
        read, once every one was read to its end; else None), "twice" and "missing" (counts) with
        "twice_named" and "missing_named" (the first of them, as (source, record)), and
        "under_way" (the last epoch of a run not ended: what is missing may still come). Carried
        through state_dict() and load_state_dict(); merge a job's with sluice.delivery_ledger()."""
        if not self._lineage:
            raise ValueError("ledger(): make the Pipeline with lineage=True to keep a ledger of what each epoch delivered")
        if self._runner is None:
            return _sluice.ledger_of_states([], self._ledgers)["epochs"]
        return self._runner.ledger()

    def load_state_dict(self, state):
        """Makes the next iteration continue from `state` (from state_dict(), maybe of another
        process): the elements it had not given yet first, then the rest of its run, exactly as
        the interrupted iteration would have gone on. A state of another pipeline, seed or file
        list is refused when the iteration starts, saying what differs.

        A job resumed on another number of workers gives every worker the list of all the
        earlier workers' states, in worker order: each continues the epoch with its share of the
        records none of them had delivered (a pipeline whose source is random_access, whose
        other stages hold only elements). With the same number of workers, each takes its own
        state from the list."""
        if isinstance(state, (list, tuple)):
            self._load_job_states(list(state))
            return
        if not isinstance(state, dict) or "epoch" not in state:
            raise ValueError("load_state_dict() takes a dict made by Pipeline.state_dict(), or the list of such dicts of every worker of a job")
        self.close()
        self.epoch = operator.index(state["epoch"])
        self._resume = _state_bytes(state, "load_state_dict()")
        self._resume_job = []
        if self._lineage:
            self._ledgers = [bytes(state["ledger"])] if state.get("ledger") is not None else []

    def _load_job_states(self, states):
        if not states or not all(isinstance(s, dict) and "epoch" in s for s in states):
            raise ValueError("load_state_dict() takes a dict made by Pipeline.state_dict(), or the list of such dicts of every worker of a job "
                             "(in worker order)")
        index, count = self.worker[0], self.worker[1]
        if len(states) == count:
            self.load_state_dict(states[index])
            return
        # What the workers between iterations had delivered joins the first new worker's ledger
        # (the others' ledgers travel in their states).
        finished = [bytes(s["ledger"]) for s in states if s.get("checkpoint") is None and s.get("ledger") is not None]
        ledgers = finished if self._lineage and index == 0 else []
        checkpoints = [_state_bytes(s, f"load_state_dict(): the state of worker {w} of {len(states)}") for w, s in enumerate(states)]
        epochs = [operator.index(s["epoch"]) for s in states]
        inside = {e for e, c in zip(epochs, checkpoints) if c is not None}
        if not inside:  # every worker between two iterations: any number of workers starts the next alike
            if len(set(epochs)) != 1:
                raise ValueError(f"load_state_dict(): the workers' states are at different epochs ({sorted(set(epochs))}): give states taken at one moment")
            self.close()
            self.epoch, self._resume, self._resume_job, self._ledgers = epochs[0], None, [], ledgers
            return
        if len(inside) != 1:
            raise ValueError(f"load_state_dict(): the workers' states are in different epochs ({sorted(inside)}): give states taken at one moment")
        epoch = inside.pop()
        for w, (e, c) in enumerate(zip(epochs, checkpoints)):
            if c is None and e != epoch + 1:
                raise ValueError(f"load_state_dict(): worker {w}'s state is at epoch {e}, the others inside epoch {epoch}: give states taken at one moment")
        self.close()
        self.epoch = epoch
        self._ledgers = ledgers
        self._resume = None
        # A worker between iterations had given its whole share of the epoch.
        self._resume_job = [c if c is not None else b"" for c in checkpoints]

    def run(self):
        """Runs the pipeline as it is (its own sinks write their files), to the end; returns its
        end state ("finished"). Raises PipelineError when a stage fails."""
        runner = self._start(False)
        try:
            return runner.run_to_end()
        finally:
            runner.close()

    @property
    def metrics_url(self):
        """Where the current run serves /metrics, /stream and /pipeline (metrics_addr=)."""
        return self._runner.metrics_url if self._runner is not None else ""

    def snapshot(self):
        """The current (or last) run's metrics, as a dict with the fields of a --metrics-log line
        (core/proto/metrics.proto), every one present (zeros too) and counts as ints."""
        if self._runner is None:
            raise RuntimeError("the pipeline has not run yet")
        return self._runner.snapshot()

    def report(self):
        """The end-of-run report of the current (or last) run, as `sluice run` prints it."""
        if self._runner is None:
            raise RuntimeError("the pipeline has not run yet")
        return self._runner.report()

    def close(self):
        """Stops the current run, if any, and joins its threads."""
        if self._runner is not None:
            self._runner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def delivery_ledger(states):
    """The delivery ledgers of several states (state_dict() dicts of a job's workers, taken by
    Pipelines made with lineage=True) merged: {"epochs": a verdict dict per epoch (see
    Pipeline.ledger()), "text": the verdicts as `sluice ledger` prints them, "clean": no record
    twice and none missing}."""
    checkpoints, ledgers = [], []
    for k, state in enumerate(states):
        if isinstance(state, dict) and state.get("checkpoint") is not None:
            checkpoints.append(bytes(state["checkpoint"]))
        elif isinstance(state, dict) and state.get("ledger") is not None:
            ledgers.append(bytes(state["ledger"]))
        else:
            raise ValueError(f"delivery_ledger(): state {k} is not a state_dict() of a Pipeline made with lineage=True")
    return _sluice.ledger_of_states(checkpoints, ledgers)


def _first_weak_leaf(item):
    """The first value of an output that a weak reference can follow (an array, a tensor)."""
    values = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else [item]
    for value in values:
        if isinstance(value, (dict, list, tuple)):
            found = _first_weak_leaf(value)
            if found is not None:
                return found
            continue
        try:
            weakref.ref(value)
        except TypeError:
            continue
        return value
    return None


def _state_bytes(state, what):
    checkpoint = state.get("checkpoint")
    if checkpoint is not None and not isinstance(checkpoint, (bytes, bytearray)):
        raise ValueError(f"{what}: 'checkpoint' must be the bytes state_dict() made")
    return bytes(checkpoint) if checkpoint is not None else None


from . import data  # noqa: E402  (uses Pipeline)
