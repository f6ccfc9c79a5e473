#include "inspector.hpp"

#include <map>

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QLineEdit>
#include <QScrollArea>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>
#include <QRegularExpressionValidator>
#include <algorithm>
#include <limits>

#include "sluice/core/param_parse.hpp"
#include "sluice/storage.hpp"

namespace sluice::studio {

namespace {
// A name written with underscores or dots (a stage id, an operator, a parameter) may break after
// them when it is longer than its line: a zero-width space there, which nobody sees.
QString breakable(QString name) {
  for (int k = name.size() - 2; k >= 0; --k)
    if (name[k] == '_' || name[k] == '.') name.insert(k + 1, QChar(0x200B));
  return name;
}


// A count of the engine's: 0 reads as `zero_text` (the engine's default), and where the engine
// may tune it, -1 as "autotune" (type "autotune" or pick it below the default).
class CountBox final : public QSpinBox {
 public:
  CountBox(QString zero_text, bool autotune) : zero_text_(std::move(zero_text)) { setRange(autotune ? -1 : 0, 1 << 20); }

 protected:
  QString textFromValue(int value) const override {
    if (value == -1) return "autotune";
    if (value == 0) return zero_text_;
    return QSpinBox::textFromValue(value);
  }
  int valueFromText(const QString& text) const override {
    const QString t = text.trimmed();
    if (t.compare("autotune", Qt::CaseInsensitive) == 0) return -1;
    if (t == zero_text_) return 0;
    return QSpinBox::valueFromText(t);
  }
  QValidator::State validate(QString& text, int& pos) const override {
    const QString t = text.trimmed();
    if (minimum() < 0 && QString("autotune").startsWith(t, Qt::CaseInsensitive)) return t.size() == 8 ? QValidator::Acceptable : QValidator::Intermediate;
    if (t == zero_text_) return QValidator::Acceptable;
    // A number first: "1" is a count, though the unset value's name ("1 (default)") starts so.
    const QValidator::State number = QSpinBox::validate(text, pos);
    if (number != QValidator::Invalid) return number;
    return zero_text_.startsWith(t) ? QValidator::Intermediate : QValidator::Invalid;
  }

 private:
  QString zero_text_;
};
const spec::Stage* stage_in(const spec::PipelineSpec& s, const QString& id) {
  for (const auto& st : s.stage())
    if (st.id() == id.toStdString()) return &st;
  return nullptr;
}
bool fits_int(const std::optional<double>& v) {
  return v && *v >= std::numeric_limits<int>::min() && *v <= std::numeric_limits<int>::max();
}
void show_message(QLabel* label, const QString& text) {
  label->setText(text);
  label->setVisible(!text.isEmpty());
}
}  // namespace

Inspector::Inspector(Document& document, QWidget* parent) : QWidget(parent), document_(document) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(4, 4, 4, 4);
  header_ = new QLabel;
  header_->setWordWrap(true);
  header_->setTextFormat(Qt::RichText);
  outer->addWidget(header_);
  outputs_ = new QLabel;
  outputs_->setObjectName("outputs");
  outputs_->setWordWrap(true);
  outputs_->setTextFormat(Qt::RichText);
  outputs_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  outputs_->setVisible(false);
  outer->addWidget(outputs_);
  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  form_host_ = new QWidget;
  form_ = new QFormLayout(form_host_);
  form_->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  // A narrow inspector (a small screen) puts a long name above its editor rather than cutting
  // the editor off behind a scrollbar.
  form_->setRowWrapPolicy(QFormLayout::WrapLongRows);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  scroll->setWidget(form_host_);
  outer->addWidget(scroll, 1);
  connect(&document_, &Document::changed, this, [this] {
    const spec::Stage* st = stage_in(document_.spec(), stage_);
    // The same options of a document that became editable (New after an attach) are built anew.
    if (!st && stage_.isEmpty() && document_.spec().options().SerializeAsString() == shown_ && document_.read_only() == shown_read_only_) return;
    if (!st) return show_stage({});
    if (st->SerializeAsString() != shown_) schedule_rebuild();
    else show_problem_messages();  // same values, maybe new problems (another stage changed)
  });
  show_stage({});
}

