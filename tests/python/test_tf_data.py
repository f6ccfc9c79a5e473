"""sluice.data written as a tf.data user writes it: tf.data's positional arguments and names give
the same pipeline as Sluice's keywords, AUTOTUNE where tf.data takes it, errors at the call that
makes them, and the reference's reading lines."""
import os
import re

import pytest

import sluice
from conftest import SOURCE_DIR

TFRECORDS = os.path.join(SOURCE_DIR, "tests", "data", "real", "tfrecord")


def base():
    return sluice.data.range(count=100)


# (tf.data's call, the same call with Sluice's keywords): each pair must give the same file.
POSITIONAL_FORMS = [
    (lambda: base().shuffle(1000), lambda: base().shuffle(buffer_size=1000)),
    (lambda: base().shuffle(1000, 7, False), lambda: base().shuffle(buffer_size=1000, seed=7, reshuffle_each_iteration=False)),
    (lambda: base().batch(64), lambda: base().batch(batch_size=64)),
    (lambda: base().batch(64, True), lambda: base().batch(batch_size=64, drop_remainder=True)),
    (lambda: base().batch(64, True, sluice.AUTOTUNE, False),
     lambda: base().batch(batch_size=64, drop_remainder=True, deterministic=False)),
    (lambda: base().batch(64, num_parallel_calls=2), lambda: base().batch(batch_size=64)),
    (lambda: base().padded_batch(8, num_parallel_calls=2), lambda: base().padded_batch(batch_size=8, parallelism=2)),
    (lambda: base().padded_batch(8, num_parallel_calls=sluice.AUTOTUNE),
     lambda: base().padded_batch(batch_size=8, parallelism=os.cpu_count())),
    (lambda: base().repeat(3), lambda: base().repeat(count=3)),
    (lambda: base().repeat(None), lambda: base().repeat()),
    (lambda: base().take(5), lambda: base().take(count=5)),
    (lambda: base().skip(5), lambda: base().skip(count=5)),
    (lambda: base().shard(2, 0), lambda: base().shard(num_shards=2, index=0)),
    (lambda: base().cache("c.bin"), lambda: base().cache(path="c.bin")),
    (lambda: base().cache(filename="c.bin"), lambda: base().cache(path="c.bin")),
    (lambda: base().cache(""), lambda: base().cache(path="")),
    (lambda: base().prefetch(4), lambda: base().prefetch(buffer_size=4)),
    (lambda: base().prefetch(sluice.AUTOTUNE), lambda: base().prefetch(output_buffer=-1)),
    (lambda: base().prefetch(buffer_size=sluice.data.AUTOTUNE), lambda: base().prefetch(output_buffer=-1)),
    (lambda: base().window(4, 2, 1, True), lambda: base().window(size=4, shift=2, stride=1, drop_remainder=True)),
    (lambda: base().padded_batch(8, None, None, True), lambda: base().padded_batch(batch_size=8, drop_remainder=True)),
    (lambda: base().ragged_batch(8, True), lambda: base().ragged_batch(batch_size=8, drop_remainder=True)),
    (lambda: base().bucket_by_sequence_length("value", [5, 10], [4, 2, 1]),
     lambda: base().bucket_by_sequence_length(length_field="value", boundaries=[5, 10], batch_sizes=[4, 2, 1])),
    (lambda: base().map(abs, sluice.AUTOTUNE, False, name="m"),
     lambda: base().map(abs, parallelism=-1, deterministic=False, name="m")),
    (lambda: sluice.data.list_files("data/*.tfrecord"), lambda: sluice.data.list_files(patterns="data/*.tfrecord")),
    (lambda: sluice.data.list_files("data/*.tfrecord", False, 3),
     lambda: sluice.data.list_files(patterns="data/*.tfrecord", shuffle=False, seed=3)),
    (lambda: sluice.data.range(10), lambda: sluice.data.range(count=10)),
    (lambda: sluice.data.range(2, 10), lambda: sluice.data.range(start=2, count=8)),
    (lambda: sluice.data.range(2, 11, 3), lambda: sluice.data.range(start=2, count=3, step=3)),
    (lambda: sluice.data.range(10, 0, -4), lambda: sluice.data.range(start=10, count=3, step=-4)),
    (lambda: sluice.data.range(5, 2), lambda: sluice.data.range(start=5, count=0)),
]


