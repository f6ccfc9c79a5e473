"""The same short tf.data programs (tf_programs.py) run by TensorFlow and by Sluice's tf.data face
in its place: every element equal, dtype and shape included, or Sluice's refusal the one the
README's difference table gives."""
import json
import types

import numpy as np
import pytest

import sluice.data
import tf_programs
from peers import run_oracle

# Sluice in tf.data's place: `tf.data` is sluice.data; TensorSpec and the dtypes that
# output_signature names are NumPy's.
SLUICE_AS_TF = types.SimpleNamespace(data=sluice.data, TensorSpec=sluice.data.TensorSpec, int32=np.int32, int64=np.int64,
                                     float32=np.float32, string=np.bytes_)

# Programs Sluice refuses, with the words its refusal must hold (the README's difference table).
REFUSED = {
    # interleave's and flat_map's function is called once, to build the reader of every input;
    # a dataset made from an element's value (range(x)) has no such reader.
    "flat_map_ranges": "the function looked at its input's value",
    # Sluice's stages take their own parallelism=, buffer_size=: tf.data's other options are
    # refused by name rather than ignored.
    "options_threading": "tf.data.Options.threading has no Sluice counterpart",
    # The engine measures a named field instead of calling a function per element.
    "bucket_by_sequence_length": "name the field whose length decides the bucket instead of a function",
    # A cache file carries the fingerprint of the pipeline before it; TensorFlow replays another
    # pipeline's file as if it were this one's.
    "cache_file_of_another_pipeline": "was made by a different pipeline before the cache",
}

# Programs both run and give different results, as the README's difference table says:
# {name: (TensorFlow's result, Sluice's)}.
DIFFERS = {
    # Text's dtype is NumPy's bytes_ (tf.string in TensorFlow).
    "element_spec_of_text": ([[], "string"], [[], "bytes"]),
    # Shapes are read from the first elements, not declared: a generator's output_signature of
    # (None,) whose elements all have 3 values reads as (3,).
    "element_spec_of_a_generator_of_equal_lengths": ([[None], "int64"], [[3], "int64"]),
}


# Programs TensorFlow refuses and Sluice runs (the README's difference table), with the words of
# TensorFlow's refusal; Sluice must give what TensorFlow gives for the program written as it takes
# it (tf_programs.WRITTEN_FOR_TENSORFLOW).
TENSORFLOW_REFUSES = {
    "prefetch_without_a_size": "buffer_size",
    "padded_batch_with_parallel_calls": "num_parallel_calls",
}

# Refused programs written as the README's difference table says to write them for Sluice.
WRITTEN_FOR_SLUICE = {
    "bucket_by_sequence_length": tf_programs.PROGRAMS["bucket_by_sequence_length"].replace(
        "lambda x: tf.shape(x)[0]", "element_length_func='value'"),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("programs")
    tf_programs.make_files(str(folder))
    return folder


@pytest.fixture(scope="module")
def tensorflow_gave(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "results.json"
    run_oracle("oracle_tf_programs.py", folder, out)
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(tf_programs.PROGRAMS))
def test_the_program_gives_what_tensorflow_gives(name, tensorflow_gave, folder, monkeypatch):
    monkeypatch.chdir(folder)
    expected = tensorflow_gave[name]
    got = tf_programs.run(name, SLUICE_AS_TF, str(folder))
    if name in TENSORFLOW_REFUSES:
        assert TENSORFLOW_REFUSES[name] in expected.get("error", ""), expected
        expected = tensorflow_gave[name + tf_programs.AS_TENSORFLOW]
        assert "error" not in expected, expected
    if name in DIFFERS:
        tensorflow_result, sluice_result = DIFFERS[name]
        assert expected == {"result": tf_programs.encode(tensorflow_result)}, expected
        assert got == {"result": tf_programs.encode(sluice_result)}, got
        return
    assert "error" not in expected, f"TensorFlow itself failed the program: {expected['error']}"
    if name in REFUSED:
        assert REFUSED[name] in got.get("error", ""), got
        if name not in WRITTEN_FOR_SLUICE:
            return
        # The same work in the form the difference table gives: the same elements.
        got = tf_programs.run(name, SLUICE_AS_TF, str(folder), source=WRITTEN_FOR_SLUICE[name])
    assert "error" not in got, f"Sluice failed where TensorFlow gave {json.dumps(expected)[:600]}:\n{got['error']}"
    assert got == expected
