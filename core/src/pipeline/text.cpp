#include "sluice/core/text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace sluice {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> closest_names(std::string_view word, const std::vector<std::string>& candidates,
                                       std::size_t count) {
  std::vector<std::pair<std::size_t, std::string>> scored;
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    bool contains = !word.empty() && (c.find(word) != std::string::npos || word.find(c) != std::string_view::npos);
    if (d <= limit || contains) scored.emplace_back(contains ? std::min(d, limit) : d, c);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (auto& [d, name] : scored) {
    if (out.size() == count) break;
    out.push_back(name);
  }
  return out;
}

bool has_control_characters(std::string_view text) {
  for (unsigned char c : text)
    if (c < 0x20 || c == 0x7f) return true;
  return false;
}

std::string printable(std::string_view text, bool keep_line_breaks) {
  if (!has_control_characters(text)) return std::string(text);
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n' && keep_line_breaks) out += '\n';
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      static const char* digits = "0123456789abcdef";
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string did_you_mean(const std::vector<std::string>& suggestions) {
  if (suggestions.empty()) return "";
  std::string s = " (did you mean ";
  for (std::size_t i = 0; i < suggestions.size(); ++i) {
    if (i) s += (i + 1 == suggestions.size()) ? " or " : ", ";
    s += "'" + suggestions[i] + "'";
  }
  return s + "?)";
}

std::optional<std::uint64_t> parse_byte_size(const std::string& text) {
  std::size_t at = 0;
  while (at < text.size() && (std::isdigit(static_cast<unsigned char>(text[at])) || text[at] == '.')) ++at;
  if (at == 0) return std::nullopt;
  double number = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + at, number);
  if (error != std::errc() || end != text.data() + at) return std::nullopt;
  std::string unit = text.substr(at);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::vector<std::pair<std::vector<std::string>, int>> units = {
      {{"", "B"}, 0}, {{"K", "KB", "KIB"}, 10}, {{"M", "MB", "MIB"}, 20}, {{"G", "GB", "GIB"}, 30}, {{"T", "TB", "TIB"}, 40}};
  for (const auto& [names, shift] : units)
    for (const auto& name : names)
      if (unit == name) {
        const double bytes = std::ldexp(number, shift);
        if (bytes >= 0x1p63) return std::nullopt;
        return static_cast<std::uint64_t>(bytes);
      }
  return std::nullopt;
}

std::optional<double> parse_duration_seconds(const std::string& text) {
  double number = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end == text.data() || !(number >= 0) || number > 1e9) return std::nullopt;
  const std::string unit(end, text.data() + text.size());
  if (unit.empty() || unit == "s") return number;
  if (unit == "ms") return number / 1000;
  if (unit == "m") return number * 60;
  if (unit == "h") return number * 3600;
  return std::nullopt;
}

std::string byte_size_text(std::uint64_t bytes) {
  static const char* const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return value >= 100 ? fmt::format("{:.0f} {}", value, names[unit]) : fmt::format("{:.3g} {}", value, names[unit]);
}

std::size_t json_nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace sluice
