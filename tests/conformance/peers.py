"""Runs the oracles: scripts of this folder in the peers environment (BUILD_DIR/peers, made by
scripts/install-deps.sh), whose results come back as files."""
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
PEERS = os.environ.get("SLUICE_PEERS_DIR", os.path.join(SOURCE_DIR, "build", "peers"))
PYTHON = os.path.join(PEERS, "bin", "python")


def run_oracle(script, *args, timeout=300):
    """Runs HERE/script with the peers' Python; fails the test with its output when it fails."""
    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} is missing: run scripts/install-deps.sh (it makes the peers environment in BUILD_DIR/peers)")
    import shutil
    import tempfile
    # Its own temporary folder, removed after it: TFDS leaves empty folders behind at each import.
    scratch = tempfile.mkdtemp(prefix="sluice-oracle-")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1", TMPDIR=scratch)
    env.pop("PYTHONPATH", None)  # the peers see their own packages, not the build tree's
    try:
        done = subprocess.run([PYTHON, os.path.join(HERE, script), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        pytest.fail(f"the oracle {script} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def oracle_writes(folder, script):
    """Runs `script write FOLDER OUT.json`: the files the real system wrote into `folder`, and
    what it says of them (OUT.json, read back)."""
    import json
    out = folder / "oracle.json"
    run_oracle(script, "write", folder, out)
    return folder, json.loads(out.read_text())


def damaged_copy(source, folder, cut=None, flip=None):
    """A copy of `source` in `folder` (a pathlib folder) with byte `flip` changed and/or cut to its
    first `cut` bytes, for the tests of damage named by file."""
    data = bytearray(open(source, "rb").read())
    if flip is not None:
        data[flip] ^= 0x40
    if cut is not None:
        data = data[:cut]
    path = folder / ("damaged-" + os.path.basename(source))
    path.write_bytes(bytes(data))
    return str(path)
