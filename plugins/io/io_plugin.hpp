#pragma once
#include <optional>
#include <string>
#include <vector>

#include "file_patterns.hpp"  // MatchedFile, match_files
#include "sluice/sdk.hpp"

namespace sluice::io {

void register_files(Registrar& registrar);     // list_files, read_file, label_from_path
void register_tfrecord(Registrar& registrar);  // tfrecord_reader, parse_example, tfrecord_writer, array_record_reader, array_record_writer
void register_csv(Registrar& registrar);       // csv_reader
void register_text(Registrar& registrar);      // text_lines, fixed_length_records
void register_tfds(Registrar& registrar);      // tfds, tfds_reader, tfds_writer
void register_webdataset(Registrar& registrar);  // webdataset_reader, webdataset_writer
void register_random_access(Registrar& registrar);  // random_access, tfrecord_index

}  // namespace sluice::io
