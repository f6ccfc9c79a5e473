#include "example_codec.hpp"

#include <cstring>
#include <unordered_map>

namespace sluice::io {

const char* feature_kind_name(FeatureKind kind) {
  switch (kind) {
    case FeatureKind::Bytes: return "bytes";
    case FeatureKind::Int64: return "int64";
    case FeatureKind::Float: return "float";
  }
  return "?";
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits on commas outside brackets.
std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      auto part = trim(text.substr(start, i - start));
      if (!part.empty()) parts.push_back(part);
      start = i + 1;
    } else if (text[i] == '[') {
      ++depth;
    } else if (text[i] == ']') {
      --depth;
    }
  }
  return parts;
}

// ---- wire format ----

struct WireField {
  std::uint32_t number = 0;
  int type = 0;
  std::uint64_t value = 0;              // varint or fixed
  const std::uint8_t* data = nullptr;  // length-delimited
  std::size_t size = 0;
};

class Wire {
 public:
  Wire(const std::uint8_t* p, std::size_t n) : p_(p), end_(p + n) {}
  bool next(WireField& f) {
    if (p_ == end_) return false;
    std::uint64_t key = varint();
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.type = static_cast<int>(key & 7);
    switch (f.type) {
      case 0: f.value = varint(); break;
      case 1: f.value = fixed(8); break;
      case 5: f.value = fixed(4); break;
      case 2: {
        std::uint64_t n = varint();
        if (n > static_cast<std::uint64_t>(end_ - p_)) throw DataError("malformed record: a field runs past the end");
        f.data = p_;
        f.size = static_cast<std::size_t>(n);
        p_ += n;
        break;
      }
      default: throw DataError("malformed record: unsupported protobuf wire type " + std::to_string(f.type));
    }
    if (f.number == 0) throw DataError("malformed record: field number 0");
    return true;
  }
  bool at_end() const { return p_ == end_; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) throw DataError("malformed record: truncated varint");
      std::uint8_t b = *p_++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw DataError("malformed record: varint longer than 10 bytes");
  }

 private:
  std::uint64_t fixed(int n) {
    if (end_ - p_ < n) throw DataError("malformed record: truncated fixed-width field");
    std::uint64_t v = 0;
    std::memcpy(&v, p_, n);
    p_ += n;
    return v;
  }
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

struct Span {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  bool present = false;
};

// The values of one Feature message.
struct FeatureValues {
  std::optional<FeatureKind> kind;  // empty for a Feature with no kind set
  std::vector<std::pair<const std::uint8_t*, std::size_t>> bytes;
  std::vector<std::int64_t> ints;
  std::vector<float> floats;
  std::size_t count() const {
    return kind == FeatureKind::Bytes ? bytes.size() : kind == FeatureKind::Int64 ? ints.size() : floats.size();
  }
};

// Into `out`, whose vectors keep their memory from one record to the next (the chunked parser's).
void decode_feature(Span feature, FeatureValues& out) {
  out.kind.reset();
  out.bytes.clear();
  out.ints.clear();
  out.floats.clear();
  Wire w(feature.data, feature.size);
  WireField f;
  Span list;
  int which = 0;
  while (w.next(f)) {
    if (f.type == 2 && f.number >= 1 && f.number <= 3) {  // oneof: the last one wins
      which = static_cast<int>(f.number);
      list = {f.data, f.size, true};
    }
  }
  if (!which) return;
  Wire values(list.data, list.size);
  if (which == 1) {
    out.kind = FeatureKind::Bytes;
    while (values.next(f))
      if (f.number == 1 && f.type == 2) out.bytes.emplace_back(f.data, f.size);
  } else if (which == 2) {
    out.kind = FeatureKind::Float;
    while (values.next(f)) {
      if (f.number != 1) continue;
      if (f.type == 2) {
        if (f.size % 4) throw DataError("malformed record: packed float list of " + std::to_string(f.size) + " bytes");
        std::size_t n = f.size / 4;
        std::size_t at = out.floats.size();
        out.floats.resize(at + n);
        if (n) std::memcpy(out.floats.data() + at, f.data, f.size);  // an empty list's data may be null
      } else if (f.type == 5) {
        float v;
        auto bits = static_cast<std::uint32_t>(f.value);
        std::memcpy(&v, &bits, 4);
        out.floats.push_back(v);
      }
    }
  } else {
    out.kind = FeatureKind::Int64;
    while (values.next(f)) {
      if (f.number != 1) continue;
      if (f.type == 2) {
        Wire packed(f.data, f.size);
        while (!packed.at_end()) out.ints.push_back(static_cast<std::int64_t>(packed.varint()));
      } else if (f.type == 0) {
        out.ints.push_back(static_cast<std::int64_t>(f.value));
      }
    }
  }
}

