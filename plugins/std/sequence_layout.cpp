#include "sequence_layout.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace sluice::std_ops {
namespace {

// IEEE binary16 nearest to `v` (ties to even), as a conversion instruction gives: rounded once,
// from the double, not through a float. Written out because clang before 15 has no _Float16 on
// x86-64 (the sanitizer trees build with clang).
std::uint16_t double_to_half(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, 8);
  const auto sign = static_cast<std::uint16_t>((bits >> 48) & 0x8000);
  const std::uint64_t magnitude = bits & 0x7FFFFFFFFFFFFFFFull;
  const auto exponent = static_cast<int>(magnitude >> 52);
  const std::uint64_t mantissa = magnitude & ((1ull << 52) - 1);
  if (exponent == 0x7FF)  // infinity, or NaN kept quiet with its top payload bits
    return static_cast<std::uint16_t>(sign | 0x7C00 | (mantissa ? 0x200 | ((mantissa >> 42) & 0x3FF) : 0));
  if (magnitude >= ((1038ull << 52) | (0x7FFull << 41))) return sign | 0x7C00;  // 65520 and up: infinity
  // Normal halves: the exponent rebased (1023 - 15), the mantissa's top 10 bits. Below 2^-14 the
  // value counts units of 2^-24 (subnormal halves), the implicit bit made explicit.
  const bool normal = exponent >= 1009;
  if (!normal && exponent < 998) return sign;  // below 2^-25: rounds to zero
  const int shift = normal ? 42 : 1051 - exponent;
  const std::uint64_t significand = normal ? mantissa : (mantissa | (1ull << 52));
  std::uint64_t half = (normal ? static_cast<std::uint64_t>(exponent - 1008) << 10 : 0) | (significand >> shift);
  const std::uint64_t rest = significand & ((1ull << shift) - 1), midway = 1ull << (shift - 1);
  if (rest > midway || (rest == midway && (half & 1))) ++half;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | half);
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// "64", "-1x40": dimensions separated by 'x'.
Shape parse_dims(const std::string& text, const std::string& entry) {
  Shape dims;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t x = text.find('x', at);
    const std::string part = trim(text.substr(at, x == std::string::npos ? std::string::npos : x - at));
    char* end = nullptr;
    errno = 0;
    const long long d = part.empty() ? 0 : std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || end != part.c_str() + part.size() || errno != 0 || d < -1)
      throw ParamError("padded_shapes entry '" + entry + "': '" + part +
                       "' is not a dimension (a size, or -1 for the longest of the batch); write FIELD:64 or FIELD:-1x40");
    dims.push_back(d);
    if (x == std::string::npos) break;
    at = x + 1;
  }
  return dims;
}

// The padding value of `field`, as `dtype`, in `out` (dtype_size bytes). Throws DataError naming
// the field when the value does not fit the type (a padding value is checked against the field's
// type only once the field's type is known: at the first batch).
void encode_value(const std::string& field, const std::string& text, DType dtype, std::byte* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  auto bad = [&](const std::string& why) {
    return DataError("padding value '" + text + "' for field '" + field + "' (" + dtype_name(dtype) + "): " + why +
                     "; set padding_values: \"" + field + ":VALUE\"");
  };
  if (text.empty() || end != text.c_str() + text.size()) throw bad("not a number");
  auto integral = [&](double lo, double hi) {
    if (v != std::floor(v) || v < lo || v > hi) throw bad("not an integer in the type's range");
  };
  switch (dtype) {
    case DType::U8: integral(0, 255); { const std::uint8_t x = static_cast<std::uint8_t>(v); std::memcpy(out, &x, 1); } break;
    case DType::I16: integral(-32768, 32767); { const std::int16_t x = static_cast<std::int16_t>(v); std::memcpy(out, &x, 2); } break;
    case DType::I32: integral(-2147483648.0, 2147483647.0); { const std::int32_t x = static_cast<std::int32_t>(v); std::memcpy(out, &x, 4); } break;
    case DType::I64: {
      errno = 0;
      const long long x = std::strtoll(text.c_str(), &end, 10);
      if (end != text.c_str() + text.size() || errno != 0) throw bad("not an int64");
      const std::int64_t y = x;
      std::memcpy(out, &y, 8);
      break;
    }
    case DType::F32: { const float x = static_cast<float>(v); std::memcpy(out, &x, 4); } break;
    case DType::F64: std::memcpy(out, &v, 8); break;
    case DType::BF16: {  // the high half of the float, rounded to nearest even
      const float f = static_cast<float>(v);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits += 0x7FFF + ((bits >> 16) & 1);
      const std::uint16_t half = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(out, &half, 2);
      break;
    }
    case DType::F16: {
      const std::uint16_t half = double_to_half(v);
      std::memcpy(out, &half, 2);
      break;
    }
    case DType::Bytes: break;
  }
}

