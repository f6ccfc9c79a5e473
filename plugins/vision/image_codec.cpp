#include "image_codec.hpp"

#include <turbojpeg.h>

#include <cstring>
#include <memory>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "sluice/error.hpp"

namespace sluice::vision {
namespace {

std::uint32_t be32(const unsigned char* p) { return (std::uint32_t(p[0]) << 24) | (p[1] << 16) | (p[2] << 8) | p[3]; }

bool is_jpeg(std::string_view b) { return b.size() >= 3 && (unsigned char)b[0] == 0xFF && (unsigned char)b[1] == 0xD8; }
bool is_png(std::string_view b) { return b.size() >= 24 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0; }

// One decompressor per thread, replaced after a failure: libjpeg-turbo 2.1 can carry the state of
// a failed decode (and its message) into the next call on the same handle.
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
  void renew() {
    if (h) tjDestroy(h);
    h = tjInitDecompress();
  }
};
TjHandle& thread_handle() {
  thread_local TjHandle handle;
  return handle;
}
tjhandle thread_decoder() { return thread_handle().h; }

cv::Mat orient(cv::Mat img, int orientation) {
  cv::Mat out;
  switch (orientation) {
    case 2: cv::flip(img, out, 1); return out;
    case 3: cv::rotate(img, out, cv::ROTATE_180); return out;
    case 4: cv::flip(img, out, 0); return out;
    case 5: cv::transpose(img, out); return out;
    case 6: cv::rotate(img, out, cv::ROTATE_90_CLOCKWISE); return out;
    case 7: cv::transpose(img, out); cv::rotate(out, out, cv::ROTATE_180); return out;
    case 8: cv::rotate(img, out, cv::ROTATE_90_COUNTERCLOCKWISE); return out;
    default: return img;
  }
}

cv::Mat to_channels(cv::Mat img, int channels) {
  if (img.depth() == CV_16U) img.convertTo(img, CV_8U, 1.0 / 257.0);
  cv::Mat out;
  const int have = img.channels();
  if (channels == 1) {
    if (have == 1) return img;
    cv::cvtColor(img, out, have == 4 ? cv::COLOR_BGRA2GRAY : cv::COLOR_BGR2GRAY);
    return out;
  }
  if (channels == 0 && have == 1) return img;
  if (have == 1) cv::cvtColor(img, out, cv::COLOR_GRAY2RGB);
  else if (have == 4) cv::cvtColor(img, out, cv::COLOR_BGRA2RGB);
  else cv::cvtColor(img, out, cv::COLOR_BGR2RGB);
  return out;
}

cv::Mat decode_with_opencv(std::string_view bytes, const DecodeOptions& options, const std::string& jpeg_error) {
  cv::Mat raw(1, static_cast<int>(bytes.size()), CV_8UC1, const_cast<char*>(bytes.data()));
  cv::Mat img;
  try {
    img = cv::imdecode(raw, cv::IMREAD_UNCHANGED | (options.apply_orientation ? 0 : cv::IMREAD_IGNORE_ORIENTATION));
  } catch (const cv::Exception& e) {
    throw DataError(std::string("cannot decode the image: ") + e.what());
  }
  if (img.empty())
    throw DataError(jpeg_error.empty() ? "cannot decode the image (unknown or corrupt format)"
                                       : "cannot decode the JPEG: " + jpeg_error);
  return to_channels(img, options.channels);
}

}  // namespace

bool peek_size(std::string_view b, int& width, int& height) {
  if (is_png(b)) {
    auto* p = reinterpret_cast<const unsigned char*>(b.data());
    width = static_cast<int>(be32(p + 16));
    height = static_cast<int>(be32(p + 20));
    return true;
  }
  if (is_jpeg(b)) {
    int subsamp = 0, colorspace = 0;
    tjhandle tj = thread_decoder();
    if (tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(b.data()), b.size(), &width, &height, &subsamp, &colorspace) == 0)
      return true;
    bool usable = tjGetErrorCode(tj) == TJERR_WARNING && width > 0 && height > 0;
    if (!usable) thread_handle().renew();
    return usable;
  }
  return false;
}