FeatureValues decode_feature(Span feature) {
  FeatureValues out;
  decode_feature(feature, out);
  return out;
}

// Map<string, MESSAGE> entries (key = field 1, value = field 2) whose key is wanted.
void collect_entries(Span map_owner, std::uint32_t entry_field, const std::unordered_map<std::string_view, std::size_t>& wanted,
                     std::vector<Span>& found) {
  Wire w(map_owner.data, map_owner.size);
  WireField f;
  while (w.next(f)) {
    if (f.number != entry_field || f.type != 2) continue;
    Wire entry(f.data, f.size);
    WireField e;
    std::string_view key;
    Span value{nullptr, 0, true};  // an entry without a value holds an empty message
    while (entry.next(e)) {
      if (e.number == 1 && e.type == 2) key = {reinterpret_cast<const char*>(e.data), e.size};
      else if (e.number == 2 && e.type == 2) value = {e.data, e.size, true};
    }
    auto it = wanted.find(key);
    if (it != wanted.end()) found[it->second] = value;  // a repeated key: the last one wins
  }
}

double parse_number(const std::string& text, const std::string& feature) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size())
    throw ParamError("feature '" + feature + "': default '" + text + "' is not a number");
  return v;
}

Tensor make_tensor(const FeatureSpec& spec, const FeatureValues& values, const std::shared_ptr<Buffer>& buffer, Shape shape) {
  switch (spec.kind) {
    case FeatureKind::Bytes: {
      const auto* begin = reinterpret_cast<const std::uint8_t*>(buffer->data());
      if (values.bytes.size() == 1 && shape.empty() && values.bytes[0].first >= begin &&
          values.bytes[0].first + values.bytes[0].second <= begin + buffer->size()) {
        // A view of the record: an encoded image is not copied.
        return Tensor::bytes_view(buffer, static_cast<std::size_t>(values.bytes[0].first - begin), values.bytes[0].second);
      }
      std::vector<std::string_view> views;
      for (auto [p, n] : values.bytes) views.emplace_back(reinterpret_cast<const char*>(p), n);
      return Tensor::from_strings(views, std::move(shape));
    }
    case FeatureKind::Int64: {
      Tensor t = Tensor::empty(DType::I64, std::move(shape));
      if (!values.ints.empty()) std::memcpy(t.raw_data(), values.ints.data(), values.ints.size() * 8);
      return t;
    }
    case FeatureKind::Float: {
      Tensor t = Tensor::empty(DType::F32, std::move(shape));
      if (!values.floats.empty()) std::memcpy(t.raw_data(), values.floats.data(), values.floats.size() * 4);
      return t;
    }
  }
  throw Error("unknown feature kind");
}

// The default of a spec as values of its kind, repeated to fill `count`.
FeatureValues default_values(const FeatureSpec& spec, std::size_t count) {
  FeatureValues v;
  v.kind = spec.kind;
  const auto& d = *spec.default_values;
  for (std::size_t i = 0; i < count; ++i) {
    const std::string& text = d.size() == 1 ? d[0] : d[i];
    switch (spec.kind) {
      case FeatureKind::Bytes:
        v.bytes.emplace_back(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
        break;
      case FeatureKind::Int64: v.ints.push_back(static_cast<std::int64_t>(parse_number(text, spec.name))); break;
      case FeatureKind::Float: v.floats.push_back(static_cast<float>(parse_number(text, spec.name))); break;
    }
  }
  return v;
}

// Every record gets a fixed shape's values (its default where the record lacks it): a shape no
// memory could hold ([100000,100000] of float: 40 GB a record) is refused with the spec, not met
// by the kernel's out-of-memory killer on the first record.
void refuse_beyond_memory(const FeatureSpec& spec) {
  long double values = 1;
  for (auto d : spec.shape) values *= static_cast<long double>(d);
  const auto beyond = beyond_memory(values * (spec.kind == FeatureKind::Bytes ? 16 : spec.kind == FeatureKind::Int64 ? 8 : 4), " a record");
  if (!beyond) return;
  throw ParamError("feature '" + spec.name + "': shape " + shape_string(spec.shape) + " is " + *beyond +
                   "; give the shape the records have ([] for variable length)");
}

}  // namespace

