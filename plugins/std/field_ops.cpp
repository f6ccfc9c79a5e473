// select_fields and split_text: shaping elements for sequence pipelines.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdlib>

#include "plain_integers.hpp"
#include "sequence_layout.hpp"
#include "std_plugin.hpp"

namespace sluice::std_ops {
namespace {

// Keeps the listed fields, in that order: tf.data's map(lambda x: {k: x[k] for k in keep}).
class SelectFields final : public Map, public ChunkedMap {
 public:
  static OperatorInfo describe() {
    return {"select_fields",
            OperatorKind::Map,
            "Keeps only the fields named in keep, in that order (the others are removed)",
            {ParamSpec::make("keep", ParamType::StringList, "fields to keep, in this order")},
            {.stateless = true},
            {}};
  }
  explicit SelectFields(const Params& p) : keep_(p.get_string_list("keep")) {
    if (keep_.empty()) throw ParamError("keep is empty; name the fields to keep");
  }
  Sample map(Sample in, const ElementContext&) override {
    Sample out;
    out.reserve(keep_.size());
    for (const auto& name : keep_) {
      Tensor* t = in.find(name);
      if (!t) throw DataError("select_fields: the element has no field '" + name + "' to keep (it has " + names(in) + ")");
      out.set(name, std::move(*t));
    }
    out.share_origin(in);
    return out;
  }
  // The kept columns, sharing their memory. A missing field is missing in every row: the host
  // then runs the rows through map(), which names each.
  Chunk map_chunk(const Chunk& in, const ElementContext&, RowIssues&) override {
    Chunk out;
    out.set_rows(in.rows());
    out.share_origins(in, 0, in.rows());
    out.columns().reserve(keep_.size());
    for (const auto& name : keep_) {
      const Column* c = in.find(name);
      if (!c) throw Error("select_fields: the chunk has no field '" + name + "'");
      auto same = std::find_if(out.columns().begin(), out.columns().end(), [&](const Column& k) { return k.name == name; });
      if (same != out.columns().end()) {
        *same = *c;  // named twice: kept once, as Sample::set keeps it
      } else {
        out.columns().push_back(*c);
      }
    }
    return out;
  }

 private:
  static std::string names(const Sample& s) {
    std::string out;
    for (const auto& f : s.fields()) out += (out.empty() ? "" : ", ") + f.name;
    return out.empty() ? "none" : out;
  }
  std::vector<std::string> keep_;
};

// tf.strings.split (and tf.strings.to_number): a text field into its tokens, as a variable-length
// field of bytes, int64 or f32. Whitespace runs separate tokens unless a separator is given (then
// empty tokens are kept, as Python's str.split(sep)).
class SplitText final : public Map, public ChunkedMap {
 public:
  static OperatorInfo describe() {
    return {"split_text",
            OperatorKind::Map,
            "Splits a text field into a sequence of tokens (bytes), or of numbers (int64, f32)",
            {ParamSpec::make("field", ParamType::String, "the text field").def("line"),
             ParamSpec::make("separator", ParamType::String, "separator; empty: runs of spaces, tabs and line ends").def(""),
             ParamSpec::make("to", ParamType::Choice, "type of the tokens").def("bytes").one_of({"bytes", "int64", "float"}),
             ParamSpec::make("output", ParamType::String, "name of the output field; empty: replace field").def("")},
            {.stateless = true},
            {}};
  }
  explicit SplitText(const Params& p)
      : field_(p.get_string("field")), separator_(p.get_string("separator")),
        to_(p.get_string("to") == "bytes" ? To::Bytes : p.get_string("to") == "int64" ? To::Int64 : To::Float),
        output_(p.get_string("output").empty() ? field_ : p.get_string("output")) {}
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& t = in.at(field_);
    if (t.dtype() != DType::Bytes || t.num_elements() != 1)
      throw DataError("split_text: field '" + field_ + "' is " + dtype_name(t.dtype()) + shape_string(t.shape()) + ", not one text");
    const std::string_view text = t.string_at(0);
    Scratch& scratch = this_thread_scratch();
    if (separator_.empty() && to_ == To::Int64) {
      scratch.integers.clear();
      if (!plain_integers(text, scratch.integers)) {
        scratch.integers.clear();
        split(text, scratch.tokens);
        append_numbers(scratch.tokens, scratch.integers);
      }
      in.set(output_, from_slab(scratch, scratch.integers.data(), static_cast<std::int64_t>(scratch.integers.size())));
      return in;
    }
    split(text, scratch.tokens);
    const auto n = static_cast<std::int64_t>(scratch.tokens.size());
    if (to_ == To::Bytes) {
      in.set(output_, Tensor::from_strings(scratch.tokens, {n}));
    } else if (to_ == To::Int64) {
      scratch.integers.clear();
      append_numbers(scratch.tokens, scratch.integers);
      in.set(output_, from_slab(scratch, scratch.integers.data(), n));
    } else {
      scratch.floats.clear();
      append_numbers(scratch.tokens, scratch.floats);
      in.set(output_, from_slab(scratch, scratch.floats.data(), n));
    }
    return in;
  }

