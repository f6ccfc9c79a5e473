"""Replay: one step of a run made again, bit for bit, without the run: directly for a random-access
pipeline (time independent of the step), by running the epoch to it for the README's pipeline."""
import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

import sluice
from conftest import CLI, SOURCE_DIR, cli


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    cli("run", "--quiet", os.path.join(SOURCE_DIR, "resources", "pipelines", "sample_data_tfrecord.txtpb"),
        "--set", "images.count=1600", "--set", "images.height=120", "--set", "images.width=160",
        "--set", f"shards.prefix={folder}/train", "--set", "shards.max_records=200")
    return folder


def same(a, b):
    return a.keys() == b.keys() and all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


def augmented(shards):
    """A shuffled (random_access: a permutation of all records), augmented random-access pipeline."""
    return (sluice.data.random_access(patterns=f"{shards}/*.tfrecord", seed=3)
            .parse_example(features="image:bytes,label:int64").decode_image(num_parallel_calls=2)
            .random_resized_crop(height=48, width=48, num_parallel_calls=2).random_flip().random_brightness(max_delta=0.3)
            .batch(8).options(seed=11))


def test_steps_of_a_random_access_pipeline_are_made_again_directly(shards, capfd):
    pipeline = augmented(shards).pipeline()
    for _ in pipeline:  # epoch 0 run, then the epoch replayed from is epoch 1's
        pass
    run = [{k: v.copy() for k, v in batch.items()} for batch in pipeline]
    assert len(run) == 200
    for step in random.Random(7).sample(range(200), 20):
        assert same(pipeline.replay(step), run[step]), f"step {step}"
    assert same(pipeline.replay(5, epoch=1), run[5]) and not same(pipeline.replay(5, epoch=0), run[5])
    assert "made by running" not in capfd.readouterr().err  # directly, each
    with pytest.raises(IndexError, match="epoch 1 has no step 200"):
        pipeline.replay(200)


def test_steps_of_the_readme_pipeline_are_made_again_by_running_to_them(shards, capfd):
    readme = os.path.join(SOURCE_DIR, "resources", "pipelines", "train_tfrecord.txtpb")
    pipeline = sluice.Pipeline(readme, set={"files.patterns": f"{shards}/*.tfrecord"})
    run = [{k: v.copy() for k, v in batch.items()} for batch in pipeline]
    assert len(run) == 25
    for step in random.Random(3).sample(range(25), 20):
        assert same(pipeline.replay(step), run[step]), f"step {step}"
    said = capfd.readouterr().err
    assert "stage 'shuffle' (shuffle)" in said and "made by running epoch 0 to it" in said


def test_the_command_line_writes_the_step_the_run_wrote(shards, tmp_path):
    spec = augmented(shards).spec()
    pipeline = tmp_path / "p.txtpb"
    pipeline.write_text(spec + f'stage {{ id: "out" op: "jsonl_sink" input: "batch" params {{ key: "path" value: "{tmp_path}/all.jsonl" }} }}\n')
    cli("run", "--quiet", str(pipeline))
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    done = cli("replay", str(pipeline), "--step", "123", "--out", str(tmp_path / "step.jsonl"))
    assert "made directly" in done.stderr
    assert (tmp_path / "step.jsonl").read_text().splitlines() == [lines[123]]
    beyond = cli("replay", str(pipeline), "--step", "200", "--out", str(tmp_path / "none.jsonl"), check=False)
    assert beyond.returncode == 1 and "epoch 0 has no step 200" in beyond.stderr and not (tmp_path / "none.jsonl").exists()


def rows_and_images(pipeline):
    """Each row the epoch gave: its (source, record) and its image's bytes, in order."""
    out = []
    for batch in pipeline:
        for row, image in zip(pipeline.lineage(batch), batch["image"]):
            out.append(((row["source"], row["record"]), image.tobytes()))
    return out


def test_records_named_are_skipped_on_the_next_run_and_the_others_keep_their_order_and_draws(shards):
    first = augmented(shards).pipeline(lineage=True)
    run = rows_and_images(first)
    named = [record for record, _ in run[56:64]] + [run[400][0]]  # step 7's rows and one of step 50
    again = augmented(shards).pipeline(lineage=True, skip_records=named)
    rerun = rows_and_images(again)
    # The same records in the same order, less the named, each with the crop, flip and brightness
    # it had: the skip sits after every random draw, before the batch.
    assert rerun == [(record, image) for record, image in run if record not in set(named)]
    [epoch] = again.ledger()
    assert (epoch["records"], epoch["expected"], epoch["missing"], epoch["skipped_as_asked"]) == (1591, 1600, 0, 9), epoch
    # Rows as lineage() gives them are taken as they are; a name that does not read is refused.
    rows = first.lineage()
    kept = rows_and_images(augmented(shards).pipeline(lineage=True, skip_records=rows))
    assert len(kept) == 1600 - len(rows) and not {(r["source"], r["record"]) for r in rows} & {record for record, _ in kept}
    with pytest.raises(ValueError, match="line 1"):
        augmented(shards).pipeline(skip_records=[("x", -1)])


