"""Outputs written to a bucket: whole or absent. jsonl_sink and tfrecord_writer publish an object only
once it is complete (one PUT, or a multipart upload completed at the end), boto3 reads back what
they wrote, and a run cut by SIGTERM or SIGKILL leaves no object and no open multipart upload."""
import base64
import json
import os
import signal
import textwrap

import pytest

from conftest import DATA, file_records, run_cli, run_cli_cut

BUCKET = "sluice-outputs"
SHARD = os.path.join(DATA, "tfrecord", "pets_examples.record")


@pytest.fixture(scope="module")
def bucket(s3, proxy):
    s3.client.create_bucket(Bucket=BUCKET)
    s3.client.upload_file(SHARD, BUCKET, "in/pets.record")
    return BUCKET


def local_records():
    return [base64.b64decode(r) for r in file_records(SHARD)]


def keys(s3, prefix):
    return sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def open_uploads(s3):
    """Multipart uploads begun and neither completed nor aborted, as the store lists them."""
    return [u["UploadId"] for u in s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]


def pipeline(tmp_path, sink, repeat=1, options=""):
    path = tmp_path / "write.txtpb"
    path.write_text(textwrap.dedent(f"""\
        options {{ remote {{ {options} }} }}
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{BUCKET}/in/pets.record" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "again" op: "repeat" input: "records" params {{ key: "count" value: "{repeat}" }} }}
        {sink}
        """))
    return str(path)


def test_jsonl_output_is_one_object_boto3_reads(bucket, s3, tmp_path):
    uri = f"s3://{BUCKET}/out/records.jsonl"
    run_cli(["run", "-q", pipeline(tmp_path, f'stage {{ id: "out" op: "jsonl_sink" input: "again" params {{ key: "path" value: "{uri}" }} }}')],
            s3.env())
    body = s3.client.get_object(Bucket=BUCKET, Key="out/records.jsonl")["Body"].read().decode()
    assert [base64.b64decode(json.loads(line)["record"]) for line in body.splitlines()] == local_records()
    assert open_uploads(s3) == []


def test_large_shards_go_up_in_parts_and_read_back(bucket, s3, proxy, tmp_path):
    # 7 copies of the 0.87 MB shard in one TFRecord shard: two 5 MiB parts of a multipart upload.
    sink = (f'stage {{ id: "out" op: "tfrecord_writer" input: "again" params {{ key: "prefix" value: "s3://{BUCKET}/shards/train" }} '
            f'params {{ key: "max_bytes" value: "1073741824" }} }}')
    # The records become tf.Examples holding them; what matters is that boto3 gets the bytes Sluice wrote.
    proxy.set_faults([])
    run_cli(["run", "-q", pipeline(tmp_path, sink, repeat=7, options='part_size: "5MiB"')], proxy.env())
    assert keys(s3, "shards/") == ["shards/train-00000-of-00001.tfrecord"]
    # Through the proxy, which checked every signature (bodies' hashes included): begun, two parts, completed.
    writes = [(r["method"], r["path"].split("?")[1]) for r in proxy.requests() if r["method"] in ("POST", "PUT")]
    assert [w[0] for w in writes] == ["POST", "PUT", "PUT", "POST"] and writes[0][1] == "uploads=", writes
    assert sorted(w[1].split("&")[0] for w in writes[1:3]) == ["partNumber=1", "partNumber=2"]
    assert all(r["status"] == 200 for r in proxy.requests() if r["method"] in ("POST", "PUT")), proxy.requests()
    body = s3.client.get_object(Bucket=BUCKET, Key="shards/train-00000-of-00001.tfrecord")["Body"].read()
    assert len(body) > 5 << 20
    local = tmp_path / "local"
    local_sink = (f'stage {{ id: "out" op: "tfrecord_writer" input: "again" params {{ key: "prefix" value: "{local}/train" }} '
                  f'params {{ key: "max_bytes" value: "1073741824" }} }}')
    run_cli(["run", "-q", pipeline(tmp_path, local_sink, repeat=7)], s3.env())
    assert body == (local / "train-00000-of-00001.tfrecord").read_bytes()
    assert open_uploads(s3) == []


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_cut_run_leaves_no_object_and_no_upload(bucket, s3, proxy, tmp_path, how):
    key = f"cut/{how.name}.jsonl"
    # Slow reads through the proxy, so that the signal lands while the output is being written.
    proxy.set_faults([{"key": "in/pets.record", "method": "GET", "action": "delay", "seconds": 0.2, "times": -1}])
    path = pipeline(tmp_path, f'stage {{ id: "out" op: "jsonl_sink" input: "again" params {{ key: "path" value: "s3://{BUCKET}/{key}" }} }}',
                    repeat=50, options='range_size: "64KiB" ranges_ahead: 0')
    run = run_cli_cut(["run", "-q", path], proxy.env(SLUICE_SPOOL_DIR=str(tmp_path / "spool")), after=1.5, sig=how)
    assert run.returncode != 0
    assert keys(s3, "cut/") == [] or key not in keys(s3, "cut/")
    assert open_uploads(s3) == []
    proxy.set_faults([])


