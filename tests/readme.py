"""ctest's `readme`: runs the shell and Python blocks of README.md, of its chapters in docs/ (in the
order of the README's table of chapters, the order a reader follows) and of sdk/README.md, as a
reader of them would, so that what they show stays true. A file in docs/ that the table does not
link, or a link to a chapter that is not there, is a problem too.

Every ```sh, ```bash and ```python block carries a mark on the line before it:

    <!-- readme: run -->                      run it; it must exit 0
    <!-- readme: run line 1 -->               run only those lines (comma-separated numbers)
    <!-- readme: run; makes PATH, PATH -->    and these files must exist afterwards
    <!-- readme: fails -->                    run it; it must exit non-zero
    <!-- readme: show: WHY -->                not run (a template, or run by the named test)

A block without a mark fails the test, naming its line. Figures in a block's output are not
checked; exit codes and promised files are. Blocks run in the repository's root, as its reader
runs them, with PYTHONPATH=build/python; they write only under build/. The README's paths name
build/: a build elsewhere skips the test (exit 77).

    python3 tests/readme.py SOURCE_DIR BUILD_DIR [PYTHON]
"""
import os
import re
import subprocess
import sys

MARK = re.compile(r"<!--\s*readme:\s*(.*?)\s*-->")
RUNNABLE = ("sh", "bash", "python")


def blocks(path):
    """(first line number, language, text, mark or None) of each fenced block of a runnable language."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, k = [], 0
    while k < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[k])
        if not fence:
            k += 1
            continue
        language, start = fence.group(1), k
        end = next((j for j in range(k + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if language in RUNNABLE:
            before = lines[start - 1] if start > 0 else ""
            mark = MARK.search(before)
            found.append((start + 1, language, "\n".join(lines[start + 1:end]) + "\n", mark.group(1) if mark else None))
        k = end + 1
    return found


def parse_mark(mark):
    """(action, lines to run or None, files it makes)."""
    if mark.startswith("show:") and mark[5:].strip():
        return "show", None, []
    if mark == "fails":
        return "fails", None, []
    match = re.fullmatch(r"run(?: line(?:s)? ([\d, ]+))?(?:\s*\(.*\))?(?:;\s*makes\s+(.+))?", mark)
    if not match:
        raise ValueError(f"unknown mark '{mark}' (run, run line N, run; makes PATH, fails, show: WHY)")
    numbers = [int(n) for n in match.group(1).replace(" ", "").split(",")] if match.group(1) else None
    makes = [p.strip() for p in match.group(2).split(",")] if match.group(2) else []
    return "run", numbers, makes


CHAPTER_LINK = re.compile(r"\]\((docs/[\w.-]+\.md)\)")


def documents(source_dir):
    """README.md, its chapters in the order its table links them, sdk/README.md; and the problems."""
    readme = open(os.path.join(source_dir, "README.md"), encoding="utf-8").read()
    chapters, problems = [], []
    table_rows = "\n".join(line for line in readme.split("\n") if line.startswith("| ["))
    for link in CHAPTER_LINK.findall(table_rows):
        if link in chapters:
            continue
        if not os.path.isfile(os.path.join(source_dir, link)):
            problems.append(f"README.md links {link}, which does not exist")
            continue
        chapters.append(link)
    docs = os.path.join(source_dir, "docs")
    for name in sorted(os.listdir(docs)) if os.path.isdir(docs) else []:
        if name.endswith(".md") and name != "README.md" and f"docs/{name}" not in chapters:
            problems.append(f"docs/{name} is not linked from the README's table of chapters: add a row for it")
    return ["README.md", *chapters, "sdk/README.md"], problems


def main():
    source_dir, build_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    python = sys.argv[3] if len(sys.argv) > 3 else sys.executable
    if os.path.realpath(build_dir) != os.path.realpath(os.path.join(source_dir, "build")):
        print(f"the README's blocks name build/, and this build is {build_dir}: not run")
        return 77
    work = source_dir
    env = dict(os.environ, PYTHONPATH=os.path.join(work, "build", "python"), BUILD_DIR="build", CI="true")
    env.pop("SLUICE_PLUGIN_PATH", None)
    ran = 0
    ordered, problems = documents(source_dir)
    for document in ordered:
        for line, language, text, mark in blocks(os.path.join(source_dir, document)):
            where = f"{document}:{line}"
            if mark is None:
                problems.append(f"{where}: a ```{language} block without a mark: put <!-- readme: run --> (or show: WHY, "
                                f"fails) on the line before it")
                continue
            try:
                action, numbers, makes = parse_mark(mark)
            except ValueError as error:
                problems.append(f"{where}: {error}")
                continue
            if action == "show":
                continue
            if numbers:
                kept = text.split("\n")
                text = "\n".join(kept[n - 1] for n in numbers if 0 < n <= len(kept)) + "\n"
            command = [python, "-c", text] if language == "python" else ["bash", "-e", "-o", "pipefail", "-c", text]
            print(f"--- {where} ({action})", flush=True)
            done = subprocess.run(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=900)
            print(done.stdout[-3000:], flush=True)
            ran += 1
            if action == "run" and done.returncode != 0:
                problems.append(f"{where}: exited {done.returncode}; the README says it runs")
            if action == "fails" and done.returncode == 0:
                problems.append(f"{where}: exited 0; the README says it fails")
            for path in makes:
                if not os.path.exists(os.path.join(work, path)):
                    problems.append(f"{where}: made no {path}, which the README promises")
    for problem in problems:
        print("FAIL " + problem)
    print(f"{ran} blocks run, {len(problems)} problems")
    return 1 if problems or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
