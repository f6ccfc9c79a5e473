// decode_image, encode_image, synthetic_images.
#include <turbojpeg.h>

#include <cmath>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "image_codec.hpp"
#include "mat.hpp"
#include "vision_plugin.hpp"

namespace sluice::vision {
namespace {

class DecodeImage final : public Map {
 public:
  static OperatorInfo describe() {
    return {"decode_image",
            OperatorKind::Map,
            "Decodes JPEG, PNG and other images into u8 HxWxC (RGB; f32 for HDR and EXR), EXIF orientation applied",
            {ParamSpec::make("field", ParamType::String,
                             "field holding the encoded bytes; empty: 'image', or 'data' (what read_file writes) when there is no 'image'")
                 .def(""),
             ParamSpec::make("output", ParamType::String, "field for the decoded image (replaces the bytes if the same)").def("image"),
             ParamSpec::make("channels", ParamType::Choice, "3: RGB, 1: gray, 0: as stored").def("3").one_of({"0", "1", "3"}),
             ParamSpec::make("max_pixels", ParamType::Int, "refuse images with more pixels (decompression bombs)")
                 .def("100000000")
                 .range(1, std::nullopt),
             ParamSpec::make("target_height", ParamType::Int,
                             "height a later resize needs: JPEGs decode at the smallest DCT scale (1/2 ... 1/8) still this tall; "
                             "0: full size; unset: taken from a later resize (through shape-keeping stages)")
                 .def("0")
                 .range(0, std::nullopt)
                 .takes_hint("image_height"),
             ParamSpec::make("target_width", ParamType::Int, "width a later resize needs (see target_height)")
                 .def("0")
                 .range(0, std::nullopt)
                 .takes_hint("image_width"),
             ParamSpec::make("orientation", ParamType::Bool, "apply the EXIF orientation").def("true"),
             ParamSpec::make("truncated", ParamType::Choice,
                             "a JPEG cut short: refuse it (a data error: skipped and reported under error_policy skip) or "
                             "accept it with its missing part grey")
                 .def("refuse")
                 .one_of({"refuse", "accept"})},
            {.stateless = true},
            {}};
  }
  explicit DecodeImage(const Params& p) : field_(p.get_string("field")), output_(p.get_string("output")) {
    options_.channels = std::stoi(p.get_string("channels"));
    options_.max_pixels = static_cast<std::uint64_t>(p.get_int("max_pixels"));
    options_.target_height = static_cast<int>(p.get_int("target_height"));
    options_.target_width = static_cast<int>(p.get_int("target_width"));
    options_.apply_orientation = p.get_bool("orientation");
    options_.accept_truncated = p.get_string("truncated") == "accept";
  }
  Sample map(Sample in, const ElementContext&) override {
    // The defaults compose: list_files -> read_file -> decode_image, and parse_example's 'image'.
    const std::string& field = !field_.empty() ? field_ : (in.find("image") || !in.find("data") ? kImage : kData);
    const Tensor& bytes = in.at(field);
    if (bytes.dtype() != DType::Bytes || bytes.num_elements() != 1)
      throw DataError("field '" + field + "' is not one encoded image (got " + dtype_name(bytes.dtype()) + shape_string(bytes.shape()) + ")");
    cv::Mat img = decode_image(bytes.string_at(0), options_);
    if (output_ != field) in.erase(field);
    in.set(output_, from_mat(img));
    return in;
  }

 private:
  static inline const std::string kImage = "image", kData = "data";
  std::string field_, output_;
  DecodeOptions options_;
};

class EncodeImage final : public Map {
 public:
  static OperatorInfo describe() {
    return {"encode_image",
            OperatorKind::Map,
            "Encodes a u8 HxWxC RGB (or gray) image as JPEG or PNG bytes",
            {ParamSpec::make("field", ParamType::String, "field holding the image").def("image"),
             ParamSpec::make("output", ParamType::String, "field for the encoded bytes").def("image"),
             ParamSpec::make("format", ParamType::Choice, "file format").def("jpeg").one_of({"jpeg", "png"}),
             ParamSpec::make("quality", ParamType::Int, "JPEG quality").def("90").range(1, 100)},
            {.stateless = true},
            {}};
  }
  explicit EncodeImage(const Params& p)
      : field_(p.get_string("field")), output_(p.get_string("output")), png_(p.get_string("format") == "png"), quality_(static_cast<int>(p.get_int("quality"))) {}
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& t = in.at(field_);
    if (t.dtype() != DType::U8) throw DataError("field '" + field_ + "' is " + dtype_name(t.dtype()) + "; encode_image takes u8 (cast first)");
    cv::Mat img = as_mat(t, field_);
    std::string encoded;
    if (png_) {
      cv::Mat bgr;
      if (img.channels() == 3) cv::cvtColor(img, bgr, cv::COLOR_RGB2BGR);
      else bgr = img;
      std::vector<unsigned char> out;
      if (!cv::imencode(".png", bgr, out)) throw DataError("PNG encoding failed");
      encoded.assign(out.begin(), out.end());
    } else {
      thread_local struct Handle {
        tjhandle h = tjInitCompress();
        ~Handle() { tjDestroy(h); }
      } handle;
      if (img.channels() != 1 && img.channels() != 3) throw DataError("JPEG needs 1 or 3 channels, the image has " + std::to_string(img.channels()));
      unsigned char* jpeg = nullptr;
      unsigned long size = 0;
      const bool gray = img.channels() == 1;
      if (tjCompress2(handle.h, img.data, img.cols, static_cast<int>(img.step), img.rows, gray ? TJPF_GRAY : TJPF_RGB, &jpeg, &size,
                      gray ? TJSAMP_GRAY : TJSAMP_420, quality_, 0) != 0)
        throw DataError(std::string("JPEG encoding failed: ") + tjGetErrorStr2(handle.h));
      encoded.assign(reinterpret_cast<char*>(jpeg), size);
      tjFree(jpeg);
    }
    if (output_ != field_) in.erase(field_);
    in.set(output_, Tensor::from_string(encoded));
    return in;
  }