void Inspector::show_stage(const QString& id) {
  stage_ = id;
  shown_.clear();
  schedule_rebuild();
  show_outputs();
}

void Inspector::show_metrics(const metrics::MetricsSnapshot& snapshot) {
  metrics_ = snapshot;
  show_outputs();
}

QString Inspector::outputs_text() const { return outputs_->isVisible() ? outputs_->text() : QString(); }

// "x  i64[32, 5…41]": a dimension whose size changed between the outputs looked at shows its
// smallest and largest size (a padded batch's length, a ragged batch's values).
void Inspector::show_outputs() {
  const metrics::StageMetrics* found = nullptr;
  for (const auto& m : metrics_.stage())
    if (QString::fromStdString(m.id()) == stage_) found = &m;
  if (!found || found->output_fields_size() == 0) {
    outputs_->setVisible(false);
    return;
  }
  QStringList rows;
  for (const auto& f : found->output_fields()) {
    QStringList dims;
    for (int d = 0; d < f.min_dims_size() && d < f.max_dims_size(); ++d)
      dims << (f.min_dims(d) == f.max_dims(d) ? QString::number(f.min_dims(d)) : QString("%1…%2").arg(f.min_dims(d)).arg(f.max_dims(d)));
    rows << QString("<tt>%1</tt> &nbsp;%2[%3]").arg(QString::fromStdString(f.name()).toHtmlEscaped(), QString::fromStdString(f.dtype()), dims.join(", "));
  }
  QString text = QString("<b>Outputs</b> <span style='color:#666'>(%1 looked at)</span><br>%2").arg(found->output_samples()).arg(rows.join("<br>"));
  const double written = double(found->padding_values()) + double(found->data_values());
  if (written > 0)
    text += QString("<br>padding: %1% of the values written").arg(100.0 * double(found->padding_values()) / written, 0, 'f', 1);
  outputs_->setText(text);
  outputs_->setVisible(true);
}

void Inspector::schedule_rebuild() {
  if (rebuild_pending_) return;
  rebuild_pending_ = true;
  QMetaObject::invokeMethod(this, [this] { rebuild(); }, Qt::QueuedConnection);
}

void Inspector::show_problem_messages() {
  for (const auto& problem : document_.problems())
    if (QString::fromStdString(problem.stage) == stage_ && !problem.param.empty())
      if (auto* label = form_host_->findChild<QLabel*>("message:" + QString::fromStdString(problem.param)))
        show_message(label, QString::fromStdString(problem.message));
}

QWidget* Inspector::editor(const QString& param) const { return form_host_->findChild<QWidget*>("param:" + param); }

QString Inspector::message(const QString& param) const {
  auto* label = form_host_->findChild<QLabel*>("message:" + param);
  return label && label->isVisible() ? label->text() : QString();
}

void Inspector::rebuild() {
  rebuild_pending_ = false;
  // Keep the keyboard where it was: a committed value rebuilds the form.
  QString focused;
  if (QWidget* f = focusWidget(); f && isAncestorOf(f)) focused = f->objectName();
  while (form_->rowCount() > 0) form_->removeRow(0);
  shown_read_only_ = document_.read_only();
  form_host_->setEnabled(!shown_read_only_);
  const spec::Stage* st = stage_in(document_.spec(), stage_);
  if (st) {
    show_stage_rows(*st);
  } else {
    shown_.clear();
    if (!stage_.isEmpty()) return header_->setText(QString());
    shown_ = document_.spec().options().SerializeAsString();
    header_->setText("<b>Pipeline</b><br><i>Select a stage to edit it; these settings are the whole pipeline's.</i>");
    add_pipeline_rows();
  }
  if (!focused.isEmpty())
    if (auto* w = form_host_->findChild<QWidget*>(focused)) w->setFocus();
}

