#pragma once
// Image decoding: JPEG with libjpeg-turbo (scaled in the DCT when a smaller size is enough),
// everything else and the JPEG flavours libjpeg-turbo's fast path refuses (CMYK) with OpenCV.
// EXIF orientation is applied; a pixel limit guards against decompression bombs.
#include <cstdint>
#include <string>
#include <string_view>

#include <opencv2/core.hpp>

namespace sluice::vision {

struct DecodeOptions {
  int channels = 3;                  // 0: as stored (1 or 3), 1: gray, 3: RGB
  std::uint64_t max_pixels = 100000000;
  int target_height = 0;             // decode at the smallest DCT scale that still covers these
  int target_width = 0;
  bool apply_orientation = true;
  bool accept_truncated = false;     // a JPEG cut short decodes with its missing part grey
};

// Returns an 8-bit image (32-bit float for Radiance HDR and OpenEXR, whose values are linear and
// unbounded), 1 or 3 channels, RGB order. Throws sluice::DataError with the reason. The pixel
// limit is checked from the header before any pixel is decoded, for every format OpenCV reads.
cv::Mat decode_image(std::string_view bytes, const DecodeOptions& options);

// EXIF orientation (1..8) of a JPEG, 1 when absent or unreadable.
int exif_orientation(std::string_view jpeg);

// Image size from the header alone (JPEG, PNG, TIFF, WebP, BMP, PNM/PAM/PFM, Radiance HDR,
// OpenEXR, JPEG 2000, Sun raster); false if the format is none of these or its header is unreadable.
bool peek_size(std::string_view bytes, int& width, int& height);

}  // namespace sluice::vision