// Calls copy(src_first, dst_first, count) for each innermost run of `src` (shape `from`, row-major)
// inside a row of shape `to` (every dimension at least as large), in element units.
template <class Copy>
void for_each_run(const Shape& from, const Shape& to, Copy&& copy) {
  const std::size_t rank = from.size();
  if (rank <= 1) {  // a scalar, or a sequence of scalars: one run
    copy(0, 0, rank == 0 ? 1 : from[0]);
    return;
  }
  if (shape_elements(from) == 0) return;
  std::vector<std::int64_t> from_stride(rank, 1), to_stride(rank, 1);
  for (std::size_t d = rank - 1; d > 0; --d) {
    from_stride[d - 1] = from_stride[d] * from[d];
    to_stride[d - 1] = to_stride[d] * to[d];
  }
  std::vector<std::int64_t> at(rank, 0);  // index over the outer rank-1 dimensions
  for (;;) {
    std::int64_t src = 0, dst = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) {
      src += at[d] * from_stride[d];
      dst += at[d] * to_stride[d];
    }
    copy(src, dst, from[rank - 1]);
    std::size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++at[d] < from[d]) break;
      at[d] = 0;
    }
  }
}

std::string row_name(const Sample& s, std::size_t k) {
  return "row " + std::to_string(k) + (s.has_origin() ? " (" + s.origin() + ")" : "");
}

}  // namespace

std::vector<ParamSpec> PaddingRules::param_specs() {
  return {ParamSpec::make("padded_shapes", ParamType::StringList,
                          "FIELD:DIMS entries, DIMS like 64 or -1x40 (-1: the longest of the batch); fields not named are "
                          "padded to the longest of the batch in every dimension")
              .def(""),
          ParamSpec::make("padding_values", ParamType::StringList,
                          "VALUE for every field, or FIELD:VALUE entries (numbers; text for bytes fields)")
              .def("0"),
          ParamSpec::make("lengths", ParamType::StringList, "fields to report each row's length of, as FIELD_length (int64)").def(""),
          ParamSpec::make("masks", ParamType::StringList, "fields to give a FIELD_mask of (u8, 1 where there is data along dimension 0)")
              .def("")};
}

PaddingRules PaddingRules::from_params(const Params& p) {
  PaddingRules rules;
  for (const auto& entry : p.get_string_list("padded_shapes")) {
    const auto colon = entry.rfind(':');
    if (colon == std::string::npos || trim(entry.substr(0, colon)).empty())
      throw ParamError("padded_shapes entry '" + entry + "' is not FIELD:DIMS (tokens:64, frames:-1x40)");
    const std::string field = trim(entry.substr(0, colon));
    if (rules.shapes.count(field)) throw ParamError("padded_shapes names field '" + field + "' twice");
    rules.shapes[field] = parse_dims(entry.substr(colon + 1), entry);
  }
  bool default_given = false;
  for (const auto& entry : p.get_string_list("padding_values")) {
    const auto colon = entry.find(':');
    if (colon == std::string::npos) {
      if (default_given) throw ParamError("padding_values gives two values for every field ('" + rules.default_value + "' and '" + entry + "')");
      rules.default_value = trim(entry);
      default_given = true;
    } else {
      const std::string field = trim(entry.substr(0, colon));
      if (rules.values.count(field)) throw ParamError("padding_values names field '" + field + "' twice");
      rules.values[field] = entry.substr(colon + 1);
    }
  }
  // A fixed padded shape is known before any element: one this machine's memory could not hold,
  // even at one byte a value, is refused now (the type, and so the bytes, when the batch is made).
  const auto batch = p.has("batch_size") ? p.get_int("batch_size") : 1;
  const std::uint64_t memory = physical_memory_bytes();
  for (const auto& [field, shape] : rules.shapes) {
    std::int64_t values = batch;
    bool overflow = false;
    for (auto d : shape)
      if (d > 0) overflow = overflow || __builtin_mul_overflow(values, d, &values);
    if (overflow || values > (std::int64_t{1} << 36) || (memory > 0 && static_cast<std::uint64_t>(values) > memory))
      throw ParamError("padded_shapes: a batch of " + std::to_string(batch) + " rows of " + field + ":" + shape_string(shape) + " is " +
                       (overflow ? std::string("more than 2^63") : std::to_string(values)) + " values, more than " +
                       (memory > 0 ? "this machine's memory (" + std::to_string(memory >> 20) + " MiB) holds" : std::string("any memory holds")) +
                       "; give a smaller padded shape (or batch_size)");
  }
  rules.length_fields = p.get_string_list("lengths");
  rules.mask_fields = p.get_string_list("masks");
  return rules;
}

