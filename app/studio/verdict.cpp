#include "verdict.hpp"

#include <QHBoxLayout>
#include <QScrollArea>

namespace sluice::studio {

VerdictPanel::VerdictPanel(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  summary_ = new QLabel;
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  summary_->setObjectName("verdict_summary");
  outer->addWidget(summary_);
  changed_since_ = new QLabel;
  changed_since_->setObjectName("verdict_changed_since");
  changed_since_->setWordWrap(true);
  changed_since_->setStyleSheet("color: #8a4b00");
  changed_since_->hide();
  outer->addWidget(changed_since_);
  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  auto* inner = new QWidget;
  rows_ = new QVBoxLayout(inner);
  rows_->addStretch();
  scroll->setWidget(inner);
  outer->addWidget(scroll, 1);
  clear();
}

void VerdictPanel::clear() {
  summary_->setText({});
  show_changed_since({});
  apply_refusal_.clear();
  suggestions_.clear();
  buttons_.clear();
  outcomes_.clear();
  while (rows_->count() > 1) {
    QLayoutItem* item = rows_->takeAt(0);
    delete item->widget();
    delete item;
  }
}

namespace {
// Elements dropped under the skip policy, per stage, with the first reason: what the CLI report
// lists under "Skipped in stage".
QString skipped_text(const metrics::MetricsSnapshot& snap) {
  QString text;
  for (const auto& st : snap.stage()) {
    if (st.errors_skipped() == 0) continue;
    text += QString("<br><b>Skipped:</b> %1 element%2 in stage '%3'")
                .arg(st.errors_skipped())
                .arg(st.errors_skipped() == 1 ? "" : "s")
                .arg(QString::fromStdString(st.id()).toHtmlEscaped());
    if (st.skip_reasons_size()) text += ", first: " + QString::fromStdString(st.skip_reasons(0)).toHtmlEscaped();
  }
  return text;
}
}  // namespace

void VerdictPanel::show_verdict(const metrics::MetricsSnapshot& snap, const QString& source) {
  clear();
  const bool never_started = snap.state() == "failed" && snap.elapsed_s() == 0;
  QString text = never_started ? QString("<b>%1</b>: could not start.").arg(source.toHtmlEscaped())
                               : QString("<b>%1</b>: %2 after %3 s.").arg(source.toHtmlEscaped(), QString::fromStdString(snap.state()))
                                     .arg(snap.elapsed_s(), 0, 'f', 2);
  if (!snap.error().empty()) text += "<br><b>Failed:</b> " + QString::fromStdString(snap.error()).toHtmlEscaped();
  else if (!snap.bottleneck().empty())
    // A stage that holds nothing up is only the busiest: not called a bottleneck (nor outlined).
    text += QString(bottleneck_holds_up(snap) ? "<br><b>Bottleneck:</b> stage '%1': %2" : "<br><b>Busiest stage</b> (nothing held up): '%1': %2")
                .arg(QString::fromStdString(snap.bottleneck()).toHtmlEscaped(), QString::fromStdString(snap.bottleneck_reason()).toHtmlEscaped());
  text += skipped_text(snap);
  // (lineage) Each epoch's delivery verdict: every record once, or the records given twice or never.
  if (const std::string ledger = format_ledger_summary(snap); !ledger.empty())
    text += "<br><b>Delivery ledger:</b><br>" + QString::fromStdString(ledger).trimmed().toHtmlEscaped().replace("\n", "<br>");
  // A failed run's figures are of a run cut short: nothing to tune from them, but the failure may
  // be one to skip past.
  if (snap.error().empty()) suggestions_ = suggestions_for(snap);
  else if (auto skip = suggestion_after_failure(snap)) suggestions_ = {*skip};
  // A run that never started has no figures to draw advice from: its message says what to fix.
  if (!suggestions_.empty()) text += "<br><b>What would help:</b>";
  else if (!never_started) text += "<br>Nothing to suggest: no change stands out from these figures.";
  summary_->setText(text);
  if (const std::string autotune = format_autotune_summary(snap); !autotune.empty()) {
    // Its lines as the CLI prints them, wrapped to the panel: a long reason must not push the
    // suggestions' Apply buttons off its right edge.
    auto* section = new QLabel("<b>Autotune</b><p style='white-space:pre-wrap'>" + QString::fromStdString(autotune).trimmed().toHtmlEscaped() + "</p>");
    section->setObjectName("verdict_autotune");
    section->setTextInteractionFlags(Qt::TextSelectableByMouse);
    section->setWordWrap(true);
    rows_->insertWidget(rows_->count() - 1, section);
  }
  for (std::size_t i = 0; i < suggestions_.size(); ++i) {
    auto* row = new QWidget;
    auto* line = new QHBoxLayout(row);
    line->setContentsMargins(0, 2, 0, 2);
    auto* label = new QLabel("• " + QString::fromStdString(suggestions_[i].text));
    label->setWordWrap(true);
    label->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto* outcome = new QLabel;
    outcome->setObjectName(QString("outcome_%1").arg(i));
    auto* button = new QPushButton("Apply");
    button->setObjectName(QString("apply_%1").arg(i));
    connect(button, &QPushButton::clicked, this, [this, i] { emit apply_requested(static_cast<int>(i)); });
    line->addWidget(label, 1);
    line->addWidget(outcome);
    line->addWidget(button);
    // Suggestions go before the Autotune section.
    rows_->insertWidget(static_cast<int>(i), row);
    buttons_.push_back(button);
    outcomes_.push_back(outcome);
  }
  update_buttons();
}

void VerdictPanel::show_changed_since(const QStringList& changes) {
  changed_since_->setText(changes.isEmpty() ? QString()
                                            : "The pipeline has changed since this run (its figures are of the pipeline before): " +
                                                  changes.mid(0, 4).join("; ") + (changes.size() > 4 ? "; …" : "") + ".");
  changed_since_->setVisible(!changes.isEmpty());
}

void VerdictPanel::show_comparison(const QString& html) {
  auto* section = findChild<QLabel*>("verdict_comparison");
  if (!section) {
    section = new QLabel;
    section->setObjectName("verdict_comparison");
    section->setTextFormat(Qt::RichText);
    section->setWordWrap(true);
    section->setTextInteractionFlags(Qt::TextSelectableByMouse);
    // Under the suggestions (the summary's "What would help:" leads to them), above Autotune.
    rows_->insertWidget(static_cast<int>(suggestions_.size()), section);
  }
  section->setText(html);
}

QString VerdictPanel::comparison() const {
  auto* section = findChild<QLabel*>("verdict_comparison");
  return section ? section->text() : QString();
}

void VerdictPanel::set_apply_refusal(const QString& why) {
  apply_refusal_ = why;
  update_buttons();
}

void VerdictPanel::update_buttons() {
  for (std::size_t i = 0; i < buttons_.size(); ++i) {
    const bool change = suggestions_[i].change != Suggestion::Change::None;
    const bool applied = outcomes_[i]->text() == "applied";
    buttons_[i]->setEnabled(change && !applied && apply_refusal_.isEmpty());
    buttons_[i]->setToolTip(!change                    ? QString("Advice: a change only you can make")
                            : !apply_refusal_.isEmpty() ? "Cannot apply here: " + apply_refusal_
                            : applied                  ? QString("Applied; Ctrl+Z undoes it")
                                                       : QString("Make this change to the pipeline (one undoable step)"));
  }
}

void VerdictPanel::mark(int index, const QString& outcome) {
  if (index < 0 || index >= suggestion_count()) return;
  outcomes_[index]->setText(outcome);
  update_buttons();
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_verdict.cpp"
