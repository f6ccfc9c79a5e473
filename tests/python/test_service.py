"""The Sluice service from Python, written as a tf.data user writes it: a dispatcher and workers
started as a cluster starts them (`sluice dispatcher`, `sluice worker`), and a training script that
sends the front of its dataset there with `distribute()` or tf.data's `apply(service.distribute())`
and iterates the rest here."""
import collections
import concurrent.futures
import re
import subprocess
import time

import pytest

import sluice
from conftest import CLI, cli


class Process:
    """A service process, stopped (SIGTERM, then SIGKILL) when the test ends."""

    def __init__(self, *args):
        self.process = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        match = re.search(r"listening on (\S+:\d+)", line)
        if not match:
            self.stop()
            raise AssertionError(f"sluice {' '.join(args)} did not start: {line}{self.process.stderr.read()}")
        self.address = match.group(1)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Service:
    """A dispatcher with two workers, both registered."""

    def __init__(self):
        self.dispatcher = Process("dispatcher", "--port", "0")
        self.address = self.dispatcher.address
        self.workers = [Process("worker", "--dispatcher", self.address) for _ in range(2)]
        deadline = time.monotonic() + 15
        while cli("service", "workers", "--dispatcher", self.address).stdout.count(" alive") < 2:
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.1)

    def stop(self):
        for process in self.workers + [self.dispatcher]:
            process.stop()


@pytest.fixture
def running_service():
    started = Service()
    yield started
    started.stop()


@pytest.fixture
def service(running_service):
    """The service's address."""
    return running_service.address


def values(dataset):
    return [int(v) for batch in dataset for v in batch.reshape(-1)]


def test_dynamic_gives_every_element_once_per_epoch(service):
    ds = (sluice.data.range(500)
          .simulate_work(us=50)
          .distribute(f"grpc://{service}", processing_mode="dynamic", job_name="python", split_size=20)
          .batch(16))
    assert sorted(values(ds)) == list(range(500))
    assert sorted(values(ds)) == list(range(500))  # the next epoch, from the service again


def test_tf_data_apply_with_a_sharding_policy(service):
    service_api = sluice.data.experimental.service
    ds = sluice.data.range(100).filter_random(p=0.5)
    ds = ds.apply(service_api.distribute(processing_mode=service_api.ShardingPolicy.OFF, service=f"grpc://{service}",
                                         job_name="copies"))
    got = collections.Counter(values(ds.batch(8)))
    # Two copies of the dataset, each with its own seed: some values twice, some once.
    assert set(got.values()) <= {1, 2} and 1 in got.values() and 2 in got.values()
    assert sum(got.values()) > 60


def test_a_job_without_a_name_is_this_runs_own(service):
    ds = sluice.data.range(40).distribute(f"grpc://{service}").batch(10)
    assert sorted(values(ds)) == list(range(40))


def test_a_pipeline_file_with_a_distributed_stage_runs(service):
    spec = f"""options {{ seed: 1 }}
stage {{ id: "numbers" op: "range" params {{ key: "count" value: "30" }} }}
stage {{ id: "work" op: "identity" input: "numbers"
        distribute {{ service: "grpc://{service}" processing_mode: DYNAMIC job_name: "file" split_size: 4 }} }}
"""
    got = [int(e["value"]) for e in sluice.Pipeline.from_spec(spec)]
    assert sorted(got) == list(range(30))


def test_what_the_workers_cannot_run_is_refused_by_name():
    ds = sluice.data.range(10).map(lambda e: e, name="mine")
    with pytest.raises(ValueError, match=r"stage 'mine' \(python_map\) calls Python code.*after distribute\(\)"):
        ds.distribute("grpc://127.0.0.1:5050")
    with pytest.raises(ValueError, match=r"processing_mode 'sometimes' is none of 'dynamic'"):
        sluice.data.range(10).distribute("grpc://127.0.0.1:5050", processing_mode="sometimes")
    with pytest.raises(ValueError, match=r"no stages"):
        sluice.data.Dataset().distribute("grpc://127.0.0.1:5050")


def test_coordinated_reads_give_each_trainer_one_batch_of_every_round(service):
    """tf.data's coordinated reads: two trainers (threads here, processes in a job), each a
    consumer of the job; a split of 8 numbers is one round of two batches."""
    service_api = sluice.data.experimental.service

    def consumer(index):
        ds = sluice.data.range(96).batch(4)
        ds = ds.apply(service_api.distribute("dynamic", f"grpc://{service}", "rounds", index, 2, split_size=8, splits_in_flight=2))
        return [[int(v) for v in batch] for batch in ds]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(consumer, [0, 1])
    assert len(first) == len(second) == 12
    for step, (a, b) in enumerate(zip(first, second)):
        assert a[0] % 8 == 0 and b[0] == a[0] + 4, f"step {step}: {a} and {b}"
    assert sorted(v for batch in first + second for v in batch) == list(range(96))
    with pytest.raises(ValueError, match=r"consumer_index and num_consumers go together"):
        sluice.data.range(4).distribute(f"grpc://{service}", job_name="x", num_consumers=2)
    with pytest.raises(ValueError, match=r"need the job_name"):
        sluice.data.range(4).distribute(f"grpc://{service}", consumer_index=0, num_consumers=2)


