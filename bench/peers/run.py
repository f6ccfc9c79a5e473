#!/usr/bin/env python3
"""Runs bench/peers: each workload done by each system, the systems alternating in rounds (a
different order each round), and writes the table into bench/peers/README.md (between its
`peers-table` markers) and every measurement into bench/peers/latest.json.

Each figure is a median over the rounds with its range; a ratio is Sluice's over the peer's in the
same round, then the median and range of those. "per CPU s" counts the items made per second of
CPU time the system used (its worker processes included): what a core buys.

Usage (from the repository root, after scripts/demo.sh and SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh):
  python3 bench/peers/run.py [--rounds N] [--build BUILD] [--only WORKLOAD ...] [--no-write]"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOADS = {  # name: (what it is, epochs)
    "image": ("JPEG tf.Example shards -> parse -> decode -> resize 224 (crop) -> normalize -> batch 64; 2,048 images x 3 epochs", 3),
    "tiny": ("1,000,000 tf.Examples of two int64 features -> parse -> batch 1024; x 3 epochs (Grain: its first 20,000 x 3)", 3),
    "shuffle": ("the tiny records in a permutation of all of them each epoch (Sluice: random_access through the files' indexes; "
                "Grain: its ArrayRecord source shuffled, its first 20,000; tf.data: a shuffle buffer of the whole dataset) "
                "-> parse -> batch 1024; x 2 epochs", 2),
    "text": ("200,000 lines of token ids -> split into int64 tokens -> bucket_by_sequence_length (6 buckets, about 4,096 "
             "tokens a batch, padded to each batch's longest); x 2 epochs", 2),
    "checkpoint": ("the image pipeline with a shuffle buffer of 1,000 decoded images (Grain, and Sluice's random_access row: "
                   "a shuffle through random access, no buffer; DALI, and Sluice's records shuffled row: a buffer of 1,000 records, before decoding): the iterator's state saved to a file after 40 batches of 64, then a fresh iterator restored from it "
                   "to its first batch", 1),
    "service": ("a dispatcher and workers on this machine, each system's own, read in dynamic sharding: the sample images "
                "parsed, decoded and resized (uint8) on the workers, batched by 64 in the trainer, through one worker and "
                "through two; then the million tiny records on two workers, one killed (SIGKILL) at 30% of the epoch, every "
                "id received counted", 1),
}
# Workloads whose figures are a state's size and times, not a rate.
STATE_WORKLOADS = {"checkpoint"}
REFERENCE = "Sluice (Python)"
# Pairs compared besides: the same code as the peer's (Sluice written as tf.data's guide writes it).
ALSO_COMPARED = [("Sluice (Python, interleaved)", "tf.data")]
# A checkpoint is compared with the Sluice pipeline that shuffles where the peer does: Grain through
# random access (no buffer), DALI in its reader (a buffer of records, before decoding); tf.data and
# the reference row both shuffle the decoded images.
STATE_COUNTERPARTS = {"Grain": "Sluice (Python, random_access)", "DALI": "Sluice (Python, records shuffled)"}


def systems(build):
    venv = os.path.join(build, "peers", "bin", "python")
    sluice_env = {"PYTHONPATH": os.path.join(build, "python"), "SLUICE": os.path.join(build, "bin", "sluice")}
    quiet_tf = {"PYTHONDONTWRITEBYTECODE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return {
        # (bench/checkpoint.sh measures the CLI's checkpoints.)
        "Sluice (CLI)": ("cli", None, {"image", "tiny", "shuffle", "text"}),  # (and bench/service.sh the CLI's service)
        REFERENCE: (["/usr/bin/python3", f"{HERE}/peer_sluice.py"], sluice_env, None),
        "Sluice (Python, interleaved)": (["/usr/bin/python3", f"{HERE}/peer_sluice.py", "--interleave"], sluice_env, {"tiny"}),
        # Grain's way of shuffling (random access, no buffer), for its checkpoints.
        "Sluice (Python, random_access)": (["/usr/bin/python3", f"{HERE}/peer_sluice.py", "--global-shuffle"], sluice_env, {"checkpoint"}),
        # DALI's way (a buffer of records, before decoding), as tf.data's guide orders a pipeline.
        "Sluice (Python, records shuffled)": (["/usr/bin/python3", f"{HERE}/peer_sluice.py", "--records-shuffle"], sluice_env, {"checkpoint"}),
        "tf.data": ([venv, f"{HERE}/peer_tfdata.py"], quiet_tf, None),
        # Grain has no text-line source and no batching by length (bench/peers/README.md).
        # Grain has no service of its own.
        "Grain": ([venv, f"{HERE}/peer_grain.py"], quiet_tf, {"image", "tiny", "shuffle", "checkpoint"}),
        "DataLoader": (["/usr/bin/python3", f"{HERE}/peer_torch.py"], {}, {"image"}),
        # DALI's CPU pipelines (no GPU here): its TFRecord reader has no global shuffle, no text
        # lines, no batching by length, no service.
        "DALI": ([venv, f"{HERE}/peer_dali.py"], quiet_tf, {"image", "tiny", "checkpoint"}),
    }


def run_cli(build, workload, data, epochs):
    """`sluice run` of the workload's pipeline file: wall and CPU time of the process (os.wait4),
    items from its metrics log (the batch stage's elements in)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        pattern = {"image": f"{ROOT}/{data}/../sample_data/tfrecord/*.tfrecord", "tiny": f"{ROOT}/{data}/tiny/*.tfrecord",
                   "shuffle": f"{ROOT}/{data}/tiny/*.tfrecord", "text": f"{ROOT}/{data}/text/*.txt"}[workload]
        command = [f"{build}/bin/sluice", "run", "--quiet", "--metrics-log", log, "--set", f"files.patterns={pattern}",
                   "--set", f"epochs.count={epochs}", f"{HERE}/{workload}.txtpb"]
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            return {"error": process.stderr.read().decode(errors="replace").strip()[-400:]}
        with open(log) as f:
            last = json.loads(f.read().splitlines()[-1])
        items = next(int(s.get("elements_in", 0)) for s in last["stage"] if s["id"] == "batch")
        return {"items": items, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime}


