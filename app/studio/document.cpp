#include "document.hpp"

#include "layered_layout.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <google/protobuf/util/message_differencer.h>

#include <QFile>
#include <QFileInfo>
#include <QMap>
#include <QSet>
#include <QtGlobal>
#include <map>

namespace sluice::studio {

using google::protobuf::util::MessageDifferencer;

// Undo keeps whole specs: pipelines are a few dozen stages, and a snapshot cannot drift from the
// edit it undoes the way hand-written inverse operations can.
class SpecEdit final : public QUndoCommand {
 public:
  SpecEdit(Document& doc, const QString& text, spec::PipelineSpec before, spec::PipelineSpec after, QString merge_tag)
      : QUndoCommand(text), doc_(doc), before_(std::move(before)), after_(std::move(after)), merge_tag_(std::move(merge_tag)) {}
  void undo() override { doc_.replace_spec(before_); }
  void redo() override { doc_.replace_spec(after_); }
  int id() const override { return merge_tag_.isEmpty() ? -1 : 1; }
  bool changes_graph() const { return !same_pipeline_ignoring_layout(before_, after_); }
  bool mergeWith(const QUndoCommand* other) override {
    auto* next = static_cast<const SpecEdit*>(other);
    if (next->merge_tag_ != merge_tag_) return false;
    after_ = next->after_;
    return true;
  }

