#include "image_codec.hpp"

#include <turbojpeg.h>

#include <cctype>
#include <cstdio>
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
  if (img.depth() != CV_8U && img.depth() != CV_32F) img.convertTo(img, CV_32F);  // EXR halves
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

void refuse_over_limit(std::uint64_t width, std::uint64_t height, const DecodeOptions& options) {
  if (width * height > options.max_pixels)
    throw DataError("the image is " + std::to_string(width) + "x" + std::to_string(height) + " = " + std::to_string(width * height) +
                    " pixels, over max_pixels " + std::to_string(options.max_pixels) + " (raise max_pixels if such images are expected)");
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
  // Whatever the header said (or when nothing could read it first: OpenCV caps a decode at 2^30
  // pixels), what OpenCV made is held to max_pixels too, so no format and no disagreement
  // between a header reader and OpenCV's gets past the limit.
  refuse_over_limit(static_cast<std::uint64_t>(img.cols), static_cast<std::uint64_t>(img.rows), options);
  return to_channels(img, options.channels);
}

std::uint32_t le32(const unsigned char* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (std::uint32_t(p[3]) << 24); }

// Sizes are read into 64 bits and must fit an int: a header claiming more is refused as such.
bool set_size(std::uint64_t w, std::uint64_t h, int& width, int& height) {
  if (w == 0 || h == 0 || w > 0x7fffffff || h > 0x7fffffff) return false;
  width = static_cast<int>(w);
  height = static_cast<int>(h);
  return true;
}

bool peek_tiff(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const std::size_t n = b.size();
  if (n < 8 || !((p[0] == 'I' && p[1] == 'I' && p[2] == 42 && p[3] == 0) || (p[0] == 'M' && p[1] == 'M' && p[2] == 0 && p[3] == 42)))
    return false;
  const bool little = p[0] == 'I';
  auto u16 = [&](std::size_t o) -> std::uint32_t { return little ? p[o] | (p[o + 1] << 8) : (p[o] << 8) | p[o + 1]; };
  auto u32 = [&](std::size_t o) -> std::uint32_t { return little ? le32(p + o) : be32(p + o); };
  const std::size_t ifd = u32(4);
  if (ifd + 2 > n) return false;
  std::uint64_t w = 0, h = 0;
  const unsigned entries = u16(ifd);
  for (unsigned e = 0; e < entries && ifd + 2 + 12 * (e + 1) <= n; ++e) {
    const std::size_t at = ifd + 2 + 12 * e;
    const unsigned tag = u16(at), type = u16(at + 2);
    const std::uint64_t value = type == 3 ? u16(at + 8) : type == 4 ? u32(at + 8) : 0;
    if (tag == 256) w = value;
    if (tag == 257) h = value;
  }
  return set_size(w, h, width, height);
}

bool peek_webp(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 30 || std::memcmp(p, "RIFF", 4) != 0 || std::memcmp(p + 8, "WEBP", 4) != 0) return false;
  if (std::memcmp(p + 12, "VP8X", 4) == 0)
    return set_size(1 + (p[24] | (p[25] << 8) | (p[26] << 16)), 1 + (p[27] | (p[28] << 8) | (p[29] << 16)), width, height);
  if (std::memcmp(p + 12, "VP8L", 4) == 0) {
    const std::uint32_t bits = le32(p + 21);
    return set_size(1 + (bits & 0x3fff), 1 + ((bits >> 14) & 0x3fff), width, height);
  }
  if (std::memcmp(p + 12, "VP8 ", 4) == 0)
    return set_size((p[26] | (p[27] << 8)) & 0x3fff, (p[28] | (p[29] << 8)) & 0x3fff, width, height);
  return false;
}

bool peek_bmp(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 26 || p[0] != 'B' || p[1] != 'M') return false;
  const auto w = static_cast<std::int32_t>(le32(p + 18)), h = static_cast<std::int32_t>(le32(p + 22));
  return set_size(static_cast<std::uint64_t>(w < 0 ? -static_cast<std::int64_t>(w) : w),
                  static_cast<std::uint64_t>(h < 0 ? -static_cast<std::int64_t>(h) : h), width, height);
}

