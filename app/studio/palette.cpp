#include "palette.hpp"

#include <QKeyEvent>
#include <QMimeData>
#include <QVBoxLayout>
#include <map>

#include "canvas.hpp"

namespace sluice::studio {

void OperatorTree::keyPressEvent(QKeyEvent* event) {
  if ((event->key() == Qt::Key_Return || event->key() == Qt::Key_Enter) && currentItem()) {
    emit entry_chosen(currentItem());
    return;
  }
  QTreeWidget::keyPressEvent(event);
}

QStringList OperatorTree::mimeTypes() const { return {kOperatorMime}; }

QMimeData* OperatorTree::mimeData(const QList<QTreeWidgetItem*>& items) const {
  for (auto* item : items) {
    if (!item) continue;
    const QString op = item->data(0, kOperatorRole).toString();
    if (op.isEmpty()) continue;
    auto* mime = new QMimeData;
    mime->setData(kOperatorMime, op.toUtf8());
    mime->setText(op);
    return mime;
  }
  return nullptr;
}

Palette::Palette(const Registry& registry, QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  search_ = new QLineEdit;
  search_->setPlaceholderText("Search operators");
  search_->setClearButtonEnabled(true);
  tree_ = new OperatorTree;
  tree_->setHeaderHidden(true);
  tree_->setDragEnabled(true);
  tree_->setDragDropMode(QAbstractItemView::DragOnly);
  no_match_ = new QLabel;
  no_match_->setObjectName("palette_no_match");
  no_match_->setWordWrap(true);
  no_match_->hide();
  layout->addWidget(search_);
  layout->addWidget(no_match_);
  layout->addWidget(tree_);

  // plugin -> kind -> operators, each level sorted by name.
  std::map<std::string, std::map<std::string, std::vector<const RegisteredOperator*>>> groups;
  for (const auto& op : registry.operators()) groups[op->plugin_name][operator_kind_name(op->info.kind)].push_back(op.get());
  for (const auto& [plugin, kinds] : groups) {
    auto* plugin_item = new QTreeWidgetItem(tree_, {QString::fromStdString(plugin)});
    plugin_item->setFlags(Qt::ItemIsEnabled);
    for (const auto& [kind, ops] : kinds) {
      auto* kind_item = new QTreeWidgetItem(plugin_item, {QString::fromStdString(kind) + "s"});
      kind_item->setFlags(Qt::ItemIsEnabled);
      for (const auto* op : ops) {
        auto* item = new QTreeWidgetItem(kind_item, {QString::fromStdString(op->info.name)});
        item->setData(0, OperatorTree::kOperatorRole, QString::fromStdString(op->info.name));
        item->setToolTip(0, QString::fromStdString(op->info.summary));
        item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled);
      }
    }
  }
  tree_->expandAll();
  connect(search_, &QLineEdit::textChanged, this, &Palette::filter);
  // A double click or Enter adds the stage in view (not "activated": whether a double click
  // activates depends on the style).
  auto request = [this](QTreeWidgetItem* item) {
    const QString op = item ? item->data(0, OperatorTree::kOperatorRole).toString() : QString();
    if (!op.isEmpty()) emit add_requested(op);
  };
  connect(tree_, &QTreeWidget::itemDoubleClicked, this, [request](QTreeWidgetItem* item) { request(item); });
  connect(tree_, &OperatorTree::entry_chosen, this, [request](QTreeWidgetItem* item) { request(item); });
  // Enter in the search adds the highlighted match (the first one, until another is chosen).
  connect(search_, &QLineEdit::returnPressed, this, [this, request] {
    QTreeWidgetItem* current = tree_->currentItem();
    if (!current || current->isHidden() || current->childCount() > 0) current = first_visible_operator();
    request(current);
  });
}

QTreeWidgetItem* Palette::first_visible_operator() const {
  // A match on the name beats one found only in a summary ("shuf": shuffle, not list_files).
  const QString needle = search_->text().trimmed();
  QTreeWidgetItem* first = nullptr;
  for (QTreeWidgetItemIterator it(tree_); *it; ++it) {
    bool shown = true;
    for (QTreeWidgetItem* up = *it; up && shown; up = up->parent()) shown = !up->isHidden();
    if (!shown || (*it)->childCount() > 0 || (*it)->data(0, OperatorTree::kOperatorRole).toString().isEmpty()) continue;
    if (!needle.isEmpty() && (*it)->text(0).contains(needle, Qt::CaseInsensitive)) return *it;
    if (!first) first = *it;
  }
  return first;
}

QTreeWidgetItem* Palette::item_for(const QString& op) const {
  for (QTreeWidgetItemIterator it(tree_); *it; ++it)
    if ((*it)->data(0, OperatorTree::kOperatorRole).toString() == op) return *it;
  return nullptr;
}

void Palette::filter(const QString& text) {
  const QString needle = text.trimmed();
  // Leaves match on name or summary, or on a group above them (its plugin, its kind); a group
  // shows when any leaf below it does.
  std::function<bool(QTreeWidgetItem*, bool)> apply = [&](QTreeWidgetItem* item, bool group_matched) {
    const bool here = needle.isEmpty() || group_matched || item->text(0).contains(needle, Qt::CaseInsensitive);
    if (item->childCount() == 0) {
      const bool match = here || item->toolTip(0).contains(needle, Qt::CaseInsensitive);
      item->setHidden(!match);
      return match;
    }
    bool any = false;
    for (int i = 0; i < item->childCount(); ++i) any = apply(item->child(i), here) || any;
    item->setHidden(!any);
    return any;
  };
  bool any = false;
  for (int i = 0; i < tree_->topLevelItemCount(); ++i) any = apply(tree_->topLevelItem(i), false) || any;
  no_match_->setText(QString("No operator's name, group or description contains \u201c%1\u201d.").arg(needle));
  no_match_->setVisible(!any);
  if (!needle.isEmpty()) tree_->setCurrentItem(first_visible_operator());
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_palette.cpp"
