"""tf.data's random transformations as both test_random.py and its oracle build them: each case
takes a tf.data module (TensorFlow's, or sluice.data) and returns a dataset of int64 scalars."""

CASES = {
    "shuffle_reshuffled": lambda data: data.Dataset.range(50).shuffle(50, seed=7),
    "shuffle_not_reshuffled": lambda data: data.Dataset.range(50).shuffle(50, seed=7, reshuffle_each_iteration=False),
    "shuffle_small_buffer_then_repeat": lambda data: data.Dataset.range(30).shuffle(4, seed=3).repeat(3),
    "sample_seventy_thirty": lambda data: data.Dataset.sample_from_datasets(
        [data.Dataset.range(1).repeat(), data.Dataset.range(1, 2).repeat()], weights=[0.7, 0.3], seed=11).take(4000),
    # Three inputs; the first (weight 0.5) runs out after 20 elements: tf.data renormalises the
    # other two's weights (0.25 each) to a half each.
    "sample_three_the_first_running_out": lambda data: data.Dataset.sample_from_datasets(
        [data.Dataset.range(100, 120), data.Dataset.range(1, 2).repeat(), data.Dataset.range(2, 3).repeat()],
        weights=[0.5, 0.25, 0.25], seed=5).take(4020),
    "sample_rerandomized": lambda data: data.Dataset.sample_from_datasets(
        [data.Dataset.range(1).repeat(), data.Dataset.range(1, 2).repeat()], weights=[0.5, 0.5], seed=11,
        rerandomize_each_iteration=True).take(200),
}

# Built twice, each iterated once: tf.data seeds an unseeded shuffle anew for each dataset, Sluice
# takes the pipeline's seed (0 unless set), so two fresh datasets agree.
FRESH_CASES = {
    "shuffle_unseeded": lambda data: data.Dataset.range(50).shuffle(50),
}
