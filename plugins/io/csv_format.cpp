#include "csv_format.hpp"

#include <stdexcept>

namespace sluice::io {

bool CsvParser::next(std::vector<std::string>& fields, std::size_t& line) {
  fields.clear();
  // Skip blank lines between rows.
  while (at_ < text_.size() && (text_[at_] == '\n' || text_[at_] == '\r')) {
    if (text_[at_] == '\n') ++line_;
    ++at_;
  }
  if (at_ >= text_.size()) return false;
  line = line_;
  std::string field;
  for (;;) {
    field.clear();
    if (at_ < text_.size() && text_[at_] == '"') {
      ++at_;
      for (;;) {
        if (at_ >= text_.size()) throw std::runtime_error("unterminated quoted field");
        char c = text_[at_++];
        if (c == '"') {
          if (at_ < text_.size() && text_[at_] == '"') {
            field += '"';
            ++at_;
            continue;
          }
          break;
        }
        if (c == '\n') ++line_;
        field += c;
      }
      if (at_ < text_.size() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r')
        throw std::runtime_error("text after a closing quote");
    } else {
      while (at_ < text_.size() && text_[at_] != delimiter_ && text_[at_] != '\n' && text_[at_] != '\r') field += text_[at_++];
    }
    fields.push_back(field);
    if (at_ < text_.size() && text_[at_] == delimiter_) {
      ++at_;
      continue;
    }
    if (at_ < text_.size() && text_[at_] == '\r') ++at_;
    if (at_ < text_.size() && text_[at_] == '\n') {
      ++at_;
      ++line_;
    }
    return true;
  }
}

}  // namespace sluice::io