def run_one(build, name, how, workload, data):
    command, env, only = how
    epochs = WORKLOADS[workload][1]
    if only is not None and workload not in only:
        return None
    if command == "cli":
        result = run_cli(build, workload, data, epochs)
    else:
        script, options = command[:2], command[2:]
        done = subprocess.run(script + [workload, data, str(epochs)] + options, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, **env}, timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip() or "no output")[-400:]}
    result.update(system=name, workload=workload)
    return with_rates(result)


def with_rates(result):
    """The rates the tables show, from what a peer measured (also for results read from latest.json)."""
    if "items" in result:
        result["per_s"] = result["items"] / result["seconds"]
        result["per_cpu_s"] = result["items"] / result["cpu_seconds"] if result["cpu_seconds"] > 0 else 0.0
    for workers in ("workers_1", "workers_2"):  # the service workload
        if workers in result:
            result[f"{workers}_per_s"] = result[workers]["items"] / result[workers]["seconds"]
    return result


def by_system(mine, columns, lines):
    """(system, its runs) for each system that ran; a system that failed gets its row of `columns`
    cells, the error in the first, in `lines` instead."""
    for name in dict.fromkeys(r["system"] for r in mine):
        runs = [r for r in mine if r["system"] == name]
        failed = [r for r in runs if "error" in r]
        if failed:
            lines.append(f"| {name} | did not run: {failed[0]['error'].splitlines()[-1][:160]} |" + " |" * (columns - 1))
            continue
        yield name, runs


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.node()}: {os.cpu_count()} cores ({model}), {time.strftime('%Y-%m-%d')}"


def spread(values, digits=0):
    values = sorted(values)
    fmt = f"{{:,.{digits}f}}"
    median = fmt.format(statistics.median(values))
    return median if len(values) == 1 else f"{median} ({fmt.format(values[0])}-{fmt.format(values[-1])})"


def round_ratios(results, ours, theirs, rounds, key):
    ratios = []
    for k in range(rounds):
        a = [r for r in results if r["system"] == ours and r["round"] == k and key in r]
        b = [r for r in results if r["system"] == theirs and r["round"] == k and key in r]
        if a and b and b[0][key] > 0:
            ratios.append(a[0][key] / b[0][key])
    return ratios


