// libFuzzer target: tf.train.Example / SequenceExample wire-format parsing against several specs.
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
  };
  return parsers[which % 4];
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  auto buffer = std::make_shared<sluice::Buffer>(size - 1);
  if (size > 1) std::memcpy(buffer->data(), data + 1, size - 1);
  try {
    sluice::Sample out;
    parser(data[0]).parse(buffer, 0, size - 1, out);
    for (const auto& f : out.fields())
      if (f.tensor.dtype() == sluice::DType::Bytes)
        for (std::int64_t i = 0; i < f.tensor.num_elements(); ++i) (void)f.tensor.string_at(i).size();
  } catch (const sluice::Error&) {
  }
  return 0;
}