// A stage's form: what it is, its id, how the engine runs it, then its operator's parameters.
void Inspector::show_stage_rows(const spec::Stage& stage) {
  const spec::Stage* st = &stage;
  shown_ = st->SerializeAsString();
  auto op = document_.registry().find(st->op());
  header_->setText(QString("<b>%1</b> &nbsp;<span style='color:#666'>%2</span><br>%3")
                       .arg(breakable(stage_.toHtmlEscaped()), breakable(QString::fromStdString(st->op()).toHtmlEscaped()),
                            op ? QString::fromStdString(op->info.summary).toHtmlEscaped()
                               : QString("<span style='color:#b00'>No loaded plugin has this operator.</span>")));

  add_id_row();
  add_engine_rows(op.get(), *st);
  if (op && !op->info.params.empty()) add_section("Parameters");
  if (op)
    for (const auto& spec : op->info.params) add_param_row(spec, *st);
  else
    add_unchecked_param_rows(*st);
  show_problem_messages();
}

void Inspector::add_id_row() {
  auto* id_edit = new QLineEdit(stage_);
  id_edit->setObjectName("stage:id");
  auto* id_message = new QLabel;
  id_message->setObjectName("message:id");
  id_message->setStyleSheet("color: #b00");
  id_message->hide();
  connect(id_edit, &QLineEdit::editingFinished, this, [this, id_edit, id_message] {
    const QString wanted = id_edit->text().trimmed();
    if (wanted == stage_) return;
    const QString old = stage_;
    stage_ = wanted;  // follow the rename
    if (auto refusal = document_.rename_stage(old, wanted)) {
      stage_ = old;
      show_message(id_message, *refusal);
    }
  });
  form_->addRow("id", id_edit);
  form_->addRow("", id_message);
}

// A count the engine takes (workers, buffer, interleave), with its special value's name at 0.
void Inspector::add_count(const QString& field, const QString& label, int value, const QString& special, const QString& tip,
                          bool autotune) {
  auto* box = new CountBox(special, autotune);
  box->setObjectName("stage:" + field);
  box->setValue(value);
  box->setKeyboardTracking(false);
  box->setToolTip(tip);
  connect(box, &QSpinBox::valueChanged, this, [this, field](int v) { document_.set_stage_field(stage_, field, v); });
  auto* name = new QLabel(label);
  name->setToolTip(tip);
  form_->addRow(name, box);
}