std::vector<FeatureSpec> parse_feature_spec(const std::string& text) {
  std::vector<FeatureSpec> specs;
  for (auto entry : split_top_level(text)) {
    FeatureSpec spec;
    std::string_view rest = entry;
    auto eq = rest.find('=');
    std::string_view default_text;
    if (eq != std::string_view::npos) {
      default_text = trim(rest.substr(eq + 1));
      rest = trim(rest.substr(0, eq));
    }
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      throw ParamError("feature spec entry '" + std::string(entry) + "' is not NAME:DTYPE (e.g. image/encoded:bytes)");
    spec.name = std::string(trim(rest.substr(0, colon)));
    // "image:bytes label:int64": two entries without the comma between them would otherwise make
    // one feature named "image:bytes label", found in no record.
    if (const auto blank = spec.name.find_first_of(" \t\n"); blank != std::string::npos && spec.name.find(':') < blank) {
      const std::size_t next = spec.name.find_first_not_of(" \t\n", blank);
      const std::size_t column = static_cast<std::size_t>(entry.data() - text.data()) + next + 1;
      throw ParamError("'" + std::string(entry) + "' lacks a ',' before '" + std::string(entry.substr(next)) + "' (column " +
                       std::to_string(column) + "): separate the features with commas, as " + std::string(entry.substr(0, blank)) +
                       ", " + std::string(entry.substr(next)));
    }
    std::string_view type = trim(rest.substr(colon + 1));
    auto bracket = type.find('[');
    std::string_view dtype = trim(type.substr(0, bracket));
    if (dtype == "bytes" || dtype == "string") spec.kind = FeatureKind::Bytes;
    else if (dtype == "int64") spec.kind = FeatureKind::Int64;
    else if (dtype == "float") spec.kind = FeatureKind::Float;
    else throw ParamError("feature '" + spec.name + "': dtype '" + std::string(dtype) + "' is not bytes, int64 or float");
    if (bracket != std::string_view::npos) {
      if (type.back() != ']') throw ParamError("feature '" + spec.name + "': shape '" + std::string(type.substr(bracket)) + "' lacks ']'");
      std::string_view dims = trim(type.substr(bracket + 1, type.size() - bracket - 2));
      if (dims.empty()) {
        spec.var_len = true;
      } else {
        for (auto d : split_top_level(dims)) {
          char* end = nullptr;
          std::string s(d);
          long long v = std::strtoll(s.c_str(), &end, 10);
          if (s.empty() || end != s.c_str() + s.size() || v < 0)
            throw ParamError("feature '" + spec.name + "': dimension '" + s + "' is not a non-negative integer");
          spec.shape.push_back(v);
        }
        refuse_beyond_memory(spec);
      }
    }
    if (!default_text.empty()) {
      std::vector<std::string> values;
      if (default_text.front() == '[' && default_text.back() == ']') {
        for (auto v : split_top_level(default_text.substr(1, default_text.size() - 2))) values.emplace_back(v);
      } else {
        values.emplace_back(default_text);
      }
      std::size_t need = static_cast<std::size_t>(shape_elements(spec.shape));
      if (!spec.var_len && values.size() != 1 && values.size() != need)
        throw ParamError("feature '" + spec.name + "': default has " + std::to_string(values.size()) + " values, shape " +
                         shape_string(spec.shape) + " needs 1 or " + std::to_string(need));
      spec.default_values = values;
      default_values(spec, values.size());  // checks numbers now, not per record
    }
    for (const auto& other : specs)
      if (other.name == spec.name) throw ParamError("feature '" + spec.name + "' appears twice in the spec");
    specs.push_back(std::move(spec));
  }
  return specs;
}