 private:
  Document& doc_;
  spec::PipelineSpec before_, after_;
  QString merge_tag_;
};

namespace {
spec::Stage* find_stage(spec::PipelineSpec& s, const QString& id) {
  const std::string key = id.toStdString();
  for (auto& st : *s.mutable_stage())
    if (st.id() == key) return &st;
  return nullptr;
}
constexpr double kColumnStep = 270, kRowStep = 130;
}  // namespace

Document::Document(const Registry& registry, QObject* parent) : QObject(parent), registry_(registry) { revalidate(); }

namespace {
// An undo step is one SpecEdit, or a macro of several (Delete of a selection).
bool step_changes_graph(const QUndoCommand* step) {
  if (!step) return false;
  if (auto* edit = dynamic_cast<const SpecEdit*>(step)) return edit->changes_graph();
  for (int i = 0; i < step->childCount(); ++i)
    if (step_changes_graph(step->child(i))) return true;
  return false;
}
}  // namespace

void Document::undo() {
  if (!undo_.canUndo()) return;
  if (!graph_lock_.isEmpty() && step_changes_graph(undo_.command(undo_.index() - 1))) return emit edit_refused(graph_lock_);
  undo_.undo();
}

void Document::redo() {
  if (!undo_.canRedo()) return;
  if (!graph_lock_.isEmpty() && step_changes_graph(undo_.command(undo_.index()))) return emit edit_refused(graph_lock_);
  undo_.redo();
}

void Document::reset(const spec::PipelineSpec& spec, const QString& file, bool read_only) {
  undo_.clear();
  file_text_.clear();
  laid_out_on_open_.clear();
  read_only_ = read_only;
  file_ = file;
  replace_spec(spec);
  emit file_changed(file_);
}

void Document::open(const QString& file) {
  // Read once: the text kept for saving is the text this document was parsed from.
  QFile in(file);
  if (!in.open(QIODevice::ReadOnly)) read_pipeline_file(file.toStdString());  // throws the reader's message
  const QByteArray bytes = in.readAll();
  std::string text(bytes.constData(), static_cast<size_t>(bytes.size()));
  PipelineDocument doc = parse_pipeline(text, file.toStdString());
  std::map<std::string, bool> had_layout;
  for (const auto& st : doc.spec.stage()) had_layout[st.id()] = st.has_layout();
  std::map<std::string, spec::Layout> chosen;
  if (lay_out_unless_placed(doc.spec))
    for (const auto& st : doc.spec.stage())
      if (!had_layout[st.id()]) chosen[st.id()] = st.layout();
  reset(doc.spec, QFileInfo(file).absoluteFilePath());
  file_text_ = std::move(text);
  laid_out_on_open_ = std::move(chosen);
}

void Document::save(const QString& file) {
  // Positions go into the file only for the stages the user placed: one laid out when the file was
  // opened and not moved since keeps its line as it was.
  spec::PipelineSpec to_write = spec_;
  for (auto& st : *to_write.mutable_stage()) {
    auto it = laid_out_on_open_.find(st.id());
    if (it != laid_out_on_open_.end() && MessageDifferencer::Equals(it->second, st.layout())) st.clear_layout();
  }
  file_text_ = write_pipeline_file(to_write, file.toStdString(), file_text_);
  for (auto it = laid_out_on_open_.begin(); it != laid_out_on_open_.end();) {
    const auto* st = find_stage(spec_, QString::fromStdString(it->first));
    it = st && MessageDifferencer::Equals(it->second, st->layout()) ? std::next(it) : laid_out_on_open_.erase(it);
  }
  file_ = QFileInfo(file).absoluteFilePath();
  undo_.setClean();
  emit file_changed(file_);
}

void Document::edit(const QString& description, const std::function<void(spec::PipelineSpec&)>& change, const QString& merge_tag) {
  if (read_only_) return;
  spec::PipelineSpec after = spec_;
  change(after);
  if (google::protobuf::util::MessageDifferencer::Equals(after, spec_)) return;
  if (!graph_lock_.isEmpty() && !same_pipeline_ignoring_layout(after, spec_)) {
    emit edit_refused(graph_lock_);
    return;
  }
  undo_.push(new SpecEdit(*this, description, spec_, std::move(after), merge_tag));
}

bool Document::refuse_if_graph_locked() {
  if (graph_lock_.isEmpty()) return false;
  emit edit_refused(graph_lock_);
  return true;
}

void Document::replace_spec(const spec::PipelineSpec& spec) {
  spec_ = spec;
  revalidate();
  emit changed();
}

void Document::revalidate() {
  // An attached run was validated where it runs, against its own plugins and files; checking it
  // here would report problems it does not have (paths of another machine, plugins not loaded).
  if (read_only_) return problems_.clear();
  PipelineDocument doc;
  doc.spec = spec_;
  // The whole path: relative paths in the pipeline are checked as the run will read them.
  doc.file = file_.isEmpty() ? "untitled" : file_.toStdString();
  problems_ = validate_pipeline(doc, registry_);
}

int Document::index_of(const QString& id) const {
  const std::string key = id.toStdString();
  for (int i = 0; i < spec_.stage_size(); ++i)
    if (spec_.stage(i).id() == key) return i;
  return -1;
}

std::shared_ptr<const RegisteredOperator> Document::operator_of(const QString& id) const {
  int i = index_of(id);
  return i < 0 ? nullptr : registry_.find(spec_.stage(i).op());
}

QString Document::unused_id(const QString& base) const {
  if (index_of(base) < 0) return base;
  for (int n = 2;; ++n) {
    QString candidate = QString("%1_%2").arg(base).arg(n);
    if (index_of(candidate) < 0) return candidate;
  }
}

QString Document::add_stage(const QString& op, QPointF position) {
  QString id = unused_id(op);
  edit(QString("Add %1").arg(id), [&](spec::PipelineSpec& s) {
    auto* st = s.add_stage();
    st->set_id(id.toStdString());
    st->set_op(op.toStdString());
    st->mutable_layout()->set_x(std::round(position.x()));
    st->mutable_layout()->set_y(std::round(position.y()));
  });
  return id;
}

void Document::remove_stages(const QStringList& ids) {
  if (ids.isEmpty()) return;
  edit(ids.size() == 1 ? QString("Delete %1").arg(ids.front()) : QString("Delete %1 stages").arg(ids.size()), [&](spec::PipelineSpec& s) {
    spec::PipelineSpec kept;
    *kept.mutable_options() = s.options();
    for (const auto& st : s.stage())
      if (!ids.contains(QString::fromStdString(st.id()))) *kept.add_stage() = st;
    // A consumer of a deleted stage keeps its place and loses its input (a problem to fix).
    for (auto& st : *kept.mutable_stage()) {
      auto* inputs = st.mutable_input();
      for (int i = inputs->size() - 1; i >= 0; --i)
        if (ids.contains(QString::fromStdString(inputs->Get(i)))) inputs->DeleteSubrange(i, 1);
    }
    s = std::move(kept);
  });
}

spec::PipelineSpec Document::extract_stages(const QStringList& ids) const {
  spec::PipelineSpec out;
  for (const auto& st : spec_.stage()) {
    if (!ids.contains(QString::fromStdString(st.id()))) continue;
    auto* copy = out.add_stage();
    *copy = st;
    copy->clear_input();
    for (const auto& in : st.input())
      if (ids.contains(QString::fromStdString(in))) copy->add_input(in);
  }
  return out;
}

QStringList Document::paste_stages(const spec::PipelineSpec& stages, QPointF offset) {
  if (stages.stage_size() == 0) return {};
  // New ids first, each unused in the document and among those already chosen.
  QMap<QString, QString> renamed;
  QSet<QString> taken;
  for (const auto& st : stages.stage()) {
    const QString base = QString::fromStdString(st.id());
    QString id = base;
    for (int n = 2; index_of(id) >= 0 || taken.contains(id); ++n) id = QString("%1_%2").arg(base).arg(n);
    taken.insert(id);
    renamed.insert(base, id);
  }
  QStringList added;
  edit(stages.stage_size() == 1 ? QString("Paste %1").arg(renamed.first()) : QString("Paste %1 stages").arg(stages.stage_size()),
       [&](spec::PipelineSpec& s) {
         for (const auto& st : stages.stage()) {
           auto* copy = s.add_stage();
           *copy = st;
           copy->set_id(renamed.value(QString::fromStdString(st.id())).toStdString());
           copy->clear_input();
           for (const auto& in : st.input())
             if (renamed.contains(QString::fromStdString(in))) copy->add_input(renamed.value(QString::fromStdString(in)).toStdString());
           copy->mutable_layout()->set_x(std::round(st.layout().x() + offset.x()));
           copy->mutable_layout()->set_y(std::round(st.layout().y() + offset.y()));
           added << QString::fromStdString(copy->id());
         }
       });
  return added;
}

std::optional<QString> Document::output_refusal(const QString& from) const {
  auto op = operator_of(from);
  if (op && op->info.kind == OperatorKind::Sink) return QString("'%1' is a sink (%2): it has no output").arg(from, QString::fromStdString(op->info.name));
  return std::nullopt;
}

int Document::connection_slot(const QString& to, int input) const {
  const int t = index_of(to);
  if (t < 0) return 0;
  auto op = operator_of(to);
  if (!op || op->info.kind != OperatorKind::Combine) return 0;
  const int inputs = spec_.stage(t).input_size();
  return input >= 0 && input < inputs ? input : inputs;
}

std::optional<QString> Document::connection_refusal(const QString& from, const QString& to, int input) const {
  const int f = index_of(from), t = index_of(to);
  if (f < 0 || t < 0) return QString("no such stage");
  if (f == t) return QString("a stage cannot feed itself");
  if (auto refusal = output_refusal(from)) return refusal;
  auto to_op = operator_of(to);
  if (to_op && to_op->info.kind == OperatorKind::Source)
    return QString("'%1' is a source (%2): it takes no input").arg(to, QString::fromStdString(to_op->info.name));
  // Walking up from `from` through every input: reaching `to` means `to` already feeds `from`.
  std::vector<bool> seen(spec_.stage_size());
  std::vector<int> pending{f};
  while (!pending.empty()) {
    const int at = pending.back();
    pending.pop_back();
    if (at < 0 || seen[at]) continue;
    seen[at] = true;
    if (at == t) return QString("'%1' already feeds '%2': the connection would make a cycle").arg(to, from);
    for (const auto& in : spec_.stage(at).input()) pending.push_back(index_of(QString::fromStdString(in)));
  }
  const auto& target = spec_.stage(t);
  const int slot = connection_slot(to, input);
  const bool combine = to_op && to_op->info.kind == OperatorKind::Combine;
  for (int k = 0; k < target.input_size(); ++k)
    if (combine && k != slot && target.input(k) == from.toStdString())
      return QString("'%1' already reads '%2' (its input %3): a stage reads an output once").arg(to, from).arg(k + 1);
  if (combine && to_op->info.max_inputs != kAnyNumberOfInputs && slot >= to_op->info.max_inputs)
    return QString("'%1' (%2) takes at most %3 inputs: drop on one of its input ports to replace that input")
        .arg(to, QString::fromStdString(to_op->info.name))
        .arg(to_op->info.max_inputs);
  return std::nullopt;
}

void Document::connect_stages(const QString& from, const QString& to, int input) {
  if (connection_refusal(from, to, input)) return;
  const int slot = connection_slot(to, input);
  auto op = operator_of(to);
  const bool combine = op && op->info.kind == OperatorKind::Combine;
  edit(combine ? QString("Connect %1 to input %2 of %3").arg(from).arg(slot + 1).arg(to) : QString("Connect %1 to %2").arg(from, to),
       [&](spec::PipelineSpec& s) {
         auto* st = find_stage(s, to);
         if (!combine) {
           st->clear_input();
           st->add_input(from.toStdString());
         } else if (slot < st->input_size()) {
           st->set_input(slot, from.toStdString());
         } else {
           st->add_input(from.toStdString());
         }
       });
}

void Document::move_stage(const QString& id, QPointF position) {
  edit(QString("Move %1").arg(id), [&](spec::PipelineSpec& s) {
    if (auto* st = find_stage(s, id)) {
      // Whole pixels: a dragged node's position is a fraction of the view's scale.
      st->mutable_layout()->set_x(std::round(position.x()));
      st->mutable_layout()->set_y(std::round(position.y()));
    }
  }, "move " + id);
}

void Document::set_param(const QString& id, const QString& name, const std::optional<QString>& value) {
  edit(QString("Set %1.%2").arg(id, name), [&](spec::PipelineSpec& s) {
    auto* st = find_stage(s, id);
    if (!st) return;
    if (value) (*st->mutable_params())[name.toStdString()] = value->toStdString();
    else st->mutable_params()->erase(name.toStdString());
  });
}

void Document::set_stage_field(const QString& id, const QString& field, int value) {
  edit(QString("Set %1 %2").arg(id, field), [&](spec::PipelineSpec& s) {
    auto* st = find_stage(s, id);
    if (!st) return;
    if (field == "parallelism") st->set_parallelism(value);
    else if (field == "buffer_size") st->set_buffer_size(value);
    else if (field == "error_policy") st->set_error_policy(static_cast<spec::ErrorPolicy>(value));
    else if (field == "per_input") st->set_per_input(value != 0);
    else if (field == "deterministic" && value < 0) st->clear_deterministic();
    else if (field == "deterministic") st->set_deterministic(value != 0);
    else if (field == "cycle_length") st->mutable_interleave()->set_cycle_length(value);
    else if (field == "block_length") st->mutable_interleave()->set_block_length(value);
    else if (field == "interleave_deterministic" && value < 0) st->mutable_interleave()->clear_deterministic();
    else if (field == "interleave_deterministic") st->mutable_interleave()->set_deterministic(value != 0);
    // An interleave that says nothing is no interleave: the file does not get an empty block.
    if (st->has_interleave() && st->interleave().ByteSizeLong() == 0) st->clear_interleave();
  });
}

void Document::set_option(const QString& option, std::int64_t value) {
  edit(QString("Set pipeline %1").arg(option), [&](spec::PipelineSpec& s) {
    auto* options = s.mutable_options();
    if (option == "seed") options->set_seed(static_cast<std::uint64_t>(value));
    else if (option == "error_policy") options->set_error_policy(static_cast<spec::ErrorPolicy>(value));
    else if (option == "deterministic" && value < 0) options->clear_deterministic();
    else if (option == "deterministic") options->set_deterministic(value != 0);
    else if (option == "fuse_stages" && value < 0) options->clear_fuse_stages();
    else if (option == "fuse_stages") options->set_fuse_stages(value != 0);
    if (options->ByteSizeLong() == 0) s.clear_options();
  });
}

std::optional<QString> Document::apply_suggestion(const Suggestion& suggestion) {
  if (read_only_) return QString("this window shows an attached run; open its pipeline file to change it");
  if (!graph_lock_.isEmpty()) return graph_lock_;
  const QString id = QString::fromStdString(suggestion.stage);
  if (index_of(id) < 0) return QString("this pipeline has no stage '%1' (the report is of another pipeline)").arg(id);
  const spec::PipelineSpec before = spec_;
  switch (suggestion.change) {
    case Suggestion::Change::None:
      return QString("this one is advice: it needs a change only you can make");
    case Suggestion::Change::SetParallelism:
      edit(QString("Set %1 workers on %2").arg(suggestion.value).arg(id), [&](spec::PipelineSpec& s) {
        find_stage(s, id)->set_parallelism(static_cast<int>(suggestion.value));
        for (const auto& other : suggestion.together)
          if (auto* st = find_stage(s, QString::fromStdString(other))) st->set_parallelism(static_cast<int>(suggestion.value));
      });
      break;
    case Suggestion::Change::SkipFailures:
      edit(QString("Skip what %1 fails on").arg(id), [&](spec::PipelineSpec& s) { find_stage(s, id)->set_error_policy(spec::skip); });
      break;
    case Suggestion::Change::SetBufferSize:
      edit(QString("Set the buffer of %1 to %2").arg(id).arg(suggestion.value),
           [&](spec::PipelineSpec& s) { find_stage(s, id)->set_buffer_size(static_cast<int>(suggestion.value)); });
      break;
    case Suggestion::Change::AddCacheAfter: {
      for (const auto& st : spec_.stage())
        if (st.op() == "cache" && st.input_size() == 1 && st.input(0) == suggestion.stage)
          return QString("stage '%1' already has a cache after it ('%2')").arg(id, QString::fromStdString(st.id()));
      const QString cache = unused_id("cache");
      edit(QString("Add %1 after %2").arg(cache, id), [&](spec::PipelineSpec& s) {
        const spec::Stage* source = find_stage(s, id);
        const double x = source->layout().x(), y = source->layout().y();
        for (auto& st : *s.mutable_stage())
          for (auto& in : *st.mutable_input())
            if (in == id.toStdString()) in = cache.toStdString();
        auto* added = s.add_stage();
        added->set_id(cache.toStdString());
        added->set_op("cache");
        added->add_input(id.toStdString());
        added->mutable_layout()->set_x(x + 40);
        added->mutable_layout()->set_y(y + 110);
      });
      break;
    }
  }
  if (google::protobuf::util::MessageDifferencer::Equals(before, spec_))
    return QString("nothing to change: the pipeline already has it");
  return std::nullopt;
}

std::optional<QString> Document::rename_stage(const QString& id, const QString& new_id) {
  if (new_id == id) return std::nullopt;
  if (new_id.trimmed().isEmpty()) return QString("a stage needs an id");
  if (index_of(new_id) >= 0) return QString("'%1' is taken by another stage").arg(new_id);
  edit(QString("Rename %1 to %2").arg(id, new_id), [&](spec::PipelineSpec& s) {
    for (auto& st : *s.mutable_stage()) {
      if (st.id() == id.toStdString()) st.set_id(new_id.toStdString());
      for (auto& in : *st.mutable_input())
        if (in == id.toStdString()) in = new_id.toStdString();
    }
  });
  return std::nullopt;
}

void Document::arrange() { edit("Arrange", [](spec::PipelineSpec& s) { lay_out(s); }); }

bool Document::lay_out_unless_placed(spec::PipelineSpec& s) {
  if (std::all_of(s.stage().begin(), s.stage().end(), [](const spec::Stage& st) { return st.has_layout(); })) return false;
  // The stages without a position get the layout's; those the file places stay where they are.
  std::map<std::string, spec::Layout> placed;
  for (const auto& st : s.stage())
    if (st.has_layout()) placed[st.id()] = st.layout();
  lay_out(s);
  for (auto& st : *s.mutable_stage())
    if (auto it = placed.find(st.id()); it != placed.end()) *st.mutable_layout() = it->second;
  return true;
}

void Document::lay_out(spec::PipelineSpec& s) {
  std::string why_not;
  if (auto places = layered_places(s, kNodeWidth, kNodeHeight, &why_not)) {
    for (auto& st : *s.mutable_stage()) {
      const auto& place = places->at(st.id());
      st.mutable_layout()->set_x(place.x);
      st.mutable_layout()->set_y(place.y);
    }
    return;
  }
  // Graphviz's plugins missing or broken on this machine: a plainer layering still shows the graph.
  qWarning("Graphviz could not lay the pipeline out (%s); placing stages in columns instead", why_not.c_str());
  lay_out_in_columns(s);
}

void Document::lay_out_in_columns(spec::PipelineSpec& s) {
  std::map<std::string, int> position;
  for (int i = 0; i < s.stage_size(); ++i) position[s.stage(i).id()] = i;
  auto inputs_of = [&](int i) {
    std::vector<int> found;
    for (const auto& in : s.stage(i).input())
      if (auto it = position.find(in); it != position.end() && it->second != i) found.push_back(it->second);
    return found;
  };
  // A stage goes one column right of its furthest input. It continues the band of rows of its
  // first input when it is that input's first reader; a second reader of a stage (a branch of a
  // tee) and a source start bands of their own, in the order the stages appear; a chain longer
  // than a screen's width goes on in the next row, again from the left.
  std::vector<int> depth(s.stage_size(), -1), chain(s.stage_size(), -1);
  std::vector<bool> first_reader_placed(s.stage_size(), false);
  int chains = 0;
  std::vector<int> state(s.stage_size(), 0);  // 0 not seen, 1 being placed (a cycle), 2 placed
  std::function<void(int)> place = [&](int i) {
    if (state[i] != 0) return;
    state[i] = 1;
    int d = 0;
    const auto inputs = inputs_of(i);
    for (int in : inputs) {
      place(in);
      if (state[in] == 2) d = std::max(d, depth[in] + 1);
    }
    depth[i] = d;
    if (!inputs.empty() && state[inputs.front()] == 2 && !first_reader_placed[inputs.front()]) {
      first_reader_placed[inputs.front()] = true;
      chain[i] = chain[inputs.front()];
    } else {
      chain[i] = chains++;
    }
    state[i] = 2;
  };
  for (int i = 0; i < s.stage_size(); ++i) place(i);
  const int per_row = layers_per_row(depth.empty() ? 1 : 1 + *std::max_element(depth.begin(), depth.end()));
  std::vector<int> rows_of_chain(chains, 1), first_row(chains, 0);
  for (int i = 0; i < s.stage_size(); ++i) rows_of_chain[chain[i]] = std::max(rows_of_chain[chain[i]], depth[i] / per_row + 1);
  for (int c = 1; c < chains; ++c) first_row[c] = first_row[c - 1] + rows_of_chain[c - 1];
  for (int i = 0; i < s.stage_size(); ++i) {
    s.mutable_stage(i)->mutable_layout()->set_x((depth[i] % per_row) * kColumnStep);
    s.mutable_stage(i)->mutable_layout()->set_y((first_row[chain[i]] + depth[i] / per_row) * kRowStep);
  }
}

bool same_pipeline_ignoring_layout(const spec::PipelineSpec& a, const spec::PipelineSpec& b) {
  spec::PipelineSpec x = a, y = b;
  for (auto& st : *x.mutable_stage()) st.clear_layout();
  for (auto& st : *y.mutable_stage()) st.clear_layout();
  return google::protobuf::util::MessageDifferencer::Equals(x, y);
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_document.cpp"