// How the engine runs the stage, labelled apart from the operator's parameters (prefetch and
// shuffle have a buffer_size parameter of their own).
void Inspector::add_engine_rows(const RegisteredOperator* op, const spec::Stage& stage) {
  const spec::Stage* st = &stage;
  // A per-input stage runs on the readers of its interleave: its workers are set there. A stage
  // that keeps state between elements runs on one (an aggregate may still assemble its outputs on
  // several, as padded_batch does): no count is offered unless the file sets one, to be undone.
  // (An operator not loaded keeps the count on offer.)
  const std::optional<bool> known = op ? takes_workers(*op, {st->params().begin(), st->params().end()}) : std::optional<bool>(true);
  const bool takes = known.value_or(false);
  if (!known && st->parallelism() <= 1 && !st->per_input()) {
    // An aggregate whose parameters do not build yet (a shuffle without its buffer size): whether
    // it can use workers is said once they do.
    auto* pending = new QLabel("once its parameters are set");
    pending->setWordWrap(true);
    pending->setObjectName("stage:parallelism");
    pending->setToolTip("whether this stage can run on several workers depends on its parameters; set them (see Problems)");
    form_->addRow("workers", pending);
  } else if (!takes && st->parallelism() <= 1 && !st->per_input()) {
    auto* one = new QLabel("one (keeps state between elements)");
    one->setWordWrap(true);
    one->setObjectName("stage:parallelism");
    one->setToolTip("this operator keeps state from one element to the next, so one worker runs it; parallelism applies to "
                    "stateless operators and to aggregates that assemble their outputs in parallel");
    form_->addRow("workers", one);
  } else if (st->per_input() && st->parallelism() == 0) {
    auto* readers = new QLabel("the interleave's readers");
    readers->setWordWrap(true);
    readers->setObjectName("stage:parallelism");
    readers->setToolTip("a per-input stage runs on the readers of the interleave before it: set workers on that stage");
    form_->addRow("workers", readers);
  } else {
    // Unset is one worker, fixed: "auto" would read as the tuner's choice, which is "autotune".
    add_count("parallelism", "workers", st->parallelism(), "1 (default)",
              "parallelism: workers running this stage (stateless operators; for an aggregate whose summary says so, "
              "threads assembling its outputs); unset: one; autotune: chosen while it runs, within the pipeline's CPU budget",
              true);
  }
  add_count("buffer_size", "output buffer", st->buffer_size(), "engine's",
            "buffer_size: elements waiting between this stage and the next; engine's: up to 256 elements or 128 MB, "
            "whichever comes first; autotune: sized while it runs, within the pipeline's RAM budget",
            true);
  const QString pipeline_policy = document_.spec().options().error_policy() == spec::skip ? "skip" : "fail";
  add_choice("stage:error_policy", "on error",
             {{"pipeline's (" + pipeline_policy + ")", spec::ERROR_POLICY_UNSET}, {"fail", spec::fail}, {"skip", spec::skip}},
             st->error_policy(), "error_policy: fail stops the run; skip drops the element, counts it and keeps going",
             [this](int v) { document_.set_stage_field(stage_, "error_policy", v); });
  if (op && op->info.kind != OperatorKind::Source && op->info.kind != OperatorKind::Combine) {
    const QString pipeline_order = document_.spec().options().has_deterministic() && !document_.spec().options().deterministic()
                                       ? "first ready"
                                       : "in order";
    add_choice("stage:deterministic", "output order",
               {{"pipeline's (" + pipeline_order + ")", -1}, {"in order", 1}, {"first ready", 0}},
               st->has_deterministic() ? int(st->deterministic()) : -1,
               "deterministic: whether this stage's parallel workers hand outputs on in input order (tf.data's "
               "map(..., deterministic=)); first ready lets a fast element pass a slow one, and the run is no "
               "longer the same bytes every time",
               [this](int v) { document_.set_stage_field(stage_, "deterministic", v); });
  }
  if (op && (op->info.kind == OperatorKind::Map || op->info.kind == OperatorKind::Filter || op->info.kind == OperatorKind::Aggregate))
    add_choice("stage:per_input", "runs", {{"on the whole stream", 0}, {"once per input", 1}}, st->per_input() ? 1 : 0,
               "per_input: once per input of the interleave before it (an expand stage such as text_lines), on that "
               "stage's readers, as tf.data's interleave(lambda f: ...) runs a dataset per file: a batch never mixes two "
               "inputs; set parallelism on the interleave",
               [this](int v) { document_.set_stage_field(stage_, "per_input", v); });
  if (op && op->info.kind == OperatorKind::Expand) {
    add_count("cycle_length", "interleave cycle", st->interleave().cycle_length(), "1",
              "interleave.cycle_length: inputs open at once (tf.data's cycle_length)");
    add_count("block_length", "interleave block", st->interleave().block_length(), "1",
              "interleave.block_length: outputs taken from one input before the next");
    add_choice("stage:interleave_deterministic", "interleave order",
               {{"pipeline's", -1}, {"in order", 1}, {"first ready", 0}},
               st->interleave().has_deterministic() ? int(st->interleave().deterministic()) : -1,
               "interleave.deterministic: in order gives the same sequence every run; first ready takes what is read first",
               [this](int v) { document_.set_stage_field(stage_, "interleave_deterministic", v); });
  }
}

void Inspector::add_unchecked_param_rows(const spec::Stage& st) {
  // No schema to build editors from: the parameters as the file writes them, as text, so that
  // they can be read and corrected while the plugin is missing (the run will check them).
  if (st.params().empty()) return;
  add_section("Parameters (as written; not checked: the operator is not loaded)");
  std::map<std::string, std::string> sorted(st.params().begin(), st.params().end());
  for (const auto& [key, value] : sorted) {
    const QString name = QString::fromStdString(key);
    auto* edit = new QLineEdit(QString::fromStdString(value));
    edit->setObjectName("param:" + name);
    connect(edit, &QLineEdit::editingFinished, this, [this, edit, name] {
      const spec::Stage* now = stage_in(document_.spec(), stage_);
      if (!now) return;
      auto it = now->params().find(name.toStdString());
      if (it != now->params().end() && QString::fromStdString(it->second) == edit->text()) return;
      document_.set_param(stage_, name, edit->text());
    });
    // A name the registry never checked may be of any length: it wraps rather than widening
    // the form past the dock.
    auto* label = new QLabel(breakable(name));
    label->setWordWrap(true);
    form_->addRow(label, edit);
  }
}

