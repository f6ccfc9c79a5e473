#include "tfds_info.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "byte_source.hpp"
#include "text_scan.hpp"

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace sluice::io {
namespace {

constexpr const char* kDefaultTemplate = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}";

[[noreturn]] void refuse_in(const std::string& file, const std::string& why) { throw DataError(file + ": " + why); }

Json parse_json(const std::string& text, const std::string& path) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    refuse_in(path, std::string("is not valid JSON (") + e.what() + ")");
  }
}

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse_in(path, "cannot be read (is this a version folder of a prepared tensorflow_datasets dataset?)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_json(text.str(), path);
}

// Protobuf's JSON writes 64-bit integers as strings ("60000"); hand-written files use numbers.
std::int64_t json_int(const Json& v, const std::string& file, const std::string& what) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return n;
  }
  refuse_in(file, what + " is " + v.dump() + ", not a whole number");
}

std::string json_string(const Json& object, const char* key, const std::string& fallback = "") {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool newer_version(const std::string& a, const std::string& b) {  // "3.0.10" > "3.0.9"
  auto parts = [](const std::string& v) {
    std::vector<long> out;
    std::stringstream in(v);
    for (std::string p; std::getline(in, p, '.');) out.push_back(std::strtol(p.c_str(), nullptr, 10));
    return out;
  };
  return parts(a) > parts(b);
}

// Whether a shard file name template names a file outside the version folder.
bool leaves_its_folder(const std::string& name_template) {
  if (name_template.empty() || name_template.front() == '/' || name_template.find("://") != std::string::npos) return true;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = name_template.find_first_of("/\\", start);
    if (name_template.substr(start, slash == std::string::npos ? std::string::npos : slash - start) == "..") return true;
    if (slash == std::string::npos) return false;
    start = slash + 1;
  }
}

std::vector<TfdsSplit> read_splits(const Json& info, const std::string& file) {
  auto splits = info.find("splits");
  if (splits == info.end() || !splits->is_array() || splits->empty()) refuse_in(file, "lists no \"splits\"");
  std::vector<TfdsSplit> out;
  for (const Json& s : *splits) {
    TfdsSplit split;
    split.shards.name = json_string(s, "name");
    if (split.shards.name.empty()) refuse_in(file, "has a split with no \"name\"");
    auto lengths = s.find("shardLengths");
    if (lengths == s.end() || !lengths->is_array())
      refuse_in(file, "split '" + split.shards.name + "' has no \"shardLengths\" (written by a TFDS older than 4.0): prepare the "
                   "dataset again with a current tensorflow_datasets");
    for (const Json& n : *lengths) {
      const std::int64_t length = json_int(n, file, "a shard length of split '" + split.shards.name + "'");
      if (length < 0) refuse_in(file, "split '" + split.shards.name + "' has a negative shard length");
      split.shards.shard_lengths.push_back(static_cast<std::uint64_t>(length));
    }
    split.filepath_template = json_string(s, "filepathTemplate", kDefaultTemplate);
    if (leaves_its_folder(split.filepath_template))
      refuse_in(file, "split '" + split.shards.name + "' has filepathTemplate '" + split.filepath_template +
                          "', which leaves the version folder (an absolute path or a '..' segment); TFDS writes shards beside "
                          "dataset_info.json: prepare the dataset again, or fix the template");
    if (auto bytes = s.find("numBytes"); bytes != s.end()) split.num_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, json_int(*bytes, file, "numBytes")));
    out.push_back(std::move(split));
  }
  return out;
}

