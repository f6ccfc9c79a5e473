// Pipeline files: every kind of mistake gets a message naming the place, the stage, the parameter.
#include <QtTest>

#include <google/protobuf/util/message_differencer.h>
#include <functional>

#include "pipeline_runner.hpp"

using namespace sluice::test;

namespace {
// All problems of `text`, joined, or "" when valid.
std::string problems(const std::string& text) {
  try {
    graph_of(text);
    return "";
  } catch (const sluice::SpecError& e) {
    return e.what();
  }
}
bool has(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return true;
  qWarning("missing '%s' in:\n%s", needle.c_str(), haystack.c_str());
  return false;
}
const std::string kUtf8Stage = "stage { id: \"a\" op: \"range\" params { key: \"path\" value: \"données\" } }\n";
const std::string kValid = stage("src", "range", "", {{"count", "5"}}) + sink_after("src");
}  // namespace

class TestSpec : public QObject {
  Q_OBJECT
 private slots:
  void the_documented_example_is_valid() {
    QCOMPARE(problems(R"(options { seed: 42 deterministic: true }
stage { id: "src"  op: "range"      params { key: "count" value: "1000" } }
stage { id: "shuf" op: "shuffle"    input: "src"  params { key: "buffer_size" value: "100" } }
stage { id: "out"  op: "jsonl_sink" input: "shuf" params { key: "path" value: "out.jsonl" } }
)"),
             std::string());
  }

  // A path written in a pipeline file is relative to the file's folder; one given with --set, to
  // the current directory; absolute ones and paths held in plain strings are left as written.
  void relative_paths_are_relative_to_the_pipeline_files_folder() {
    const std::string text = stage("files", "list_files", "", {{"patterns", "data/*.tfrecord,/abs/x.tfrecord"}}) +
                             stage("label", "label_from_path", "files", {{"root", "../classes"}}) +
                             stage("out", "jsonl_sink", "label", {{"path", "out/result.jsonl"}});
    auto built = [&](const std::string& file, const std::vector<std::string>& sets = {}) {
      auto doc = sluice::parse_pipeline(text, file);
      sluice::apply_overrides(doc, sets);
      return sluice::build_graph(doc, registry());
    };
    auto param = [](const sluice::Graph& g, const std::string& id, const std::string& name) -> const sluice::ParamValue& {
      for (const auto& st : g.stages)
        if (st.id == id) return st.params.values().at(name);
      throw std::runtime_error("no stage " + id);
    };
    using Strings = std::vector<std::string>;
    const auto from_file = built("/jobs/train/p.txtpb");
    QCOMPARE(std::get<Strings>(param(from_file, "files", "patterns")), (Strings{"/jobs/train/data/*.tfrecord", "/abs/x.tfrecord"}));
    QCOMPARE(std::get<std::string>(param(from_file, "label", "root")), std::string("/jobs/classes"));
    QCOMPARE(std::get<std::string>(param(from_file, "out", "path")), std::string("/jobs/train/out/result.jsonl"));
    // A file named without a folder is in the current directory: nothing to prefix.
    const auto here = built("p.txtpb");
    QCOMPARE(std::get<std::string>(param(here, "out", "path")), std::string("out/result.jsonl"));
    const auto nearby = built("jobs/p.txtpb");
    QCOMPARE(std::get<std::string>(param(nearby, "label", "root")), std::string("classes"));
    // --set values are the command line's: relative to where the command runs.
    const auto overridden = built("/jobs/train/p.txtpb", {"out.path=mine.jsonl", "files.patterns=a/*.tfrecord"});
    QCOMPARE(std::get<std::string>(param(overridden, "out", "path")), std::string("mine.jsonl"));
    QCOMPARE(std::get<Strings>(param(overridden, "files", "patterns")), (Strings{"a/*.tfrecord"}));
    QCOMPARE(std::get<std::string>(param(overridden, "label", "root")), std::string("/jobs/classes"));
  }

  void syntax_error_names_line_and_column() {
    try {
      sluice::parse_pipeline("stage { id: \"a\" op: \"range\" }\nstage { id: \"b\" op: }\n", "bad.txtpb");
      QFAIL("no error");
    } catch (const sluice::SpecError& e) {
      QVERIFY(has(e.what(), "bad.txtpb:2:"));
      QCOMPARE(e.problems().front().line, 2);
    }
  }

