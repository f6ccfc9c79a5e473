// csv_reader: a CSV file into one sample per row.
#include <cerrno>
#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "byte_source.hpp"
#include "csv_format.hpp"
#include "io_plugin.hpp"

namespace sluice::io {
namespace {

enum class ColumnType { Int64, Float, Bytes };

struct CsvColumn {
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
             ParamSpec::make("delimiter", ParamType::String, "one character").def(","),
             ParamSpec::make("select_columns", ParamType::StringList, "the columns to keep, by name, in this order; empty: all").def(""),
             ParamSpec::make("na_values", ParamType::StringList,
                             "cells that mean a missing value (as written, e.g. NA,null,-); an empty cell is missing too when "
                             "listed as \"\"")
                 .def(""),
             ParamSpec::make("defaults", ParamType::StringList,
                             "COLUMN:VALUE for missing values; a missing float without one is NaN, a missing int64 is an error")
                 .def("")},
            {.stateless = true},
            {}};
  }
  explicit CsvReader(const Params& p)
      : field_(p.get_string("field")),
        header_(p.get_bool("header")),
        select_(p.get_string_list("select_columns")),
        na_values_(p.get_string_list("na_values")) {
    for (auto& v : na_values_)
      if (v == "\"\"") v.clear();
    for (const auto& entry : p.get_string_list("defaults")) {
      const auto colon = entry.find(':');
      if (colon == std::string::npos || colon == 0) throw ParamError("defaults entry '" + entry + "' is not COLUMN:VALUE");
      if (!defaults_.emplace(entry.substr(0, colon), entry.substr(colon + 1)).second)
        throw ParamError("defaults names column '" + entry.substr(0, colon) + "' twice");
    }
    for (std::size_t i = 0; i < select_.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (select_[i] == select_[j]) throw ParamError("select_columns names column '" + select_[i] + "' twice");
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
      CsvColumn c{trim(entry.substr(0, colon)), ColumnType::Bytes};
      auto type = trim(entry.substr(colon + 1));
      if (type == "int64") c.type = ColumnType::Int64;
      else if (type == "float") c.type = ColumnType::Float;
      else if (type != "bytes" && type != "string") throw ParamError("schema type '" + type + "' is not int64, float or bytes");
      for (const auto& earlier : schema_)
        if (earlier.name == c.name) throw ParamError("schema names column '" + c.name + "' twice");
      schema_.push_back(c);
    }
    if (schema_.empty() && !header_) throw ParamError("without a header row, give a schema");
    for (const auto& name : select_)
      if (!schema_.empty() && std::none_of(schema_.begin(), schema_.end(), [&](const CsvColumn& c) { return c.name == name; }))
        throw ParamError("select_columns names '" + name + "', which the schema has not");
  }

  // Rows of one file, read in chunks as they are needed: memory holds the chunk and the row
  // being split, never the whole file.
  class Rows final : public ExpandCursor {
   public:
    Rows(std::string path, std::vector<CsvColumn> schema, bool header, char delimiter, const CsvReader& op, DamageReport& damage,
         Storage* storage)
        : path_(std::move(path)), source_(open_file(path_, Compression::None, storage)), parser_({}, delimiter, false), columns_(std::move(schema)),
          op_(op), damage_(damage) {
      if (header) read_header();
      // The columns handed out: the selected ones in their order, else all.
      for (const auto& name : op_.select_) {
        std::size_t k = 0;
        while (k < columns_.size() && columns_[k].name != name) ++k;
        if (k == columns_.size()) {
          std::string have;
          for (const auto& c : columns_) have += (have.empty() ? "" : ", ") + c.name;
          throw DataError(path_ + ": select_columns names '" + name + "', which is not a column (columns: " + have + ")");
        }
        selected_.push_back(k);
      }
      if (op_.select_.empty())
        for (std::size_t k = 0; k < columns_.size(); ++k) selected_.push_back(k);
    }
    void read_header() {
      std::vector<std::string> names;
      std::size_t line = 0;
      if (!next_fields(names, line)) return;
      if (!names.empty() && names[0].compare(0, 3, "\xEF\xBB\xBF") == 0) names[0].erase(0, 3);  // a UTF-8 byte-order mark
      if (columns_.empty()) {
        for (std::size_t i = 0; i < names.size(); ++i)
          for (std::size_t j = 0; j < i; ++j)
            if (names[i] == names[j])
              throw DataError(path_ + ":" + std::to_string(line) + ": columns " + std::to_string(j + 1) + " and " +
                              std::to_string(i + 1) + " are both named '" + names[i] +
                              "'; rename one, or give a schema with a name per column");
        for (auto& n : names) columns_.push_back({n, ColumnType::Bytes});
        infer_types_ = true;
      } else if (names.size() != columns_.size()) {
        throw DataError(path_ + ":" + std::to_string(line) + ": the header has " + std::to_string(names.size()) +
                        " columns, the schema " + std::to_string(columns_.size()));
      }
    }
    bool next(Sample& out) override {
      std::vector<std::string> fields;
      for (;;) {
        std::size_t line = 0;
        try {
          if (!next_fields(fields, line)) return false;
        } catch (const DataError&) {
          throw;
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
            // From the first row; a column missing there is taken as float (a missing float is
            // NaN); give a schema when that guess is wrong.
            for (std::size_t i = 0; i < columns_.size(); ++i)
              columns_[i].type = is_missing(fields[i]) ? ColumnType::Float
                                 : is_int(fields[i])   ? ColumnType::Int64
                                 : is_float(fields[i]) ? ColumnType::Float
                                                       : ColumnType::Bytes;
            infer_types_ = false;
          }
          out = Sample();
          out.reserve(selected_.size());
          for (std::size_t i : selected_) {
            const auto& c = columns_[i];
            const std::string* cell = &fields[i];  // the cell, or its column's default (no copy per cell)
            if (is_missing(*cell)) {
              auto d = op_.defaults_.find(c.name);
              if (d != op_.defaults_.end()) {
                cell = &d->second;
              } else if (c.type == ColumnType::Float) {
                out.set(c.name, Tensor::scalar<float>(std::numeric_limits<float>::quiet_NaN()));
                continue;
              } else if (c.type == ColumnType::Int64) {
                throw DataError("column '" + c.name + "' is missing ('" + *cell + "') and has no default; give defaults: \"" + c.name +
                                ":VALUE\" or make it a float column (missing floats are NaN)");
              }
            }
            const std::string& f = *cell;
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
    static constexpr std::size_t kChunk = 1 << 20;
    static constexpr std::size_t kMaxRowBytes = 256u << 20;
    bool is_missing(const std::string& cell) const {
      return std::find(op_.na_values_.begin(), op_.na_values_.end(), cell) != op_.na_values_.end();
    }

    // The next row, reading more of the file while the parser needs it.
    bool next_fields(std::vector<std::string>& fields, std::size_t& line) {
      for (;;) {
        if (parser_.next(fields, line)) return true;
        if (!parser_.needs_more()) return false;
        text_.erase(0, parser_.consumed());
        if (text_.size() > kMaxRowBytes)
          throw DataError(path_ + ": a row is longer than " + std::to_string(kMaxRowBytes >> 20) +
                          " MB (an unterminated quote?)");
        const std::size_t had = text_.size();
        text_.resize(had + kChunk);
        const std::size_t got = source_->read(reinterpret_cast<std::byte*>(text_.data() + had), kChunk);
        text_.resize(had + got);
        parser_.refill(text_, got == 0);
      }
    }

    std::string path_;
    std::unique_ptr<ByteSource> source_;  // a local file or a remote object
    std::string text_;
    CsvParser parser_;
    std::vector<CsvColumn> columns_;
    std::vector<std::size_t> selected_;  // the columns handed out, in order
    const CsvReader& op_;
    bool infer_types_ = false;
    DamageReport& damage_;
  };

  std::unique_ptr<ExpandCursor> open(Sample in, const ElementContext& ctx, DamageReport& damage) override {
    return std::make_unique<Rows>(std::string(in.at(field_).string_at(0)), schema_, header_, delimiter_, *this, damage,
                                  ctx.stage ? ctx.stage->storage : nullptr);
  }

 private:
  std::string field_;
  bool header_;
  char delimiter_ = ',';
  std::vector<CsvColumn> schema_;
  std::vector<std::string> select_, na_values_;
  std::map<std::string, std::string> defaults_;
};

}  // namespace

void register_csv(Registrar& registrar) { registrar.add<CsvReader>(); }

}  // namespace sluice::io
