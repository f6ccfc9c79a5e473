#!/usr/bin/env python3
"""The house rules on size: no function in product code (core, plugins, app, sdk) over 120 lines,
no product file over 900. Prints the longest functions and the files over the limit; with
--check, exits 1 when a rule is broken. Functions are found by universal-ctags (its `end:`
field), C++ and Python alike; a lambda counts within the function that holds it.

  python3 scripts/house.py            # the 20 longest functions, and any file over 900 lines
  python3 scripts/house.py --top 40
  python3 scripts/house.py --check    # exit 1 if a function is over 120 lines or a file over 900
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("core", "plugins", "app", "sdk")
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".py"}
FUNCTION_LIMIT = 120
FILE_LIMIT = 900


def functions():
    """(lines, 'path:line', name) for every function and method of the product code."""
    ctags = shutil.which("ctags")
    if not ctags:
        sys.exit("error: universal-ctags is not installed (apt-get install universal-ctags)")
    out = subprocess.run([ctags, "-R", "--languages=C++,Python", "--kinds-C++=f", "--kinds-Python=fm", "--fields=+ne",
                          "--exclude=*.pb.*", "-o", "-", *PRODUCT], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for row in out.splitlines():
        parts = row.split("\t")
        fields = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        if "line" in fields and "end" in fields:
            start, end = int(fields["line"]), int(fields["end"])
            found.append((end - start + 1, f"{parts[1]}:{start}", parts[0]))
    return sorted(found, reverse=True)


def long_files():
    found = []
    for top in PRODUCT:
        for path in (ROOT / top).rglob("*"):
            if path.suffix in SOURCE_SUFFIXES and path.is_file() and ".pb." not in path.name:
                lines = path.read_bytes().count(b"\n")
                if lines > FILE_LIMIT:
                    found.append((lines, str(path.relative_to(ROOT))))
    return sorted(found, reverse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=20, help="how many of the longest functions to print (default 20)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if a function is over {FUNCTION_LIMIT} lines or a file over {FILE_LIMIT}")
    args = parser.parse_args()

    funcs = functions()
    print(f"the {args.top} longest functions (lines, where, name):")
    for lines, where, name in funcs[:args.top]:
        print(f"  {lines:5}  {where}  {name}")
    over_functions = [f for f in funcs if f[0] > FUNCTION_LIMIT]
    over_files = long_files()
    for lines, where, name in over_functions:
        print(f"function over {FUNCTION_LIMIT} lines: {where} {name} ({lines}): name its phases as functions")
    for lines, path in over_files:
        print(f"file over {FILE_LIMIT} lines: {path} ({lines}): split it along its sections")
    if not over_functions and not over_files:
        print(f"no function over {FUNCTION_LIMIT} lines, no file over {FILE_LIMIT}")
    return 1 if args.check and (over_functions or over_files) else 0


if __name__ == "__main__":
    sys.exit(main())
