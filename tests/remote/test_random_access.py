"""A global shuffle over TFRecord objects in a bucket (random_access): indexes built by one
sequential read, beside the objects or in a local folder, records read by ranged requests, the
same order as over local copies of the files; a replaced object refused by name."""
import os
import shutil
import textwrap

import pytest

from conftest import DATA, run_cli

import sluice

BUCKET = "sluice-random"
NAMES = ["tfx_mnist.tfrecord", "torchdata_example.tfrecord", "torchdata_sequence_example.tfrecord"]


@pytest.fixture(scope="module")
def store(s3):
    os.environ.update(s3.env())
    s3.client.create_bucket(Bucket=BUCKET)
    for n in NAMES:
        s3.client.upload_file(os.path.join(DATA, "tfrecord", n), BUCKET, f"beside/{n}")
        s3.client.upload_file(os.path.join(DATA, "tfrecord", n), BUCKET, f"apart/{n}")
    return s3


def keys(store, prefix):
    listed = store.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in listed)


def shuffled(patterns, **params):
    ds = sluice.data.random_access(patterns=patterns, seed=7, **params)
    return [(bytes(e["record"]), int(e["index"]), os.path.basename(e["path"].decode())) for e in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    folder = tmp_path_factory.mktemp("local")
    for n in NAMES:
        shutil.copy(os.path.join(DATA, "tfrecord", n), folder / n)
    return shuffled(str(folder / "*.tfrecord"), index_dir=str(folder / "index"))


@pytest.mark.parametrize("readers", [1, 16])
def test_a_global_shuffle_of_objects_is_the_local_one(store, local, readers):
    remote = shuffled(f"s3://{BUCKET}/beside/*.tfrecord", num_parallel_reads=readers)
    assert len(local) > 1000 and remote == local
    # Built by the first run, beside each object (uploaded whole), and read by the next.
    assert keys(store, "beside/") == sorted([f"beside/{n}" for n in NAMES] + [f"beside/{n}.idx" for n in NAMES])


def test_indexes_of_objects_can_live_in_a_local_folder(store, local, tmp_path):
    assert shuffled(f"s3://{BUCKET}/apart/*.tfrecord", index_dir=str(tmp_path / "index")) == local
    assert len(os.listdir(tmp_path / "index")) == len(NAMES)
    assert keys(store, "apart/") == [f"apart/{n}" for n in NAMES]  # nothing written into the bucket


def test_sluice_index_writes_the_indexes_of_objects(store, tmp_path):
    store.client.upload_file(os.path.join(DATA, "tfrecord", "pets_examples.record"), BUCKET, "cli/pets.record")
    done = run_cli(["index", f"s3://{BUCKET}/cli/*.record"], store.env())
    assert f"s3://{BUCKET}/cli/pets.record: 10 records, index built s3://{BUCKET}/cli/pets.record.idx" in done.stdout, done.stdout
    again = run_cli(["index", f"s3://{BUCKET}/cli/*.record"], store.env())
    assert "0 indexes written, 1 up to date" in again.stdout, again.stdout


def test_an_object_replaced_after_indexing_is_refused_by_name(store, tmp_path):
    store.client.upload_file(os.path.join(DATA, "tfrecord", "torchdata_example.tfrecord"), BUCKET, "replaced/a.tfrecord")
    pattern = f"s3://{BUCKET}/replaced/*.tfrecord"
    assert len(shuffled(pattern)) == 4
    with open(os.path.join(DATA, "tfrecord", "torchdata_example.tfrecord"), "rb") as f:
        data = bytearray(f.read())
    data[20] ^= 0xFF  # the same size, other bytes: another ETag
    store.client.put_object(Bucket=BUCKET, Key="replaced/a.tfrecord", Body=bytes(data))
    pipeline = tmp_path / "p.txtpb"
    pipeline.write_text(textwrap.dedent(f"""\
        stage {{ id: "src" op: "random_access" params {{ key: "patterns" value: "{pattern}" }} }}
        stage {{ id: "out" op: "null_sink" input: "src" }}
        """))
    done = run_cli(["run", "-q", str(pipeline)], store.env(), check=False)
    assert done.returncode != 0
    assert f"s3://{BUCKET}/replaced/a.tfrecord.idx does not describe s3://{BUCKET}/replaced/a.tfrecord" in done.stderr, done.stderr
    assert "another ETag" in done.stderr and "sluice index --rebuild" in done.stderr


def test_a_job_checkpointed_into_a_bucket_resumes_on_another_number_of_workers(store, tmp_path):
    import subprocess
    import time
    from conftest import CLI
    pipeline = tmp_path / "p.txtpb"
    out = tmp_path / "out-{worker}-of-{num_workers}.jsonl"
    pipeline.write_text(textwrap.dedent(f"""\
        stage {{ id: "src" op: "random_access" params {{ key: "patterns" value: "s3://{BUCKET}/beside/*.tfrecord" }} buffer_size: 2 }}
        stage {{ id: "pick" op: "select_fields" input: "src" params {{ key: "keep" value: "path,index" }} buffer_size: 2 }}
        stage {{ id: "slow" op: "simulate_work" input: "pick" params {{ key: "us" value: "4000" }} buffer_size: 2 }}
        stage {{ id: "out" op: "jsonl_sink" input: "slow" params {{ key: "path" value: "{out}" }} }}
        """))
    ck = f"s3://{BUCKET}/ck-job"

    def job(workers, *extra):
        return [subprocess.Popen([CLI, "run", "-q", str(pipeline), "--checkpoint", ck, "--worker-index", str(w), "--num-workers", str(workers),
                                  *extra], env=store.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
                for w in range(workers)]

    two = job(2, "--checkpoint-every", "20")
    # SIGTERM once each has written a checkpoint: mid-epoch (a share takes 2 s; small buffers keep
    # the source from reading it all ahead, after which a run finishes rather than checkpoints).
    deadline = time.time() + 60
    while len(keys(store, "ck-job/")) < 2 and time.time() < deadline:
        time.sleep(0.05)
    for p in two:
        p.send_signal(15)
    for p in two:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 75, err
    assert keys(store, "ck-job/") == ["ck-job/worker-0-of-2.sluice", "ck-job/worker-1-of-2.sluice"]
    three = job(3, "--resume", ck)
    said = ""
    for p in three:
        _, err = p.communicate(timeout=120)
        said += err
        assert p.returncode == 0, err
    assert f"resumed the checkpoint of 2 workers in {ck}" in said, said
    lines = [line for f in sorted(tmp_path.glob("out-*.jsonl")) for line in f.read_text().splitlines()]
    assert len(list(tmp_path.glob("out-*.jsonl"))) == 5
    assert len(lines) == len(set(lines)) == 1008  # 1,000 + 4 + 4: the three files' records, each once


def test_array_record_objects_read_in_order_and_at_random_as_the_local_files(store, tmp_path):
    """ArrayRecord files in a bucket: the footer and chunks read by ranged requests, in order
    (array_record_reader) and at random (random_access) as their local copies read; an
    ArrayRecord output published to the bucket reads back the same."""
    local = tmp_path / "local"
    (sluice.data.TFRecordDataset(os.path.join(DATA, "tfrecord", "tfx_mnist.tfrecord"))
     .map(lambda r: {"record": r})
     .array_record_writer(prefix=str(local / "mnist"), max_records=400, options="zstd,group_size:3").pipeline().run())
    names = sorted(os.listdir(local))
    assert len(names) == 3
    for n in names:
        store.client.upload_file(str(local / n), BUCKET, f"arrays/{n}")

    def in_order(pattern):
        return [bytes(r) for r in sluice.data.ArrayRecordDataset(sluice.data.list_files(pattern, shuffle=False))]

    def at_random(pattern):
        return [(bytes(e["record"]), int(e["index"])) for e in sluice.data.random_access(patterns=[pattern], seed=3).as_numpy_iterator()]

    expected = in_order(str(local / "*.array_record"))
    assert len(expected) == 1000 and in_order(f"s3://{BUCKET}/arrays/*.array_record") == expected
    assert at_random(f"s3://{BUCKET}/arrays/*.array_record") == at_random(str(local / "*.array_record"))
    assert keys(store, "arrays/") == [f"arrays/{n}" for n in names]  # no index written: the footer is the index
    (sluice.data.ArrayRecordDataset(str(local / names[0])).map(lambda r: {"record": r})
     .array_record_writer(prefix=f"s3://{BUCKET}/written/copy").pipeline().run())
    assert in_order(f"s3://{BUCKET}/written/copy-00000-of-00001.array_record") == expected[:400]
