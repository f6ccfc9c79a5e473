#pragma once
/// @file
/// The plugin author's test harness: one operator run on given samples, with given parameters
/// (as text, exactly as a pipeline file gives them), seed, epoch and element indices, without a
/// pipeline file and without the engine; checks of its outputs, of its determinism at several
/// parallelisms, and of the parameters it refuses. Header-only and framework-free: it throws
/// sluice::testing::Failure with a message, which any test framework (or a bare main()) reports.
///
///     sluice::testing::Harness<MyScale> scale({{"factor", "3"}});
///     auto out = scale.map({sluice::testing::sample("value", std::int64_t{2})});
///     sluice::testing::expect_equal(out[0].at("value").item<std::int64_t>(), std::int64_t{6}, "2 x 3");
///     scale.check_deterministic({...inputs...});            // same bytes on 1, 2 and 4 threads
///     scale.check_chunks({...inputs...});                   // chunked form == element form
///     sluice::testing::expect_refused<MyScale>({{"factor", "x"}}, "expects an integer");
///
/// A context is the engine's: element `first_index + i` of epoch `epoch`, stage id `stage_id`
/// and seed `seed`, so a random operator draws here what it draws in a pipeline whose stage has
/// that id and whose options have that seed.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <type_traits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/chunk.hpp"
#include "sluice/operator.hpp"
#include "sluice/param_text.hpp"

namespace sluice::testing {

/// What a failed check throws: catch it as std::exception in any test framework.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parameters as a pipeline file writes them: name and text value.
using TextParams = std::vector<std::pair<std::string, std::string>>;

/// Where the elements stand, as the engine would give it.
struct Options {
  std::uint64_t seed = 0;           ///< the pipeline's seed (options { seed: ... })
  std::uint64_t epoch = 0;          ///< the epoch of the elements given
  std::uint64_t first_index = 0;    ///< the index of the first element given; the next ones follow
  std::string stage_id = "under_test";  ///< the stage's id (random draws depend on it)
};

/// A sample of one field.
template <class T> Sample sample(const std::string& field, T value) {
  Sample s;
  if constexpr (std::is_convertible_v<T, std::string_view>) s.set(field, Tensor::from_string(std::string_view(value)));
  else s.set(field, Tensor::scalar<T>(value));
  return s;
}

/// The samples as one chunk (sluice/chunk.hpp): each field of the first a column of every row
/// stacked, or (6.3) a Ragged column where the rows' sizes in dimension 0 differ; the rows must
/// have the same fields and types, and shapes equal but for that (Failure otherwise). Row
/// origins are the samples' own.
inline Chunk chunk_of(const std::vector<Sample>& rows) {
  Chunk chunk;
  chunk.set_rows(rows.size());
  if (rows.empty()) return chunk;
  for (const auto& field : rows[0].fields()) {
    const Tensor& first = field.tensor;
    bool ragged = false;
    for (const auto& row : rows) {
      const Tensor* t = row.find(field.name);
      ragged = ragged || (t && t->shape() != first.shape());
    }
    if (ragged && first.rank() > 0) {
      Shape step(first.shape().begin() + 1, first.shape().end());
      std::vector<Column::Span> spans;
      std::vector<std::string_view> strings;
      std::int64_t total = 0;
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const Tensor* t = rows[r].find(field.name);
        if (!t || t->dtype() != first.dtype() || t->rank() != first.rank() || !std::equal(step.begin(), step.end(), t->shape().begin() + 1))
          throw Failure("chunk_of: row " + std::to_string(r) + "'s field '" + field.name +
                        "' is missing, or not of row 0's type and shape but for its first dimension");
        spans.push_back({static_cast<std::uint64_t>(total), static_cast<std::uint64_t>(t->shape()[0])});
        total += t->shape()[0];
      }
      Shape shape = step;
      shape.insert(shape.begin(), total);
      Column& column = chunk.add(field.name, Column::Layout::Ragged);
      column.spans = std::move(spans);
      if (first.dtype() == DType::Bytes) {
        for (const auto& row : rows)
          for (std::int64_t k = 0; k < row.at(field.name).num_elements(); ++k) strings.push_back(row.at(field.name).string_at(k));
        column.tensor = Tensor::from_strings(strings, shape);
      } else {
        column.tensor = Tensor::empty(first.dtype(), shape);
        std::size_t at = 0;
        for (const auto& row : rows) {
          const Tensor& t = row.at(field.name);
          if (t.nbytes() > 0) std::memcpy(column.tensor.raw_data() + at, t.raw_data(), t.nbytes());
          at += t.nbytes();
        }
      }
      continue;
    }
    Shape shape = first.shape();
    shape.insert(shape.begin(), static_cast<std::int64_t>(rows.size()));
    std::vector<std::string_view> strings;
    Tensor column = first.dtype() == DType::Bytes ? Tensor() : Tensor::empty(first.dtype(), shape);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const Tensor* t = rows[r].find(field.name);
      if (!t || t->dtype() != first.dtype() || t->shape() != first.shape())
        throw Failure("chunk_of: row " + std::to_string(r) + "'s field '" + field.name + "' is missing or not of row 0's type and shape");
      if (first.dtype() == DType::Bytes) {
        for (std::int64_t k = 0; k < t->num_elements(); ++k) strings.push_back(t->string_at(k));
      } else if (t->nbytes() > 0) {
        std::memcpy(column.raw_data() + r * first.nbytes(), t->raw_data(), t->nbytes());
      }
    }
    chunk.add(field.name, Column::Layout::Rows).tensor = first.dtype() == DType::Bytes ? Tensor::from_strings(strings, shape) : column;
  }
  chunk.set_where(rows[0].shared_origin().where);
  for (const auto& row : rows) {
    chunk.records().push_back(row.shared_origin().record);
    chunk.byte_offsets().push_back(row.shared_origin().byte_offset);
  }
  return chunk;
}