// {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": "label"}]}} (TFDS 4.7 and later) or
// {"input": "image", "output": "label"} (before).
std::optional<std::pair<std::string, std::string>> read_supervised_keys(const Json& info, const std::string& file) {
  auto keys = info.find("supervisedKeys");
  if (keys == info.end() || !keys->is_object()) return std::nullopt;
  if (keys->contains("input") && keys->contains("output")) return std::make_pair(json_string(*keys, "input"), json_string(*keys, "output"));
  auto tuple = keys->find("tuple");
  if (tuple == keys->end()) refuse_in(file, "\"supervisedKeys\" is neither {input, output} nor a tuple of feature keys");
  auto items = tuple->find("items");
  if (items == tuple->end() || !items->is_array() || items->size() != 2)
    refuse_in(file, "\"supervisedKeys\" is not a pair of feature keys (as_supervised gives (input, target) pairs only)");
  std::vector<std::string> names;
  for (const Json& item : *items) {
    const std::string key = json_string(item, "featureKey");
    if (key.empty()) refuse_in(file, "\"supervisedKeys\" holds an item that is not a featureKey (nested structures are not read)");
    names.push_back(key);
  }
  return std::make_pair(names[0], names[1]);
}

Shape read_shape(const Json& content, const std::string& file, const std::string& feature) {
  Shape shape;
  auto s = content.find("shape");
  if (s == content.end()) return shape;
  auto dims = s->find("dimensions");
  if (dims == s->end()) return shape;  // a scalar: protobuf's JSON leaves an empty list out
  for (const Json& d : *dims) shape.push_back(d.is_null() ? -1 : std::max<std::int64_t>(-1, json_int(d, file, "a dimension of '" + feature + "'")));
  return shape;
}

class FeatureReader {
 public:
  explicit FeatureReader(std::string file) : file_(std::move(file)) {}

  void read(const Json& feature, const std::string& name, bool in_sequence) {
    if (!feature.is_object()) refuse_in(file_, "feature '" + name + "' is not an object");
    if (feature.contains("type") && feature.contains("content"))
      refuse_in(file_, "is in the format of TFDS before 4.0 (\"type\" and \"content\"); prepare the dataset again with a current "
                    "tensorflow_datasets");
    const std::string cls = json_string(feature, "pythonClassName");
    if (auto dict = feature.find("featuresDict"); dict != feature.end()) {
      auto members = dict->find("features");
      if (members == dict->end() || !members->is_object()) refuse_in(file_, "FeaturesDict '" + name + "' has no \"features\"");
      for (auto it = members->begin(); it != members->end(); ++it) read(it.value(), name.empty() ? it.key() : name + "/" + it.key(), in_sequence);
      return;
    }
    if (auto seq = feature.find("sequence"); seq != feature.end()) {
      auto inner = seq->find("feature");
      if (inner == seq->end()) refuse_in(file_, "Sequence '" + name + "' has no \"feature\"");
      if (in_sequence)
        refuse_in(file_, "feature '" + name + "' is a sequence of sequences (stored ragged by TFDS), which Sluice does not read yet");
      read(*inner, name, true);
      return;
    }
    TfdsFeature f;
    f.name = name;
    f.sequence = in_sequence;
    if (auto c = feature.find("image"); c != feature.end()) {
      f.kind = TfdsFeature::Kind::Image;
      f.shape = read_shape(*c, file_, name);
      f.tfds_dtype = json_string(*c, "dtype", "uint8");
      f.encoding_format = json_string(*c, "encodingFormat");
      f.dtype = DType::Bytes;  // encoded; decode_image makes the pixels
    } else if (auto c = feature.find("classLabel"); c != feature.end()) {
      f.kind = TfdsFeature::Kind::ClassLabel;
      f.tfds_dtype = "int64";
      f.dtype = DType::I64;
      if (auto n = c->find("numClasses"); n != c->end()) f.num_classes = json_int(*n, file_, "numClasses of '" + name + "'");
    } else if (feature.contains("text")) {
      f.kind = TfdsFeature::Kind::Text;
      f.tfds_dtype = "string";
      f.dtype = DType::Bytes;
    } else if (auto c = feature.find("video"); c != feature.end()) {
      f.kind = TfdsFeature::Kind::Video;  // encoded frames, one per item
      f.tfds_dtype = json_string(*c, "dtype", "uint8");
      f.shape = read_shape(*c, file_, name);
      f.dtype = DType::Bytes;
      if (in_sequence) refuse_in(file_, "feature '" + name + "' is a sequence of videos (stored ragged by TFDS), which Sluice does not read yet");
    } else {
      read_tensor(feature, cls, f);
    }
    if (in_sequence) f.shape.insert(f.shape.begin(), -1);
    const auto open = std::count(f.shape.begin(), f.shape.end(), -1);
    if (f.dtype != DType::Bytes && open > 1)
      refuse_in(file_, "feature '" + name + "' has " + std::to_string(open) + " dimensions of unknown size (" + shape_string(f.shape) +
                    "), which TFDS stores ragged; Sluice reads at most one");
    features_.push_back(std::move(f));
  }

