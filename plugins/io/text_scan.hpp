#pragma once
// Small scanners for the short texts the io plugin checks (split expressions, dataset names,
// versions, .npy headers, brace ranges), written out rather than with std::regex: the grammars are
// tiny, and <regex> costs seconds of compiling in each translation unit that uses it.
#include <cctype>
#include <string_view>

namespace sluice::io::scan {

inline bool digit(char c) { return c >= '0' && c <= '9'; }
inline bool word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// One or more decimal digits from `at`; returns where they end (== at when there are none).
inline std::size_t digits(std::string_view s, std::size_t at) {
  while (at < s.size() && digit(s[at])) ++at;
  return at;
}
// -?DIGITS, the whole of s.
inline bool whole_number(std::string_view s) {
  const std::size_t start = !s.empty() && s[0] == '-' ? 1 : 0;
  const std::size_t end = digits(s, start);
  return end > start && end == s.size();
}
// MAJOR.MINOR.PATCH, digits each.
inline bool version(std::string_view s) {
  std::size_t at = 0;
  for (int part = 0; part < 3; ++part) {
    const std::size_t end = digits(s, at);
    if (end == at) return false;
    at = end;
    if (part < 2) {
      if (at >= s.size() || s[at] != '.') return false;
      ++at;
    }
  }
  return at == s.size();
}
// Every character of a non-empty s is a word character or one of `extra`.
inline bool name(std::string_view s, std::string_view extra) {
  if (s.empty()) return false;
  for (char c : s)
    if (!word(c) && extra.find(c) == std::string_view::npos) return false;
  return true;
}
inline std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace sluice::io::scan
