"""The remote cache (--remote-cache, options.remote_cache): filled by the first read of each object,
read instead of the store afterwards (one HEAD per object and run checks the copy is of the version
stored), never used for another version, kept within its bound by evicting the least recently used,
shared by processes."""
import json
import os
import subprocess
import textwrap

import pytest

from conftest import CLI, DATA, file_records, run_cli, tfrecord_records

BUCKET = "sluice-cache"
SHARD = os.path.join(DATA, "tfrecord", "pets_examples.record")


@pytest.fixture(scope="module")
def bucket(s3):
    s3.client.create_bucket(Bucket=BUCKET)
    for name in ("a", "b"):
        s3.client.upload_file(SHARD, BUCKET, f"shards/{name}.record")
    return BUCKET


SHARD_RECORDS = file_records(SHARD)


def run(tmp_path, env, names, cache, epochs=1, max_bytes="", check=True):
    out = tmp_path / "out.jsonl"
    pipeline = tmp_path / "cached.txtpb"
    patterns = ",".join(f"s3://{BUCKET}/shards/{n}.record" for n in names)
    limit = f'max_bytes: "{max_bytes}"' if max_bytes else ""
    pipeline.write_text(textwrap.dedent(f"""\
        options {{ remote_cache {{ {limit} }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{patterns}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "epochs" op: "repeat" input: "records" params {{ key: "count" value: "{epochs}" }} }}
        stage {{ id: "out" op: "jsonl_sink" input: "epochs" params {{ key: "path" value: "{out}" }} }}
        """))
    done = run_cli(["run", "--remote-cache", str(cache), str(pipeline)], env, check=check)
    got = [json.loads(line)["record"] for line in out.read_text().splitlines()] if done.returncode == 0 else None
    return got, done


def copies(cache):
    return sorted((n, os.path.getsize(cache / n)) for n in os.listdir(cache) if n.endswith(".copy"))


def gets(proxy, name):
    return [r for r in proxy.requests() if r["method"] == "GET" and r["path"].endswith(f"/{name}.record")]


def test_the_first_run_fills_the_cache_and_the_next_reads_it(bucket, proxy, tmp_path):
    cache = tmp_path / "cache"
    proxy.set_faults([])
    got, done = run(tmp_path, proxy.env(), ["a", "b"], cache, epochs=2)
    assert got == SHARD_RECORDS * 4
    assert [size for _, size in copies(cache)] == [os.path.getsize(SHARD)] * 2
    # Epoch 2 read the copies: each object was fetched once, and asked about (HEAD) once.
    assert len(gets(proxy, "a")) == 1 and len(gets(proxy, "b")) == 1, proxy.requests()
    assert len([r for r in proxy.requests() if r["method"] == "HEAD"]) == 2
    proxy.set_faults([])
    got, done = run(tmp_path, proxy.env(), ["a", "b"], cache)
    assert got == SHARD_RECORDS * 2
    assert gets(proxy, "a") == [] and gets(proxy, "b") == []
    assert "2 objects (1.7 MB) from the remote cache" in done.stdout, done.stdout


def test_a_copy_of_another_version_is_not_used(bucket, proxy, s3, tmp_path):
    cache = tmp_path / "cache"
    s3.client.upload_file(SHARD, BUCKET, "shards/c.record")
    run(tmp_path, proxy.env(), ["c"], cache)
    with open(os.path.join(DATA, "tfrecord", "tfx_mnist.tfrecord"), "rb") as f:
        replacement = f.read()
    s3.client.put_object(Bucket=BUCKET, Key="shards/c.record", Body=replacement)
    proxy.set_faults([])
    got, done = run(tmp_path, proxy.env(), ["c"], cache)
    assert got == tfrecord_records(replacement)
    assert len(gets(proxy, "c")) == 1  # fetched again: the copy held the old version
    assert len(copies(cache)) == 2 and len(replacement) in [size for _, size in copies(cache)]


def framed_records(data):
    """The framed records of a TFRecord file (length, its CRC, data, its CRC), each as bytes."""
    import struct
    out, at = [], 0
    while at < len(data):
        length = struct.unpack_from("<Q", data, at)[0]
        out.append(data[at:at + 16 + length])
        at += 16 + length
    return out


def test_a_copy_of_another_version_of_the_same_size_is_not_used(bucket, proxy, s3, tmp_path):
    # The same records in the other order: a valid shard of exactly the old one's size.
    cache = tmp_path / "cache"
    with open(SHARD, "rb") as f:
        original = f.read()
    s3.client.put_object(Bucket=BUCKET, Key="shards/d.record", Body=original)
    run(tmp_path, proxy.env(), ["d"], cache)
    replacement = b"".join(reversed(framed_records(original)))
    assert len(replacement) == len(original) and replacement != original
    s3.client.put_object(Bucket=BUCKET, Key="shards/d.record", Body=replacement)
    proxy.set_faults([])
    got, done = run(tmp_path, proxy.env(), ["d"], cache)
    assert got == tfrecord_records(replacement) != tfrecord_records(original)
    assert len(gets(proxy, "d")) == 1  # fetched again: the copy held the old version


def test_least_recently_used_copies_are_evicted(bucket, proxy, tmp_path):
    cache = tmp_path / "cache"
    bound = str(int(os.path.getsize(SHARD) * 1.5))  # room for one copy, not two
    run(tmp_path, proxy.env(), ["a"], cache, max_bytes=bound)
    run(tmp_path, proxy.env(), ["b"], cache, max_bytes=bound)
    assert len(copies(cache)) == 1
    proxy.set_faults([])
    got, done = run(tmp_path, proxy.env(), ["b"], cache, max_bytes=bound)
    assert got == SHARD_RECORDS and gets(proxy, "b") == []  # b, the most recent, stayed


def test_two_processes_share_one_cache(bucket, proxy, tmp_path):
    cache = tmp_path / "cache"
    runs = []
    for k in range(2):
        folder = tmp_path / f"p{k}"
        folder.mkdir()
        out = folder / "out.jsonl"
        pipeline = folder / "p.txtpb"
        pipeline.write_text(textwrap.dedent(f"""\
            stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{BUCKET}/shards/*.record" }} params {{ key: "shuffle" value: "false" }} }}
            stage {{ id: "records" op: "tfrecord_reader" input: "files" parallelism: 2 interleave {{ cycle_length: 2 block_length: 1 }} }}
            stage {{ id: "epochs" op: "repeat" input: "records" params {{ key: "count" value: "3" }} }}
            stage {{ id: "out" op: "jsonl_sink" input: "epochs" params {{ key: "path" value: "{out}" }} }}
            """))
        runs.append((subprocess.Popen([CLI, "run", "-q", "--remote-cache", str(cache), str(pipeline)], env=proxy.env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out))
    for process, out in runs:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    outputs = [out.read_text() for _, out in runs]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) >= 3 * 3 * len(SHARD_RECORDS)
    assert not [n for n in os.listdir(cache) if n.startswith("filling-")]
    for name, size in copies(cache):
        assert size in (os.path.getsize(SHARD), os.path.getsize(os.path.join(DATA, "tfrecord", "tfx_mnist.tfrecord")))