@pytest.mark.parametrize("index", range(len(POSITIONAL_FORMS)))
def test_tf_data_positional_forms_give_the_keyword_spec(index):
    as_tf_data, as_keywords = POSITIONAL_FORMS[index]

    def spec(dataset):  # a function held twice at once is told apart by "#2"
        return re.sub(r'"(python:[^"#]*)#\d+"', r'"\1"', dataset.spec())

    assert spec(as_tf_data()) == spec(as_keywords())


def test_tf_data_forms_set_what_they_say():
    ds = base().batch(64, True, sluice.AUTOTUNE, False).prefetch(sluice.AUTOTUNE)
    spec = ds.spec()
    assert 'op: "batch"' in spec and "deterministic: false" in spec
    assert 'op: "prefetch"' in spec and "buffer_size: -1" in spec
    assert [len(b) for b in ds] == [64]  # runs: the short batch dropped
    # map(fn, AUTOTUNE, False): every element, in whatever order the workers finish.
    mapped = sluice.data.range(200).map(lambda x: x * 2, sluice.AUTOTUNE, False)
    assert sorted(int(x) for x in mapped) == [2 * v for v in range(200)]
    # range() counts as Python's does.
    assert [int(x) for x in sluice.data.range(2, 11, 3)] == [2, 5, 8]
    assert [int(x) for x in sluice.data.range(10, 0, -4)] == [10, 6, 2]


def test_tf_data_calls_refuse_what_tf_data_refuses():
    with pytest.raises(TypeError, match="at most 1 positional"):
        base().take(5, 6)
    with pytest.raises(TypeError, match="multiple values for argument 'count'"):
        base().take(5, count=6)
    with pytest.raises(TypeError, match="both num_parallel_calls= and parallelism="):
        base().map(abs, 2, parallelism=2)
    with pytest.raises(TypeError, match="by name"):
        base().simulate_work(5)
    with pytest.raises(TypeError, match="element_length_func"):
        base().bucket_by_sequence_length(len, [5], [2, 1])


def test_a_bad_value_is_refused_at_the_call_that_gives_it():
    with pytest.raises(sluice.SpecError) as refused:
        base().batch(0)
    message = str(refused.value)
    assert message.startswith("batch(): batch_size=0: "), message
    assert ".txtpb" not in message
    with pytest.raises(sluice.SpecError, match="shuffle\\(\\): buffer_size=-5"):
        base().shuffle(-5)
    with pytest.raises(sluice.SpecError, match="reshuffle_each_iteration"):
        base().shuffle(10, None, "sometimes")
    # Parameters refused together (window's shift and stride are checked by the operator).
    with pytest.raises(sluice.SpecError, match="^standardize\\(\\): "):
        base().standardize(fields=["value"], mean=[0.0, 1.0], std=[1.0])


def test_tfrecord_dataset_reads_as_tf_data_does():
    path = os.path.join(TFRECORDS, "tfx_mnist.tfrecord")
    records = [bytes(record) for record in sluice.data.TFRecordDataset(path)]  # tf.data's: the records alone
    by_reader = [bytes(e["record"][0]) if isinstance(e["record"], list) else bytes(e["record"])
                 for e in sluice.data.list_files(path, shuffle=False).tfrecord_reader()]
    assert records == by_reader and len(records) > 0
    # Two files read at once, one record from each in turn, as num_parallel_reads does.
    spec = sluice.data.TFRecordDataset([path, path], num_parallel_reads=2).spec()
    assert "cycle_length: 2" in spec and "parallelism: 2" in spec and 'value: "false"' in spec  # files in the order given
    assert "compression" not in sluice.data.TFRecordDataset(path).spec()
    assert 'value: "gzip"' in sluice.data.TFRecordDataset(path, "GZIP").spec()
    with pytest.raises(ValueError, match="compression_type"):
        sluice.data.TFRecordDataset(path, "BROTLI")
    # A dataset of file names is read in its order.
    assert "list_files" in sluice.data.TFRecordDataset(sluice.data.list_files(path)).spec()


