// libFuzzer target: what a stored dataset's files hold, all untrusted: a tensorflow_datasets
// directory's dataset_info.json and features.json (then a split expression resolved over its
// splits), a NumPy .npy member, and a WebDataset tar shard (through libarchive, from a file).
// The first byte picks the format.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tfds_info.hpp"
#include "tfds_split.hpp"
#include "webdataset_format.hpp"

namespace {

struct Refuse final : sluice::DamageReport {
  bool skip_damaged(const std::string&) override { return true; }  // read on as far as a shard can be
};

void tfds_metadata(std::string_view input) {
  // dataset_info.json, a NUL, features.json, a NUL, a split expression.
  const auto first = input.find('\0');
  const auto second = first == std::string_view::npos ? first : input.find('\0', first + 1);
  const std::string info(input.substr(0, first));
  const std::string features(first == std::string_view::npos ? "" : input.substr(first + 1, second == std::string_view::npos ? second : second - first - 1));
  const std::string split(second == std::string_view::npos ? "train" : input.substr(second + 1));
  const auto ds = sluice::io::parse_tfds_dataset(info, features, "/fuzz");
  sluice::io::tfds_example_spec(ds.features);
  sluice::io::tfds_features_json(ds.features, features, "/fuzz/features.json");
  for (const auto& range : sluice::io::resolve_split(split, ds.split_shards())) {
    for (const auto& read : sluice::io::shard_reads(range, ds.split(range.split).shards)) ds.shard_path(read.split, read.shard);
  }
}

void tar_shard(std::string_view input) {
  static const std::string path = "/tmp/fuzz_stored_" + std::to_string(::getpid()) + ".tar";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(input.data(), static_cast<std::streamsize>(input.size()));
  Refuse damage;
  sluice::io::WebDatasetShard shard(path);
  sluice::io::WebDatasetSample sample, first;
  for (int n = 0; n < 100000 && shard.next(sample, damage); ++n)
    if (n == 0) first = sample;
  if (!first.members.empty()) shard.seek(first.index, first.header_offset);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: tfds_metadata(input); break;
      case 1: sluice::io::parse_npy(input); break;
      default: tar_shard(input); break;
    }
  } catch (const std::runtime_error&) {  // Error, DataError, ParamError: refusals are fine
  }
  return 0;
}
