#pragma once
// CSV rows (RFC 4180: quoted fields, "" inside quotes, line breaks inside quotes).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::io {

class CsvParser {
 public:
  CsvParser(std::string_view text, char delimiter) : text_(text), delimiter_(delimiter) {}
  // The next row's fields, or false at the end. `line` is the row's first line (1-based).
  // Throws std::runtime_error for an unterminated quote or text after a closing quote.
  bool next(std::vector<std::string>& fields, std::size_t& line);

 private:
  std::string_view text_;
  char delimiter_;
  std::size_t at_ = 0, line_ = 1;
};

}  // namespace sluice::io
