// select_fields and split_text: shaping elements for sequence pipelines.
#include <cerrno>
#include <charconv>
#include <cstdlib>

#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Keeps the listed fields, in that order: tf.data's map(lambda x: {k: x[k] for k in keep}).
class SelectFields final : public Map {
 public:
  static OperatorInfo describe() {
    return {"select_fields",
            OperatorKind::Map,
            "Keeps only the fields named in keep, in that order (the others are removed)",
            {ParamSpec::make("keep", ParamType::StringList, "fields to keep, in this order")},
            {.stateless = true},
            {}};
  }
  explicit SelectFields(const Params& p) : keep_(p.get_string_list("keep")) {
    if (keep_.empty()) throw ParamError("keep is empty; name the fields to keep");
  }
  Sample map(Sample in, const ElementContext&) override {
    Sample out;
    out.reserve(keep_.size());
    for (const auto& name : keep_) {
      Tensor* t = in.find(name);
      if (!t) throw DataError("select_fields: the element has no field '" + name + "' to keep (it has " + names(in) + ")");
      out.set(name, std::move(*t));
    }
    out.share_origin(in);
    return out;
  }

 private:
  static std::string names(const Sample& s) {
    std::string out;
    for (const auto& f : s.fields()) out += (out.empty() ? "" : ", ") + f.name;
    return out.empty() ? "none" : out;
  }
  std::vector<std::string> keep_;
};

// tf.strings.split (and tf.strings.to_number): a text field into its tokens, as a variable-length
// field of bytes, int64 or f32. Whitespace runs separate tokens unless a separator is given (then
// empty tokens are kept, as Python's str.split(sep)).
class SplitText final : public Map {
 public:
  static OperatorInfo describe() {
    return {"split_text",
            OperatorKind::Map,
            "Splits a text field into a sequence of tokens (bytes), or of numbers (int64, f32)",
            {ParamSpec::make("field", ParamType::String, "the text field").def("line"),
             ParamSpec::make("separator", ParamType::String, "separator; empty: runs of spaces, tabs and line ends").def(""),
             ParamSpec::make("to", ParamType::Choice, "type of the tokens").def("bytes").one_of({"bytes", "int64", "float"}),
             ParamSpec::make("output", ParamType::String, "name of the output field; empty: replace field").def("")},
            {.stateless = true},
            {}};
  }
  explicit SplitText(const Params& p)
      : field_(p.get_string("field")), separator_(p.get_string("separator")), to_(p.get_string("to")),
        output_(p.get_string("output").empty() ? field_ : p.get_string("output")) {}
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& t = in.at(field_);
    if (t.dtype() != DType::Bytes || t.num_elements() != 1)
      throw DataError("split_text: field '" + field_ + "' is " + dtype_name(t.dtype()) + shape_string(t.shape()) + ", not one text");
    const std::string_view text = t.string_at(0);
    thread_local std::vector<std::string_view> tokens;  // reused: one allocation per thread, not per element
    tokens.clear();
    if (separator_.empty()) {
      std::size_t at = 0;
      for (;;) {
        at = text.find_first_not_of(" \t\r\n\v\f", at);
        if (at == std::string_view::npos) break;
        const std::size_t end = std::min(text.size(), text.find_first_of(" \t\r\n\v\f", at));
        tokens.push_back(text.substr(at, end - at));
        at = end;
      }
    } else if (!text.empty()) {
      std::size_t at = 0;
      for (;;) {
        const std::size_t end = text.find(separator_, at);
        tokens.push_back(text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
        if (end == std::string_view::npos) break;
        at = end + separator_.size();
      }
    }
    const auto n = static_cast<std::int64_t>(tokens.size());
    if (to_ == "bytes") {
      in.set(output_, Tensor::from_strings(tokens, {n}));
    } else if (to_ == "int64") {
      Tensor out = Tensor::empty(DType::I64, {n});
      auto* values = out.data<std::int64_t>();
      for (std::int64_t k = 0; k < n; ++k) values[k] = number<std::int64_t>(tokens[static_cast<std::size_t>(k)], k);
      in.set(output_, std::move(out));
    } else {
      Tensor out = Tensor::empty(DType::F32, {n});
      auto* values = out.data<float>();
      for (std::int64_t k = 0; k < n; ++k) values[k] = number<float>(tokens[static_cast<std::size_t>(k)], k);
      in.set(output_, std::move(out));
    }
    return in;
  }

 private:
  // from_chars: no copy of the token and no locale (strtoll costs several times more per token).
  template <class T> T number(std::string_view token, std::int64_t k) const {
    T v{};
    const char* begin = token.data();
    const char* end = begin + token.size();
    if (!token.empty() && *begin == '+') ++begin;  // "+5", as strtoll reads it
    const auto [stop, error] = std::from_chars(begin, end, v);
    if (token.empty() || stop != end || error != std::errc())
      throw DataError("split_text: token " + std::to_string(k) + " of field '" + field_ + "', '" + std::string(token.substr(0, 40)) +
                      "', is not " + (std::is_same_v<T, float> ? "a number" : "an int64"));
    return v;
  }
  std::string field_, separator_, to_, output_;
};

}  // namespace

void register_field_ops(Registrar& registrar) {
  registrar.add<SelectFields>();
  registrar.add<SplitText>();
}

}  // namespace sluice::std_ops
