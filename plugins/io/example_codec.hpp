#pragma once
// tf.train.Example and SequenceExample, read straight from the wire format (field numbers of
// TensorFlow's example.proto and feature.proto; see proto/example.proto) so that a bytes feature
// such as an encoded image becomes a view of the record, not a copy. Packed and unpacked repeated
// values, map entries in any order and an empty Feature (no kind set) are all accepted.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/sdk.hpp"

namespace sluice::io {

enum class FeatureKind { Bytes, Int64, Float };
const char* feature_kind_name(FeatureKind kind);

// One entry of a feature spec: NAME:DTYPE, NAME:DTYPE[SHAPE] or NAME:DTYPE[] (variable length),
// optionally =DEFAULT (one value, repeated to fill the shape, or [v1,v2,...]).
struct FeatureSpec {
  std::string name;
  FeatureKind kind = FeatureKind::Bytes;
  Shape shape;  // fixed shape; empty for a scalar
  bool var_len = false;
  std::optional<std::vector<std::string>> default_values;
};

// Parses "image/encoded:bytes, label:int64=0, x:float[10], xmin:float[]". Throws ParamError.
std::vector<FeatureSpec> parse_feature_spec(const std::string& text);

class ExampleParser {
 public:
  // With sequence features, records are SequenceExamples (context features + feature lists).
  ExampleParser(std::vector<FeatureSpec> features, std::vector<FeatureSpec> sequence_features);

  // Decodes `length` bytes at `offset` of `buffer` into fields of `out`. Throws DataError naming
  // the feature; the caller adds the record's origin.
  void parse(const std::shared_ptr<Buffer>& buffer, std::size_t offset, std::size_t length, Sample& out) const;
  bool sequence() const { return !sequence_.empty(); }

  // Chunks: with every feature of a fixed shape (bytes features scalar) and no sequence features,
  // records parse straight into one column per feature.
  bool columnar() const;
  // Parses the records of `records` (a column of scalar bytes, `rows` of them) into one column
  // per feature, in the spec's order, added to `out`; `kept` lists the rows parsed, in order. A
  // record parse() would refuse goes to issues.skip_row() with parse()'s reason (the caller's
  // origin added), and is thrown as RowError when refused.
  void parse_rows(const Column& records, std::size_t rows, Chunk& out, std::vector<std::size_t>& kept, RowIssues& issues) const;

 private:
  std::vector<FeatureSpec> features_, sequence_;
  // Feature name -> position in the spec, built once rather than per record.
  std::unordered_map<std::string_view, std::size_t> feature_index_, sequence_index_;
};

// Serialises a sample as a tf.train.Example: bytes fields as BytesList, integer fields as
// Int64List, floating-point fields as FloatList (all values, row-major).
std::string encode_example(const Sample& sample);

}  // namespace sluice::io
