"""A hostile store (hostile_store.py) against `sluice run`: keys are sent as they are, never
resolved into another bucket; a listing that loops or never ends cannot hold a run (an error
naming the prefix; the first SIGTERM); a listing page of many keys costs its objects, not a tree
of its text; an answer that contradicts the request is named for what it is."""
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CLI, DATA, run_cli
from hostile_store import HostileStore, listing, query_of


@pytest.fixture(scope="module")
def store():
    server = HostileStore()
    yield server
    server.stop()


def pipeline(tmp_path, pattern, sink='op: "null_sink"', options=""):
    path = tmp_path / "hostile.txtpb"
    path.write_text(textwrap.dedent(f"""\
        options {{ remote {{ max_attempts: 2 {options} }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{pattern}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "out" {sink} input: "records" }}
        """))
    return str(path)


def stop_with_sigterm(run, seconds, what):
    """SIGTERM to `run`, which must then end within `seconds`; its (stdout, stderr)."""
    run.send_signal(signal.SIGTERM)
    try:
        return run.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail(f"one SIGTERM did not end {what}")


# 1. Dot segments are part of a key: resolving them would read (or write) another bucket.
def test_keys_with_dot_segments_are_sent_as_the_keys_they_are(store, tmp_path):
    store.reset(lambda h: h.send(404, b"<Error><Code>NoSuchKey</Code><Message>none</Message></Error>"))
    uri = "s3://bkt/data/../../../other/x.tfrecord"
    done = run_cli(["run", "-q", pipeline(tmp_path, uri)], store.env(), check=False)
    assert done.returncode != 0 and uri in done.stderr, done.stderr
    paths = [path for _, path in store.paths()]
    assert paths and all(path.startswith("/bkt/data/../../../other/x.tfrecord") for path in paths), paths


def test_an_output_key_with_dot_segments_stays_in_its_bucket(store, tmp_path):
    store.reset(lambda h: h.send(200, b"", headers=[("ETag", '"e"')]))
    path = tmp_path / "write.txtpb"
    path.write_text(textwrap.dedent("""\
        stage { id: "numbers" op: "range" params { key: "count" value: "3" } }
        stage { id: "out" op: "jsonl_sink" input: "numbers" params { key: "path" value: "s3://bkt/../other/out.jsonl" } }
        """))
    run_cli(["run", "-q", str(path)], store.env())
    assert [p for m, p in store.paths() if m == "PUT"] == ["/bkt/../other/out.jsonl"], store.paths()


def test_an_http_path_with_dot_segments_is_sent_as_given(store, tmp_path):
    store.reset(lambda h: h.send(404, b"no", content_type="text/plain"))
    url = f"{store.endpoint}/public/../private/x.tfrecord"
    done = run_cli(["run", "-q", pipeline(tmp_path, url)], store.env(), check=False)
    assert done.returncode != 0 and url in done.stderr, done.stderr
    assert {path for _, path in store.paths()} == {"/public/../private/x.tfrecord"}


# 5. A listing cannot hold a run: a token given twice is an error; SIGTERM ends any listing.
def test_a_listing_that_gives_a_token_twice_is_refused_naming_the_prefix(store, tmp_path):
    pages = {"": (["shards/a.tfrecord"], "A"), "A": (["shards/b.tfrecord"], "B"), "B": (["shards/c.tfrecord"], "A")}
    store.reset(lambda h: h.send(200, listing(*pages[query_of(h.path).get("continuation-token", "")])))
    started = time.monotonic()
    done = run_cli(["run", "-q", pipeline(tmp_path, "s3://bkt/shards/*.tfrecord")], store.env(), check=False, timeout=60)
    assert done.returncode != 0, done.stderr
    assert "s3://bkt/shards/" in done.stderr and "a continuation token it had already given" in done.stderr, done.stderr
    assert len(store.paths()) == 3 and time.monotonic() - started < 30