  // Syntax errors in the file's words, at the line to fix: a stage left open is named where it
  // opens (protobuf names the next stage's line, "has no field named \"stage\""), a misspelt
  // setting gets its nearest name, a number that must be text says how to write it, a wrong
  // value of a list of choices lists them.
  void syntax_errors_say_what_to_fix_and_where() {
    struct Case {
      std::string text;
      int line;
      std::string says;
    };
    const std::vector<Case> cases{
        {"stage { id: \"src\" op: \"list_files\" params { key: \"pattern\" value: \"data/{train\" } }  # a brace { in a comment\n"
         "stage { id: \"out\" op: \"null_sink\" input: \"src\"\n\nstage { id: \"x\" op: \"identity\" }\n", 2,
         "syntax error: the `stage {` opened on line 2 is not closed: a `}` is missing before `stage` on line 4"},
        {"options { seed: 1\nstage { id: \"src\" op: \"range\" }\n", 1,
         "syntax error: the `options {` opened on line 1 is not closed: a `}` is missing before `stage` on line 2"},
        {"stage { id: \"src\" op: \"range\" parms { key: \"count\" value: \"10\" } }\n", 1,
         "syntax error: a `stage { }` block has no setting 'parms' (did you mean 'params'?); it has id, op, input, params"},
        {"stage { id: \"src\" op: \"range\" count: 10 }\n", 1,
         "(an operator's parameters go in `params { key: \"count\" value: \"...\" }`)"},
        {"stage { id: \"src\" op: \"range\" params { key: \"count\" value: 10 } }\n", 1,
         "syntax error: a quoted text was expected, found 10: write it in double quotes, \"10\""},
        {"stage { id: \"src\" op: \"range\" parallelism: \"4\" }\n", 1, "syntax error: a number was expected, found \"4\": write it without quotes"},
        {"options { error_policy: skipp }\n", 1, "syntax error: 'skipp' is not a value of 'error_policy' (did you mean 'skip'?); it takes fail, skip"},
        {"stages { id: \"src\" }\n", 1, "syntax error: the top level of a pipeline file has no setting 'stages' (did you mean 'stage'?)"},
    };
    for (const auto& c : cases) {
      try {
        sluice::parse_pipeline(c.text, "words.txtpb");
        QFAIL(("no error: " + c.text).c_str());
      } catch (const sluice::SpecError& e) {
        QVERIFY2(has(e.what(), "words.txtpb:" + std::to_string(c.line) + ":") && has(e.what(), c.says), e.what());
        const std::string said = e.what();
        QVERIFY2(said.find("sluice.spec") == std::string::npos && said.find("Message type") == std::string::npos, e.what());
        QCOMPARE(e.problems().front().line, c.line);
      }
    }
  }

  // A file cut short (a copy interrupted, an editor's half-saved buffer) says so, rather than
  // "Expected identifier, got: " with nothing after it.
  void a_file_cut_short_says_so() {
    for (const char* text : {"stage { id: \"a\" op: \"range\" }\nstage { id: \"b\" op: \"null_sink\" input: \"a\" ",
                             "stage { id: \"a\" op: \"range\" }\nstage { id: \"b\" op: "}) {
      try {
        sluice::parse_pipeline(text, "cut.txtpb");
        QFAIL("no error");
      } catch (const sluice::SpecError& e) {
        QVERIFY2(has(e.what(), "cut.txtpb:2:") && has(e.what(), "syntax error: the file ends here: is it cut short"), e.what());
        QVERIFY2(!has(e.what(), "got: \n") && std::string(e.what()).back() != ' ', e.what());
      }
    }
  }