int exif_orientation(std::string_view b) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  std::size_t n = b.size(), at = 2;
  while (at + 4 <= n && p[at] == 0xFF) {
    unsigned marker = p[at + 1];
    if (marker == 0xD9 || marker == 0xDA) break;  // end of headers
    std::size_t len = (std::size_t(p[at + 2]) << 8) | p[at + 3];
    if (len < 2 || at + 2 + len > n) break;
    if (marker == 0xE1 && len >= 16 && std::memcmp(p + at + 4, "Exif\0\0", 6) == 0) {
      const unsigned char* tiff = p + at + 10;
      std::size_t size = len - 8;
      bool little = tiff[0] == 'I';
      auto u16 = [&](std::size_t o) -> unsigned { return little ? tiff[o] | (tiff[o + 1] << 8) : (tiff[o] << 8) | tiff[o + 1]; };
      auto u32 = [&](std::size_t o) -> std::size_t {
        return little ? tiff[o] | (tiff[o + 1] << 8) | (tiff[o + 2] << 16) | (std::size_t(tiff[o + 3]) << 24)
                      : (std::size_t(tiff[o]) << 24) | (tiff[o + 1] << 16) | (tiff[o + 2] << 8) | tiff[o + 3];
      };
      if (size < 8) return 1;
      std::size_t ifd = u32(4);
      if (ifd + 2 > size) return 1;
      unsigned entries = u16(ifd);
      for (unsigned e = 0; e < entries; ++e) {
        std::size_t entry = ifd + 2 + 12 * e;
        if (entry + 12 > size) break;
        if (u16(entry) == 0x0112) {
          unsigned v = u16(entry + 8);
          return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
        }
      }
      return 1;
    }
    at += 2 + len;
  }
  return 1;
}

cv::Mat decode_image(std::string_view bytes, const DecodeOptions& options) {
  if (bytes.empty()) throw DataError("the image is empty (0 bytes)");
  int width = 0, height = 0;
  if (peek_size(bytes, width, height) && static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height) > options.max_pixels)
    throw DataError("the image is " + std::to_string(width) + "x" + std::to_string(height) + " = " +
                    std::to_string(std::uint64_t(width) * height) + " pixels, over max_pixels " + std::to_string(options.max_pixels) +
                    " (raise max_pixels if such images are expected)");
  if (!is_jpeg(bytes)) return decode_with_opencv(bytes, options, "");

  tjhandle tj = thread_decoder();
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  int subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, data, bytes.size(), &width, &height, &subsamp, &colorspace) != 0 &&
      (tjGetErrorCode(tj) != TJERR_WARNING || width <= 0 || height <= 0)) {
    std::string reason = tjGetErrorStr2(tj);
    thread_handle().renew();
    return decode_with_opencv(bytes, options, reason);
  }
  const int orientation = options.apply_orientation ? exif_orientation(bytes) : 1;
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) return orient(decode_with_opencv(bytes, options, ""), 1);

  // The smallest DCT scale whose output still covers the target size (after orientation).
  int need_w = options.target_width, need_h = options.target_height;
  if (orientation >= 5) std::swap(need_w, need_h);
  tjscalingfactor best{1, 1};
  if (need_w > 0 || need_h > 0) {
    int count = 0, best_w = width;
    tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int i = 0; i < count; ++i) {
      const auto& f = factors[i];
      if (f.num > f.denom) continue;
      int w = TJSCALED(width, f), h = TJSCALED(height, f);
      if (w >= need_w && h >= need_h && w < best_w) {
        best = f;
        best_w = w;
      }
    }
  }
  const int out_w = TJSCALED(width, best), out_h = TJSCALED(height, best);
  const bool gray = options.channels == 1 || (options.channels == 0 && colorspace == TJCS_GRAY);
  cv::Mat img(out_h, out_w, gray ? CV_8UC1 : CV_8UC3);
  if (tjDecompress2(tj, data, bytes.size(), img.data, out_w, 0, out_h, gray ? TJPF_GRAY : TJPF_RGB, 0) != 0 &&
      tjGetErrorCode(tj) != TJERR_WARNING) {
    // 12-bit, lossless and arithmetic-coded variants: OpenCV's libjpeg may still read them.
    std::string reason = tjGetErrorStr2(tj);
    thread_handle().renew();
    return decode_with_opencv(bytes, options, reason);
  }
  return orient(img, orientation);
}

}  // namespace sluice::vision
