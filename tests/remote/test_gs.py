"""gs:// through Google Cloud Storage's XML API: the requests S3's are, with the host Google's
client libraries use (STORAGE_EMULATOR_HOST pointed at moto's server, which checks each request's
Signature Version 4 as GCS checks HMAC keys' signatures). A listing, a read of a key that needs
percent-encoding, a multipart upload and a wrong secret, as for s3://."""
import base64
import json
import os
import textwrap

import pytest

from conftest import DATA, file_records, run_cli

BUCKET = "sluice-gcs"
SHARD = os.path.join(DATA, "tfrecord", "pets_examples.record")


@pytest.fixture(scope="module")
def gcs(s3):
    s3.client.create_bucket(Bucket=BUCKET)
    for key in ("shards/a b+c.record", "shards/two.record", "other/three.record"):
        s3.client.upload_file(SHARD, BUCKET, key)
    return s3


def gcs_env(gcs, **more):
    """A user's gs:// settings: HMAC keys, and the emulator's HOST:PORT (no AWS endpoint)."""
    env = gcs.env(STORAGE_EMULATOR_HOST=gcs.endpoint[len("http://"):], **more)
    del env["AWS_ENDPOINT_URL"]
    return env


def run_pipeline(tmp_path, env, stages, check=True):
    path = tmp_path / "gs.txtpb"
    path.write_text(textwrap.dedent(stages))
    return run_cli(["run", "-q", str(path)], env, check=check)


def test_a_glob_lists_and_reads_every_record(gcs, tmp_path):
    out = tmp_path / "records.jsonl"
    run_pipeline(tmp_path, gcs_env(gcs), f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "gs://{BUCKET}/shards/*.record" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "out" op: "jsonl_sink" input: "records" params {{ key: "path" value: "{out}" }} }}
        """)
    records = [base64.b64decode(json.loads(line)["record"]) for line in out.read_text().splitlines()]
    local = [base64.b64decode(r) for r in file_records(SHARD)]
    assert records == local + local  # "a b+c.record" and "two.record", not other/


def test_an_output_goes_up_in_parts_and_boto3_reads_it(gcs, tmp_path):
    # 7 copies of the 0.87 MB shard in one TFRecord shard: a multipart upload of two 5 MiB parts.
    def write(prefix):
        run_pipeline(tmp_path, gcs_env(gcs), f"""\
            options {{ remote {{ part_size: "5MiB" }} }}
            stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "gs://{BUCKET}/shards/two.record" }} }}
            stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
            stage {{ id: "again" op: "repeat" input: "records" params {{ key: "count" value: "7" }} }}
            stage {{ id: "out" op: "tfrecord_writer" input: "again" params {{ key: "prefix" value: "{prefix}" }} params {{ key: "max_bytes" value: "1073741824" }} }}
            """)
    write(f"gs://{BUCKET}/out/train")
    write(f"{tmp_path}/train")
    key = "out/train-00000-of-00001.tfrecord"
    assert gcs.client.head_object(Bucket=BUCKET, Key=key)["ETag"].endswith('-2"')  # completed from two parts
    assert gcs.client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == (tmp_path / "train-00000-of-00001.tfrecord").read_bytes()
    assert gcs.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_wrong_secret_is_refused_and_never_printed(gcs, tmp_path):
    secret = "not-the-hmac-secret"
    done = run_pipeline(tmp_path, gcs_env(gcs, AWS_SECRET_ACCESS_KEY=secret), f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "gs://{BUCKET}/shards/two.record" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "out" op: "null_sink" input: "records" }}
        """, check=False)
    assert done.returncode != 0 and "SignatureDoesNotMatch" in done.stderr and f"gs://{BUCKET}/shards/" in done.stderr, done.stderr
    assert secret not in done.stderr + done.stdout


@pytest.mark.parametrize("host", ["ftp://127.0.0.1:1"])
def test_an_emulator_host_that_is_not_http_is_refused_by_name(gcs, tmp_path, host):
    env = dict(gcs_env(gcs), STORAGE_EMULATOR_HOST=host)
    done = run_pipeline(tmp_path, env, f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "gs://{BUCKET}/shards/*.record" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "out" op: "null_sink" input: "records" }}
        """, check=False)
    assert done.returncode != 0 and "STORAGE_EMULATOR_HOST" in done.stderr, done.stderr