void HeldRows::check(const Sample& in, bool same_shapes) const {
  if (empty()) return;
  const Sample& first = rows().front();
  // Formatted only for a message: every element is checked, and the origin's text costs more than the check.
  const auto against = [&] { return row_name(first, 0); };
  for (const auto& f : first.fields()) {
    const Tensor* t = in.find(f.name);
    if (!t) throw DataError("this element has no field '" + f.name + "', which " + against() + " of the output has");
    if (t->dtype() != f.tensor.dtype() || t->rank() != f.tensor.rank() || (same_shapes && t->shape() != f.tensor.shape()))
      throw DataError("field '" + f.name + "' is " + dtype_name(t->dtype()) + shape_string(t->shape()) + " here and " +
                      dtype_name(f.tensor.dtype()) + shape_string(f.tensor.shape()) + " in " + against() +
                      (same_shapes ? " (this stage stacks rows: give them one shape first)"
                                   : " (rows may differ in their sizes, not in their type or number of dimensions)"));
  }
  if (in.size() != first.size())
    for (const auto& f : in.fields())
      if (!first.find(f.name)) throw DataError("this element has a field '" + f.name + "' that " + against() + " has not");
}

void HeldRows::save(StateWriter& w) const {
  w.put<std::uint64_t>(rows_.size());
  for (std::size_t k = 0; k < rows_.size(); ++k) {
    w.put(indices_[k]);
    w.put_element(rows_[k]);
  }
}

namespace {

// Throws DataError when the state holds more rows than `at_most`.
std::uint64_t saved_rows(StateReader& r, std::size_t at_most) {
  const auto n = r.get<std::uint64_t>();
  if (n > at_most)
    throw DataError("the saved state holds " + std::to_string(n) + " rows, more than this stage gathers (" + std::to_string(at_most) + ")");
  return n;
}

}  // namespace

void HeldRows::restore(StateReader& r, std::size_t at_most) {
  clear();
  for (std::uint64_t k = 0, n = saved_rows(r, at_most); k < n; ++k) {
    const auto index = r.get<std::uint64_t>();
    add(r.get_element(), index);
  }
}

// The same as HeldRows saves: the count, then each row's index and the row as an element.
void HeldRefs::save(StateWriter& w) const {
  w.put<std::uint64_t>(rows_);
  for (const HeldRun& run : runs_)
    for (std::size_t k = 0; k < run.count; ++k) {
      w.put(run.index + k);
      w.put_element(run.chunk->row(run.first + k));
    }
}

void HeldRefs::restore(StateReader& r, std::size_t at_most) {
  clear();
  for (std::uint64_t k = 0, n = saved_rows(r, at_most); k < n; ++k) {
    const auto index = r.get<std::uint64_t>();
    add(chunk_of_element(r.get_element()), 0, index);
  }
}

