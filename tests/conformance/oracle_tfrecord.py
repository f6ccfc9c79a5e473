"""The oracle of test_tfrecord.py, with TensorFlow (in the peers environment).

  oracle_tfrecord.py write FOLDER OUT.json   TFRecord files written by tf.io.TFRecordWriter (no
      compression, GZIP, ZLIB) of tf.train.Examples with every feature kind, empty lists and an
      empty Example, and of SequenceExamples; OUT.json: each file's records and what
      tf.io.parse_single_example / parse_single_sequence_example make of them.
  oracle_tfrecord.py read FILE... OUT.json   what tf.data.TFRecordDataset reads of each file (the
      files Sluice's tfrecord_writer wrote) and the Examples' features as tf.train.Example parses
      them.
"""
import base64
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def feature(kind, values):
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def examples():
    """Example i: `ids` an int64 list of i % 4 values (none for 0), `pair` two floats, `name` one
    bytes value (absent from every fifth), `big` an int64 past 32 bits; the last has no features."""
    made = []
    for i in range(12):
        features = {"ids": feature("int64", [i * 10 + k for k in range(i % 4)]),
                    "pair": feature("float", [i + 0.25, -i / 3.0]),
                    "big": feature("int64", [2**40 + i])}
        if i % 5:
            features["name"] = feature("bytes", [f"name-{i}".encode()])
        made.append(tf.train.Example(features=tf.train.Features(feature=features)))
    made.append(tf.train.Example())
    return made


EXAMPLE_SPEC = {"ids": tf.io.VarLenFeature(tf.int64), "pair": tf.io.FixedLenFeature([2], tf.float32, default_value=[0.0, 0.0]),
                "name": tf.io.FixedLenFeature([], tf.string, default_value=b"none"),
                "big": tf.io.FixedLenFeature([], tf.int64, default_value=-1)}


def sequence_examples():
    made = []
    for i in range(5):
        context = tf.train.Features(feature={"length": feature("int64", [i])})
        frames = tf.train.FeatureList(feature=[feature("int64", [i, k, k * k]) for k in range(i)])
        scores = tf.train.FeatureList(feature=[feature("float", [k / 2.0]) for k in range(i)])
        lists = tf.train.FeatureLists(feature_list={"frames": frames, "scores": scores})
        made.append(tf.train.SequenceExample(context=context, feature_lists=lists))
    return made


def as_json(value):
    import numpy as np
    value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if value.dtype.kind in ("O", "S"):
        return {"dtype": "string", "shape": list(value.shape), "values": [base64.b64encode(bytes(v)).decode() for v in value.reshape(-1)]}
    return {"dtype": str(value.dtype), "shape": list(value.shape), "values": value.reshape(-1).tolist()}


def write(folder, out):
    results = {}
    for compression in ("", "GZIP", "ZLIB"):
        path = os.path.join(folder, f"examples-{compression.lower() or 'none'}.tfrecord")
        with tf.io.TFRecordWriter(path, options=tf.io.TFRecordOptions(compression_type=compression)) as writer:
            for example in examples():
                writer.write(example.SerializeToString())
        records = [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression)]
        parsed = []
        for record in records:
            p = tf.io.parse_single_example(record, EXAMPLE_SPEC)
            parsed.append({"ids": as_json(tf.sparse.to_dense(p["ids"])), "pair": as_json(p["pair"]), "name": as_json(p["name"]),
                           "big": as_json(p["big"])})
        undeclared = "read"
        try:  # tf.data's default (compression_type None) reads the bytes as they are
            list(tf.data.TFRecordDataset(path))
        except tf.errors.OpError as e:
            undeclared = f"{type(e).__name__}: {e.message}"
        results[os.path.basename(path)] = {"compression": compression, "records": [base64.b64encode(r).decode() for r in records],
                                           "undeclared": undeclared,
                                           "parsed": parsed}
    path = os.path.join(folder, "sequences.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for example in sequence_examples():
            writer.write(example.SerializeToString())
    parsed = []
    for record in tf.data.TFRecordDataset(path):
        context, lists = tf.io.parse_single_sequence_example(
            record, context_features={"length": tf.io.FixedLenFeature([], tf.int64)},
            sequence_features={"frames": tf.io.FixedLenSequenceFeature([3], tf.int64),
                               "scores": tf.io.FixedLenSequenceFeature([1], tf.float32)})
        parsed.append({"length": as_json(context["length"]), "frames": as_json(lists["frames"]), "scores": as_json(lists["scores"])})
    results["sequences.tfrecord"] = {"compression": "", "parsed": parsed,
                                     "records": [base64.b64encode(r.numpy()).decode() for r in tf.data.TFRecordDataset(path)]}
    return results


def read(paths):
    results = {}
    for path in paths:
        compression = "GZIP" if path.endswith(".gz") else "ZLIB" if path.endswith(".zz") else ""
        examples_read = []
        for record in tf.data.TFRecordDataset(path, compression_type=compression):
            example = tf.train.Example.FromString(record.numpy())
            fields = {}
            for name, f in example.features.feature.items():
                kind = f.WhichOneof("kind")
                values = list(getattr(f, kind).value)
                fields[name] = {"kind": kind, "values": [base64.b64encode(v).decode() for v in values] if kind == "bytes_list" else values}
            examples_read.append(fields)
        results[os.path.basename(path)] = examples_read
    return results


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[-1]
    results = write(sys.argv[2], out) if mode == "write" else read(sys.argv[2:-1])
    with open(out + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(out + ".partial", out)