def test_sigterm_ends_a_listing_that_never_ends(store, tmp_path):
    def endless(handler):
        token = int(query_of(handler.path).get("continuation-token") or 0)
        time.sleep(0.05)
        handler.send(200, listing([f"shards/{token:09d}.tfrecord"], str(token + 1)))
    store.reset(endless)
    run = subprocess.Popen([CLI, "run", "-q", pipeline(tmp_path, "s3://bkt/shards/*.tfrecord")], env=store.env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(store.paths()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(store.paths()) >= 5, "the listing did not start"
    out, err = stop_with_sigterm(run, 10, "a run whose listing never ends")
    assert run.returncode == 130, err
    assert "failed" not in err, err  # the stop's own doing, not a failure of the listing


def stall(handler):
    """Headers, then silence: without the stop, a read waits for the stall timeout (30 s)."""
    handler.send_response(206)
    handler.send_header("Content-Range", "bytes 0-65535/873919")
    handler.send_header("Content-Length", "65536")
    handler.end_headers()
    handler.wfile.flush()
    time.sleep(25)


def start_stalled(store, args):
    run = subprocess.Popen(args, env=store.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not store.paths() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return run


def test_sigterm_ends_a_read_the_server_stalls(store, tmp_path):
    store.reset(stall)
    url = f"{store.endpoint}/data/stalled.tfrecord"
    run = start_stalled(store, [CLI, "run", "-q", pipeline(tmp_path, url, options='range_size: "64KiB"')])
    started = time.monotonic()
    out, err = stop_with_sigterm(run, 8, "a run waiting on a stalled read")
    print(f"stopped {time.monotonic() - started:.2f} s after SIGTERM")
    assert run.returncode == 130 and "error" not in err, err


def test_a_read_ended_by_sigterm_is_not_counted_as_a_skipped_element(store, tmp_path):
    # read_file (a map) under `skip`: the read the stop ended is the stop's, not the element's fault.
    store.reset(stall)
    path = tmp_path / "read.txtpb"
    path.write_text(textwrap.dedent(f"""\
        options {{ error_policy: skip }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{store.endpoint}/data/stalled.bin" }} }}
        stage {{ id: "read" op: "read_file" input: "files" }}
        stage {{ id: "out" op: "null_sink" input: "read" }}
        """))
    run = start_stalled(store, [CLI, "run", "-q", str(path)])  # the report is printed at the end
    out, err = stop_with_sigterm(run, 8, "a run whose read_file waits on a stalled read")
    assert run.returncode == 130, err
    row = next(line for line in out.splitlines() if line.startswith("read "))
    assert row.split()[-1] == "0", out  # the report's `skipped` column


# 10. A page of many keys is parsed as it arrives.
def max_rss_mib(args, env):
    """The peak memory of `args` run to its end, in MiB (ru_maxrss of a child of a fresh process)."""
    measure = ("import resource, subprocess, sys\n"
               "done = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, capture_output=True)\n"
               "sys.stderr.write(done.stderr.decode())\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")
    done = subprocess.run([sys.executable, "-c", measure, *args], env=env, capture_output=True, text=True, timeout=300)
    return int(done.stdout.strip()), done.stderr


@pytest.mark.skipif(os.environ.get("SLUICE_SANITIZED") == "1", reason="ASan's quarantine holds freed memory: no peak to compare")
def test_a_listing_page_of_many_keys_costs_its_objects_not_a_tree_of_its_text(store, tmp_path):
    small, many = listing(["shards/0.tfrecord"]), listing([f"shards/{i:09d}.tfrecord" for i in range(300_000)])
    args = [CLI, "run", "-q", pipeline(tmp_path, "s3://bkt/shards/*.tfrecord", sink='op: "null_sink"')]
    store.reset(lambda h: h.send(200, small) if "list-type" in h.path else h.send(404, b"<Error><Code>NoSuchKey</Code></Error>"))
    base, _ = max_rss_mib(args, store.env())
    store.reset(lambda h: h.send(200, many) if "list-type" in h.path else h.send(404, b"<Error><Code>NoSuchKey</Code></Error>"))
    peak, err = max_rss_mib(args, store.env())
    assert "NoSuchKey" in err, err  # the listing was read whole: its first object was asked for
    body_mib = len(many) / 2**20
    print(f"a listing page of {body_mib:.0f} MiB (300,000 keys): peak {peak} MiB, {peak - base} MiB over a one-key listing's {base} MiB")
    assert peak - base < 4 * body_mib, (peak, base, body_mib)


# 11. Answers that contradict the request are named for what they are.
def test_a_web_page_answering_a_ranged_get_is_named(store, tmp_path):
    page = b"<html><body>Please log in to download this file.</body></html>\n" + b" " * 16
    store.reset(lambda h: h.send(200, page, content_type="text/html; charset=utf-8"))
    url = f"{store.endpoint}/datasets/train.tfrecord"
    done = run_cli(["run", "-q", pipeline(tmp_path, url)], store.env(), check=False)
    assert done.returncode != 0 and url in done.stderr, done.stderr
    assert f"200 OK and {len(page)} bytes of text/html (a web page), not the object's bytes" in done.stderr, done.stderr
    assert "TFRecord" not in done.stderr, done.stderr  # not taken for a damaged file


def test_a_whole_answer_of_another_length_than_the_object_is_named(store, tmp_path):
    # The first range answered as it should (206, the object's size in Content-Range); the next
    # ones with 200 OK and 80 bytes, which is not the object.
    with open(os.path.join(DATA, "tfrecord", "pets_examples.record"), "rb") as f:
        data = f.read()

    def answer(handler):
        first, last = (int(n) for n in handler.headers["Range"][len("bytes="):].split("-"))
        if first == 0:
            handler.send(206, data[:last + 1], content_type="binary/octet-stream",
                         headers=[("Content-Range", f"bytes 0-{last}/{len(data)}"), ("ETag", '"e"')])
        else:
            handler.send(200, b"x" * 80, content_type="binary/octet-stream", headers=[("ETag", '"e"')])
    store.reset(answer)
    url = f"{store.endpoint}/data/pets.record"
    done = run_cli(["run", "-q", pipeline(tmp_path, url, options='range_size: "256KiB"')], store.env(), check=False)
    assert done.returncode != 0 and url in done.stderr, done.stderr
    assert f"200 OK and 80 bytes where the object has {len(data)}" in done.stderr, done.stderr


def test_an_answer_that_is_not_http_is_called_a_cut_connection_and_names_the_uri(store, tmp_path):
    def garbage(handler):
        handler.wfile.write(b"\x00\x01 no status line\r\n")
        handler.wfile.flush()
        handler.close_connection = True
    store.reset(garbage)
    url = f"{store.endpoint}/data/x.tfrecord"
    done = run_cli(["run", "-q", pipeline(tmp_path, url)], store.env(), check=False)
    assert done.returncode != 0 and url in done.stderr, done.stderr
    assert "the answer was not HTTP" in done.stderr and "connection was cut" in done.stderr, done.stderr
    assert "CURL_CA_BUNDLE" not in done.stderr and "certificate" not in done.stderr, done.stderr
