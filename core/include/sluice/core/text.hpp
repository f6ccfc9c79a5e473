#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

// Edit distance between two strings, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidates close enough to `word` to be a plausible typo, closest first, at most `count`.
std::vector<std::string> closest_names(std::string_view word, const std::vector<std::string>& candidates,
                                       std::size_t count = 3);

// `text` with control characters (newlines, terminal escape codes) written as \n, \t or \xNN, so
// that a name taken from a file cannot break or take over the terminal it is printed on.
// `keep_line_breaks` leaves \n as it is, for multi-line messages of our own.
std::string printable(std::string_view text, bool keep_line_breaks = false);
bool has_control_characters(std::string_view text);

// " (did you mean 'a' or 'b'?)", or "" when nothing is close.
std::string did_you_mean(const std::vector<std::string>& suggestions);

// How deeply JSON text nests arrays and objects (brackets inside strings do not count). Checked
// before a JSON parser sees text from outside: protobuf's takes time quadratic in the depth
// (60,000 nested arrays in a 120 KB TF_CONFIG ran for more than ten minutes).
std::size_t json_nesting_depth(std::string_view text);
// Nesting no pipeline file, TF_CONFIG or metrics snapshot has legitimately.
inline constexpr std::size_t kDeepestJson = 100;

// "4GiB", "512MB", "1.5G", "65536" -> bytes (K/M/G/T and their -iB forms are powers of 1024, as
// memory is counted). Nullopt when it is not a size.
std::optional<std::uint64_t> parse_byte_size(const std::string& text);
std::string byte_size_text(std::uint64_t bytes);  // "1.5 GiB"
// "250ms", "30s", "5m", "1.5h", or a number of seconds -> seconds. Nullopt when it is not one.
std::optional<double> parse_duration_seconds(const std::string& text);

}  // namespace sluice