ExampleParser::ExampleParser(std::vector<FeatureSpec> features, std::vector<FeatureSpec> sequence)
    : features_(std::move(features)), sequence_(std::move(sequence)) {
  for (const auto& s : sequence_)
    for (const auto& f : features_)
      if (s.name == f.name) throw ParamError("feature '" + s.name + "' is both a context and a sequence feature");
  // Views of the names in features_ and sequence_, which no longer change.
  for (std::size_t i = 0; i < features_.size(); ++i) feature_index_.emplace(features_[i].name, i);
  for (std::size_t i = 0; i < sequence_.size(); ++i) sequence_index_.emplace(sequence_[i].name, i);
}

void ExampleParser::parse(const std::shared_ptr<Buffer>& buffer, std::size_t offset, std::size_t length, Sample& out) const {
  const auto* base = reinterpret_cast<const std::uint8_t*>(buffer->data()) + offset;
  // Top level: Example { features = 1 } or SequenceExample { context = 1; feature_lists = 2 }.
  Span features_msg{nullptr, 0, true}, lists_msg{nullptr, 0, true};
  {
    Wire w(base, length);
    WireField f;
    while (w.next(f)) {
      if (f.number == 1 && f.type == 2) features_msg = {f.data, f.size, true};
      else if (f.number == 2 && f.type == 2) lists_msg = {f.data, f.size, true};
    }
  }
  std::vector<Span> found(features_.size());
  if (features_msg.data) collect_entries(features_msg, 1, feature_index_, found);
  for (std::size_t i = 0; i < features_.size(); ++i) {
    const FeatureSpec& spec = features_[i];
    FeatureValues values;
    if (found[i].present) values = decode_feature(found[i]);
    if (values.kind && *values.kind != spec.kind)
      throw SchemaMismatch("feature '" + spec.name + "' holds " + feature_kind_name(*values.kind) + " values, the spec says " +
                      feature_kind_name(spec.kind));
    const bool missing = !found[i].present || !values.kind;  // an empty Feature counts as missing
    if (spec.var_len) {
      if (missing && spec.default_values) values = default_values(spec, spec.default_values->size());
      out.set(spec.name, make_tensor(spec, values, buffer, {static_cast<std::int64_t>(values.count())}));
      continue;
    }
    const std::size_t need = static_cast<std::size_t>(shape_elements(spec.shape));
    if (missing) {
      if (!spec.default_values)
        throw SchemaMismatch("feature '" + spec.name + "' is " + (found[i].present ? "empty" : "missing") +
                        " and the spec gives no default (add =VALUE, or make it variable-length with [])");
      values = default_values(spec, need);
    }
    if (values.count() != need)
      throw DataError("feature '" + spec.name + "' has " + std::to_string(values.count()) + " values, the spec's shape " +
                      shape_string(spec.shape) + " needs " + std::to_string(need));
    out.set(spec.name, make_tensor(spec, values, buffer, spec.shape));
  }

  if (sequence_.empty()) return;
  std::vector<Span> lists(sequence_.size());
  if (lists_msg.data) collect_entries(lists_msg, 1, sequence_index_, lists);
  for (std::size_t i = 0; i < sequence_.size(); ++i) {
    const FeatureSpec& spec = sequence_[i];
    std::vector<FeatureValues> frames;
    if (lists[i].present) {
      Wire w(lists[i].data, lists[i].size);
      WireField f;
      while (w.next(f))
        if (f.number == 1 && f.type == 2) frames.push_back(decode_feature({f.data, f.size, true}));
    }
    std::size_t per_frame = spec.var_len ? (frames.empty() ? 0 : frames[0].count()) : static_cast<std::size_t>(shape_elements(spec.shape));
    FeatureValues all;
    all.kind = spec.kind;
    for (std::size_t k = 0; k < frames.size(); ++k) {
      const auto& frame = frames[k];
      if (frame.kind && *frame.kind != spec.kind)
        throw DataError("sequence feature '" + spec.name + "' frame " + std::to_string(k) + " holds " +
                        feature_kind_name(*frame.kind) + " values, the spec says " + feature_kind_name(spec.kind));
      if (frame.count() != per_frame)
        throw DataError("sequence feature '" + spec.name + "' frame " + std::to_string(k) + " has " + std::to_string(frame.count()) +
                        " values, " + (spec.var_len ? "frame 0 has " : "the spec's shape needs ") + std::to_string(per_frame));
      all.bytes.insert(all.bytes.end(), frame.bytes.begin(), frame.bytes.end());
      all.ints.insert(all.ints.end(), frame.ints.begin(), frame.ints.end());
      all.floats.insert(all.floats.end(), frame.floats.begin(), frame.floats.end());
    }
    Shape shape{static_cast<std::int64_t>(frames.size())};
    if (spec.var_len) shape.push_back(static_cast<std::int64_t>(per_frame));
    else shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
    out.set(spec.name, make_tensor(spec, all, buffer, shape));
  }
}

