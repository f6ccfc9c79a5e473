"""A training loop saved mid-epoch (state_dict() beside the model, through pickle as torch.save
does) and restored in a fresh process continues exactly: no element twice, none lost, the same
shuffles and augmentations; what cannot be saved is refused with the stage named."""
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

import sluice
from conftest import SOURCE_DIR, cli, stage

RESUMABLE = ("options { seed: 21 }\n" + stage("src", "range", "", {"count": "3000"}) +
             stage("work", "simulate_work", "src", {"us": "2", "jitter_us": "5"}, "parallelism: 3") +
             stage("mix", "shuffle", "work", {"buffer_size": "400"}) +
             stage("batch", "batch", "mix", {"batch_size": "10"}, "buffer_size: 2") +
             stage("epochs", "repeat", "batch", {"count": "2"}) + stage("out", "null_sink", "epochs"))


def batches(iterable):
    return [tuple(b["value"].tolist()) for b in iterable]


def resumed_in_a_new_process(state_file, key=None):
    """The batches a fresh interpreter gives after loading the state pickled in `state_file`
    (under `key` of what was pickled, when given)."""
    load = f"pickle.load(open({str(state_file)!r}, 'rb'))" + (f"[{key!r}]" if key else "")
    script = (f"import pickle, sluice\n"
              f"p = sluice.Pipeline.from_spec({RESUMABLE!r})\n"
              f"p.load_state_dict({load})\n"
              "for b in p: print(','.join(map(str, b['value'].tolist())))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return [tuple(int(x) for x in line.split(",")) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("taken", [1, 37, 300, 599])
def test_state_dict_mid_epoch_resumes_exactly(taken):
    whole = batches(sluice.Pipeline.from_spec(RESUMABLE))
    assert len(whole) == 600
    pipeline = sluice.Pipeline.from_spec(RESUMABLE)
    it = iter(pipeline)
    first = [tuple(next(it)["value"].tolist()) for _ in range(taken)]
    state = pickle.loads(pickle.dumps(pipeline.state_dict()))
    # Taking a state does not disturb the iteration.
    after = batches(b for _, b in zip(range(5), it))
    assert after == whole[taken:taken + 5]
    pipeline.close()
    restored = sluice.Pipeline.from_spec(RESUMABLE)
    restored.load_state_dict(state)
    rest = batches(restored)
    assert first + rest == whole
    assert restored.epoch == 1  # the next iter() is the next epoch
    # The state was for that iteration only: the next one is the whole next epoch, as the
    # uninterrupted pipeline's own.
    fresh = sluice.Pipeline.from_spec(RESUMABLE)
    batches(fresh)
    assert batches(restored) == batches(fresh) and len(whole) == 600


def test_a_cut_in_progress_does_not_hold_the_sources():
    # state_dict() asks the engine for a cut, which reaches the loop only after what is in flight
    # ahead of it (here about 370 numbers: the source's buffer of 256 and what the batch took from
    # it, 90 batches). Meanwhile the stages go on: as the loop takes 40 batches the source reads on
    # behind the cut, where until 2026-11-30 it stood at the cut until the cut reached the loop (a
    # loop taking a state every 10 steps then lost 40% of its images/s).
    pipeline = sluice.data.range(count=10**9).batch(4, buffer_size=2).pipeline()
    it = iter(pipeline)
    for _ in range(3):
        next(it)

    def read():
        return {s["id"]: s for s in pipeline.snapshot()["stage"]}["range"]["elements_out"]

    deadline = time.monotonic() + 20
    while read() < 256 and time.monotonic() < deadline:  # its buffer full
        time.sleep(0.01)
    asked_at = read()
    pipeline.state_dict()  # the first cut, asked in the background
    taken = [next(it).tolist() for _ in range(40)]
    assert taken[0] == [12, 13, 14, 15] and taken[-1] == [168, 169, 170, 171]
    while read() < asked_at + 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read() >= asked_at + 20, f"the source stood at {read()} after the cut was asked at {asked_at}"
    pipeline.close()


def test_states_are_taken_close_behind_the_loop(tmp_path):
    # After the first state_dict() a cut is kept under way, the next asked as the last completes, so
    # that a state taken 200 steps later names few outputs taken after its cut (made again and
    # dropped on resume): those the loop took while one cut crossed what was in flight (here about
    # 20 steps of 2 ms). Until 2026-11-30 a cut was asked only by each state_dict(), and a state
    # 200 steps after the last was that call's cut: about 180 outputs behind.
    spec = (stage("src", "range", "", {"count": "100000"}, "buffer_size: 4") +
            stage("batch", "batch", "src", {"batch_size": "4"}, "buffer_size: 2") + stage("out", "null_sink", "batch"))
    pipeline = sluice.Pipeline.from_spec(spec)
    it = iter(pipeline)
    behind = []
    for step in range(1, 601):
        next(it)
        time.sleep(0.002)  # a training step: the loop, not the pipeline, sets the pace
        if step % 200 == 0:
            (tmp_path / "state.bin").write_bytes(pipeline.state_dict()["checkpoint"])
            info = cli("checkpoint", "info", str(tmp_path / "state.bin")).stdout
            if step > 200:
                behind.append(int(info.split("the loop had taken ")[1].split(" ")[0]))
    assert next(it)["value"].tolist() == [2400, 2401, 2402, 2403]
    pipeline.close()
    assert max(behind) <= 100, behind


def test_state_between_epochs_is_the_next_epoch():
    pipeline = sluice.Pipeline.from_spec(RESUMABLE)
    first_epoch = batches(pipeline)
    state = pipeline.state_dict()
    assert state == {"epoch": 1}
    second = sluice.Pipeline.from_spec(RESUMABLE)
    second.load_state_dict(state)
    expected = batches(pipeline)  # the same pipeline's own next epoch
    assert batches(second) == expected != first_epoch


def test_a_fresh_interpreter_continues_the_saved_state(tmp_path):
    whole = batches(sluice.Pipeline.from_spec(RESUMABLE))
    pipeline = sluice.Pipeline.from_spec(RESUMABLE)
    it = iter(pipeline)
    first = [tuple(next(it)["value"].tolist()) for _ in range(123)]
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(pipeline.state_dict()))
    pipeline.close()
    assert first + resumed_in_a_new_process(tmp_path / "state.pkl") == whole


