#pragma once
// CSV rows (RFC 4180: quoted fields, "" inside quotes, line breaks inside quotes), from the whole
// text at once or from a text that arrives in pieces (a file read in chunks).
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::io {

class CsvParser {
 public:
  // `final`: the text is all there is. Otherwise a row that reaches the end of the text may go on
  // in bytes not yet given: next() then returns false with needs_more() set, and consumes nothing.
  CsvParser(std::string_view text, char delimiter, bool final = true) : text_(text), delimiter_(delimiter), final_(final) {}
  // The next row's fields, or false at the end (or when more text is needed). `line` is the row's
  // first line (1-based). Throws std::runtime_error for an unterminated quote or text after a
  // closing quote.
  bool next(std::vector<std::string>& fields, std::size_t& line);

  bool needs_more() const { return needs_more_; }
  // Bytes of the text that whole rows used; the rest is the start of the next row.
  std::size_t consumed() const { return at_; }
  // Goes on with `text`, which must start with the bytes not consumed so far.
  void refill(std::string_view text, bool final) {
    text_ = text;
    at_ = 0;
    final_ = final;
    needs_more_ = false;
  }

 private:
  bool next_row(std::vector<std::string>& fields, std::size_t& line);
  // True at the end of the text; when more may come, it abandons the row instead.
  bool at_end() const;

  std::string_view text_;
  char delimiter_;
  bool final_;
  bool needs_more_ = false;
  std::size_t at_ = 0, line_ = 1;
};

}  // namespace sluice::io
