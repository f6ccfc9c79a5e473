"""The oracle of test_array_record.py, with the array-record package (in the peers environment).

  oracle_array_record.py write FOLDER      a file per case of array_record_cases.OPTIONS, written by
      array_record_module.ArrayRecordWriter with those options (NAME.array_record).
  oracle_array_record.py write-transposed FOLDER   transposed.array_record: transpose:true.
  oracle_array_record.py read OUT.json FILE...  each file as the package reads it: its records'
      SHA-256 in order, read by ArrayRecordReader, the same read at random by Grain's shape of
      it, ArrayRecordDataSource, and the options the writer recorded.
"""
import json
import os
import sys

from array_record.python import array_record_data_source, array_record_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from array_record_cases import OPTIONS, digests, records  # noqa: E402


def write(folder):
    for name, options in OPTIONS.items():
        writer = array_record_module.ArrayRecordWriter(os.path.join(folder, name + ".array_record"), options)
        for r in records():
            writer.write(r)
        writer.close()


def read(out, files):
    result = {}
    for path in files:
        reader = array_record_module.ArrayRecordReader(path)
        sequential = digests(reader.read_all())
        options = reader.writer_options_string()
        reader.close()
        source = array_record_data_source.ArrayRecordDataSource([path])
        backwards = [source[i] for i in reversed(range(len(source)))]
        result[path] = {"records": sequential, "random": digests(backwards[::-1]), "options": options}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "write-transposed":
        writer = array_record_module.ArrayRecordWriter(os.path.join(sys.argv[2], "transposed.array_record"), "transpose:true")
        for r in records()[:20]:
            writer.write(r)
        writer.close()
    else:
        read(sys.argv[2], sys.argv[3:])
