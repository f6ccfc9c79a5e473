"""sluice.data.tfds written as a TFDS user writes tfds.load: a prepared directory (MNIST's own
dataset_info.json, saying tfrecord, with shards written by Sluice's tfrecord_writer under TFDS's
names), split slices, as_supervised pairs, images decoded, TFDS's interleave order."""
import json
import os

import numpy
import pytest

import sluice
from conftest import SOURCE_DIR

MNIST_INFO = os.path.join(SOURCE_DIR, "tests", "data", "real", "tfds", "metadata", "mnist", "3.0.1", "dataset_info.json")
MNIST_FEATURES = {
    "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
    "featuresDict": {"features": {
        "image": {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
                  "image": {"shape": {"dimensions": ["28", "28", "1"]}, "dtype": "uint8", "encodingFormat": "png"}},
        "label": {"pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                  "classLabel": {"numClasses": "10"}}}}}
TRAIN_SHARDS, TEST_SHARDS = [40, 24], [16]


def digit_image(k):
    """A 28x28 gray image that tells example k apart: its first pixels hold k."""
    image = numpy.full((28, 28, 1), 7, dtype=numpy.uint8)
    image[0, 0, 0], image[0, 1, 0] = k % 256, k // 256
    return image


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """DATA_DIR/mnist/3.0.1 with MNIST's metadata (tfrecord, smaller shards) and its shards."""
    root = tmp_path_factory.mktemp("tfds")
    folder = root / "mnist" / "3.0.1"
    folder.mkdir(parents=True)
    with open(MNIST_INFO, encoding="utf-8") as f:
        info = json.load(f)
    info["fileFormat"] = "tfrecord"
    for split in info["splits"]:
        split["shardLengths"] = [str(n) for n in (TRAIN_SHARDS if split["name"] == "train" else TEST_SHARDS)]
    (folder / "dataset_info.json").write_text(json.dumps(info))
    (folder / "features.json").write_text(json.dumps(MNIST_FEATURES))
    for split, shards, first in (("train", TRAIN_SHARDS, 0), ("test", TEST_SHARDS, 1000)):
        count = sum(shards)
        images = numpy.stack([digit_image(first + k) for k in range(count)])
        labels = numpy.array([(first + k) % 10 for k in range(count)], dtype=numpy.int64)
        writer = (sluice.data.from_tensor_slices({"image": images, "label": labels})
                  .encode_image(format="png")
                  .tfrecord_writer(prefix=str(folder / f"mnist-{split}.tfrecord"), max_records=shards[0]))
        writer.pipeline().run()
    for shard in os.listdir(folder):  # tfrecord_writer ends its names in .tfrecord, TFDS's names end in the shard number
        if shard.endswith(".tfrecord"):
            os.rename(folder / shard, folder / shard[:-len(".tfrecord")])
    assert sorted(os.listdir(folder)) == ["dataset_info.json", "features.json", "mnist-test.tfrecord-00000-of-00001",
                                          "mnist-train.tfrecord-00000-of-00002", "mnist-train.tfrecord-00001-of-00002"]
    return str(root)


def numbers(images):
    return [int(i[0, 0, 0]) + 256 * int(i[0, 1, 0]) for i in images]


def tfds_order(shard_reads, cycle=16, block=16):
    """The example order of TFDS's reader over at most `cycle` shard reads (first example
    number, count): tf.data's interleave(cycle_length, block_length) with every read open at once,
    block_length examples from each in turn."""
    assert len(shard_reads) <= cycle
    iterators = [iter(range(first, first + count)) for first, count in shard_reads]
    order = []
    while iterators:
        for it in list(iterators):
            taken = [x for _, x in zip(range(block), it)]
            order += taken
            if len(taken) < block:
                iterators.remove(it)
    return order


def test_as_supervised_gives_decoded_image_and_label_pairs_in_tfds_order(data_dir):
    ds = sluice.data.tfds("mnist", split="train[:75%]", data_dir=data_dir, as_supervised=True)
    images, labels = [], []
    for image, label in ds.batch(8):
        assert image.dtype == numpy.uint8 and image.shape[1:] == (28, 28, 1)
        images += list(image)
        labels += list(label)
    expected = tfds_order([(0, 40), (40, 8)])  # round(64 * 0.75) = 48: all of shard 0, 8 of shard 1
    assert numbers(images) == expected
    assert labels == [k % 10 for k in expected]
    assert all(numpy.array_equal(image, digit_image(k)) for image, k in zip(images, expected))


def test_elements_are_dicts_of_the_features(data_dir):
    element = next(iter(sluice.data.tfds("mnist", split="test[-2:]", data_dir=data_dir)))
    assert sorted(element) == ["image", "label"]
    assert numbers([element["image"]]) == [1014]
    assert element["label"] == 4


@pytest.mark.parametrize("split, expected", [
    ("test", list(range(1000, 1016))),
    ("test[:25%]", list(range(1000, 1004))),
    ("test[-3:]", list(range(1013, 1016))),
    ("test[:2]+train[1shard][:1]", None),  # refused: TFDS slices a split once
    ("train[1shard]", tfds_order([(40, 24)])),
    ("test[:10%]+train[-2:]", [1000, 1001, 62, 63]),  # round(1.6) = 2
])
def test_split_slices(data_dir, split, expected):
    ds = sluice.data.tfds("mnist", split=split, data_dir=data_dir, as_supervised=True, read_config={"interleave_cycle_length": 1})
    if expected is None:
        with pytest.raises(sluice.PipelineError, match=r"split 'test\[:2\]\+train\[1shard\]\[:1\]'"):
            list(ds)
        return
    assert numbers([image for image, _ in ds]) == expected


def test_tfds_data_dir_is_the_default_folder(data_dir, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
    assert len(list(sluice.data.tfds("mnist:3.0.1", split="test"))) == 16


def test_shuffle_files_reorders_shards_with_the_seed(data_dir):
    def order(seed):
        ds = sluice.data.tfds("mnist", split="train", data_dir=data_dir, shuffle_files=True, decode_images=False,
                              read_config={"interleave_cycle_length": 1, "shuffle_seed": seed})
        return [int(label) for label in (e["label"] for e in ds)]
    orders = {tuple(order(seed)) for seed in range(8)}
    assert len(orders) == 2  # two shards: both orders appear over eight seeds
    assert order(3) == order(3)


def test_refusals_name_what_to_do(data_dir, tmp_path):
    with pytest.raises(TypeError, match="give split="):
        sluice.data.tfds("mnist", data_dir=data_dir)
    with pytest.raises(sluice.PipelineError, match="no dataset 'cifar10'.*download_and_prepare"):
        list(sluice.data.tfds("cifar10", split="train", data_dir=data_dir))
    # TFDS's real MNIST metadata (array_record) beside no features.json; then saying a format Sluice does not read.
    real = os.path.dirname(os.path.dirname(os.path.dirname(MNIST_INFO)))
    with pytest.raises(sluice.PipelineError, match="features.json: cannot be read"):
        list(sluice.data.tfds("mnist", split="train", data_dir=real))
    version = tmp_path / "mnist" / "3.0.1"
    version.mkdir(parents=True)
    (version / "dataset_info.json").write_text(open(MNIST_INFO).read().replace('"array_record"', '"riegeli"'))
    with pytest.raises(sluice.PipelineError, match="fileFormat \"riegeli\".*tfrecord or array_record"):
        list(sluice.data.tfds("mnist", split="train", data_dir=str(tmp_path)))


def test_tfds_writer_directory_reads_back_as_written(tmp_path):
    """A split written by tfds_writer from NumPy arrays, read back by tfds(): the same images and
    labels, described in features.json and dataset_info.json as TFDS describes them."""
    images = numpy.stack([digit_image(k) for k in range(25)])
    labels = numpy.arange(25, dtype=numpy.int64) % 10
    for split, rows in (("train", slice(0, 20)), ("test", slice(20, 25))):
        (sluice.data.from_tensor_slices({"image": images[rows], "label": labels[rows]})
         .encode_image(format="png")
         .tfds_writer(data_dir=str(tmp_path), name="digits", split=split, max_records=8,
                      class_labels=["label"], supervised_keys=["image", "label"])
         .pipeline().run())
    folder = tmp_path / "digits" / "1.0.0"
    info = json.loads((folder / "dataset_info.json").read_text())
    assert [(s["name"], s["shardLengths"]) for s in info["splits"]] == [("train", ["8", "8", "4"]), ("test", ["5"])]
    assert info["supervisedKeys"]["tuple"]["items"] == [{"featureKey": "image"}, {"featureKey": "label"}]
    features = json.loads((folder / "features.json").read_text())["featuresDict"]["features"]
    assert features["image"]["image"] == {"shape": {"dimensions": ["28", "28", "1"]}, "dtype": "uint8", "encodingFormat": "png"}
    assert features["label"]["classLabel"] == {"numClasses": "10"}
    pairs = list(sluice.data.tfds("digits", split="all", data_dir=str(tmp_path), as_supervised=True,
                                  read_config={"interleave_cycle_length": 1}))
    assert numbers([image for image, _ in pairs]) == list(range(25))
    assert all(numpy.array_equal(image, images[k]) and label == labels[k] for k, (image, label) in enumerate(pairs))