@pytest.mark.parametrize("compression", ["zstd", "snappy"])
def test_compressed_on_the_wire(service, compression):
    ds = sluice.data.range(200).distribute(f"grpc://{service}", job_name=compression, split_size=25, compression=compression).batch(20)
    assert sorted(values(ds)) == list(range(200))


def test_the_kubernetes_manifests_start_a_dispatcher_and_workers(tmp_path):
    """resources/kubernetes/service.yaml's commands, run here as its pods would run them (the
    paths of its volumes and the Service's name mapped to this machine): the dispatcher serves
    TLS with the token, and its workers register with it."""
    yaml = pytest.importorskip("yaml")
    import os
    import shlex
    from conftest import SOURCE_DIR
    docs = [d for d in yaml.safe_load_all(open(os.path.join(SOURCE_DIR, "resources", "kubernetes", "service.yaml"))) if d]
    command = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["command"] for d in docs if d["kind"] == "Deployment"}

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=sluice")
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "tls.pem", "-days", "2",
            "-extfile", "san.ext")
    (tmp_path / "token").write_text("k8s-t0ken\n")
    port = str(free_port())

    def here(text):
        for pod, local in (("/opt/sluice/bin/sluice", CLI), ("/tls/", f"{tmp_path}/"), ("/token/token", f"{tmp_path}/token"),
                           ("/journal", f"{tmp_path}/journal"), ("sluice-dispatcher:5050", f"localhost:{port}"), ("5050", port),
                           ("0.0.0.0:9464", "127.0.0.1:0"), ("--port 5051", "--port 0")):
            text = text.replace(pod, local)
        return text
    dispatcher = subprocess.Popen([here(a) for a in command["sluice-dispatcher"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, text=True)
    assert "listening on" in dispatcher.stdout.readline()
    env = dict(os.environ, POD_IP="127.0.0.1", POD_NAMESPACE="training")
    shell = command["sluice-worker"]
    workers = [subprocess.Popen(shell[:2] + [here(shell[2])], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True) for _ in range(2)]
    try:
        client = ["--tls-ca", str(tmp_path / "ca.pem"), "--token-file", str(tmp_path / "token")]
        deadline = time.monotonic() + 20
        while True:
            listed = cli("service", "workers", "--dispatcher", f"localhost:{port}", *client, check=False)
            if listed.stdout.count(" alive") == 2:
                break
            assert time.monotonic() < deadline, listed.stdout + listed.stderr
            time.sleep(0.2)
        assert "127-0-0-1.training.pod.cluster.local:" in listed.stdout
        refused = cli("service", "workers", "--dispatcher", f"localhost:{port}", "--tls-ca", str(tmp_path / "ca.pem"), check=False)
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
    finally:
        for process in workers + [dispatcher]:
            process.terminate()
            process.wait(10)
    assert "t0ken" not in "".join(p.stderr.read() for p in workers + [dispatcher])


def numbered_files(folder, files, lines):
    """Line J of file fK holds "K J": each record says where it is."""
    for k in range(files):
        (folder / f"f{k}.txt").write_text("".join(f"{k} {j}\n" for j in range(lines)))
    return (sluice.data.list_files(patterns=str(folder / "f*.txt"), shuffle=False)
            .text_lines(interleave=dict(cycle_length=2)).split_text(to="int64"))


def test_lineage_names_the_records_the_workers_read(service, tmp_path):
    # Batches made on the workers and rebatched here: each row named with its file, line and epoch.
    ds = (numbered_files(tmp_path, 4, 30).simulate_work(us=1).batch(3)
          .distribute(f"grpc://{service}", job_name="lineage", split_size=1).unbatch().batch(5))
    pipeline = ds.pipeline(lineage=True)
    for epoch in range(2):
        seen = []
        for batch in pipeline:
            rows = pipeline.lineage(batch)
            assert [(int(r[0]), int(r[1])) for r in batch["line"]] == \
                [(int(row["source"].rsplit("/f", 1)[1][:-4]), row["record"]) for row in rows]
            assert {row["epoch"] for row in rows} == {epoch}
            # Drawn on a worker, by the stage as its split named it (its draws' seed is the split's).
            assert all([(k.split("@")[0], e) for k, (e, _) in row["keys"].items()] == [("simulate_work", epoch)] for row in rows), rows
            seen += [(row["source"], row["record"]) for row in rows]
        assert len(seen) == len(set(seen)) == 120


def test_a_service_worker_killed_mid_epoch_loses_and_repeats_no_record(running_service, tmp_path):
    # One of the two workers is killed (SIGKILL) while the first epoch streams: the splits it was
    # making are made again by the other from where the trainer stopped. The trainer's ledger
    # says each record of both epochs arrived once, of the records the files hold.
    ds = (numbered_files(tmp_path, 8, 40).simulate_work(us=3000)
          .distribute(f"grpc://{running_service.address}", job_name="killed", split_size=1).batch(4))
    pipeline = ds.pipeline(lineage=True)
    for step, _ in enumerate(pipeline):
        if step == 10:
            running_service.workers[0].process.kill()
    for _ in pipeline:
        pass
    epochs = pipeline.ledger()
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert (e["records"], e["deliveries"], e["expected"], e["twice"], e["missing"]) == (320, 320, 320, 0, 0), e


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