def test_a_checkpointed_output_is_taken_back_and_continued(bucket, s3, proxy, tmp_path):
    uri = f"s3://{BUCKET}/resumed/records.jsonl"
    proxy.set_faults([{"key": "in/pets.record", "method": "GET", "action": "delay", "seconds": 0.3, "times": -1}])
    path = pipeline(tmp_path, f'stage {{ id: "out" op: "jsonl_sink" input: "again" params {{ key: "path" value: "{uri}" }} }}',
                    options='range_size: "64KiB" ranges_ahead: 0')
    env = proxy.env(SLUICE_SPOOL_DIR=str(tmp_path / "spool"))
    run = run_cli_cut(["run", "-q", "--checkpoint", str(tmp_path / "ck"), path], env, after=1.5)
    assert run.returncode == 75, run.stderr_text
    first = s3.client.get_object(Bucket=BUCKET, Key="resumed/records.jsonl")["Body"].read().decode().splitlines()
    assert 0 < len(first) < len(local_records())  # published at the stop, as a local output is
    proxy.set_faults([])
    run_cli(["run", "-q", "--resume", str(tmp_path / "ck"), path], env)
    body = s3.client.get_object(Bucket=BUCKET, Key="resumed/records.jsonl")["Body"].read().decode()
    assert [base64.b64decode(json.loads(line)["record"]) for line in body.splitlines()] == local_records()


def test_http_outputs_are_refused_by_name(bucket, s3, tmp_path):
    done = run_cli(["run", "-q", pipeline(tmp_path, 'stage { id: "out" op: "jsonl_sink" input: "again" params { key: "path" value: "https://example.com/x.jsonl" } }')],
                   s3.env(), check=False)
    assert done.returncode != 0 and "https://example.com/x.jsonl" in done.stderr and "read-only" in done.stderr, done.stderr


def test_webdataset_shards_written_to_a_bucket(bucket, s3, tmp_path):
    sink = (f'stage {{ id: "out" op: "webdataset_writer" input: "again" params {{ key: "prefix" value: "s3://{BUCKET}/wds/train" }} '
            f'params {{ key: "max_records" value: "4" }} }}')
    run_cli(["run", "-q", pipeline(tmp_path, sink)], s3.env())
    names = keys(s3, "wds/")
    local = tmp_path / "local"
    run_cli(["run", "-q", pipeline(tmp_path, sink.replace(f"s3://{BUCKET}/wds", str(local)))], s3.env())
    assert len(names) > 1 and [n.split("/")[1] for n in names] == sorted(os.listdir(local)), names
    for name in names:
        assert s3.client.get_object(Bucket=BUCKET, Key=name)["Body"].read() == (local / name.split("/")[1]).read_bytes()


def test_checkpoints_and_metrics_logs_in_a_bucket(bucket, s3, proxy, tmp_path):
    ck, log = f"s3://{BUCKET}/ck/run1", f"s3://{BUCKET}/logs/run1.jsonl"
    out = tmp_path / "out.jsonl"
    proxy.set_faults([{"key": "in/pets.record", "method": "GET", "action": "delay", "seconds": 0.3, "times": -1}])
    path = pipeline(tmp_path, f'stage {{ id: "out" op: "jsonl_sink" input: "again" params {{ key: "path" value: "{out}" }} }}',
                    options='range_size: "64KiB" ranges_ahead: 0')
    run = run_cli_cut(["run", "-q", "--checkpoint", ck, "--metrics-log", log, path], proxy.env(), after=1.5)
    assert run.returncode == 75, run.stderr_text
    assert keys(s3, "ck/") == ["ck/run1/checkpoint.sluice"]
    snapshots = s3.client.get_object(Bucket=BUCKET, Key="logs/run1.jsonl")["Body"].read().decode().splitlines()
    assert snapshots and all(json.loads(line)["stage"] for line in snapshots)
    proxy.set_faults([])
    run_cli(["run", "-q", "--resume", ck, path], proxy.env())
    assert [base64.b64decode(json.loads(line)["record"]) for line in out.read_text().splitlines()] == local_records()


