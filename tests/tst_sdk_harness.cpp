// The plugin author's test harness (sdk/include/sluice/testing.hpp): it gives an operator the
// contexts the engine gives, and each of its checks fails on the fault it exists to catch.
#include <QtTest>

#include <thread>

#include "sluice/row_origins.hpp"
#include "sluice/sample_codec.hpp"
#include "sluice/testing.hpp"

namespace t = sluice::testing;

namespace {

// Adds a draw of the element's generator to 'value': deterministic at any parallelism.
class Jitter final : public sluice::Map {
 public:
  static sluice::OperatorInfo describe() {
    return {"jitter", sluice::OperatorKind::Map, "adds a random draw", {sluice::ParamSpec::make("scale", sluice::ParamType::Float, "").def("1").range(0, 10)},
            {.stateless = true, .random = true}, {}};
  }
  explicit Jitter(const sluice::Params& p) : scale_(p.get_float("scale")) {}
  sluice::Sample map(sluice::Sample in, const sluice::ElementContext& ctx) override {
    auto rng = ctx.rng();
    in.set("draw", sluice::Tensor::scalar<double>(scale_ * rng.uniform()));
    return in;
  }

 private:
  double scale_;
};

// Its output depends on the thread that makes it (as with a generator per thread): the same on
// one thread every time, different on several (the fault check_deterministic exists for).
const std::thread::id first_thread = std::this_thread::get_id();
class ThreadBound final : public sluice::Map {
 public:
  static sluice::OperatorInfo describe() { return {"thread_bound", sluice::OperatorKind::Map, "depends on its thread", {}, {.stateless = true}, {}}; }
  explicit ThreadBound(const sluice::Params&) {}
  sluice::Sample map(sluice::Sample in, const sluice::ElementContext&) override {
    in.set("main_thread", sluice::Tensor::scalar<std::int64_t>(std::this_thread::get_id() == first_thread));
    return in;
  }
};

// Sums pairs; with Forgetful, its restore_state() loses the held half of a pair.
template <bool Forgetful> class Pairs final : public sluice::Aggregate {
 public:
  static sluice::OperatorInfo describe() { return {"pairs", sluice::OperatorKind::Aggregate, "sums pairs", {}, {.saves_state = true}, {}}; }
  explicit Pairs(const sluice::Params&) {}
  void begin_iteration(std::uint64_t) override { held_ = -1; }
  Flow push(sluice::Sample in, const sluice::ElementContext&, sluice::Emitter& out) override {
    const auto v = in.at("value").item<std::int64_t>();
    if (held_ < 0) {
      held_ = v;
    } else {
      out.push(t::sample("value", held_ + v));
      held_ = -1;
    }
    return Flow::Continue;
  }
  void end_iteration(std::uint64_t, sluice::Emitter& out) override {
    if (held_ >= 0) out.push(t::sample("value", held_));
  }
  void save_state(sluice::StateWriter& w) const override { w.put(held_); }
  void restore_state(sluice::StateReader& r) override { held_ = Forgetful ? (r.get<std::int64_t>(), -1) : r.get<std::int64_t>(); }

 private:
  std::int64_t held_ = -1;
};

// Three values a pass, shifted by the pass it begins. Flawed, it numbers its passes by its own
// count of them (CountsPasses), or goes back to a pass's start only for a later pass than the one
// it was in (ResetsOnlyForward): a state saved in a later pass then misleads it.
enum class Flaw { None, CountsPasses, ResetsOnlyForward };
template <Flaw F> class Shifted final : public sluice::Source {
 public:
  static sluice::OperatorInfo describe() { return {"shifted", sluice::OperatorKind::Source, "3 values a pass", {}, {.saves_state = true}, {}}; }
  explicit Shifted(const sluice::Params&) {}
  void begin_pass(std::uint64_t pass) override {
    if (F != Flaw::ResetsOnlyForward || pass >= pass_) next_ = 0;
    pass_ = F == Flaw::CountsPasses ? begun_ : pass;
    ++begun_;
  }
  bool next(sluice::Sample& out, const sluice::ElementContext&) override {
    if (next_ >= 3) return false;
    out = t::sample("value", static_cast<std::int64_t>(pass_ * 10 + next_++));
    return true;
  }
  void save_state(sluice::StateWriter& w) const override {
    w.put(pass_);
    w.put(next_);
    w.put(begun_);
  }
  void restore_state(sluice::StateReader& r) override {
    pass_ = r.get<std::uint64_t>();
    next_ = r.get<std::uint64_t>();
    begun_ = r.get<std::uint64_t>();
  }

 private:
  std::uint64_t pass_ = 0, next_ = 0, begun_ = 0;
};

// Gives a record per byte of its input's 'text'; a '!' is damage it steps over.
class Bytes final : public sluice::Expand {
 public:
  static sluice::OperatorInfo describe() { return {"bytes", sluice::OperatorKind::Expand, "a record per byte", {}, {.stateless = true}, {}}; }
  explicit Bytes(const sluice::Params&) {}
  std::unique_ptr<sluice::ExpandCursor> open(sluice::Sample in, const sluice::ElementContext&, sluice::DamageReport& damage) override {
    return std::make_unique<Cursor>(std::string(in.at("text").string_at(0)), damage);
  }

