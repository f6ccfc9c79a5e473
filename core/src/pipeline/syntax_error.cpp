#include "syntax_error.hpp"

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>

#include <cctype>
#include <regex>
#include <vector>

#include "pipeline.pb.h"
#include "sluice/core/text.hpp"

namespace sluice {

namespace {
using google::protobuf::Descriptor;

// A `name {` not closed yet at the error: what it is, where it opens, which message it fills
// (null for a name the pipeline does not have).
struct OpenBlock {
  std::string name;
  int line = 0;
  const Descriptor* type = nullptr;
};

bool starts_name(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool in_name(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::size_t offset_of(const std::string& text, int line, int column) {
  std::size_t at = 0;
  for (int l = 1; l < line && at < text.size(); ++at)
    if (text[at] == '\n') ++l;
  return std::min(text.size(), at + static_cast<std::size_t>(std::max(0, column - 1)));
}

// The blocks open where the parser stopped, outermost first: names, strings, comments and braces
// read as the text format reads them.
std::vector<OpenBlock> open_blocks(const std::string& text, std::size_t end) {
  std::vector<OpenBlock> stack;
  std::string last_name;
  int line = 1;
  for (std::size_t i = 0; i < end; ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '#') {
      while (i + 1 < end && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      for (++i; i < end && text[i] != c; ++i) {
        if (text[i] == '\\') ++i;
        else if (text[i] == '\n') ++line;
      }
      last_name.clear();
    } else if (starts_name(c)) {
      std::size_t j = i;
      while (j < text.size() && in_name(text[j])) ++j;
      last_name = text.substr(i, j - i);
      i = j - 1;
    } else if (c == '{' || c == '<') {
      const Descriptor* parent = stack.empty() ? spec::PipelineSpec::descriptor() : stack.back().type;
      const auto* field = parent ? parent->FindFieldByName(last_name) : nullptr;
      stack.push_back({last_name, line, field ? field->message_type() : nullptr});
      last_name.clear();
    } else if (c == '}' || c == '>') {
      if (!stack.empty()) stack.pop_back();
      last_name.clear();
    } else if (c != ':' && !std::isspace(static_cast<unsigned char>(c))) {
      last_name.clear();
    }
  }
  return stack;
}

std::vector<std::string> field_names(const Descriptor* type) {
  std::vector<std::string> names;
  for (int k = 0; type && k < type->field_count(); ++k) names.push_back(type->field(k)->name());
  return names;
}

// A name its block does not have: a `}` missing before it (the name belongs to a block further
// out), or a misspelt setting.
Problem unknown_name(const std::string& file, int line, int column, const std::string& name, const std::vector<OpenBlock>& open) {
  for (std::size_t k = open.size(); k-- > 0;) {
    const Descriptor* outer = k == 0 ? spec::PipelineSpec::descriptor() : open[k - 1].type;
    if (outer && outer->FindFieldByName(name) && !(open.back().type && open.back().type->FindFieldByName(name)))
      return {file, open[k].line, 1, "", "",
              fmt::format("syntax error: the `{} {{` opened on line {} is not closed: a `}}` is missing before `{}` on line {}",
                          open[k].name, open[k].line, name, line)};
  }
  const Descriptor* inside = open.empty() ? spec::PipelineSpec::descriptor() : open.back().type;
  const std::string where = open.empty() ? "the top level of a pipeline file" : fmt::format("a `{} {{ }}` block", open.back().name);
  const auto close = closest_names(name, field_names(inside));
  std::string text = fmt::format("syntax error: {} has no setting '{}'{}; it has {}", where, printable(name), did_you_mean(close),
                                 fmt::join(field_names(inside), ", "));
  if (inside == spec::Stage::descriptor() && close.empty())
    text += fmt::format(" (an operator's parameters go in `params {{ key: \"{}\" value: \"...\" }}`)", printable(name));
  return {file, line, column, "", "", text};
}
}  // namespace

Problem explain_syntax_error(const std::string& text, const std::string& file, int line, int column, const std::string& message) {
  static const std::regex no_field("Message type \"[\\w.]+\" has no field named \"(\\w+)\"\\.?");
  static const std::regex expected("Expected (string|integer|double|identifier|\"\\{\"|\"\\}\"|\":\"), got: (.*)");
  static const std::regex enum_value("Unknown enumeration value of \"(\\w+)\" for field \"(\\w+)\"\\.?");
  std::smatch found;
  if (std::regex_match(message, found, no_field))
    return unknown_name(file, line, column, found[1], open_blocks(text, offset_of(text, line, column)));
  if (std::regex_match(message, found, expected)) {
    const std::string what = found[1], got = found[2];
    if (got.empty())
      return {file, line, column, "", "", "syntax error: the file ends here: is it cut short (a block not closed with `}`, a name "
                                          "without its value)?"};
    if (what == "string")
      return {file, line, column, "", "", fmt::format("syntax error: a quoted text was expected, found {}: write it in double quotes, \"{}\"",
                                                      printable(got), printable(got))};
    if (what == "integer" || what == "double")
      return {file, line, column, "", "", fmt::format("syntax error: a number was expected, found {}{}", printable(got),
                                                      got.size() > 1 && got.front() == '"' ? ": write it without quotes" : "")};
    const std::string wanted = what == "identifier" ? "a setting's name" : "`" + what.substr(1, what.size() - 2) + "`";
    return {file, line, column, "", "", fmt::format("syntax error: {} was expected, found {}", wanted, printable(got))};
  }
  if (std::regex_match(message, found, enum_value)) {
    const auto open = open_blocks(text, offset_of(text, line, column));
    const Descriptor* inside = open.empty() ? spec::PipelineSpec::descriptor() : open.back().type;
    const auto* field = inside ? inside->FindFieldByName(found[2]) : nullptr;
    std::vector<std::string> values;
    // The values a file may write: the "not set" value (FOO_UNSET = 0) is what leaving it out means.
    for (int k = 0; field && field->enum_type() && k < field->enum_type()->value_count(); ++k) {
      const std::string& value = field->enum_type()->value(k)->name();
      if (value.size() < 6 || value.compare(value.size() - 6, 6, "_UNSET") != 0) values.push_back(value);
    }
    return {file, line, column, "", "", fmt::format("syntax error: '{}' is not a value of '{}'{}; it takes {}", printable(found[1].str()), found[2].str(),
                                                    did_you_mean(closest_names(found[1].str(), values)), fmt::join(values, ", "))};
  }
  return {file, line, column, "", "", "syntax error: " + printable(message)};
}

}  // namespace sluice
