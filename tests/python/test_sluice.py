"""What a training script relies on: the same data as the CLI, views instead of copies, memory
that is reused, Python functions with deterministic output at any parallelism, errors that name
the stage, Ctrl-C that stops everything, and no hang whatever the script does."""
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
import torch

import sluice
from conftest import CLI, FIXTURE_PLUGINS, SOURCE_DIR, cli, stage, thread_count

SHUFFLED = ("options { seed: 5 }\n" + stage("src", "range", "", {"count": "1000"}) +
            stage("mix", "shuffle", "src", {"buffer_size": "100"}) +
            stage("work", "simulate_work", "mix", {"us": "5", "jitter_us": "5"}, "parallelism: 2") +
            stage("drop", "filter_random", "work", {"p": "0.8"}) + stage("batch", "batch", "drop", {"batch_size": "16"}))


def jsonl_rows(path):
    rows = []
    for line in open(path):
        obj = json.loads(line)
        rows.append({k: v for k, v in obj.items()})
    return rows


def as_plain(batch):
    """A pipeline file's element (a dict of fields) or a sluice.data one of one value (which is
    field "value" in the file), as lists."""
    if not isinstance(batch, dict):
        return {"value": batch.tolist()}
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in batch.items()}


def test_operators_come_from_the_plugins_with_their_docs():
    sources = dir(sluice.data)
    assert "range" in sources and "list_files" in sources and "tfrecord_reader" not in sources
    assert "tfrecord_reader" in dir(sluice.data.range())
    assert "count" in sluice.data.range.__doc__
    with pytest.raises(AttributeError, match=r"unknown source 'rnage' \(did you mean 'range'\?\)"):
        sluice.data.rnage(count=3)
    with pytest.raises(AttributeError, match=r"did you mean 'batch'"):
        sluice.data.range().bacth(batch_size=2)
    with pytest.raises(TypeError, match=r"unknown parameter 'batchsize' \(did you mean 'batch_size'\?\)"):
        sluice.data.range().batch(batchsize=2)


def test_file_and_python_built_pipelines_give_the_cli_output(write, tmp_path):
    # The CLI writes the file's output with jsonl_sink.
    out = tmp_path / "cli.jsonl"
    path = write("p.txtpb", SHUFFLED + stage("out", "jsonl_sink", "batch", {"path": str(out)}))
    cli("run", "--quiet", str(path))
    expected = jsonl_rows(out)
    assert len(expected) > 40
    # The same file iterated from Python: what reaches the sink, batch by batch.
    assert [as_plain(b) for b in sluice.Pipeline(path)] == expected
    # Built the tf.data way: the same stages (their names key their random draws).
    ds = (sluice.data.range(count=1000, name="src").shuffle(buffer_size=100, name="mix")
          .simulate_work(us=5, jitter_us=5, parallelism=2, name="work").filter_random(p=0.8, name="drop")
          .batch(batch_size=16, name="batch").options(seed=5))
    assert [as_plain(b) for b in ds] == expected
    # Its spec runs under the CLI with the same bytes, and back in Python.
    again = tmp_path / "again.jsonl"
    spec = ds.jsonl_sink(path=str(again), name="out").spec()
    cli("run", "--quiet", str(write("built.txtpb", spec)))
    assert again.read_bytes() == out.read_bytes()
    assert [as_plain(b) for b in sluice.Pipeline.from_spec(ds.spec())] == expected
    # seed= as --seed.
    reseeded = tmp_path / "seed9.jsonl"
    cli("run", "--quiet", "--seed", "9", "--set", f"out.path={reseeded}", str(path))
    seeded = [as_plain(b) for b in sluice.Pipeline(path, seed=9)]
    assert seeded == jsonl_rows(reseeded) and seeded != expected
    # run(): as `sluice run`, sinks included.
    third = tmp_path / "third.jsonl"
    assert sluice.Pipeline(path, set={"out.path": str(third)}).run() == "finished"
    assert third.read_bytes() == out.read_bytes()


