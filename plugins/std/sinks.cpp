#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

class NullSink final : public Sink {
 public:
  static OperatorInfo describe() {
    return {"null_sink", OperatorKind::Sink, "Consumes and discards every element (for benchmarks and dry runs)", {},
            {.stateless = true}, {}};
  }
  explicit NullSink(const Params&) {}
  void consume(Sample, const ElementContext&) override {}
};

void append_base64(std::string& out, std::string_view in) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    std::uint32_t v = (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8) | std::uint8_t(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    std::uint32_t v = std::uint8_t(in[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    std::uint32_t v = (std::uint8_t(in[i]) << 16) | (std::uint8_t(in[i + 1]) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
  else bits = sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"nan\"";  // JSON has no NaN or infinity
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "\"inf\"" : "\"-inf\"";
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}

void append_scalar(std::string& out, const Tensor& t, std::int64_t i) {
  const std::byte* p = t.raw_data();
  switch (t.dtype()) {
    case DType::U8: out += std::to_string(reinterpret_cast<const std::uint8_t*>(p)[i]); break;
    case DType::I16: out += std::to_string(reinterpret_cast<const std::int16_t*>(p)[i]); break;
    case DType::I32: out += std::to_string(reinterpret_cast<const std::int32_t*>(p)[i]); break;
    case DType::I64: out += std::to_string(reinterpret_cast<const std::int64_t*>(p)[i]); break;
    case DType::F32: {
      char buf[32];
      float v = reinterpret_cast<const float*>(p)[i];
      if (std::isfinite(v)) {
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
        out += buf;
      } else {
        append_number(out, v);
      }
      break;
    }
    case DType::F64: append_number(out, reinterpret_cast<const double*>(p)[i]); break;
    case DType::F16: append_number(out, half_to_float(reinterpret_cast<const std::uint16_t*>(p)[i])); break;
    case DType::BF16: {
      std::uint32_t bits = static_cast<std::uint32_t>(reinterpret_cast<const std::uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      append_number(out, f);
      break;
    }
    case DType::Bytes: {
      out += '"';
      append_base64(out, t.string_at(i));
      out += '"';
      break;
    }
  }
}

// Nested lists following the shape, row-major.
void append_tensor(std::string& out, const Tensor& t, std::size_t dim, std::int64_t& next) {
  if (dim == t.rank()) {
    append_scalar(out, t, next++);
    return;
  }
  out += '[';
  for (std::int64_t k = 0; k < t.shape()[dim]; ++k) {
    if (k) out += ',';
    append_tensor(out, t, dim + 1, next);
  }
  out += ']';
}

// One JSON object per element. Written to a temporary file of its own that is renamed over `path`
// only when the run completed: an interrupted run leaves `path` untouched and a `.partial-XXXXXX`
// file beside it (see output_file.hpp for what is never replaced).
class JsonlSink final : public Sink {
 public:
  static OperatorInfo describe() {
    return {"jsonl_sink",
            OperatorKind::Sink,
            "Writes one JSON object per element (numbers as nested lists, bytes as base64); atomic on completion",
            {ParamSpec::make("path", ParamType::OutputPath, "output file")},
            {.saves_state = true},
            {}};
  }
  explicit JsonlSink(const Params& p) : path_(p.get_string("path")) {
    if (path_.empty()) throw ParamError("path must not be empty");
  }
  void start(const StageInfo& info) override { file_.open(path_, info.storage); }
  void consume(Sample in, const ElementContext&) override {
    line_.clear();
    line_ += '{';
    bool first = true;
    for (const auto& f : in.fields()) {
      if (!first) line_ += ',';
      first = false;
      append_json_string(line_, f.name);
      line_ += ':';
      std::int64_t next = 0;
      append_tensor(line_, f.tensor, 0, next);
    }
    line_ += "}\n";
    file_.write(line_);
  }
  void finish(bool complete) override {
    if (!file_.is_open()) return;
    if (complete) file_.commit();
    else file_.abandon(/*keep=*/true);  // the .partial file stays: it is visibly incomplete
  }
  // A resumed run goes on writing the interrupted run's file after the lines written before the
  // checkpoint, so that resuming with the same path gives the uninterrupted run's file.
  void save_state(StateWriter& w) const override {
    file_.save(w);
    w.describe("output " + path_ + " written up to the checkpoint");
  }
  void restore_state(StateReader& r) override { file_.restore(r); }

 private:
  std::string path_, line_;
  mutable AtomicOutputFile file_;  // save_state() flushes it to disk
};

}  // namespace

void register_sinks(Registrar& registrar) {
  registrar.add<NullSink>();
  registrar.add<JsonlSink>();
}

}  // namespace sluice::std_ops