void Inspector::add_section(const QString& title) {
  auto* label = new QLabel("<b>" + title.toHtmlEscaped() + "</b>");
  label->setWordWrap(true);
  label->setContentsMargins(0, 8, 0, 0);
  form_->addRow(label);
}

void Inspector::add_choice(const QString& object_name, const QString& label, const std::vector<std::pair<QString, int>>& items,
                           int current, const QString& tip, const std::function<void(int)>& on_change) {
  auto* box = new QComboBox;
  box->setObjectName(object_name);
  for (const auto& [text, value] : items) box->addItem(text, value);
  box->setCurrentIndex(std::max(0, box->findData(current)));
  box->setToolTip(tip);
  connect(box, &QComboBox::activated, this, [box, on_change](int index) { on_change(box->itemData(index).toInt()); });
  auto* name = new QLabel(label);
  name->setToolTip(tip);
  form_->addRow(name, box);
}

void Inspector::add_pipeline_rows() {
  const auto& options = document_.spec().options();
  auto* seed = new QLineEdit(QString::number(options.seed()));
  seed->setObjectName("option:seed");
  seed->setValidator(new QRegularExpressionValidator(QRegularExpression("[0-9]{1,19}"), seed));
  const QString seed_tip = "seed: every random stage draws from it; the same seed gives the same data, at any parallelism";
  seed->setToolTip(seed_tip);
  connect(seed, &QLineEdit::editingFinished, this, [this, seed] {
    bool ok = false;
    const qulonglong value = seed->text().toULongLong(&ok);
    if (ok && value != document_.spec().options().seed()) document_.set_option("seed", static_cast<std::int64_t>(value));
  });
  auto* seed_label = new QLabel("seed");
  seed_label->setToolTip(seed_tip);
  form_->addRow(seed_label, seed);
  auto tristate = [](bool has, bool value) { return has ? int(value) : -1; };
  add_choice("option:deterministic", "order", {{"default (in order)", -1}, {"in order", 1}, {"first ready", 0}},
             tristate(options.has_deterministic(), options.deterministic()),
             "deterministic: parallel stages keep their input's order (the same output every run) or pass on what is "
             "ready first",
             [this](int v) { document_.set_option("deterministic", v); });
  add_choice("option:error_policy", "on error", {{"default (fail)", spec::ERROR_POLICY_UNSET}, {"fail", spec::fail}, {"skip", spec::skip}},
             options.error_policy(),
             "error_policy: fail stops the run naming the stage and element; skip drops the element, counts it and "
             "reports the first reasons (a stage's own setting wins)",
             [this](int v) { document_.set_option("error_policy", v); });
  add_choice("option:fuse_stages", "fuse stages", {{"default (yes)", -1}, {"yes", 1}, {"no", 0}},
             tristate(options.has_fuse_stages(), options.fuse_stages()),
             "fuse_stages: neighbouring stateless maps with the same workers share them (no hand-off); their metrics stay "
             "separate",
             [this](int v) { document_.set_option("fuse_stages", v); });
}

