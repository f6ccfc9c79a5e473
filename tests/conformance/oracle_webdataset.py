"""The oracle of test_webdataset.py, with webdataset (in the peers environment).

  oracle_webdataset.py write FOLDER OUT.json   shards written by webdataset.TarWriter (a .tar and a
      gzip .tar.gz): samples with every kind of member (bytes, class, text, JSON, .npy, a member
      of two extensions, keys with dots in their folders); OUT.json: the samples webdataset's own
      reader gives, members as raw bytes (base64).
  oracle_webdataset.py read SHARD... OUT.json  Sluice's shards as webdataset.WebDataset reads
      and decodes them (its default decoders: by extension).
"""
import base64
import io
import json
import os
import sys

import numpy as np
import webdataset as wds


def samples():
    made = []
    for i in range(7):
        sample = {"__key__": f"part.{i % 2}/sample{i:03d}", "jpg": bytes([0xFF, 0xD8, i, 0xFF, 0xD9]), "cls": i % 3,
                  "txt": f"caption {i}: é", "json": {"i": i, "tags": ["a"] * i}, "seg.png": bytes(range(i))}
        if i % 2:
            buffer = io.BytesIO()
            np.save(buffer, np.arange(i * 2, dtype=np.float32).reshape(i, 2))
            sample["npy"] = buffer.getvalue()
        made.append(sample)
    return made


def raw(sample):
    return {k: (v if k.startswith("__") and k != "__key__" else
                v if k == "__key__" else base64.b64encode(v).decode()) for k, v in sample.items() if k != "__url__" and k != "__local_path__"}


def write(folder):
    paths = []
    for name, compress in (("plain.tar", False), ("zipped.tar.gz", True)):
        path = os.path.join(folder, name)
        with wds.TarWriter(path, compress=compress) as sink:
            for sample in samples():
                sink.write(sample)
        paths.append(path)
    return {os.path.basename(p): [raw(s) for s in wds.WebDataset(p, shardshuffle=False, empty_check=False)] for p in paths}


def plain(value):
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "shape": list(value.shape), "values": value.reshape(-1).tolist()}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    return value


def read(paths):
    dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False).decode()
    return [{k: plain(v) for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in dataset]


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[-1]
    results = write(sys.argv[2]) if mode == "write" else read(sys.argv[2:-1])
    with open(out + ".partial", "w") as f:
        json.dump(results, f)
    os.replace(out + ".partial", out)
