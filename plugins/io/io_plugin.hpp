#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sluice/sdk.hpp"

namespace sluice::io {

void register_files(Registrar& registrar);     // list_files, read_file, label_from_path
void register_tfrecord(Registrar& registrar);  // tfrecord_reader, parse_example, tfrecord_writer, array_record_reader, array_record_writer
void register_csv(Registrar& registrar);       // csv_reader
void register_text(Registrar& registrar);      // text_lines, fixed_length_records
void register_tfds(Registrar& registrar);      // tfds, tfds_reader, tfds_writer
void register_webdataset(Registrar& registrar);  // webdataset_reader, webdataset_writer
void register_random_access(Registrar& registrar);  // random_access, tfrecord_index

// A file the patterns matched: a local path, or an object with its size and ETag as the listing
// gave them (a URI without wildcards is not listed: its size is 0 and its ETag empty until opened).
struct MatchedFile {
  std::string path;
  std::optional<StoredObject> object;
};
// Every file or object the patterns match (globs, {a,b} and {000..009}, and remote URIs listed
// through `storage`), in pattern order; a pattern matching nothing is a DataError naming it.
std::vector<MatchedFile> match_files(const std::vector<std::string>& patterns, Storage* storage);

}  // namespace sluice::io
