"""WebDataset shards read and written as a PyTorch user's tools would: the real shards of
tests/data/real/webdataset against what Python's tarfile finds in them, damaged shards under the
fail and skip policies, and webdataset_writer's shards read back by tarfile and by the reader."""
import gzip
import io
import os
import shutil
import tarfile

import numpy
import pytest

import sluice
from conftest import SOURCE_DIR

SHARDS = os.path.join(SOURCE_DIR, "tests", "data", "real", "webdataset")


def samples_by_tarfile(path):
    """(key, {field: bytes}) per sample, grouped as webdataset groups members, by the standard library."""
    samples = []
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            stem, _, field = name.partition(".")
            key = f"{folder}/{stem}" if folder else stem
            data = archive.extractfile(member).read()
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            samples[-1][1][field] = data
    return samples


def read(path, error_policy=None, **reader):
    ds = sluice.data.list_files(path, shuffle=False).webdataset_reader(error_policy=error_policy, **reader)
    return list(ds)


def test_sample_tgz_every_sample_every_field_in_order():
    path = os.path.join(SHARDS, "sample.tgz")
    expected = samples_by_tarfile(path)
    got = read(path)
    assert len(got) == len(expected) == 90
    for element, (key, fields) in zip(got, expected):
        assert element["__key__"] == key.encode()
        assert element["__url__"] == path.encode()
        assert sorted(element) == ["__key__", "__url__", "cls", "png"]
        assert element["cls"] == int(fields["cls"])  # cls is read as an integer by default
        assert element["png"] == fields["png"]


def test_sample_tgz_pngs_decode():
    path = os.path.join(SHARDS, "sample.tgz")
    ds = (sluice.data.list_files(path, shuffle=False).webdataset_reader()
          .decode_image(field="png", output="image", channels=0).batch(30))
    batches = list(ds)
    assert [b["image"].shape[0] for b in batches] == [30, 30, 30]
    assert all(b["image"].dtype == numpy.uint8 and b["image"].ndim == 4 for b in batches)


def test_folder_member_and_gzip_members():
    path = os.path.join(SHARDS, "compressed.tar")
    got = read(path)
    expected = samples_by_tarfile(path)
    assert [e["__key__"] for e in got] == [b"compressed/0001", b"compressed/0002", b"compressed/0003"]
    assert [e["txt"] for e in got] == [gzip.decompress(fields["txt.gz"]) for _, fields in expected]
    kept = read(path, inflate=False)
    assert [e["txt.gz"] for e in kept] == [fields["txt.gz"] for _, fields in expected]


def test_thousand_gzip_samples():
    path = os.path.join(SHARDS, "testgz.tar")
    got = read(path)
    expected = samples_by_tarfile(path)
    assert len(got) == len(expected) == 1000
    assert [e["__key__"].decode() for e in got] == [key for key, _ in expected]
    assert all(e["txt"] == gzip.decompress(fields["txt.gz"]) for e, (_, fields) in zip(got, expected))


