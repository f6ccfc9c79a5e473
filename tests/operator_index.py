"""ctest's `operator_index`: plugins/README.md's operator index lists every operator `sluice plugins`
knows, once, with the file that describes it; each file named exists and still names its operator
(as `"NAME"`). The host's operators that only a Python process or a service worker registers are
in the table too and are checked the same way, against their files. And the host never tests an
operator's name: no file of core/ but the one describing an operator writes its name as a string
literal (what the host must know of an operator is its role, declared in describe()).

    python3 tests/operator_index.py SOURCE_DIR SLUICE
"""
import json
import os
import re
import subprocess
import sys

ROW = re.compile(r"^\| (\w+) \| `(\w+)` \| (\w+) \| `([^`]+)` \|$")


def main():
    source_dir, sluice = sys.argv[1], sys.argv[2]
    readme = os.path.join(source_dir, "plugins", "README.md")
    rows = [ROW.match(line) for line in open(readme, encoding="utf-8").read().split("\n")]
    index = [m.groups() for m in rows if m]
    listed = subprocess.run([sluice, "plugins", "--json"], capture_output=True, text=True, check=True,
                            env=dict(os.environ, SLUICE_REGISTRY="off"))
    operators = {op["name"]: op for op in json.loads(listed.stdout)["operators"]}
    problems = []
    seen = {}
    for plugin, name, kind, path in index:
        if name in seen:
            problems.append(f"`{name}` is listed twice")
        seen[name] = path
        full = os.path.join(source_dir, path)
        if not os.path.isfile(full):
            problems.append(f"`{name}`: {path} does not exist")
        elif f'"{name}"' not in open(full, encoding="utf-8", errors="replace").read():
            problems.append(f"`{name}`: {path} does not name it; say which file describes it now")
        op = operators.get(name)
        if op and (op["plugin"] != plugin or op["kind"] != kind):
            problems.append(f"`{name}` is a {op['kind']} of plugin {op['plugin']}, the table says a {kind} of {plugin}")
    for name, op in sorted(operators.items()):
        if name not in seen:
            problems.append(f"`{name}` ({op['kind']}, plugin {op['plugin']}) is not in plugins/README.md's operator index: add its row")
    problems += names_in_core(source_dir, dict(seen))
    for problem in problems:
        print("FAIL " + problem)
    print(f"{len(index)} operators in the index, {len(operators)} known to `sluice plugins`, {len(problems)} problems")
    return 1 if problems else 0


def names_in_core(source_dir, described_in):
    """Operator names written as string literals in core/'s code, outside the file describing them."""
    problems = []
    core = os.path.join(source_dir, "core")
    for folder, _, files in os.walk(core):
        for file in sorted(files):
            if not file.endswith((".cpp", ".hpp", ".h")):
                continue
            path = os.path.join(folder, file)
            relative = os.path.relpath(path, source_dir)
            text = open(path, encoding="utf-8", errors="replace").read()
            for name, describing in described_in.items():
                if describing != relative and f'"{name}"' in text:
                    problems.append(f'{relative} names operator `{name}` ("{name}"): the host reads roles '
                                    f"(OperatorTraits::role), never names")
    return problems


if __name__ == "__main__":
    sys.exit(main())
