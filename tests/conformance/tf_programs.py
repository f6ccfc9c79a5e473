"""Short tf.data programs, written as tf.data's guide and API pages write them, each run twice: once
with `import tensorflow as tf` (in the peers environment, by oracle_tf_programs.py) and once with
Sluice's tf.data face in tf.data's place (test_tf_programs.py). Every element of both runs is
compared: dtype, shape and value.

A program is Python text run with `tf`, `np` and `folder` (a folder holding a.txt, b.txt, c.txt,
made by make_files) as globals; it leaves the dataset to iterate in `ds`, or a value in `result`.
Nothing here imports TensorFlow or Sluice: both interpreters import this file.
"""
import base64
import os

PROGRAMS = {
    # Sources.
    "range_stop": "ds = tf.data.Dataset.range(5)",
    "range_start_stop_step": "ds = tf.data.Dataset.range(2, 20, 3)",
    "range_negative_step": "ds = tf.data.Dataset.range(5, 1, -2)",
    "range_empty": "ds = tf.data.Dataset.range(0)",
    "slices_of_a_list": "ds = tf.data.Dataset.from_tensor_slices([1, 2, 3])",
    "slices_of_floats": "ds = tf.data.Dataset.from_tensor_slices([1.5, 2.5])",
    "slices_of_file_names": "ds = tf.data.Dataset.from_tensor_slices(['a.txt', 'b.txt', 'c.txt'])",
    "slices_of_a_matrix": "ds = tf.data.Dataset.from_tensor_slices(np.arange(12).reshape(4, 3))",
    "slices_of_a_tuple": "ds = tf.data.Dataset.from_tensor_slices(([1, 2, 3], ['a', 'b', 'c']))",
    "slices_of_a_dict": "ds = tf.data.Dataset.from_tensor_slices({'a': [1, 2], 'b': [3.0, 4.0]})",
    "slices_of_nested_structure": ("ds = tf.data.Dataset.from_tensor_slices("
                                   "({'x': np.array([1, 2], np.int64), 'y': np.array([3, 4], np.int64)}, np.array([5, 6], np.int64)))"),
    "from_tensors_tuple": "ds = tf.data.Dataset.from_tensors((np.array([1, 2, 3]), np.float32(0.5)))",
    "generator_scalars": ("def gen():\n    for i in range(4):\n        yield i\n"
                          "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=(), dtype=tf.int64))"),
    "generator_tuples": ("def gen():\n    for i in range(3):\n        yield i, [1] * i\n"
                         "ds = tf.data.Dataset.from_generator(gen, output_signature=(tf.TensorSpec(shape=(), dtype=tf.int64),\n"
                         "                                                        tf.TensorSpec(shape=(None,), dtype=tf.int64)))"),
    "list_files_unshuffled": "ds = tf.data.Dataset.list_files(os.path.join(folder, '*.txt'), shuffle=False)",
    "text_lines_of_a_list": ("ds = tf.data.TextLineDataset([os.path.join(folder, 'a.txt'), os.path.join(folder, 'b.txt')])"),
    "file_names_interleaved_into_lines": ("files = tf.data.Dataset.from_tensor_slices([os.path.join(folder, n) for n in ('a.txt', 'b.txt', 'c.txt')])\n"
                                         "ds = files.interleave(tf.data.TextLineDataset, cycle_length=2, block_length=1)"),
    # Functions over elements.
    "map_over_scalars": "ds = tf.data.Dataset.range(5).map(lambda x: x * 2)",
    "map_to_a_tuple": "ds = tf.data.Dataset.range(4).map(lambda x: (x, x * x))",
    "map_to_a_dict": "ds = tf.data.Dataset.range(3).map(lambda x: {'x': x, 'y': x + 1})",
    "map_over_a_tuple": "ds = tf.data.Dataset.from_tensor_slices(([1, 2, 3], [4, 5, 6])).map(lambda x, y: x + y)",
    "map_over_a_dict": "ds = tf.data.Dataset.from_tensor_slices({'a': [1, 2], 'b': [3, 4]}).map(lambda d: d['a'] * d['b'])",
    "filter_scalars": "ds = tf.data.Dataset.range(10).filter(lambda x: x % 3 == 0)",
    "filter_tuples": "ds = tf.data.Dataset.from_tensor_slices(([1, 2, 3, 4], [5, 6, 7, 8])).filter(lambda x, y: x % 2 == 0)",
    "map_then_filter": "ds = tf.data.Dataset.range(8).map(lambda x: x + 1).filter(lambda x: x > 4)",
    # Batching.
    "batch_keeps_remainder": "ds = tf.data.Dataset.range(8).batch(3)",
    "batch_drops_remainder": "ds = tf.data.Dataset.range(8).batch(3, drop_remainder=True)",
    "batch_of_tuples": "ds = tf.data.Dataset.from_tensor_slices(([1, 2, 3, 4], [5, 6, 7, 8])).batch(2)",
    "batch_then_unbatch": "ds = tf.data.Dataset.range(6).batch(4).unbatch()",
    "padded_batch_to_a_shape": ("def gen():\n    for n in range(1, 5):\n        yield [n] * n\n"
                                "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=[None], dtype=tf.int64))\n"
                                "ds = ds.padded_batch(2, padded_shapes=[5])"),
    "padded_batch_with_a_value": ("def gen():\n    for n in range(1, 4):\n        yield [n] * n\n"
                                  "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=[None], dtype=tf.int64))\n"
                                  "ds = ds.padded_batch(2, padded_shapes=[None], padding_values=np.int64(-1))"),
    "window_flat_map": "ds = tf.data.Dataset.range(7).window(3, shift=2, drop_remainder=True).flat_map(lambda w: w.batch(3))",
    "window_keeps_short_ones": "ds = tf.data.Dataset.range(5).window(2).flat_map(lambda w: w.batch(2))",
    "rebatch": "ds = tf.data.Dataset.range(10).batch(4).rebatch(3)",
    # Order and count.
    "prefetch_without_a_size": "ds = tf.data.Dataset.range(3).prefetch()",
    "take_and_skip": "ds = tf.data.Dataset.range(10).skip(3).take(4)",
    "take_more_than_there_is": "ds = tf.data.Dataset.range(3).take(10)",
    "repeat_twice": "ds = tf.data.Dataset.range(3).repeat(2)",
    "shard": "ds = tf.data.Dataset.range(10).shard(3, 1)",
    "enumerate": "ds = tf.data.Dataset.from_tensor_slices([10, 20, 30]).enumerate()",
    "enumerate_from_five": "ds = tf.data.Dataset.range(3).enumerate(start=5)",
    "concatenate": "ds = tf.data.Dataset.range(3).concatenate(tf.data.Dataset.range(10, 12))",
    "zip_of_two": "ds = tf.data.Dataset.zip(tf.data.Dataset.range(3), tf.data.Dataset.range(3, 6))",
    "zip_of_a_tuple": "ds = tf.data.Dataset.zip((tf.data.Dataset.range(3), tf.data.Dataset.range(3, 6)))",
    "zip_stops_at_the_shortest": "ds = tf.data.Dataset.zip((tf.data.Dataset.range(5), tf.data.Dataset.range(2).map(lambda x: x * 10)))",
    "choose_from_datasets": ("sources = [tf.data.Dataset.from_tensors(w).repeat() for w in ('foo', 'bar', 'baz')]\n"
                             "ds = tf.data.Dataset.choose_from_datasets(sources, tf.data.Dataset.range(3).repeat(3))"),
    "interleave_from_tensors": ("ds = tf.data.Dataset.range(1, 4).interleave(lambda x: tf.data.Dataset.from_tensors(x).repeat(2),\n"
                                "                                            cycle_length=2, block_length=1)"),
    "flat_map_ranges": "ds = tf.data.Dataset.range(1, 4).flat_map(lambda x: tf.data.Dataset.range(x))",
    # The edges: empty inputs, remainders, cycles longer than the inputs, strides.
    "batch_of_nothing": "ds = tf.data.Dataset.range(0).batch(4)",
    "batch_larger_than_the_input": "ds = tf.data.Dataset.range(3).batch(5, drop_remainder=True)",
    "window_with_a_stride": "ds = tf.data.Dataset.range(10).window(3, shift=1, stride=3, drop_remainder=True).flat_map(lambda w: w.batch(3))",
    "window_shift_past_the_size": "ds = tf.data.Dataset.range(10).window(2, shift=4).flat_map(lambda w: w.batch(2))",
    "interleave_blocks_of_two": ("ds = tf.data.Dataset.range(1, 4).interleave(lambda x: tf.data.Dataset.from_tensors(x).repeat(3),\n"
                                 "                                            cycle_length=2, block_length=2)"),
    "interleave_cycle_longer_than_the_input": ("ds = tf.data.Dataset.range(2).interleave(lambda x: tf.data.Dataset.from_tensors(x).repeat(2),\n"
                                               "                                          cycle_length=5)"),
    "padded_batch_of_floats": ("def gen():\n    for n in range(1, 4):\n        yield [n * 0.5] * n\n"
                               "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=[None], dtype=tf.float32))\n"
                               "ds = ds.padded_batch(2, padding_values=np.float32(-0.5))"),
    "padded_batch_of_tuples": ("def gen():\n    for n in range(1, 4):\n        yield [n] * n, n\n"
                               "ds = tf.data.Dataset.from_generator(gen, output_signature=(tf.TensorSpec(shape=[None], dtype=tf.int64),\n"
                               "                                                        tf.TensorSpec(shape=[], dtype=tf.int64)))\n"
                               "ds = ds.padded_batch(3, padded_shapes=([4], []), padding_values=(np.int64(9), np.int64(0)))"),
    "bucket_by_sequence_length": ("def gen():\n    for n in (1, 5, 2, 6, 3, 7, 1, 2):\n        yield [n] * n\n"
                                  "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=[None], dtype=tf.int64))\n"
                                  "ds = ds.bucket_by_sequence_length(lambda x: tf.shape(x)[0], bucket_boundaries=[4], bucket_batch_sizes=[2, 2])"),
    "unbatch_of_tuples": "ds = tf.data.Dataset.from_tensor_slices(([1, 2, 3, 4], [5, 6, 7, 8])).batch(3).unbatch()",
    "rebatch_dropping_the_remainder": "ds = tf.data.Dataset.range(11).batch(5).rebatch(4, drop_remainder=True)",
    "take_all_with_minus_one": "ds = tf.data.Dataset.range(4).take(-1)",
    "skip_past_the_end": "ds = tf.data.Dataset.range(4).skip(10)",
    "repeat_zero_times": "ds = tf.data.Dataset.range(4).repeat(0)",
    "shard_first_of_four": "ds = tf.data.Dataset.range(10).shard(4, 0)",
    "concatenate_an_empty_one": "ds = tf.data.Dataset.range(0).concatenate(tf.data.Dataset.range(2))",
    "zip_of_a_dict": "ds = tf.data.Dataset.zip({'a': tf.data.Dataset.range(2), 'b': tf.data.Dataset.range(5, 7)})",
    "filter_everything_out": "ds = tf.data.Dataset.range(5).filter(lambda x: x > 10)",
    "from_tensor_slices_of_big_ints": "ds = tf.data.Dataset.from_tensor_slices([1, 2**40])",
    "bytes_ending_in_nul": "ds = tf.data.Dataset.from_tensor_slices([b'a\\x00', b'\\x00', b''])",
    "enumerate_of_tuples": "ds = tf.data.Dataset.from_tensor_slices((['a', 'b'], [1.0, 2.0])).enumerate()",
    # Text in batches: arrays of bytes in the batch's shape.
    "batch_of_text": "ds = tf.data.Dataset.from_tensor_slices(['a', 'bc', 'def']).batch(2)",
    "slices_of_a_text_matrix": "ds = tf.data.Dataset.from_tensor_slices(np.array([[b'a', b'b'], [b'c', b''], [b'e', b'f']])).batch(2)",
    "lines_batched_then_unbatched": "ds = tf.data.TextLineDataset(os.path.join(folder, 'c.txt')).batch(2).unbatch()",
    # Caches: replayed, in memory or from a file; a file made by another pipeline.
    "cache_replays_its_first_pass": ("ds = tf.data.Dataset.range(8).shuffle(8, seed=3).cache()\n"
                                     "first, second = list(ds.as_numpy_iterator()), list(ds.as_numpy_iterator())\n"
                                     "uncached = tf.data.Dataset.range(8).shuffle(8, seed=3)\n"
                                     "a, b = list(uncached.as_numpy_iterator()), list(uncached.as_numpy_iterator())\n"
                                     "result = [sorted(first), first == second, a == b]"),
    "cache_file_read_again_by_the_same_pipeline": ("import tempfile\nf = os.path.join(tempfile.mkdtemp(), 'cache')\n"
                                                   "one = list(tf.data.Dataset.range(6).shuffle(6, seed=1).cache(f).as_numpy_iterator())\n"
                                                   "two = list(tf.data.Dataset.range(6).shuffle(6, seed=1).cache(f).as_numpy_iterator())\n"
                                                   "result = [one == two, sorted(one)]"),
    "cache_file_of_another_pipeline": ("import tempfile\nf = os.path.join(tempfile.mkdtemp(), 'cache')\n"
                                       "one = list(tf.data.Dataset.range(4).cache(f).as_numpy_iterator())\n"
                                       "two = list(tf.data.Dataset.range(4).map(lambda x: x * 10).cache(f).as_numpy_iterator())\n"
                                       "result = [one, two]"),
    # Parallel batching.
    "batch_with_parallel_calls": "ds = tf.data.Dataset.range(10).batch(4, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)",
    "padded_batch_with_parallel_calls": "ds = tf.data.Dataset.range(5).batch(2).padded_batch(2, num_parallel_calls=tf.data.AUTOTUNE)",
    # element_spec: [shape, dtype's name, name] of each TensorSpec.
    "element_spec_of_a_batch": "s = tf.data.Dataset.range(10).batch(3).element_spec\nresult = [list(s.shape), s.dtype.name, s.name]",
    "element_spec_dropping_the_remainder": ("s = tf.data.Dataset.range(10).batch(3, drop_remainder=True).element_spec\n"
                                            "result = [list(s.shape), s.dtype.name, s.name]"),
    "element_spec_of_a_tuple": ("spec = tf.data.Dataset.from_tensor_slices(([1, 2], [0.5, 1.5], np.zeros((2, 3), np.uint8))).element_spec\n"
                                "result = [[list(s.shape), s.dtype.name, s.name] for s in spec]"),
    "element_spec_of_a_dict_after_a_map": ("spec = tf.data.Dataset.range(3).map(lambda x: {'x': x, 'pair': (x, x * 2)}).element_spec\n"
                                           "result = [[list(s.shape), s.dtype.name] for s in (spec['x'], spec['pair'][0], spec['pair'][1])]"),
    "element_spec_of_a_padded_batch": ("def gen():\n    for n in range(1, 6):\n        yield [n] * n\n"
                                       "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=[None], dtype=tf.int64))\n"
                                       "s = ds.padded_batch(2, drop_remainder=True).element_spec\nresult = [list(s.shape), s.dtype.name]"),
    "element_spec_of_text": "s = tf.data.Dataset.from_tensor_slices(['a', 'bc']).element_spec\nresult = [list(s.shape), s.dtype.name]",
    "element_spec_of_a_generator_of_equal_lengths": ("def gen():\n    for i in range(4):\n        yield [1, 2, 3]\n"
                                                     "ds = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape=(None,), dtype=tf.int64))\n"
                                                     "s = ds.element_spec\nresult = [list(s.shape), s.dtype.name]"),
    # Values, not datasets.
    "reduce_a_sum": "result = tf.data.Dataset.range(5).reduce(np.int64(0), lambda state, x: state + x)",
    "cardinality_of_a_batch": "result = int(tf.data.Dataset.range(10).batch(3).cardinality())",
    "len_of_a_dataset": "result = len(tf.data.Dataset.from_tensor_slices([4, 5, 6]).skip(1))",
    "options_deterministic": ("options = tf.data.Options()\noptions.deterministic = True\n"
                              "ds = tf.data.Dataset.range(4).map(lambda x: x + 1, num_parallel_calls=2).with_options(options)\n"
                              "result = [ds.options().deterministic, list(ds.as_numpy_iterator())]"),
    "options_threading": ("options = tf.data.Options()\noptions.threading.private_threadpool_size = 4\n"
                          "ds = tf.data.Dataset.range(3).with_options(options)"),
}