/// Why two samples differ (field names and order, types, shapes, bytes), or empty when they are
/// the same byte for byte.
inline std::string difference(const Sample& a, const Sample& b) {
  if (a.size() != b.size()) return "one has " + std::to_string(a.size()) + " fields, the other " + std::to_string(b.size());
  for (std::size_t f = 0; f < a.size(); ++f) {
    const Field& x = a.fields()[f];
    const Field& y = b.fields()[f];
    if (x.name != y.name) return "field " + std::to_string(f) + " is '" + x.name + "' in one and '" + y.name + "' in the other";
    if (x.tensor.dtype() != y.tensor.dtype() || x.tensor.shape() != y.tensor.shape())
      return "field '" + x.name + "' is " + dtype_name(x.tensor.dtype()) + shape_string(x.tensor.shape()) + " in one and " +
             dtype_name(y.tensor.dtype()) + shape_string(y.tensor.shape()) + " in the other";
    if (x.tensor.dtype() == DType::Bytes) {
      for (std::int64_t i = 0; i < x.tensor.num_elements(); ++i)
        if (x.tensor.string_at(i) != y.tensor.string_at(i)) return "field '" + x.name + "' differs at string " + std::to_string(i);
    } else if (x.tensor.nbytes() > 0 && std::memcmp(x.tensor.raw_data(), y.tensor.raw_data(), x.tensor.nbytes()) != 0) {
      return "field '" + x.name + "' differs in its values";
    }
  }
  return {};
}

/// Throws Failure unless the two lists of samples are the same, sample by sample, byte for byte.
inline void expect_same(const std::vector<Sample>& got, const std::vector<Sample>& want, const std::string& what) {
  if (got.size() != want.size())
    throw Failure(what + ": " + std::to_string(got.size()) + " outputs, expected " + std::to_string(want.size()));
  for (std::size_t i = 0; i < got.size(); ++i)
    if (const std::string why = difference(got[i], want[i]); !why.empty()) throw Failure(what + ": output " + std::to_string(i) + ": " + why);
}

/// Throws Failure unless `got == want`.
template <class T, class U> void expect_equal(const T& got, const U& want, const std::string& what) {
  if (got == want) return;
  std::ostringstream message;
  message << what << ": got " << got << ", expected " << want;
  throw Failure(message.str());
}