def test_the_command_line_names_a_steps_records_and_skips_them_on_the_next_run(shards, tmp_path):
    spec = augmented(shards).spec()
    pipeline = tmp_path / "p.txtpb"
    pipeline.write_text(spec + f'stage {{ id: "out" op: "jsonl_sink" input: "batch" params {{ key: "path" value: "{tmp_path}/all.jsonl" }} }}\n')
    run = augmented(shards).pipeline(lineage=True)
    in_python = [rows for _, rows in zip(range(13), ((run.lineage(batch)) for batch in run))][12]
    # The records of step 12, as the run's lineage names them; of a checkpoint's run the same.
    named = cli("lineage", str(pipeline), "--step", "12")
    assert named.stdout.splitlines() == [f"{r['record']} {r['source']}" for r in in_python]
    as_json = [json.loads(line) for line in cli("lineage", str(pipeline), "--step", "12", "--json").stdout.splitlines()]
    assert [(r["row"], r["source"], r["record"], r["epoch"]) for r in as_json] == [(i, r["source"], r["record"], 0) for i, r in enumerate(in_python)]
    assert [{stage: tuple(key) for stage, key in r["keys"].items()} for r in as_json] == [r["keys"] for r in in_python]
    # A run preempted (SIGTERM) after a checkpoint: its checkpoint names the pipeline and seed.
    slow = tmp_path / "slow.txtpb"
    slow.write_text(spec.replace('input: "random_access"', 'input: "slow"') + 'stage { id: "out" op: "null_sink" input: "batch" }\n'
                    'stage { id: "slow" op: "simulate_work" input: "random_access" params { key: "us" value: "2000" } }\n')
    running = subprocess.Popen([CLI, "run", "--quiet", str(slow), "--checkpoint", str(tmp_path / "ck"), "--checkpoint-every", "5"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ck" / "checkpoint.sluice").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    running.send_signal(signal.SIGTERM)
    assert running.wait(timeout=60) == 75
    assert cli("lineage", str(tmp_path / "ck"), "--step", "12").stdout == named.stdout  # (the slow stage passes records on)
    cli("replay", str(tmp_path / "ck"), "--step", "12", "--out", str(tmp_path / "from_ck.jsonl"))
    cli("replay", str(pipeline), "--step", "12", "--out", str(tmp_path / "from_file.jsonl"))
    assert (tmp_path / "from_ck.jsonl").read_text() == (tmp_path / "from_file.jsonl").read_text() != ""
    nothing = cli("lineage", str(tmp_path), "--step", "12", check=False)
    assert nothing.returncode == 2 and "no checkpoint at" in nothing.stderr
    # The next run skips them: 8 records fewer, the ledger says so rather than missing.
    (tmp_path / "bad.txt").write_text(named.stdout)
    cli("run", "--quiet", str(pipeline), "--skip-records", str(tmp_path / "bad.txt"), "--ledger", str(tmp_path / "run.ledger"))
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == 199
    verdict = cli("ledger", str(tmp_path / "run.ledger")).stdout
    assert "1592 records delivered of 1600 expected, none twice, none missing, 8 skipped as asked" in verdict
    for damage in ["not a record", "12"]:  # (a record with no source names nothing)
        (tmp_path / "damaged.txt").write_text("12 " + in_python[0]["source"] + f"\n{damage}\n")
        refused = cli("run", "--quiet", str(pipeline), "--skip-records", str(tmp_path / "damaged.txt"), check=False)
        assert refused.returncode == 2 and f"line 2: '{damage}' is not \"RECORD SOURCE\"" in refused.stderr
    beyond = cli("lineage", str(pipeline), "--step", "200", check=False)
    assert beyond.returncode == 1 and "epoch 0 has no step 200" in beyond.stderr


def test_lineage_names_the_key_each_random_map_drew_with(shards):
    # Each row's numbers were drawn with the key (epoch, index at the map's input): the row's place
    # in the epoch here (random_access, then maps); the command line names the same.
    pipeline = augmented(shards).pipeline(lineage=True)
    for step, batch in enumerate(pipeline):
        for row, r in enumerate(pipeline.lineage(batch)):
            at = (0, step * 8 + row)
            assert r["keys"] == {"random_resized_crop": at, "random_flip": at, "random_brightness": at}, (step, row, r)
    pipeline.epoch = 1
    it = iter(pipeline)
    next(it)
    assert pipeline.lineage(step=0)[3]["keys"]["random_flip"] == (1, 3)
    it.close()
