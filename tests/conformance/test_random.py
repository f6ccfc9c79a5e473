"""tf.data's random transformations against TensorFlow's own. Orders come from different
generators (Sluice's are keyed by seed, stage, epoch and index: the same at any parallelism), so
what is compared is what tf.data promises: a shuffle gives the same multiset every epoch, another
order each epoch with reshuffle_each_iteration (the default) and the same order without it, a
small buffer keeps elements near their place, and sample_from_datasets draws each dataset in its
weight's proportion, the same mixture each epoch unless rerandomize_each_iteration."""
import json

import pytest

import sluice.data
from peers import run_oracle
from random_cases import CASES, FRESH_CASES

# How far the share of a dataset drawn 4,000 times may be from its weight: 4 standard deviations
# of a binomial share at p = 0.7 (0.0072 each), for either system.
SHARE_BOUND = 0.03


@pytest.fixture(scope="module")
def tensorflow_gave(tmp_path_factory):
    out = tmp_path_factory.mktemp("random") / "results.json"
    run_oracle("oracle_random.py", out)
    return json.loads(out.read_text())


def sluice_gave(name):
    ds = CASES[name](sluice.data)
    return [[int(v) for v in ds] for _ in range(3)]


@pytest.mark.parametrize("system", ["tensorflow", "sluice"])
def test_a_reshuffled_dataset_has_its_multiset_in_a_new_order_each_epoch(tensorflow_gave, system):
    epochs = tensorflow_gave["shuffle_reshuffled"] if system == "tensorflow" else sluice_gave("shuffle_reshuffled")
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != sorted(epochs[0])


@pytest.mark.parametrize("system", ["tensorflow", "sluice"])
def test_reshuffle_each_iteration_false_keeps_one_order(tensorflow_gave, system):
    epochs = tensorflow_gave["shuffle_not_reshuffled"] if system == "tensorflow" else sluice_gave("shuffle_not_reshuffled")
    assert epochs[0] == epochs[1] == epochs[2] and sorted(epochs[0]) == list(range(50)) and epochs[0] != list(range(50))


@pytest.mark.parametrize("system", ["tensorflow", "sluice"])
def test_a_shuffle_before_a_repeat_finishes_each_epoch_first(tensorflow_gave, system):
    runs = tensorflow_gave["shuffle_small_buffer_then_repeat"] if system == "tensorflow" else sluice_gave("shuffle_small_buffer_then_repeat")
    for run in runs:
        assert len(run) == 90
        for epoch in range(3):
            part = run[30 * epoch:30 * (epoch + 1)]
            assert sorted(part) == list(range(30))
            # A buffer of 4: element i leaves at the earliest at position i - 3.
            assert all(position >= value - 3 for position, value in enumerate(part))
        assert run[:30] != run[30:60]


def test_sample_from_datasets_draws_in_proportion_to_the_weights(tensorflow_gave):
    shares = {}
    for system, epochs in (("tensorflow", tensorflow_gave["sample_seventy_thirty"]), ("sluice", sluice_gave("sample_seventy_thirty"))):
        assert all(len(e) == 4000 for e in epochs)
        shares[system] = [e.count(0) / 4000 for e in epochs]
    print("share of the first dataset (weight 0.7), three epochs each:", shares)
    for system, values in shares.items():
        assert all(abs(v - 0.7) < SHARE_BOUND for v in values), (system, values)


def test_sample_from_datasets_renormalises_when_an_input_runs_out(tensorflow_gave):
    shares = {}
    for system, epochs in (("tensorflow", tensorflow_gave["sample_three_the_first_running_out"]),
                           ("sluice", sluice_gave("sample_three_the_first_running_out"))):
        shares[system] = []
        for e in epochs:
            assert len(e) == 4020 and [v for v in e if v >= 100] == list(range(100, 120)), e[:60]
            # After the first input's last element, the other two share the draws half and half.
            rest = e[e.index(119) + 1:]
            shares[system].append(rest.count(2) / len(rest))
    print("share of the third dataset once the first ran out (tf.data: a half), three epochs each:", shares)
    for system, values in shares.items():
        assert all(abs(v - 0.5) < SHARE_BOUND for v in values), (system, values)


@pytest.mark.parametrize("system", ["tensorflow", "sluice"])
def test_a_seeded_mixture_is_the_same_each_epoch_unless_rerandomized(tensorflow_gave, system):
    same = tensorflow_gave["sample_seventy_thirty"] if system == "tensorflow" else sluice_gave("sample_seventy_thirty")
    assert same[0] == same[1] == same[2]
    other = tensorflow_gave["sample_rerandomized"] if system == "tensorflow" else sluice_gave("sample_rerandomized")
    assert other[0] != other[1] != other[2]


def test_an_unseeded_shuffle_is_the_same_in_two_fresh_datasets_where_tf_data_differs(tensorflow_gave):
    # The README's difference table: Sluice's default is the pipeline's seed, tf.data's a new one.
    theirs = tensorflow_gave["shuffle_unseeded"]
    mine = [[int(v) for v in FRESH_CASES["shuffle_unseeded"](sluice.data)] for _ in range(2)]
    assert sorted(theirs[0]) == sorted(mine[0]) == list(range(50))
    assert theirs[0] != theirs[1]
    assert mine[0] == mine[1] != sorted(mine[0])
