// The canvas from the keyboard: arrow keys move the selection from stage to stage along the
// pipeline, Shift adds to it (canvas.hpp: PipelineScene::select_neighbour).
#include <cmath>
#include <limits>

#include <QGraphicsView>

#include "canvas.hpp"

namespace sluice::studio {

namespace {
QPointF centre(const NodeItem* n) { return n->sceneBoundingRect().center(); }
}  // namespace

bool PipelineScene::select_neighbour(int key, bool extend) {
  if (key != Qt::Key_Left && key != Qt::Key_Right && key != Qt::Key_Up && key != Qt::Key_Down) return false;
  const auto& spec = document_.spec();
  if (spec.stage_size() == 0) return false;
  const QString from = selection_order_.isEmpty() ? QString() : selection_order_.back();
  NodeItem* here = nodes_.value(from);
  QString next;
  if (!here) {
    next = QString::fromStdString(spec.stage(0).id());  // nothing selected: where the data starts
  } else if (key == Qt::Key_Right) {
    for (const auto& st : spec.stage())
      for (const auto& in : st.input())
        if (next.isEmpty() && QString::fromStdString(in) == from) next = QString::fromStdString(st.id());
  } else if (key == Qt::Key_Left) {
    for (const auto& st : spec.stage())
      if (QString::fromStdString(st.id()) == from && st.input_size() > 0) next = QString::fromStdString(st.input(0));
  } else {
    // The nearest stage whose centre lies above (or below) this one's, closer in height counting
    // more than sideways: the stage under it in a branch, or in the row below a long chain's.
    const bool down = key == Qt::Key_Down;
    double best = std::numeric_limits<double>::max();
    for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
      const QPointF d = centre(it.value()) - centre(here);
      if (it.value() == here || (down ? d.y() <= 1 : d.y() >= -1)) continue;
      const double cost = std::abs(d.y()) + 2 * std::abs(d.x());
      if (cost < best) {
        best = cost;
        next = it.key();
      }
    }
  }
  NodeItem* target = nodes_.value(next);
  if (!target) return true;  // at an end: the selection stays
  if (!extend) clearSelection();
  target->setSelected(true);
  if (extend) {  // the stage reached is the one the next key moves from
    selection_order_.removeAll(next);
    selection_order_ << next;
  }
  for (QGraphicsView* v : views()) v->ensureVisible(target);
  return true;
}

}  // namespace sluice::studio
