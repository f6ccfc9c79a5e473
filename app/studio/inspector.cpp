#include "inspector.hpp"

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
#include <limits>

#include "sluice/core/param_parse.hpp"

namespace sluice::studio {

namespace {
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
  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  form_host_ = new QWidget;
  form_ = new QFormLayout(form_host_);
  form_->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
  scroll->setWidget(form_host_);
  outer->addWidget(scroll, 1);
  connect(&document_, &Document::changed, this, [this] {
    const spec::Stage* st = stage_in(document_.spec(), stage_);
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
  const spec::Stage* st = stage_in(document_.spec(), stage_);
  if (!st) {
    header_->setText(stage_.isEmpty() ? "<i>Select a stage to edit it.</i>" : QString());
    shown_.clear();
    return;
  }
  shown_ = st->SerializeAsString();
  auto op = document_.registry().find(st->op());
  header_->setText(QString("<b>%1</b> &nbsp;<span style='color:#666'>%2</span><br>%3")
                       .arg(stage_.toHtmlEscaped(), QString::fromStdString(st->op()).toHtmlEscaped(),
                            op ? QString::fromStdString(op->info.summary).toHtmlEscaped()
                               : QString("<span style='color:#b00'>No loaded plugin has this operator.</span>")));
  form_host_->setEnabled(!document_.read_only());

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

  auto add_count = [&](const QString& field, int value, const QString& tip) {
    auto* box = new QSpinBox;
    box->setObjectName("stage:" + field);
    box->setRange(0, 1 << 20);
    box->setSpecialValueText("auto");
    box->setValue(value);
    box->setKeyboardTracking(false);
    box->setToolTip(tip);
    connect(box, &QSpinBox::valueChanged, this, [this, field](int v) { document_.set_stage_field(stage_, field, v); });
    form_->addRow(field, box);
  };
  add_count("parallelism", st->parallelism(), "workers running this stage (stateless operators only); auto: one");
  add_count("buffer_size", st->buffer_size(), "output buffer in elements; auto: chosen by the engine");

  if (op)
    for (const auto& spec : op->info.params) add_param_row(spec, *st);

  show_problem_messages();

  if (!focused.isEmpty())
    if (auto* w = form_host_->findChild<QWidget*>(focused)) w->setFocus();
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
      browse->setToolTip("Choose a file");
      connect(browse, &QToolButton::clicked, this, [this, line, name, spec] {
        const QString title = QString("Choose %1").arg(name);
        const QString file = spec.type == ParamType::OutputPath ? QFileDialog::getSaveFileName(this, title, line->text())
                                                                : QFileDialog::getOpenFileName(this, title, line->text());
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
