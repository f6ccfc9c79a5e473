#pragma once
// The pipeline being edited: the same PipelineSpec the CLI reads, the file it came from, and the
// undo stack every edit goes through. Widgets change it only through edit(); it tells them with
// changed().
#include <QObject>
#include <QPointF>
#include <QString>
#include <QUndoStack>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <optional>
#include <vector>

#include "pipeline.pb.h"
#include "sluice/core/registry.hpp"
#include "sluice/core/report.hpp"
#include "sluice/core/spec.hpp"

namespace sluice::studio {

class Document : public QObject {
  Q_OBJECT
 public:
  explicit Document(const Registry& registry, QObject* parent = nullptr);

  const spec::PipelineSpec& spec() const { return spec_; }
  const Registry& registry() const { return registry_; }
  QUndoStack* undo_stack() { return &undo_; }
  const QString& file() const { return file_; }
  bool modified() const { return !undo_.isClean(); }
  // Set while attached to a run elsewhere: the canvas shows it but nothing edits it.
  bool read_only() const { return read_only_; }
  // While a run of this document goes, edits that change the graph (not the layout) are refused
  // with `reason` (edit_refused), undo and redo of such edits included.
  void lock_graph(const QString& reason) { graph_lock_ = reason; }
  void unlock_graph() { graph_lock_.clear(); }
  const QString& graph_lock() const { return graph_lock_; }
  // For edits of several steps (Delete, Add, Insert): refused as a whole, with edit_refused,
  // before their undo step opens, so that no empty step is left; true when refused.
  bool refuse_if_graph_locked();
  void undo();  // the undo stack's, unless the step would change a locked graph
  void redo();

  // Replaces everything (no undo): a new, opened or attached pipeline.
  void reset(const spec::PipelineSpec& spec, const QString& file, bool read_only = false);
  // Reads a pipeline file; throws SpecError naming the file, line and column of what is wrong.
  // Stages without a position are laid out.
  void open(const QString& file);
  // Writes atomically and marks the document clean; throws Error when the file cannot be written.
  // A file that was opened is saved as an edit of its text: comments and the hand-written layout
  // stay, and only what changed changes. Positions the app chose on open for a file without any
  // are not written unless a node was moved (then every position is).
  void save(const QString& file);

  // One undoable edit: `change` is applied to a copy of the spec. Edits in a row with the same
  // non-empty merge tag (moving one node, nudging one field) become one undo step.
  void edit(const QString& description, const std::function<void(spec::PipelineSpec&)>& change, const QString& merge_tag = {});

  // The edits users make, each one undo step.
  QString add_stage(const QString& op, QPointF position);  // returns the new stage's id
  void remove_stages(const QStringList& ids);
  // The stages `ids` as a pipeline of their own: their connections among themselves kept, those
  // from other stages left out (what Copy puts on the clipboard, as pipeline-file text).
  spec::PipelineSpec extract_stages(const QStringList& ids) const;
  // Adds `stages` as one undo step (Paste, Duplicate): each renamed where its id is taken, their
  // inputs among themselves following, an input naming any other stage dropped, every position
  // moved by `offset`. Returns the new ids, in order.
  QStringList paste_stages(const spec::PipelineSpec& stages, QPointF offset);
  // Into input `input` of `to` (-1: the next free input of a combine, the only one of others);
  // an input a combine already has is replaced, one past its last is added.
  void connect_stages(const QString& from, const QString& to, int input = -1);
  void move_stage(const QString& id, QPointF position);
  void set_param(const QString& id, const QString& name, const std::optional<QString>& value);  // nullopt: back to default
  // parallelism, buffer_size, error_policy (spec::ErrorPolicy), cycle_length, block_length,
  // interleave_deterministic (-1: the pipeline's, 0: no, 1: yes).
  void set_stage_field(const QString& id, const QString& field, int value);
  // seed, error_policy (spec::ErrorPolicy), deterministic and fuse_stages (-1: default, 0, 1).
  void set_option(const QString& option, std::int64_t value);
  // Renames and rewires the consumer; returns why not when the id is empty or taken.
  std::optional<QString> rename_stage(const QString& id, const QString& new_id);
  void arrange();  // left-to-right layout of every stage
  // Applies a report's suggestion as one undo step; returns why not (its stage is not in this
  // pipeline, the document is read-only or locked, the change is advice only).
  std::optional<QString> apply_suggestion(const Suggestion& suggestion);

  // Why nothing can be connected out of `from` (a sink), or nothing when something can.
  std::optional<QString> output_refusal(const QString& from) const;
  // Why `from`'s output cannot go into `to`, or nothing when it can.
  std::optional<QString> connection_refusal(const QString& from, const QString& to, int input = -1) const;
  // The input of `to` that a connection dropped on its port `input` (-1: its body) would take.
  int connection_slot(const QString& to, int input) const;

  int index_of(const QString& id) const;  // -1 when absent
  std::shared_ptr<const RegisteredOperator> operator_of(const QString& id) const;
  // Every problem validation finds, as the CLI would report it.
  const std::vector<Problem>& problems() const { return problems_; }

  // Positions for every stage, in layers left to right as Graphviz's `dot` draws them (see
  // layered_layout.hpp). lay_out_in_columns is the plainer placement used when Graphviz cannot:
  // each stage right of its inputs, a branch in rows of its own, a long chain wrapped.
  static void lay_out(spec::PipelineSpec& spec);
  static void lay_out_in_columns(spec::PipelineSpec& spec);
  // Lays out every stage when any has no position (a hand-written file); true when it did.
  static bool lay_out_unless_placed(spec::PipelineSpec& spec);

 signals:
  void changed();
  void file_changed(const QString& file);
  void edit_refused(const QString& reason);

 private:
  friend class SpecEdit;
  void replace_spec(const spec::PipelineSpec& spec);
  void revalidate();
  QString unused_id(const QString& base) const;

  const Registry& registry_;
  spec::PipelineSpec spec_;
  QString file_;
  std::string file_text_;  // the text as read or last saved; save edits it
  std::map<std::string, spec::Layout> laid_out_on_open_;  // stage id -> position the app chose
  bool read_only_ = false;
  QString graph_lock_;
  QUndoStack undo_;
  std::vector<Problem> problems_;
};

// Layout fields are the only difference the app may make to a file it opens and saves.
bool same_pipeline_ignoring_layout(const spec::PipelineSpec& a, const spec::PipelineSpec& b);

}  // namespace sluice::studio