def damaged_copies(tmp_path):
    """A tar cut in the middle of its 6th member, and one whose 3rd member's header is broken."""
    source = os.path.join(SHARDS, "testgz.tar")
    with tarfile.open(source) as archive:
        members = archive.getmembers()
    cut = tmp_path / "cut.tar"
    raw = open(source, "rb").read()
    cut.write_bytes(raw[:members[5].offset_data + members[5].size // 2])
    broken = bytearray(raw)
    broken[members[2].offset + 148:members[2].offset + 156] = b"garbage!"  # its header checksum
    (tmp_path / "broken.tar").write_bytes(bytes(broken))
    return str(cut), str(tmp_path / "broken.tar"), members


def test_damaged_shards_fail_naming_shard_member_and_byte(tmp_path):
    cut, broken, members = damaged_copies(tmp_path)
    with pytest.raises(sluice.PipelineError, match=rf"{cut}: member {members[5].name} cut short .* at byte {members[5].offset}"):
        read(cut)
    with pytest.raises(sluice.PipelineError, match=rf"{broken}: a damaged member header .* at byte {members[2].offset}"):
        read(broken)


def test_a_header_claiming_gigabytes_is_damage_not_an_allocation(tmp_path):
    """A damaged header may claim any size (the fuzzer found one saying 5 GB): the reader makes
    room as bytes arrive, and names the member cut short, rather than asking for the memory."""
    shard = tmp_path / "claims.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as archive:
        ok = tarfile.TarInfo("000.txt")
        ok.size = 2
        archive.addfile(ok, io.BytesIO(b"ok"))
        huge = tarfile.TarInfo("001.txt")
        huge.size = 1 << 40  # a terabyte, written in base-256 by GNU tar's format; no data follows
        archive.addfile(huge)
    with pytest.raises(sluice.PipelineError, match=rf"{shard}: member 001.txt cut short after 0 bytes"):
        read(str(shard))


def test_damaged_shards_are_read_up_to_the_damage_under_skip(tmp_path):
    cut, broken, members = damaged_copies(tmp_path)
    assert len(read(cut, error_policy="skip")) == 5
    assert len(read(broken, error_policy="skip")) == 2
    # Both shards with a sound one between them: what the damage spares, and all of the sound one.
    both = sluice.data.list_files([cut, os.path.join(SHARDS, "sample.tgz"), broken], shuffle=False)
    assert len(list(both.webdataset_reader(error_policy="skip"))) == 5 + 90 + 2


def test_writer_shards_read_back_by_tarfile_and_by_the_reader(tmp_path):
    images = numpy.random.default_rng(0).integers(0, 255, size=(25, 8, 8, 3), dtype=numpy.uint8)
    labels = numpy.arange(25, dtype=numpy.int64) % 7
    embeddings = numpy.arange(25 * 4, dtype=numpy.float32).reshape(25, 4)
    keys = numpy.array([f"sample{k:04d}" for k in range(25)])
    (sluice.data.from_tensor_slices({"__key__": keys, "image": images, "cls": labels, "npy": embeddings})
     .encode_image(field="image", output="jpg")
     .select_fields(keep=["__key__", "jpg", "cls", "npy"])
     .webdataset_writer(prefix=str(tmp_path / "shards"), max_records=10)
     .pipeline().run())
    shards = sorted(os.listdir(tmp_path))
    assert shards == ["shards-000000.tar", "shards-000001.tar", "shards-000002.tar"]
    by_tarfile = [s for shard in shards for s in samples_by_tarfile(str(tmp_path / shard))]
    assert [key for key, _ in by_tarfile] == keys.tolist()
    assert all(sorted(fields) == ["cls", "jpg", "npy"] for _, fields in by_tarfile)
    assert [int(fields["cls"]) for _, fields in by_tarfile] == labels.tolist()
    assert all(numpy.array_equal(numpy.load(io.BytesIO(fields["npy"])), embeddings[k]) for k, (_, fields) in enumerate(by_tarfile))
    back = list(sluice.data.list_files(str(tmp_path / "shards-*.tar"), shuffle=False).webdataset_reader())
    assert [e["__key__"].decode() for e in back] == keys.tolist()
    assert [int(e["cls"]) for e in back] == labels.tolist()
    assert all(numpy.array_equal(e["npy"], embeddings[k]) and e["jpg"] == fields["jpg"] for k, (e, (_, fields)) in enumerate(zip(back, by_tarfile)))


@pytest.mark.parametrize("compression, suffix", [("gzip", ".tar.gz"), ("zstd", ".tar.zst")])
def test_compressed_shards_round_trip(tmp_path, compression, suffix):
    texts = [f"line {k}".encode() for k in range(12)]
    (sluice.data.from_tensor_slices({"txt": numpy.array(texts)})
     .webdataset_writer(prefix=str(tmp_path / "c"), max_records=5, compression=compression)
     .pipeline().run())
    assert sorted(os.listdir(tmp_path)) == [f"c-00000{k}{suffix}" for k in range(3)]
    back = list(sluice.data.list_files(str(tmp_path / f"c-*{suffix}"), shuffle=False).webdataset_reader())
    assert [e["txt"] for e in back] == texts
    assert [e["__key__"] for e in back] == [f"{k:09d}".encode() for k in range(12)]
    if compression == "gzip":  # Python's tarfile reads gzip itself
        assert [f["txt"] for _, f in samples_by_tarfile(str(tmp_path / "c-000000.tar.gz"))] == texts[:5]


def test_a_rerun_with_fewer_shards_leaves_none_of_the_old_ones(tmp_path):
    for count in (30, 12):
        (sluice.data.from_tensor_slices({"txt": numpy.array([b"x"] * count)})
         .webdataset_writer(prefix=str(tmp_path / "s"), max_records=10).pipeline().run())
    assert sorted(os.listdir(tmp_path)) == ["s-000000.tar", "s-000001.tar"]


def test_brace_patterns_name_shards_as_webdataset_does(tmp_path):
    (sluice.data.from_tensor_slices({"txt": numpy.array([b"x"] * 30)})
     .webdataset_writer(prefix=str(tmp_path / "shards"), max_records=10).pipeline().run())

    def listed(pattern):
        return [os.path.basename(path.decode()) for path in sluice.data.list_files(pattern, shuffle=False)]
    assert listed(str(tmp_path / "shards-{000000..000002}.tar")) == ["shards-000000.tar", "shards-000001.tar", "shards-000002.tar"]
    assert listed(str(tmp_path / "shards-{000002,000000}.tar")) == ["shards-000002.tar", "shards-000000.tar"]  # as written
    assert listed([str(tmp_path / "shards-00000{0..1}.tar"), str(tmp_path / "shards-000002.tar")]) == [
        "shards-000000.tar", "shards-000001.tar", "shards-000002.tar"]
    with pytest.raises(sluice.PipelineError, match=r"shards-000003\.tar' \(of '.*shards-\{000000\.\.000004\}\.tar'\) matches no file"):
        listed(str(tmp_path / "shards-{000000..000004}.tar"))
    reader = sluice.data.list_files(str(tmp_path / "shards-{000000..000002}.tar"), shuffle=False).webdataset_reader()
    assert len(list(reader)) == 30