def test_text_line_dataset_reads_lines(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("one\ntwo\n")
    second.write_text("three\n")
    lines = [line.decode() for line in sluice.data.TextLineDataset([str(first), str(second)])]
    assert lines == ["one", "two", "three"]


def test_an_in_memory_cache_lasts_across_for_loops():
    # tf.data's cache() lives as long as the dataset: the map before it runs in the first loop only.
    calls = []

    def costly(element):
        calls.append(int(element))
        return element * 3

    ds = sluice.data.range(40).map(costly).cache().shuffle(40)
    seen = [sorted(int(x) for x in ds) for _ in range(3)]
    assert seen == [[3 * v for v in range(40)]] * 3
    assert sorted(calls) == list(range(40))
    # A dataset built on it shares it; one made anew records again.
    assert sorted(int(x) for x in ds.take(5)) and len(calls) == 40
    assert "cache" in ds.spec() and "sluice-cache" not in ds.spec()  # the file is the dataset's business
    list(sluice.data.range(40).map(costly).cache())
    assert len(calls) == 80


def test_apply_ignore_errors_and_as_numpy_iterator():
    def fragile(element):
        if int(element) % 10 == 3:
            raise ValueError("unlucky")
        return element

    failing = sluice.data.range(20).map(fragile)
    with pytest.raises(sluice.PipelineError):
        list(failing)
    kept = [int(x) for x in failing.apply(sluice.data.experimental.ignore_errors()).as_numpy_iterator()]
    assert kept == [v for v in range(20) if v % 10 != 3]
    assert 'error_policy: skip' in failing.ignore_errors().spec()
    # A stage's own policy stays.
    assert 'error_policy: fail' in sluice.data.range(5).map(fragile, error_policy="fail").ignore_errors().spec()
    with pytest.raises(TypeError, match="not a sluice.data.Dataset"):
        base().apply(lambda ds: 3)


def test_list_files_shuffles_by_default(tmp_path):
    for i in range(20):
        (tmp_path / f"f{i:02d}.txt").write_text("x")
    pattern = str(tmp_path / "*.txt")

    def order(ds):
        return [path.decode() for path in ds]  # tf.data's: the paths alone

    listed = sluice.data.list_files(pattern).options(seed=4)
    first, second = order(listed), order(listed)  # iterating again is the next epoch
    assert sorted(first) == sorted(second) == [str(tmp_path / f"f{i:02d}.txt") for i in range(20)]
    assert first != sorted(first) and first != second
    assert order(sluice.data.list_files(pattern, shuffle=False)) == sorted(first)


def test_failures_are_pipeline_errors_and_tracebacks_keep_their_lines():
    with pytest.raises(sluice.PipelineError) as refused:
        list(sluice.data.list_files("/nonexistent/*.tfrecord", name="files"))
    assert refused.value.stage == "files" and "matches no file" in str(refused.value)

    def fragile(element):
        if int(element) == 3:
            raise ValueError("three is unlucky")
        return element

    pipeline = sluice.data.range(6).map(fragile, error_policy="skip").pipeline()
    assert len(list(pipeline)) == 5
    report = pipeline.report()
    assert "\\n" not in report
    assert "\n    Traceback (most recent call last):" in report and "\n    ValueError: three is unlucky" in report


def test_save_writes_a_file_that_sluice_run_runs(tmp_path, monkeypatch):
    from conftest import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for name in ("a", "b"):
        (tmp_path / "data" / f"{name}.txt").write_text("1 2 3\n4 5\n")
    ds = (sluice.data.TextLineDataset("data/*.txt").split_text(to="int64").padded_batch(2)
          .options(seed=3))
    (tmp_path / "jobs").mkdir()
    saved = ds.save("jobs/lines.txtpb")
    text = open(saved).read()
    assert "../data/*.txt" in text and 'op: "null_sink"' in text
    done = cli("run", "--quiet", saved)
    assert "null_sink" in done.stdout
    with pytest.raises(ValueError, match="stage 'python_map' \\(python_map\\) calls Python code"):
        ds.map(lambda e: e).save("jobs/nope.txtpb")
    assert not (tmp_path / "jobs" / "nope.txtpb").exists()


def test_cardinality_and_len_where_the_size_is_known():
    import numpy as np

    assert len(sluice.data.range(100).batch(32)) == 4
    assert sluice.data.range(100).batch(32, drop_remainder=True).cardinality() == 3
    assert len(sluice.data.range(100).shuffle(10).take(7)) == 7
    assert len(sluice.data.range(100).skip(95).repeat(3)) == 15
    assert len(sluice.data.range(10).shard(3, 1)) == 3  # 1, 4, 7
    assert len(sluice.data.from_tensor_slices({"x": np.zeros((12, 2))}).batch(5)) == 3
    assert len(sluice.data.concatenate(sluice.data.range(3), sluice.data.range(4))) == 7
    assert sluice.data.range(10).repeat().cardinality() == sluice.data.INFINITE_CARDINALITY
    assert len(sluice.data.range(10).repeat().take(25)) == 25
    assert sluice.data.range(10).filter(lambda e: True).cardinality() == sluice.data.UNKNOWN_CARDINALITY
    with pytest.raises(TypeError, match="infinite"):
        len(sluice.data.range(10).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(sluice.data.list_files("*.nothing").tfrecord_reader())
    # What it says is what a run gives.
    ds = sluice.data.range(77).shuffle(20).batch(10).take(5).repeat(2)
    assert len(list(ds)) == len(ds) == 10


def test_tuples_and_nested_dicts_keep_their_structure():
    import numpy as np

    images = np.arange(6 * 4, dtype=np.uint8).reshape(6, 2, 2)
    labels = np.arange(6, dtype=np.int64)
    pairs = sluice.data.from_tensor_slices((images, labels))
    first = next(iter(pairs))
    assert isinstance(first, tuple) and (first[0] == images[0]).all() and int(first[1]) == 0
    # A map takes the tuple's items as its arguments and may return a tuple; batch keeps it.
    doubled = pairs.map(lambda x, y: (x.astype(np.int32) * 2, y + 1)).batch(3)
    seen = []
    for xs, ys in doubled:
        assert xs.shape == (3, 2, 2) and ys.shape == (3,)
        seen += ys.tolist()
    assert seen == [1, 2, 3, 4, 5, 6]
    nested = sluice.data.from_tensor_slices({"a": {"b": labels}, "c": labels * 10}).batch(6)
    batch = next(iter(nested))
    assert (batch["a"]["b"] == labels).all() and (batch["c"] == labels * 10).all()
    # A map returning a nested dict.
    grouped = sluice.data.range(4).map(lambda x: {"x": {"twice": x * 2}})
    assert [int(e["x"]["twice"]) for e in grouped] == [0, 2, 4, 6]
    # NumPy text arrays are text, as tf.data's strings.
    assert list(sluice.data.from_tensor_slices(np.array(["cat", "doggy"]))) == [b"cat", b"doggy"]
    # Plain dicts stay dicts, single values single values (scalars, as tf.data's).
    assert list(next(iter(sluice.data.from_tensor_slices({"x": labels})))) == ["x"]
    one = next(iter(sluice.data.range(3).map(lambda x: x + 1)))
    assert isinstance(one, np.ndarray) and one.shape == () and one.dtype == np.int64 and int(one) == 1


def test_interleave_with_a_reading_function_gives_the_per_input_pipeline(tmp_path):
    import numpy as np

    for name, lines in (("a", ["1 2 3", "4", "5 6", "7 8 9 10", "11"]), ("b", ["20 21", "22", "23 24 25"])):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    pattern = str(tmp_path / "*.txt")
    # tf.data's interleave(lambda f: TextLineDataset(f).map(...).padded_batch(...)) ...
    built = (sluice.data.list_files(pattern, shuffle=False)
             .interleave(lambda f: sluice.data.TextLineDataset(f).split_text(to="int64").padded_batch(2),
                         cycle_length=2, block_length=1, num_parallel_calls=2))
    # ... is the pipeline file's reader with per_input stages after it.
    written = sluice.Pipeline.from_spec(
        f'stage {{ id: "files" op: "list_files" params {{ key: "patterns" value: "{pattern}" }} params {{ key: "shuffle" value: "false" }} }}\n'
        'stage { id: "lines" op: "text_lines" input: "files" parallelism: 2 interleave { cycle_length: 2 block_length: 1 } }\n'
        'stage { id: "split" op: "split_text" input: "lines" per_input: true params { key: "to" value: "int64" } }\n'
        'stage { id: "batches" op: "padded_batch" input: "split" per_input: true params { key: "batch_size" value: "2" } }\n'
        'stage { id: "out" op: "null_sink" input: "batches" }\n')
    assert "per_input: true" in built.spec()
    as_built = [b["line"].tolist() for b in built]
    assert as_built == [b["line"].tolist() for b in written]
    assert len(as_built) == 5  # 3 batches of a's 5 lines, 2 of b's 3: none mixes the files
    # interleave(TFRecordDataset, ...) and flat_map read every record of every file.
    path = os.path.join(TFRECORDS, "tfx_mnist.tfrecord")
    twice = sluice.data.list_files([path, path], shuffle=False)
    by_interleave = [bytes(r) for r in twice.interleave(sluice.data.TFRecordDataset, cycle_length=2,
                                                                    num_parallel_calls=sluice.AUTOTUNE)]
    by_flat_map = [bytes(r) for r in twice.flat_map(sluice.data.TFRecordDataset)]
    one = [bytes(r) for r in sluice.data.TFRecordDataset(path)]
    assert sorted(by_interleave) == sorted(by_flat_map) == sorted(one + one) and by_flat_map == one + one
    # tf.data's idiom: a list of file names as a dataset, then interleave.
    names = sluice.data.from_tensor_slices(np.array([path, path]))
    assert sorted(bytes(r) for r in names.interleave(sluice.data.TFRecordDataset, cycle_length=2)) == sorted(one + one)
    with pytest.raises(TypeError, match="looked at its input's value"):
        twice.interleave(lambda f: sluice.data.TFRecordDataset(f + ".gz"))
    with pytest.raises(TypeError, match="must start from"):
        twice.interleave(lambda f: sluice.data.range(3))


def test_interleave_of_from_tensors_repeats_each_input_as_tf_data():
    import numpy as np

    images = np.arange(12, dtype=np.float32).reshape(6, 2)
    labels = np.arange(6, dtype=np.int64)
    # 001's program: a map to (x, y, z) triples, then parallel_interleave over
    # lambda x, y, z: from_tensors((x, y, z)).repeat(k) (the map's result is known only when it runs).
    triples = (sluice.data.Dataset.from_tensor_slices((images, labels)).batch(2, drop_remainder=True)
               .map(lambda x, y: (x, y, y * 10)))
    repeated = triples.apply(sluice.data.experimental.parallel_interleave(
        lambda x, y, z: sluice.data.Dataset.from_tensors((x, y, z)).repeat(3), cycle_length=2,
        num_parallel_calls=sluice.AUTOTUNE))
    got = [(x.tolist(), y.tolist(), z.tolist()) for x, y, z in repeated]
    batches = [(images[i:i + 2].tolist(), labels[i:i + 2].tolist(), (labels[i:i + 2] * 10).tolist()) for i in (0, 2, 4)]
    # cycle_length 2, block_length 1: the first two inputs alternate, then the third alone.
    assert got == [batches[0], batches[1]] * 3 + [batches[2]] * 3
    assert repeated.cardinality() == 9
    # The reference's own figures: cycle_length 10, 100 copies of each; repeat() is endless.
    hundred = sluice.data.range(25).interleave(lambda x: sluice.data.from_tensors(x).repeat(100), cycle_length=10,
                                               num_parallel_calls=sluice.AUTOTUNE)
    values = [int(x) for x in hundred]
    assert len(values) == 2500 and all(values.count(v) == 100 for v in range(25)) and values[:12] == list(range(10)) + [0, 1]
    assert "repeat_each" in hundred.spec() and "count\" value: \"100\"" in hundred.spec()
    endless = sluice.data.range(3).flat_map(lambda x: sluice.data.from_tensors(x).repeat())
    assert endless.cardinality() == sluice.data.INFINITE_CARDINALITY
    assert [int(x) for x in endless.take(4)] == [0, 0, 0, 0]
    # What the function cannot do at build time is refused there.
    with pytest.raises(TypeError, match="whole and in order"):
        triples.interleave(lambda x, y, z: sluice.data.from_tensors((y, x, z)))
    with pytest.raises(TypeError, match="looked at its input's value"):
        triples.interleave(lambda x, y, z: sluice.data.from_tensors((x * 2, y, z)))
    # Outside an interleave, from_tensors is one element.
    assert [(a.tolist(), bytes(t)) for a, t in sluice.data.from_tensors((np.array([1, 2]), "hi"))] == [([1, 2], b"hi")]


def test_interleave_of_from_tensors_resumes_from_a_state_mid_cycle():
    def build():
        return sluice.data.range(40).interleave(lambda x: sluice.data.from_tensors(x).repeat(7), cycle_length=3).batch(5)

    whole = [b.tolist() for b in build()]
    assert len(whole) == 56
    pipeline = build().pipeline()
    it = iter(pipeline)
    taken = [next(it).tolist() for _ in range(9)]
    pipeline.state_dict()  # asks for a cut behind the loop
    taken += [next(it).tolist() for _ in range(14)]
    state = pipeline.state_dict()
    pipeline.close()
    restored = build().pipeline()
    restored.load_state_dict(state)
    assert taken + [b.tolist() for b in restored] == whole


def test_element_spec_reads_shapes_and_dtypes_as_tf_data_gives_them():
    import numpy as np

    images = np.zeros((10, 4, 3), dtype=np.uint8)
    labels = np.arange(10, dtype=np.int64)
    pairs = sluice.data.Dataset.from_tensor_slices((images, labels))
    image, label = pairs.element_spec
    assert (image.shape, image.dtype, label.shape, label.dtype) == ((4, 3), np.uint8, (), np.int64)
    # A batch that keeps its remainder has no fixed first dimension; one that drops it has.
    assert pairs.batch(4).element_spec[0].shape == (None, 4, 3)
    assert pairs.batch(4, drop_remainder=True).element_spec[0].shape == (4, 4, 3)
    nested = pairs.map(lambda x, y: {"image": x, "pair": (y, y * 2)}).element_spec
    assert nested["image"].shape == (4, 3) and nested["pair"][1].dtype == np.int64
    # A dimension that differs between elements is None.
    growing = sluice.data.from_generator(lambda: ({"v": np.zeros(i + 1)} for i in range(4)))
    assert growing.element_spec == {"v": sluice.data.TensorSpec((None,), np.dtype("float64"))}
    # Text is numpy.bytes_, whether one string or a batch of them.
    words = sluice.data.Dataset.from_tensor_slices(["a", "bc", "def"])
    assert words.element_spec.dtype == np.bytes_ and words.batch(2).element_spec.dtype == np.bytes_
    with pytest.raises(ValueError, match="gave no element"):
        sluice.data.range(0).element_spec


def test_batches_of_text_are_arrays_of_bytes_that_go_back_in_unchanged():
    import numpy as np

    words = sluice.data.Dataset.from_tensor_slices(["a", "bc", "d\x00"]).batch(2)
    batches = list(words)
    assert [b.dtype for b in batches] == [np.dtype(object)] * 2 and [b.tolist() for b in batches] == [[b"a", b"bc"], [b"d\x00"]]
    # A map given the batch returns it as it is; from_tensor_slices takes such an array (2-D too).
    assert [b.tolist() for b in words.map(lambda text: text)] == [[b"a", b"bc"], [b"d\x00"]]
    table = np.array([[b"a", "b"], [b"c", b""]], dtype=object)
    again = list(sluice.data.Dataset.from_tensor_slices(table).batch(2))
    assert len(again) == 1 and again[0].shape == (2, 2) and again[0].tolist() == [[b"a", b"b"], [b"c", b""]]
    with pytest.raises(sluice.PipelineError, match="a NumPy array of objects holds <class 'int'>; only arrays of bytes or str are text"):
        list(words.map(lambda text: np.array([1, "x"], dtype=object)))


def test_zip_of_a_tuple_gives_tuples_as_tf_data():
    import numpy as np

    pairs = sluice.data.Dataset.from_tensor_slices((np.arange(4), np.arange(4) * 2))
    zipped = sluice.data.Dataset.zip((pairs, sluice.data.range(3)))
    assert [(int(x), int(y), int(c)) for (x, y), c in zipped] == [(0, 0, 0), (1, 2, 1), (2, 4, 2)]
    assert [int(v) for v in zipped.map(lambda pair, count: pair[1] + count)] == [0, 3, 6]
    # zip(a, b) merges the fields instead, as a pipeline file's zip does.
    merged = sluice.data.zip(pairs, sluice.data.range(3), prefixes=["p", "r"])
    assert sorted(next(iter(merged))) == ["p/0", "p/1", "r/value"]
