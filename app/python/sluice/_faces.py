"""The faces of other systems: tensorflow_datasets directories (tfds), tf.data.experimental and
its service's names."""
import enum
import json
import os


from . import AUTOTUNE, _sluice
from ._structure import Structure as _Structure
from ._ops import _is_remote_uri
from ._sources import _source


_TFDS_NAME = r"^([\w.-]+)(/[\w.-]+)?(?::(\d+\.\d+\.\d+))?$"


def _tfds_version_folder(name, data_dir):
    """The folder the tfds source reads for `name` (the same rule as its: the newest prepared
    version when none is named), or None when there is none (the source then says why). A
    data_dir in a bucket (s3://, gs://) is listed through the engine's remote storage."""
    import re
    match = re.match(_TFDS_NAME, name)
    if match is None:
        return None
    base = os.path.join(data_dir, match.group(1) + (match.group(2) or ""))
    if match.group(3):
        return os.path.join(base, match.group(3))
    try:
        if _is_remote_uri(base):
            infos = [uri[len(base) + 1:] for uri in _sluice.list_remote(base + "/") if uri.endswith("/dataset_info.json")]
            versions = [v.split("/")[0] for v in infos if v.count("/") == 1 and re.match(r"^\d+\.\d+\.\d+$", v.split("/")[0])]
        else:
            versions = [v for v in os.listdir(base) if re.match(r"^\d+\.\d+\.\d+$", v) and os.path.exists(os.path.join(base, v, "dataset_info.json"))]
    except (OSError, ValueError, RuntimeError):
        return None
    return os.path.join(base, max(versions, key=lambda v: tuple(int(p) for p in v.split(".")))) if versions else None


def _read_metadata(path):
    """A small file of a dataset's folder, local or in a bucket, as text."""
    if _is_remote_uri(path):
        try:
            return _sluice.read_remote_text(path)
        except (ValueError, RuntimeError) as e:
            raise OSError(str(e)) from None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _metadata_exists(path):
    if _is_remote_uri(path):
        try:
            return path in _sluice.list_remote(path)
        except (ValueError, RuntimeError):
            return False
    return os.path.exists(path)


def _tfds_features(feature, name=""):
    """(field, kind, channels) of each feature of features.json, nested names joined with '/';
    kind 'image' only for a single (not sequence) image, which decode_image can decode."""
    if not isinstance(feature, dict):
        return []
    if "featuresDict" in feature:
        found = []
        for key, inner in feature["featuresDict"].get("features", {}).items():
            found += _tfds_features(inner, f"{name}/{key}" if name else key)
        return found
    if "sequence" in feature:
        return [(field, "other" if kind == "image" else kind, channels)
                for field, kind, channels in _tfds_features(feature["sequence"].get("feature"), name)]
    if "image" in feature:
        dims = feature["image"].get("shape", {}).get("dimensions", [])
        last = int(dims[-1]) if dims else 3
        return [(name, "image", str(last) if last in (1, 3) else "0")]
    return [(name, "class_label" if "classLabel" in feature else "other", None)]