namespace {

// A batch this machine's memory cannot hold is refused by name before it is allocated (the
// kernel's out-of-memory killer says nothing of padded_shapes).
void refuse_beyond_memory(const std::string& field, DType dtype, const Shape& shape, bool shape_given) {
  const auto beyond = beyond_memory(static_cast<long double>(shape_elements(shape)) * (dtype == DType::Bytes ? 16 : dtype_size(dtype)));
  if (!beyond) return;
  throw ParamError("a batch of field '" + field + "' would be " + dtype_name(dtype) + shape_string(shape) + ", " + *beyond + "; " +
                   (shape_given ? "give a smaller padded shape for it in padded_shapes (or a smaller batch_size)"
                                : "give a smaller batch_size, or cut the rows before batching"));
}

// The fields the rules name must be the elements' (a misspelt padded_shapes entry was ignored,
// and the batch padded to the longest instead): a parameter that does not fit the data.
void check_named_fields(const Chunk& rows, const PaddingRules& rules) {
  auto check = [&](const std::string& field, const char* parameter) {
    for (const Column& c : rows.columns())
      if (c.name == field) return;
    std::string fields;
    for (const Column& c : rows.columns()) fields += (fields.empty() ? "" : ", ") + c.name;
    throw ParamError(std::string(parameter) + " names field '" + field + "', which the elements do not have (they have: " + fields + ")");
  };
  for (const auto& entry : rules.shapes) check(entry.first, "padded_shapes");
  for (const auto& entry : rules.values) check(entry.first, "padding_values");
  for (const auto& field : rules.length_fields) check(field, "lengths");
  for (const auto& field : rules.mask_fields) check(field, "masks");
}

// The batch's runs of consecutive rows of one chunk (HeldRefs made them as long as they go), each
// with its column of the field being stacked: the field is looked up once per run, and a run's
// values are copied without a call per row.
struct RowRun {
  const Chunk* chunk;
  std::size_t first, count;
  const Column* cells = nullptr;
};

std::vector<RowRun> row_runs(const std::vector<HeldRun>& rows) {
  std::vector<RowRun> runs;
  runs.reserve(rows.size());
  for (const HeldRun& r : rows) runs.push_back({r.chunk.get(), r.first, r.count});
  return runs;
}

std::size_t rows_in(const std::vector<HeldRun>& rows) {
  std::size_t n = 0;
  for (const HeldRun& r : rows) n += r.count;
  return n;
}

// Each row's number in its chunk, for the paths that go row by row.
std::vector<std::size_t> row_numbers(const std::vector<RowRun>& runs, std::size_t batch) {
  std::vector<std::size_t> numbers;
  numbers.reserve(batch);
  for (const RowRun& run : runs)
    for (std::size_t r = run.first; r < run.first + run.count; ++r) numbers.push_back(r);
  return numbers;
}

// Each run's column of field `first` (the first row's chunk's column).
void find_cells(std::vector<RowRun>& runs, const Column& first, const Chunk* first_chunk) {
  for (RowRun& run : runs) run.cells = run.chunk == first_chunk ? &first : &run.chunk->at(first.name);
}


// Rows [first, first + count) of a numeric column, their values one after another, into `dst`;
// returns the end of what it wrote. Rows of a Rows column are one copy, and so are rows of a
// Ragged column whose spans follow one another.
std::byte* concatenate_run(const Column& c, std::size_t first, std::size_t count, std::size_t elem, std::byte* dst) {
  const std::size_t end = first + count;
  switch (c.layout) {
    case Column::Layout::Rows: {
      const std::size_t bytes = count * static_cast<std::size_t>(c.row_elements(first)) * elem;
      if (bytes > 0) std::memcpy(dst, c.row_data(first), bytes);
      return dst + bytes;
    }
    case Column::Layout::Ragged: {
      const std::size_t step = static_cast<std::size_t>(c.step_elements()) * elem;
      const std::byte* base = c.tensor.raw_data();
      for (std::size_t r = first; r < end;) {
        const std::uint64_t from = c.spans[r].offset;
        std::uint64_t to = from + c.spans[r].length;
        for (++r; r < end && c.spans[r].offset == to; ++r) to += c.spans[r].length;
        const std::size_t bytes = static_cast<std::size_t>(to - from) * step;
        if (bytes > 0) std::memcpy(dst, base + static_cast<std::size_t>(from) * step, bytes);
        dst += bytes;
      }
      return dst;
    }
    case Column::Layout::Constant:
    case Column::Layout::Spans: break;
  }
  for (std::size_t r = first; r < end; ++r) {  // the same values in every row
    const std::size_t bytes = static_cast<std::size_t>(c.row_elements(r)) * elem;
    if (bytes > 0) std::memcpy(dst, c.row_data(r), bytes);
    dst += bytes;
  }
  return dst;
}

// One field of the rows, their values concatenated (`shape`: the whole's, its dimension 0 the
// rows' lengths summed for a ragged field, the batch for a stacked one).
Tensor concatenated_field(const std::vector<RowRun>& runs, DType dtype, const Shape& shape, Allocator& allocator) {
  if (dtype == DType::Bytes) {
    std::vector<std::string_view> strings;
    strings.reserve(static_cast<std::size_t>(shape_elements(shape)));
    for (const RowRun& run : runs) {
      const Column& c = *run.cells;
      for (std::size_t r = run.first; r < run.first + run.count; ++r) {
        if (c.layout == Column::Layout::Spans) {
          strings.push_back(c.string_at(r));
          continue;
        }
        for (std::int64_t j = 0; j < c.row_elements(r); ++j) strings.push_back(c.row_string(r, j));
      }
    }
    return Tensor::from_strings(strings, shape);
  }
  Tensor values = Tensor::empty(dtype, shape, allocator);
  std::byte* dst = values.raw_data();
  for (const RowRun& run : runs) dst = concatenate_run(*run.cells, run.first, run.count, dtype_size(dtype), dst);
  return values;
}

// Rows of rank 0 or 1 into `dst`, `row_elements` values a row: each row's values, then its
// padding (`fill(at, values)`), every byte written once (the batch is the stage's largest write,
// on one thread). A run of a chunk's rows, none padded: copied at once.
template <class Fill>
void copy_short_rows(const std::vector<RowRun>& runs, const std::vector<std::int64_t>& counts, std::size_t row_elements,
                     std::size_t elem, std::byte* dst, Fill&& fill) {
  std::size_t k = 0;
  for (const RowRun& run : runs) {
    const Column& c = *run.cells;
    if (c.layout == Column::Layout::Rows && static_cast<std::size_t>(counts[k]) == row_elements) {
      if (row_elements > 0) std::memcpy(dst + k * row_elements * elem, c.row_data(run.first), run.count * row_elements * elem);
      k += run.count;
      continue;
    }
    for (std::size_t r = run.first; r < run.first + run.count; ++r, ++k) {
      const auto count = static_cast<std::size_t>(counts[k]);
      std::byte* row_base = dst + k * row_elements * elem;
      if (count > 0) std::memcpy(row_base, c.row_data(r), count * elem);
      fill(row_base + count * elem, row_elements - count);
    }
  }
}

// Each row's column of the field (`cells`) and its values (`counts`), from the runs.
void cells_and_counts(const std::vector<RowRun>& runs, std::vector<const Column*>& cells, std::vector<std::int64_t>& counts) {
  std::size_t k = 0;
  for (const RowRun& run : runs) {
    std::fill_n(cells.begin() + static_cast<std::ptrdiff_t>(k), run.count, run.cells);
    if (run.cells->layout == Column::Layout::Rows) {
      std::fill_n(counts.begin() + static_cast<std::ptrdiff_t>(k), run.count, run.cells->row_elements(run.first));
      k += run.count;
      continue;
    }
    for (std::size_t r = run.first; r < run.first + run.count; ++r) counts[k++] = run.cells->row_elements(r);
  }
}

}  // namespace

