// resize, random_resized_crop, random_flip, random_brightness, random_contrast, normalize,
// transpose, cast.
#include <cmath>
#include <limits>
#include <opencv2/imgproc.hpp>

#include <sstream>

#include "mat.hpp"
#include "pixel_ops.hpp"
#include "vision_plugin.hpp"

namespace sluice::vision {
namespace {

int interpolation(const std::string& name) {
  if (name == "nearest") return cv::INTER_NEAREST;
  if (name == "linear") return cv::INTER_LINEAR;
  if (name == "area") return cv::INTER_AREA;
  if (name == "cubic") return cv::INTER_CUBIC;
  throw ParamError("unknown interpolation '" + name + "'");
}
ParamSpec field_param() { return ParamSpec::make("field", ParamType::String, "field holding the image (HxWxC)").def("image"); }
ParamSpec interpolation_param() {
  return ParamSpec::make("interpolation", ParamType::Choice, "resampling").def("linear").one_of({"nearest", "linear", "area", "cubic"});
}

class Resize final : public Map {
 public:
  static OperatorInfo describe() {
    return {"resize",
            OperatorKind::Map,
            "Resizes to height x width: stretch, or keep the aspect ratio and center-crop or pad",
            {field_param(), ParamSpec::make("height", ParamType::Int, "output height").range(1, 65536).offers_hint("image_height"),
             ParamSpec::make("width", ParamType::Int, "output width").range(1, 65536).offers_hint("image_width"), interpolation_param(),
             ParamSpec::make("mode", ParamType::Choice, "stretch, crop (fill then center-crop) or pad (fit then pad with zeros)")
                 .def("stretch")
                 .one_of({"stretch", "crop", "pad"})},
            {.stateless = true},
            {}};
  }
  explicit Resize(const Params& p)
      : field_(p.get_string("field")), h_(static_cast<int>(p.get_int("height"))), w_(static_cast<int>(p.get_int("width"))),
        interp_(interpolation(p.get_string("interpolation"))), mode_(p.get_string("mode")) {}
  Sample map(Sample in, const ElementContext&) override {
    cv::Mat src = as_mat(in.at(field_), field_), out;
    if (mode_ == "stretch") {
      cv::resize(src, out, cv::Size(w_, h_), 0, 0, interp_);
    } else {
      double sx = double(w_) / src.cols, sy = double(h_) / src.rows;
      double s = mode_ == "crop" ? std::max(sx, sy) : std::min(sx, sy);
      int rw = std::max(1, static_cast<int>(std::lround(src.cols * s))), rh = std::max(1, static_cast<int>(std::lround(src.rows * s)));
      cv::Mat scaled;
      cv::resize(src, scaled, cv::Size(rw, rh), 0, 0, interp_);
      if (mode_ == "crop") {
        int x = std::max(0, (rw - w_) / 2), y = std::max(0, (rh - h_) / 2);
        out = scaled(cv::Rect(x, y, std::min(w_, rw), std::min(h_, rh))).clone();
        if (out.cols != w_ || out.rows != h_) cv::resize(out, out, cv::Size(w_, h_), 0, 0, interp_);
      } else {
        out = cv::Mat::zeros(h_, w_, scaled.type());
        scaled.copyTo(out(cv::Rect((w_ - rw) / 2, (h_ - rh) / 2, rw, rh)));
      }
    }
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  int h_, w_, interp_;
  std::string mode_;
};

std::pair<double, double> range_of(const Params& p, const std::string& name) {
  const auto& v = p.get_float_list(name);
  if (v.size() != 2) throw ParamError(name + " must be two numbers, low,high; it has " + std::to_string(v.size()));
  if (v[0] > v[1]) {
    auto text = [](double x) {
      std::ostringstream out;
      out << x;
      return out.str();
    };
    throw ParamError(name + " " + text(v[0]) + "," + text(v[1]) + " is high,low: give the lower bound first (" + text(v[1]) + "," +
                     text(v[0]) + ")");
  }
  return {v[0], v[1]};
}

class RandomResizedCrop final : public Map {
 public:
  static OperatorInfo describe() {
    return {"random_resized_crop",
            OperatorKind::Map,
            "Crops a random area (scale of the image, aspect ratio in range) and resizes it to height x width",
            {field_param(), ParamSpec::make("height", ParamType::Int, "output height").range(1, 65536),
             ParamSpec::make("width", ParamType::Int, "output width").range(1, 65536),
             ParamSpec::make("scale", ParamType::FloatList, "range of the crop's area as a fraction of the image").def("0.08,1").range(0, 1),
             ParamSpec::make("ratio", ParamType::FloatList, "range of the crop's width/height").def("0.75,1.3333333").range(0.001, 1000),
             interpolation_param()},
            {.stateless = true, .random = true},
            {}};
  }
  explicit RandomResizedCrop(const Params& p)
      : field_(p.get_string("field")), h_(static_cast<int>(p.get_int("height"))), w_(static_cast<int>(p.get_int("width"))),
        scale_(range_of(p, "scale")), ratio_(range_of(p, "ratio")), interp_(interpolation(p.get_string("interpolation"))) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    cv::Mat src = as_mat(in.at(field_), field_);
    Rng rng = ctx.rng();
    const double area = double(src.cols) * src.rows;
    cv::Rect crop;
    for (int attempt = 0; attempt < 10 && crop.empty(); ++attempt) {
      double target = area * rng.uniform(scale_.first, scale_.second);
      double ratio = std::exp(rng.uniform(std::log(ratio_.first), std::log(ratio_.second)));
      int cw = static_cast<int>(std::lround(std::sqrt(target * ratio))), ch = static_cast<int>(std::lround(std::sqrt(target / ratio)));
      if (cw > 0 && ch > 0 && cw <= src.cols && ch <= src.rows)
        crop = cv::Rect(static_cast<int>(rng.below(src.cols - cw + 1)), static_cast<int>(rng.below(src.rows - ch + 1)), cw, ch);
    }
    if (crop.empty()) {  // fall back to the largest centered crop within the ratio range
      double ratio = double(src.cols) / src.rows;
      int cw = src.cols, ch = src.rows;
      if (ratio < ratio_.first) ch = static_cast<int>(std::lround(cw / ratio_.first));
      else if (ratio > ratio_.second) cw = static_cast<int>(std::lround(ch * ratio_.second));
      crop = cv::Rect((src.cols - cw) / 2, (src.rows - ch) / 2, cw, ch);
    }
    cv::Mat out;
    cv::resize(src(crop), out, cv::Size(w_, h_), 0, 0, interp_);
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  int h_, w_;
  std::pair<double, double> scale_, ratio_;
  int interp_;
};

class RandomFlip final : public Map {
 public:
  static OperatorInfo describe() {
    return {"random_flip",
            OperatorKind::Map,
            "Flips the image with probability p",
            {field_param(), ParamSpec::make("direction", ParamType::Choice, "axis").def("horizontal").one_of({"horizontal", "vertical"}),
             ParamSpec::make("p", ParamType::Float, "probability of flipping").def("0.5").range(0, 1)},
            {.stateless = true, .random = true, .keeps_shape = true},
            {}};
  }
  explicit RandomFlip(const Params& p)
      : field_(p.get_string("field")), code_(p.get_string("direction") == "horizontal" ? 1 : 0), p_(p.get_float("p")) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    if (!ctx.rng().bernoulli(p_)) return in;
    cv::Mat out;
    cv::flip(as_mat(in.at(field_), field_), out, code_);
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  int code_;
  double p_;
};

// Full scale of a pixel value: 255 for u8, 1 for floating-point images.
double full_scale(int depth) { return depth == CV_8U ? 255.0 : 1.0; }

class RandomBrightness final : public Map {
 public:
  static OperatorInfo describe() {
    return {"random_brightness",
            OperatorKind::Map,
            "Adds a random delta in [-max_delta, max_delta] (a fraction of full scale) to every pixel",
            {field_param(), ParamSpec::make("max_delta", ParamType::Float, "largest change, 0..1 of full scale").def("0.2").range(0, 1)},
            {.stateless = true, .random = true, .keeps_shape = true},
            {}};
  }
  explicit RandomBrightness(const Params& p) : field_(p.get_string("field")), max_delta_(p.get_float("max_delta")) {}
  Sample map(Sample in, const ElementContext& ctx) override {
    cv::Mat src = as_mat(in.at(field_), field_), out;
    double delta = ctx.rng().uniform(-max_delta_, max_delta_) * full_scale(src.depth());
    src.convertTo(out, src.type(), 1.0, delta);
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  double max_delta_;
};

class RandomContrast final : public Map {
 public:
  static OperatorInfo describe() {
    return {"random_contrast",
            OperatorKind::Map,
            "Scales each channel's distance from its mean by a random factor in [lower, upper]",
            {field_param(), ParamSpec::make("lower", ParamType::Float, "smallest factor").def("0.8").range(0, std::nullopt),
             ParamSpec::make("upper", ParamType::Float, "largest factor").def("1.2").range(0, std::nullopt)},
            {.stateless = true, .random = true, .keeps_shape = true},
            {}};
  }
  explicit RandomContrast(const Params& p) : field_(p.get_string("field")), lower_(p.get_float("lower")), upper_(p.get_float("upper")) {
    if (lower_ > upper_) throw ParamError("lower must not exceed upper");
  }
  Sample map(Sample in, const ElementContext& ctx) override {
    cv::Mat src = as_mat(in.at(field_), field_), out;
    double factor = ctx.rng().uniform(lower_, upper_);
    cv::Scalar mean = cv::mean(src);
    cv::Mat f;
    src.convertTo(f, CV_32F);
    f = (f - mean) * factor + mean;
    f.convertTo(out, src.type());
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  double lower_, upper_;
};

class Normalize final : public Map {
 public:
  static OperatorInfo describe() {
    return {"normalize",
            OperatorKind::Map,
            "Converts to f32 as (pixel * scale - mean) / std, per channel",
            {field_param(), ParamSpec::make("mean", ParamType::FloatList, "per-channel mean (after scale)").def("0.485,0.456,0.406"),
             ParamSpec::make("std", ParamType::FloatList, "per-channel standard deviation").def("0.229,0.224,0.225"),
             ParamSpec::make("scale", ParamType::Float, "applied first; 1/255 maps u8 to 0..1").def("0.00392156862745098")},
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  explicit Normalize(const Params& p)
      : field_(p.get_string("field")), mean_(p.get_float_list("mean")), std_(p.get_float_list("std")), scale_(p.get_float("scale")) {
    if (mean_.empty() || mean_.size() != std_.size()) throw ParamError("mean and std need one value per channel each");
    for (double s : std_)
      if (s == 0) throw ParamError("std must not contain 0");
  }
  Sample map(Sample in, const ElementContext& ctx) override {
    const Tensor& input = in.at(field_);
    cv::Mat src = as_mat(input, field_);
    if (static_cast<std::size_t>(src.channels()) != mean_.size() && mean_.size() != 1)
      throw DataError("the image has " + std::to_string(src.channels()) + " channels, mean and std give " + std::to_string(mean_.size()));
    cv::Mat out;
    if (src.depth() == CV_8U && src.isContinuous() && src.channels() <= 4) {
      // Written where a batch after this stage wants it, when it offered (no copy there).
      bool in_batch_row = false;
      Tensor result = ctx.output_tensor(field_, DType::F32, input.shape(), &in_batch_row);
      float mul[4], add[4];
      for (int c = 0; c < src.channels(); ++c) {
        const std::size_t k = mean_.size() == 1 ? 0 : static_cast<std::size_t>(c);
        mul[c] = static_cast<float>(scale_ / std_[k]);
        add[c] = static_cast<float>(-mean_[k] / std_[k]);
      }
      auto* kernel = in_batch_row ? normalize_u8_to_cold : normalize_u8;
      kernel(src.ptr<std::uint8_t>(), result.data<float>(), src.total(), src.channels(), mul, add);
      in.set(field_, std::move(result));
      return in;
    }
    src.convertTo(out, CV_32F, scale_);
    cv::Scalar mean, inv_std;
    for (int c = 0; c < src.channels(); ++c) {
      mean[c] = mean_[mean_.size() == 1 ? 0 : c];
      inv_std[c] = 1.0 / std_[std_.size() == 1 ? 0 : c];
    }
    cv::subtract(out, mean, out);
    cv::multiply(out, inv_std, out);
    in.set(field_, from_mat(out));
    return in;
  }

 private:
  std::string field_;
  std::vector<double> mean_, std_;
  double scale_;
};

class Transpose final : public Map {
 public:
  static OperatorInfo describe() {
    return {"transpose",
            OperatorKind::Map,
            "Reorders an image between HWC and CHW",
            {field_param(), ParamSpec::make("to", ParamType::Choice, "target layout").def("chw").one_of({"chw", "hwc"})},
            {.stateless = true},
            {}};
  }
  explicit Transpose(const Params& p) : field_(p.get_string("field")), to_chw_(p.get_string("to") == "chw") {}
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& t = in.at(field_);
    if (t.rank() != 3 || t.dtype() == DType::Bytes) throw DataError("field '" + field_ + "' is not a 3-D image");
    const auto& s = t.shape();
    const std::size_t item = dtype_size(t.dtype());
    Shape shape = to_chw_ ? Shape{s[2], s[0], s[1]} : Shape{s[1], s[2], s[0]};
    Tensor out = Tensor::empty(t.dtype(), shape);
    const std::byte* src = t.raw_data();
    std::byte* dst = out.raw_data();
    // HWC (a, b, c) -> CHW (c, a, b), or CHW -> HWC: one strided copy per element.
    const std::int64_t d0 = s[0], d1 = s[1], d2 = s[2];
    for (std::int64_t i = 0; i < d0; ++i)
      for (std::int64_t j = 0; j < d1; ++j)
        for (std::int64_t k = 0; k < d2; ++k) {
          std::int64_t from = (i * d1 + j) * d2 + k;
          std::int64_t to = to_chw_ ? (k * d0 + i) * d1 + j : (j * d2 + k) * d0 + i;
          std::memcpy(dst + to * item, src + from * item, item);
        }
    in.set(field_, std::move(out));
    return in;
  }

 private:
  std::string field_;
  bool to_chw_;
};

class Cast final : public Map {
 public:
  static OperatorInfo describe() {
    return {"cast",
            OperatorKind::Map,
            "Converts a numeric field to another dtype (saturating), optionally scaled",
            {field_param(), ParamSpec::make("dtype", ParamType::Choice, "target dtype").one_of({"u8", "i16", "i32", "f32", "f64"}),
             ParamSpec::make("scale", ParamType::Float, "multiplier applied while converting").def("1")},
            {.stateless = true, .keeps_shape = true},
            {}};
  }
  explicit Cast(const Params& p) : field_(p.get_string("field")), scale_(p.get_float("scale")) {
    const auto& d = p.get_string("dtype");
    depth_ = d == "u8" ? CV_8U : d == "i16" ? CV_16S : d == "i32" ? CV_32S : d == "f32" ? CV_32F : CV_64F;
  }
  // Fresh pages cost more than the conversion (a 320x240 image to f32 is 900 KB): outputs not
  // placed in a batch come from a pool of blocks that their readers give back.
  void start(const StageInfo& info) override {
    pooled_ = std::string(info.allocator->name()) == "host";
  }
  // Converted straight into the output (a batch's row when the batch after it offers one): one
  // pass over the data, no temporary and no copy.
  Sample map(Sample in, const ElementContext& ctx) override {
    const Tensor& t = in.at(field_);
    if (t.dtype() == DType::Bytes || t.dtype() == DType::I64 || t.dtype() == DType::F16 || t.dtype() == DType::BF16)
      throw DataError("cast does not convert " + std::string(dtype_name(t.dtype())) + " fields");
    if (t.num_elements() > std::numeric_limits<int>::max())
      throw DataError("field '" + field_ + "' has " + std::to_string(t.num_elements()) + " values, more than cast converts at once");
    const int n = static_cast<int>(t.num_elements());
    Tensor result = output(ctx, sluice_dtype(depth_), t.shape());
    if (n > 0) {
      cv::Mat from(1, n, CV_MAKETYPE(cv_depth(t.dtype()), 1), const_cast<std::byte*>(t.raw_data()));
      cv::Mat to(1, n, CV_MAKETYPE(depth_, 1), result.raw_data());
      from.convertTo(to, depth_, scale_);  // `to` has the size and type: written in place
    }
    in.set(field_, std::move(result));
    return in;
  }

 private:
  Tensor output(const ElementContext& ctx, DType dtype, const Shape& shape) {
    if (ctx.stage->placement || !pooled_) return ctx.output_tensor(field_, dtype, shape);
    return Tensor::empty(dtype, shape, pool_);
  }

  std::string field_;
  int depth_;
  double scale_;
  bool pooled_ = false;
  PooledHostAllocator pool_;  // thread-safe: the stage's workers share it
};

}  // namespace

void register_transform_ops(Registrar& registrar) {
  registrar.add<Resize>();
  registrar.add<RandomResizedCrop>();
  registrar.add<RandomFlip>();
  registrar.add<RandomBrightness>();
  registrar.add<RandomContrast>();
  registrar.add<Normalize>();
  registrar.add<Transpose>();
  registrar.add<Cast>();
}

}  // namespace sluice::vision
