#include "csv_format.hpp"

#include <stdexcept>

namespace sluice::io {
namespace {
struct MoreTextNeeded {};
}  // namespace

bool CsvParser::at_end() const {
  if (at_ < text_.size()) return false;
  if (!final_) throw MoreTextNeeded{};
  return true;
}

bool CsvParser::next(std::vector<std::string>& fields, std::size_t& line) {
  const std::size_t row_start = at_, row_line = line_;
  try {
    return next_row(fields, line);
  } catch (const MoreTextNeeded&) {
    at_ = row_start;
    line_ = row_line;
    needs_more_ = true;
    fields.clear();
    return false;
  }
}

bool CsvParser::next_row(std::vector<std::string>& fields, std::size_t& line) {
  fields.clear();
  // Skip blank lines between rows.
  while (!at_end() && (text_[at_] == '\n' || text_[at_] == '\r')) {
    if (text_[at_] == '\n') ++line_;
    ++at_;
  }
  if (at_end()) return false;
  line = line_;
  std::string field;
  for (;;) {
    field.clear();
    if (!at_end() && text_[at_] == '"') {
      ++at_;
      for (;;) {
        if (at_end()) throw std::runtime_error("unterminated quoted field");
        char c = text_[at_++];
        if (c == '"') {
          if (!at_end() && text_[at_] == '"') {
            field += '"';
            ++at_;
            continue;
          }
          break;
        }
        if (c == '\n') ++line_;
        field += c;
      }
      if (!at_end() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r')
        throw std::runtime_error("text after a closing quote");
    } else {
      while (!at_end() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r') field += text_[at_++];
    }
    fields.push_back(field);
    if (!at_end() && text_[at_] == delimiter_) {
      ++at_;
      continue;
    }
    if (!at_end() && text_[at_] == '\r') ++at_;
    if (!at_end() && text_[at_] == '\n') {
      ++at_;
      ++line_;
    }
    return true;
  }
}

}  // namespace sluice::io
