#pragma once
// The selected stage's settings (how the engine runs it, then its operator's parameters), or the
// pipeline's options when no stage is selected. Parameters get editors from the operator's
// schema: spin boxes with the schema's ranges, combo boxes for choices, check boxes, file pickers
// for paths, text for lists. Text is checked as it is typed; a committed value goes through the Document (undoable)
// and the problems panel reports whatever validation still finds.
#include <QFormLayout>
#include <QLabel>
#include <QWidget>
#include <functional>
#include <utility>
#include <vector>

#include "document.hpp"
#include "metrics.pb.h"

namespace sluice::studio {

class Inspector final : public QWidget {
  Q_OBJECT
 public:
  explicit Inspector(Document& document, QWidget* parent = nullptr);
  void show_stage(const QString& id);  // empty: nothing selected
  // The last run's metrics: the selected stage's output fields (names, types, shapes with the
  // smallest and largest size seen in each dimension) and padding share are shown under its name.
  void show_metrics(const metrics::MetricsSnapshot& snapshot);
  // What the outputs line says now ("" when the stage has not run), for tests.
  QString outputs_text() const;
  const QString& stage() const { return stage_; }
  bool settled() const { return !rebuild_pending_; }  // the form shows the document as it is
  // The editor of a parameter (object name "param:NAME"), for tests and focus keeping.
  QWidget* editor(const QString& param) const;
  // The message under a parameter's editor: what is wrong with the text being typed, or with the
  // committed value.
  QString message(const QString& param) const;

 private:
  // The form is rebuilt from the event loop, never inside one of its own editors' signals (a
  // committed value changes the document, which would delete the editor still handling its key).
  void schedule_rebuild();
  void rebuild();
  // rebuild()'s parts for a selected stage.
  void show_stage_rows(const spec::Stage& stage);
  void add_id_row();
  void add_count(const QString& field, const QString& label, int value, const QString& special, const QString& tip,
                 bool autotune = false);
  void add_engine_rows(const RegisteredOperator* op, const spec::Stage& stage);
  bool rebuild_pending_ = false;
  // Validation's problems of this stage's parameters, under their editors.
  void show_problem_messages();
  void add_param_row(const ParamSpec& spec, const spec::Stage& stage);
  void add_unchecked_param_rows(const spec::Stage& stage);
  void add_section(const QString& title);
  // A combo box of (text, value) pairs; on_change gets the chosen value.
  void add_choice(const QString& object_name, const QString& label, const std::vector<std::pair<QString, int>>& items,
                  int current, const QString& tip, const std::function<void(int)>& on_change);
  void add_pipeline_rows();  // the options, shown when no stage is selected
  void commit(const QString& param, const QString& text, const ParamSpec& spec);

  Document& document_;
  QString stage_;
  std::string shown_;  // the stage as the form shows it, to rebuild only when it changed
  bool shown_read_only_ = false;  // whether the form was built for a document nothing edits
  QWidget* form_host_ = nullptr;
  QFormLayout* form_ = nullptr;
  QLabel* header_ = nullptr;
  QLabel* outputs_ = nullptr;
  void show_outputs();
  metrics::MetricsSnapshot metrics_;
};

}  // namespace sluice::studio