Sample pad_and_stack(const std::vector<HeldRun>& held, const PaddingRules& rules, Allocator& allocator, StageCounters* counters,
                     std::optional<std::int64_t> dim0, const std::vector<std::string>& dim0_fields) {
  Sample out;
  if (held.empty()) return out;
  const Chunk& head = *held.front().chunk;
  check_named_fields(head, rules);
  std::uint64_t written = 0, data = 0;
  std::vector<RowRun> runs = row_runs(held);
  const std::size_t n = rows_in(held);
  const auto batch = static_cast<std::int64_t>(n);
  const std::vector<std::size_t> rows = row_numbers(runs, n);
  std::vector<const Column*> cells(n);  // the field's column in each row's chunk
  std::vector<std::int64_t> counts(n);  // each row's values
  for (const Column& first : head.columns()) {
    find_cells(runs, first, &head);
    cells_and_counts(runs, cells, counts);
    const DType dtype = first.dtype();
    const std::size_t rank = first.row_rank();
    // The padded shape of one row: the rule's fixed sizes, else the longest of the batch.
    Shape padded = first.row_shape(held.front().first);
    if (rank == 1) {
      for (const RowRun& run : runs) {
        const std::size_t last = run.cells->layout == Column::Layout::Rows ? run.first + 1 : run.first + run.count;  // Rows: one length
        for (std::size_t r = run.first; r < last; ++r) padded[0] = std::max(padded[0], run.cells->row_length(r));
      }
    } else if (rank > 1) {
      for (std::size_t k = 0; k < n; ++k) {
        const Shape s = cells[k]->row_shape(rows[k]);
        for (std::size_t d = 0; d < rank; ++d) padded[d] = std::max(padded[d], s[d]);
      }
    }
    auto rule = rules.shapes.find(first.name);
    if (rule != rules.shapes.end())
      for (std::size_t d = 0; d < rank; ++d)
        if (rule->second[d] >= 0) padded[d] = rule->second[d];
    if (dim0 && rank > 0 && contains(dim0_fields, first.name) && (rule == rules.shapes.end() || rule->second[0] < 0))
      padded[0] = *dim0;
    auto value = rules.values.find(first.name);
    const std::string& pad_text = value != rules.values.end() ? value->second : rules.default_value;

    Shape shape = padded;
    shape.insert(shape.begin(), batch);
    const std::int64_t row_elements = shape_elements(padded);
    refuse_beyond_memory(first.name, dtype, shape, rule != rules.shapes.end());
    written += static_cast<std::uint64_t>(batch * row_elements);
    for (const std::int64_t count : counts) data += static_cast<std::uint64_t>(count);
    // Calls copy(src, dst, count) for each run of row k's values inside its padded row.
    auto runs_of = [&](std::size_t k, auto&& copy) {
      if (rank <= 1) {
        copy(0, 0, counts[k]);
      } else {
        for_each_run(cells[k]->row_shape(rows[k]), padded, copy);
      }
    };
    if (dtype == DType::Bytes && rank == 0) {  // nothing to pad: one string a row
      out.set(first.name, concatenated_field(runs, dtype, shape, allocator));
    } else if (dtype == DType::Bytes) {
      std::vector<std::string_view> strings(static_cast<std::size_t>(batch * row_elements), std::string_view(pad_text));
      for (std::int64_t r = 0; r < batch; ++r) {
        const auto k = static_cast<std::size_t>(r);
        runs_of(k, [&](std::int64_t src, std::int64_t dst, std::int64_t count) {
          for (std::int64_t j = 0; j < count; ++j)
            strings[static_cast<std::size_t>(r * row_elements + dst + j)] = cells[k]->row_string(rows[k], src + j);
        });
      }
      out.set(first.name, Tensor::from_strings(strings, shape));
    } else {
      const std::size_t elem = dtype_size(dtype);
      Tensor block = Tensor::empty(dtype, shape, allocator);
      std::byte pad[8] = {};
      encode_value(first.name, trim(pad_text), dtype, pad);
      std::byte* dst_base = block.raw_data();
      const std::size_t total = static_cast<std::size_t>(batch * row_elements);
      const bool zero_pad = std::all_of(pad, pad + elem, [](std::byte b) { return b == std::byte{0}; });
      auto fill = [&](std::byte* at, std::size_t values) {
        if (zero_pad) {
          std::memset(at, 0, values * elem);
        } else {
          for (std::size_t k = 0; k < values; ++k) std::memcpy(at + k * elem, pad, elem);
        }
      };
      if (rank <= 1) {
        copy_short_rows(runs, counts, static_cast<std::size_t>(row_elements), elem, dst_base, fill);
      } else {
        fill(dst_base, total);
        for (std::int64_t r = 0; r < batch; ++r) {
          const auto k = static_cast<std::size_t>(r);
          const std::byte* src_base = cells[k]->row_data(rows[k]);
          std::byte* row_base = dst_base + static_cast<std::size_t>(r * row_elements) * elem;
          runs_of(k, [&](std::int64_t src, std::int64_t dst, std::int64_t count) {
            if (count > 0)
              std::memcpy(row_base + static_cast<std::size_t>(dst) * elem, src_base + static_cast<std::size_t>(src) * elem,
                          static_cast<std::size_t>(count) * elem);
          });
        }
      }
      out.set(first.name, std::move(block));
    }
    if (contains(rules.length_fields, first.name)) {
      Tensor lengths = Tensor::empty(DType::I64, {batch}, allocator);
      for (std::size_t k = 0; k < n; ++k) lengths.data<std::int64_t>()[k] = cells[k]->row_length(rows[k]);
      out.set(first.name + "_length", std::move(lengths));
    }
    if (contains(rules.mask_fields, first.name)) {
      Tensor mask = Tensor::empty(DType::U8, {batch, padded[0]}, allocator);
      auto* m = mask.data<std::uint8_t>();
      for (std::int64_t r = 0; r < batch; ++r) {
        const std::int64_t len = cells[static_cast<std::size_t>(r)]->row_length(rows[static_cast<std::size_t>(r)]);
        for (std::int64_t j = 0; j < padded[0]; ++j) m[r * padded[0] + j] = j < len ? 1 : 0;
      }
      out.set(first.name + "_mask", std::move(mask));
    }
  }
  if (counters) counters->add_padding(written - data, data);
  share_origin(out, head, held.front().first);
  return out;
}

