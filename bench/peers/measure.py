"""What every peer script reports: items made, wall seconds and CPU seconds (this process and the
worker processes it waited for) from the moment its iterator is made to the last item, the
seconds to the first item, and the seconds from its imports (of the system, its modules) to the
first item. Standard library only: it runs under Debian's Python (Sluice, PyTorch)
and under the peers environment's (tf.data, Grain)."""
import gc
import json
import os
import resource
import sys
import time

# Each peer imports this module first: the start of "from import to the first batch".
IMPORTED_AT = time.perf_counter()


def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def consume(make_iterator, count_of, after=None):
    """Iterates what make_iterator() gives to the end; count_of(batch) items per batch. `after` (the
    iterator's shutdown: worker processes joined) runs inside the timed span."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    iterator = make_iterator()
    items, first = 0, None
    for batch in iterator:
        items += count_of(batch)
        if first is None:
            first = time.perf_counter() - wall
    del iterator
    if after:
        after()
    return {"items": items, "seconds": time.perf_counter() - wall, "cpu_seconds": cpu_seconds() - cpu, "first_s": first,
            "import_to_first_s": None if first is None else wall + first - IMPORTED_AT}


CHECKPOINT_STEP = 40  # batches of 64 taken before the state is saved (the shuffle buffer is full by then)


def checkpoint_figures(take_batch, save, release, make_resumed):
    """The checkpoint workload: CHECKPOINT_STEP batches taken (take_batch(step) gives one; a
    system whose state is taken from behind the loop may save along the way, as a training loop
    that checkpoints would), then save() -> the state's size in bytes, timed; release() ends the
    first iteration (its threads and processes, as a run that stopped); then make_resumed() -> a
    fresh iterator continuing from that state, timed to its first batch."""
    for step in range(1, CHECKPOINT_STEP + 1):
        take_batch(step)
    start = time.perf_counter()
    size = save()
    saved = time.perf_counter() - start
    release()
    gc.collect()
    start = time.perf_counter()
    resumed = make_resumed()
    next(resumed)
    return {"checkpoint_bytes": size, "save_s": saved, "resume_s": time.perf_counter() - start,
            "import_to_first_s": None}


def folder_bytes(folder):
    total = 0
    for path, _, names in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(path, n)) for n in names)
    return total


def report(system, workload, result, **extra):
    result.update(system=system, workload=workload, **extra)
    print(json.dumps(result), flush=True)


def fail(system, workload, why):
    """A peer that cannot run here says so, with the error it gave: the table shows it."""
    print(json.dumps({"system": system, "workload": workload, "error": why}), flush=True)
    sys.exit(3)