// PBM/PGM/PPM (P1-P6), PAM (P7: WIDTH and HEIGHT lines) and PFM (PF, Pf): text headers.
bool peek_pnm(std::string_view b, int& width, int& height) {
  if (b.size() < 3 || b[0] != 'P' || !std::strchr("1234567Ff", b[1])) return false;
  std::size_t at = 2;
  auto token = [&]() -> std::string {
    for (;;) {
      while (at < b.size() && std::isspace(static_cast<unsigned char>(b[at]))) ++at;
      if (at < b.size() && b[at] == '#') {
        while (at < b.size() && b[at] != '\n') ++at;
        continue;
      }
      break;
    }
    std::size_t start = at;
    while (at < b.size() && at - start < 20 && !std::isspace(static_cast<unsigned char>(b[at]))) ++at;
    return std::string(b.substr(start, at - start));
  };
  auto number = [](const std::string& t) -> std::uint64_t {
    if (t.empty() || t.size() > 12 || t.find_first_not_of("0123456789") != std::string::npos) return 0;
    return std::stoull(t);
  };
  if (b[1] == '7') {
    std::uint64_t w = 0, h = 0;
    for (int k = 0; k < 64 && at < b.size(); ++k) {
      const std::string key = token();
      if (key == "ENDHDR") break;
      if (key == "WIDTH") w = number(token());
      if (key == "HEIGHT") h = number(token());
    }
    return set_size(w, h, width, height);
  }
  const std::uint64_t w = number(token());
  return set_size(w, number(token()), width, height);
}

// Radiance: "#?RADIANCE" lines up to an empty line, then "-Y H +X W" (or another orientation).
bool peek_hdr(std::string_view b, int& width, int& height) {
  if (b.compare(0, 2, "#?") != 0) return false;
  std::size_t blank = b.find("\n\n");
  if (blank == std::string_view::npos || blank > 64 * 1024) return false;
  std::size_t end = b.find('\n', blank + 2);
  std::string line(b.substr(blank + 2, (end == std::string_view::npos ? b.size() : end) - blank - 2));
  char a1 = 0, a2 = 0, s1 = 0, s2 = 0;
  unsigned long long n1 = 0, n2 = 0;
  if (std::sscanf(line.c_str(), "%c%c %llu %c%c %llu", &s1, &a1, &n1, &s2, &a2, &n2) != 6) return false;
  return a1 == 'Y' ? set_size(n2, n1, width, height) : set_size(n1, n2, width, height);
}

// OpenEXR: attributes (name, type, size, value) after the 8-byte header, up to an empty name.
bool peek_exr(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 8 || be32(p) != 0x762f3101u) return false;
  std::size_t at = 8;
  while (at < b.size() && b[at] != '\0') {
    const std::size_t name_end = b.find('\0', at);
    if (name_end == std::string_view::npos) return false;
    const std::string_view name = b.substr(at, name_end - at);
    const std::size_t type_end = b.find('\0', name_end + 1);
    if (type_end == std::string_view::npos || type_end + 5 > b.size()) return false;
    const std::uint32_t size = le32(p + type_end + 1);
    const std::size_t value = type_end + 5;
    if (size > b.size() - value) return false;
    if (name == "dataWindow" && size == 16) {
      const auto x0 = static_cast<std::int32_t>(le32(p + value)), y0 = static_cast<std::int32_t>(le32(p + value + 4));
      const auto x1 = static_cast<std::int32_t>(le32(p + value + 8)), y1 = static_cast<std::int32_t>(le32(p + value + 12));
      return set_size(static_cast<std::uint64_t>(std::int64_t(x1) - x0 + 1), static_cast<std::uint64_t>(std::int64_t(y1) - y0 + 1),
                      width, height);
    }
    at = value + size;
  }
  return false;
}

