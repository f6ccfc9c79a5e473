"""ArrayRecord against the array-record package itself: files the package wrote (each compression
it offers, group sizes 1 and 65,536, records of 0 bytes to 1 MiB) read by Sluice record for record,
in order and at random; the files array_record_writer writes read by the package (its reader and
Grain's ArrayRecordDataSource) record for record; damage named by file, chunk and byte."""
import json
import os

import pytest

import sluice
import sluice.data
from array_record_cases import OPTIONS, digests, records
from peers import damaged_copy, run_oracle


@pytest.fixture(scope="module")
def package_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("array_record_written")
    run_oracle("oracle_array_record.py", "write", folder)
    return folder


def read_records(dataset):
    return [bytes(r) for r in dataset]


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_files_of_the_package_read_record_for_record(package_files, case):
    path = str(package_files / (case + ".array_record"))
    assert digests(read_records(sluice.data.ArrayRecordDataset(path))) == digests(records())
    # At random, through the file's own footer: every record once, in a permutation.
    shuffled = read_records(sluice.data.random_access(patterns=[path], seed=3).map(lambda e: e["record"]))
    assert sorted(digests(shuffled)) == sorted(digests(records())) and digests(shuffled) != digests(records())


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_files_of_array_record_writer_read_by_the_package(tmp_path, case):
    (sluice.data.from_tensor_slices({"record": records()})
     .array_record_writer(prefix=str(tmp_path / case), options=OPTIONS[case]).pipeline().run())
    written = str(tmp_path / (case + "-00000-of-00001.array_record"))
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(written)]
    out = tmp_path / "read.json"
    run_oracle("oracle_array_record.py", "read", out, written)
    read = json.loads(out.read_text())[written]
    assert read["records"] == read["random"] == digests(records())
    assert read["options"].startswith("group_size:")  # (recorded in the package's own form)
    if OPTIONS[case]:
        for option in OPTIONS[case].split(","):
            assert option.split(":")[0] in read["options"]


def test_uncompressed_files_are_byte_for_byte_the_packages(package_files, tmp_path):
    """Riegeli's framing as the package writes it: block headers, hashes, padding, footer,
    postscript; the chunks' data too when nothing is compressed."""
    (sluice.data.from_tensor_slices({"record": records()})
     .array_record_writer(prefix=str(tmp_path / "ours"), options=OPTIONS["uncompressed-1"]).pipeline().run())
    ours = (tmp_path / "ours-00000-of-00001.array_record").read_bytes()
    assert len(ours) > 1 << 20 and ours == (package_files / "uncompressed-1.array_record").read_bytes()


def chunk_offsets(path):
    """Each record's chunk's first byte, as the reader names it (field 'offset')."""
    return [int(e["offset"]) for e in sluice.data.list_files([path], shuffle=False).array_record_reader()]


def test_a_flipped_bit_is_named_by_file_chunk_and_byte_and_skipped_under_skip(package_files, tmp_path):
    source = str(package_files / "uncompressed-1.array_record")
    offsets = chunk_offsets(source)
    assert offsets == sorted(set(offsets)) and len(offsets) == len(records())  # a chunk per record
    broken = damaged_copy(source, tmp_path, flip=offsets[5] + 60)  # inside record 5's data
    with pytest.raises(sluice.PipelineError, match=rf"{broken}, chunk at byte {offsets[5]}: its data's hash does not match"):
        read_records(sluice.data.ArrayRecordDataset(broken))
    kept = read_records(sluice.data.list_files([broken], shuffle=False).array_record_reader(error_policy="skip").map(lambda e: e["record"]))
    assert digests(kept) == digests(records()[:5] + records()[6:])


def test_a_truncated_file_is_named_never_read_past(package_files, tmp_path):
    source = str(package_files / "zstd-65536.array_record")
    size = os.path.getsize(source)
    for cut in (0, 10, 64, size // 2, size - 1):
        broken = damaged_copy(source, tmp_path, cut=cut)
        with pytest.raises(sluice.PipelineError, match=rf"{broken}"):
            read_records(sluice.data.ArrayRecordDataset(broken))


def test_a_transposed_file_is_refused_by_name(tmp_path):
    run_oracle("oracle_array_record.py", "write-transposed", tmp_path)
    path = str(tmp_path / "transposed.array_record")
    with pytest.raises(sluice.PipelineError, match="transposed chunk .*write the file with transpose:false"):
        read_records(sluice.data.ArrayRecordDataset(path))
