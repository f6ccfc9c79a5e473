// csv_reader: a CSV file into one sample per row.
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "csv_format.hpp"
#include "io_plugin.hpp"

namespace sluice::io {
namespace {

enum class ColumnType { Int64, Float, Bytes };

struct Column {
  std::string name;
  ColumnType type = ColumnType::Bytes;
};

bool is_int(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  std::strtoll(s.c_str(), &end, 10);
  return end == s.c_str() + s.size() && errno == 0;
}
bool is_float(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

class CsvReader final : public Expand {
 public:
  static OperatorInfo describe() {
    return {"csv_reader",
            OperatorKind::Expand,
            "Reads the CSV file named by 'path' into one element per row, a typed field per column",
            {ParamSpec::make("field", ParamType::String, "field holding the path").def("path"),
             ParamSpec::make("schema", ParamType::String,
                             "NAME:TYPE per column (int64, float, bytes), comma-separated; empty: names from the header, "
                             "types from the first row")
                 .def(""),
             ParamSpec::make("header", ParamType::Bool, "the first row names the columns").def("true"),
             ParamSpec::make("delimiter", ParamType::String, "one character").def(",")},
            {.stateless = true},
            {}};
  }
  explicit CsvReader(const Params& p) : field_(p.get_string("field")), header_(p.get_bool("header")) {
    const auto& d = p.get_string("delimiter");
    if (d.size() != 1) throw ParamError("delimiter must be one character, got '" + d + "'");
    delimiter_ = d[0];
    std::stringstream schema(p.get_string("schema"));
    for (std::string entry; std::getline(schema, entry, ',');) {
      auto colon = entry.rfind(':');
      auto trim = [](std::string s) {
        s.erase(0, s.find_first_not_of(" \t"));
        s.erase(s.find_last_not_of(" \t") + 1);
        return s;
      };
      if (colon == std::string::npos) throw ParamError("schema entry '" + entry + "' is not NAME:TYPE");
      Column c{trim(entry.substr(0, colon)), ColumnType::Bytes};
      auto type = trim(entry.substr(colon + 1));
      if (type == "int64") c.type = ColumnType::Int64;
      else if (type == "float") c.type = ColumnType::Float;
      else if (type != "bytes" && type != "string") throw ParamError("schema type '" + type + "' is not int64, float or bytes");
      schema_.push_back(c);
    }
    if (schema_.empty() && !header_) throw ParamError("without a header row, give a schema");
  }

  class Rows final : public ExpandCursor {
   public:
    Rows(std::string path, std::string text, std::vector<Column> schema, bool header, char delimiter, DamageReport& damage)
        : path_(std::move(path)), text_(std::move(text)), parser_(text_, delimiter), columns_(std::move(schema)), damage_(damage) {
      if (header) {
        std::vector<std::string> names;
        std::size_t line = 0;
        if (!parser_.next(names, line)) return;
        if (columns_.empty()) {
          for (auto& n : names) columns_.push_back({n, ColumnType::Bytes});
          infer_types_ = true;
        } else if (names.size() != columns_.size()) {
          throw DataError(path_ + ":" + std::to_string(line) + ": the header has " + std::to_string(names.size()) +
                          " columns, the schema " + std::to_string(columns_.size()));
        }
      }
    }
    bool next(Sample& out) override {
      std::vector<std::string> fields;
      for (;;) {
        std::size_t line = 0;
        try {
          if (!parser_.next(fields, line)) return false;
        } catch (const std::exception& e) {
          // The rest of the file cannot be split into rows reliably.
          std::string reason = path_ + ":" + std::to_string(line ? line : 0) + ": " + e.what();
          if (!damage_.skip_damaged(reason)) throw DataError(reason);
          return false;
        }
        try {
          if (fields.size() != columns_.size())
            throw DataError("row has " + std::to_string(fields.size()) + " fields, expected " + std::to_string(columns_.size()));
          if (infer_types_) {
            for (std::size_t i = 0; i < columns_.size(); ++i)
              columns_[i].type = is_int(fields[i]) ? ColumnType::Int64 : is_float(fields[i]) ? ColumnType::Float : ColumnType::Bytes;
            infer_types_ = false;
          }
          out = Sample();
          for (std::size_t i = 0; i < columns_.size(); ++i) {
            const auto& c = columns_[i];
            const auto& f = fields[i];
            if (c.type == ColumnType::Int64) {
              if (!is_int(f)) throw DataError("column '" + c.name + "': '" + f + "' is not an int64");
              out.set(c.name, Tensor::scalar<std::int64_t>(std::strtoll(f.c_str(), nullptr, 10)));
            } else if (c.type == ColumnType::Float) {
              if (!is_float(f)) throw DataError("column '" + c.name + "': '" + f + "' is not a number");
              out.set(c.name, Tensor::scalar<float>(std::strtof(f.c_str(), nullptr)));
            } else {
              out.set(c.name, Tensor::from_string(f));
            }
          }
          out.set_origin(path_ + ":" + std::to_string(line));
          return true;
        } catch (const DataError& e) {
          std::string reason = path_ + ":" + std::to_string(line) + ": " + e.what();
          if (!damage_.skip_damaged(reason)) throw DataError(reason);
        }
      }
    }

   private:
    std::string path_, text_;
    CsvParser parser_;
    std::vector<Column> columns_;
    bool infer_types_ = false;
    DamageReport& damage_;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext&, DamageReport& damage) override {
    std::string path(in.at(field_).string_at(0));
    std::ifstream file(path, std::ios::binary);
    if (!file) throw DataError("cannot open " + path);
    std::stringstream text;
    text << file.rdbuf();
    return std::make_unique<Rows>(path, text.str(), schema_, header_, delimiter_, damage);
  }

 private:
  std::string field_;
  bool header_;
  char delimiter_ = ',';
  std::vector<Column> schema_;
};

}  // namespace

void register_csv(Registrar& registrar) { registrar.add<CsvReader>(); }

}  // namespace sluice::io