bool ExampleParser::columnar() const {
  if (!sequence_.empty()) return false;
  for (const auto& spec : features_)
    if (spec.var_len || (spec.kind == FeatureKind::Bytes && !spec.shape.empty())) return false;
  return true;
}

namespace {

// Reads a varint at p (before end); false when it runs past the end or past 10 bytes.
inline bool read_varint(const std::uint8_t*& p, const std::uint8_t* end, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 70 && p < end; shift += 7) {
    const std::uint8_t b = *p++;
    v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// The common shape of a fixed feature, written straight into its row: a Feature holding only a
// list of the spec's kind whose only field is the values, packed (numbers) or one string (a
// scalar bytes feature), exactly `need` of them. Anything else returns false and goes the general
// way (decode_feature), which gives what parse() gives, values or error.
bool decode_direct(const FeatureSpec& spec, Span feature, std::size_t need, std::byte* row, std::vector<std::string_view>& strings) {
  const std::uint8_t* p = feature.data;
  const std::uint8_t* end = p + feature.size;
  const std::uint8_t tag = spec.kind == FeatureKind::Bytes ? 0x0a : spec.kind == FeatureKind::Float ? 0x12 : 0x1a;
  std::uint64_t length = 0;
  if (p == end || *p++ != tag || !read_varint(p, end, length) || length != static_cast<std::uint64_t>(end - p)) return false;
  // The list: field 1, length-delimited, filling it.
  if (p == end || *p++ != 0x0a || !read_varint(p, end, length) || length != static_cast<std::uint64_t>(end - p)) return false;
  switch (spec.kind) {
    case FeatureKind::Bytes:
      if (need != 1) return false;
      strings.emplace_back(reinterpret_cast<const char*>(p), static_cast<std::size_t>(length));
      return true;
    case FeatureKind::Float:
      if (length != need * 4) return false;
      std::memcpy(row, p, need * 4);
      return true;
    case FeatureKind::Int64: {
      auto* values = reinterpret_cast<std::int64_t*>(row);
      std::size_t n = 0;
      for (std::uint64_t v; p < end; ++n) {
        if (n == need || !read_varint(p, end, v)) return false;
        values[n] = static_cast<std::int64_t>(v);
      }
      return n == need;
    }
  }
  return false;
}

}  // namespace

namespace {
// The spec position of feature `key` (features.size(): not wanted). `guess`, the position after
// the last one found, is compared first: records usually list their features in one order, and a
// compare costs less than a hash.
std::size_t feature_position(std::string_view key, std::size_t guess, const std::vector<FeatureSpec>& features,
                             const std::unordered_map<std::string_view, std::size_t>& index) {
  if (guess < features.size() && features[guess].name == key) return guess;
  const auto it = index.find(key);
  return it == index.end() ? features.size() : it->second;
}

bool find_entries_direct(const Span& features_msg, const std::vector<FeatureSpec>& features_,
                         const std::unordered_map<std::string_view, std::size_t>& feature_index_, std::vector<Span>& found) {
  // The common layout of a Features message: entries (field 1) each holding a key (field 1) then
  // a value (field 2), nothing else. Anything else returns false: the general walk reads it.
  const std::uint8_t* p = features_msg.data;
  const std::uint8_t* const end = p + features_msg.size;
  const std::size_t count = features_.size();
  std::size_t guess = 0;
  std::uint64_t length = 0;
  while (p < end) {
    if (*p++ != 0x0a || !read_varint(p, end, length) || length > static_cast<std::uint64_t>(end - p)) return false;
    const std::uint8_t* const entry_end = p + length;
    if (p == entry_end || *p++ != 0x0a || !read_varint(p, entry_end, length) || length > static_cast<std::uint64_t>(entry_end - p)) return false;
    const std::string_view key(reinterpret_cast<const char*>(p), static_cast<std::size_t>(length));
    p += length;
    if (p == entry_end || *p++ != 0x12 || !read_varint(p, entry_end, length) || length != static_cast<std::uint64_t>(entry_end - p)) return false;
    const Span value{p, static_cast<std::size_t>(length), true};
    p = entry_end;
    const std::size_t index = feature_position(key, guess, features_, feature_index_);
    if (index == count) continue;
    found[index] = value;
    guess = index + 1;
  }
  return true;
}
}  // namespace

void ExampleParser::parse_rows(const Column& records, std::size_t rows, Chunk& out, std::vector<std::size_t>& kept,
                               RowIssues& issues) const {
  // Made once per chunk and reused for its records: no allocation per record.
  std::vector<Span> found;
  FeatureValues values;
  const std::size_t count = features_.size();
  std::vector<std::size_t> need(count), row_bytes(count);
  std::vector<Tensor> numeric(count);
  std::vector<std::vector<std::string_view>> strings(count);
  for (std::size_t i = 0; i < count; ++i) {
    const FeatureSpec& spec = features_[i];
    need[i] = static_cast<std::size_t>(shape_elements(spec.shape));
    if (spec.kind == FeatureKind::Bytes) {
      strings[i].reserve(rows);
      continue;
    }
    Shape shape = spec.shape;
    shape.insert(shape.begin(), static_cast<std::int64_t>(rows));
    numeric[i] = Tensor::empty(spec.kind == FeatureKind::Int64 ? DType::I64 : DType::F32, shape);
    row_bytes[i] = need[i] * (spec.kind == FeatureKind::Int64 ? 8 : 4);
  }
  kept.clear();
  kept.reserve(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::string_view record = records.string_at(r);
    const std::size_t at = kept.size();  // the output row
    try {
      Span features_msg{nullptr, 0, true};
      {
        Wire w(reinterpret_cast<const std::uint8_t*>(record.data()), record.size());
        WireField f;
        while (w.next(f))
          if (f.number == 1 && f.type == 2) features_msg = {f.data, f.size, true};
      }
      found.assign(count, Span{});
      if (features_msg.data && !find_entries_direct(features_msg, features_, feature_index_, found)) {
        found.assign(count, Span{});
        // As collect_entries, with the next feature of the spec tried first (feature_position).
        Wire w(features_msg.data, features_msg.size);
        WireField f, e;
        std::size_t guess = 0;
        while (w.next(f)) {
          if (f.number != 1 || f.type != 2) continue;
          Wire entry(f.data, f.size);
          std::string_view key;
          Span value{nullptr, 0, true};
          while (entry.next(e)) {
            if (e.number == 1 && e.type == 2) key = {reinterpret_cast<const char*>(e.data), e.size};
            else if (e.number == 2 && e.type == 2) value = {e.data, e.size, true};
          }
          const std::size_t index = feature_position(key, guess, features_, feature_index_);
          if (index == count) continue;
          found[index] = value;
          guess = index + 1;
        }
      }
      for (std::size_t i = 0; i < count; ++i) {
        const FeatureSpec& spec = features_[i];
        if (found[i].present && decode_direct(spec, found[i], need[i], spec.kind == FeatureKind::Bytes ? nullptr : numeric[i].raw_data() + at * row_bytes[i], strings[i]))
          continue;
        if (found[i].present) {
          decode_feature(found[i], values);
        } else {
          values.kind.reset();
        }
        if (values.kind && *values.kind != spec.kind)
          throw SchemaMismatch("feature '" + spec.name + "' holds " + feature_kind_name(*values.kind) + " values, the spec says " +
                          feature_kind_name(spec.kind));
        const bool missing = !found[i].present || !values.kind;
        if (missing) {
          if (!spec.default_values)
            throw SchemaMismatch("feature '" + spec.name + "' is " + (found[i].present ? "empty" : "missing") +
                            " and the spec gives no default (add =VALUE, or make it variable-length with [])");
          values = default_values(spec, need[i]);
        }
        if (values.count() != need[i])
          throw DataError("feature '" + spec.name + "' has " + std::to_string(values.count()) + " values, the spec's shape " +
                          shape_string(spec.shape) + " needs " + std::to_string(need[i]));
        switch (spec.kind) {
          case FeatureKind::Bytes:
            strings[i].emplace_back(reinterpret_cast<const char*>(values.bytes[0].first), values.bytes[0].second);
            break;
          case FeatureKind::Int64:
            std::memcpy(numeric[i].raw_data() + at * row_bytes[i], values.ints.data(), row_bytes[i]);
            break;
          case FeatureKind::Float:
            std::memcpy(numeric[i].raw_data() + at * row_bytes[i], values.floats.data(), row_bytes[i]);
            break;
        }
      }
      kept.push_back(r);
    } catch (const DataError& e) {
      for (auto& s : strings) s.resize(std::min(s.size(), at));  // what this record's features had added
      if (!issues.skip_row(r, e.what())) throw RowError(r, e.what());
    }
  }
  const auto parsed = static_cast<std::int64_t>(kept.size());
  for (std::size_t i = 0; i < count; ++i) {
    const FeatureSpec& spec = features_[i];
    Column& column = out.add(spec.name, Column::Layout::Rows);
    if (spec.kind == FeatureKind::Bytes) {
      // Defaults are views of the spec's text: copied here, as every value is.
      column.tensor = Tensor::from_strings(strings[i], {parsed});
      continue;
    }
    Shape shape = spec.shape;
    shape.insert(shape.begin(), parsed);
    column.tensor = parsed == static_cast<std::int64_t>(rows) ? numeric[i] : Tensor::view(numeric[i].dtype(), shape, numeric[i].buffer(), 0);
  }
}

namespace {
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_len(std::string& out, std::uint32_t field, const std::string& payload) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | 2);
  put_varint(out, payload.size());
  out += payload;
}
double as_double(const Tensor& t, std::int64_t i) {
  const std::byte* p = t.raw_data();
  switch (t.dtype()) {
    case DType::F32: return reinterpret_cast<const float*>(p)[i];
    case DType::F64: return reinterpret_cast<const double*>(p)[i];
    default: return 0;
  }
}
std::int64_t as_int(const Tensor& t, std::int64_t i) {
  const std::byte* p = t.raw_data();
  switch (t.dtype()) {
    case DType::U8: return reinterpret_cast<const std::uint8_t*>(p)[i];
    case DType::I16: return reinterpret_cast<const std::int16_t*>(p)[i];
    case DType::I32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case DType::I64: return reinterpret_cast<const std::int64_t*>(p)[i];
    default: return 0;
  }
}
}  // namespace