def test_a_cache_file_in_a_bucket_is_recorded_then_replayed(bucket, s3, proxy, tmp_path):
    uri = f"s3://{BUCKET}/cache/records.cache"
    out = tmp_path / "out.jsonl"

    def cached_pipeline(before_cache=""):
        path = tmp_path / "cached.txtpb"
        path.write_text(textwrap.dedent(f"""\
            stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{BUCKET}/in/pets.record" }} params {{ key: "shuffle" value: "false" }} }}
            stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
            {before_cache}
            stage {{ id: "cache" op: "cache" input: "{'trim' if before_cache else 'records'}" params {{ key: "path" value: "{uri}" }} }}
            stage {{ id: "again" op: "repeat" input: "cache" params {{ key: "count" value: "2" }} }}
            stage {{ id: "out" op: "jsonl_sink" input: "again" params {{ key: "path" value: "{out}" }} }}
            """))
        return str(path)

    def written():
        return [base64.b64decode(json.loads(line)["record"]) for line in out.read_text().splitlines()]

    # The first run reads the shard once, records it into the bucket (one object, published when
    # the first iteration is whole) and replays it for the second.
    run_cli(["run", "-q", cached_pipeline()], proxy.env())
    assert written() == local_records() * 2
    assert keys(s3, "cache/") == ["cache/records.cache"] and open_uploads(s3) == []
    # The next run replays the object from the bucket both times, without reading the shard.
    reads_before = sum(1 for r in proxy.requests() if r["method"] == "GET" and "in/pets.record" in r["path"])
    out.unlink()
    run_cli(["run", "-q", cached_pipeline()], proxy.env())
    assert written() == local_records() * 2
    assert sum(1 for r in proxy.requests() if r["method"] == "GET" and "in/pets.record" in r["path"]) == reads_before
    # A different pipeline before the cache is refused by name, never replayed.
    take = 'stage { id: "trim" op: "take" input: "records" params { key: "count" value: "5" } }'
    done = run_cli(["run", "-q", cached_pipeline(take)], proxy.env(), check=False)
    assert done.returncode != 0 and f"cache file {uri} was made by a different pipeline" in done.stderr, done.stderr


def files_pipeline(tmp_path, folder, name="files", work_us=0):
    path = tmp_path / f"{name}.txtpb"
    work = (f'stage {{ id: "slow" op: "simulate_work" input: "read" params {{ key: "us" value: "{work_us}" }} buffer_size: 1 }}'
            if work_us else "")
    path.write_text(textwrap.dedent(f"""\
        stage {{ id: "list" op: "list_files" params {{ key: "patterns" value: "{DATA}/jpeg/**/*.jpg" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "read" op: "read_file" input: "list" }}
        {work}
        stage {{ id: "out" op: "write_files" input: "{'slow' if work_us else 'read'}" params {{ key: "folder" value: "{folder}" }} params {{ key: "field" value: "data" }} params {{ key: "class_field" value: "" }} }}
        """))
    return str(path)


def local_files(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(folder) for f in names}


def bucket_files(s3, prefix):
    return {k[len(prefix) + 1:]: s3.client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys(s3, prefix + "/")}


def test_write_files_into_a_bucket_gives_the_local_folder(bucket, s3, tmp_path):
    run_cli(["run", "-q", files_pipeline(tmp_path, tmp_path / "local", "local")], s3.env())
    expected = local_files(tmp_path / "local")
    assert len(expected) > 40
    run_cli(["run", "-q", files_pipeline(tmp_path, f"s3://{BUCKET}/images")], s3.env())
    assert bucket_files(s3, "images") == expected
    assert open_uploads(s3) == []
    # A prefix that holds objects is refused, as a folder that holds files is, and left as it was.
    done = run_cli(["run", "-q", files_pipeline(tmp_path, f"s3://{BUCKET}/images")], s3.env(), check=False)
    assert done.returncode != 0 and f"output folder s3://{BUCKET}/images already holds" in done.stderr, done.stderr
    assert bucket_files(s3, "images") == expected


@pytest.mark.parametrize("how", ["SIGKILL", "checkpoint"])
def test_write_files_into_a_bucket_cut_or_stopped_and_resumed(bucket, s3, proxy, tmp_path, how):
    # The shard's records, one file each, read slowly (a range of 64 KiB every 0.3 s) so that the
    # run is cut with some written: by SIGKILL (nothing is published; the files wait in the spool
    # folder), or by SIGTERM (a checkpoint, and the files so far published at the stop).
    def sink(folder):
        return (f'stage {{ id: "out" op: "write_files" input: "again" params {{ key: "folder" value: "{folder}" }} '
                'params { key: "field" value: "record" } params { key: "class_field" value: "" } params { key: "extension" value: ".bin" }')
    prefix = f"cut-{how}"
    spool = tmp_path / "spool"
    env = proxy.env(SLUICE_SPOOL_DIR=str(spool))
    run_cli(["run", "-q", pipeline(tmp_path, sink(tmp_path / "local") + " }")], env)
    expected = local_files(tmp_path / "local")
    assert sorted(expected.values()) == sorted(local_records())
    proxy.set_faults([{"key": "in/pets.record", "method": "GET", "action": "delay", "seconds": 0.3, "times": -1}])
    path = pipeline(tmp_path, sink(f"s3://{BUCKET}/{prefix}") + " }", options='range_size: "64KiB" ranges_ahead: 0')
    run = run_cli_cut(["run", "-q", "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "1", path], env, after=2,
                      sig=signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
    if how == "SIGKILL":
        assert keys(s3, prefix + "/") == []
        assert any(spool.rglob("*.bin")), list(spool.rglob("*"))
    else:
        assert run.returncode == 75, run.stderr_text
        assert 0 < len(bucket_files(s3, prefix)) < len(expected)
    proxy.set_faults([])
    run_cli(["run", "-q", "--resume", str(tmp_path / "ck"), path], env)
    assert bucket_files(s3, prefix) == expected
    assert open_uploads(s3) == []
