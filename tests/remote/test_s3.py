"""Reading from an S3-compatible store (moto's, on loopback, checking signatures), as a user points a pipeline at a bucket:
the same bytes as from local files, every page of a listing, and failures that name the object."""
import json
import os
import textwrap

import pytest

from conftest import DATA, run_cli

import sluice

BUCKET = "sluice-data"


@pytest.fixture(scope="session")
def store(s3):
    # The in-process engine reads the store's settings from the environment at its first request.
    os.environ.update(s3.env())
    s3.client.create_bucket(Bucket=BUCKET)
    s3.tfrecords = s3.upload_tree(BUCKET, os.path.join(DATA, "tfrecord"), "tfrecord")
    s3.jpegs = s3.upload_tree(BUCKET, os.path.join(DATA, "jpeg"), "jpeg")
    return s3


def records(dataset):
    """The records of a TFRecordDataset, in order: tf.data's elements (the record alone)."""
    return [bytes(record) for record in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("readers", [1, 4])
def test_tfrecords_from_s3_are_the_local_bytes(store, readers):
    keys = sorted(k for k in store.tfrecords if k.endswith((".record", ".tfrecord")) and "/corrupt/" not in k)
    assert len(keys) >= 3
    local = records(sluice.data.TFRecordDataset([store.tfrecords[k] for k in keys], num_parallel_reads=readers))
    remote = records(sluice.data.TFRecordDataset([f"s3://{BUCKET}/{k}" for k in keys], num_parallel_reads=readers))
    assert len(local) > 100
    assert remote == local


def test_gzip_tfrecords_from_s3(store):
    keys = sorted(k for k in store.tfrecords if k.endswith(".tfrecord.gz"))
    local = records(sluice.data.TFRecordDataset([store.tfrecords[k] for k in keys], compression_type="GZIP"))
    remote = records(sluice.data.TFRecordDataset([f"s3://{BUCKET}/{k}" for k in keys], compression_type="GZIP"))
    assert len(local) > 10 and remote == local


def test_list_files_with_double_star_lists_what_boto3_put(store):
    listed = [path.decode() for path in sluice.data.list_files(f"s3://{BUCKET}/jpeg/**/*.jpg", shuffle=False).as_numpy_iterator()]
    expected = sorted(f"s3://{BUCKET}/{k}" for k in store.jpegs if k.endswith(".jpg"))
    assert listed == expected and len(listed) > 10


@pytest.mark.parametrize("parallelism", [1, 4])
def test_read_file_gives_each_objects_bytes(store, parallelism):
    ds = sluice.data.list_files(f"s3://{BUCKET}/jpeg/**/*.jpg", shuffle=False).read_file(parallelism=parallelism)
    got = {e["path"].decode(): e["data"] for e in ds.as_numpy_iterator()}
    assert len(got) > 10
    for uri, data in got.items():
        with open(store.jpegs[uri[len(f"s3://{BUCKET}/"):]], "rb") as f:
            assert data == f.read(), uri


def test_listing_of_more_than_one_page(store):
    # S3 answers at most 1,000 keys a page: 1,234 need two pages and a continuation token.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.client.put_object(Bucket=BUCKET, Key=f"many/part-{i:05d}.txt", Body=f"line {i}\n".encode()),
                      range(1234)))
    listed = [path.decode() for path in sluice.data.list_files(f"s3://{BUCKET}/many/*.txt", shuffle=False).as_numpy_iterator()]
    assert listed == [f"s3://{BUCKET}/many/part-{i:05d}.txt" for i in range(1234)]
    text = sluice.data.list_files(f"s3://{BUCKET}/many/part-0000*.txt", shuffle=False).text_lines()
    assert [e["line"].decode() for e in text.as_numpy_iterator()] == [f"line {i}" for i in range(10)]


