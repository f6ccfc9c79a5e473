"""The oracle of test_tf_programs.py: runs every program of tf_programs.py with TensorFlow (in the
peers environment) and writes what each gave as JSON. Usage: oracle_tf_programs.py FOLDER OUT.json"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

import tf_programs  # noqa: E402

folder, out = sys.argv[1], sys.argv[2]
tf_programs.make_files(folder)
os.chdir(folder)
results = {name: tf_programs.run(name, tf, folder) for name in tf_programs.PROGRAMS}
for name, source in tf_programs.WRITTEN_FOR_TENSORFLOW.items():
    results[name + tf_programs.AS_TENSORFLOW] = tf_programs.run(name, tf, folder, source=source)
results["_versions"] = {"tensorflow": tf.__version__}
with open(out + ".partial", "w") as f:
    json.dump(results, f)
os.replace(out + ".partial", out)