std::shared_ptr<const Chunk> chunk_of_element(Sample in) {
  auto chunk = std::make_shared<Chunk>();
  chunk->set_rows(1);
  chunk->columns().reserve(in.size());
  for (auto& f : in.fields()) {
    if (f.tensor.rank() == 0) {
      chunk->add(f.name, Column::Layout::Constant).tensor = std::move(f.tensor);
    } else {
      Column& c = chunk->add(f.name, Column::Layout::Ragged);
      c.spans.push_back({0, static_cast<std::uint64_t>(f.tensor.shape()[0])});
      c.tensor = std::move(f.tensor);
    }
  }
  const Origin& o = in.shared_origin();
  chunk->set_where(o.where);
  if (o.record >= 0 || o.byte_offset >= 0) {
    chunk->records().push_back(o.record);
    chunk->byte_offsets().push_back(o.byte_offset);
  }
  if (o.read_index >= 0) chunk->set_read_position(o.read_epoch, o.read_index);
  return chunk;
}

void share_origin(Sample& out, const Chunk& chunk, std::size_t row) {
  const Origin o = chunk.origin(row);
  if (o.where) out.set_origin(o.where, o.record, o.byte_offset);
  if (o.read_index >= 0) out.set_read_position(o.read_epoch, o.read_index);
}

