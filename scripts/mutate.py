#!/usr/bin/env python3
"""Mutation check: puts each fault of tests/mutants.txt into the code, one at a time, rebuilds
incrementally, runs the tests that should catch it, and restores the file. Prints the score and
the mutants that survived. Run through scripts/mutate.sh (see tests/README.md)."""

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("name", "file", "line", "from", "to", "tests")


@dataclass
class Mutant:
    name: str
    file: str
    line: int
    original: str
    replacement: str
    tests: list
    where: str  # "mutants.txt:LINE" of the block, for messages
    found_line: int = 0
    outcome: str = ""
    detail: str = ""
    seconds: float = 0.0
    notes: list = field(default_factory=list)


def parse(path):
    mutants, problems = [], []
    block, start = {}, 0
    lines = path.read_text(encoding="utf-8").splitlines() + [""]
    for number, text in enumerate(lines, 1):
        if text.startswith("#"):
            continue
        if not text.strip():
            if block:
                missing = [k for k in KEYS if k not in block]
                where = f"{path.name}:{start}"
                if missing:
                    problems.append(f"{where}: the block lacks {', '.join(missing)}")
                elif not block["line"].isdigit():
                    problems.append(f"{where}: line '{block['line']}' is not a number")
                else:
                    tests = [t.strip() for t in block["tests"].split(",") if t.strip()]
                    mutants.append(Mutant(block["name"], block["file"], int(block["line"]), block["from"], block["to"], tests, where))
                block = {}
            continue
        key, sep, value = text.partition(": ")
        if not sep or key not in KEYS:
            problems.append(f"{path.name}:{number}: expected one of {', '.join(k + ':' for k in KEYS)} (got '{text}')")
            continue
        if key in block:
            problems.append(f"{path.name}:{number}: '{key}' given twice in one block (blocks are separated by a blank line)")
        if not block:
            start = number
        block[key] = value
    return mutants, problems


def locate(mutant, known_tests):
    """Finds the line that holds the original text; returns a problem, or None."""
    path = ROOT / mutant.file
    if not path.is_file():
        return f"{mutant.where}: {mutant.file} does not exist"
    if mutant.original == mutant.replacement:
        return f"{mutant.where}: 'from' and 'to' are the same"
    unknown = [t for t in mutant.tests if t != "all" and t not in known_tests]
    if unknown:
        return f"{mutant.where}: no ctest test named {', '.join(unknown)} (ctest -N lists them)"
    lines = path.read_text(encoding="utf-8").split("\n")
    hint = mutant.line - 1
    if 0 <= hint < len(lines) and mutant.original in lines[hint]:
        mutant.found_line = mutant.line
        return None
    if 0 <= hint < len(lines) and mutant.replacement and mutant.replacement in lines[hint] and mutant.original not in "\n".join(lines):
        return (f"{mutant.where}: {mutant.file}:{mutant.line} holds the mutant, not the original: an earlier run was "
                f"stopped hard; restore it with `git checkout -- {mutant.file}`")
    hits = [i for i, text in enumerate(lines) if mutant.original in text]
    if len(hits) == 1:
        mutant.found_line = hits[0] + 1
        mutant.notes.append(f"moved from line {mutant.line} to {mutant.found_line}: update {mutant.where}")
        return None
    if not hits:
        return f"{mutant.where}: '{mutant.original}' is no longer in {mutant.file}: update or remove this mutant"
    return (f"{mutant.where}: '{mutant.original}' is not on line {mutant.line} of {mutant.file} and occurs "
            f"{len(hits)} times (lines {', '.join(str(h + 1) for h in hits)}): give the right line")


