"""Which records made a batch: Pipeline(lineage=True).lineage(batch), checked against records
that carry their own identity (line J of file fK holds "K J ...", J % 5 more tokens after it)."""
import collections
import os
import shutil

import numpy as np
import pytest

import sluice

FILES, LINES = 4, 40


@pytest.fixture
def numbered(tmp_path):
    for k in range(FILES):
        lines = [" ".join(str(t) for t in [k, j] + [7] * (j % 5)) for j in range(LINES)]
        (tmp_path / f"f{k}.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def lines_of(path, cycle_length=2):
    return (sluice.data.list_files(patterns=str(path / "f*.txt"), shuffle=False)
            .text_lines(interleave=dict(cycle_length=cycle_length))
            .split_text(to="int64"))


def named(row):
    """(file number, line) as the lineage names the row."""
    return int(os.path.basename(row["source"])[1:-4]), row["record"]


def ids(batch_lines):
    """(file number, line) as each row of a padded batch of lines holds it."""
    return [(int(r[0]), int(r[1])) for r in np.asarray(batch_lines)]


def test_each_row_of_each_batch_is_named_with_its_epoch_through_interleave_shuffle_and_batch(numbered):
    ds = lines_of(numbered).repeat(2).shuffle(50).padded_batch(6).options(seed=11)
    pipeline = ds.pipeline(lineage=True)
    seen = collections.Counter()
    for batch in pipeline:
        rows = pipeline.lineage(batch)
        assert [named(r) for r in rows] == ids(batch["line"])
        for r in rows:
            seen[(named(r), r["epoch"])] += 1
            assert r["byte_offset"] >= 0
    # Every record once in each of the two epochs, none twice.
    assert seen == collections.Counter({((k, j), e): 1 for k in range(FILES) for j in range(LINES) for e in (0, 1)})


def test_the_lineage_of_a_batch_is_found_by_the_batch_or_its_step(numbered):
    pipeline = lines_of(numbered).padded_batch(5).pipeline(lineage=True)
    it = iter(pipeline)
    first, second = next(it), next(it)
    assert [named(r) for r in pipeline.lineage(first)] == ids(first["line"])
    assert pipeline.lineage(step=1) == pipeline.lineage(second) == pipeline.lineage()
    assert pipeline.lineage(step=0) == pipeline.lineage(first)
    with pytest.raises(IndexError, match="step 9 is not among"):
        pipeline.lineage(step=9)
    with pytest.raises(ValueError, match="not one of the last outputs"):
        pipeline.lineage({"line": np.zeros(3)})
    pipeline.close()


def test_rows_unbatched_and_batched_again_are_named_once_each(numbered):
    pipeline = lines_of(numbered).padded_batch(3).unbatch().padded_batch(5).pipeline(lineage=True)
    seen = []
    for batch in pipeline:
        rows = [named(r) for r in pipeline.lineage(batch)]
        assert rows == ids(batch["line"])
        seen += rows
    assert sorted(seen) == [(k, j) for k in range(FILES) for j in range(LINES)]
    [epoch] = pipeline.ledger()
    assert (epoch["records"], epoch["deliveries"], epoch["twice"], epoch["missing"]) == (FILES * LINES, FILES * LINES, 0, 0)


def test_lineage_must_be_asked_for(numbered):
    pipeline = lines_of(numbered).padded_batch(4).pipeline()
    next(iter(pipeline))
    with pytest.raises(ValueError, match="lineage=True"):
        pipeline.lineage()
    pipeline.close()


def test_buckets_name_the_rows_they_regrouped(numbered):
    ds = lines_of(numbered, cycle_length=3).bucket_by_sequence_length("line", [4, 6], [3, 2, 2])
    pipeline = ds.pipeline(lineage=True)
    seen = []
    for batch in pipeline:
        rows = pipeline.lineage(batch)
        assert [named(r) for r in rows] == ids(batch["line"])
        seen += [named(r) for r in rows]
    assert sorted(seen) == [(k, j) for k in range(FILES) for j in range(LINES)]


def test_a_zipped_row_names_one_record_per_input_and_a_mixture_each_records_own(numbered):
    a = sluice.data.TextLineDataset(str(numbered / "f0.txt"))
    b = sluice.data.TextLineDataset(str(numbered / "f1.txt")).skip(3)
    pipeline = sluice.data.zip(a, b).batch(4).pipeline(lineage=True)
    for left, right in pipeline:
        rows = pipeline.lineage(left)
        assert len(rows) == len(left)
        for row, x, y in zip(rows, left, right):
            assert [named(p) for p in row["parts"]] == [tuple(int(t) for t in x.split()[:2]), tuple(int(t) for t in y.split()[:2])]

    mixed = sluice.data.sample_from_datasets([lines_of(numbered), sluice.data.TextLineDataset(str(numbered / "f3.txt"))
                                              .split_text(to="int64")], seed=5)
    pipeline = mixed.padded_batch(8).pipeline(lineage=True)
    for batch in pipeline:
        assert [named(r) for r in pipeline.lineage(batch)] == ids(batch["line"])


def test_records_read_again_in_another_epoch_are_named_with_that_epoch(tmp_path):
    # random_access names every record by one path object for the whole run: each epoch's
    # records must still say their own epoch (its records carry "path" and "index" fields).
    data = str(tmp_path / "tfx_mnist.tfrecord")
    shutil.copy(os.path.join(os.path.dirname(__file__), "..", "data", "real", "tfrecord", "tfx_mnist.tfrecord"), data)
    pipeline = sluice.data.random_access(patterns=data, seed=4).repeat(3).batch(40).pipeline(lineage=True)
    epochs = collections.Counter()
    for batch in pipeline:
        rows = pipeline.lineage(batch)
        assert [(r["source"], r["record"]) for r in rows] == list(zip([p.decode() for p in batch["path"]], batch["index"].tolist()))
        epochs.update(r["epoch"] for r in rows)
    per_epoch = sum(epochs.values()) // 3
    assert epochs == {0: per_epoch, 1: per_epoch, 2: per_epoch}
