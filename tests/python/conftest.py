"""The Python face as a training script uses it: `import sluice` from the build tree (ctest sets
PYTHONPATH to build/python), the CLI beside it to compare with."""
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
CLI = os.environ.get("SLUICE_CLI", os.path.join(SOURCE_DIR, "build", "bin", "sluice"))
FIXTURE_PLUGINS = os.environ.get("SLUICE_FIXTURE_PLUGIN_DIR", os.path.join(SOURCE_DIR, "build", "tests", "fixture_plugins"))


def stage(stage_id, op, input_id="", params=None, extra=""):
    """One stage line of a pipeline file, as the C++ tests write them."""
    text = f'stage {{ id: "{stage_id}" op: "{op}"'
    if input_id:
        text += f' input: "{input_id}"'
    for key, value in (params or {}).items():
        text += f' params {{ key: "{key}" value: "{value}" }}'
    return text + (" " + extra if extra else "") + " }\n"


def cli(*args, check=True):
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def thread_count():
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def write(tmp_path):
    def write_file(name, text):
        path = tmp_path / name
        path.write_text(text)
        return path

    return write_file