  std::vector<TfdsFeature> take() { return std::move(features_); }

 private:
  void read_tensor(const Json& feature, const std::string& cls, TfdsFeature& f) {
    const Json* content = nullptr;
    for (const char* key : {"tensor", "boundingBox", "audio"})
      if (auto c = feature.find(key); c != feature.end()) {
        content = &*c;
        f.kind = std::string(key) == "tensor" ? TfdsFeature::Kind::Tensor
                 : std::string(key) == "audio" ? TfdsFeature::Kind::Audio
                                               : TfdsFeature::Kind::BoundingBox;
      }
    if (!content)
      refuse_in(file_, "feature '" + f.name + "' is a " + (cls.empty() ? std::string("feature") : cls) +
                    ", which Sluice does not know how to read (it reads FeaturesDict, Sequence, Image, ClassLabel, Tensor, "
                    "Scalar, Text, BBoxFeature, Audio and Video); select the features you need with parse_example instead");
    const std::string encoding = json_string(*content, "encoding", "none");
    if (encoding != "none" && !encoding.empty())
      refuse_in(file_, "feature '" + f.name + "' is stored with encoding '" + encoding +
                    "', which Sluice does not decode yet; read it as bytes with parse_example");
    f.shape = read_shape(*content, file_, f.name);
    f.tfds_dtype = json_string(*content, "dtype", f.kind == TfdsFeature::Kind::BoundingBox ? "float32" : "");
    if (f.tfds_dtype.empty()) refuse_in(file_, "feature '" + f.name + "' gives no dtype");
    try {
      f.dtype = tfds_dtype(f.tfds_dtype);
    } catch (const ParamError& e) {
      refuse_in(file_, "feature '" + f.name + "': " + e.what());
    }
  }

  std::string file_;
  std::vector<TfdsFeature> features_;
};

// `features` gives features.json's content once dataset_info.json is found readable: a dataset of
// another format is refused for that, before its features are looked at.
TfdsDataset dataset_from_json(const Json& info, const std::function<Json()>& features, const std::string& dir);

}  // namespace

DType tfds_dtype(const std::string& name) {
  if (name == "uint8" || name == "bool") return DType::U8;
  if (name == "int8" || name == "int16") return DType::I16;
  if (name == "uint16" || name == "int32") return DType::I32;
  if (name == "uint32" || name == "int64" || name == "uint64") return DType::I64;
  if (name == "float16" || name == "bfloat16" || name == "float32") return DType::F32;
  if (name == "float64") return DType::F64;
  if (name == "string") return DType::Bytes;
  throw ParamError("dtype '" + name + "' is not one of TFDS's (bool, int8 to int64, uint8 to uint64, float16, bfloat16, float32, float64, string)");
}

const char* tfds_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::U8: return "uint8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::Bytes: return "string";
  }
  return "string";
}

std::vector<SplitShards> TfdsDataset::split_shards() const {
  std::vector<SplitShards> out;
  for (const auto& s : splits) out.push_back(s.shards);
  return out;
}

const TfdsSplit& TfdsDataset::split(const std::string& wanted) const {
  for (const auto& s : splits)
    if (s.shards.name == wanted) return s;
  throw DataError(dir + ": no split '" + wanted + "'");
}

