#pragma once
// The end of a run in the app: its state and length, the bottleneck, and the report's "What would
// help", each suggestion with an Apply button when the app can make the change itself, then the
// report's Autotune section. Shown for a run of this window, an attached run that ended, and a
// metrics log opened from a file.
#include <QLabel>
#include <QPushButton>
#include <QVBoxLayout>
#include <QWidget>
#include <vector>

#include "metrics.pb.h"
#include "sluice/core/report.hpp"

namespace sluice::studio {

class VerdictPanel final : public QWidget {
  Q_OBJECT
 public:
  explicit VerdictPanel(QWidget* parent = nullptr);
  // `source`: what the numbers are of ("run of train.txtpb", "metrics log run.jsonl").
  void show_verdict(const metrics::MetricsSnapshot& final_snapshot, const QString& source);
  void clear();
  // Marks suggestion `index` as applied (its button disabled) or says why it was not; "" clears it
  // (the change was undone).
  void mark(int index, const QString& outcome);
  // Why no suggestion can be applied here (the numbers are of a pipeline this window does not
  // edit: an attached run, a metrics log shown read-only); empty: those that can be, can.
  void set_apply_refusal(const QString& why);
  // The run beside an earlier one (run_comparison.hpp), under the suggestions.
  void show_comparison(const QString& html);
  // The pipeline shown was edited since the run this Verdict is of: what changed (empty: nothing,
  // or an edit undone), said above the suggestions.
  void show_changed_since(const QStringList& changes);
  QString changed_since() const { return changed_since_->isHidden() ? QString() : changed_since_->text(); }
  QString comparison() const;

  bool empty() const { return suggestions_.empty() && summary_->text().isEmpty(); }
  QString summary() const { return summary_->text(); }
  int suggestion_count() const { return static_cast<int>(suggestions_.size()); }
  const Suggestion& suggestion(int index) const { return suggestions_.at(index); }
  QPushButton* apply_button(int index) const { return buttons_.at(index); }

 signals:
  void apply_requested(int index);

 private:
  QLabel* summary_;
  QLabel* changed_since_;
  QVBoxLayout* rows_;
  std::vector<Suggestion> suggestions_;
  std::vector<QPushButton*> buttons_;
  std::vector<QLabel*> outcomes_;
  QString apply_refusal_;
  void update_buttons();
};

}  // namespace sluice::studio