// JPEG 2000: a JP2 file's 'ihdr' box (height, width), or a bare codestream's SIZ marker.
bool peek_jpeg2000(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() >= 50 && p[0] == 0xFF && p[1] == 0x4F && p[2] == 0xFF && p[3] == 0x51)
    return set_size(std::uint64_t(be32(p + 8)) - be32(p + 16), std::uint64_t(be32(p + 12)) - be32(p + 20), width, height);
  if (b.size() < 12 || be32(p + 4) != 0x6A502020u) return false;  // 'jP  '
  for (std::size_t at = 0; at + 8 <= b.size() && at < 4096;) {
    const std::uint32_t length = be32(p + at), type = be32(p + at + 4);
    if (type == 0x69686472u && at + 16 <= b.size()) return set_size(be32(p + at + 12), be32(p + at + 8), width, height);  // 'ihdr'
    if (type == 0x6A703268u) {  // 'jp2h': a super-box, look inside
      at += 8;
      continue;
    }
    if (length < 8) return false;
    at += length;
  }
  return false;
}

bool peek_sun_raster(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 12 || be32(p) != 0x59a66a95u) return false;
  return set_size(be32(p + 4), be32(p + 8), width, height);
}

// A JPEG's frame header (SOF0..SOF15, not DHT, JPG or DAC), read by walking the markers: the
// size libjpeg decodes to when turbojpeg's own header call refuses the file (sampling factors it
// cannot name), so that such a file is held to max_pixels before OpenCV allocates it.
bool peek_jpeg_frame(std::string_view b, int& width, int& height) {
  auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const std::size_t n = b.size();
  std::size_t at = 2;
  while (at + 4 <= n && p[at] == 0xFF) {
    const unsigned marker = p[at + 1];
    if (marker == 0xFF) {  // fill byte before a marker
      ++at;
      continue;
    }
    if (marker == 0xD9 || marker == 0xDA) return false;  // no frame header before the scan
    const std::size_t length = (std::size_t(p[at + 2]) << 8) | p[at + 3];
    if (length < 2 || at + 2 + length > n) return false;
    const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame) return length >= 7 && set_size((p[at + 7] << 8) | p[at + 8], (p[at + 5] << 8) | p[at + 6], width, height);
    at += 2 + length;
  }
  return false;
}

}  // namespace

bool peek_size(std::string_view b, int& width, int& height) {
  for (auto peek : {peek_tiff, peek_webp, peek_bmp, peek_pnm, peek_hdr, peek_exr, peek_jpeg2000, peek_sun_raster})
    if (peek(b, width, height)) return true;
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
    if (tjGetErrorCode(tj) == TJERR_WARNING && width > 0 && height > 0) return true;
    thread_handle().renew();
    return peek_jpeg_frame(b, width, height);
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
  const bool known_size = peek_size(bytes, width, height);
  if (known_size) refuse_over_limit(static_cast<std::uint64_t>(width), static_cast<std::uint64_t>(height), options);
  if (!is_jpeg(bytes)) {
    // OpenCV hands a file with "DICM" at byte 128 (and no earlier format's signature) to GDCM,
    // whose assertions end the whole process on a damaged file: such files never reach it.
    if (!known_size && bytes.size() >= 132 && bytes.substr(128, 4) == "DICM")
      throw DataError("DICOM images are not decoded (OpenCV's DICOM reader aborts the process on a damaged file): "
                      "convert them to PNG or TIFF first, e.g. with gdcmconv or dcmj2pnm");
    return decode_with_opencv(bytes, options, "");
  }

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
  if (tjDecompress2(tj, data, bytes.size(), img.data, out_w, 0, out_h, gray ? TJPF_GRAY : TJPF_RGB, 0) != 0) {
    std::string reason = tjGetErrorStr2(tj);
    if (tjGetErrorCode(tj) != TJERR_WARNING) {
      // 12-bit, lossless and arithmetic-coded variants: OpenCV's libjpeg may still read them.
      thread_handle().renew();
      return decode_with_opencv(bytes, options, reason);
    }
    // Other warnings (extra bytes between markers) leave the image whole; a file cut short does not.
    if (!options.accept_truncated && reason.find("Premature end of JPEG file") != std::string::npos) {
      thread_handle().renew();
      throw DataError("the JPEG ends before its last scan (" + reason +
                      "): part of the image is missing; set truncated: accept to keep such images");
    }
  }
  return orient(img, orientation);
}

}  // namespace sluice::vision
