"""A global shuffle from Python, written as a tf.data user writes a training loop: every epoch a
new permutation of all records of all files, the same for the same seed, and a state_dict() taken
mid-epoch that a fresh pipeline continues exactly."""
import os
import pickle
import shutil

import pytest

import sluice
from conftest import SOURCE_DIR

DATA = os.path.join(SOURCE_DIR, "tests", "data", "real", "tfrecord")
NAMES = ["tfx_mnist.tfrecord", "torchdata_example.tfrecord", "pets_examples.record"]


@pytest.fixture
def files(tmp_path):
    for n in NAMES:
        shutil.copy(os.path.join(DATA, n), tmp_path / n)
    return str(tmp_path / "*.*record")


def keys(batch):
    return list(zip([p.decode() for p in batch["path"]], batch["index"].tolist()))


def test_every_epoch_is_another_permutation_of_all_records(files):
    ds = sluice.data.random_access(patterns=files, seed=5).batch(32)
    epochs = []
    for _ in range(2):  # as a training loop iterates: each iter() another epoch
        epochs.append([k for batch in ds for k in keys(batch)])
    assert len(epochs[0]) == 1014 and len(set(epochs[0])) == 1014
    assert sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]
    # Mixed across files from the first batch on (a shuffle buffer of 32 would stay in one file).
    assert len({path for path, _ in epochs[0][:32]}) > 1
    again = [k for batch in sluice.data.random_access(patterns=files, seed=5).batch(32) for k in keys(batch)]
    assert again == epochs[0]


def test_a_state_taken_mid_epoch_continues_exactly(files):
    spec = sluice.data.random_access(patterns=files, seed=9).batch(16).spec()
    whole = [keys(b) for b in sluice.Pipeline.from_spec(spec)]
    pipeline = sluice.Pipeline.from_spec(spec)
    it = iter(pipeline)
    first = [keys(next(it)) for _ in range(20)]
    state = pickle.loads(pickle.dumps(pipeline.state_dict()))
    pipeline.close()
    assert len(state["checkpoint"]) < 4096  # positions only: a place in the permutation
    restored = sluice.Pipeline.from_spec(spec)
    restored.load_state_dict(state)
    assert first + [keys(b) for b in restored] == whole


def test_a_state_of_another_worker_count_is_refused_saying_what_to_do(files):
    spec = sluice.data.random_access(patterns=files, seed=1).batch(8).spec()
    pipeline = sluice.Pipeline.from_spec(spec, worker_index=0, num_workers=2)
    it = iter(pipeline)
    for _ in range(10):
        next(it)
    state = pipeline.state_dict()
    pipeline.close()
    other = sluice.Pipeline.from_spec(spec, worker_index=0, num_workers=3)
    other.load_state_dict(state)
    with pytest.raises(sluice.PipelineError, match=r"taken by another worker of a job: stage '.*' has parameter num_shards=3 "
                                                   r"\(the checkpoint's run had num_shards=2\).*sluice run --resume FOLDER"):
        list(other)
