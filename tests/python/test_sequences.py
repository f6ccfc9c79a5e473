"""Variable-length data from Python: ragged batches as rows and as torch nested tensors, padded
batches with lengths, packed rows, built the tf.data way."""
import numpy as np
import pytest

import sluice

torch = pytest.importorskip("torch")


@pytest.fixture
def ranges(tmp_path):
    # range(x) for x in 0..5, one sequence per line (dense_to_ragged_batch's documented example).
    path = tmp_path / "ranges.txt"
    path.write_text("\n0\n0 1\n0 1 2\n0 1 2 3\n0 1 2 3 4\n")
    return sluice.data.list_files(patterns=str(path)).text_lines().split_text(to="int64")


def test_ragged_batches_give_their_rows_and_nested_tensors(ranges):
    expected = [[[], [0]], [[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0, 1, 2, 3, 4]]]
    batches = list(ranges.ragged_batch(batch_size=2))
    assert [[row.tolist() for row in sluice.ragged_rows(b, "line")] for b in batches] == expected
    # The rows are views of the batch's values, not copies.
    rows = sluice.ragged_rows(batches[2], "line")
    assert all(np.shares_memory(row, batches[2]["line"]) for row in rows)
    # Offsets (row_splits) and torch tensors, as a training loop takes them.
    for batch, want in zip(ranges.ragged_batch(batch_size=2, row_partition="row_splits").torch(), expected):
        assert isinstance(batch["line"], torch.Tensor)
        nested = sluice.nested(batch, "line")
        assert [t.tolist() for t in nested.unbind()] == want
    with pytest.raises(KeyError, match="no line_row_lengths or line_row_splits"):
        sluice.ragged_rows({"line": np.zeros(3)}, "line")


def test_padded_batches_with_lengths_and_masks(ranges):
    padded = list(ranges.padded_batch(batch_size=3, padding_values=-1, lengths="line", masks="line"))
    assert padded[0]["line"].tolist() == [[-1, -1], [0, -1], [0, 1]]
    assert padded[0]["line_length"].tolist() == [0, 1, 2]
    assert padded[1]["line_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_packed_rows_hold_every_token_once(ranges):
    rows = list(ranges.pack_sequences(fields="line", length=6, open_rows=2))
    tokens = [t for row in rows for t, s in zip(row["line"].tolist(), row["segment_ids"].tolist()) if s > 0]
    assert sorted(tokens) == sorted([0] * 5 + [1] * 4 + [2] * 3 + [3] * 2 + [4])
    assert all(row["line"].shape == (6,) for row in rows)


def test_per_input_batches_never_mix_files(tmp_path):
    # tf.data's interleave(lambda f: TextLineDataset(f).map(split).padded_batch(2)): each file
    # batched apart, on the reader reading it; a stage that cannot run per input is refused by name.
    (tmp_path / "a.txt").write_text("1\n2 2\n3\n")
    (tmp_path / "b.txt").write_text("10 10 10\n11\n")
    files = sluice.data.list_files(patterns=str(tmp_path / "*.txt"))
    ds = (files.text_lines(parallelism=2, interleave=dict(cycle_length=2))
          .split_text(to="int64", per_input=True)
          .padded_batch(batch_size=2, per_input=True))
    assert "per_input: true" in ds.spec()
    assert [b["line"].tolist() for b in ds] == [[[1, 0], [2, 2]], [[10, 10, 10], [11, 0, 0]], [[3]]]
    with pytest.raises(sluice.SpecError, match="stage 'split_text': per_input runs a stage once per input"):
        list(files.split_text(per_input=True))


def test_float16_rows_are_padded_with_the_value_rounded_as_numpy_rounds_it():
    # The padding value is converted to binary16 by Sluice's own rounding (ties to even, once,
    # from the double): it must give NumPy's float16 of the same value, including values between
    # two halves, beyond the largest half and below the smallest subnormal.
    rows = [np.array([1.5, -2.0], dtype=np.float16), np.array([0.25], dtype=np.float16)]
    for value in [0.1, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65519.0, 65520.0, -1e-8, 2.0 ** -25 * 1.5, 3.0e-5]:
        ds = sluice.data.from_generator(lambda: iter({"x": r} for r in rows)).padded_batch(
            batch_size=2, padding_values=value)
        (batch,) = list(ds)
        assert batch["x"].dtype == np.float16
        want = np.array([[1.5, -2.0], [0.25, value]], dtype=np.float16)
        assert batch["x"].view(np.uint16).tolist() == want.view(np.uint16).tolist(), value
