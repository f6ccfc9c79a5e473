// libFuzzer target: image headers and bodies through decode_image with a small pixel limit, as
// decode_image meets them in corrupt or hostile datasets. The first byte picks the options.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "image_codec.hpp"
#include "sluice/error.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // OpenCV's own ceiling for formats whose size decode_image cannot read first; decode_image
  // then holds the result to max_pixels too.
  setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "4194304", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  sluice::vision::DecodeOptions options;
  options.max_pixels = 1 << 20;
  options.channels = (data[0] & 3) == 3 ? 0 : (data[0] & 3) == 2 ? 1 : 3;
  options.apply_orientation = data[0] & 4;
  options.accept_truncated = data[0] & 8;
  if (data[0] & 16) options.target_height = options.target_width = 32;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    cv::Mat image = sluice::vision::decode_image(bytes, options);
    if (image.total() > options.max_pixels) __builtin_trap();  // the limit held for every format
  } catch (const sluice::Error&) {
  }
  return 0;
}