  // A chunk's texts into one Ragged column of all their tokens, each row a span of it: one tensor
  // per chunk rather than one per line.
  Chunk map_chunk(const Chunk& in, const ElementContext&, RowIssues& issues) override {
    const Column& texts = in.at(field_);
    const bool one_text_per_row = texts.layout == Column::Layout::Spans ||
                                  (texts.tensor.dtype() == DType::Bytes && texts.layout != Column::Layout::Ragged &&
                                   texts.tensor.rank() == (texts.layout == Column::Layout::Constant ? 0u : 1u));
    // Anything else is refused per element, by map(): the host runs the rows through it.
    if (!one_text_per_row) throw Error("field '" + field_ + "' is not a column of single texts");
    Scratch& scratch = this_thread_scratch();
    std::vector<Column::Span> spans;
    spans.reserve(in.rows());
    std::vector<std::size_t> kept;
    kept.reserve(in.rows());
    std::vector<std::string_view> all_tokens;  // to: bytes
    scratch.integers.clear();
    scratch.floats.clear();
    for (std::size_t r = 0; r < in.rows(); ++r) {
      const std::string_view text = texts.string_at(r);
      std::size_t before = 0, after = 0;
      try {
        if (to_ == To::Int64) {
          before = scratch.integers.size();
          if (!separator_.empty() || !plain_integers(text, scratch.integers)) {
            scratch.integers.resize(before);
            split(text, scratch.tokens);
            append_numbers(scratch.tokens, scratch.integers);
          }
          after = scratch.integers.size();
        } else if (to_ == To::Float) {
          before = scratch.floats.size();
          split(text, scratch.tokens);
          append_numbers(scratch.tokens, scratch.floats);
          after = scratch.floats.size();
        } else {
          before = all_tokens.size();
          split(text, scratch.tokens);
          all_tokens.insert(all_tokens.end(), scratch.tokens.begin(), scratch.tokens.end());
          after = all_tokens.size();
        }
      } catch (const DataError& e) {
        scratch.integers.resize(std::min(scratch.integers.size(), before));
        scratch.floats.resize(std::min(scratch.floats.size(), before));
        if (!issues.skip_row(r, e.what())) throw RowError(r, e.what());
        continue;
      }
      spans.push_back({before, after - before});
      kept.push_back(r);
    }
    Chunk out;
    const bool all_kept = kept.size() == in.rows();
    if (all_kept) {
      out.share_origins(in, 0, in.rows());
    } else {
      out.gather_origins(in, kept);
    }
    out.set_rows(kept.size());
    Column tokens{output_, Column::Layout::Ragged, {}, {}, std::move(spans)};
    if (to_ == To::Bytes) {
      tokens.tensor = Tensor::from_strings(all_tokens, {static_cast<std::int64_t>(all_tokens.size())});
    } else if (to_ == To::Int64) {
      tokens.tensor = copy_of(scratch.integers, values_pool_);
    } else {
      tokens.tensor = copy_of(scratch.floats, values_pool_);
    }
    // The other fields as they were, and the tokens where the element form sets them.
    bool placed = false;
    for (const Column& c : in.columns()) {
      if (c.name == output_) {
        out.columns().push_back(std::move(tokens));
        placed = true;
      } else {
        out.columns().push_back(all_kept ? c : gather_rows(c, kept));
      }
    }
    if (!placed) out.columns().push_back(std::move(tokens));
    return out;
  }