# Programs TensorFlow refuses, written as TensorFlow takes them: what Sluice gives for the program
# must be what TensorFlow gives for this one (the oracle runs each as NAME + AS_TENSORFLOW).
AS_TENSORFLOW = " as tensorflow takes it"
WRITTEN_FOR_TENSORFLOW = {
    "prefetch_without_a_size": "ds = tf.data.Dataset.range(3).prefetch(8)",
    "padded_batch_with_parallel_calls": "ds = tf.data.Dataset.range(5).batch(2).padded_batch(2)",
}


def make_files(folder):
    for name, lines in (("a.txt", ["alpha", "beta"]), ("b.txt", ["gamma"]), ("c.txt", ["delta", "epsilon", "zeta"])):
        with open(os.path.join(folder, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def encode(value):
    """A value as JSON: the structure (tuple, dict, list), and for each array its dtype, shape and
    values (text as base64 of its bytes). Works on NumPy values and on whatever has .numpy()."""
    import numpy as np
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    if value is None:
        return {"python": "None"}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in sorted(value.items())}}
    if isinstance(value, list):
        return {"list": [encode(v) for v in value]}
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
        return {"python": type(value).__name__, "value": value}
    if isinstance(value, (bytes, str)):
        value = np.array(value.encode() if isinstance(value, str) else value, dtype=object)
    array = np.asarray(value)
    if array.dtype.kind in ("O", "S", "U"):
        flat = [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()]
        return {"dtype": "string", "shape": list(array.shape), "values": [base64.b64encode(v).decode() for v in flat]}
    return {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.reshape(-1).tolist()}


def run(name, tf, folder, source=None):
    """The program's elements (or its result), encoded; its exception as {"error": "Type: message"}."""
    import numpy as np
    import linecache
    scope = {"tf": tf, "np": np, "os": os, "folder": folder}
    filename = f"<tf program {name}>"
    source = (source or PROGRAMS[name]) + "\n"
    # Where inspect finds it: TensorFlow's AutoGraph reads the source of the program's functions.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        exec(compile(source, filename, "exec"), scope)
        if "result" in scope:
            return {"result": encode(scope["result"])}
        return {"elements": [encode(e) for e in scope["ds"].as_numpy_iterator()]}
    except Exception as e:  # the comparison says what failed, program by program
        return {"error": f"{type(e).__name__}: {e}"}