 private:
  class Cursor final : public sluice::ExpandCursor {
   public:
    Cursor(std::string text, sluice::DamageReport& damage) : text_(std::move(text)), damage_(damage) {}
    bool next(sluice::Sample& out) override {
      for (; at_ < text_.size(); ++at_) {
        if (text_[at_] != '!') {
          out.set("byte", sluice::Tensor::scalar<std::int64_t>(text_[at_++]));
          return true;
        }
        if (!damage_.skip_damaged("byte " + std::to_string(at_) + " is damaged")) throw sluice::DataError("byte " + std::to_string(at_) + " is damaged");
      }
      return false;
    }

   private:
    std::string text_;
    sluice::DamageReport& damage_;
    std::size_t at_ = 0;
  };
};

// Adds a draw to 'value', refusing negative values, element by element or a chunk at a time;
// with WrongIndex its chunked form draws every row with row 0's context (the fault check_chunks
// exists for).
template <bool WrongIndex> class Draws final : public sluice::Map, public sluice::ChunkedMap {
 public:
  static sluice::OperatorInfo describe() { return {"draws", sluice::OperatorKind::Map, "adds a draw", {}, {.stateless = true, .random = true}, {}}; }
  explicit Draws(const sluice::Params&) {}
  sluice::Sample map(sluice::Sample in, const sluice::ElementContext& ctx) override {
    const auto v = in.at("value").item<std::int64_t>();
    if (v < 0) throw sluice::DataError("negative value " + std::to_string(v));
    sluice::Sample out;
    out.set("value", sluice::Tensor::scalar<double>(static_cast<double>(v) + ctx.rng().uniform()));
    return out;
  }
  sluice::Chunk map_chunk(const sluice::Chunk& in, const sluice::ElementContext& first, sluice::RowIssues& issues) override {
    const auto* values = in.at("value").tensor.data<std::int64_t>();
    std::vector<double> out;
    std::vector<std::size_t> kept;
    for (std::size_t r = 0; r < in.rows(); ++r) {
      if (values[r] < 0) {
        const std::string reason = "negative value " + std::to_string(values[r]);
        if (!issues.skip_row(r, reason)) throw sluice::RowError(r, reason);
        continue;
      }
      const sluice::ElementContext row{first.stage, first.epoch, first.index + (WrongIndex ? 0 : r)};
      out.push_back(static_cast<double>(values[r]) + row.rng().uniform());
      kept.push_back(r);
    }
    sluice::Chunk result;
    result.set_rows(out.size());
    result.add("value", sluice::Column::Layout::Rows).tensor = sluice::Tensor::from_vector(out);
    result.gather_origins(in, kept);
    return result;
  }
};

std::vector<sluice::Sample> numbers(int n) {
  std::vector<sluice::Sample> out;
  for (int i = 0; i < n; ++i) out.push_back(t::sample("value", std::int64_t{i}));
  return out;
}

}  // namespace