std::string TfdsDataset::shard_path(const std::string& split_name, std::size_t shard) const {
  const TfdsSplit& s = split(split_name);
  char numbered[64];
  std::snprintf(numbered, sizeof numbered, "%05zu-of-%05zu", shard, s.shards.shard_lengths.size());
  std::string path = s.filepath_template;
  auto put = [&](const std::string& key, const std::string& value) {
    for (auto at = path.find(key); at != std::string::npos; at = path.find(key, at + value.size())) path.replace(at, key.size(), value);
  };
  put("{DATASET}", name);
  put("{SPLIT}", split_name);
  put("{FILEFORMAT}", file_format);
  put("{SHARD_X_OF_Y}", numbered);
  put("{SHARD_INDEX}", std::to_string(shard));
  put("{NUM_SHARDS}", std::to_string(s.shards.shard_lengths.size()));
  return (fs::path(dir) / path).string();
}

namespace {
// A dataset's folder in a bucket (BASE = DATA_DIR/NAME[/CONFIG]): its version folders are the
// prefixes BASE/VERSION/ holding a dataset_info.json, found in one listing.
std::string find_remote_tfds_version(const std::string& base, const std::string& dataset, const std::string& version, bool has_config,
                                     Storage* storage) {
  if (!storage) throw DataError("cannot read " + base + ": remote URIs are read through a Sluice engine");
  std::string newest;
  bool any = false;
  for (const auto& object : storage->list(base + "/")) {
    any = true;
    const std::string rest = object.uri.substr(base.size() + 1);  // VERSION/dataset_info.json
    const std::size_t slash = rest.find('/');
    if (slash == std::string::npos || rest.substr(slash + 1) != "dataset_info.json") continue;
    const std::string v = rest.substr(0, slash);
    if (!version.empty() ? v == version : scan::version(v) && (newest.empty() || newer_version(v, newest))) newest = v;
  }
  if (!any)
    throw DataError("no dataset '" + dataset + "' in " + base.substr(0, base.size() - dataset.size() - 1) + " (nothing is stored under " + base +
                    "/): copy the prepared dataset there (gsutil -m cp -r, aws s3 sync), or set data_dir");
  if (newest.empty() && !version.empty())
    throw DataError("version " + version + " of '" + dataset + "' is not prepared in " + base + " (no " + base + "/" + version + "/dataset_info.json)");
  if (newest.empty())
    throw DataError(base + " holds no prepared version (a folder such as 3.0.1 with a dataset_info.json)" +
                    (has_config ? std::string() : "; if the dataset has configs, name one: " + dataset + "/CONFIG"));
  return base + "/" + newest;
}
}  // namespace

std::string find_tfds_dataset(const std::string& data_dir, const std::string& name, Storage* storage) {
  // NAME[/CONFIG][:VERSION], NAME and CONFIG of word characters, '.' and '-'.
  const std::size_t colon = name.find(':'), slash = name.find('/');
  const std::string dataset = name.substr(0, colon), version = colon == std::string::npos ? "" : name.substr(colon + 1);
  const bool well_formed = scan::name(std::string_view(dataset).substr(0, slash), ".-") &&
                           (slash == std::string::npos || (slash < dataset.size() && scan::name(std::string_view(dataset).substr(slash + 1), ".-"))) &&
                           (colon == std::string::npos || scan::version(version));
  if (!well_formed)
    throw ParamError("name '" + name + "' is not NAME, NAME:VERSION, NAME/CONFIG or NAME/CONFIG:VERSION (as mnist, mnist:3.0.1, "
                     "imagenet2012/subset:5.0.0)");
  const fs::path base = fs::path(data_dir) / dataset;
  if (is_remote_uri(data_dir)) return find_remote_tfds_version(base.string(), dataset, version, slash != std::string::npos, storage);
  std::error_code ec;
  if (!fs::is_directory(base, ec))
    throw DataError("no dataset '" + dataset + "' in " + data_dir + " (" + base.string() +
                    " is not a folder): prepare it with tfds.builder(...).download_and_prepare(), or set data_dir");
  if (!version.empty()) {
    const fs::path dir = base / version;
    if (!fs::exists(dir / "dataset_info.json", ec))
      throw DataError("version " + version + " of '" + dataset + "' is not prepared in " + base.string() +
                      " (no dataset_info.json in " + dir.string() + ")");
    return dir.string();
  }
  std::string newest;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const std::string v = entry.path().filename().string();
    if (!scan::version(v) || !fs::exists(entry.path() / "dataset_info.json", ec)) continue;
    if (newest.empty() || newer_version(v, newest)) newest = v;
  }
  if (newest.empty())
    throw DataError(base.string() + " holds no prepared version (a folder such as 3.0.1 with a dataset_info.json)" +
                    (slash != std::string::npos ? std::string() : "; if the dataset has configs, name one: " + dataset + "/CONFIG"));
  return (base / newest).string();
}