std::string encode_example(const Sample& sample) {
  std::string features;
  for (const auto& field : sample.fields()) {
    const Tensor& t = field.tensor;
    std::string list, feature;
    if (t.dtype() == DType::Bytes) {
      for (std::int64_t i = 0; i < t.num_elements(); ++i) {
        auto s = t.string_at(i);
        put_len(list, 1, std::string(s));
      }
      put_len(feature, 1, list);
    } else if (t.dtype() == DType::F32 || t.dtype() == DType::F64) {
      std::string packed;
      for (std::int64_t i = 0; i < t.num_elements(); ++i) {
        float v = static_cast<float>(as_double(t, i));
        packed.append(reinterpret_cast<const char*>(&v), 4);
      }
      put_len(list, 1, packed);
      put_len(feature, 2, list);
    } else if (t.dtype() == DType::F16 || t.dtype() == DType::BF16) {
      throw DataError("field '" + field.name + "' is " + dtype_name(t.dtype()) + "; cast it to f32 before writing a tf.Example");
    } else {
      std::string packed;
      for (std::int64_t i = 0; i < t.num_elements(); ++i) put_varint(packed, static_cast<std::uint64_t>(as_int(t, i)));
      put_len(list, 1, packed);
      put_len(feature, 3, list);
    }
    std::string entry;
    put_len(entry, 1, field.name);
    put_len(entry, 2, feature);
    put_len(features, 1, entry);
  }
  std::string example;
  put_len(example, 1, features);
  return example;
}

}  // namespace sluice::io
