#pragma once
#include "sluice/sdk.hpp"

namespace sluice::io {

void register_files(Registrar& registrar);     // list_files, read_file, label_from_path
void register_tfrecord(Registrar& registrar);  // tfrecord_reader, parse_example, tfrecord_writer
void register_csv(Registrar& registrar);       // csv_reader
void register_text(Registrar& registrar);      // text_lines, fixed_length_records
void register_tfds(Registrar& registrar);      // tfds, tfds_reader, tfds_writer
void register_webdataset(Registrar& registrar);  // webdataset_reader, webdataset_writer

}  // namespace sluice::io
