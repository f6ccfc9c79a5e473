"""Makes the peers benchmark's data once, under OUT (default build/bench_peers), from the sample
data (bash scripts/demo.sh) and generated records; runs in the peers environment:
  image_ar/   the sample data's 8 JPEG tf.Example shards, the same records as ArrayRecord (Grain's format)
  tiny/       1,000,000 tf.Examples of two int64 features in 8 TFRecord shards (with `sluice index`'s
              index files); tiny_ar/ the same as ArrayRecord
  image_tfr/  the sample data's shards copied, with `sluice index`'s index files (random_access)
  dali_index/ DALI's index files (tfrecord2idx) of the sample shards (image/) and tiny's (tiny/), when DALI is installed
  text/       200,000 lines of token ids (whitespace-separated integers below 32,000, lengths
              log-normal: median 33, 1% over 210) in 8 text files
Usage: build/peers/bin/python bench/peers/prepare.py [OUT]"""
import glob
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from example_proto import Example  # noqa: E402

TINY_RECORDS = 1_000_000
TEXT_LINES = 200_000
SHARDS = 8


def write_array_record(path, records):
    from array_record.python.array_record_module import ArrayRecordWriter
    writer = ArrayRecordWriter(path + ".partial", "group_size:1")
    for record in records:
        writer.write(record)
    writer.close()
    os.replace(path + ".partial", path)


def dali_index_files(shards, folder):
    """DALI's TFRecord reader's index of each sample shard, made by the tfrecord2idx script its wheel
    installs (bench/peers/requirements.txt); none when DALI is not installed."""
    tool = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    if not os.path.exists(tool):
        print("prepare.py: no DALI in this environment (SLUICE_BENCH_DEPS=1 bash scripts/install-deps.sh): its index files are not made")
        return
    import subprocess
    os.makedirs(folder, exist_ok=True)
    for shard in shards:
        index = os.path.join(folder, os.path.basename(shard) + ".idx")
        if not os.path.exists(index):
            subprocess.run([sys.executable, tool, shard, index + ".partial"], check=True, stdout=subprocess.DEVNULL)
            os.replace(index + ".partial", index)


def tfrecords(path):
    import tensorflow as tf
    return [r.numpy() for r in tf.data.TFRecordDataset(path)]


def write_text_lines(folder):
    """Lines of token ids as a tokenized corpus is kept: sentence lengths log-normal, a long tail."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(11)
    per_file = TEXT_LINES // SHARDS
    for s in range(SHARDS):
        path = f"{folder}/part-{s:05d}-of-{SHARDS:05d}.txt"
        if os.path.exists(path):
            continue
        lines = []
        for _ in range(per_file):
            length = min(512, max(1, round(rng.lognormvariate(3.5, 0.8))))
            lines.append(" ".join(str(rng.randrange(32000)) for _ in range(length)))
        with open(path + ".partial", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".partial", path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/bench_peers"
    shards = sorted(glob.glob("build/sample_data/tfrecord/*.tfrecord"))
    if not shards:
        sys.exit("prepare.py: no sample data: run bash scripts/demo.sh once")
    os.makedirs(f"{out}/image_ar", exist_ok=True)
    for shard in shards:
        target = f"{out}/image_ar/{os.path.basename(shard).replace('.tfrecord', '.array_record')}"
        if not os.path.exists(target):
            write_array_record(target, tfrecords(shard))
    os.makedirs(f"{out}/tiny", exist_ok=True)
    os.makedirs(f"{out}/tiny_ar", exist_ok=True)
    if len(glob.glob(f"{out}/tiny_ar/*.array_record")) < SHARDS:
        import tensorflow as tf
        rng = random.Random(7)
        per_shard = TINY_RECORDS // SHARDS
        for s in range(SHARDS):
            records = []
            for i in range(per_shard):
                e = Example()
                e.features.feature["id"].int64_list.value.append(s * per_shard + i)
                e.features.feature["label"].int64_list.value.append(rng.randrange(1000))
                records.append(e.SerializeToString())
            name = f"train-{s:05d}-of-{SHARDS:05d}"
            with tf.io.TFRecordWriter(f"{out}/tiny/{name}.tfrecord.partial") as w:
                for r in records:
                    w.write(r)
            os.replace(f"{out}/tiny/{name}.tfrecord.partial", f"{out}/tiny/{name}.tfrecord")
            write_array_record(f"{out}/tiny_ar/{name}.array_record", records)
    write_text_lines(f"{out}/text")
    # The sample shards again, for random_access (its index files beside them, not in the sample
    # data's folder).
    os.makedirs(f"{out}/image_tfr", exist_ok=True)
    for shard in shards:
        target = f"{out}/image_tfr/{os.path.basename(shard)}"
        if not os.path.exists(target):
            shutil.copyfile(shard, target + ".partial")
            os.replace(target + ".partial", target)
    # The index files random_access reads through, made once here so that no timed run makes them.
    sluice = os.environ.get("SLUICE", "build/bin/sluice")
    if os.path.exists(sluice):
        import subprocess
        indexed = sorted(glob.glob(f"{out}/tiny/*.tfrecord")) + sorted(glob.glob(f"{out}/image_tfr/*.tfrecord"))
        subprocess.run([sluice, "index", *indexed], check=True, stdout=subprocess.DEVNULL)
    else:
        print(f"prepare.py: no {sluice} (SLUICE=...): random_access will index the tiny shards on its first run")
    dali_index_files(shards, f"{out}/dali_index/image")
    dali_index_files(sorted(glob.glob(f"{out}/tiny/*.tfrecord")), f"{out}/dali_index/tiny")
    print(f"prepare.py: data in {out}")


if __name__ == "__main__":
    main()