void name_rows(Sample& out, const std::vector<HeldRun>& rows) {
  if (rows.empty() || !out.shared_origin().where) return;
  std::vector<Origin> origins;
  origins.reserve(rows_in(rows));
  for (const HeldRun& run : rows)
    for (std::size_t r = run.first; r < run.first + run.count; ++r) origins.push_back(run.chunk->origin(r));
  const Origin head = out.shared_origin();
  const Origin named = origin_of_rows(head, origins);
  out.set_origin(named.where, named.record, named.byte_offset);
  out.set_read_position(head.read_epoch, head.read_index);
}

void HeldRefs::check(const Chunk& in, std::size_t r) const {
  if (empty()) return;
  const Chunk& head = first_chunk();
  // Formatted only for a message: every element is checked, and the origin's text costs more than the check.
  const auto against = [&] {
    const Origin o = head.origin(first_row());
    return "row 0" + (o.empty() ? std::string() : " (" + o.text() + ")");
  };
  for (const Column& f : head.columns()) {
    const Column* c = in.find(f.name);
    if (!c) throw DataError("this element has no field '" + f.name + "', which " + against() + " of the output has");
    if (c->dtype() != f.dtype() || c->row_rank() != f.row_rank())
      throw DataError("field '" + f.name + "' is " + dtype_name(c->dtype()) + shape_string(c->row_shape(r)) + " here and " +
                      dtype_name(f.dtype()) + shape_string(f.row_shape(first_row())) + " in " + against() +
                      " (rows may differ in their sizes, not in their type or number of dimensions)");
  }
  if (in.columns().size() != head.columns().size())
    for (const Column& c : in.columns())
      if (!head.find(c.name)) throw DataError("this element has a field '" + c.name + "' that " + against() + " has not");
}

void check_fits(const Chunk& in, std::size_t r, const PaddingRules& rules, std::optional<std::int64_t> dim0_limit,
                const std::vector<std::string>& dim0_fields) {
  if (!rules.checks_rows() && !dim0_limit) return;
  for (const Column& f : in.columns()) {
    auto rule = rules.shapes.find(f.name);
    const bool limited = dim0_limit && contains(dim0_fields, f.name);
    const bool reported = contains(rules.length_fields, f.name) || contains(rules.mask_fields, f.name);
    if (rule == rules.shapes.end() && !limited && !reported) continue;
    const Shape have = f.row_shape(r);
    if (rule != rules.shapes.end()) {
      if (rule->second.size() != have.size())
        throw DataError("field '" + f.name + "' is " + shape_string(have) + ", which has " + std::to_string(have.size()) +
                        " dimensions; padded_shapes gives " + std::to_string(rule->second.size()) + " (" +
                        shape_string(rule->second) + ")");
      for (std::size_t d = 0; d < have.size(); ++d)
        if (rule->second[d] >= 0 && have[d] > rule->second[d])
          throw DataError("field '" + f.name + "' is " + shape_string(have) + ", longer than its padded shape " +
                          shape_string(rule->second) + " in dimension " + std::to_string(d) +
                          "; raise padded_shapes, or cut or filter long elements before this stage");
    }
    if (limited && !have.empty() && have[0] > *dim0_limit)
      throw DataError("field '" + f.name + "' has length " + std::to_string(have[0]) + ", more than the " +
                      std::to_string(*dim0_limit) + " its bucket pads to");
    if (reported && have.empty())
      throw DataError("field '" + f.name + "' is a scalar: it has no length to report (lengths, masks)");
  }
  for (const auto& name : rules.length_fields)
    if (!in.find(name)) throw DataError("lengths names field '" + name + "', which this element has not");
  for (const auto& name : rules.mask_fields)
    if (!in.find(name)) throw DataError("masks names field '" + name + "', which this element has not");
}

