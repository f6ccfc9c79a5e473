#include "sluice/core/param_parse.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "sluice/core/text.hpp"

namespace sluice {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_list(std::string_view text) {
  std::vector<std::string_view> items;
  text = trim(text);
  if (text.empty()) return items;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = text.find(',', start);
    items.push_back(trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

std::int64_t parse_int(std::string_view text) {
  text = trim(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) throw ParamError(fmt::format("'{}' is out of the 64-bit integer range", text));
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw ParamError(fmt::format("expects an integer, got '{}'", text));
  return v;
}

double parse_float(std::string_view text) {
  std::string s(trim(text));
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw ParamError(fmt::format("expects a number, got '{}'", s));
  if (errno == ERANGE && std::isinf(v)) throw ParamError(fmt::format("'{}' is out of range", s));
  // NaN compares false with every bound, so it would pass any range check.
  if (std::isnan(v)) throw ParamError(fmt::format("expects a number, got '{}' (not a number)", s));
  return v;
}

bool parse_bool(std::string_view text) {
  std::string s(trim(text));
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  throw ParamError(fmt::format("expects true or false, got '{}'", text));
}

void check_range(const ParamSpec& spec, double v, std::string_view text) {
  if ((spec.min && !(v >= *spec.min)) || (spec.max && !(v <= *spec.max)))
    throw ParamError(fmt::format("{} is out of range; {}", trim(text), describe_param_constraints(spec)));
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

}  // namespace

ParamValue parse_param(const ParamSpec& spec, std::string_view text) {
  switch (spec.type) {
    case ParamType::Int: {
      auto v = parse_int(text);
      check_range(spec, static_cast<double>(v), text);
      return v;
    }
    case ParamType::Float: {
      auto v = parse_float(text);
      check_range(spec, v, text);
      return v;
    }
    case ParamType::Bool: return parse_bool(text);
    case ParamType::String:
    case ParamType::Path:
    case ParamType::OutputPath: return std::string(text);
    case ParamType::Choice: {
      std::string v(trim(text));
      for (const auto& c : spec.choices)
        if (c == v) return v;
      throw ParamError(fmt::format("'{}' is not one of {}{}", v, fmt::join(spec.choices, ", "),
                                   did_you_mean(closest_names(v, spec.choices))));
    }
    case ParamType::IntList: {
      std::vector<std::int64_t> out;
      for (auto item : split_list(text)) {
        out.push_back(parse_int(item));
        check_range(spec, static_cast<double>(out.back()), item);
      }
      return out;
    }
    case ParamType::FloatList: {
      std::vector<double> out;
      for (auto item : split_list(text)) {
        out.push_back(parse_float(item));
        check_range(spec, out.back(), item);
      }
      return out;
    }
    case ParamType::StringList:
    case ParamType::PathList: {
      std::vector<std::string> out;
      for (auto item : split_list(text)) out.emplace_back(item);
      return out;
    }
  }
  throw ParamError("unknown parameter type");
}

std::string format_param(const ParamValue& value) {
  struct Visitor {
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return number(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<std::int64_t>& v) const { return fmt::format("{}", fmt::join(v, ",")); }
    std::string operator()(const std::vector<double>& v) const {
      std::string s;
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + number(v[i]);
      return s;
    }
    std::string operator()(const std::vector<std::string>& v) const { return fmt::format("{}", fmt::join(v, ",")); }
  };
  return std::visit(Visitor{}, value);
}

Params parse_params(const std::vector<ParamSpec>& schema, const std::vector<std::pair<std::string, std::string>>& given) {
  Params params;
  for (const auto& spec : schema) {
    const std::string* text = nullptr;
    for (const auto& [name, value] : given)
      if (name == spec.name) text = &value;
    if (text) {
      try {
        params.set(spec.name, parse_param(spec, *text));
      } catch (const ParamError& e) {
        throw ParamError(fmt::format("parameter '{}' {}", spec.name, e.what()));
      }
    } else if (spec.default_value) {
      params.set(spec.name, parse_param(spec, *spec.default_value));
    } else {
      throw ParamError(fmt::format("parameter '{}' is required ({})", spec.name, spec.doc));
    }
  }
  for (const auto& [name, value] : given) {
    bool known = false;
    for (const auto& spec : schema) known |= spec.name == name;
    if (!known) throw ParamError(fmt::format("unknown parameter '{}'", name));
  }
  return params;
}

std::string describe_param_constraints(const ParamSpec& spec) {
  std::string s = param_type_name(spec.type);
  if (spec.default_value) s += fmt::format(", default {}", spec.default_value->empty() ? "\"\"" : *spec.default_value);
  else s += ", required";
  if (spec.min || spec.max)
    s += fmt::format(", range [{}, {}]", spec.min ? number(*spec.min) : "-inf", spec.max ? number(*spec.max) : "inf");
  if (!spec.choices.empty()) s += fmt::format(", one of {}", fmt::join(spec.choices, "|"));
  return s;
}

}  // namespace sluice
