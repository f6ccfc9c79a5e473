"""What every peer script reports: items made, wall seconds and CPU seconds (this process and the
worker processes it waited for) from the moment its iterator is made to the last item, the
seconds to the first item, and the seconds from its imports (of the system, its modules) to the
first item. Standard library only: it runs under Debian's Python (Sluice, PyTorch)
and under the peers environment's (tf.data, Grain)."""
import json
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


def report(system, workload, result, **extra):
    result.update(system=system, workload=workload, **extra)
    print(json.dumps(result), flush=True)


def fail(system, workload, why):
    """A peer that cannot run here says so, with the error it gave: the table shows it."""
    print(json.dumps({"system": system, "workload": workload, "error": why}), flush=True)
    sys.exit(3)
