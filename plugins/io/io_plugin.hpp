#pragma once
#include "sluice/sdk.hpp"

namespace sluice::io {

void register_files(Registrar& registrar);     // list_files, read_file, label_from_path
void register_tfrecord(Registrar& registrar);  // tfrecord_reader, parse_example, tfrecord_writer
void register_csv(Registrar& registrar);       // csv_reader
void register_text(Registrar& registrar);      // text_lines, fixed_length_records
void register_tfds(Registrar& registrar);      // tfds, tfds_reader, tfds_writer
void register_webdataset(Registrar& registrar);  // webdataset_reader, webdataset_writer
void register_random_access(Registrar& registrar);  // random_access, tfrecord_index

// The local files that list_files' patterns (globs, braces, comma lists) name, in their order;
// throws DataError for a pattern matching nothing and ParamError for a remote one (`op` refuses it).
std::vector<std::string> match_local_patterns(const std::vector<std::string>& patterns, const std::string& op);

}  // namespace sluice::io
