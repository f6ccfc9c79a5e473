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
  suggestions_.clear();
  buttons_.clear();
  outcomes_.clear();
  while (rows_->count() > 1) {
    QLayoutItem* item = rows_->takeAt(0);
    delete item->widget();
    delete item;
  }
}

void VerdictPanel::show_verdict(const metrics::MetricsSnapshot& snap, const QString& source) {
  clear();
  QString text = QString("<b>%1</b>: %2 after %3 s.").arg(source.toHtmlEscaped(), QString::fromStdString(snap.state()))
                     .arg(snap.elapsed_s(), 0, 'f', 2);
  if (!snap.error().empty()) text += "<br><b>Failed:</b> " + QString::fromStdString(snap.error()).toHtmlEscaped();
  else if (!snap.bottleneck().empty())
    text += QString("<br><b>Bottleneck:</b> stage '%1': %2")
                .arg(QString::fromStdString(snap.bottleneck()).toHtmlEscaped(), QString::fromStdString(snap.bottleneck_reason()).toHtmlEscaped());
  // A failed run's figures are of a run cut short: nothing to tune from them.
  if (snap.error().empty()) suggestions_ = suggestions_for(snap);
  text += suggestions_.empty() ? QString("<br>Nothing to suggest: no change stands out from these figures.")
                               : QString("<br><b>What would help:</b>");
  summary_->setText(text);
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
    const bool can = suggestions_[i].change != Suggestion::Change::None;
    button->setEnabled(can);
    button->setToolTip(can ? "Make this change to the pipeline (one undoable step)" : "Advice: a change only you can make");
    connect(button, &QPushButton::clicked, this, [this, i] { emit apply_requested(static_cast<int>(i)); });
    line->addWidget(label, 1);
    line->addWidget(outcome);
    line->addWidget(button);
    rows_->insertWidget(rows_->count() - 1, row);
    buttons_.push_back(button);
    outcomes_.push_back(outcome);
  }
}

void VerdictPanel::mark(int index, const QString& outcome) {
  if (index < 0 || index >= suggestion_count()) return;
  outcomes_[index]->setText(outcome);
  if (outcome == "applied") buttons_[index]->setEnabled(false);
}

}  // namespace sluice::studio
