// libFuzzer target: tf.train.Example / SequenceExample wire-format parsing against several specs,
// and, for the specs with fixed shapes, the chunked parser against the element parser: the same
// values or the same refusal, whatever the bytes.
#include <cstdint>
#include <cstring>

#include "example_codec.hpp"

namespace {
const sluice::io::ExampleParser& parser(int which) {
  static const sluice::io::ExampleParser parsers[] = {
      {sluice::io::parse_feature_spec("x_float:float[10], x_int:int64[10], x_byte:bytes"), {}},
      {sluice::io::parse_feature_spec("x_float:float[], x_int:int64[]=1, x_byte:bytes[], missing:bytes=none"), {}},
      {sluice::io::parse_feature_spec("x_int:int64[]"),
       sluice::io::parse_feature_spec("x_int_seq:int64[10], x_float_seq:float[], x_byte_seq:bytes[]")},
      {sluice::io::parse_feature_spec("image/encoded:bytes, image/height:int64=0, image/object/bbox/xmin:float[]"), {}},
      {sluice::io::parse_feature_spec("id:int64, label:int64=-1, x:float[3]=0.5, name:bytes=none"), {}},
  };
  return parsers[which % 5];
}

// Refusals as the engine's skip policy takes them: kept, so they can be compared.
struct Refusals final : sluice::RowIssues {
  std::string reason;
  bool skip_row(std::size_t, const std::string& why) override {
    reason = why;
    return true;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  auto buffer = std::make_shared<sluice::Buffer>(size - 1);
  if (size > 1) std::memcpy(buffer->data(), data + 1, size - 1);
  const auto& p = parser(data[0]);
  sluice::Sample out;
  std::string refused;
  try {
    p.parse(buffer, 0, size - 1, out);
    for (const auto& f : out.fields())
      if (f.tensor.dtype() == sluice::DType::Bytes)
        for (std::int64_t i = 0; i < f.tensor.num_elements(); ++i) (void)f.tensor.string_at(i).size();
  } catch (const sluice::Error& e) {
    refused = e.what();
  }
  if (!p.columnar()) return 0;
  // The same record as a chunk of one row: the same fields, bytes and refusal.
  sluice::Column records{"record", sluice::Column::Layout::Spans, {}, buffer, {{0, size - 1}}};
  sluice::Chunk chunk;
  std::vector<std::size_t> kept;
  Refusals refusals;
  p.parse_rows(records, 1, chunk, kept, refusals);
  if (refusals.reason != refused || kept.size() != (refused.empty() ? 1u : 0u)) __builtin_trap();
  if (!refused.empty()) return 0;
  chunk.set_rows(1);
  const sluice::Sample row = chunk.row(0);
  if (row.size() != out.size()) __builtin_trap();
  for (std::size_t f = 0; f < out.size(); ++f) {
    const auto& a = out.fields()[f];
    const auto& b = row.fields()[f];
    if (a.name != b.name || a.tensor.dtype() != b.tensor.dtype() || a.tensor.shape() != b.tensor.shape() || a.tensor.nbytes() != b.tensor.nbytes())
      __builtin_trap();
    if (a.tensor.dtype() == sluice::DType::Bytes) {
      if (a.tensor.string_at(0) != b.tensor.string_at(0)) __builtin_trap();
    } else if (a.tensor.nbytes() > 0 && std::memcmp(a.tensor.raw_data(), b.tensor.raw_data(), a.tensor.nbytes()) != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
