"""The delivery ledger from Python: whether each epoch gave every record once, through resumes from
state_dict() after a crash, across the job's workers, and the faults it must name."""
import collections
import json
import pickle
import signal
import subprocess
import time
import urllib.request

import pytest

import sluice
from conftest import CLI, cli, stage

FILES, LINES = 4, 40
RECORDS = FILES * LINES


@pytest.fixture
def spec(tmp_path):
    for k in range(FILES):
        (tmp_path / f"f{k}.txt").write_text("".join(f"{k} {j}\n" for j in range(LINES)))
    return (sluice.data.list_files(patterns=str(tmp_path / "f*.txt"), shuffle=False)
            .text_lines(interleave=dict(cycle_length=2)).split_text(to="int64")
            .shuffle(25).batch(4).options(seed=3).spec())


def job_spec(spec, sharding):
    return spec.replace("options {", f"options {{ sharding: {sharding}", 1)


def clean(epoch, records=RECORDS):
    return (epoch["records"], epoch["expected"], epoch["twice"], epoch["missing"], epoch["under_way"]) == (records, records, 0, 0, False)


def test_each_epoch_of_a_run_gives_each_record_once(spec):
    pipeline = sluice.Pipeline.from_spec(spec, lineage=True)
    for _ in range(2):  # two iterations: two epochs, the ledger kept across them
        assert sum(len(b["line"]) for b in pipeline) == RECORDS
    epochs = pipeline.ledger()
    assert [e["epoch"] for e in epochs] == [0, 1] and all(clean(e) for e in epochs), epochs
    assert epochs[0]["digest"] == epochs[1]["digest"]  # the same records, in another order
    with pytest.raises(ValueError, match="lineage=True"):
        sluice.Pipeline.from_spec(spec).ledger()


def test_a_loop_resumed_after_a_crash_delivers_each_record_once(spec):
    # The loop takes 7 batches, saves its state, takes 5 more and dies: the 5 were lost with the
    # model's progress, so the resumed run gives them again, and they count once.
    first = sluice.Pipeline.from_spec(spec, lineage=True)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    for _ in range(5):
        next(it)
    first.close()
    resumed = sluice.Pipeline.from_spec(spec, lineage=True)
    resumed.load_state_dict(state)
    for _ in resumed:
        pass
    assert resumed.state_dict()["epoch"] == 1
    [epoch] = resumed.ledger()
    assert clean(epoch), epoch
    # The state taken between epochs carries the ledger into the next process's epochs.
    later = sluice.Pipeline.from_spec(spec, lineage=True)
    later.load_state_dict(pickle.loads(pickle.dumps(resumed.state_dict())))
    for _ in later:
        pass
    assert [e["epoch"] for e in later.ledger()] == [0, 1] and all(clean(e) for e in later.ledger())
    # A state taken mid-epoch names the epoch as under way, with what is still to come.
    partial = sluice.delivery_ledger([state])
    assert partial["epochs"][0]["under_way"] and partial["clean"] and "under way" in partial["text"]


def run_worker(spec, index, count):
    pipeline = sluice.Pipeline.from_spec(spec, lineage=True, worker_index=index, num_workers=count)
    for _ in pipeline:
        pass
    return pipeline.state_dict()