def test_each_new_iteration_is_the_next_epoch():
    # Three iterations of one pipeline (or dataset) give what one run repeating three times gives:
    # each iter() has the next epoch's shuffles and random draws.
    def epochs(iterable, count):
        return [[as_plain(b) for b in iterable] for _ in range(count)]

    repeated = sluice.Pipeline.from_spec(SHUFFLED + stage("more", "repeat", "batch", {"count": "3"}))
    one_run = [as_plain(b) for b in repeated]
    pipeline = sluice.Pipeline.from_spec(SHUFFLED)
    three = epochs(pipeline, 3)
    assert three[0] != three[1] != three[2]
    assert sum(three, []) == one_run
    assert pipeline.epoch == 3
    # Set the epoch to continue where another process stopped.
    again = sluice.Pipeline.from_spec(SHUFFLED)
    again.epoch = 2
    assert [as_plain(b) for b in again] == three[2]
    with pytest.raises(ValueError, match="epoch must be 0 or more"):
        again.epoch = -1
        next(iter(again))
    # A sluice.data dataset iterated again moves on too; pipeline() starts a new one at epoch 0.
    dataset = sluice.data.range(count=40).shuffle(buffer_size=40).batch(batch_size=10).options(seed=3)
    first, second = epochs(dataset, 2)
    assert first != second
    assert sorted(sum((b["value"] for b in first), [])) == list(range(40))
    assert [as_plain(b) for b in dataset.pipeline()] == first


def test_autotune_is_written_as_in_tf_data():
    ds = (sluice.data.range(count=2000).simulate_work(us=50, parallelism=sluice.AUTOTUNE, buffer_size=sluice.AUTOTUNE)
          .batch(batch_size=100).options(seed=1))
    assert "parallelism: -1" in ds.spec() and "buffer_size: -1" in ds.spec()
    pipeline = ds.pipeline()
    values = [v for b in pipeline for v in b.tolist()]
    assert values == list(range(2000))
    work = [s for s in pipeline.snapshot()["stage"] if s["id"] == "simulate_work"][0]
    assert work["workers_tuned"] and work["buffer_tuned"]
    assert "Autotune: budget" in pipeline.report()