def test_states_that_cannot_be_used_are_refused():
    def numbers():
        yield from ({"value": i} for i in range(100))

    generated = sluice.data.from_generator(numbers).batch(batch_size=4).pipeline()
    it = iter(generated)
    next(it)
    with pytest.raises(ValueError, match=r"stage '.*' \(python_generator\).*cannot save it"):
        generated.state_dict()
    generated.close()

    pipeline = sluice.Pipeline.from_spec(RESUMABLE)
    it = iter(pipeline)
    next(it)
    state = pipeline.state_dict()
    pipeline.close()
    other = sluice.Pipeline.from_spec(RESUMABLE.replace("seed: 21", "seed: 22"))
    other.load_state_dict(state)
    with pytest.raises(RuntimeError, match="seed 21, this run's seed is 22"):
        next(iter(other))
    with pytest.raises(ValueError, match="takes a dict made by Pipeline.state_dict"):
        other.load_state_dict({"checkpoint": b"x"})
    damaged = sluice.Pipeline.from_spec(RESUMABLE)
    damaged.load_state_dict({"epoch": 0, "checkpoint": b"\x01\x02garbage"})
    with pytest.raises(ValueError, match="not a Sluice pipeline state"):
        next(iter(damaged))


def test_states_hold_positions_only_and_a_killed_loop_resumes_from_its_last(tmp_path):
    # A training loop saving a state every 7 batches (as it would save the model), killed with
    # SIGKILL: a new process loads its last state and gives exactly the batches after it. Each
    # state is positions, never batches: it is taken from the engine's latest cut behind the loop.
    whole = batches(sluice.Pipeline.from_spec(RESUMABLE))
    state_file = tmp_path / "state.pkl"
    loop = (f"import os, pickle, sys, time, sluice\n"
            f"p = sluice.Pipeline.from_spec({RESUMABLE!r})\n"
            "for i, b in enumerate(p, 1):\n"
            "    print(','.join(map(str, b['value'].tolist())), flush=True)\n"
            "    if i % 7 == 0:\n"
            f"        with open({str(state_file) + '.new'!r}, 'wb') as f: pickle.dump({{'taken': i, 'data': p.state_dict()}}, f)\n"
            f"        os.replace({str(state_file) + '.new'!r}, {str(state_file)!r})\n"
            "    if i == 250: time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    printed = []
    for line in child.stdout:
        printed.append(tuple(int(x) for x in line.split(",")))
        if len(printed) == 250:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    saved = pickle.loads(state_file.read_bytes())
    assert saved["taken"] == 245
    assert len(saved["data"]["checkpoint"]) < 64 * 1024  # positions: a few KB
    # The CLI reads a state's bytes as it reads a checkpoint file.
    (tmp_path / "state.bin").write_bytes(saved["data"]["checkpoint"])
    info = cli("checkpoint", "info", str(tmp_path / "state.bin"))
    assert "elements had reached the sinks" in info.stdout and "a Python state" in info.stdout
    assert printed[:245] + resumed_in_a_new_process(state_file, "data") == whole


def test_states_of_the_readme_pipeline_are_small_and_quick(tmp_path):
    # The README's main pipeline (224 px, batches of 64 images as float32, 38 MB each): a state is
    # the positions of its readers and the places of the shuffle's images, not batches.
    # A state taken mid-epoch is one of the engine's cuts, with a partly gathered batch and a
    # shuffle buffer full of decoded images behind it: all named by their records.
    cli("run", "--quiet", os.path.join(SOURCE_DIR, "resources", "pipelines", "sample_data_tfrecord.txtpb"),
        "--set", "images.count=1600", "--set", "images.height=120", "--set", "images.width=160",
        "--set", f"shards.prefix={tmp_path}/train", "--set", "shards.max_records=200")
    readme_pipeline = os.path.join(SOURCE_DIR, "resources", "pipelines", "train_tfrecord.txtpb")
    files = {"files.patterns": f"{tmp_path}/*.tfrecord"}
    pipeline = sluice.Pipeline(readme_pipeline, set=files)
    it = iter(pipeline)
    sizes, seconds = [], []
    for _ in range(18):
        assert next(it)["image"].shape == (64, 224, 224, 3)
        start = time.perf_counter()
        state = pipeline.state_dict()
        seconds.append(time.perf_counter() - start)
        sizes.append(len(pickle.dumps(state)))
    following = [next(it)["image"].copy() for _ in range(3)]
    pipeline.close()
    print(f"state_dict() on the README pipeline: {max(sizes)} bytes and {1000 * max(seconds):.1f} ms at most over 18 calls")
    assert max(sizes) <= 1 << 20
    assert sizes[-1] > sizes[0]  # the last is a cut's (positions), the first the run's start
    restored = sluice.Pipeline(readme_pipeline, set=files)
    restored.load_state_dict(state)
    again = iter(restored)
    for expected in following:
        assert (next(again)["image"] == expected).all()
    restored.close()


def test_states_name_python_functions_by_their_code_not_their_order(tmp_path):
    """A training script started again may build its datasets in another order (an eval dataset
    first): its training state still loads, because each stage's Python function is named by its
    own code. Two functions of other code are still told apart (the state of one is refused by a
    pipeline of the other)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import pickle, sys, sluice.data as sd\n"
        "def scale(x):\n    return x * 3\n"
        "def shift(x):\n    return x + 1000\n"
        "def build():\n    return sd.range(400).map(scale).shuffle(64, seed=5).batch(8).pipeline()\n"
        "if sys.argv[1] == 'save':\n"
        "    train = build()\n"
        "    it = iter(train)\n"
        "    first = [next(it).tolist() for _ in range(7)]\n"
        "    pickle.dump(train.state_dict(), open(sys.argv[2], 'wb'))\n"
        "    print(first + [b.tolist() for b in it])\n"
        "elif sys.argv[1] == 'resume':\n"
        "    evaluation = sd.range(10).map(shift).pipeline()  # built first this time\n"
        "    train = build()\n"
        "    train.load_state_dict(pickle.load(open(sys.argv[2], 'rb')))\n"
        "    print([b.tolist() for b in train])\n"
        "else:\n"
        "    other = sd.range(400).map(shift).shuffle(64, seed=5).batch(8).pipeline()\n"
        "    other.load_state_dict(pickle.load(open(sys.argv[2], 'rb')))\n"
        "    next(iter(other))\n")
    state = tmp_path / "state.pkl"

    def run(*args):
        return subprocess.run([sys.executable, str(script), *args, str(state)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)

    saved = run("save")
    assert saved.returncode == 0, saved.stderr
    whole = eval(saved.stdout)
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert eval(resumed.stdout) == whole[7:]
    refused = run("other")
    assert refused.returncode != 0 and "another pipeline" in refused.stderr and "function=python:shift-" in refused.stderr, refused.stderr


def test_states_taken_every_step_stay_the_same_size(tmp_path):
    # A state each training step, tf.data's way of reading (files interleaved, the epochs repeated
    # after the batches): each cut made the reader take its whole input buffer ahead and keep it
    # while the file list refilled the buffer, so the states grew by every cut (4 MB at step 1,000
    # of the README's pipeline); given back to the buffer, they still let the list in past its
    # bounds by what it had made at each cut (143 KB at step 10,000). The list now puts the cut's
    # barrier after the first end of a pass waiting in its buffer (saved as before the next pass)
    # and the reader takes it there: the state names one pass of files at most, 8 here, and the
    # buffer stays within its bounds.
    cli("run", "--quiet", os.path.join(SOURCE_DIR, "resources", "pipelines", "sample_data_tfrecord.txtpb"),
        "--set", "images.count=256", "--set", "images.height=24", "--set", "images.width=32",
        "--set", f"shards.prefix={tmp_path}/train", "--set", "shards.max_records=32")
    ds = (sluice.data.list_files(f"{tmp_path}/*.tfrecord")
          .tfrecord_reader(interleave=dict(cycle_length=4), num_parallel_calls=2)
          .parse_example(features="image:bytes, label:int64")
          .batch(8, drop_remainder=True).repeat().prefetch(sluice.AUTOTUNE).options(seed=5))
    pipeline = ds.pipeline()
    it = iter(pipeline)
    sizes, buffered = {}, 0
    for step in range(1, 601):
        next(it)
        state = pipeline.state_dict()
        if step in (200, 600):
            sizes[step] = len(pickle.dumps(state))
        if step % 20 == 0:
            # (The list's buffer, of 16 names before an interleave, is empty at times: its level 0.)
            files = pipeline.snapshot()["stage"][0]
            buffered = max(buffered, files["buffer_level"] - files["buffer_capacity"])
    following = [next(it)["label"].tolist() for _ in range(5)]
    pipeline.close()
    print(f"states at steps 200 and 600: {sizes[200]} and {sizes[600]} bytes; the file list's buffer at most {buffered} over its bounds")
    assert sizes[600] <= sizes[200] + 2048 and sizes[600] < 12 * 1024, sizes
    assert buffered <= 1, buffered  # (a barrier)
    restored = ds.pipeline()
    restored.load_state_dict(state)
    again = iter(restored)
    assert [next(again)["label"].tolist() for _ in range(5)] == following
    restored.close()
