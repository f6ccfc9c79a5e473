#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sluice/error.hpp"

namespace sluice {

/// Path, OutputPath and PathList values written in a pipeline file are relative to that file's
/// folder (the host resolves them before the operator sees them); given with --set, to the current
/// directory. OutputPath (ABI 4.1) names what a stage writes: validation refuses two stages writing
/// one path, and the studio offers a save dialog for it. PathList (ABI 4.2): comma-separated paths
/// or glob patterns. Appended last so that older plugins keep their values.
enum class ParamType { Int, Float, Bool, String, Path, Choice, IntList, FloatList, StringList, OutputPath, PathList };

inline const char* param_type_name(ParamType t) {
  switch (t) {
    case ParamType::Int: return "int";
    case ParamType::Float: return "float";
    case ParamType::Bool: return "bool";
    case ParamType::String: return "string";
    case ParamType::Path: return "path";
    case ParamType::Choice: return "choice";
    case ParamType::IntList: return "int-list";
    case ParamType::FloatList: return "float-list";
    case ParamType::StringList: return "string-list";
    case ParamType::OutputPath: return "output-path";
    case ParamType::PathList: return "path-list";
  }
  return "?";
}

/// One parameter of an operator's schema. The CLI help, validation and the app's inspector are all
/// generated from it. A parameter without a default is required. Values are written as text in
/// pipeline files and on the command line; lists are comma-separated.
struct ParamSpec {
  std::string name;
  ParamType type = ParamType::String;
  std::string doc;
  std::optional<std::string> default_value;
  std::optional<double> min;  ///< inclusive; for lists, applies to every item
  std::optional<double> max;
  std::vector<std::string> choices;  ///< for Choice
  /// Hints flow from later stages to earlier ones when a pipeline is built: a parameter that
  /// takes hint H, left unset by the user, gets the value of the first later stage's parameter
  /// that offers H, looking through stages whose traits say they keep shapes. (decode_image takes
  /// resize's height and width, and decodes at a reduced DCT scale.)
  enum class HintRole : std::uint8_t { None, Offers, Takes };
  HintRole hint_role = HintRole::None;
  std::string hint;

  bool required() const { return !default_value.has_value(); }

  /// Builder helpers, so that schemas read as one declaration per line.
  static ParamSpec make(std::string name, ParamType type, std::string doc) {
    ParamSpec p;
    p.name = std::move(name);
    p.type = type;
    p.doc = std::move(doc);
    return p;
  }
  ParamSpec&& def(std::string value) && {
    default_value = std::move(value);
    return std::move(*this);
  }
  ParamSpec&& range(std::optional<double> lo, std::optional<double> hi) && {
    min = lo;
    max = hi;
    return std::move(*this);
  }
  ParamSpec&& one_of(std::vector<std::string> values) && {
    choices = std::move(values);
    return std::move(*this);
  }
  ParamSpec&& offers_hint(std::string name) && {
    hint_role = HintRole::Offers;
    hint = std::move(name);
    return std::move(*this);
  }
  ParamSpec&& takes_hint(std::string name) && {
    hint_role = HintRole::Takes;
    hint = std::move(name);
    return std::move(*this);
  }
};

using ParamValue = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>,
                                std::vector<double>, std::vector<std::string>>;

/// Parsed, validated parameter values handed to an operator's constructor. Every parameter of the
/// schema is present (defaults filled in) once the host has validated a stage.
class Params {
 public:
  void set(const std::string& name, ParamValue value) { values_[name] = std::move(value); }
  bool has(const std::string& name) const { return values_.count(name) != 0; }

  std::int64_t get_int(const std::string& name) const { return get<std::int64_t>(name); }
  double get_float(const std::string& name) const { return get<double>(name); }
  bool get_bool(const std::string& name) const { return get<bool>(name); }
  const std::string& get_string(const std::string& name) const { return get<std::string>(name); }
  const std::vector<std::int64_t>& get_int_list(const std::string& name) const {
    return get<std::vector<std::int64_t>>(name);
  }
  const std::vector<double>& get_float_list(const std::string& name) const { return get<std::vector<double>>(name); }
  const std::vector<std::string>& get_string_list(const std::string& name) const {
    return get<std::vector<std::string>>(name);
  }
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  template <class T> const T& get(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw ParamError("parameter '" + name + "' is not set");
    if (const T* v = std::get_if<T>(&it->second)) return *v;
    throw ParamError("parameter '" + name + "' is read with a type other than its schema's");
  }
  std::map<std::string, ParamValue> values_;
};

}  // namespace sluice
