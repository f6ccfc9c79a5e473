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
    # Positions only: a place in the permutation, and the records of the batches taken since the
    # cut it comes from (a few bytes each, for a job of another size), never their bytes.
    assert len(state["checkpoint"]) < 4096 + 4 * 20 * 16
    restored = sluice.Pipeline.from_spec(spec)
    restored.load_state_dict(state)
    assert first + [keys(b) for b in restored] == whole


def run_workers(spec, workers, steps, states=None, early_state=True, lineage=False):
    """A job of `workers` workers, each a Pipeline as a process of torchrun would make it: worker w
    takes steps[w] batches (None: all of its share), then its state, and goes on a little (the
    batches after a state are not delivered: a job killed then repeats them). Returns the records
    each delivered and their states."""
    delivered, saved = [], []
    for w in range(workers):
        pipeline = sluice.Pipeline.from_spec(spec, worker_index=w, num_workers=workers, lineage=lineage)
        if states is not None:
            pipeline.load_state_dict(states)
        it = iter(pipeline)
        got = []
        for step, batch in enumerate(it if steps[w] is None else (next(it) for _ in range(steps[w]))):
            got += keys(batch)
            if step == 2 and early_state:
                pipeline.state_dict()  # as a loop saving every few steps: the engine cuts behind it
        saved.append(pickle.loads(pickle.dumps(pipeline.state_dict())))
        for _ in range(3):
            next(it, None)
        pipeline.close()
        delivered.append(got)
    return delivered, saved


def assert_one_epoch(*jobs):
    everything = [k for delivered in jobs for got in delivered for k in got]
    assert len(everything) == 1014, f"{len(everything)} records delivered, {len(everything) - len(set(everything))} of them twice"
    assert len(set(everything)) == 1014


@pytest.mark.parametrize("buffers", [None, 2])
def test_states_of_two_workers_continue_on_three_and_those_on_two(files, buffers):
    # A shuffle buffer and a batch being gathered hold records at each cut, and the loop takes
    # batches after the cut its state comes from: all of it is given back or counted delivered.
    # (With small buffers the cut asked at step 2 comes early, and the states are taken from it;
    # with the default ones it comes late, and they are taken from the run's start.)
    spec = (sluice.data.random_access(patterns=files, seed=4, output_buffer=buffers).shuffle(40, output_buffer=buffers)
            .batch(8, output_buffer=buffers).spec())
    before, states = run_workers(spec, 2, [23, 11])
    assert all("checkpoint" in s for s in states)
    middle, states = run_workers(spec, 3, [9, 14, 5], states)
    after, _ = run_workers(spec, 2, [None, None], states)
    assert_one_epoch(before, middle, after)
    # The next epoch is split two ways afresh, each worker reading half.
    epoch = [sum(1 for b in sluice.Pipeline.from_spec(spec, worker_index=w, num_workers=2) for _ in b["index"]) for w in range(2)]
    assert epoch == [507, 507]


def test_the_ledgers_of_a_job_resized_twice_say_each_record_was_delivered_once(files):
    # 2 workers -> 3 -> 2, as above, each keeping the delivery ledger: merged, the last job's
    # ledgers hold every earlier worker's deliveries once, and say the epoch whole.
    spec = (sluice.data.random_access(patterns=files, seed=4, output_buffer=2).shuffle(40, output_buffer=2)
            .batch(8, output_buffer=2).spec())
    before, states = run_workers(spec, 2, [23, 11], lineage=True)
    early = sluice.delivery_ledger(states)  # mid-epoch: what is not given yet is still to come
    assert early["clean"] and early["epochs"][0]["under_way"] and early["epochs"][0]["records"] == 8 * (23 + 11)
    middle, states = run_workers(spec, 3, [9, 14, 5], states, lineage=True)
    after, states = run_workers(spec, 2, [None, None], states, lineage=True)
    assert_one_epoch(before, middle, after)
    verdict = sluice.delivery_ledger(states)
    [epoch] = verdict["epochs"]
    assert verdict["clean"], verdict["text"]
    assert (epoch["records"], epoch["expected"], epoch["deliveries"], epoch["under_way"]) == (1014, 1014, 1014, False)
    # The first worker's ledger alone: the other's records missing, and said to be its share.
    alone = sluice.delivery_ledger(states[:1])
    assert 0 < alone["epochs"][0]["missing"] < 1014 and "give every worker's" in alone["text"]


def test_states_from_the_start_of_resumed_runs_continue_on_other_workers(files):
    # Each run's only state comes before its first cut: the first resumed on as many workers (their
    # batches being gathered restored, the first output stacking rows read before), the second on
    # another number (its states name the job's states it continued), then again.
    spec = (sluice.data.random_access(patterns=files, seed=8, output_buffer=2).shuffle(24, output_buffer=2)
            .batch(8, output_buffer=2).spec())
    first, states = run_workers(spec, 2, [20, 13])
    second, states = run_workers(spec, 2, [6, 9], states, early_state=False)
    third, states = run_workers(spec, 3, [4, 7, 5], states, early_state=False)
    fourth, states = run_workers(spec, 3, [3, 3, 3], states, early_state=False)
    last, _ = run_workers(spec, 2, [None, None], states)
    assert_one_epoch(first, second, third, fourth, last)


def test_states_of_three_workers_one_of_them_done_continue_on_two(files):
    spec = sluice.data.random_access(patterns=files, seed=6).batch(16).spec()
    before, states = run_workers(spec, 3, [7, None, 12])
    assert "checkpoint" not in states[1] and states[1]["epoch"] == 1  # its share given whole
    after, _ = run_workers(spec, 2, [None, None], states)
    assert_one_epoch(before, after)


def test_states_of_as_many_workers_are_each_their_own(files):
    spec = sluice.data.random_access(patterns=files, seed=2).shuffle(30).batch(8).spec()
    whole = [[k for b in sluice.Pipeline.from_spec(spec, worker_index=w, num_workers=2) for k in keys(b)] for w in range(2)]
    before, states = run_workers(spec, 2, [10, 20])
    after, _ = run_workers(spec, 2, [None, None], states)
    assert [b + a for b, a in zip(before, after)] == whole  # exactly as if never stopped


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
                                                   r"\(the checkpoint's run had num_shards=2\).*sluice run --resume FOLDER.*"
                                                   r"load_state_dict\(\) with the list of every worker's state"):
        list(other)


def test_states_whose_stages_hold_batches_are_refused_on_another_job_size(files):
    # A shuffle of batches holds batches at the cut, which cannot go back to the source record by
    # record: refused by name, saying how it can resume.
    spec = (sluice.data.random_access(patterns=files, seed=3, output_buffer=2).batch(4, output_buffer=2)
            .shuffle(6, output_buffer=2).spec())
    _, states = run_workers(spec, 2, [12, 12])
    pipeline = sluice.Pipeline.from_spec(spec, worker_index=0, num_workers=3)
    pipeline.load_state_dict(states)
    with pytest.raises(sluice.PipelineError, match=r"stage 'shuffle' \(shuffle\) holds batches.*resume it on 2 workers"):
        next(iter(pipeline))
    # On as many workers, each goes on from its own.
    after, _ = run_workers(spec, 2, [None, None], states)
    assert all(after)
