"""The records of the ArrayRecord cases, made the same way by the oracle (in the peers
environment) and by the tests (Sluice's Python): sizes from 0 bytes to 1 MiB, bytes that are not
text, records that compress and records that do not."""
import hashlib

# The array-record package's option strings, each written by the package and by array_record_writer.
OPTIONS = {
    "uncompressed-1": "uncompressed,group_size:1",
    "zstd-1": "zstd,group_size:1",
    "zstd-65536": "zstd:5,group_size:65536",
    "brotli-65536": "brotli,group_size:65536",
    "snappy-1": "snappy,group_size:1",
    "snappy-65536": "snappy,group_size:65536",
    "default": "",
}
SIZES = [0, 1, 2, 100, 1000, 4095, 65535, 65536, 65537, 200000, 1 << 20] + [i % 50 for i in range(300)]


def record(i):
    """Record i: a run of a counter's bytes (compressible), then pseudo-random bytes (not)."""
    size = SIZES[i]
    seed = hashlib.sha256(str(i).encode()).digest()
    noise = (seed * (size // 64 + 1))[:size // 2]
    return (bytes(range(256)) * (size // 512 + 1))[:size - len(noise)] + noise


def records():
    return [record(i) for i in range(len(SIZES))]


def digests(items):
    return [hashlib.sha256(r).hexdigest() for r in items]