TfdsDataset read_tfds_dataset(const std::string& dir, Storage* storage) {
  const std::string info_file = (fs::path(dir) / "dataset_info.json").string();
  const std::string features_file = (fs::path(dir) / "features.json").string();
  if (is_remote_uri(dir)) return parse_tfds_dataset(read_remote_text(info_file, storage), read_remote_text(features_file, storage), dir);
  return dataset_from_json(read_json(info_file), [&] { return read_json(features_file); }, dir);
}

TfdsDataset parse_tfds_dataset(const std::string& info_text, const std::string& features_text, const std::string& dir) {
  const std::string info_file = (fs::path(dir) / "dataset_info.json").string();
  const std::string features_file = (fs::path(dir) / "features.json").string();
  return dataset_from_json(parse_json(info_text, info_file), [&] { return parse_json(features_text, features_file); }, dir);
}

namespace {

TfdsDataset dataset_from_json(const Json& info, const std::function<Json()>& features_json, const std::string& dir) {
  TfdsDataset ds;
  ds.dir = dir;
  const std::string info_file = (fs::path(dir) / "dataset_info.json").string();
  if (!info.is_object()) refuse_in(info_file, "is not a JSON object");
  ds.name = json_string(info, "name");
  ds.version = json_string(info, "version");
  if (ds.name.empty()) refuse_in(info_file, "has no \"name\"");
  ds.file_format = json_string(info, "fileFormat", "tfrecord");
  if (ds.file_format != "tfrecord" && ds.file_format != "array_record")
    refuse_in(info_file, "says fileFormat \"" + ds.file_format + "\"; Sluice reads TFDS datasets written as tfrecord or array_record: "
                         "prepare it with tfds.builder(name, file_format='array_record').download_and_prepare()");
  ds.splits = read_splits(info, info_file);
  ds.supervised_keys = read_supervised_keys(info, info_file);

  const std::string features_file = (fs::path(dir) / "features.json").string();
  FeatureReader features(features_file);
  features.read(features_json(), "", false);
  ds.features = features.take();
  if (ds.features.empty()) refuse_in(features_file, "describes no feature");
  if (ds.supervised_keys)
    for (const std::string& key : {ds.supervised_keys->first, ds.supervised_keys->second})
      if (std::none_of(ds.features.begin(), ds.features.end(), [&](const TfdsFeature& f) { return f.name == key; }))
        refuse_in(info_file, "names supervised key '" + key + "', which features.json does not describe");
  return ds;
}

}  // namespace