 private:
  // What a splitting thread reuses from line to line: its token list (one allocation per thread,
  // not per line) and the block its numbers go to. In a plugin a thread_local's address comes
  // from a call to __tls_get_addr, and GCC, given the variable inline, calls it again at every
  // use in the token loop (5% of the stage): out of line, the address is fetched once per line.
  struct Scratch {
    std::vector<std::string_view> tokens;
    std::vector<std::int64_t> integers;
    std::vector<float> floats;
    std::shared_ptr<Buffer> slab;
    std::size_t used = 0;
  };
  [[gnu::noinline]] static Scratch& this_thread_scratch() {
    thread_local Scratch scratch;
    return scratch;
  }
  // The numbers of many lines share one 16 KiB block, carved on this thread: a line's tensor costs
  // no allocation, and no free on the thread that drops it (each one's own malloc and its free on
  // the batching thread, contending for malloc's arena locks, halved the pipeline's speed:
  // bench_sequences). A block lives while any of its lines does, as a read chunk lives while any
  // record viewing it does.
  template <class T> static Tensor copy_of(const std::vector<T>& values, Allocator& allocator) {
    Tensor t = Tensor::empty(dtype_of<T>(), {static_cast<std::int64_t>(values.size())}, allocator);
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
    return t;
  }
  template <class T> static Tensor from_slab(Scratch& scratch, const T* values, std::int64_t n) {
    Tensor out = from_slab(scratch, dtype_of<T>(), n);
    if (n > 0) std::memcpy(out.raw_data(), values, static_cast<std::size_t>(n) * sizeof(T));
    return out;
  }
  static Tensor from_slab(Scratch& scratch, DType dtype, std::int64_t n) {
    std::shared_ptr<Buffer>& slab = scratch.slab;
    std::size_t& used = scratch.used;
    const std::size_t need = (static_cast<std::size_t>(n) * dtype_size(dtype) + 7) & ~std::size_t{7};  // 8-byte aligned
    if (need > kSlabBytes / 4) return Tensor::empty(dtype, {n});  // a long line has its own
    if (!slab || used + need > slab->size()) {
      slab = HostAllocator::instance().allocate(kSlabBytes);
      used = 0;
    }
    Tensor out = Tensor::view(dtype, {n}, slab, used);
    used += need;
    return out;
  }
  static constexpr std::size_t kSlabBytes = 16384;
  // Whitespace-separated decimal integers (pre-tokenized text: the common case) read in the pass
  // that finds them (plain_integers.hpp): false at anything else, and the general path then reads
  // the line again and names the token it cannot read. Appends to `out` (which the caller cuts
  // back when this says false).
  static bool plain_integers(std::string_view text, std::vector<std::int64_t>& out) {
    return read_plain_integers(text, [&out](std::int64_t v) { out.push_back(v); });
  }
  // The tokens of `text` into `tokens`: runs of blanks separate them, or the separator (empty
  // tokens kept, as Python's str.split(sep)).
  void split(std::string_view text, std::vector<std::string_view>& tokens) const {
    tokens.clear();
    if (separator_.empty()) {
      // A character test, not find_first_of: libstdc++ searches the set with a memchr per
      // character of the text, a quarter of this stage's time on lines of short numbers.
      const char* p = text.data();
      const char* const end = p + text.size();
      for (;;) {
        while (p != end && is_blank(*p)) ++p;
        if (p == end) break;
        const char* const begin = p;
        while (p != end && !is_blank(*p)) ++p;
        tokens.emplace_back(begin, static_cast<std::size_t>(p - begin));
      }
    } else if (!text.empty()) {
      std::size_t at = 0;
      for (;;) {
        const std::size_t end = text.find(separator_, at);
        tokens.push_back(text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
        if (end == std::string_view::npos) break;
        at = end + separator_.size();
      }
    }
  }
  template <class T> void append_numbers(const std::vector<std::string_view>& tokens, std::vector<T>& out) const {
    for (std::size_t k = 0; k < tokens.size(); ++k) out.push_back(number<T>(tokens[k], static_cast<std::int64_t>(k)));
  }
  // Space, tab, line feed, vertical tab, form feed, carriage return: what str.split() splits at.
  static bool is_blank(char c) { return c == ' ' || is_other_blank(c); }

  // from_chars: no copy of the token and no locale (strtoll costs several times more per token).
  template <class T> T number(std::string_view token, std::int64_t k) const {
    T v{};
    const char* begin = token.data();
    const char* end = begin + token.size();
    if (!token.empty() && *begin == '+') ++begin;  // "+5", as strtoll reads it
    const auto [stop, error] = std::from_chars(begin, end, v);
    if (token.empty() || stop != end || error != std::errc())
      throw DataError("split_text: token " + std::to_string(k) + " of field '" + field_ + "', '" + std::string(token.substr(0, 40)) +
                      "', is not " + (std::is_same_v<T, float> ? "a number" : "an int64"));
    return v;
  }
  // A chunk's values: blocks reused once the stage that takes them lets go (a fresh one each
  // time cost malloc's consolidation on the thread that frees it, and fresh pages).
  VaryingSizePool values_pool_;
  enum class To { Bytes, Int64, Float };
  std::string field_, separator_;
  To to_;
  std::string output_;
};

// tf.stack([x[f] for f in fields], axis=-1): several fields of one shape (a sensor's channels)
// into one field with a last dimension of their number, converted to one type.
class StackFields final : public Map {
 public:
  static OperatorInfo describe() {
    return {"stack_fields",
            OperatorKind::Map,
            "Stacks fields of one shape into one field along a new last dimension (the fields are removed)",
            {ParamSpec::make("fields", ParamType::StringList, "the fields to stack, in order"),
             ParamSpec::make("output", ParamType::String, "name of the stacked field"),
             ParamSpec::make("dtype", ParamType::Choice, "type of the stacked field").def("f32").one_of({"f32", "f64", "i64", "i32"})},
            {.stateless = true},
            {}};
  }
  explicit StackFields(const Params& p) : fields_(p.get_string_list("fields")), output_(p.get_string("output")) {
    if (fields_.size() < 1) throw ParamError("fields is empty; name the fields to stack");
    const std::string& t = p.get_string("dtype");
    dtype_ = t == "f64" ? DType::F64 : t == "i64" ? DType::I64 : t == "i32" ? DType::I32 : DType::F32;
  }
  Sample map(Sample in, const ElementContext&) override {
    const Tensor& first = in.at(fields_.front());
    Shape shape = first.shape();
    const std::int64_t n = first.num_elements(), k = static_cast<std::int64_t>(fields_.size());
    shape.push_back(k);
    Tensor out = Tensor::empty(dtype_, shape);
    for (std::int64_t f = 0; f < k; ++f) {
      const Tensor& t = in.at(fields_[static_cast<std::size_t>(f)]);
      if (t.shape() != first.shape())
        throw DataError("stack_fields: field '" + fields_[static_cast<std::size_t>(f)] + "' is " + shape_string(t.shape()) + ", '" +
                        fields_.front() + "' " + shape_string(first.shape()) + ": stacked fields need one shape");
      for (std::int64_t i = 0; i < n; ++i) put(out, i * k + f, value(t, i, fields_[static_cast<std::size_t>(f)]));
    }
    for (const auto& name : fields_) in.erase(name);
    in.set(output_, std::move(out));
    return in;
  }