Tensor stack_tensors(const std::vector<const Tensor*>& rows, Allocator& allocator) {
  const Tensor& first = *rows.front();
  Shape shape = first.shape();
  shape.insert(shape.begin(), static_cast<std::int64_t>(rows.size()));
  if (first.dtype() == DType::Bytes) {
    std::vector<std::string_view> strings;
    strings.reserve(static_cast<std::size_t>(shape_elements(shape)));
    for (const Tensor* t : rows)
      for (std::int64_t k = 0; k < t->num_elements(); ++k) strings.push_back(t->string_at(k));
    return Tensor::from_strings(strings, shape);
  }
  Tensor block = Tensor::empty(first.dtype(), shape, allocator);
  const std::size_t row_bytes = first.nbytes();
  for (std::size_t r = 0; r < rows.size(); ++r)
    if (row_bytes) std::memcpy(block.raw_data() + r * row_bytes, rows[r]->raw_data(), row_bytes);
  return block;
}

Tensor stack_field(const std::vector<const Sample*>& rows, const std::string& name, Allocator& allocator) {
  std::vector<const Tensor*> tensors;
  tensors.reserve(rows.size());
  for (const Sample* row : rows) tensors.push_back(&row->at(name));
  return stack_tensors(tensors, allocator);
}

Sample stack(const std::vector<const Sample*>& rows, Allocator& allocator) {
  Sample out;
  if (rows.empty()) return out;
  for (const auto& f : rows.front()->fields()) out.set(f.name, stack_field(rows, f.name, allocator));
  out.share_origin(*rows.front());
  return out;
}

bool is_ragged_field(const std::vector<std::string>& ragged, const Column& c) {
  return ragged.empty() ? c.row_rank() >= 1 : contains(ragged, c.name);
}

Sample ragged_stack(const std::vector<HeldRun>& rows, const std::vector<std::string>& ragged, RowPartition partition,
                    Allocator& allocator, StageCounters* counters) {
  Sample out;
  if (rows.empty()) return out;
  const auto batch = static_cast<std::int64_t>(rows_in(rows));
  const Chunk& head = *rows.front().chunk;
  std::vector<RowRun> runs = row_runs(rows);
  for (const Column& first : head.columns()) {
    find_cells(runs, first, &head);
    Shape shape = first.row_shape(rows.front().first);
    if (!is_ragged_field(ragged, first)) {
      shape.insert(shape.begin(), batch);
      refuse_beyond_memory(first.name, first.dtype(), shape, false);
      out.set(first.name, concatenated_field(runs, first.dtype(), shape, allocator));
      if (counters) counters->add_padding(0, static_cast<std::uint64_t>(shape_elements(shape)));
      continue;
    }
    Tensor starts = Tensor::empty(DType::I64, {partition == RowPartition::Splits ? batch + 1 : batch}, allocator);
    auto* s = starts.data<std::int64_t>();
    std::int64_t total = 0;
    for (const RowRun& run : runs) {
      for (std::size_t r = run.first; r < run.first + run.count; ++r, ++s) {
        const std::int64_t length = run.cells->row_length(r);
        *s = partition == RowPartition::Splits ? total : length;
        total += length;
      }
    }
    if (partition == RowPartition::Splits) *s = total;
    shape[0] = total;
    refuse_beyond_memory(first.name, first.dtype(), shape, false);
    out.set(first.name, concatenated_field(runs, first.dtype(), shape, allocator));
    out.set(first.name + (partition == RowPartition::Splits ? "_row_splits" : "_row_lengths"), std::move(starts));
    if (counters) counters->add_padding(0, static_cast<std::uint64_t>(shape_elements(shape)));  // nothing padded
  }
  share_origin(out, head, rows.front().first);
  return out;
}

}  // namespace sluice::std_ops
