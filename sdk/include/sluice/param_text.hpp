#pragma once
/// Parameter values as text (pipeline files, --set, the studio's inspector, the test harness):
/// parsed against an operator's schema, defaults filled in, ranges and choices checked. The host
/// and the SDK's test harness (sluice/testing.hpp) use this one reading, so that an operator
/// unit-tested with text parameters gets exactly the values a pipeline file would give it.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <variant>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/params.hpp"

namespace sluice {

namespace param_text_detail {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

/// Comma-separated items; with `braces`, a comma inside {...} belongs to its item (a path pattern
/// such as shards-{train,val}-*.tar).
inline std::vector<std::string_view> split_list(std::string_view text, bool braces = false) {
  std::vector<std::string_view> items;
  text = trim(text);
  if (text.empty()) return items;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && braces) depth += text[i] == '{' ? 1 : (text[i] == '}' && depth > 0) ? -1 : 0;
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      items.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  return items;
}

inline std::int64_t parse_int(std::string_view text) {
  text = trim(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) throw ParamError("'" + std::string(text) + "' is out of the 64-bit integer range");
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw ParamError("expects an integer, got '" + std::string(text) + "'");
  return v;
}

inline double parse_float(std::string_view text) {
  const std::string s(trim(text));
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw ParamError("expects a number, got '" + s + "'");
  if (errno == ERANGE && std::isinf(v)) throw ParamError("'" + s + "' is out of range");
  /// NaN compares false with every bound, so it would pass any range check.
  if (std::isnan(v)) throw ParamError("expects a number, got '" + s + "' (not a number)");
  return v;
}

inline bool parse_bool(std::string_view text) {
  std::string s(trim(text));
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  throw ParamError("expects true or false, got '" + std::string(text) + "'");
}

/// Shortest text that reads back as the same double; plain digits unless very small or large.
inline std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buffer[64];
  const double magnitude = std::fabs(v);
  const auto format = v != 0 && (magnitude < 1e-4 || magnitude >= 1e16) ? std::chars_format::scientific : std::chars_format::fixed;
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v, format);
  return ec == std::errc() ? std::string(buffer, end) : std::to_string(v);
}

template <class T> std::string joined(const std::vector<T>& items, const char* separator, std::string (*text)(const T&)) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? separator : "") + text(items[i]);
  return s;
}
inline std::string same(const std::string& s) { return s; }

}  // namespace param_text_detail

/// "int, default 1, range [0, inf]" and the like: for help output and range errors.
inline std::string describe_param_constraints(const ParamSpec& spec) {
  using namespace param_text_detail;
  std::string s = param_type_name(spec.type);
  if (spec.default_value) s += ", default " + (spec.default_value->empty() ? std::string("\"\"") : *spec.default_value);
  else s += ", required";
  if (spec.min || spec.max)
    s += ", range [" + (spec.min ? number(*spec.min) : std::string("-inf")) + ", " + (spec.max ? number(*spec.max) : std::string("inf")) + "]";
  if (!spec.choices.empty()) s += ", one of " + joined<std::string>(spec.choices, "|", same);
  return s;
}

/// Parses one parameter's text against its spec and checks range and choices. Throws ParamError
/// saying what was expected and what was given (not naming the parameter: the caller does).
inline ParamValue parse_param_text(const ParamSpec& spec, std::string_view text) {
  using namespace param_text_detail;
  auto check_range = [&](double v, std::string_view item) {
    if ((spec.min && !(v >= *spec.min)) || (spec.max && !(v <= *spec.max)))
      throw ParamError(std::string(trim(item)) + " is out of range; " + describe_param_constraints(spec));
  };
  switch (spec.type) {
    case ParamType::Int: {
      const auto v = parse_int(text);
      check_range(static_cast<double>(v), text);
      return v;
    }
    case ParamType::Float: {
      const auto v = parse_float(text);
      check_range(v, text);
      return v;
    }
    case ParamType::Bool: return parse_bool(text);
    case ParamType::String:
    case ParamType::Path:
    case ParamType::OutputPath: return std::string(text);
    case ParamType::Choice: {
      std::string v(trim(text));
      if (std::find(spec.choices.begin(), spec.choices.end(), v) != spec.choices.end()) return v;
      throw ParamError("'" + v + "' is not one of " + joined<std::string>(spec.choices, ", ", same));
    }
    case ParamType::IntList: {
      std::vector<std::int64_t> out;
      for (auto item : split_list(text)) {
        out.push_back(parse_int(item));
        check_range(static_cast<double>(out.back()), item);
      }
      return out;
    }
    case ParamType::FloatList: {
      std::vector<double> out;
      for (auto item : split_list(text)) {
        out.push_back(parse_float(item));
        check_range(out.back(), item);
      }
      return out;
    }
    case ParamType::StringList:
    case ParamType::PathList: {
      std::vector<std::string> out;
      for (auto item : split_list(text, spec.type == ParamType::PathList)) out.emplace_back(item);
      return out;
    }
  }
  throw ParamError("unknown parameter type");
}

/// Text form of a value, as a pipeline file would hold it.
inline std::string format_param(const ParamValue& value) {
  using namespace param_text_detail;
  struct Visitor {
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return number(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<std::int64_t>& v) const {
      return joined<std::int64_t>(v, ",", [](const std::int64_t& x) { return std::to_string(x); });
    }
    std::string operator()(const std::vector<double>& v) const {
      return joined<double>(v, ",", [](const double& x) { return number(x); });
    }
    std::string operator()(const std::vector<std::string>& v) const { return joined<std::string>(v, ",", same); }
  };
  return std::visit(Visitor{}, value);
}

/// Every given value parsed (by `parse`, parse_param_text unless the caller adds to it) and the
/// defaults filled in. Throws ParamError naming the first bad, missing or unknown parameter.
inline Params parse_param_texts(const std::vector<ParamSpec>& schema, const std::vector<std::pair<std::string, std::string>>& given,
                                ParamValue (*parse)(const ParamSpec&, std::string_view) = parse_param_text) {
  Params params;
  for (const auto& spec : schema) {
    const std::string* text = nullptr;
    for (const auto& [name, value] : given)
      if (name == spec.name) text = &value;
    if (text) {
      try {
        params.set(spec.name, parse(spec, *text));
      } catch (const ParamError& e) {
        throw ParamError("parameter '" + spec.name + "' " + e.what());
      }
    } else if (spec.default_value) {
      params.set(spec.name, parse(spec, *spec.default_value));
    } else {
      throw ParamError("parameter '" + spec.name + "' is required (" + spec.doc + ")");
    }
  }
  for (const auto& entry : given) {  // not a structured binding: Clang before 16 cannot capture one in a lambda
    const std::string& name = entry.first;
    const bool known = std::any_of(schema.begin(), schema.end(), [&](const ParamSpec& spec) { return spec.name == name; });
    if (!known) throw ParamError("unknown parameter '" + name + "'");
  }
  return params;
}

}  // namespace sluice