def tfds(name, *, split=None, data_dir=None, shuffle_files=False, as_supervised=False, read_config=None,
         class_names=False, decode_images=True, seed=None):
    """A prepared tensorflow_datasets dataset, as tfds.load(name, split=..., data_dir=...,
    shuffle_files=..., as_supervised=...) gives it: elements are dicts of its features (nested
    dicts as TFDS nests them), images decoded (decode_images=False keeps the encoded bytes),
    or (input, target) pairs with as_supervised=True. split is TFDS's grammar ('train[:10%]',
    'train[:4shard]+test', 'all'); data_dir defaults to $TFDS_DATA_DIR, else
    ~/tensorflow_datasets. The shards are read as TFDS reads them: 16 at once, in blocks of 16
    (read_config={'interleave_cycle_length': C, 'interleave_block_length': B} changes it).
    class_names=True adds FEATURE_name beside each ClassLabel whose names the dataset holds."""
    if split is None:
        raise TypeError("tfds(): give split= (tfds.load(split=None) returns a dict of every split; name one, or 'all', "
                        "or a union such as 'train+test')")
    read_config = dict(read_config or {})
    unknown = set(read_config) - {"interleave_cycle_length", "interleave_block_length", "shuffle_seed"}
    if unknown:
        raise TypeError(f"tfds(): read_config takes interleave_cycle_length, interleave_block_length and shuffle_seed, "
                        f"not {', '.join(sorted(unknown))}")
    folder_base = os.fspath(data_dir) if data_dir is not None else (
        os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))
    if seed is None:
        seed = read_config.get("shuffle_seed")
    shards = _source("tfds", {"name": name, "split": split, "data_dir": folder_base if data_dir is not None else None,
                              "shuffle_files": shuffle_files, "seed": seed})
    cycle = int(read_config.get("interleave_cycle_length", 16))
    block = int(read_config.get("interleave_block_length", 16))
    dataset = shards.tfds_reader(class_names=class_names or None,
                                 interleave={"cycle_length": cycle, "block_length": block}, parallelism=AUTOTUNE)
    folder = _tfds_version_folder(name, folder_base)
    features = []
    if folder is not None:
        try:
            features = _tfds_features(json.loads(_read_metadata(os.path.join(folder, "features.json"))))
        except (OSError, ValueError):
            features = []  # the source refuses the dataset when it starts, naming the file
    if decode_images:
        for field, kind, channels in features:
            if kind == "image":
                dataset = dataset.decode_image(field=field, output=field, channels=channels)
    fields = [field for field, _, _ in features]
    if class_names:
        fields += [f"{field}_name" for field, kind, _ in features
                   if kind == "class_label" and _metadata_exists(os.path.join(folder, field.replace("/", "-") + ".labels.txt"))]
    if as_supervised:
        keys = json.loads(_read_metadata(os.path.join(folder, "dataset_info.json"))).get("supervisedKeys", {})
        pair = ([keys["input"], keys["output"]] if "input" in keys else
                [item.get("featureKey") for item in keys.get("tuple", {}).get("items", [])])
        if len(pair) != 2 or None in pair:
            raise ValueError(f"tfds(): {name} has no supervised keys (a pair of features) in its dataset_info.json; "
                             "use as_supervised=False and pick the fields yourself")
        dataset = dataset.select_fields(keep=pair)
        dataset._structure = _Structure(tuple(pair))
    elif any("/" in field for field in fields):
        template = {}
        for field in fields:
            *outer, last = field.split("/")
            level = template
            for key in outer:
                level = level.setdefault(key, {})
            level[last] = field
        dataset._structure = _Structure(template)
    return dataset


class _ShardingPolicy(enum.Enum):
    """tf.data.experimental.service.ShardingPolicy: how the service's workers share a dataset."""
    OFF = "off"
    DYNAMIC = "dynamic"
    FILE = "file"
    DATA = "data"
    FILE_OR_DATA = "file_or_data"


class _Service:
    """tf.data.experimental.service's names that Sluice has: distribute() and ShardingPolicy."""
    ShardingPolicy = _ShardingPolicy

    @staticmethod
    def distribute(processing_mode, service, job_name=None, consumer_index=None, num_consumers=None, **options):
        """For ds.apply(): Dataset.distribute(service, processing_mode, job_name, ...), in
        tf.data's argument order."""
        return lambda dataset: dataset.distribute(service, processing_mode, job_name, consumer_index=consumer_index,
                                                  num_consumers=num_consumers, **options)


class experimental:
    """tf.data.experimental's names that Sluice has: AUTOTUNE, ignore_errors(), parallel_interleave(),
    service.distribute()."""
    AUTOTUNE = AUTOTUNE
    service = _Service

    @staticmethod
    def ignore_errors():
        """For ds.apply(): the dataset with every stage so far skipping what fails (Dataset.ignore_errors)."""
        return lambda dataset: dataset.ignore_errors()

    @staticmethod
    def parallel_interleave(map_func, cycle_length, block_length=1, sloppy=False, buffer_output_elements=None,
                            prefetch_input_elements=None, num_parallel_calls=None):
        """For ds.apply(): Dataset.interleave(map_func, cycle_length, block_length, num_parallel_calls
        (else cycle_length readers), deterministic=not sloppy), as tf.data.experimental's.
        buffer_output_elements and prefetch_input_elements are the engine's to choose."""
        readers = cycle_length if num_parallel_calls is None else num_parallel_calls
        return lambda dataset: dataset.interleave(map_func, cycle_length, block_length, readers, False if sloppy else None)
