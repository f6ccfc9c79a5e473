"""Faults between Sluice and the store, injected by tests/remote/s3_proxy.py at the start, middle and
end of an object: each run gives every record once, in order, or fails at once naming the object,
the HTTP status, the store's code and what to do."""
import json
import os
import textwrap

import pytest

from conftest import DATA, file_records, run_cli, run_cli_cut

BUCKET = "sluice-faults"
SHARD = "tfrecord/pets_examples.record"  # 1.4 MB: several ranges with a 256 KiB range size


@pytest.fixture(scope="module")
def bucket(s3):
    s3.client.create_bucket(Bucket=BUCKET)
    s3.client.upload_file(os.path.join(DATA, SHARD), BUCKET, SHARD)
    return BUCKET


def run_records(tmp_path, env, pattern, options="", check=True):
    """The records a CLI run reads from `pattern`, in order (and the finished process)."""
    out = tmp_path / "out.jsonl"
    if out.exists():
        out.unlink()
    pipeline = tmp_path / "read.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        options {{ remote {{ range_size: "256KiB" {options} }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{pattern}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "out" op: "jsonl_sink" input: "records" params {{ key: "path" value: "{out}" }} }}
        """))
    done = run_cli(["run", "-q", str(pipeline)], env, check=check)
    if done.returncode != 0:
        return None, done
    with open(out) as f:
        return [json.loads(line)["record"] for line in f], done


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    path = os.path.join(DATA, SHARD)
    return file_records(path), os.path.getsize(path)


@pytest.mark.parametrize("action", ["reset", "truncate"])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_cut_transfers_are_resumed_at_the_byte_reached(bucket, proxy, expected, tmp_path, action, where):
    records, size = expected
    # Byte offsets within one GET's body: its first byte, the middle of a range, its last byte.
    at = {"start": 0, "middle": 100_000, "end": 256 * 1024 - 1}[where]
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": action, "at": at, "times": 2}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}")
    assert got == records
    gets = [r for r in proxy.requests() if r["method"] == "GET"]
    cut = [r for r in gets if r["fault"] == action]
    assert len(cut) == 2
    # The try after a cut asks for the rest of the range from the byte reached, not from its start.
    first_cut = gets.index(cut[0])
    retry = next(r for r in gets[first_cut + 1:] if r["range"].split("-")[1] == cut[0]["range"].split("-")[1])
    cut_from = int(cut[0]["range"][len("bytes="):].split("-")[0])
    retry_from = int(retry["range"][len("bytes="):].split("-")[0])
    if action == "truncate":
        assert retry_from == cut_from + at
    else:  # a reset drops what the client's kernel held unread: it resumes where it had got to
        assert cut_from <= retry_from <= cut_from + at


@pytest.mark.parametrize("status,code", [(503, "SlowDown"), (500, "InternalError"), (429, "SlowDown"), (502, "BadGateway")])
def test_retryable_answers_are_retried(bucket, proxy, expected, tmp_path, status, code):
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "status", "status": status, "code": code, "times": 3}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}")
    assert got == expected[0]
    assert sum(1 for r in proxy.requests() if r["fault"] == code) == 3


def test_retries_end_at_the_limit_with_the_store_named(bucket, proxy, tmp_path):
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "status", "status": 503, "code": "SlowDown", "times": -1}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}", options="max_attempts: 3", check=False)
    assert done.returncode != 0
    assert f"s3://{bucket}/{SHARD}" in done.stderr and "503 SlowDown" in done.stderr and "gave up after 3 tries" in done.stderr, done.stderr
    assert len([r for r in proxy.requests() if r["fault"] == "SlowDown"]) == 3


def test_access_denied_is_not_retried(bucket, proxy, tmp_path):
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "status", "status": 403, "code": "AccessDenied", "times": -1}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}", check=False)
    assert done.returncode != 0 and "403 AccessDenied" in done.stderr and "bucket's policy" in done.stderr, done.stderr
    assert len([r for r in proxy.requests() if r["fault"] == "AccessDenied"]) == 1


def test_a_wrong_secret_is_refused_by_the_signature_check(bucket, proxy, tmp_path):
    proxy.set_faults([])
    secret = "not-the-secret-of-the-test-user"
    got, done = run_records(tmp_path, proxy.env(AWS_SECRET_ACCESS_KEY=secret), f"s3://{bucket}/{SHARD}", check=False)
    assert done.returncode != 0 and "SignatureDoesNotMatch" in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr, done.stderr
    # moto, unlike S3, does not say what it signed: the message cannot know which side is wrong.
    assert "did not say over what: either the secret key does not belong to the key id" in done.stderr, done.stderr
    assert secret not in done.stdout + done.stderr


def test_the_right_secret_passes_the_signature_check(bucket, proxy, expected, tmp_path):
    # Also a listing (a signed query string) and a key that needs percent-encoding.
    key = "odd names/a+b=c (1).tfrecord"
    proxy.s3.client.upload_file(os.path.join(DATA, SHARD), BUCKET, key)
    proxy.set_faults([])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/odd names/a+b*")
    assert got == expected[0]
    assert all(r["status"] in (200, 206) for r in proxy.requests()), proxy.requests()


def test_latency_is_hidden_by_read_ahead(bucket, proxy, expected, tmp_path):
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "delay", "seconds": 0.05, "times": -1}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}")
    assert got == expected[0]


def test_report_and_metrics_log_count_requests_retries_and_throttles(bucket, proxy, expected, tmp_path):
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "status", "status": 503, "code": "SlowDown", "times": 3}])
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{SHARD}")
    assert got == expected[0]
    gets = [r for r in proxy.requests() if r["method"] == "GET"]
    line = next(l for l in done.stdout.splitlines() if l.startswith("Remote reads of stage 'records'"))
    assert f"{len(gets)} requests" in line and "3 retries (3 throttled), 0 failed" in line, line
    assert f"{expected[1] / 1e6:.1f} MB" in line, line


def test_a_run_cut_mid_object_resumes_from_its_checkpoint(bucket, proxy, expected, tmp_path):
    # Slow answers, so that SIGTERM lands with the shard half read.
    proxy.set_faults([{"key": SHARD, "method": "GET", "action": "delay", "seconds": 0.3, "times": -1}])
    out = tmp_path / "out.jsonl"
    pipeline = tmp_path / "read.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        options {{ remote {{ range_size: "64KiB" ranges_ahead: 0 }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{bucket}/{SHARD}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" buffer_size: 1 }}
        stage {{ id: "out" op: "jsonl_sink" input: "records" params {{ key: "path" value: "{out}" }} }}
        """))
    run = run_cli_cut(["run", "-q", "--checkpoint", str(tmp_path / "ck"), str(pipeline)], proxy.env(), after=1.5)
    assert run.returncode == 75, run.stderr_text
    with open(out) as f:  # published at the stop with what was read; the resumed run goes on with it
        assert 0 < len(f.readlines()) < len(expected[0])
    read_before = [r for r in proxy.requests() if r["method"] == "GET"]
    assert 0 < len(read_before) < expected[1] // 65536, read_before  # cut inside the object
    proxy.set_faults([])
    run_cli(["run", "-q", "--resume", str(tmp_path / "ck"), str(pipeline)], proxy.env())
    with open(out) as f:
        assert [json.loads(line)["record"] for line in f] == expected[0]
    # The resumed run reads on from where the checkpoint's run stood (after the first bytes, which
    # tell the shard's compression), not the whole object again.
    resumed = [r for r in proxy.requests() if r["method"] == "GET"]
    assert len(resumed) < expected[1] // 65536, resumed