  void json_is_accepted_and_bad_json_is_reported() {
    auto doc = sluice::parse_pipeline(R"({"stage":[{"id":"src","op":"range","params":{"count":"3"}},
      {"id":"out","op":"null_sink","input":["src"]}]})", "p.json");
    QCOMPARE(doc.spec.stage_size(), 2);
    QVERIFY(sluice::validate_pipeline(doc, registry()).empty());
    QVERIFY_THROWS_EXCEPTION(sluice::SpecError, sluice::parse_pipeline("{\"stage\": [", "p.json"));
  }

  void unknown_operator_suggests_closest() {
    auto p = problems(stage("src", "rnage", "") + sink_after("src"));
    QVERIFY(has(p, "stage 'src': unknown operator 'rnage' (did you mean 'range'?)"));
    QVERIFY(has(p, "test.txtpb:1:1"));
    // An operator no loaded plugin has may be in a library elsewhere: say how to load it.
    auto elsewhere = problems(stage("src", "read_parquet_shards", "") + sink_after("src"));
    QVERIFY(has(elsewhere, "unknown operator 'read_parquet_shards'"));
    QVERIFY(has(elsewhere, "--plugin-dir DIR"));
    QVERIFY(has(elsewhere, "SLUICE_PLUGIN_PATH"));
    QVERIFY(has(elsewhere, "load_plugins"));
  }

  void parameter_errors() {
    QVERIFY(has(problems(stage("src", "range", "", {{"cuont", "5"}}) + sink_after("src")),
                "stage 'src': parameter 'cuont': 'range' has no such parameter (did you mean 'count'?)"));
    QVERIFY(has(problems(stage("src", "range", "", {{"count", "five"}}) + sink_after("src")),
                "parameter 'count': expects an integer, got 'five'"));
    QVERIFY(has(problems(stage("src", "range", "", {{"count", "-4"}}) + sink_after("src")),
                "parameter 'count': -4 is out of range"));
    // The upper bound holds too, for integers, floats and each item of a list.
    QVERIFY(has(problems(stage("src", "range", "") + stage("s", "shuffle", "src", {{"buffer_size", "1000000001"}}) + sink_after("s")),
                "parameter 'buffer_size': 1000000001 is out of range; int, required, range [1, 1000000000]"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("f", "filter_random", "src", {{"p", "1.5"}}) + sink_after("f")),
                "parameter 'p': 1.5 is out of range; float, default 0.5, range [0, 1]"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("s", "shuffle", "src") + sink_after("s")),
                "stage 's': parameter 'buffer_size': is required"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("b", "batch", "src", {{"batch_size", "2"}, {"drop_remainder", "maybe"}}) +
                         sink_after("b")),
                "parameter 'drop_remainder': expects true or false, got 'maybe'"));
    QVERIFY(has(problems(stage("src", "from_list", "", {{"values", "1"}, {"dtype", "int46"}}) + sink_after("src")),
                "'int46' is not one of auto, int64, float, bytes (did you mean 'int64'?)"));
  }

  void wiring_errors() {
    QVERIFY(has(problems(stage("src", "range", "") + sink_after("scr")), "stage 'out': input 'scr' names no stage (did you mean 'src'?)"));
    QVERIFY(has(problems(stage("a", "range", "", {}, "input: \"b\"") + stage("b", "identity", "a") + sink_after("b")),
                "'range' is a source and takes no input"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("x", "identity", "") + sink_after("src")), "needs an input"));
    // A stage read by two stages (a tee) is fine; each branch must still end in a sink.
    QVERIFY(has(problems(stage("src", "range", "") + stage("a", "identity", "src") + stage("b", "identity", "src") + sink_after("a")),
                "stage 'b': no path to a sink"));
    QVERIFY(problems(stage("src", "range", "") + stage("a", "identity", "src") + stage("b", "null_sink", "src") + sink_after("a")).empty());
    QVERIFY(has(problems(stage("src", "range", "") + stage("a", "identity", "src")), "stage 'a': no path to a sink"));
    // One break is one problem, told where the data stops, naming what flows only there.
    const auto broken = problems(stage("src", "range", "") + stage("a", "identity", "src") + stage("b", "identity", "a"));
    QCOMPARE(QString::fromStdString(broken).count("no path to a sink"), 1);
    QVERIFY(has(broken, "stage 'b': no path to a sink: no stage reads its output; add a sink (null_sink, jsonl_sink, ...) with "
                        "`input: \"b\"` (what 'src' and 'a' give ends here too)"));
    // An unknown operator in the chain is told as such; what flows into it is not blamed.
    const auto unknown = problems(stage("src", "range", "") + stage("mystery", "not_an_op", "src") + stage("tail", "identity", "mystery"));
    QVERIFY(has(unknown, "not_an_op"));
    QVERIFY2(unknown.find("stage 'src': no path") == std::string::npos, unknown.c_str());
    // A stage read by a dead end and by a sink reaches a sink: only the dead end is a problem.
    const auto tee = problems(stage("src", "range", "") + stage("dead", "identity", "src") + sink_after("src"));
    QCOMPARE(QString::fromStdString(tee).count("no path to a sink"), 1);
    QVERIFY(has(tee, "stage 'dead': no path to a sink: no stage reads its output"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("src", "null_sink", "src")), "another stage already has this id"));
    QVERIFY(has(problems(""), "the pipeline has no stages"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("o1", "null_sink", "src") + stage("o2", "null_sink", "o1")),
                "its input 'o1' is a sink"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("b", "shuffle", "src", {{"buffer_size", "2"}}, "parallelism: 3") + sink_after("b")),
                "stage 'b': 'shuffle' keeps state between elements and runs on one worker, and it assembles its outputs there too; "
                "set parallelism to 1"));
    // An aggregate that assembles its outputs off its thread takes a parallelism: its assembly threads.
    QCOMPARE(problems(stage("src", "range", "") + stage("b", "padded_batch", "src", {{"batch_size", "2"}}, "parallelism: 3") + sink_after("b")),
             std::string());
    QVERIFY(has(problems(stage("src", "range", "") + stage("b", "batch", "src", {{"batch_size", "2"}}, "interleave { cycle_length: 2 }") +
                         sink_after("b")),
                "interleave applies to expand operators only"));
  }

  // AUTOTUNE: -1 where the engine may choose; anything else negative, a stateful stage, a sink's
  // buffer and unreadable budgets are refused with what to write instead.
  void autotune_fields_are_checked() {
    QCOMPARE(problems("options { autotune { cpu_budget: 2 ram_budget: \"1GiB\" } }\n" + stage("src", "range", "") +
                      stage("m", "identity", "src", {}, "parallelism: -1 buffer_size: -1") + sink_after("m")),
             std::string());
    QVERIFY(has(problems(stage("src", "range", "") + stage("m", "identity", "src", {}, "parallelism: -2") + sink_after("m")),
                "stage 'm': parallelism -2 is negative; use 1 or more, or -1 to let the engine choose (autotune)"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("m", "identity", "src", {}, "buffer_size: -5") + sink_after("m")),
                "buffer_size -5 is negative; use 0 (sized by the engine), -1 (tuned while it runs) or more"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("b", "batch", "src", {{"batch_size", "2"}}, "parallelism: -1") + sink_after("b")),
                "'batch' is an aggregate: the engine does not tune the threads that assemble its outputs; give their number"));
    QVERIFY(has(problems(stage("src", "range", "") + stage("out", "null_sink", "src", {}, "buffer_size: -1")),
                "'null_sink' is a sink and has no output buffer; remove `buffer_size: -1`"));
    QVERIFY(has(problems("options { autotune { ram_budget: \"lots\" } }\n" + kValid),
                "options.autotune.ram_budget 'lots' is not a size; write it as \"4GiB\""));
    QVERIFY(has(problems("options { autotune { cpu_budget: -1 } }\n" + kValid), "options.autotune.cpu_budget -1 is not a number of cores"));
    // --set takes the stage's own fields by name, as numbers or `autotune`.
    auto doc = sluice::parse_pipeline(stage("src", "range", "") + stage("m", "identity", "src") + sink_after("m"), "p.txtpb");
    sluice::apply_overrides(doc, {"m.parallelism=autotune", "m.output_buffer=32"});
    QCOMPARE(doc.spec.stage(1).parallelism(), -1);
    QCOMPARE(doc.spec.stage(1).buffer_size(), 32);
    QVERIFY(doc.spec.stage(1).params().empty());
    try {
      sluice::apply_overrides(doc, {"m.parallelism=many"});
      QFAIL("accepted parallelism=many");
    } catch (const sluice::SpecError& e) {
      QVERIFY(has(e.what(), "'m.parallelism=many': parallelism is a count of 0 or more, or 'autotune'"));
    }
  }

  void cycle_is_reported() {
    auto p = problems(stage("src", "range", "") + stage("a", "identity", "b") + stage("b", "identity", "a") + sink_after("src"));
    QVERIFY(has(p, "stages 'a' -> 'b' -> 'a' form a cycle"));
    // A stage fed by the cycle is not part of it and is not named in the message.
    auto q = problems(stage("src", "range", "") + stage("a", "identity", "c") + stage("b", "identity", "a") +
                      stage("c", "identity", "b") + stage("x", "null_sink", "a") + sink_after("src"));
    QVERIFY(has(q, "stages 'a' -> 'b' -> 'c' -> 'a' form a cycle"));
    const auto cycle_line = q.substr(q.find("form a cycle") - 40, 60);
    QVERIFY2(cycle_line.find("'x'") == std::string::npos, q.c_str());
  }

  void overrides_are_parsed_like_params() {
    auto doc = sluice::parse_pipeline(kValid, "p.txtpb");
    sluice::apply_overrides(doc, {"src.count=12"});
    auto graph = sluice::build_graph(doc, registry());
    QCOMPARE(graph.stages[0].params.get_int("count"), std::int64_t(12));
    auto bad = sluice::parse_pipeline(kValid, "p.txtpb");
    sluice::apply_overrides(bad, {"src.count=twelve"});
    try {
      sluice::build_graph(bad, registry());
      QFAIL("no error");
    } catch (const sluice::SpecError& e) {
      QVERIFY(has(e.what(), "parameter 'count': expects an integer, got 'twelve'"));
    }
    try {
      sluice::apply_overrides(bad, {"sr.count=1"});
      QFAIL("no error");
    } catch (const sluice::SpecError& e) {
      QVERIFY(has(e.what(), "names no stage 'sr' (did you mean 'src'?)"));
    }
    QVERIFY_THROWS_EXCEPTION(sluice::SpecError, sluice::apply_overrides(bad, {"no-equals-sign"}));
  }

  void text_round_trip_changes_nothing() {
    auto doc = sluice::parse_pipeline("options { seed: 3 }\n" + kValid + "", "p.txtpb");
    std::string once = sluice::pipeline_to_text(doc.spec);
    auto again = sluice::parse_pipeline(once, "p2.txtpb");
    QCOMPARE(sluice::pipeline_to_text(again.spec), once);
    QVERIFY(again.spec.SerializeAsString() == doc.spec.SerializeAsString());
  }

  // What the studio's save does to a file people wrote by hand and keep in git.
  void saving_keeps_the_file_as_written_and_changes_only_what_changed() {
    const QDir folder(QString(SLUICE_SOURCE_DIR) + "/resources/pipelines");
    const auto files = folder.entryList({"*.txtpb"}, QDir::Files);
    QVERIFY(files.size() >= 5);
    for (const auto& name : files) {
      const std::string original = read_file(folder.filePath(name).toStdString());
      const auto doc = sluice::parse_pipeline(original, name.toStdString());
      QCOMPARE(sluice::update_pipeline_text(original, doc.spec), original);
      for (int i = 0; i < doc.spec.stage_size(); ++i) {
        const auto& stage = doc.spec.stage(i);
        const int line = doc.stage_locations[static_cast<size_t>(i)].first;
        // A parameter's new value, a new parameter, a worker count, a buffer, a layout: each
        // changes that stage's line alone.
        std::vector<std::function<void(sluice::spec::Stage&)>> edits = {
            [](sluice::spec::Stage& s) { (*s.mutable_params())["zz_new"] = "1"; },
            [](sluice::spec::Stage& s) { s.set_parallelism(s.parallelism() + 3); },
            [](sluice::spec::Stage& s) { s.set_buffer_size(s.buffer_size() + 7); },
            [](sluice::spec::Stage& s) { s.mutable_layout()->set_x(s.layout().x() + 12.5); },
            [](sluice::spec::Stage& s) { s.set_error_policy(s.error_policy() == sluice::spec::skip ? sluice::spec::fail : sluice::spec::skip); },
            [](sluice::spec::Stage& s) { s.mutable_interleave()->set_cycle_length(s.interleave().cycle_length() + 3); },
            [](sluice::spec::Stage& s) { s.set_per_input(!s.per_input()); },
        };
        if (!stage.params().empty())
          edits.push_back([](sluice::spec::Stage& s) { s.mutable_params()->begin()->second += "0"; });
        if (stage.params_size() > 1)
          edits.push_back([](sluice::spec::Stage& s) { s.mutable_params()->erase(s.mutable_params()->begin()); });
        if (stage.input_size() == 1) edits.push_back([](sluice::spec::Stage& s) { s.set_input(0, "elsewhere"); });
        for (size_t e = 0; e < edits.size(); ++e) {
          auto edited = doc.spec;
          edits[e](*edited.mutable_stage(i));
          const std::string saved = sluice::update_pipeline_text(original, edited);
          const QStringList a = QString::fromStdString(original).split('\n'), b = QString::fromStdString(saved).split('\n');
          const QString where = QString("%1, stage '%2', edit %3").arg(name, QString::fromStdString(stage.id())).arg(e);
          QVERIFY2(a.size() == b.size(), qPrintable(where + ":\n" + QString::fromStdString(saved)));
          for (int l = 0; l < a.size(); ++l)
            if (l + 1 != line) QVERIFY2(a[l] == b[l], qPrintable(where + ": line " + QString::number(l + 1) + " changed to " + b[l]));
          QVERIFY2(a[line - 1] != b[line - 1], qPrintable(where));
          auto back = sluice::parse_pipeline(saved, "saved.txtpb");
          QVERIFY2(google::protobuf::util::MessageDifferencer::Equals(back.spec, edited), qPrintable(where));
        }
      }
    }
  }

  void saving_adds_removes_and_renames_stages_around_the_comments() {
    const std::string original =
        "# Made by hand.\n"
        "options { seed: 3 }  # the seed\n"
        "\n"
        "stage { id: \"src\"   op: \"range\" params { key: \"count\" value: \"10\" } }\n"
        "# the middle\n"
        "stage { id: \"take\"  op: \"take\"  input: \"src\" params { key: \"count\" value: \"5\" } }\n"
        "stage {\n"
        "\tid: \"out\"\n"
        "\top: \"null_sink\" ; input: \"take\"\n"
        "}\n";
    const auto doc = sluice::parse_pipeline(original, "p.txtpb");
    auto expect = [&](const sluice::spec::PipelineSpec& edited, const std::string& wanted) {
      const std::string saved = sluice::update_pipeline_text(original, edited);
      QCOMPARE(QString::fromStdString(saved), QString::fromStdString(wanted));
      QVERIFY(google::protobuf::util::MessageDifferencer::Equals(sluice::parse_pipeline(saved, "s").spec, edited));
    };
    auto removed = doc.spec;
    removed.mutable_stage()->DeleteSubrange(1, 1);
    removed.mutable_stage(1)->set_input(0, "src");
    std::string wanted = original;
    wanted.replace(wanted.find("stage { id: \"take\""), wanted.find("stage {\n") - wanted.find("stage { id: \"take\""), "");
    wanted.replace(wanted.find("\"take\"\n}"), 6, "\"src\"");
    expect(removed, wanted);

    auto added = doc.spec;
    auto* extra = added.add_stage();
    extra->set_id("more");
    extra->set_op("take");
    extra->add_input("out");
    expect(added, original.substr(0, original.size() - 2) + "}\n" + "stage {\n  id: \"more\"\n  op: \"take\"\n  input: \"out\"\n}\n");

    auto renamed = doc.spec;
    renamed.mutable_stage(0)->set_id("numbers");
    renamed.mutable_stage(1)->set_input(0, "numbers");
    wanted = original;
    wanted.replace(wanted.find("\"src\" "), 5, "\"numbers\"");
    wanted.replace(wanted.find("\"src\""), 5, "\"numbers\"");
    expect(renamed, wanted);

    auto options = doc.spec;
    options.mutable_options()->set_seed(4);
    options.mutable_options()->set_error_policy(sluice::spec::skip);
    wanted = original;
    wanted.replace(wanted.find("seed: 3"), 7, "seed: 4 error_policy: skip");
    expect(options, wanted);
  }

  // Files written elsewhere: Windows line ends, angle brackets, commas and lists, tabs, UTF-8.
  void saving_keeps_unusual_but_valid_text_as_written() {
    struct Case {
      std::string original, wanted;
    };
    const std::vector<Case> cases = {
        {"# c\r\nstage { id: \"a\" op: \"range\" }\r\nstage { id: \"b\" op: \"take\" input: \"a\" }\r\n",
         "# c\r\nstage { id: \"a\" op: \"range\" parallelism: 4 }\r\nstage { id: \"b\" op: \"take\" input: \"a\" }\r\n"
         "stage { id: \"z\" op: \"null_sink\" input: \"b\" }\r\n"},
        {"stage < id: \"a\" op: \"range\" >\nstage: { id: \"b\", op: \"take\", input: [\"a\"] }  # listed\n",
         "stage < id: \"a\" op: \"range\" parallelism: 4 >\nstage: { id: \"b\", op: \"take\", input: [\"a\"] }  # listed\n"
         "stage { id: \"z\" op: \"null_sink\" input: \"b\" }\n"},
        {"stage {\n\tid: \"a\"  # the source\n\top: \"range\"\n\tparams { key: \"path\" value: \"données\" }\n}\n# end\n",
         "stage {\n\tid: \"a\"  # the source\n\top: \"range\"\n\tparams { key: \"path\" value: \"données\" }\n\tparallelism: 4\n}\n"
         "stage {\n  id: \"z\"\n  op: \"null_sink\"\n  input: \"a\"\n}\n# end\n"},
    };
    for (const auto& c : cases) {
      auto edited = sluice::parse_pipeline(c.original, "p.txtpb").spec;
      edited.mutable_stage(0)->set_parallelism(4);
      auto* sink = edited.add_stage();
      sink->set_id("z");
      sink->set_op("null_sink");
      sink->add_input(edited.stage(edited.stage_size() - 2).id());
      QCOMPARE(QString::fromStdString(sluice::update_pipeline_text(c.original, edited)), QString::fromStdString(c.wanted));
    }
    // A new file keeps UTF-8 readable rather than escaped.
    auto spec = sluice::parse_pipeline(kUtf8Stage, "p.txtpb").spec;
    QVERIFY(sluice::pipeline_to_text(spec).find("données") != std::string::npos);
  }

  void a_json_pipeline_is_saved_as_json() {
    const auto doc = sluice::parse_pipeline(R"({"stage": [{"id": "src", "op": "range"}]})", "p.json");
    auto edited = doc.spec;
    edited.mutable_stage(0)->set_parallelism(2);
    const std::string saved = sluice::update_pipeline_text(R"({"stage": [{"id": "src", "op": "range"}]})", edited);
    QVERIFY2(saved.rfind('{', 0) == 0, saved.c_str());
    QVERIFY(google::protobuf::util::MessageDifferencer::Equals(sluice::parse_pipeline(saved, "s.json").spec, edited));
  }

  void a_new_file_has_a_line_per_stage() {
    const auto doc = sluice::parse_pipeline("options { seed: 3 }\n" + kValid, "p.txtpb");
    const std::string text = sluice::pipeline_to_text(doc.spec);
    QCOMPARE(QString::fromStdString(text).count('\n'), doc.spec.stage_size() + 1);
  }

  void pipeline_file_written_atomically_reads_back() {
    QTemporaryDir dir;
    auto path = dir.path().toStdString() + "/p.txtpb";
    auto doc = sluice::parse_pipeline(kValid, "p.txtpb");
    sluice::write_pipeline_file(doc.spec, path);
    auto back = sluice::read_pipeline_file(path);
    QVERIFY(back.spec.SerializeAsString() == doc.spec.SerializeAsString());
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files).size(), 1);  // no temporary left behind
    QVERIFY_THROWS_EXCEPTION(sluice::SpecError, sluice::read_pipeline_file(dir.path().toStdString() + "/missing.txtpb"));
  }
};

QTEST_APPLESS_MAIN(TestSpec)
#include "tst_spec.moc"
