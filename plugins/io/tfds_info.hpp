#pragma once
// A prepared tensorflow_datasets directory as TFDS writes it: DATA_DIR/NAME[/CONFIG]/VERSION/ with
// dataset_info.json (the JSON form of TFDS's DatasetInfo message: splits, shard lengths, file
// format, shard name template, supervised keys), features.json (the JSON form of its Feature
// message) and the shards. Only metadata is read here; the shards are TFRecord files of
// tf.train.Examples whose keys are the features' names, nested dictionaries flattened with '/'.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "example_codec.hpp"
#include "sluice/sdk.hpp"
#include "tfds_split.hpp"

namespace sluice::io {

struct TfdsFeature {
  enum class Kind { Image, ClassLabel, Tensor, Text, BoundingBox, Audio, Video };
  std::string name;  // flattened: "objects/bbox"
  Kind kind = Kind::Tensor;
  DType dtype = DType::I64;    // what a reader hands out (TFDS's dtype, widened where Sluice has none)
  std::string tfds_dtype;      // as features.json says it: "uint8", "int64", "string"
  Shape shape;                 // -1 for a dimension TFDS leaves open; sequences add a leading -1
  bool sequence = false;       // inside a Sequence: a variable number of items per example
  std::int64_t num_classes = 0;      // ClassLabel
  std::string encoding_format;       // Image: png, jpeg, or "" (TFDS chose)
};

struct TfdsSplit {
  SplitShards shards;
  std::string filepath_template;  // "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
  std::uint64_t num_bytes = 0;
};

struct TfdsDataset {
  std::string dir;      // the version folder
  std::string name;     // "mnist"
  std::string version;  // "3.0.1"
  std::string file_format;  // "tfrecord" or "array_record"
  std::vector<TfdsSplit> splits;
  std::vector<TfdsFeature> features;  // flattened, in features.json's order
  std::optional<std::pair<std::string, std::string>> supervised_keys;  // (input, target)

  std::vector<SplitShards> split_shards() const;
  const TfdsSplit& split(const std::string& name) const;
  // The file holding shard `shard` of `split`, from the split's name template.
  std::string shard_path(const std::string& split, std::size_t shard) const;
};

// The version folder `name` designates under `data_dir`: "mnist", "mnist:3.0.1",
// "mnist/config", "mnist/config:1.2.0"; with no version, the newest one present that holds a
// dataset_info.json. Throws DataError naming what was looked for and what is there.
std::string find_tfds_dataset(const std::string& data_dir, const std::string& name, Storage* storage = nullptr);

// Reads the version folder's dataset_info.json and features.json. Throws DataError naming the file
// and the entry that is missing or malformed, and refuses what Sluice cannot read (a fileFormat
// other than tfrecord, features it does not know) saying what to do.
TfdsDataset read_tfds_dataset(const std::string& dir, Storage* storage = nullptr);

// tfds.load's data_dir: `given`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (tfds_ops.cpp).
std::string tfds_data_dir(const std::string& given);

// A feature's values as an Example parsed them (int64 or float32 lists, or bytes), in the
// feature's dtype and shape (tfds_ops.cpp); throws DataError naming the feature.
Tensor tfds_feature_tensor(const Tensor& parsed, const TfdsFeature& f);
// The same from the two files' text (the fuzz target's entry), named as the files of `dir`.
TfdsDataset parse_tfds_dataset(const std::string& info_text, const std::string& features_text, const std::string& dir);

// The parse_example spec of the dataset's features (every feature of an example, by its key).
std::vector<FeatureSpec> tfds_example_spec(const std::vector<TfdsFeature>& features);

// features.json for `features` as TFDS writes it (names with '/' nest FeaturesDicts). With the text
// of an existing features.json (`existing`, read from `file`), refuses features that differ from
// it, naming the file and the feature: the splits of one dataset share its features.
std::string tfds_features_json(const std::vector<TfdsFeature>& features, const std::string& existing = "",
                               const std::string& file = "");

// dataset_info.json as TFDS writes it, with `split` (its shard lengths, bytes and name template)
// put in place of a split of its name in `existing` (the text of the file there, or empty), the
// other splits kept. Refuses an existing file of another dataset name or version.
std::string tfds_dataset_info_json(const std::string& existing, const std::string& file, const std::string& name,
                                   const std::string& version, const TfdsSplit& split,
                                   const std::optional<std::pair<std::string, std::string>>& supervised_keys,
                                   const std::string& description);

// TFDS's dtype names and Sluice's: "uint8" -> U8; "bool" -> U8, "int8" -> I16, "uint16" -> I32,
// "uint32" and "uint64" -> I64, "float16" and "bfloat16" -> F32 (widened: Sluice has no such
// dtype, or none that tf.train.Example's float list converts to exactly); "string" -> Bytes.
// Throws ParamError for a name it does not know.
DType tfds_dtype(const std::string& name);
// The TFDS name of a Sluice dtype, for writing features.json.
const char* tfds_dtype_name(DType dtype);

}  // namespace sluice::io