class TestSdkHarness : public QObject {
  Q_OBJECT
 private slots:
  void contexts_are_the_engines() {
    // Element k of the call is index first_index + k of that epoch, keyed by seed and stage id.
    t::Harness<Jitter> jitter({{"scale", "2"}}, t::Options{.seed = 42, .epoch = 3, .first_index = 100, .stage_id = "noise"});
    const auto out = jitter.map(numbers(5));
    for (std::uint64_t k = 0; k < 5; ++k) {
      sluice::Rng rng(42, sluice::stable_hash("noise"), 3, 100 + k);
      QCOMPARE(out[k].at("draw").item<double>(), 2 * rng.uniform());
    }
    jitter.check_deterministic(numbers(200), {1, 2, 3, 8});
  }

  void check_chunks_compares_the_two_forms() {
    auto inputs = numbers(50);
    inputs[7] = t::sample("value", std::int64_t{-3});  // refused by both forms, as row 7
    t::Harness<Draws<false>> right({}, t::Options{.seed = 9, .first_index = 1000});
    right.check_chunks(inputs);
    t::Harness<Draws<true>> wrong({}, t::Options{.seed = 9, .first_index = 1000});
    try {
      wrong.check_chunks(inputs);
      QFAIL("a chunked form drawing with the wrong indices passed check_chunks");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("draws given a chunk of 50 rows: output 1: field 'value' differs") != std::string::npos, e.what());
    }
    t::Harness<Jitter> element_only;
    try {
      element_only.check_chunks(inputs);
      QFAIL("check_chunks passed an operator without a chunked form");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("jitter has no chunked form") != std::string::npos, e.what());
    }
  }

  void chunk_of_rows_of_different_lengths_is_ragged() {
    // Sequences of 0..4 values (and text of 1..3 tokens): one Ragged column each, whose rows
    // are the samples again, read through row() and through the row_* readers alike.
    std::vector<sluice::Sample> rows;
    for (int n = 0; n < 5; ++n) {
      sluice::Sample s;
      std::vector<std::int64_t> values;
      std::vector<std::string_view> words;
      for (int k = 0; k < n; ++k) values.push_back(10 * n + k);
      for (int k = 0; k <= n % 3; ++k) words.push_back(k % 2 ? "b" : "aa");
      s.set("ids", sluice::Tensor::from_vector(values, {n}));
      s.set("words", sluice::Tensor::from_strings(words, {static_cast<std::int64_t>(words.size())}));
      rows.push_back(std::move(s));
    }
    const sluice::Chunk chunk = t::chunk_of(rows);
    const sluice::Column& ids = chunk.at("ids");
    QVERIFY(ids.layout == sluice::Column::Layout::Ragged);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      t::expect_same({chunk.row(r)}, {rows[r]}, "row " + std::to_string(r));
      QCOMPARE(ids.row_length(r), static_cast<std::int64_t>(r));
      QCOMPARE(ids.row_rank(), std::size_t(1));
      for (std::size_t k = 0; k < r; ++k)
        QCOMPARE(reinterpret_cast<const std::int64_t*>(ids.row_data(r))[k], static_cast<std::int64_t>(10 * r + k));
      QCOMPARE(chunk.at("words").row_string(r, 0), std::string_view("aa"));
    }
    // A slice shares the values and keeps each row's span.
    const sluice::Chunk tail = chunk.slice(3, 5);
    t::expect_same({tail.row(0), tail.row(1)}, {rows[3], rows[4]}, "the slice's rows");
  }

  void check_deterministic_catches_thread_dependence() {
    t::Harness<ThreadBound> bound;
    QCOMPARE(bound.map(numbers(3)).size(), std::size_t(3));
    try {
      bound.check_deterministic(numbers(100), {1, 2});
      QFAIL("an operator whose outputs depend on its thread passed check_deterministic");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("thread_bound on 2 threads: output 1: field 'main_thread' differs") != std::string::npos, e.what());
    }
  }

  void check_resume_catches_lost_state() {
    t::Harness<Pairs<false>> pairs;
    const auto out = pairs.aggregate(numbers(5));
    QCOMPARE(out.size(), std::size_t(3));
    QCOMPARE(out[2].at("value").item<std::int64_t>(), std::int64_t(4));
    pairs.check_resume(numbers(5));
    t::Harness<Pairs<true>> forgetful;
    try {
      forgetful.check_resume(numbers(5));
      QFAIL("a restore that loses state passed check_resume");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("pairs saved after input 1 and restored") != std::string::npos, e.what());
    }
  }

  // The host resumes a source before a pass with the state it had when the cut came, maybe of a
  // later pass: begin_pass() must begin the pass it names.
  void check_resume_catches_a_source_that_misreads_a_later_state() {
    t::Harness<Shifted<Flaw::None>> shifted;
    shifted.check_resume();
    // check_resume's failure for a flawed source: the cut it names.
    auto failure_of = [](auto harness) -> std::string {
      try {
        harness.check_resume();
      } catch (const t::Failure& e) {
        return e.what();
      }
      return "check_resume passed";
    };
    const std::string counting = failure_of(t::Harness<Shifted<Flaw::CountsPasses>>());
    QVERIFY2(counting.find("shifted saved after output 0 of the next pass, restored, then begun at this pass") != std::string::npos, counting.c_str());
    const std::string forward = failure_of(t::Harness<Shifted<Flaw::ResetsOnlyForward>>());
    QVERIFY2(forward.find("shifted saved after output 1 of the next pass, restored, then begun at this pass") != std::string::npos, forward.c_str());
  }

  void refusals_are_checked_by_their_reason() {
    QVERIFY(t::refusal<Jitter>({{"scale", "11"}}).find("parameter 'scale' 11 is out of range; float, default 1, range [0, 10]") != std::string::npos);
    QVERIFY(t::refusal<Jitter>({{"scale", "0.5"}}).empty());
    QVERIFY(t::refusal<Jitter>({{"sclae", "1"}}).find("unknown parameter 'sclae'") != std::string::npos);
    t::expect_refused<Jitter>({{"scale", "x"}}, "expects a number");
    try {
      t::expect_refused<Jitter>({{"scale", "1"}}, "anything");
      QFAIL("expect_refused passed on parameters the operator takes");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("took parameters it should refuse") != std::string::npos, e.what());
    }
    try {
      t::expect_refused<Jitter>({{"scale", "x"}}, "out of range");
      QFAIL("expect_refused passed on another reason");
    } catch (const t::Failure& e) {
      QVERIFY2(std::string(e.what()).find("expected 'out of range'") != std::string::npos, e.what());
    }
  }

  void expand_damage_is_skipped_or_fails() {
    t::Harness<Bytes> bytes;
    const auto out = bytes.expand({t::sample("text", "a!b"), t::sample("text", "c")});
    QCOMPARE(out.size(), std::size_t(3));
    QCOMPARE(out[1].at("byte").item<std::int64_t>(), std::int64_t('b'));
    QCOMPARE(bytes.damage_reports(), std::vector<std::string>{"byte 1 is damaged"});
    QVERIFY_THROWS_EXCEPTION(sluice::DataError, bytes.expand({t::sample("text", "a!b")}, /*fail_on_damage=*/true));
  }

  void expect_same_names_the_difference() {
    QVERIFY(t::difference(t::sample("v", std::int64_t{1}), t::sample("v", std::int64_t{1})).empty());
    QCOMPARE(t::difference(t::sample("v", std::int64_t{1}), t::sample("v", std::int64_t{2})), std::string("field 'v' differs in its values"));
    QCOMPARE(t::difference(t::sample("v", std::int64_t{1}), t::sample("v", 1.0)), std::string("field 'v' is i64[] in one and f64[] in the other"));
    QCOMPARE(t::difference(t::sample("v", "a"), t::sample("w", "a")), std::string("field 0 is 'v' in one and 'w' in the other"));
  }

  // The one binary form of a Sample (checkpoints, the service, the cache's files): every field
  // and the whole origin come back; damage is refused by name before memory is taken.
  void the_sample_codec_keeps_fields_and_origin_and_refuses_damage() {
    sluice::Sample sample = t::sample("label", std::int64_t{7});
    std::vector<float> pixels{1.5f, -2.0f, 3.25f, 0.0f, 8.0f, 9.5f};
    sluice::Tensor image = sluice::Tensor::empty(sluice::DType::F32, {2, 3});
    std::memcpy(image.raw_data(), pixels.data(), image.nbytes());
    sample.set("image", image);
    sample.set("names", sluice::Tensor::from_strings({"a", "", "ccc"}, {3}));
    sample.set_origin(std::make_shared<const std::string>("s3://bucket/part-0.tfrecord"), 41, 9000);
    const std::string bytes = sluice::encode_sample(sample);
    QCOMPARE(bytes.size(), sluice::encoded_sample_size(sample));
    const sluice::Sample back = sluice::decode_sample(bytes, "element 3");
    QCOMPARE(t::difference(back, sample), std::string());
    QCOMPARE(*back.shared_origin().where, std::string("s3://bucket/part-0.tfrecord"));
    QCOMPARE(back.shared_origin().record, std::int64_t{41});
    QCOMPARE(back.shared_origin().byte_offset, std::int64_t{9000});

    auto refusal = [](const std::string& damaged) {
      try {
        sluice::decode_sample(damaged, "element 3");
      } catch (const sluice::DataError& e) {
        return std::string(e.what());
      }
      return std::string("decoded");
    };
    QVERIFY(refusal(bytes.substr(0, bytes.size() - 1)).rfind("element 3 is damaged: it ends 1 bytes early", 0) == 0);
    std::string huge = bytes;  // the first field's (label's) rank 0 made 1, with a dimension of 2^40
    const std::size_t rank_at = 8 + 8 + 5 + 1;
    huge[rank_at] = 1;
    const std::uint64_t dimension = std::uint64_t{1} << 40;
    huge.insert(rank_at + 8, reinterpret_cast<const char*>(&dimension), 8);
    QCOMPARE(refusal(huge), std::string("element 3 is damaged: dimension 1099511627776"));
  }
  void row_origins_give_each_row_its_own_origin() {
    // The runs a batch keeps of its rows' origins give back, row for row, what each row's Origin
    // was: rows counting up from a Parquet-like chunk (one run), rows with their own byte offsets
    // (TFRecord-like), a chunk whose rows were filtered (read positions listed), single elements.
    auto file = [](const std::string& name) { return std::make_shared<const std::string>(name); };
    sluice::Chunk counted;
    counted.set_rows(300);
    counted.set_where(file("a.parquet"));
    for (std::int64_t r = 0; r < 300; ++r) {
      counted.records().push_back(1000 + r);
      counted.byte_offsets().push_back(4);
    }
    counted.set_read_position(2, 50);
    sluice::Chunk listed;
    listed.set_rows(40);
    listed.set_where(file("b.tfrecord"));
    for (std::int64_t r = 0; r < 40; ++r) {
      listed.records().push_back(r);
      listed.byte_offsets().push_back(16 * r);
    }
    sluice::Chunk filtered;
    filtered.gather_origins(counted, {0, 2, 3, 9});
    filtered.set_rows(4);
    std::vector<sluice::Origin> expected;
    sluice::RowOrigins kept;
    auto append = [&](const sluice::Chunk& chunk, std::size_t begin, std::size_t end) {
      kept.append(chunk, begin, end);
      for (std::size_t r = begin; r < end; ++r) expected.push_back(chunk.origin(r));
    };
    auto push = [&](const sluice::Origin& o) {
      kept.push_back(o);
      expected.push_back(o);
    };
    append(counted, 0, 256);
    append(counted, 256, 300);  // continues the run
    append(listed, 0, 40);
    push(sluice::Origin{file("c.jsonl"), 7, 100, 1, 9});
    push(sluice::Origin{});
    const auto elements = file("f.tfrecord");  // elements of one file, each at its own byte: one listed run
    for (std::int64_t r = 0; r < 5; ++r) push(sluice::Origin{elements, r, 40 * r + r * r});
    push(sluice::Origin{elements, 9, 700});
    push(sluice::Origin{file("g.tfrecord"), 1, 5});  // another file's: not that run's
    // The same text under another owner (an origin carrying what only its element has, as batches'
    // rows and draw keys ride in their where's control block): rows of their own, owners kept.
    const auto text = file("h.tfrecord");
    const std::shared_ptr<const std::string> carrier(text.get(), [keep = text](const std::string*) {});
    push(sluice::Origin{text, 0, 0});
    push(sluice::Origin{carrier, 1, 0});
    push(sluice::Origin{text, 2, 50});
    push(sluice::Origin{carrier, 3, 90});
    append(filtered, 0, 4);
    append(counted, 10, 20);  // the same file again, not where the run ended
    sluice::Chunk unplaced;   // rows without read positions: only their records tell runs apart
    unplaced.set_rows(80);
    unplaced.set_where(file("e.parquet"));
    for (std::int64_t r = 0; r < 80; ++r) {
      unplaced.records().push_back(r);
      unplaced.byte_offsets().push_back(4);
    }
    append(unplaced, 0, 50);
    append(unplaced, 60, 80);
    auto same = [](const sluice::Origin& a, const sluice::Origin& b) {
      return (a.where ? *a.where : "") == (b.where ? *b.where : "") && !a.where.owner_before(b.where) && !b.where.owner_before(a.where) &&
             a.record == b.record && a.byte_offset == b.byte_offset &&
             a.read_epoch == b.read_epoch && a.read_index == b.read_index;
    };
    auto check = [&](const char* when) {
      QVERIFY2(kept.size() == expected.size(), when);
      for (std::size_t k = 0; k < expected.size(); ++k) QVERIFY2(same(kept[k], expected[k]), (std::string(when) + ", row " + std::to_string(k)).c_str());
    };
    check("appended");
    const auto first = kept.take_front(270);  // inside the first run
    for (std::size_t k = 0; k < first.size(); ++k) QVERIFY(same(first[k], expected[k]));
    expected.erase(expected.begin(), expected.begin() + 270);
    check("after 270 rows were taken");
    kept.drop_back(82);  // the last three runs and two of the filtered rows
    expected.resize(expected.size() - 82);
    check("after 82 rows were taken back");
    const std::vector<sluice::Origin> restored{sluice::Origin{file("d"), 3, -1, 4, 8}, sluice::Origin{file("d"), 4, -1, 4, 9}};
    kept.push_front(restored);
    expected.insert(expected.begin(), restored.begin(), restored.end());
    check("after two rows were restored before them");
    const auto rest = kept.take_front(1000);
    QCOMPARE(rest.size(), expected.size());
    QVERIFY(kept.empty());
    QVERIFY(kept.take_front(5).empty());
  }
};

QTEST_GUILESS_MAIN(TestSdkHarness)
#include "tst_sdk_harness.moc"