def pipeline_file(tmp_path, pattern):
    path = tmp_path / "remote.txtpb"
    path.write_text(textwrap.dedent(f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{pattern}" }} params {{ key: "shuffle" value: "false" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "count" op: "null_sink" input: "records" }}
        """))
    return str(path)


def test_missing_object_is_named_with_what_to_do(store, tmp_path):
    done = run_cli(["run", "-q", pipeline_file(tmp_path, f"s3://{BUCKET}/tfrecord/no-such.tfrecord")], store.env(), check=False)
    assert done.returncode != 0
    assert f"s3://{BUCKET}/tfrecord/no-such.tfrecord" in done.stderr and "NoSuchKey" in done.stderr, done.stderr
    assert "check the key" in done.stderr


def test_pattern_matching_nothing_says_what_is_there(store, tmp_path):
    done = run_cli(["run", "-q", pipeline_file(tmp_path, f"s3://{BUCKET}/tfrecord/*.nothing")], store.env(), check=False)
    assert done.returncode != 0 and "matches no object" in done.stderr and f"s3://{BUCKET}/tfrecord/" in done.stderr, done.stderr


def test_unknown_key_id_fails_at_once_and_shows_no_secret(store, tmp_path):
    secret = "wJalrXUtnFEMI-not-a-real-secret-42"
    env = store.env(AWS_ACCESS_KEY_ID="AKIDUNKNOWN", AWS_SECRET_ACCESS_KEY=secret)
    done = run_cli(["run", pipeline_file(tmp_path, f"s3://{BUCKET}/tfrecord/*.record")], env, check=False)
    assert done.returncode != 0 and "InvalidAccessKeyId" in done.stderr, done.stderr
    assert "AWS_ACCESS_KEY_ID" in done.stderr  # where the credentials came from
    assert secret not in done.stdout + done.stderr


def test_secret_appears_in_no_output_of_a_run(store, tmp_path):
    # The real secret, in everything a run that read with it prints and writes; then a wrong,
    # distinctive one, in everything the refused run prints and writes.
    metrics = tmp_path / "metrics.jsonl"
    done = run_cli(["run", "--metrics-log", str(metrics), pipeline_file(tmp_path, f"s3://{BUCKET}/tfrecord/*.record")], store.env())
    assert "records" in done.stdout
    assert store.secret_key not in done.stdout + done.stderr + metrics.read_text()
    secret = "pr1vate-Secret/Key+ForGrep"
    done = run_cli(["run", "--metrics-log", str(metrics), pipeline_file(tmp_path, f"s3://{BUCKET}/tfrecord/*.record")],
                   store.env(AWS_SECRET_ACCESS_KEY=secret), check=False)
    assert done.returncode != 0 and "SignatureDoesNotMatch" in done.stderr, done.stderr
    assert secret not in done.stdout + done.stderr + metrics.read_text()


def test_webdataset_shards_from_s3_are_the_local_samples(store):
    folder = os.path.join(DATA, "webdataset")
    names = sorted(n for n in os.listdir(folder) if n.endswith((".tar", ".tar.gz", ".tgz")) and "bad" not in n and "cut" not in n)
    for n in names:
        store.client.upload_file(os.path.join(folder, n), BUCKET, f"wds/{n}")

    def samples(paths):
        ds = sluice.data.list_files(paths, shuffle=False).webdataset_reader()
        return [{k: v for k, v in e.items() if k != "__url__"} for e in ds.as_numpy_iterator()]

    local = samples([os.path.join(folder, n) for n in names])
    remote = samples([f"s3://{BUCKET}/wds/{n}" for n in names])
    assert len(local) > 5
    assert [sorted(e) for e in remote] == [sorted(e) for e in local]
    for r, l in zip(remote, local):
        for k in l:
            assert bytes(r[k]) == bytes(l[k]) if isinstance(l[k], bytes) else (r[k] == l[k]).all()


def test_csv_rows_from_s3_are_the_local_rows(store, tmp_path):
    local = tmp_path / "table.csv"
    local.write_text('id,name,score\n1,"a, quoted",0.5\n2,b,1.5\n3,"multi\nline",2.5\n' + "".join(f"{i},n{i},{i}.25\n" for i in range(4, 3000)))
    store.client.upload_file(str(local), BUCKET, "csv/table.csv")

    def rows(path):
        return [tuple(e[k].tolist() if hasattr(e[k], "tolist") else e[k] for k in ("id", "name", "score"))
                for e in sluice.data.list_files(path, shuffle=False).csv_reader().as_numpy_iterator()]

    assert rows(f"s3://{BUCKET}/csv/table.csv") == rows(str(local))
    assert len(rows(str(local))) == 2999


@pytest.mark.parametrize("reader", ["tfrecord_reader", "webdataset_reader"])
def test_an_object_missing_among_those_opened_ahead_is_skipped_at_its_turn(store, tmp_path, reader):
    # An interleave opens its next remote inputs ahead of their turn (their first requests start
    # then); one that cannot be read is reported when its turn comes, and every other is read whole.
    if reader == "tfrecord_reader":
        folder, prefix = os.path.join(DATA, "tfrecord"), "tfrecord"
        names = sorted(k[len("tfrecord/"):] for k in store.tfrecords if k.endswith((".record", ".tfrecord")) and "/corrupt/" not in k)
        names = [n for n in names if "/" not in n]
    else:
        folder, prefix = os.path.join(DATA, "webdataset"), "wds-ahead"
        names = sorted(n for n in os.listdir(folder) if n.endswith((".tar", ".tar.gz", ".tgz")) and "bad" not in n and "cut" not in n)
        for n in names:
            store.client.upload_file(os.path.join(folder, n), BUCKET, f"{prefix}/{n}")
    assert len(names) >= 3

    def run(paths, name):
        out = tmp_path / f"{name}.jsonl"
        pipeline = tmp_path / f"{name}.txtpb"
        pipeline.write_text(textwrap.dedent(f"""\
            stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{','.join(paths)}" }} params {{ key: "shuffle" value: "false" }} }}
            stage {{ id: "read" op: "{reader}" input: "files" parallelism: 2 interleave {{ cycle_length: 2 }} error_policy: skip }}
            stage {{ id: "out" op: "jsonl_sink" input: "read" params {{ key: "path" value: "{out}" }} }}
            """))
        done = run_cli(["run", str(pipeline)], store.env())
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return sorted(json.dumps({k: v for k, v in r.items() if k not in ("path", "__url__")}, sort_keys=True) for r in rows), done

    local, _ = run([os.path.join(folder, n) for n in names], "local")
    uris = [f"s3://{BUCKET}/{prefix}/{n}" for n in names]
    gone = f"s3://{BUCKET}/{prefix}/gone-{names[0]}"
    remote, done = run(uris[:1] + [gone] + uris[1:], "remote")
    assert len(local) > 5 and remote == local
    assert "Skipped in stage 'read': 1 element" in done.stdout and gone in done.stdout, done.stdout



def test_a_tfds_directory_in_a_bucket_reads_as_the_local_one(store, tmp_path):
    # A dataset prepared by tfds_writer (with the labels file TFDS writes for named classes),
    # copied to the bucket as `gsutil cp -r` / `aws s3 sync` would, then loaded as tfds.load does.
    data_dir = tmp_path / "tfds"
    pipeline = tmp_path / "prepare.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        stage {{ id: "img" op: "synthetic_images" params {{ key: "count" value: "40" }} params {{ key: "height" value: "8" }} params {{ key: "width" value: "8" }} params {{ key: "classes" value: "3" }} }}
        stage {{ id: "enc" op: "encode_image" input: "img" }}
        stage {{ id: "out" op: "tfds_writer" input: "enc" params {{ key: "data_dir" value: "{data_dir}" }} params {{ key: "name" value: "pics" }} params {{ key: "max_records" value: "9" }} params {{ key: "class_labels" value: "label" }} params {{ key: "supervised_keys" value: "image,label" }} }}
        """))
    run_cli(["run", "-q", str(pipeline)], store.env())
    (data_dir / "pics" / "1.0.0" / "label.labels.txt").write_text("cat\ndog\nbird\n")
    store.upload_tree(BUCKET, str(data_dir), "tfds")

    def load(where, **kwargs):
        ds = sluice.data.tfds("pics", split="train[:50%]+train[75%:]", data_dir=where, **kwargs)
        return list(ds.as_numpy_iterator())

    local = load(str(data_dir), class_names=True)
    remote = load(f"s3://{BUCKET}/tfds", class_names=True)
    assert len(local) == 30 and len(remote) == len(local)
    for r, l in zip(remote, local):
        assert sorted(r) == sorted(l) == ["image", "label", "label_name"]
        assert (r["image"] == l["image"]).all() and r["label"] == l["label"] and r["label_name"] == l["label_name"]
    pairs = load(f"s3://{BUCKET}/tfds", as_supervised=True)
    assert [int(label) for _, label in pairs] == [int(e["label"]) for e in local]
    with pytest.raises(Exception, match=f"no dataset 'nothing' in s3://{BUCKET}/tfds"):
        list(sluice.data.tfds("nothing", split="train", data_dir=f"s3://{BUCKET}/tfds").as_numpy_iterator())