 private:
  std::string field_, output_;
  bool png_;
  int quality_;
};

// Photo-like test images: a lit gradient whose hue says the class, shapes and texture drawn from
// the per-element generator. The same seed gives the same pixels everywhere.
class SyntheticImages final : public Source {
 public:
  static OperatorInfo describe() {
    return {"synthetic_images",
            OperatorKind::Source,
            "Emits deterministic photo-like images ('image' u8 HxWx3) with a class 'label'",
            {ParamSpec::make("count", ParamType::Int, "number of images").def("100").range(0, std::nullopt),
             ParamSpec::make("height", ParamType::Int, "image height").def("240").range(1, 16384),
             ParamSpec::make("width", ParamType::Int, "image width").def("320").range(1, 16384),
             ParamSpec::make("classes", ParamType::Int, "number of classes").def("10").range(1, 100000)},
            {.stateless = false, .random = true, .saves_state = true},
            {}};
  }
  explicit SyntheticImages(const Params& p)
      : count_(p.get_int("count")), height_(static_cast<int>(p.get_int("height"))), width_(static_cast<int>(p.get_int("width"))),
        classes_(p.get_int("classes")) {}
  void begin_pass(std::uint64_t) override { next_ = 0; }
  std::int64_t expected_elements() const override { return count_; }
  bool next(Sample& out, const ElementContext& ctx) override {
    if (next_ >= count_) return false;
    // Images depend on their index only (not the epoch): the dataset is the same every pass.
    Rng rng(ctx.stage->seed, ctx.stage->stage_hash, 0, static_cast<std::uint64_t>(next_));
    const std::int64_t label = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(classes_)));
    const double hue = 180.0 * static_cast<double>(label) / static_cast<double>(classes_);
    cv::Mat hsv(height_, width_, CV_8UC3);
    const double tilt = rng.uniform(-1, 1);
    for (int y = 0; y < height_; ++y) {
      auto* row = hsv.ptr<cv::Vec3b>(y);
      for (int x = 0; x < width_; ++x) {
        double light = 0.5 + 0.35 * std::sin((x * (1 + tilt) + y) * 0.01);
        row[x] = cv::Vec3b(static_cast<unsigned char>(hue), 160, static_cast<unsigned char>(60 + 160 * light));
      }
    }
    cv::Mat img;
    cv::cvtColor(hsv, img, cv::COLOR_HSV2RGB);
    const int shapes = 3 + static_cast<int>(rng.below(6));
    for (int s = 0; s < shapes; ++s) {
      cv::Point center(static_cast<int>(rng.below(width_)), static_cast<int>(rng.below(height_)));
      cv::Scalar color(static_cast<double>(rng.below(256)), static_cast<double>(rng.below(256)), static_cast<double>(rng.below(256)));
      int a = 5 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::max(1, width_ / 4))));
      int b = 5 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::max(1, height_ / 4))));
      if (rng.bernoulli(0.5)) cv::ellipse(img, center, cv::Size(a, b), rng.uniform(0, 180), 0, 360, color, cv::FILLED, cv::LINE_AA);
      else cv::rectangle(img, cv::Rect(center.x - a / 2, center.y - b / 2, a, b), color, cv::FILLED);
    }
    cv::Mat noise(height_, width_, CV_16SC3);
    cv::theRNG().state = rng.next_u64() | 1;  // cv::randn draws from this thread's generator
    cv::randn(noise, cv::Scalar::all(0), cv::Scalar::all(6));
    cv::add(img, noise, img, cv::noArray(), CV_8U);
    out.set("image", from_mat(img));
    out.set("label", Tensor::scalar<std::int64_t>(label));
    out.set_origin("synthetic image " + std::to_string(next_));
    ++next_;
    return true;
  }
  void save_state(StateWriter& w) const override { w.put(next_); }
  void restore_state(StateReader& r) override { next_ = r.get_within<std::int64_t>(0, count_, "the next image's number"); }

 private:
  std::int64_t count_;
  int height_, width_;
  std::int64_t classes_, next_ = 0;
};

}  // namespace

void register_codec_ops(Registrar& registrar) {
  registrar.add<DecodeImage>();
  registrar.add<EncodeImage>();
  registrar.add<SyntheticImages>();
}

}  // namespace sluice::vision