def update_lines(path, mutants):
    """Rewrites the `line:` of each block whose text moved (code moved by a refactoring)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    moved = 0
    for m in mutants:
        if m.found_line == m.line:
            continue
        start = int(m.where.rsplit(":", 1)[1]) - 1
        for k in range(start, len(lines)):
            if lines[k].startswith("line: "):
                lines[k] = f"line: {m.found_line}"
                moved += 1
                break
    path.write_text("\n".join(lines), encoding="utf-8")
    print(f"{moved} line hints updated in {path}")
    return 0


def run(command, log, timeout=None):
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(command) + "\n").encode())
        out.flush()
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout).returncode


def failed_tests(log):
    text = Path(log).read_text(encoding="utf-8", errors="replace")
    tail = text[text.rfind("$ ctest"):]
    return re.findall(r"^\s*\d+ - (\S+) \(([^)]*)\)", tail, re.M)


class Interrupted(Exception):
    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", "build"), help="configured build folder (default: build)")
    parser.add_argument("--mutants", default=str(ROOT / "tests" / "mutants.txt"), help="list of mutants")
    parser.add_argument("--only", action="append", default=[], help="run only mutants whose name contains this text (repeatable)")
    parser.add_argument("--all-tests", action="store_true", help="run the whole suite for every mutant, not only its tests")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")), help="build and test jobs (default 2)")
    parser.add_argument("--list", action="store_true", help="check the list and print it; change nothing")
    parser.add_argument("--update-lines", action="store_true",
                        help="write the line where each mutant's text was found (only there) into the list; change no code")
    args = parser.parse_args()

    build = Path(args.build_dir)
    if not build.is_absolute():
        build = ROOT / build
    if not (build / "CMakeCache.txt").is_file():
        sys.exit(f"error: {build} is not a configured build folder; build first (bash scripts/build.sh), or give --build-dir")

    mutants, problems = parse(Path(args.mutants))
    listed = subprocess.run(["ctest", "--test-dir", str(build), "-N"], capture_output=True, text=True)
    known_tests = set(re.findall(r"Test\s+#\d+: (\S+)", listed.stdout))
    if not known_tests:
        sys.exit(f"error: ctest lists no tests in {build}: {listed.stderr.strip() or 'configure it with tests on'}")
    if args.only:
        mutants = [m for m in mutants if any(o in m.name for o in args.only)]
        if not mutants:
            sys.exit(f"error: no mutant's name contains {' or '.join(repr(o) for o in args.only)}")
    problems += [p for p in (locate(m, known_tests) for m in mutants) if p]
    if problems:
        print("error: the mutant list has problems; nothing was changed:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 2
    for m in mutants:
        for note in m.notes:
            print(f"note: {m.name}: {note}")
    if args.update_lines:
        return update_lines(Path(args.mutants), mutants)
    if args.list:
        for i, m in enumerate(mutants, 1):
            print(f"{i:2}. {m.name}\n    {m.file}:{m.found_line}  '{m.original}' -> '{m.replacement}'\n    tests: {', '.join(m.tests)}")
        return 0

    logs = build / "mutation"
    logs.mkdir(exist_ok=True)
    jobs = str(max(1, args.jobs))

    def tests_of(m):
        names = sorted(known_tests) if args.all_tests or "all" in m.tests else m.tests
        return "^(" + "|".join(re.escape(t) for t in names) + ")$"

    def stop_on_signal(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)

    started = time.monotonic()
    try:
        # Without mutants every test that will be asked must pass, or a "kill" would mean nothing.
        baseline = logs / "baseline.log"
        baseline.write_text("")
        print(f"building {build} and running the tests unmutated (log: {baseline})", flush=True)
        if run(["cmake", "--build", str(build), "-j", jobs], baseline) != 0:
            print(f"error: the unmutated tree does not build; see {baseline}", file=sys.stderr)
            return 2
        union = sorted(known_tests) if args.all_tests else sorted({t for m in mutants for t in (known_tests if "all" in m.tests else m.tests)})
        pattern = "^(" + "|".join(re.escape(t) for t in union) + ")$"
        if run(["ctest", "--test-dir", str(build), "-R", pattern, "-j", jobs, "--output-on-failure"], baseline) != 0:
            names = ", ".join(n for n, _ in failed_tests(baseline)) or "see the log"
            print(f"error: tests fail without any mutant ({names}); fix them first. Log: {baseline}", file=sys.stderr)
            return 2

        for index, m in enumerate(mutants, 1):
            path = ROOT / m.file
            original_bytes = path.read_bytes()
            lines = original_bytes.decode("utf-8").split("\n")
            lines[m.found_line - 1] = lines[m.found_line - 1].replace(m.original, m.replacement, 1)
            log = logs / (re.sub(r"[^A-Za-z0-9]+", "_", m.name).strip("_")[:80] + ".log")
            log.write_text(f"mutant: {m.name}\n{m.file}:{m.found_line}: '{m.original}' -> '{m.replacement}'\n")
            print(f"[{index}/{len(mutants)}] {m.name} ({m.file}:{m.found_line}) ... ", end="", flush=True)
            t0 = time.monotonic()
            try:
                path.write_text("\n".join(lines), encoding="utf-8")
                if run(["cmake", "--build", str(build), "-j", jobs], log) != 0:
                    m.outcome, m.detail = "did not build", f"log: {log}"
                elif run(["ctest", "--test-dir", str(build), "-R", tests_of(m), "-j", jobs, "--stop-on-failure",
                          "--output-on-failure"], log) != 0:
                    caught = failed_tests(log)
                    m.outcome = "killed"
                    m.detail = "by " + (", ".join(f"{n} ({why})" for n, why in caught) if caught else "the tests (see " + str(log) + ")")
                else:
                    m.outcome, m.detail = "SURVIVED", f"{', '.join(m.tests)} passed with it; log: {log}"
            finally:
                # The restored file is newer than the mutant's objects, so the next build compiles it again.
                path.write_bytes(original_bytes)
            m.seconds = time.monotonic() - t0
            print(f"{m.outcome} {m.detail} ({m.seconds:.0f} s)", flush=True)
    except Interrupted as e:
        print(f"\ninterrupted ({e}): the mutated file was restored; the build folder may hold a mutant's objects until "
              f"the next build", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    print("rebuilding the unmutated tree ...", flush=True)
    rebuilt = run(["cmake", "--build", str(build), "-j", jobs], logs / "restore.log") == 0
    done = [m for m in mutants if m.outcome]
    killed = [m for m in done if m.outcome == "killed"]
    survived = [m for m in done if m.outcome == "SURVIVED"]
    unbuilt = [m for m in done if m.outcome == "did not build"]
    scored = len(killed) + len(survived)
    minutes = (time.monotonic() - started) / 60
    print(f"\nmutation score: {len(killed)} of {scored} killed ({100.0 * len(killed) / max(1, scored):.0f}%) in {minutes:.1f} min")
    for m in survived:
        print(f"  survived: {m.name}\n    {m.file}:{m.found_line}  '{m.original}' -> '{m.replacement}'")
    for m in unbuilt:
        print(f"  did not build (fix the mutant): {m.name} ({m.where}); {m.detail}")
    if not rebuilt:
        print(f"error: the restored tree did not rebuild; see {logs / 'restore.log'}", file=sys.stderr)
    return 1 if survived or unbuilt or not rebuilt else 0


if __name__ == "__main__":
    sys.exit(main())