def state_table(mine, rounds):
    lines = [f"| system | state, bytes | saved in, s | resumed to its first batch, s | {REFERENCE}'s state / its | its resume time / {REFERENCE}'s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, runs in by_system(mine, 5, lines):
        size = "" if name == REFERENCE else spread(round_ratios(mine, REFERENCE, name, rounds, "checkpoint_bytes"), 5)
        resume = "" if name == REFERENCE else spread([1 / r for r in round_ratios(mine, REFERENCE, name, rounds, "resume_s")], 2)
        lines.append(f"| {name} | {spread([r['checkpoint_bytes'] for r in runs])} | {spread([r['save_s'] for r in runs], 3)} | "
                     f"{spread([r['resume_s'] for r in runs], 2)} | {size} | {resume} |")
    lines.append("")
    for theirs, ours in STATE_COUNTERPARTS.items():
        size, resume = round_ratios(mine, ours, theirs, rounds, "checkpoint_bytes"), round_ratios(mine, theirs, ours, rounds, "resume_s")
        if size:
            lines += [f"{ours} / {theirs}: its state {spread(size, 2)}x {theirs}'s, resumed {spread(resume, 2)}x as fast.", ""]
    return lines


def after_the_kill(killed):
    """How the trainers' epochs ended, as peer_service.py said ("the epoch's end", or why not)."""
    whole = sum(k["ended"] == "the epoch's end" for k in killed)
    other = [k["ended"] for k in killed if k["ended"] != "the epoch's end"]
    return f"{whole} of {len(killed)} reached the epoch's end" + (f"; the others: {other[0]}" if other else "")


def service_table(mine, rounds):
    lines = [f"| system | 1 worker, images/s | 2 workers, images/s | {REFERENCE} / it, 1 worker | 2 workers | "
             "one of 2 workers killed: records delivered | of them twice or more | missing | the trainer after the kill |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, runs in by_system(mine, 8, lines):
        ratios = ["" if name == REFERENCE else spread(round_ratios(mine, REFERENCE, name, rounds, f"{w}_per_s"), 2) for w in ("workers_1", "workers_2")]
        killed = [r["killed"] for r in runs]
        lines.append(f"| {name} | {spread([r['workers_1_per_s'] for r in runs])} | {spread([r['workers_2_per_s'] for r in runs])} | "
                     f"{ratios[0]} | {ratios[1]} | {spread([k['delivered'] for k in killed])} of {killed[0]['expected']:,} | "
                     f"{spread([k['twice_or_more'] for k in killed])} | {spread([k['missing'] for k in killed])} | "
                     f"{after_the_kill(killed)} |")
    return lines + [""]


def table(results, rounds):
    lines = []
    for workload, (what, _) in WORKLOADS.items():
        mine = [r for r in results if r["workload"] == workload]
        if not mine:
            continue
        if workload in STATE_WORKLOADS:
            lines += [f"**{workload}**: {what}", ""] + state_table(mine, rounds)
            continue
        if workload == "service":
            lines += [f"**{workload}**: {what}", ""] + service_table(mine, rounds)
            continue
        lines += [f"**{workload}**: {what}", "",
                  f"| system | items/s | items per CPU s | {REFERENCE} / it, items/s | per CPU s | import to first batch, s |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, runs in by_system(mine, 5, lines):
            ratio = "" if name == REFERENCE else spread(round_ratios(mine, REFERENCE, name, rounds, "per_s"), 2)
            cpu_ratio = "" if name == REFERENCE else spread(round_ratios(mine, REFERENCE, name, rounds, "per_cpu_s"), 2)
            starts = [r["import_to_first_s"] for r in runs if r.get("import_to_first_s") is not None]
            start = spread(starts, 2) if starts else ""
            lines.append(f"| {name} | {spread([r['per_s'] for r in runs])} | {spread([r['per_cpu_s'] for r in runs])} | {ratio} | {cpu_ratio} | {start} |")
        lines.append("")
        for ours, theirs in ALSO_COMPARED:
            per_s, per_cpu = round_ratios(mine, ours, theirs, rounds, "per_s"), round_ratios(mine, ours, theirs, rounds, "per_cpu_s")
            if per_s:
                lines += [f"{ours} / {theirs}: {spread(per_s, 2)} in items/s, {spread(per_cpu, 2)} per CPU s.", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--data", default="build/bench_peers")
    parser.add_argument("--only", action="append", choices=list(WORKLOADS),
                        help="run this workload only (repeatable); the others keep latest.json's figures if they were measured "
                             "on this machine in as many rounds")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave README.md and latest.json as they are")
    parser.add_argument("--from-json", action="store_true", help="write the table again from latest.json, running nothing")
    args = parser.parse_args()
    if args.from_json:
        with open(os.path.join(HERE, "latest.json")) as f:
            kept = json.load(f)
        kept["results"] = [with_rates(r) for r in kept["results"]]
        write_tables(kept["machine"], kept["results"], kept["rounds"])
        return
    if not os.path.exists(os.path.join(ROOT, args.data, "tiny_ar")):
        sys.exit(f"run.py: no data in {args.data}: {args.build}/peers/bin/python bench/peers/prepare.py first")
    every = systems(args.build)
    results = []
    for k in range(args.rounds):
        for workload in args.only or list(WORKLOADS):
            names = list(every)
            names = names[k % len(names):] + names[:k % len(names)]  # each round another order
            for name in names:
                result = run_one(args.build, name, every[name], workload, args.data)
                if result is None:
                    continue
                result["round"] = k
                results.append(result)
                shown = (f"{result['per_s']:,.0f} items/s, {result['per_cpu_s']:,.0f} per CPU s" if "per_s" in result else
                         f"state {result['checkpoint_bytes']:,} B, saved in {result['save_s']:.3f} s, resumed in {result['resume_s']:.2f} s"
                         if "checkpoint_bytes" in result else
                         f"1 worker {result['workers_1']['items'] / result['workers_1']['seconds']:,.0f} images/s, 2 workers "
                         f"{result['workers_2']['items'] / result['workers_2']['seconds']:,.0f}; killed: {result['killed']}"
                         if "killed" in result else result["error"][-200:])
                print(f"round {k + 1}/{args.rounds} {workload:6} {name:16} {shown}", flush=True)
    if args.only and not args.no_write:
        # The other workloads' figures stay as the last whole run measured them.
        with open(os.path.join(HERE, "latest.json")) as f:
            kept = json.load(f)
        kept["results"] = [with_rates(r) for r in kept["results"]]
        same_machine = kept["machine"].rsplit(", ", 1)[0] == machine().rsplit(", ", 1)[0]
        if kept["rounds"] == args.rounds and same_machine:
            results = [r for r in kept["results"] if r["workload"] not in args.only] + results
    text = f"{machine()}, {args.rounds} rounds\n\n" + table(results, args.rounds)
    print("\n" + text)
    if args.no_write:
        return
    with open(os.path.join(HERE, "latest.json"), "w") as f:
        json.dump({"machine": machine(), "rounds": args.rounds, "results": results}, f, indent=1)
    write_tables(machine(), results, args.rounds)


PEERS = ["tf.data", "Grain", "DALI", "DataLoader"]


def summary(results, rounds, machine_line):
    """The README's performance section: per workload, Sluice's figure and its ratio to each peer
    within rounds (median, range), a peer that was not run left blank."""
    lines = [f"{machine_line}; every figure in [bench/peers](bench/peers/README.md), made by "
             "`python3 bench/peers/run.py --rounds 3`, which rewrites this table.", "",
             f"| workload | {REFERENCE} | " + " | ".join(f"against {p}" for p in PEERS) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in PEERS) + " |"]
    for workload in WORKLOADS:
        mine = [r for r in results if r["workload"] == workload and "error" not in r]
        ours = [r for r in mine if r["system"] == REFERENCE]
        if not ours:
            continue
        cells = []
        if workload in STATE_WORKLOADS:
            figure = f"state {spread([r['checkpoint_bytes'] for r in ours])} B, resumed in {spread([r['resume_s'] for r in ours], 2)} s"
            for peer in PEERS:
                ours = STATE_COUNTERPARTS.get(peer, REFERENCE)
                size = round_ratios(mine, ours, peer, rounds, "checkpoint_bytes")
                resume = round_ratios(mine, peer, ours, rounds, "resume_s")
                if not size:
                    cells.append("")
                    continue
                share = statistics.median(size)
                of_its = f"1/{1 / share:,.0f} of its state" if share < 1 else f"{share:,.0f}x its state"
                against = "" if ours == REFERENCE else f" ({ours[len('Sluice (Python, '):-1]})"
                cells.append(f"{of_its}, resumed {spread(resume, 2)}x as fast{against}")
        elif workload == "service":
            killed = [r["killed"] for r in ours]
            figure = (f"{spread([r['workers_2_per_s'] for r in ours])} images/s through 2 workers; one killed: "
                      f"{spread([k['missing'] for k in killed])} missing, {spread([k['twice_or_more'] for k in killed])} twice")
            for peer in PEERS:
                ratio = round_ratios(mine, REFERENCE, peer, rounds, "workers_2_per_s")
                theirs = [r["killed"] for r in mine if r["system"] == peer]
                cells.append(f"{spread(ratio, 2)}x; theirs lost {spread([k['missing'] for k in theirs])}" if ratio else "")
        else:
            figure = f"{spread([r['per_s'] for r in ours])}/s"
            for peer in PEERS:
                ratio = round_ratios(mine, REFERENCE, peer, rounds, "per_s")
                per_cpu = round_ratios(mine, REFERENCE, peer, rounds, "per_cpu_s")
                cells.append(f"{spread(ratio, 2)}x ({spread(per_cpu, 2)}x per CPU s)" if ratio else "")
        lines.append(f"| {workload} | {figure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_between(path, name, text):
    with open(path) as f:
        page = f.read()
    begin, end = f"<!-- {name}: made by bench/peers/run.py -->", f"<!-- /{name} -->"
    if begin not in page or end not in page:
        sys.exit(f"run.py: {path} has no {begin} ... {end} markers")
    head, rest = page.split(begin, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])


def write_tables(machine_line, results, rounds):
    """The whole table into bench/peers/README.md, its summary into the project's README."""
    write_between(os.path.join(HERE, "README.md"), "peers-table", f"{machine_line}, {rounds} rounds\n\n" + table(results, rounds))
    write_between(os.path.join(ROOT, "README.md"), "performance", summary(results, rounds, machine_line))


if __name__ == "__main__":
    main()