 private:
  static double value(const Tensor& t, std::int64_t i, const std::string& name) {
    switch (t.dtype()) {
      case DType::U8: return t.data<std::uint8_t>()[i];
      case DType::I16: return t.data<std::int16_t>()[i];
      case DType::I32: return t.data<std::int32_t>()[i];
      case DType::I64: return static_cast<double>(t.data<std::int64_t>()[i]);
      case DType::F32: return t.data<float>()[i];
      case DType::F64: return t.data<double>()[i];
      default: throw DataError("stack_fields: field '" + name + "' is " + dtype_name(t.dtype()) + ", not a number");
    }
  }
  void put(Tensor& out, std::int64_t i, double v) const {
    switch (dtype_) {
      case DType::F64: out.data<double>()[i] = v; break;
      case DType::I64: out.data<std::int64_t>()[i] = static_cast<std::int64_t>(v); break;
      case DType::I32: out.data<std::int32_t>()[i] = static_cast<std::int32_t>(v); break;
      default: out.data<float>()[i] = static_cast<float>(v); break;
    }
  }
  std::vector<std::string> fields_;
  std::string output_;
  DType dtype_ = DType::F32;
};

}  // namespace

void register_field_ops(Registrar& registrar) {
  registrar.add<SelectFields>();
  registrar.add<SplitText>();
  registrar.add<StackFields>();
}

}  // namespace sluice::std_ops
