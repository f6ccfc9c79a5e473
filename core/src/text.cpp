#include "sluice/core/text.hpp"

#include <algorithm>
#include <numeric>

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

}  // namespace sluice
