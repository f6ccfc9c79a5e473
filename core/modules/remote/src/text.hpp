#pragma once
// Text helpers shared by remote/'s sources (header names, INI lines, HTTP header lines).
#include <cctype>
#include <string>
#include <string_view>

namespace sluice::remote {

inline std::string lowercase(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Without leading and trailing spaces, tabs and line ends.
inline std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace sluice::remote
