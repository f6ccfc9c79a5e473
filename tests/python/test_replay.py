"""Replay: one step of a run made again, bit for bit, without the run: directly for a random-access
pipeline (time independent of the step), by running the epoch to it for the README's pipeline."""
import os
import random

import numpy as np
import pytest

import sluice
from conftest import SOURCE_DIR, cli


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
