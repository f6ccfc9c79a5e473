#pragma once
// Every operator the registry knows, grouped by plugin and kind, filtered as the user types;
// dragged onto the canvas (or double-clicked) to add a stage.
#include <QLabel>
#include <QLineEdit>
#include <QTreeWidget>
#include <QWidget>

#include "sluice/core/registry.hpp"

namespace sluice::studio {

class OperatorTree final : public QTreeWidget {
  Q_OBJECT
 public:
  using QTreeWidget::QTreeWidget;
  static constexpr int kOperatorRole = Qt::UserRole + 1;

 signals:
  void entry_chosen(QTreeWidgetItem* item);  // Enter on an entry

 protected:
  void keyPressEvent(QKeyEvent* event) override;
  QStringList mimeTypes() const override;
  QMimeData* mimeData(const QList<QTreeWidgetItem*>& items) const override;
};

class Palette final : public QWidget {
  Q_OBJECT
 public:
  explicit Palette(const Registry& registry, QWidget* parent = nullptr);
  OperatorTree* tree() { return tree_; }
  QLineEdit* search() { return search_; }
  QTreeWidgetItem* item_for(const QString& op) const;
  // Shows only operators whose name, group (plugin or kind: "map" finds the maps) or summary
  // contains the text, the first match highlighted; says so when none does.
  void filter(const QString& text);
  QTreeWidgetItem* first_visible_operator() const;
  QLabel* no_match() const { return no_match_; }  // shown when nothing matches

 signals:
  void add_requested(const QString& op);

 private:
  QLineEdit* search_;
  OperatorTree* tree_;
  QLabel* no_match_;
};

}  // namespace sluice::studio
