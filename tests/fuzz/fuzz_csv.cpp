// libFuzzer target: CSV row splitting (quotes, escaped quotes, line breaks in fields).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "csv_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (char delimiter : {',', ';'}) {
    sluice::io::CsvParser parser(text, delimiter);
    std::vector<std::string> fields;
    std::size_t line = 0, rows = 0;
    try {
      while (parser.next(fields, line) && rows < 1000000) ++rows;
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}