void Inspector::add_param_row(const ParamSpec& spec, const spec::Stage& stage) {
  const QString name = QString::fromStdString(spec.name);
  auto given = stage.params().find(spec.name);
  const bool is_set = given != stage.params().end();
  const QString text = is_set ? QString::fromStdString(given->second) : QString::fromStdString(spec.default_value.value_or(""));
  // A value that does not parse is shown as the text it is, whatever the type.
  bool parses = true;
  try {
    if (!text.isEmpty() || spec.type != ParamType::String) parse_param(spec, text.toStdString());
  } catch (const Error&) {
    parses = false;
  }

  auto* message = new QLabel;
  message->setObjectName("message:" + name);
  message->setStyleSheet("color: #b00");
  message->setWordWrap(true);
  message->hide();

  QWidget* editor = nullptr;
  if (parses && spec.type == ParamType::Bool) {
    auto* box = new QCheckBox;
    box->setChecked(text == "true" || text == "1");
    connect(box, &QCheckBox::toggled, this, [this, name, spec](bool on) { commit(name, on ? "true" : "false", spec); });
    editor = box;
  } else if (parses && spec.type == ParamType::Choice) {
    auto* box = new QComboBox;
    for (const auto& c : spec.choices) box->addItem(QString::fromStdString(c));
    box->setCurrentText(text);
    connect(box, &QComboBox::textActivated, this, [this, name, spec](const QString& v) { commit(name, v, spec); });
    editor = box;
  } else if (parses && spec.type == ParamType::Int && fits_int(spec.min) && fits_int(spec.max)) {
    auto* box = new QSpinBox;
    box->setRange(static_cast<int>(*spec.min), static_cast<int>(*spec.max));
    box->setValue(text.toInt());
    box->setKeyboardTracking(false);
    connect(box, &QSpinBox::valueChanged, this, [this, name, spec](int v) { commit(name, QString::number(v), spec); });
    editor = box;
  } else if (parses && spec.type == ParamType::Float && spec.min && spec.max) {
    auto* box = new QDoubleSpinBox;
    box->setDecimals(6);
    box->setRange(*spec.min, *spec.max);
    box->setValue(text.toDouble());
    box->setKeyboardTracking(false);
    connect(box, &QDoubleSpinBox::valueChanged, this, [this, name, spec](double v) { commit(name, QString::number(v, 'g', 12), spec); });
    editor = box;
  } else {
    auto* line = new QLineEdit(text);
    if (!is_set && spec.default_value) line->setPlaceholderText(text);
    if (spec.required()) line->setPlaceholderText("required");
    // Checked on every keystroke; committed when the user is done with the field.
    connect(line, &QLineEdit::textEdited, this, [message, spec](const QString& typed) {
      try {
        parse_param(spec, typed.toStdString());
        show_message(message, {});
      } catch (const Error& e) {
        show_message(message, QString::fromUtf8(e.what()));
      }
    });
    connect(line, &QLineEdit::editingFinished, this, [this, line, name, spec] { commit(name, line->text(), spec); });
    editor = line;
    if (spec.type == ParamType::Path || spec.type == ParamType::OutputPath) {
      auto* row = new QWidget;
      auto* h = new QHBoxLayout(row);
      h->setContentsMargins(0, 0, 0, 0);
      h->addWidget(line, 1);
      auto* browse = new QToolButton;
      browse->setText("…");
      browse->setToolTip("Choose a local file (or type an s3://, gs://, http:// or https:// URI into the field)");
      connect(browse, &QToolButton::clicked, this, [this, line, name, spec] {
        const QString title = QString("Choose %1").arg(name);
        // A URI names no local folder to start the dialog in.
        const QString start = is_remote_uri(line->text().toStdString()) ? QString() : line->text();
        const QString file = spec.type == ParamType::OutputPath ? QFileDialog::getSaveFileName(this, title, start)
                                                                : QFileDialog::getOpenFileName(this, title, start);
        if (file.isEmpty()) return;
        line->setText(file);
        commit(name, file, spec);
      });
      h->addWidget(browse);
      line->setObjectName("param:" + name);
      row->setObjectName("row:" + name);
      editor = row;
    }
  }
  if (editor->objectName().isEmpty()) editor->setObjectName("param:" + name);
  const QString tip = QString::fromStdString(spec.doc + " (" + describe_param_constraints(spec) + ")");
  editor->setToolTip(tip);
  auto* label = new QLabel(name);
  label->setToolTip(tip);
  if (is_set) label->setStyleSheet("font-weight: bold");
  form_->addRow(label, editor);
  form_->addRow("", message);
}

void Inspector::commit(const QString& param, const QString& text, const ParamSpec& spec) {
  const spec::Stage* st = stage_in(document_.spec(), stage_);
  if (!st) return;
  auto given = st->params().find(spec.name);
  const bool is_set = given != st->params().end();
  // Typing the default into an unset parameter, or emptying an optional one, leaves it unset, so
  // the file keeps only what the user chose.
  if (!is_set && spec.default_value && text.toStdString() == *spec.default_value) return;
  if (text.isEmpty() && spec.default_value && spec.type != ParamType::String) return document_.set_param(stage_, param, std::nullopt);
  if (is_set && given->second == text.toStdString()) return;
  document_.set_param(stage_, param, text);
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_inspector.cpp"