/// Why the operator refuses these parameters (the message of the error that parsing them against
/// its schema, or its constructor, throws), or empty if it takes them.
template <class T> std::string refusal(const TextParams& params) {
  try {
    T op(parse_param_texts(T::describe().params, params));
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

/// Throws Failure unless the operator refuses these parameters with a message containing `reason`.
template <class T> void expect_refused(const TextParams& params, const std::string& reason) {
  const std::string why = refusal<T>(params);
  if (why.empty()) throw Failure(T::describe().name + " took parameters it should refuse (expected: " + reason + ")");
  if (why.find(reason) == std::string::npos) throw Failure(T::describe().name + " refused its parameters with '" + why + "', expected '" + reason + "'");
}

/// One operator of class T (a static describe() and a constructor from Params, as plugins
/// register them), started as the engine starts it and run call by call.
template <class T> class Harness {
 public:
  /// `Harness<Op> op({{"factor", "3"}})`: the parameters as a pipeline file writes them.
  Harness(std::initializer_list<std::pair<std::string, std::string>> params = {}, Options options = {})
      : Harness(TextParams(params), std::move(options)) {}
  explicit Harness(const TextParams& params, Options options = {})
      : info_(T::describe()), params_(parse_param_texts(info_.params, params)), options_(std::move(options)) {
    stage_.id = options_.stage_id;
    stage_.seed = options_.seed;
    stage_.stage_hash = stable_hash(options_.stage_id);
    op_ = std::make_unique<T>(params_);
    op_->start(stage_);
  }
  ~Harness() {
    if (op_) op_->finish(true);
  }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  T& op() { return *op_; }
  const OperatorInfo& info() const { return info_; }
  /// The context of the k-th element given (k from 0).
  ElementContext context(std::uint64_t k) const { return ElementContext{&stage_, options_.epoch, options_.first_index + k}; }

  /// A map's outputs, one per input.
  std::vector<Sample> map(std::vector<Sample> inputs) {
    std::vector<Sample> out;
    for (std::size_t k = 0; k < inputs.size(); ++k) out.push_back(op_->map(std::move(inputs[k]), context(k)));
    return out;
  }
  /// The inputs a filter keeps, in order.
  std::vector<Sample> filter(std::vector<Sample> inputs) {
    std::vector<Sample> out;
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (op_->keep(inputs[k], context(k))) out.push_back(std::move(inputs[k]));
    return out;
  }
  /// Every output of each input of an expand, input after input. Damage it reports is kept in
  /// damage_reports() and stepped over (the skip policy) unless `fail_on_damage`.
  std::vector<Sample> expand(std::vector<Sample> inputs, bool fail_on_damage = false) {
    std::vector<Sample> out;
    Damage damage(fail_on_damage, damage_);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      auto cursor = op_->open(std::move(inputs[k]), context(k), damage);
      for (Sample s; cursor && cursor->next(s); s = Sample()) out.push_back(std::move(s));
    }
    return out;
  }
  /// An aggregate's outputs for one iteration of these inputs (begin_iteration, a push each,
  /// end_iteration).
  std::vector<Sample> aggregate(std::vector<Sample> inputs) {
    Collect out;
    op_->begin_iteration(options_.epoch);
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (op_->push(std::move(inputs[k]), context(k), out) == Aggregate::Flow::SkipRestOfIteration) break;
    op_->end_iteration(options_.epoch, out);
    return std::move(out.samples);
  }
  /// One pass of a source (at most `limit` elements; -1: all of them).
  std::vector<Sample> source(std::int64_t limit = -1) {
    std::vector<Sample> out;
    op_->begin_pass(options_.epoch);
    for (std::uint64_t k = 0; limit < 0 || static_cast<std::int64_t>(k) < limit; ++k) {
      Sample s;
      if (!op_->next(s, context(k))) break;
      out.push_back(std::move(s));
    }
    return out;
  }
  /// A sink consuming these inputs, then the end of the iteration.
  void sink(std::vector<Sample> inputs) {
    for (std::size_t k = 0; k < inputs.size(); ++k) op_->consume(std::move(inputs[k]), context(k));
    op_->end_iteration(options_.epoch);
  }
  /// One iteration of a combine over these inputs (one list per input stage).
  std::vector<Sample> combine(std::vector<std::vector<Sample>> inputs) {
    Inputs in(std::move(inputs));
    std::vector<Sample> out;
    op_->begin_iteration(context(0));
    for (Sample s; op_->next(in, s); s = Sample()) out.push_back(std::move(s));
    return out;
  }

  /// For aggregates and sources that save state (traits.saves_state, what checkpoints need): a
  /// run cut after every possible number of inputs (an aggregate) or outputs (a source), its
  /// state saved and restored into a fresh operator with the same parameters, which goes on from
  /// there, gives the outputs of an uninterrupted run byte for byte. A source's state saved inside
  /// the next pass, restored and then given begin_pass() of this one gives this pass whole (the
  /// host resumes a source before a pass with the state it had when a cut came, which may be of a
  /// later pass than the one it resumes). Throws Failure naming the cut.
  void check_resume(const std::vector<Sample>& inputs = {}) {
    if (!info_.traits.saves_state) throw Failure(info_.name + " does not say saves_state: a checkpoint would refuse it");
    if constexpr (std::is_base_of_v<Aggregate, T>) {
      const std::vector<Sample> whole = fresh_aggregate(inputs, 0, inputs.size(), nullptr, nullptr);
      for (std::size_t cut = 0; cut <= inputs.size(); ++cut) {
        MemoryState state;
        std::vector<Sample> out = fresh_aggregate(inputs, 0, cut, &state, nullptr);
        const std::vector<Sample> rest = fresh_aggregate(inputs, cut, inputs.size(), nullptr, &state);
        out.insert(out.end(), rest.begin(), rest.end());
        expect_same(out, whole, info_.name + " saved after input " + std::to_string(cut) + " and restored");
      }
    } else if constexpr (std::is_base_of_v<Source, T>) {
      T first(params_);
      first.start(stage_);
      std::vector<Sample> whole;
      first.begin_pass(options_.epoch);
      for (Sample s; first.next(s, context(whole.size())); s = Sample()) whole.push_back(std::move(s));
      for (std::size_t cut = 0; cut <= whole.size(); ++cut) {
        MemoryState state;
        std::vector<Sample> out;
        {
          T before(params_);
          before.start(stage_);
          before.begin_pass(options_.epoch);
          for (Sample s; out.size() < cut && before.next(s, context(out.size())); s = Sample()) out.push_back(std::move(s));
          before.save_state(state);
          before.finish(false);
        }
        T after(params_);
        after.start(stage_);
        after.restore_state(state);
        for (Sample s; after.next(s, context(out.size())); s = Sample()) out.push_back(std::move(s));
        after.finish(true);
        expect_same(out, whole, info_.name + " saved after output " + std::to_string(cut) + " and restored");
        MemoryState later;
        {
          T ahead(params_);
          ahead.start(stage_);
          ahead.begin_pass(options_.epoch + 1);
          std::size_t made = 0;
          for (Sample s; made < cut && ahead.next(s, ElementContext{&stage_, options_.epoch + 1, options_.first_index + made}); s = Sample()) ++made;
          ahead.save_state(later);
          ahead.finish(false);
        }
        T again(params_);
        again.start(stage_);
        again.restore_state(later);
        again.begin_pass(options_.epoch);
        std::vector<Sample> pass;
        for (Sample s; again.next(s, context(pass.size())); s = Sample()) pass.push_back(std::move(s));
        again.finish(true);
        expect_same(pass, whole, info_.name + " saved after output " + std::to_string(cut) + " of the next pass, restored, then begun at this pass");
      }
      first.finish(true);
    } else {
      throw Failure(info_.name + " is a " + operator_kind_name(info_.kind) + ": check_resume takes aggregates and sources");
    }
  }

  /// Damage reasons an expand reported (see expand()).
  const std::vector<std::string>& damage_reports() const { return damage_; }

  /// For an operator with a chunked form (ChunkedMap, ChunkedAggregate; see sluice/chunk.hpp):
  /// `inputs` given as one chunk (chunk_of) give the element form's outputs byte for byte, and the
  /// rows the element form refuses (DataError) are the rows the chunked form reports, with the
  /// same reasons. Each form runs on a fresh operator. Throws Failure naming what differs.
  void check_chunks(const std::vector<Sample>& inputs) {
    std::vector<Sample> want, got;
    std::vector<std::pair<std::size_t, std::string>> refused_want, refused_got;
    const Chunk chunk = chunk_of(inputs);
    T elements(params_), chunked(params_);
    elements.start(stage_);
    chunked.start(stage_);
    if constexpr (std::is_base_of_v<ChunkedMap, T>) {
      if (!chunked.maps_chunks()) throw Failure(info_.name + " says it takes no chunks with these parameters (maps_chunks())");
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        try {
          want.push_back(elements.map(Sample(inputs[k]), context(k)));
        } catch (const DataError& e) {
          refused_want.emplace_back(k, e.what());
        }
      }
      struct Rows final : RowIssues {
        std::vector<std::pair<std::size_t, std::string>>& refused;
        explicit Rows(std::vector<std::pair<std::size_t, std::string>>& r) : refused(r) {}
        bool skip_row(std::size_t row, const std::string& reason) override {
          refused.emplace_back(row, reason);
          return true;
        }
      } rows(refused_got);
      const Chunk out = chunked.map_chunk(chunk, context(0), rows);
      for (std::size_t r = 0; r < out.rows(); ++r) got.push_back(out.row(r));
    } else if constexpr (std::is_base_of_v<ChunkedAggregate, T>) {
      Collect want_out, got_out;
      elements.begin_iteration(options_.epoch);
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        try {
          if (elements.push(Sample(inputs[k]), context(k), want_out) == Aggregate::Flow::SkipRestOfIteration) break;
        } catch (const DataError& e) {
          refused_want.emplace_back(k, e.what());
        }
      }
      elements.end_iteration(options_.epoch, want_out);
      chunked.begin_iteration(options_.epoch);
      Chunk rest = chunk;
      for (std::size_t done = 0; rest.rows() > 0;) {  // as the engine does: after a refused row, the rows after it
        try {
          if (chunked.push_chunk(rest, context(done), got_out) == Aggregate::Flow::SkipRestOfIteration) break;
          break;
        } catch (const RowError& e) {
          refused_got.emplace_back(done + e.row(), e.what());
          rest = rest.slice(e.row() + 1, rest.rows());
          done += e.row() + 1;
        }
      }
      chunked.end_iteration(options_.epoch, got_out);
      want = std::move(want_out.samples);
      got = std::move(got_out.samples);
    } else {
      throw Failure(info_.name + " has no chunked form: derive from ChunkedMap or ChunkedAggregate too");
    }
    elements.finish(true);
    chunked.finish(true);
    expect_same(got, want, info_.name + " given a chunk of " + std::to_string(inputs.size()) + " rows");
    if (refused_got != refused_want) {
      auto text = [](const std::vector<std::pair<std::size_t, std::string>>& v) {
        std::string t;
        for (const auto& [row, reason] : v) t += (t.empty() ? "" : "; ") + std::to_string(row) + ": " + reason;
        return t.empty() ? std::string("none") : t;
      };
      throw Failure(info_.name + " given a chunk refused rows " + text(refused_got) + ", element by element " + text(refused_want));
    }
  }

  /// For stateless maps and filters (the engine runs them on several workers): the outputs on
  /// each of `threads` worker threads, each element with its own context, are the sequential
  /// outputs byte for byte. Throws Failure naming the parallelism and the output that differs.
  void check_deterministic(const std::vector<Sample>& inputs, std::vector<int> threads = {1, 2, 4}) {
    if (!info_.traits.stateless) throw Failure(info_.name + " is not stateless: the engine runs it on one worker only");
    const std::vector<Sample> sequential = run_parallel(inputs, 1);
    for (int n : threads) expect_same(run_parallel(inputs, n), sequential, info_.name + " on " + std::to_string(n) + " threads");
    for (int n : threads) expect_same(run_parallel(inputs, n), sequential, info_.name + " again on " + std::to_string(n) + " threads");
  }

 private:
  class Collect final : public Emitter {
   public:
    std::vector<Sample> samples;
    bool push(Sample s) override {
      samples.push_back(std::move(s));
      return true;
    }
  };
  class Damage final : public DamageReport {
   public:
    Damage(bool fail, std::vector<std::string>& reasons) : fail_(fail), reasons_(reasons) {}
    bool skip_damaged(const std::string& reason) override {
      reasons_.push_back(reason);
      return !fail_;
    }

   private:
    bool fail_;
    std::vector<std::string>& reasons_;
  };
  class Inputs final : public CombineInputs {
   public:
    explicit Inputs(std::vector<std::vector<Sample>> lists) : lists_(std::move(lists)), next_(lists_.size(), 0) {
      for (std::size_t k = 0; k < lists_.size(); ++k) names_.push_back("input " + std::to_string(k));
    }
    std::size_t size() const override { return lists_.size(); }
    bool next(std::size_t k, Sample& out) override {
      if (k >= lists_.size() || next_[k] >= lists_[k].size()) return false;
      out = std::move(lists_[k][next_[k]++]);
      return true;
    }
    const std::string& name(std::size_t k) const override { return names_.at(k); }

   private:
    std::vector<std::vector<Sample>> lists_;
    std::vector<std::size_t> next_;
    std::vector<std::string> names_;
  };

  // A checkpoint's state in memory: bytes in order, elements by value.
  class MemoryState final : public StateWriter, public StateReader {
   public:
    void put_bytes(const void* data, std::size_t size) override {
      const auto* bytes = static_cast<const char*>(data);
      bytes_.insert(bytes_.end(), bytes, bytes + size);
    }
    void put_element(const Sample& element) override { elements_.push_back(element); }
    void describe(std::string) override {}
    void get_bytes(void* data, std::size_t size) override {
      if (read_ + size > bytes_.size()) throw DataError("restore_state() read more than save_state() wrote");
      std::memcpy(data, bytes_.data() + read_, size);
      read_ += size;
    }
    Sample get_element() override {
      if (next_element_ >= elements_.size()) throw DataError("restore_state() read more elements than save_state() wrote");
      return elements_[next_element_++];
    }

   private:
    std::vector<char> bytes_;
    std::size_t read_ = 0;
    std::vector<Sample> elements_;
    std::size_t next_element_ = 0;
  };

  // A fresh aggregate given inputs [from, to): restored from `restore` first when given (and
  // then not begun), saved into `save` at the end instead of ending the iteration when given.
  template <class Op = T>
  std::vector<Sample> fresh_aggregate(const std::vector<Sample>& inputs, std::size_t from, std::size_t to, MemoryState* save,
                                      MemoryState* restore) {
    Op op(params_);
    op.start(stage_);
    Collect out;
    if (restore) op.restore_state(*restore);
    else op.begin_iteration(options_.epoch);
    for (std::size_t k = from; k < to; ++k)
      if (op.push(Sample(inputs[k]), context(k), out) == Aggregate::Flow::SkipRestOfIteration) break;
    if (save) {
      op.save_state(*save);
      op.finish(false);
    } else {
      op.end_iteration(options_.epoch, out);
      op.finish(true);
    }
    return std::move(out.samples);
  }

  // Element k on thread k % n, as the engine's workers take them: each thread has its own copy
  // of the input (tensors shared, as the engine shares them), the outputs put back in order.
  std::vector<Sample> run_parallel(const std::vector<Sample>& inputs, int n) {
    std::vector<Sample> out(inputs.size());
    std::vector<char> kept(inputs.size(), 0);
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(std::max(1, n)));
    auto work = [&](int t) {
      try {
        for (std::size_t k = static_cast<std::size_t>(t); k < inputs.size(); k += static_cast<std::size_t>(n)) {
          Sample in = inputs[k];
          if constexpr (std::is_base_of_v<Map, T>) {
            out[k] = op_->map(std::move(in), context(k));
            kept[k] = 1;
          } else if constexpr (std::is_base_of_v<Filter, T>) {
            kept[k] = op_->keep(in, context(k));
            if (kept[k]) out[k] = std::move(in);
          } else {
            throw Failure(info_.name + " is a " + operator_kind_name(info_.kind) + ": only maps and filters run on several workers");
          }
        }
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    std::vector<Sample> result;
    for (std::size_t k = 0; k < out.size(); ++k)
      if (kept[k]) result.push_back(std::move(out[k]));
    return result;
  }

  OperatorInfo info_;
  Params params_;
  Options options_;
  StageInfo stage_;
  std::unique_ptr<T> op_;
  std::vector<std::string> damage_;
};

}  // namespace sluice::testing