def test_the_metrics_endpoint_counts_remote_reads_and_shows_no_secret(store, tmp_path):
    import subprocess
    import time
    import urllib.request
    from conftest import CLI, free_port
    secret = store.secret_key
    port = free_port()
    pipeline = tmp_path / "served.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "s3://{BUCKET}/tfrecord/*.record" }} }}
        stage {{ id: "records" op: "tfrecord_reader" input: "files" }}
        stage {{ id: "slow" op: "simulate_work" input: "records" params {{ key: "us" value: "20000" }} buffer_size: 1 }}
        stage {{ id: "out" op: "null_sink" input: "slow" }}
        """))
    run = subprocess.Popen([CLI, "run", "-q", "--metrics-addr", f"127.0.0.1:{port}", str(pipeline)], env=store.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = {}
        deadline = time.time() + 20
        while time.time() < deadline and len(answers) < 3:
            for path in ("/metrics", "/pipeline", "/snapshot"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                        body = answer.read().decode(errors="replace")  # (/snapshot is a protobuf message)
                    if path != "/metrics" or "sluice_stage_remote_requests_total" in body:
                        answers[path] = body
                except OSError:
                    time.sleep(0.1)
        assert set(answers) == {"/metrics", "/pipeline", "/snapshot"}, answers.keys()
        assert 'sluice_stage_remote_requests_total{stage="records"' in answers["/metrics"], answers["/metrics"][:2000]
        for body in answers.values():
            assert secret not in body
    finally:
        run.terminate()
        stdout, stderr = run.communicate(timeout=60)
    assert secret not in stdout + stderr


def test_a_secret_changed_in_os_environ_is_used_by_the_next_dataset(store):
    # As boto3 resolves credentials for each new client: a notebook that fixes its secret and
    # reads again must not keep signing with the first one its process used.
    uri = f"s3://{BUCKET}/tfrecord/pets_examples.record"
    assert len(records(sluice.data.TFRecordDataset([uri]))) > 0
    try:
        os.environ["AWS_SECRET_ACCESS_KEY"] = "a-mistyped-secret"
        with pytest.raises(Exception, match="SignatureDoesNotMatch"):
            records(sluice.data.TFRecordDataset([uri]))
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = store.secret_key
    assert len(records(sluice.data.TFRecordDataset([uri]))) > 0


def test_tensorflow_without_tensorflow_io_cannot_read_what_sluice_reads(store):
    """The README's difference table: tf.data reads s3:// only through tensorflow-io's filesystem
    plugin; Sluice reads it with the AWS CLI's settings. TensorFlow (the peers environment's) is
    given the same settings and object, and refuses the scheme."""
    import subprocess
    from conftest import PEERS
    key = sorted(k for k in store.tfrecords if k.endswith(".tfrecord") and "/corrupt/" not in k)[0]
    uri = f"s3://{BUCKET}/{key}"
    program = f"import tensorflow as tf\nprint(sum(1 for _ in tf.data.TFRecordDataset({uri!r})))"
    tensorflow = subprocess.run([os.path.join(PEERS, "bin", "python"), "-c", program], capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL, env=dict(store.env(), TF_CPP_MIN_LOG_LEVEL="2"))
    assert tensorflow.returncode != 0 and "File system scheme 's3' not implemented" in tensorflow.stderr, tensorflow.stderr[-2000:]
    assert records(sluice.data.TFRecordDataset(uri)) == records(sluice.data.TFRecordDataset(store.tfrecords[key]))