namespace {

Json dimensions_json(const Shape& shape) {
  Json dims = Json::array();
  for (auto d : shape) dims.push_back(std::to_string(d));
  Json out = Json::object();
  if (!shape.empty()) out["dimensions"] = dims;  // protobuf's JSON leaves an empty list out
  return out;
}

Json feature_json(const TfdsFeature& f) {
  Json j = Json::object();
  if (f.sequence) {  // its items' feature, inside a Sequence of the shape's first dimension
    TfdsFeature item = f;
    item.sequence = false;
    item.shape.erase(item.shape.begin());
    j["pythonClassName"] = "tensorflow_datasets.core.features.sequence_feature.Sequence";
    j["sequence"] = {{"feature", feature_json(item)}, {"length", std::to_string(f.shape.front())}};
    return j;
  }
  switch (f.kind) {
    case TfdsFeature::Kind::Image:
      j["pythonClassName"] = "tensorflow_datasets.core.features.image_feature.Image";
      j["image"] = {{"shape", dimensions_json(f.shape)}, {"dtype", "uint8"}};
      if (!f.encoding_format.empty()) j["image"]["encodingFormat"] = f.encoding_format;
      break;
    case TfdsFeature::Kind::ClassLabel:
      j["pythonClassName"] = "tensorflow_datasets.core.features.class_label_feature.ClassLabel";
      j["classLabel"] = {{"numClasses", std::to_string(f.num_classes)}};
      break;
    case TfdsFeature::Kind::Text:
      j["pythonClassName"] = "tensorflow_datasets.core.features.text_feature.Text";
      j["text"] = Json::object();
      break;
    default:
      j["pythonClassName"] = "tensorflow_datasets.core.features.tensor_feature.Tensor";
      j["tensor"] = {{"shape", dimensions_json(f.shape)}, {"dtype", f.tfds_dtype.empty() ? tfds_dtype_name(f.dtype) : f.tfds_dtype},
                     {"encoding", "none"}};
  }
  return j;
}

Json features_dict() {
  return {{"pythonClassName", "tensorflow_datasets.core.features.features_dict.FeaturesDict"}, {"featuresDict", {{"features", Json::object()}}}};
}

}  // namespace

namespace {

Json features_dict_of(const std::vector<TfdsFeature>& features) {
  Json root = features_dict();
  for (const auto& f : features) {
    Json* level = &root;
    std::string rest = f.name;
    for (auto slash = rest.find('/'); slash != std::string::npos; slash = rest.find('/')) {
      Json& members = (*level)["featuresDict"]["features"];
      const std::string key = rest.substr(0, slash);
      if (!members.contains(key)) members[key] = features_dict();
      if (!members[key].contains("featuresDict"))
        throw DataError("field '" + f.name + "' nests under '" + key + "', which is a field of its own; rename one of them");
      level = &members[key];
      rest = rest.substr(slash + 1);
    }
    (*level)["featuresDict"]["features"][rest] = feature_json(f);
  }
  return root;
}

}  // namespace

std::string tfds_features_json(const std::vector<TfdsFeature>& given, const std::string& existing, const std::string& file) {
  if (existing.empty()) return features_dict_of(given).dump(2);
  Json before;
  try {
    before = Json::parse(existing);
  } catch (const Json::exception& e) {
    refuse_in(file, std::string("is not valid JSON (") + e.what() + "); remove it, or write to another data_dir");
  }
  FeatureReader reader(file);
  reader.read(before, "", false);
  std::vector<TfdsFeature> old = reader.take(), features = given;
  // What one split saw of a feature is not all the dataset holds: a split with fewer classes, or
  // whose images or tensors happen to share a size, still fits the others. A ClassLabel counts
  // the most classes either says, a dimension that differs is left open, two image formats are
  // either.
  for (auto& f : features)
    for (auto& o : old) {
      if (o.name != f.name || o.kind != f.kind || o.dtype != f.dtype || o.sequence != f.sequence || o.shape.size() != f.shape.size()) continue;
      f.num_classes = o.num_classes = std::max(o.num_classes, f.num_classes);
      for (std::size_t d = 0; d < f.shape.size(); ++d)
        if (f.shape[d] != o.shape[d]) f.shape[d] = o.shape[d] = -1;
      if (f.encoding_format != o.encoding_format) f.encoding_format = o.encoding_format = "";
      if (f.tfds_dtype.empty()) f.tfds_dtype = o.tfds_dtype;
    }
  std::string differs;
  for (const auto& f : features) {
    auto same = std::find_if(old.begin(), old.end(), [&](const TfdsFeature& o) { return o.name == f.name; });
    if (same == old.end()) differs = "field '" + f.name + "' is new";
    else if (feature_json(*same) != feature_json(f))
      differs = "field '" + f.name + "' is " + feature_json(f).dump() + " here, " + feature_json(*same).dump() + " there";
    if (!differs.empty()) break;
  }
  if (differs.empty() && old.size() != features.size()) differs = "fields are missing here that it describes";
  if (!differs.empty())
    refuse_in(file, "describes other features than this split's (" + differs +
                        "); the splits of a dataset share their features: write to another version or data_dir");
  return features_dict_of(old).dump(2);  // the file's order, with its class counts brought up to date
}