def test_a_job_s_ledgers_add_up_and_name_the_records_given_twice_or_never(spec):
    spec = job_spec(spec, "by_record")
    job = [run_worker(spec, w, 2) for w in range(2)]
    whole = sluice.delivery_ledger(job)
    assert whole["clean"] and clean(whole["epochs"][0]), whole["text"]
    # The digest adds up over the workers: the job's is the one process's that read everything.
    single = sluice.Pipeline.from_spec(spec, lineage=True)
    for _ in single:
        pass
    assert whole["epochs"][0]["digest"] == single.ledger()[0]["digest"] != 0
    # Worker 1's ledger lost: its share is missing, named, and the verdict says why.
    alone = sluice.delivery_ledger(job[:1])
    [epoch] = alone["epochs"]
    assert not alone["clean"] and epoch["missing"] == RECORDS // 2 and len(epoch["missing_named"]) == 10
    assert "1 of the job's 2 workers" in alone["text"]
    # Two processes both told they are worker 0: its share twice, worker 1's never.
    twice = sluice.delivery_ledger([job[0], run_worker(spec, 0, 2)])
    [epoch] = twice["epochs"]
    assert (epoch["twice"], epoch["missing"]) == (RECORDS // 2, RECORDS // 2)
    source, record = epoch["twice_named"][0]
    assert source.endswith(".txt") and record >= 0
    assert "more than once:" in twice["text"] and "missing:" in twice["text"]


def test_the_digest_tells_apart_as_many_records_of_the_same_file(tmp_path):
    (tmp_path / "a.txt").write_text("".join(f"{j}\n" for j in range(40)))
    digests = []
    for seed in (1, 2):  # the first 20 records of two shuffles: the same file, the same count
        pipeline = sluice.data.TextLineDataset(str(tmp_path / "a.txt")).shuffle(40).batch(4).options(seed=seed).pipeline(lineage=True)
        it = iter(pipeline)
        for _ in range(5):
            next(it)
        [epoch] = sluice.delivery_ledger([pipeline.state_dict()])["epochs"]
        pipeline.close()
        assert epoch["records"] == 20
        digests.append(epoch["digest"])
    assert digests[0] != digests[1]


def test_a_pipeline_that_reads_its_data_twice_is_told_so(tmp_path):
    # A mistake a ledger exists to catch: the dataset concatenated with itself.
    (tmp_path / "a.txt").write_text("".join(f"{j}\n" for j in range(30)))
    lines = sluice.data.TextLineDataset(str(tmp_path / "a.txt"))
    pipeline = lines.concatenate(lines).batch(8).pipeline(lineage=True)
    for _ in pipeline:
        pass
    [epoch] = pipeline.ledger()
    assert (epoch["records"], epoch["deliveries"], epoch["twice"], epoch["missing"]) == (30, 60, 30, 0)
    assert epoch["twice_named"][0] == (str(tmp_path / "a.txt"), 0)


def test_ledgers_that_are_not_are_refused_by_name(spec):
    plain = sluice.Pipeline.from_spec(spec)
    it = iter(plain)
    next(it)
    with pytest.raises(ValueError, match="state 0 of 1 has no ledger"):
        sluice.delivery_ledger([plain.state_dict()])
    plain.close()
    with pytest.raises(ValueError, match="not a state_dict"):
        sluice.delivery_ledger([{"epoch": 0}])
    with pytest.raises(ValueError, match="damaged"):
        sluice.delivery_ledger([{"epoch": 1, "ledger": b"\x0a\x05garbage"}])


def test_sluice_run_keeps_the_ledger_through_a_kill_and_a_preemption(tmp_path):
    for k in range(FILES):
        (tmp_path / f"g{k}.txt").write_text("".join(f"{k} {j}\n" for j in range(100)))
    pipeline = tmp_path / "p.txtpb"
    pipeline.write_text(
        "options { seed: 5 }\n" + stage("files", "list_files", params={"patterns": "g*.txt", "shuffle": "false"}) +
        stage("lines", "text_lines", "files", extra="interleave { cycle_length: 2 } buffer_size: 2") +
        stage("work", "simulate_work", "lines", {"us": "2000"}, "buffer_size: 2 parallelism: 1") +
        stage("repeat", "repeat", "work", {"count": "3"}) + stage("shuffle", "shuffle", "repeat", {"buffer_size": "25"}, "buffer_size: 2") +
        stage("batch", "batch", "shuffle", {"batch_size": "4"}) + stage("out", "jsonl_sink", "batch", {"path": "out.jsonl"}))
    # (A shuffle after the repeat mixes the epochs and holds its elements by value at each cut.)
    ck, run = tmp_path / "ck", [CLI, "run", "--quiet", str(pipeline), "--checkpoint", str(tmp_path / "ck")]

    def start(*extra):
        return subprocess.Popen(run + list(extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def wait_for(condition):
        deadline = time.monotonic() + 60
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)

    # 1. A checkpoint every 20 batches; the node is lost (kill -9) past the first.
    first = start("--checkpoint-every", "20", "--ledger", str(tmp_path / "a.ledger"))
    wait_for(lambda: (ck / "checkpoint.sluice").exists())
    time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert not (tmp_path / "a.ledger").exists()  # killed: the checkpoint holds its ledger
    killed_at = (ck / "checkpoint.sluice").read_bytes()
    # 2. Resumed, then preempted (SIGTERM: a checkpoint and its ledger, exit 75) past its first checkpoint.
    second = start("--resume", str(ck), "--checkpoint-every", "20", "--ledger", str(tmp_path / "b.ledger"))
    wait_for(lambda: (ck / "checkpoint.sluice").read_bytes() != killed_at)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 75, second.stderr.read()
    partial = cli("ledger", str(tmp_path / "b.ledger"), check=False)
    assert partial.returncode == 0 and "under way" in partial.stdout and "more than once" not in partial.stdout
    assert partial.stdout == cli("ledger", str(ck), check=False).stdout  # the checkpoint carries the same ledger
    # 3. Resumed to the end: every epoch delivered each record once, and the output agrees.
    third = start("--resume", str(ck), "--ledger", str(tmp_path / "c.ledger"))
    assert third.wait(timeout=120) == 0, third.stderr.read()
    verdict = cli("ledger", str(tmp_path / "c.ledger"))
    assert verdict.stdout.count("400 records delivered of 400 expected, none twice, none missing") == 3, verdict.stdout
    lines = [tuple(row) for line in (tmp_path / "out.jsonl").read_text().splitlines() for row in json.loads(line)["line"]]
    assert len(lines) == 1200 and all(count == 3 for count in collections.Counter(lines).values())
    # Faults are named, with exit code 1: the same deliveries given twice; a ledger cut short.
    doubled = cli("ledger", str(tmp_path / "c.ledger"), str(tmp_path / "c.ledger"), check=False)
    assert doubled.returncode == 1 and "400 more than once" in doubled.stdout and "g0.txt record 0" in doubled.stdout
    (tmp_path / "cut.ledger").write_text((tmp_path / "c.ledger").read_text()[:200])
    damaged = cli("ledger", str(tmp_path / "cut.ledger"), check=False)
    assert damaged.returncode == 2 and "cut.ledger is not a ledger file" in damaged.stderr
    missing = cli("ledger", str(tmp_path / "nothing.ledger"), check=False)
    assert missing.returncode == 2 and "nothing.ledger does not exist" in missing.stderr


def test_the_report_metrics_and_metrics_log_show_each_epochs_verdict(spec, tmp_path):
    # The run's report, its /metrics while it runs and its metrics log (which the studio opens)
    # carry the ledger's verdict on each epoch.
    pipeline = tmp_path / "p.txtpb"
    pipeline.write_text(spec.replace("options {", 'stage { id: "out" op: "null_sink" input: "batch" }\noptions {', 1))
    done = cli("run", str(pipeline), "--ledger", str(tmp_path / "run.ledger"), "--metrics-log", str(tmp_path / "log.jsonl"))
    assert f"Delivery ledger:\n  epoch 0: {RECORDS} records delivered of {RECORDS} expected, none twice, none missing" in done.stdout, done.stdout
    last = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    assert [(int(e.get("epoch", 0)), int(e["records"]), int(e["expected"])) for e in last["ledger"]] == [(0, RECORDS, RECORDS)], last.get("ledger")
    live = sluice.Pipeline.from_spec(spec, lineage=True, metrics_addr="127.0.0.1:0")
    it = iter(live)
    for _ in range(3):
        next(it)
    deadline = time.monotonic() + 10
    text = ""
    while "sluice_ledger_records{" not in text and time.monotonic() < deadline:
        time.sleep(0.25)
        text = urllib.request.urlopen(live.metrics_url + "/metrics", timeout=5).read().decode()
    assert 'sluice_ledger_records{epoch="0",under_way=' in text and 'sluice_ledger_twice{epoch="0",under_way=' in text, text[-2000:]
    it.close()