def test_arrays_are_views_of_the_batch_and_memory_is_reused():
    ds = sluice.data.tensors(count=8000, shape=[224, 224, 3], dtype="f32").batch(batch_size=4)
    pipeline = ds.pipeline()
    addresses = set()
    rss = []
    for i, batch in enumerate(pipeline):
        data = batch["data"]
        assert data.shape == (4, 224, 224, 3) and data.dtype == np.float32
        assert not data.flags.owndata  # a view: the memory is the batch's
        addresses.add(data.__array_interface__["data"][0])
        if i in (199, 1999):
            rss.append(int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    assert i == 1999
    # Released batches come back from the pool: a handful of buffers, and no growth.
    assert len(addresses) < 64, len(addresses)
    assert rss[1] - rss[0] < 64 << 20, rss
    # A tensor's NumPy view, its torch tensor and numpy.from_dlpack all point at the batch.
    for batch in ds.pipeline().tensors():
        t = batch["data"]
        assert isinstance(t, sluice.Tensor) and t.device == "cpu" and t.shape == (4, 224, 224, 3)
        assert t.numpy().__array_interface__["data"][0] == t.data_ptr
        assert torch.from_dlpack(t).data_ptr() == t.data_ptr
        assert np.from_dlpack(t).__array_interface__["data"][0] == t.data_ptr
        break


def test_torch_tensors_equal_the_arrays():
    ds = sluice.data.tensors(count=40, shape=[8, 8], dtype="u8").batch(batch_size=8).options(seed=3)
    arrays = [b for b in ds]
    tensors = [b for b in ds.torch()]
    assert len(arrays) == len(tensors) == 5
    for a, t in zip(arrays, tensors):
        assert isinstance(t["data"], torch.Tensor) and t["data"].dtype == torch.uint8
        assert np.array_equal(t["data"].numpy(), a["data"])
        assert np.array_equal(t["index"].numpy(), a["index"])


def test_python_functions_give_the_same_output_at_any_parallelism():
    def numbers():
        for i in range(300):
            yield {"x": np.int64(i), "name": f"n{i}"}

    def square(e):
        return {"x": e["x"] * e["x"], "name": e["name"]}

    def build(parallelism):
        return (sluice.data.from_generator(numbers).map(square, parallelism=parallelism)
                .filter(lambda e: e["x"] % 3 != 0, parallelism=parallelism)
                .filter_random(p=0.5).batch(batch_size=10).options(seed=11))

    one = [as_plain(b) for b in build(1)]
    four = [as_plain(b) for b in build(4)]
    assert one == four and len(one) > 5
    flat = [x for b in one for x in b["x"]]
    assert all(x % 3 != 0 for x in flat) and all(int(np.sqrt(x)) ** 2 == x for x in flat)
    assert one[0]["name"][0].startswith(b"n")


def test_from_tensor_slices_hands_out_rows_of_the_arrays_without_a_copy():
    images = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    labels = np.arange(6, dtype=np.int64)
    rows = list(sluice.data.from_tensor_slices({"image": images, "label": labels}))
    assert [int(r["label"]) for r in rows] == list(range(6))
    assert all(np.shares_memory(r["image"], images) for r in rows)
    batches = list(sluice.data.from_tensor_slices({"image": images, "label": labels}).batch(batch_size=4))
    assert np.array_equal(batches[0]["image"], images[:4])


def test_an_exception_in_a_function_follows_the_error_policy():
    def fragile(x):
        if int(x) % 7 == 3:
            raise ValueError(f"cannot take {int(x)}")
        return x

    failing = sluice.data.range(count=50).map(fragile)
    with pytest.raises(sluice.PipelineError) as error:
        list(failing)
    message = str(error.value)
    assert "python_map" in message and "cannot take 3" in message and "Traceback" in message and "fragile" in message
    assert error.value.stage == "python_map"
    skipping = sluice.data.range(count=50).map(fragile, error_policy="skip").pipeline()
    kept = [int(x) for x in skipping]
    assert kept == [i for i in range(50) if i % 7 != 3]
    stage_metrics = {s["id"]: s for s in skipping.snapshot()["stage"]}
    assert stage_metrics["python_map"]["errors_skipped"] == 7  # counts are ints, not protobuf JSON's strings
    assert any("cannot take" in reason for reason in stage_metrics["python_map"]["skip_reasons"])
    assert sum(stage_metrics["python_map"]["skip_reason_counts"].values()) == 7  # a map is a dict
    assert stage_metrics["range"]["errors_skipped"] == 0  # zeros are there too


def test_ctrl_c_stops_the_run_within_a_second_and_joins_its_threads():
    before = thread_count()
    endless = sluice.data.range(count=10**12).simulate_work(us=200, parallelism=2).batch(batch_size=4).pipeline()
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        for _ in endless:
            pass
    assert time.monotonic() - start < 1.5
    timer.join()
    deadline = time.monotonic() + 1
    while thread_count() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_count() == before


def test_close_from_another_thread_ends_the_loop():
    # The loop's thread ends its run while close() joins the same threads: they were joined twice
    # and both threads hung.
    for _ in range(3):
        pipeline = sluice.data.range(count=10**12).map(lambda e: e, num_parallel_calls=2).batch(4).pipeline()
        taken = []
        loop = threading.Thread(target=lambda: taken.extend(1 for _ in pipeline))
        loop.start()
        deadline = time.monotonic() + 10
        while not taken and time.monotonic() < deadline:
            time.sleep(0.01)
        pipeline.close()
        loop.join(10)
        assert not loop.is_alive(), "the loop's thread hangs after close() from another thread"
        assert taken


def run_script(tmp_path, text, timeout=60):
    script = tmp_path / "script.py"
    script.write_text(text)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - start


def test_ctrl_c_reaches_a_loop_whose_map_is_stuck(tmp_path):
    # A map stuck in a wait (time.sleep) and one spinning in Python: KeyboardInterrupt within the
    # stop's patience, the stuck function named, and the interpreter exits normally afterwards.
    for body in ("time.sleep(1000)", "while True: pass"):
        done, took = run_script(tmp_path, "\n".join([
            "import os, signal, threading, time, sluice",
            "def stuck(x):",
            f"    {body}",
            "pipeline = sluice.data.range(count=10).map(stuck, num_parallel_calls=2).pipeline()",
            "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()",
            "start = time.monotonic()",
            "try:",
            "    for _ in pipeline: pass",
            "except KeyboardInterrupt:",
            "    print('interrupted after %.1f s' % (time.monotonic() - start), flush=True)",
        ]) + "\n")
        assert done.returncode == 0, done.stderr
        assert "interrupted after" in done.stdout, done.stderr
        assert float(done.stdout.split("after ")[1].split(" s")[0]) < 10
        assert "the function of stage 'python_map' has not returned" in done.stderr
        assert took < 30


def test_leaving_the_interpreter_does_not_map_the_queued_elements_first(tmp_path):
    # A map taking 1 s per element with elements queued for it: leaving waits for the call in
    # progress, not for the queue (66 s before); a daemon thread whose map spins forever does not
    # keep the process, nor make it abort on the way out.
    done, took = run_script(tmp_path, "\n".join([
        "import time, sluice",
        "def slow(x):",
        "    time.sleep(1)",
        "    return x",
        "it = iter(sluice.data.range(count=1000).map(slow, num_parallel_calls=4).prefetch(2))",
        "next(it)",
        "print('leaving', flush=True)",
    ]) + "\n")
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout
    assert took < 15
    for _ in range(3):
        done, took = run_script(tmp_path, "\n".join([
            "import threading, time, sluice",
            "def spin(x):",
            "    while True: pass",
            "pipeline = sluice.data.range(count=10).map(spin, num_parallel_calls=2).pipeline()",
            "threading.Thread(target=lambda: list(pipeline), daemon=True).start()",
            "time.sleep(0.5)",
            "print('leaving', flush=True)",
        ]) + "\n")
        assert done.returncode == 0, done.stderr
        assert "leaving" in done.stdout and took < 20


def test_two_pipelines_iterated_at_once():
    a = sluice.data.range(count=100).batch(batch_size=10)
    b = sluice.data.range(count=100, start=1000).batch(batch_size=10)
    pairs = list(zip(a, b))
    assert len(pairs) == 10
    assert all(int(y[0]) - int(x[0]) == 1000 for x, y in pairs)


def test_an_abandoned_iterator_and_exit_during_a_run_do_not_hang(tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(
        "import sluice\n"
        "it = iter(sluice.data.range(count=10**12).simulate_work(us=100, parallelism=2)"
        ".map(lambda e: e, parallelism=2).batch(batch_size=8))\n"
        "next(it); next(it)\n"
        "half = iter(sluice.data.range(count=10**12).batch(batch_size=8)); next(half); del half\n"
        "print('leaving', flush=True)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout
    assert time.monotonic() - start < 20


def test_bad_pipelines_give_the_cli_messages(write):
    cases = {
        "syntax.txtpb": 'stage { id: "a" op: "range" \n',
        "unknown_op.txtpb": stage("a", "rnage") + stage("out", "null_sink", "a"),
        "bad_param.txtpb": stage("a", "range", "", {"count": "twelve"}) + stage("out", "null_sink", "a"),
        "unknown_param.txtpb": stage("a", "range", "", {"cuont": "3"}) + stage("out", "null_sink", "a"),
        "wiring.txtpb": stage("a", "range") + stage("b", "batch", "nowhere", {"batch_size": "2"}) + stage("out", "null_sink", "b"),
        "cycle.txtpb": stage("a", "identity", "b") + stage("b", "identity", "a") + stage("out", "null_sink", "b"),
        "no_sink.txtpb": stage("a", "range") + stage("b", "batch", "a", {"batch_size": "2"}),
        "bad.json": '{"stage": [{"id": "a", "op": "range", "nonsense": 1}]}',
        "choice.txtpb": stage("a", "tensors", "", {"dtype": "f31"}) + stage("out", "null_sink", "a"),
        "range.txtpb": stage("a", "range") + stage("b", "batch", "a", {"batch_size": "0"}) + stage("out", "null_sink", "b"),
        "duplicate.txtpb": stage("a", "range") + stage("a", "range") + stage("out", "null_sink", "a"),
        "autotune.txtpb": 'options { autotune { ram_budget: "lots" } }\n' + stage("a", "range") +
                          stage("b", "batch", "a", {"batch_size": "2"}, "parallelism: -1") + stage("out", "null_sink", "b"),
    }
    for name, text in cases.items():
        path = write(name, text)
        said = cli("validate", str(path), check=False)
        assert said.returncode != 0, name
        expected = [line[len("error: "):] for line in said.stderr.splitlines() if line.startswith("error: ")]
        with pytest.raises(sluice.SpecError) as error:
            sluice.validate(path)
        assert [p["text"] for p in error.value.problems] == expected, name
        assert str(error.value).splitlines() == expected, name
    with pytest.raises(sluice.SpecError, match="cannot open the pipeline file"):
        sluice.Pipeline("/nonexistent/pipeline.txtpb")
    # Overrides: a stage that does not exist, a value that does not parse.
    path = write("set.txtpb", stage("src", "range") + stage("o", "null_sink", "src"))
    for key, value in (("sr.count", "1"), ("src.count", "twelve"), ("src.nope", "1"), ("src.parallelism", "many")):
        said = cli("validate", "--set", f"{key}={value}", str(path), check=False)
        expected = [line[len("error: "):] for line in said.stderr.splitlines() if line.startswith("error: ")]
        assert said.returncode != 0 and expected, key
        with pytest.raises(sluice.SpecError) as error:
            sluice.validate(path, set={key: value})
        assert [p["text"] for p in error.value.problems] == expected, key


def test_metrics_are_served_while_python_iterates():
    pipeline = sluice.data.range(count=10**9).simulate_work(us=50).batch(batch_size=16).pipeline(metrics_addr="127.0.0.1:0")
    it = iter(pipeline)
    next(it)
    url = pipeline.metrics_url
    assert url.startswith("http://127.0.0.1:")
    spec = urllib.request.urlopen(url + "/pipeline", timeout=5).read().decode()
    assert 'op: "simulate_work"' in spec and 'op: "python_iterator"' in spec
    time.sleep(0.5)
    snapshot = json.loads(urllib.request.urlopen(url + "/snapshot?format=json", timeout=5).read())
    assert snapshot["state"] == "running" and any(s["id"] == "simulate_work" for s in snapshot["stage"])
    assert pipeline.snapshot()["state"] == "running"
    it.close()
    assert "bottleneck" in pipeline.report().lower() or "stage" in pipeline.report()


def test_a_gpu_feed_yields_one_slice_per_device_per_step():
    ds = (sluice.data.tensors(count=64, shape=[4, 4], dtype="u8").batch(batch_size=8)
          .gpu_feed(emulate=2, consume="external", split="uneven"))
    expected = [b["data"].copy() for b in sluice.data.tensors(count=64, shape=[4, 4], dtype="u8").batch(batch_size=8)]
    steps = 0
    # Each step's tensors are dropped before the next: their slots go back to the feed's ring
    # (a loop holding more steps than the ring's depth would wait for itself).
    for step in ds.pipeline().torch():
        assert len(step) == 2
        assert [int(s["valid_rows"]) for s in step] == [4, 4]
        assert all(isinstance(s["data"], torch.Tensor) and tuple(s["data"].shape) == (4, 4, 4) for s in step)
        joined = np.concatenate([s["data"].numpy() for s in step])
        assert np.array_equal(joined, expected[steps])
        steps += 1
    assert steps == 8


def test_a_consumer_stream_named_through_dlpack_goes_with_the_slot():
    ds = (sluice.data.tensors(count=32, shape=[4], dtype="u8").batch(batch_size=8)
          .gpu_feed(emulate=2, consume="external", split="uneven"))
    steps = 0
    for step in ds.pipeline().tensors():
        for device_slice in step:
            capsule = device_slice["data"].__dlpack__(stream=7)  # a CUDA consumer names its stream
            del capsule
        steps += 1
    assert steps == 4  # every slot came back: the feed ran to its end


def test_feed_tensors_kept_after_the_run_stay_readable():
    ds = (sluice.data.tensors(count=16, shape=[4], dtype="u8").batch(batch_size=8)
          .gpu_feed(emulate=2, consume="external", split="uneven"))
    pipeline = ds.pipeline()
    kept = next(iter(pipeline.torch()))
    pipeline.close()
    assert [int(s["data"].sum()) >= 0 for s in kept] == [True, True]
    del kept  # the slots go back to a feed whose engine is already stopped


def test_the_examples_train_on_a_small_sample(tmp_path):
    # A small copy of the sample data, made by the sample-data pipeline.
    cli("run", "--quiet", os.path.join(SOURCE_DIR, "resources", "pipelines", "sample_data_tfrecord.txtpb"),
        "--set", "images.count=256", "--set", "images.height=64", "--set", "images.width=64",
        "--set", f"shards.prefix={tmp_path}/train", "--set", "shards.max_records=64")
    data = f"{tmp_path}/*.tfrecord"
    env = dict(os.environ)
    examples = os.path.join(SOURCE_DIR, "resources", "examples")
    torch_run = subprocess.run([sys.executable, os.path.join(examples, "train_pytorch.py"), "--steps", "20", "--size", "32",
                                "--data", data], capture_output=True, text=True, timeout=120, env=env)
    assert torch_run.returncode == 0, torch_run.stderr
    assert "epoch 1:" in torch_run.stdout and "elements/s" in torch_run.stdout  # its closing report
    numpy_run = subprocess.run([sys.executable, os.path.join(examples, "numpy_loop.py"), "--epochs", "2", "--data", data],
                               capture_output=True, text=True, timeout=120, env=env)
    assert numpy_run.returncode == 0, numpy_run.stderr
    assert "epoch 2: loss" in numpy_run.stdout


def test_third_party_plugins_join_sluice_data():
    assert os.path.isdir(FIXTURE_PLUGINS), f"no fixture plugins at {FIXTURE_PLUGINS} (SLUICE_FIXTURE_PLUGIN_DIR)"
    sluice.data.load_plugins(os.path.join(FIXTURE_PLUGINS, "good"))
    assert "fail_when" in dir(sluice.data.range())
    with pytest.raises(sluice.PipelineError) as error:
        list(sluice.data.range(count=10, start=1).fail_when(divisor=4, name="picky"))
    assert error.value.stage == "picky" and "picky" in str(error.value)


def test_workers_under_torchrun_read_disjoint_shards(tmp_path):
    # torchrun's variables, as each of its processes sees them: every process iterates the same
    # pipeline file and gets its own shard, together the whole dataset.
    pipeline = tmp_path / "p.txtpb"
    # Its sink writes one file, which several workers running it could not share; iterated, the
    # sink is not run, and the workers are not refused for it.
    pipeline.write_text("options { seed: 3 }\n" + stage("src", "range", "", {"count": "50"}) +
                        stage("mix", "shuffle", "src", {"buffer_size": "50"}) +
                        stage("out", "jsonl_sink", "mix", {"path": str(tmp_path / "all.jsonl")}))
    script = ("import json, sys, sluice\n"
              "p = sluice.Pipeline(sys.argv[1])\n"
              "print(json.dumps({'worker': p.worker, 'values': [int(b['value']) for b in p]}))\n")
    outputs = []
    for rank in range(3):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", LOCAL_RANK=str(rank))
        done = subprocess.run([sys.executable, "-c", script, str(pipeline)], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert [o["worker"][:2] for o in outputs] == [[0, 3], [1, 3], [2, 3]]
    assert outputs[1]["worker"][2] == "torchrun: RANK=1, WORLD_SIZE=3"
    values = [v for o in outputs for v in o["values"]]
    assert sorted(values) == list(range(50))
    # Asked for explicitly, over the environment; a malformed variable is an error naming it.
    assert [int(b["value"]) for b in sluice.Pipeline(str(pipeline), worker_index=1, num_workers=3)] == outputs[1]["values"]
    # The pipeline's own options name the worker where nothing else does, as for `sluice run`
    # (one preparation for every face: sluice/core/prepare.hpp).
    own = tmp_path / "own.txtpb"
    own.write_text(pipeline.read_text().replace("options { seed: 3 }", "options { seed: 3 worker_index: 1 num_workers: 3 }"))
    assert [int(b["value"]) for b in sluice.Pipeline(str(own))] == outputs[1]["values"]
    bad = subprocess.run([sys.executable, "-c", script, str(pipeline)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, RANK="one", WORLD_SIZE="3"))
    assert bad.returncode != 0 and "RANK='one'" in bad.stderr


def test_datasets_combine_the_tf_data_way_and_match_the_pipeline_file(tmp_path):
    import sluice.data as sd
    a, b = sd.range(start=1, count=3), sd.range(start=4, count=4)
    # tf.data's documented examples of zip and concatenate.
    assert [(int(e["a/value"]), int(e["b/value"])) for e in sd.zip(a, b, prefixes=["a", "b"])] == [(1, 4), (2, 5), (3, 6)]
    assert [int(x) for x in a.concatenate(b)] == [1, 2, 3, 4, 5, 6, 7]
    assert [(int(x), int(y)) for x, y in sd.zip(a, b)] == [(1, 4), (2, 5), (3, 6)]  # tf.data's zip(a, b): tuples
    # A dataset given twice, or one built from another, is read twice, each from its own source.
    doubled = sd.zip(a, a.map(lambda x: x * 10), prefixes=["x", "y"])
    assert [(int(e["x/value"]), int(e["y/value"])) for e in doubled] == [(1, 10), (2, 20), (3, 30)]
    words = [sd.from_list(values=w, field="word").repeat(count=-1) for w in ("foo", "bar")]
    assert [e["word"] for e in sd.choose_from_datasets(words, sd.range(count=2).repeat(count=2))] == [b"foo", b"bar"] * 2
    # The same mixture as the pipeline file says, run by the CLI.
    mix = sd.sample_from_datasets([sd.range(count=500), sd.range(start=1000, count=500)], weights=[0.7, 0.3]).options(seed=9)
    python_values = [int(x) for x in mix]
    spec = tmp_path / "mix.txtpb"
    out = tmp_path / "mix.jsonl"
    spec.write_text(mix.spec() + stage("out", "jsonl_sink", "sample_from_datasets", {"path": str(out)}))
    cli("run", "--quiet", str(spec))
    assert python_values == [json.loads(line)["value"] for line in out.read_text().splitlines()]
    assert sorted(python_values) == list(range(500)) + list(range(1000, 1500))
    with pytest.raises(TypeError, match="two or more datasets"):
        sd.zip(a)


def test_a_pipeline_with_several_ends_iterates_the_one_named(tmp_path):
    copy = tmp_path / "all.jsonl"
    text = (stage("src", "range", "", {"count": "50"}) + stage("all", "jsonl_sink", "src", {"path": str(copy)}) +
            stage("first", "take", "src", {"count": "5"}) + stage("few", "null_sink", "first"))
    pipeline = sluice.Pipeline.from_spec(text)
    with pytest.raises(ValueError, match=r"ends in 2 stages \('all', 'few'\): pass output='STAGE'"):
        next(iter(pipeline))
    few = sluice.Pipeline.from_spec(text, output="few")
    assert [int(e["value"]) for e in few] == [0, 1, 2, 3, 4]
    # The other branch ran as written: its sink wrote every element.
    assert [json.loads(line)["value"] for line in copy.read_text().splitlines()] == list(range(50))
    with pytest.raises(ValueError, match="output='nope' names no stage"):
        sluice.Pipeline.from_spec(text, output="nope")


def test_a_pipeline_loads_only_the_plugin_libraries_it_uses(tmp_path):
    # In a fresh interpreter, as a user's script starts: the operators of every plugin are known
    # (from the registry cache) without loading their libraries, and a run maps only the ones its
    # pipeline uses: no vision library (and its image codecs) for a pipeline of std operators.
    script = """
import sluice
def mapped():
    return open("/proc/self/maps").read()
assert hasattr(sluice.data, "synthetic_images") and not hasattr(sluice.data, "no_such_operator")
assert "libsluice_" not in mapped(), "importing sluice loaded a plugin library"
rows = [int(v) for batch in sluice.data.range(count=20).batch(batch_size=5) for v in batch]
assert rows == list(range(20)), rows
assert "libsluice_std.so" in mapped(), "std was not loaded"
assert "libsluice_vision.so" not in mapped(), "a std-only pipeline loaded the vision library"
assert "libsluice_io.so" not in mapped(), "a std-only pipeline loaded the io library"
images = list(sluice.data.synthetic_images(count=2, height=8, width=8).random_flip())
assert len(images) == 2
assert "libsluice_vision.so" in mapped(), "an image pipeline did not load the vision library"
print("ok")
"""
    env = dict(os.environ, SLUICE_REGISTRY=str(tmp_path / "registry.bin"))
    for attempt in ("probed", "from the cache"):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and done.stdout.strip() == "ok", (attempt, done.stdout, done.stderr)
    assert (tmp_path / "registry.bin").is_file()