std::string tfds_dataset_info_json(const std::string& existing, const std::string& file, const std::string& name,
                                   const std::string& version, const TfdsSplit& split,
                                   const std::optional<std::pair<std::string, std::string>>& supervised_keys,
                                   const std::string& description) {
  Json info = Json::object();
  if (!existing.empty()) {
    try {
      info = Json::parse(existing);
    } catch (const Json::exception& e) {
      refuse_in(file, std::string("is not valid JSON (") + e.what() + "); remove it, or write to another data_dir");
    }
    if (json_string(info, "name") != name || json_string(info, "version") != version)
      refuse_in(file, "describes dataset '" + json_string(info, "name") + "' version " + json_string(info, "version") + ", not '" + name +
                          "' version " + version + "; write to another folder");
  }
  info["name"] = name;
  info["version"] = version;
  info["fileFormat"] = "tfrecord";
  if (!description.empty() || !info.contains("description")) info["description"] = description;
  Json entry = {{"name", split.shards.name}, {"numBytes", std::to_string(split.num_bytes)}, {"shardLengths", Json::array()},
                {"filepathTemplate", split.filepath_template}};
  for (auto n : split.shards.shard_lengths) entry["shardLengths"].push_back(std::to_string(n));
  Json splits = Json::array();
  bool placed = false;
  if (info.contains("splits") && info["splits"].is_array())
    for (const Json& s : info["splits"]) {
      if (json_string(s, "name") == split.shards.name) {
        splits.push_back(entry);
        placed = true;
      } else {
        splits.push_back(s);
      }
    }
  if (!placed) splits.push_back(entry);
  info["splits"] = splits;
  if (supervised_keys)
    info["supervisedKeys"] = {{"tuple", {{"items", {{{"featureKey", supervised_keys->first}}, {{"featureKey", supervised_keys->second}}}}}}};
  return info.dump(2);
}

std::vector<FeatureSpec> tfds_example_spec(const std::vector<TfdsFeature>& features) {
  std::vector<FeatureSpec> spec;
  for (const auto& f : features) {
    FeatureSpec s;
    s.name = f.name;
    s.kind = f.dtype == DType::Bytes ? FeatureKind::Bytes
             : (f.dtype == DType::F32 || f.dtype == DType::F64 || f.dtype == DType::F16 || f.dtype == DType::BF16) ? FeatureKind::Float
                                                                                                                : FeatureKind::Int64;
    const bool open = std::find(f.shape.begin(), f.shape.end(), -1) != f.shape.end();
    // An encoded image is one bytes value per item whatever its pixel shape; a video is a list of
    // encoded frames.
    if (f.kind == TfdsFeature::Kind::Video)
      s.var_len = true;
    else if (f.kind == TfdsFeature::Kind::Image)
      s.var_len = f.sequence;
    else if (open)
      s.var_len = true;
    else
      s.shape = f.shape;
    spec.push_back(std::move(s));
  }
  return spec;
}

}  // namespace sluice::io