def test_an_unreadable_object_is_skipped_under_skip(bucket, proxy, expected, tmp_path):
    proxy.set_faults([])
    out = tmp_path / "out.jsonl"
    pipeline = tmp_path / "skip.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{bucket}/gone.tfrecord,s3://{bucket}/{SHARD}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" error_policy: skip }}
        stage {{ id: "out" op: "jsonl_sink" input: "records" params {{ key: "path" value: "{out}" }} }}
        """))
    done = run_cli(["run", str(pipeline)], proxy.env())
    assert [json.loads(line)["record"] for line in out.read_text().splitlines()] == expected[0]
    assert "Skipped in stage 'records': 1 element" in done.stdout and f"s3://{bucket}/gone.tfrecord" in done.stdout, done.stdout


def test_an_object_replaced_while_it_is_read_is_named(bucket, proxy, s3, tmp_path):
    import threading
    key = "changing.record"
    s3.client.upload_file(os.path.join(DATA, SHARD), bucket, key)
    # Slow answers, one range of 256 KiB at a time: the object is replaced after the first.
    proxy.set_faults([{"key": key, "method": "GET", "action": "delay", "seconds": 0.4, "times": -1}])
    replace = threading.Timer(0.6, lambda: s3.client.put_object(Bucket=bucket, Key=key, Body=b"x" * 500_000))
    replace.start()
    got, done = run_records(tmp_path, proxy.env(), f"s3://{bucket}/{key}", options="ranges_ahead: 0", check=False)
    replace.join()
    assert done.returncode != 0 and f"s3://{bucket}/{key} changed while it was read" in done.stderr, done.stderr


def test_a_resumed_run_refuses_an_object_replaced_since_its_checkpoint(bucket, proxy, s3, tmp_path):
    # A checkpoint keeps each listed object's size and ETag: an object replaced by one of the same
    # size (one byte changed) is named on resume, not read on as if it were the one begun.
    for name in ("a", "b"):
        s3.client.upload_file(os.path.join(DATA, SHARD), bucket, f"replaced/{name}.record")
    proxy.set_faults([{"key": "replaced/", "method": "GET", "action": "delay", "seconds": 0.3, "times": -1}])
    pipeline = tmp_path / "replaced.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        options {{ remote {{ range_size: "64KiB" ranges_ahead: 0 }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{bucket}/replaced/*.record" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" buffer_size: 1 }}
        stage {{ id: "out" op: "null_sink" input: "records" }}
        """))
    run = run_cli_cut(["run", "-q", "--checkpoint", str(tmp_path / "ck"), str(pipeline)], proxy.env(), after=1.5)
    assert run.returncode == 75, run.stderr_text
    with open(os.path.join(DATA, SHARD), "rb") as f:
        data = bytearray(f.read())
    data[-1] ^= 0xFF  # the same size, other bytes: another ETag
    s3.client.put_object(Bucket=bucket, Key="replaced/b.record", Body=bytes(data))
    proxy.set_faults([])
    done = run_cli(["run", "-q", "--resume", str(tmp_path / "ck"), str(pipeline)], proxy.env(), check=False)
    assert done.returncode != 0
    assert f"s3://{bucket}/replaced/b.record was replaced since the checkpoint's run" in done.stderr, done.stderr
