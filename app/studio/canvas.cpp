#include "canvas.hpp"

#include <algorithm>

#include <QContextMenuEvent>
#include <QFontInfo>

#include <QGraphicsSceneMouseEvent>
#include <QKeyEvent>
#include <QMimeData>
#include <QPainter>
#include <QRegularExpression>
#include <QScrollBar>
#include <QStyleOptionGraphicsItem>
#include <QUndoStack>
#include <QWheelEvent>
#include <cmath>

namespace sluice::studio {

QString short_number(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return QString::number(v / 1e9, 'f', 1) + "G";
  if (a >= 1e6) return QString::number(v / 1e6, 'f', 1) + "M";
  if (a >= 1e4) return QString::number(v / 1e3, 'f', 1) + "k";
  if (a >= 100) return QString::number(v, 'f', 0);
  return QString::number(v, 'f', 1);
}

QColor occupancy_colour(double fill) {
  fill = std::clamp(fill, 0.0, 1.0);
  // Hue from 0 (red: the consumer starves) through 120 (green) to 220 (blue: the consumer is
  // slower than the producer and the buffer is full).
  return QColor::fromHsvF(static_cast<float>(fill * 220.0 / 360.0), 0.75f, 0.85f);
}

// ---- NodeItem ----

NodeItem::NodeItem(PipelineScene& scene, QString id) : scene_(scene), id_(std::move(id)) {
  setFlags(ItemIsMovable | ItemIsSelectable | ItemSendsGeometryChanges);
  setZValue(1);
}

void NodeItem::sync(const spec::Stage& stage, const RegisteredOperator* op, bool has_problem) {
  op_ = QString::fromStdString(stage.op());
  per_input_ = stage.per_input();
  known_ = op != nullptr;
  summary_ = op ? QString::fromStdString(op->info.summary) : QString("no plugin loaded here has an operator '%1'").arg(op_);
  const int inputs = stage.input_size();
  if (op && op->info.kind == OperatorKind::Source) input_ports_ = 0;
  else if (op && op->info.kind == OperatorKind::Combine) {
    const bool any = op->info.max_inputs == kAnyNumberOfInputs;
    input_ports_ = std::max(op->info.min_inputs, any ? inputs + 1 : std::min(inputs + 1, op->info.max_inputs));
  } else input_ports_ = std::max(1, inputs);
  gives_output_ = !op || op->info.kind != OperatorKind::Sink;
  has_problem_ = has_problem;
  setPos(stage.layout().x(), stage.layout().y());
  update_tooltip();
  update();
}

void NodeItem::set_live(const std::optional<LiveStage>& live) {
  live_ = live;
  update_tooltip();
  update();
}

void NodeItem::update_tooltip() {
  QString tip = QString("<b>%1</b> (%2)<br>%3").arg(id_, op_, summary_.toHtmlEscaped());
  if (per_input_) tip += "<br>Runs once per input of the interleave before it, on that stage's readers.";
  if (live_ && live_->workers_tuned)
    tip += QString("<br>Autotuned: %1 of at most %2 workers now (the Log and the Verdict say why).").arg(live_->workers).arg(live_->max_workers);
  if (live_)
    tip += QString("<br>%1 elements/s %2.")
               .arg(short_number(live_->elements_per_s), live_->averages ? "over the whole run (the report's figure)" : "over the last 2 s");
  if (live_ && live_->pass_elements > 0) tip += "<br>" + pass_text() + " elements read.";
  if (live_ && live_->bottleneck)
    tip += QString("<br><br><b>Bottleneck%1.</b> ").arg(live_->lost.isEmpty() ? "" : " when last seen") + live_->bottleneck_reason.toHtmlEscaped();
  if (live_ && !live_->failure.isEmpty()) tip += "<br><br><b>The run failed here.</b> " + live_->failure.toHtmlEscaped();
  if (live_ && !live_->lost.isEmpty())
    tip += "<br><br><b>Connection lost</b> (numbers as last seen): " + live_->lost.toHtmlEscaped();
  setToolTip(tip);
}

int NodeItem::port_at(QPointF scene_pos) const {
  const double grab = kPortRadius + 5;
  if (QLineF(scene_pos, output_port()).length() <= grab) return 1;
  for (int k = 0; k < input_ports_; ++k)
    if (QLineF(scene_pos, input_port(k)).length() <= grab) return -1 - k;
  return 0;
}

QRectF NodeItem::boundingRect() const {
  const double m = kPortRadius + 3;
  return QRectF(-m, -m, kWidth + 2 * m, kHeight + 2 * m);
}

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  paint_body(p);
  // Zoomed out (Fit on a long pipeline, a small window), the node shows fewer lines in larger
  // type, so that its name and rate stay readable at any zoom Fit chooses.
  const double zoom = QStyleOptionGraphicsItem::levelOfDetailFromTransform(p->worldTransform());
  if (zoom < kDetailedZoom) paint_compact_text(p, zoom);
  else paint_detailed_text(p);
  if (live_ && live_->failure.isEmpty()) paint_busy_gauge(p);  // a failed stage's face holds its cause there
  paint_ports(p);
}

void NodeItem::paint_body(QPainter* p) {
  p->setRenderHint(QPainter::Antialiasing);
  const QRectF body(0, 0, kWidth, kHeight);
  QColor border(90, 96, 110);
  double border_width = 1.2;
  if (has_problem_) border = QColor(200, 60, 50);
  if (outlined_as_bottleneck()) {
    border = QColor(230, 120, 0);
    border_width = 4;
  }
  const bool failed_here = live_ && !live_->failure.isEmpty();
  if (failed_here) {
    border = QColor(200, 30, 30);
    border_width = 4;
  }
  if (isSelected()) {
    border = QColor(40, 110, 230);
    border_width = std::max(border_width, 2.5);
  }
  p->setPen(QPen(border, border_width));
  p->setBrush(known_ && !failed_here ? QColor(250, 251, 253) : QColor(250, 232, 230));
  p->drawRoundedRect(body, 8, 8);
}

QString failure_cause(const QString& message) {
  QString text = message.section('\n', 0, 0).trimmed();
  // "stage 'files' (list_files) could not start: ...", "stage 'read': ..."
  static const QRegularExpression stage_prefix("^(error: )?stage '[^']*'( \\([^)]*\\))?( could not start)?: ");
  text.remove(stage_prefix);
  // "s3://bucket/data/: Could not resolve host: ...", "/data/a.tfrecord: truncated ..."
  static const QRegularExpression location("^(\\S+://\\S*|/\\S*): ");
  const auto found = location.match(text);
  if (found.hasMatch() && found.capturedLength() < text.size()) text = text.mid(found.capturedLength());
  return text;
}

namespace {
// Fits `text` in `width` by shortening its longest word where that is enough, so that the words
// around it stay whole: a path or URI keeps its end (the folder's or file's name), another word its
// ends. Otherwise the text's end goes.
QString fit_line(const QString& text, const QFontMetrics& metrics, int width) {
  const int excess = metrics.horizontalAdvance(text) - width;
  if (excess <= 0) return text;
  QStringList words = text.split(' ');
  const auto longest = std::max_element(words.begin(), words.end(), [](const QString& a, const QString& b) { return a.size() < b.size(); });
  const QString whole = *longest;
  const int least = metrics.horizontalAdvance(QString::fromUtf8("\u2026/data"));
  // A line that fits by its advance is kept as it is: elidedText() measures otherwise and shortened
  // such lines at their end ("...does not ex..."), for some letters in a path and not others.
  // Widths do not add up exactly either (kerning, the ellipsis): a line still too wide shortens the
  // word again by what it exceeds.
  for (int kept = metrics.horizontalAdvance(whole) - excess, round = 0; kept >= least && round < 4; ++round) {
    *longest = metrics.elidedText(whole, whole.contains('/') ? Qt::ElideLeft : Qt::ElideMiddle, kept);
    const QString line = words.join(' ');
    const int over = metrics.horizontalAdvance(line) - width;
    if (over <= 0) return line;
    kept -= over;
  }
  return metrics.elidedText(text, Qt::ElideRight, width);
}

// Words laid on at most `lines` lines of `width`: a line takes words while they fit (a word too
// long for a line alone is shortened, a path keeping its end); the last line takes the rest.
QStringList wrap_words(const QString& text, const QFontMetrics& metrics, int width, int lines) {
  const QStringList words = text.split(' ', Qt::SkipEmptyParts);
  QStringList out;
  qsizetype next = 0;
  while (next < words.size() && out.size() + 1 < lines) {
    QString line;
    for (; next < words.size(); ++next) {
      QString word = words[next];
      if (line.isEmpty() && metrics.horizontalAdvance(word) > width)
        word = metrics.elidedText(word, word.contains('/') ? Qt::ElideLeft : Qt::ElideRight, width);
      const QString longer = line.isEmpty() ? word : line + ' ' + word;
      if (!line.isEmpty() && metrics.horizontalAdvance(longer) > width) break;
      line = longer;
    }
    out << line;
  }
  if (next < words.size()) out << fit_line(words.mid(next).join(' '), metrics, width);
  return out;
}
}  // namespace

QStringList failure_face_lines(const QString& message, const QFontMetrics& metrics, int width) {
  const QString cause = failure_cause(message);
  // "what failed: why": the why ("the folder ... does not exist") on lines of its own, never
  // pushed out by a long what.
  const qsizetype colon = cause.indexOf(": ");
  if (colon <= 0) return wrap_words("failed: " + cause, metrics, width, kFailureLines);
  return QStringList{fit_line("failed: " + cause.left(colon), metrics, width)} + wrap_words(cause.mid(colon + 2), metrics, width, kFailureLines - 1);
}

QString NodeItem::rate_text() const {
  if (!live_->failure.isEmpty()) return "failed: " + failure_cause(live_->failure);
  const bool lost = !live_->lost.isEmpty();
  QString rates = QString("%1%2/s").arg(lost ? "lost \u00b7 last " : live_->averages ? "avg " : "", short_number(live_->elements_per_s));
  if (live_->bytes_per_s > 0) rates += QString("  %1B/s").arg(short_number(live_->bytes_per_s));
  if (live_->skipped) rates += QString("  %1 skipped").arg(live_->skipped);
  return rates;
}

QColor NodeItem::rate_colour() const {
  if (!live_->failure.isEmpty()) return QColor(170, 20, 20);
  return live_->lost.isEmpty() ? QColor(20, 20, 20) : QColor(150, 150, 150);
}

QString NodeItem::pass_text() const {
  return QString("Epoch %1: %2 of %3").arg(live_->pass_epoch).arg(live_->pass_position).arg(live_->pass_elements);
}

void NodeItem::paint_detailed_text(QPainter* p) {
  QFont title = p->font();
  title.setBold(true);
  p->setFont(title);
  p->setPen(Qt::black);
  p->drawText(QRectF(10, 5, kWidth - 20, 18), Qt::AlignLeft | Qt::AlignVCenter, p->fontMetrics().elidedText(id_, Qt::ElideRight, int(kWidth - 20)));
  title.setBold(false);
  p->setFont(title);
  p->setPen(QColor(95, 100, 110));
  // A per-input stage says so where its operator is named: it runs once per input of the
  // interleave before it, not over the whole stream.
  QString kind = per_input_ ? op_ + QString::fromUtf8(" \u00b7 per input") : op_;
  // Its workers while a run is shown; the autotuner's count is marked as such.
  if (live_ && live_->workers_tuned) kind += QString::fromUtf8(" \u00b7 %1 wk auto").arg(live_->workers);
  else if (live_ && live_->workers > 1) kind += QString::fromUtf8(" \u00b7 %1 wk").arg(live_->workers);
  p->drawText(QRectF(10, 23, kWidth - 20, 16), Qt::AlignLeft | Qt::AlignVCenter, p->fontMetrics().elidedText(kind, Qt::ElideRight, int(kWidth - 20)));
  if (!live_) return;
  p->setPen(rate_colour());
  if (!live_->failure.isEmpty()) {  // the cause, small, where the rates, the detail and the gauge go
    QFont small = p->font();
    small.setPointSizeF(small.pointSizeF() * 0.85);
    p->setFont(small);
    const QStringList lines = failure_face_lines(live_->failure, p->fontMetrics(), int(kWidth - 20));
    const double line_height = (kHeight - 42) / kFailureLines;
    for (int k = 0; k < lines.size(); ++k)
      p->drawText(QRectF(10, 39 + line_height * k, kWidth - 20, line_height), Qt::AlignLeft | Qt::AlignVCenter, lines[k]);
    return;
  }
  p->drawText(QRectF(10, 40, kWidth - 20, 16), Qt::AlignLeft | Qt::AlignVCenter,
              p->fontMetrics().elidedText(rate_text(), Qt::ElideRight, int(kWidth - 20)));
  // Under the rates, small: a feed sink's devices, or a source's place in its epoch.
  QString detail = live_->devices.join("; ");
  if (detail.isEmpty() && live_->pass_elements > 0) detail = pass_text();
  if (!detail.isEmpty()) {
    QFont small = p->font();
    small.setPointSizeF(small.pointSizeF() * 0.8);
    p->setFont(small);
    p->drawText(QRectF(10, 55, kWidth - 20, 12), Qt::AlignLeft | Qt::AlignVCenter, p->fontMetrics().elidedText(detail, Qt::ElideRight, int(kWidth - 20)));
  }
}

namespace {
// When zoomed out: the name, bold, and the rate under it, above the busy gauge.
const QRectF kCompactNameLine(8, 2, NodeItem::kWidth - 16, 38), kCompactRateLine(8, 40, NodeItem::kWidth - 16, 30);

// Type a third larger on screen than the detailed view's (fewer lines, each worth reading at a
// glance), as large as the line holds.
QFont compact_font(QFont font, double zoom, double line_height, bool bold) {
  font.setPixelSize(int(std::min(1.3 * QFontInfo(font).pixelSize() / zoom, line_height - 4)));
  font.setBold(bold);
  return font;
}
}  // namespace

void NodeItem::paint_compact_text(QPainter* p, double zoom) {
  const QFont base = p->font();
  p->setFont(compact_font(base, zoom, kCompactNameLine.height(), true));
  p->setPen(Qt::black);
  p->drawText(kCompactNameLine, Qt::AlignLeft | Qt::AlignVCenter, p->fontMetrics().elidedText(id_, Qt::ElideRight, int(kCompactNameLine.width())));
  if (!live_) return;
  p->setFont(compact_font(base, zoom, kCompactRateLine.height(), false));
  p->setPen(rate_colour());
  p->drawText(kCompactRateLine, Qt::AlignLeft | Qt::AlignVCenter, compact_rate_line(p->fontMetrics()));
}

QString NodeItem::compact_rate_line(const QFontMetrics& metrics) const {
  const QStringList texts = compact_rate_texts();
  for (const QString& text : texts)
    if (metrics.horizontalAdvance(text) <= kCompactRateLine.width()) return text;
  return metrics.elidedText(texts.back(), Qt::ElideRight, int(kCompactRateLine.width()));
}

namespace {
// The rate line's type at `zoom`, as paint_compact_text sets it from the scene's font.
QFontMetrics compact_rate_metrics(const QGraphicsItem& item, double zoom) {
  return QFontMetrics(compact_font(item.scene() ? item.scene()->font() : QFont(), zoom, kCompactRateLine.height(), false));
}
}  // namespace

bool NodeItem::compact_rate_line_fits(double zoom) const {
  const QFontMetrics metrics = compact_rate_metrics(*this, zoom);
  return !live_ || metrics.horizontalAdvance(compact_rate_line(metrics)) <= kCompactRateLine.width();
}

QString NodeItem::compact_rate_line(double zoom) const { return live_ ? compact_rate_line(compact_rate_metrics(*this, zoom)) : QString(); }

QStringList NodeItem::compact_rate_texts() const {
  if (!live_->failure.isEmpty()) return {rate_text()};
  const QString rate = QString("%1/s").arg(short_number(live_->elements_per_s));
  if (!live_->lost.isEmpty()) return {"lost \u00b7 last " + rate, "lost " + rate};
  QStringList texts;
  if (live_->workers_tuned)
    texts << QString::fromUtf8("%1 \u00b7 %2 wk auto").arg(rate).arg(live_->workers) << QString::fromUtf8("%1 \u00b7 %2 wk").arg(rate).arg(live_->workers);
  if (live_->averages) texts << "avg " + rate;
  return texts << rate;
}

void NodeItem::paint_busy_gauge(QPainter* p) {
  // The share of its workers' time spent working.
  const QRectF gauge(10, kHeight - 13, kWidth - 20, 6);
  p->setPen(Qt::NoPen);
  p->setBrush(QColor(225, 228, 234));
  p->drawRoundedRect(gauge, 3, 3);
  QRectF level = gauge;
  level.setWidth(gauge.width() * std::clamp(live_->busy, 0.0, 1.0));
  const bool lost = !live_->lost.isEmpty();
  p->setBrush(lost ? QColor(170, 170, 170) : live_->bottleneck ? QColor(230, 120, 0) : QColor(70, 140, 90));
  p->drawRoundedRect(level, 3, 3);
}

void NodeItem::paint_ports(QPainter* p) {
  p->setPen(QPen(QColor(70, 75, 85), 1.2));
  p->setBrush(QColor(70, 120, 200));
  // Only ports that take a connection: a source has no input, a sink no output.
  for (int k = 0; k < input_ports_; ++k) p->drawEllipse(input_port_local(k), kPortRadius, kPortRadius);
  if (gives_output_) p->drawEllipse(QPointF(kWidth, kHeight / 2), kPortRadius, kPortRadius);
}

QVariant NodeItem::itemChange(GraphicsItemChange change, const QVariant& value) {
  if (change == ItemPositionHasChanged) scene_.node_position_changed(this);
  if (change == ItemSelectedHasChanged) update();
  return QGraphicsObject::itemChange(change, value);
}

// ---- EdgeItem ----

EdgeItem::EdgeItem(NodeItem* from, NodeItem* to, int input) : from_(from), to_(to), input_(input) {
  setFlag(ItemIsSelectable);
  setZValue(0);
  adjust();
  update_tooltip();
}

void EdgeItem::adjust() {
  prepareGeometryChange();
  const QPointF a = from_->output_port(), b = to_->input_port(input_);
  QPainterPath path(a);
  if (b.x() >= a.x() + 40) {
    const double bend = std::max(40.0, (b.x() - a.x()) / 2);
    path.cubicTo(a + QPointF(bend, 0), b - QPointF(bend, 0), b);
  } else {
    // Back to the left (a chain wrapped to the next row): around the nodes, through the gap
    // between the rows.
    const double gap_y = b.y() > a.y() ? (a.y() + b.y()) / 2 : std::min(a.y(), b.y()) - NodeItem::kHeight;
    path.lineTo(a.x() + 20, a.y());
    path.lineTo(a.x() + 20, gap_y);
    path.lineTo(b.x() - 20, gap_y);
    path.lineTo(b.x() - 20, b.y());
    path.lineTo(b);
  }
  setPath(path);
}

QRectF EdgeItem::fill_bar_rect() const { return QRectF(bar_center_.x() - 23, bar_center_.y() - 6, 46, 12); }

void EdgeItem::set_bar_center(QPointF center) {
  if (center == bar_center_) return;
  prepareGeometryChange();
  bar_center_ = center;
  update();
}

QRectF EdgeItem::boundingRect() const { return QGraphicsPathItem::boundingRect().united(fill_bar_rect()).adjusted(-6, -6, 6, 6); }

QPainterPath EdgeItem::shape() const {
  QPainterPathStroker band;
  band.setWidth(12);
  QPainterPath out = band.createStroke(path());
  if (buffer()) out.addRect(fill_bar_rect());
  return out;
}

std::optional<BufferView> EdgeItem::buffer() const {
  const auto& live = from_->live();
  // Fused stages hand elements over inside one worker: no buffer between them.
  if (!live || (to_->live() && to_->live()->fused)) return std::nullopt;
  BufferView own{live->buffer_level, live->buffer_capacity, live->buffer_bytes, live->buffer_byte_limit};
  BufferView view = live->reader_buffers.value(to_->id(), own);
  if (view.capacity == 0) return std::nullopt;
  return view;
}

namespace {
QString bytes_text(std::uint64_t bytes) {
  return bytes >= 1000000 ? QString("%1 MB").arg(bytes / 1e6, 0, 'f', 1)
         : bytes >= 1000  ? QString("%1 KB").arg(bytes / 1e3, 0, 'f', 1)
                          : QString("%1 bytes").arg(bytes);
}
}  // namespace

void EdgeItem::live_changed() {
  prepareGeometryChange();  // its shape takes the bar in or out
  update_tooltip();
  update();
}

void EdgeItem::update_tooltip() {
  const QString between = QString("'%1' -> '%2'").arg(from_->id(), to_->id());
  const auto& live = from_->live();
  QString tip;
  if (!live) tip = QString("%1: its buffer's level shows here while a run is shown").arg(between);
  else if (to_->live() && to_->live()->fused) tip = QString("%1: fused, handed over inside one worker, with no buffer between").arg(between);
  else if (auto b = buffer()) {
    const double percent = 100.0 * b->level / b->capacity;
    if (live->averages) {
      tip = QString("Buffer %1, over the run: %2% full on average (%3 of %4 elements)").arg(between).arg(percent, 0, 'f', 0).arg(b->level).arg(b->capacity);
    } else {
      tip = QString("Buffer %1: %2 of %3 elements (%4%), %5").arg(between).arg(b->level).arg(b->capacity).arg(percent, 0, 'f', 0).arg(bytes_text(b->bytes));
      if (b->byte_limit > 0) tip += QString(" of at most %1").arg(bytes_text(b->byte_limit));
    }
  }
  setToolTip(tip);
}

void EdgeItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  p->setRenderHint(QPainter::Antialiasing);
  // Fused stages hand elements over inside one worker: no buffer between them to draw.
  const bool fused = to_->live() && to_->live()->fused;
  QPen pen(isSelected() ? QColor(40, 110, 230) : QColor(110, 115, 125), isSelected() ? 3 : 2);
  if (fused) pen.setStyle(Qt::DashLine);
  p->setPen(pen);
  p->setBrush(Qt::NoBrush);
  p->drawPath(path());
  // The buffer between the stages, as a fill bar: level / capacity. A tee has one per reader.
  const auto b = buffer();
  if (!b) return;
  const double fill = double(b->level) / b->capacity;
  const QRectF bar = fill_bar_rect();
  p->setPen(QPen(QColor(80, 85, 95), 1));
  p->setBrush(Qt::white);
  p->drawRect(bar);
  QRectF level = bar.adjusted(1, 1, -1, -1);
  level.setWidth(level.width() * std::clamp(fill, 0.0, 1.0));
  p->setPen(Qt::NoPen);
  // A lost run's levels are as last seen, in grey as its nodes' numbers are.
  const bool lost = from_->live() && !from_->live()->lost.isEmpty();
  p->setBrush(lost ? QColor(175, 175, 175) : occupancy_colour(fill));
  p->drawRect(level);
}

// ---- PipelineScene ----

PipelineScene::PipelineScene(Document& document, QObject* parent) : QGraphicsScene(parent), document_(document) {
  setSceneRect(-2000, -2000, 6000, 4000);
  connect(&document_, &Document::changed, this, &PipelineScene::sync);
  // The order stages were selected in: the first is where a connection from the keyboard starts.
  connect(this, &QGraphicsScene::selectionChanged, this, [this] {
    const QStringList now = selected_stage_ids();
    selection_order_.erase(std::remove_if(selection_order_.begin(), selection_order_.end(), [&](const QString& id) { return !now.contains(id); }),
                           selection_order_.end());
    for (const QString& id : now)
      if (!selection_order_.contains(id)) selection_order_ << id;
  });
  sync();
}

PipelineScene::~PipelineScene() {
  // QGraphicsScene's destructor removes the items, which changes the selection after this part
  // is gone: the handler above must not hear it.
  disconnect(this, &QGraphicsScene::selectionChanged, this, nullptr);
}

QStringList PipelineScene::selection_order() const { return selection_order_; }

void PipelineScene::sync() {
  const auto& spec = document_.spec();
  QSet<QString> problem_stages;
  for (const auto& problem : document_.problems()) problem_stages.insert(QString::fromStdString(problem.stage));
  QSet<QString> present;
  for (const auto& st : spec.stage()) {
    const QString id = QString::fromStdString(st.id());
    present.insert(id);
    NodeItem* item = nodes_.value(id);
    if (!item) {
      item = new NodeItem(*this, id);
      addItem(item);
      nodes_.insert(id, item);
    }
    item->setFlag(QGraphicsItem::ItemIsMovable, !document_.read_only());
    auto op = document_.registry().find(st.op());
    item->sync(st, op.get(), problem_stages.contains(id));
    item->set_live(live_.contains(id) ? std::optional<LiveStage>(live_.value(id)) : std::nullopt);
  }
  // Edges are cheap: made again from the inputs each time.
  for (EdgeItem* e : edges_) {
    removeItem(e);
    delete e;
  }
  edges_.clear();
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (present.contains(it.key())) {
      ++it;
      continue;
    }
    NodeItem* gone = it.value();
    it = nodes_.erase(it);
    removeItem(gone);
    gone->deleteLater();  // it may be inside one of its own event handlers
  }
  for (const auto& st : spec.stage())
    for (int k = 0; k < st.input_size(); ++k) {
      NodeItem* from = nodes_.value(QString::fromStdString(st.input(k)));
      NodeItem* to = nodes_.value(QString::fromStdString(st.id()));
      if (!from || !to) continue;
      auto* edge = new EdgeItem(from, to, std::min(k, std::max(0, to->input_ports() - 1)));
      addItem(edge);
      edges_.push_back(edge);
    }
  place_fill_bars();
}

void PipelineScene::place_fill_bars() {
  QList<QRectF> taken;
  for (NodeItem* n : nodes_) taken << n->mapRectToScene(QRectF(0, 0, NodeItem::kWidth, NodeItem::kHeight)).adjusted(-3, -3, 3, 3);
  auto free = [&](const QRectF& r) {
    return std::none_of(taken.begin(), taken.end(), [&](const QRectF& t) { return t.intersects(r); });
  };
  for (EdgeItem* e : edges_) {
    const QPainterPath line = e->mapToScene(e->path());
    const double length = line.length();
    QPointF at = line.pointAtPercent(0.5);
    for (double back = 30; back <= length - 30; back += 6) {
      const QPointF p = line.pointAtPercent(line.percentAtLength(length - back));
      if (free(QRectF(p.x() - 23, p.y() - 6, 46, 12))) {
        at = p;
        break;
      }
    }
    e->set_bar_center(e->mapFromScene(at));
    taken << QRectF(at.x() - 23, at.y() - 6, 46, 12);
  }
}

EdgeItem* PipelineScene::edge_into(const QString& to, int input) const {
  for (EdgeItem* e : edges_)
    if (e->to()->id() == to && e->input() == input) return e;
  return nullptr;
}

QStringList PipelineScene::selected_stage_ids() const {
  QStringList ids;
  for (auto* item : selectedItems())
    if (auto* node = dynamic_cast<NodeItem*>(item)) ids.push_back(node->id());
  return ids;
}

QStringList PipelineScene::selected_edge_targets() const {
  QStringList ids;
  for (auto* item : selectedItems())
    if (auto* edge = dynamic_cast<EdgeItem*>(item)) ids.push_back(edge->to()->id());
  return ids;
}

QList<QPair<QString, int>> PipelineScene::selected_edges() const {
  QList<QPair<QString, int>> found;
  for (auto* item : selectedItems())
    if (auto* edge = dynamic_cast<EdgeItem*>(item)) found.push_back({edge->to()->id(), edge->input()});
  return found;
}

void PipelineScene::select_stage(const QString& id, bool reveal) {
  clearSelection();
  if (NodeItem* n = nodes_.value(id)) {
    n->setSelected(true);
    if (reveal)
      for (QGraphicsView* v : views()) v->ensureVisible(n);
  }
}

void PipelineScene::set_live(const QHash<QString, LiveStage>& live) {
  live_ = live;
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it)
    it.value()->set_live(live_.contains(it.key()) ? std::optional<LiveStage>(live_.value(it.key())) : std::nullopt);
  for (EdgeItem* e : edges_) e->live_changed();
}

void PipelineScene::mark_lost(const QString& why) {
  auto live = live_;
  for (auto& l : live) l.lost = why;
  set_live(live);
}

void PipelineScene::node_position_changed(NodeItem* node) {
  for (EdgeItem* e : edges_)
    if (e->from() == node || e->to() == node) e->adjust();
  place_fill_bars();
}

NodeItem* PipelineScene::node_under(QPointF scene_pos) const {
  for (auto* item : items(scene_pos))
    if (auto* n = dynamic_cast<NodeItem*>(item)) return n;
  // A drop on a port counts too (its circle reaches outside the body).
  for (NodeItem* n : nodes_)
    if (n->port_at(scene_pos) != 0) return n;
  return nullptr;
}

std::optional<QString> PipelineScene::drag_refusal(const NodeItem* target, int input) const {
  if (auto refusal = document_.output_refusal(drag_from_->id())) return refusal;
  return target ? document_.connection_refusal(drag_from_->id(), target->id(), input) : std::nullopt;
}

NodeItem* PipelineScene::drag_target(QPointF scene_pos, int* input) const {
  NodeItem* target = node_under(scene_pos);
  if (target == drag_from_) target = nullptr;  // letting go on its own node connects nothing
  if (input) *input = target && target->port_at(scene_pos) < 0 ? -1 - target->port_at(scene_pos) : -1;
  return target;
}

void PipelineScene::update_drag(QPointF scene_pos) {
  const QPointF a = drag_from_->output_port();
  QPainterPath path(a);
  path.cubicTo(a + QPointF(60, 0), scene_pos - QPointF(60, 0), scene_pos);
  drag_line_->setPath(path);
  int input = -1;
  NodeItem* target = drag_target(scene_pos, &input);
  const auto refusal = drag_refusal(target, input);
  if (refusal) drag_hint_ = "cannot connect: " + *refusal;
  else if (target && target->input_ports() > 1)
    drag_hint_ = QString("connect '%1' to input %2 of '%3'")
                     .arg(drag_from_->id())
                     .arg(document_.connection_slot(target->id(), input) + 1)
                     .arg(target->id());
  else if (target) drag_hint_ = QString("connect '%1' to '%2'").arg(drag_from_->id(), target->id());
  else drag_hint_ = QString("drop on a stage's input to connect '%1'").arg(drag_from_->id());
  drag_line_->setPen(QPen(refusal ? QColor(200, 50, 40) : QColor(40, 110, 230), 2, Qt::DashLine));
  drag_label_->setText(drag_hint_);
  drag_label_->setBrush(refusal ? QColor(200, 50, 40) : QColor(30, 30, 30));
  drag_label_->setPos(6, 3);
  drag_plate_->setRect(drag_label_->boundingRect().adjusted(0, 0, 12, 6));
  drag_plate_->setPen(QPen(refusal ? QColor(200, 50, 40) : QColor(150, 155, 165)));
  drag_plate_->setPos(scene_pos + QPointF(12, 10));
  emit hint(drag_hint_);
}

void PipelineScene::mousePressEvent(QGraphicsSceneMouseEvent* event) {
  if (event->button() == Qt::LeftButton && !document_.read_only()) {
    for (NodeItem* n : nodes_) {
      if (n->port_at(event->scenePos()) != 1) continue;
      drag_from_ = n;
      drag_line_ = addPath(QPainterPath(), QPen(QColor(40, 110, 230), 2, Qt::DashLine));
      drag_line_->setZValue(10);
      // The hint on a plate of its own, over whatever node it passes, at the same size on screen
      // whatever the zoom.
      drag_plate_ = addRect(QRectF(), QPen(QColor(150, 155, 165)), QColor(255, 255, 255, 240));
      drag_plate_->setFlag(QGraphicsItem::ItemIgnoresTransformations);
      drag_plate_->setZValue(11);
      drag_label_ = new QGraphicsSimpleTextItem(drag_plate_);
      update_drag(event->scenePos());
      event->accept();
      return;
    }
    moving_nodes_ = true;
  }
  QGraphicsScene::mousePressEvent(event);
}

void PipelineScene::mouseMoveEvent(QGraphicsSceneMouseEvent* event) {
  if (!drag_from_) {
    QGraphicsScene::mouseMoveEvent(event);
    return;
  }
  update_drag(event->scenePos());
  event->accept();
}

void PipelineScene::mouseReleaseEvent(QGraphicsSceneMouseEvent* event) {
  if (drag_from_) {
    int input = -1;
    NodeItem* target = drag_target(event->scenePos(), &input);
    const QString from = drag_from_->id();
    const auto refusal = drag_refusal(target, input);
    end_connection_drag();
    if (refusal) emit connection_refused(*refusal);
    else if (target) document_.connect_stages(from, target->id(), input);
    event->accept();
    return;
  }
  QGraphicsScene::mouseReleaseEvent(event);
  if (!moving_nodes_) return;
  moving_nodes_ = false;
  // Nodes dragged by hand: one undo step for all that moved.
  QList<NodeItem*> moved;
  for (NodeItem* n : nodes_) {
    int i = document_.index_of(n->id());
    if (i < 0) continue;
    const auto& layout = document_.spec().stage(i).layout();
    if (QPointF(layout.x(), layout.y()) != n->pos()) moved.push_back(n);
  }
  if (moved.isEmpty()) return;
  document_.undo_stack()->beginMacro(moved.size() == 1 ? QString("Move %1").arg(moved.front()->id()) : QString("Move %1 stages").arg(moved.size()));
  for (NodeItem* n : moved) document_.move_stage(n->id(), n->pos());
  document_.undo_stack()->endMacro();
}

void PipelineScene::end_connection_drag() {
  drag_from_ = nullptr;
  delete drag_line_;
  drag_line_ = nullptr;
  delete drag_plate_;  // and the label on it
  drag_plate_ = nullptr;
  drag_label_ = nullptr;
  drag_hint_.clear();
  emit hint({});
}

// ---- CanvasView ----

CanvasView::CanvasView(PipelineScene& scene, QWidget* parent) : QGraphicsView(&scene, parent) {
  setRenderHint(QPainter::Antialiasing);
  setDragMode(RubberBandDrag);
  setTransformationAnchor(AnchorUnderMouse);
  setAcceptDrops(true);
  setViewportUpdateMode(BoundingRectViewportUpdate);
  setBackgroundBrush(QColor(238, 240, 244));
  // The empty canvas's hint goes with the first stage and comes back with New: the whole
  // viewport is drawn again then, not only the items that changed.
  connect(&scene, &QGraphicsScene::changed, this, [this] {
    const bool empty = this->scene()->items().isEmpty();
    if (empty == showed_empty_hint_) return;
    showed_empty_hint_ = empty;
    viewport()->update();
  });
}

void CanvasView::zoom_by(double factor) {
  auto_fit_ = false;
  const double current = transform().m11();
  const double next = std::clamp(current * factor, 0.2, 4.0);
  scale(next / current, next / current);
}

void CanvasView::fit() {
  auto_fit_ = true;
  QRectF bounds = scene()->itemsBoundingRect();
  if (bounds.isEmpty()) {
    // Nothing to fit (New): back to 1:1 at the origin, where the first stage goes.
    setTransform(QTransform());
    centerOn(QPointF(0, 0));
    return;
  }
  const QRectF framed = bounds.adjusted(-40, -40, 40, 40);
  fitInView(framed, Qt::KeepAspectRatio);
  if (transform().m11() > 1.0) setTransform(QTransform());
}

void CanvasView::drawForeground(QPainter* painter, const QRectF& rect) {
  QGraphicsView::drawForeground(painter, rect);
  if (!scene()->items().isEmpty()) return;
  // An empty canvas says how to start.
  painter->save();
  painter->resetTransform();
  painter->setPen(QColor(120, 125, 135));
  painter->drawText(viewport()->rect(), Qt::AlignCenter | Qt::TextWordWrap,
                    "Drag an operator from the list on the left, or press Ctrl+F and type its name.\n"
                    "Ctrl+O opens a pipeline file; Run > Attach follows a headless run.");
  painter->restore();
}

void CanvasView::resizeEvent(QResizeEvent* event) {
  QGraphicsView::resizeEvent(event);
  if (auto_fit_) fit();
}

void CanvasView::wheelEvent(QWheelEvent* event) {
  zoom_by(std::pow(1.0015, event->angleDelta().y()));
  event->accept();
}

void CanvasView::mousePressEvent(QMouseEvent* event) {
  if (event->button() == Qt::MiddleButton || (event->button() == Qt::LeftButton && space_held_)) {
    panning_ = true;
    pan_last_ = event->pos();
    viewport()->setCursor(Qt::ClosedHandCursor);
    event->accept();
    return;
  }
  QGraphicsView::mousePressEvent(event);
}

void CanvasView::mouseMoveEvent(QMouseEvent* event) {
  if (panning_) {
    const QPoint delta = event->pos() - pan_last_;
    pan_last_ = event->pos();
    horizontalScrollBar()->setValue(horizontalScrollBar()->value() - delta.x());
    verticalScrollBar()->setValue(verticalScrollBar()->value() - delta.y());
    event->accept();
    return;
  }
  QGraphicsView::mouseMoveEvent(event);
}

void CanvasView::mouseReleaseEvent(QMouseEvent* event) {
  if (panning_) {
    panning_ = false;
    viewport()->unsetCursor();
    event->accept();
    return;
  }
  QGraphicsView::mouseReleaseEvent(event);
}

void CanvasView::keyPressEvent(QKeyEvent* event) {
  if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
    space_held_ = true;
    viewport()->setCursor(Qt::OpenHandCursor);
    return;
  }
  if (event->key() == Qt::Key_Plus || event->key() == Qt::Key_Equal) return zoom_by(1.2);
  if (event->key() == Qt::Key_Minus) return zoom_by(1 / 1.2);
  // Arrow keys go from stage to stage (Shift adds to the selection), not scroll the canvas.
  auto* pipeline = static_cast<PipelineScene*>(scene());
  if (!(event->modifiers() & (Qt::ControlModifier | Qt::AltModifier)) &&
      pipeline->select_neighbour(event->key(), event->modifiers() & Qt::ShiftModifier))
    return event->accept();
  QGraphicsView::keyPressEvent(event);
}

void CanvasView::contextMenuEvent(QContextMenuEvent* event) {
  emit context_menu_requested(event->pos(), event->globalPos());
  event->accept();
}

void CanvasView::keyReleaseEvent(QKeyEvent* event) {
  if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
    space_held_ = false;
    viewport()->unsetCursor();
    return;
  }
  QGraphicsView::keyReleaseEvent(event);
}

void CanvasView::dragEnterEvent(QDragEnterEvent* event) {
  if (event->mimeData()->hasFormat(kOperatorMime)) event->acceptProposedAction();
  else QGraphicsView::dragEnterEvent(event);
}

void CanvasView::dragMoveEvent(QDragMoveEvent* event) {
  if (event->mimeData()->hasFormat(kOperatorMime)) event->acceptProposedAction();
  else QGraphicsView::dragMoveEvent(event);
}

void CanvasView::dropEvent(QDropEvent* event) {
  if (!event->mimeData()->hasFormat(kOperatorMime)) return QGraphicsView::dropEvent(event);
  const QString op = QString::fromUtf8(event->mimeData()->data(kOperatorMime));
  // The node's centre where the pointer let go.
  const QPointF at = mapToScene(event->position().toPoint()) - QPointF(NodeItem::kWidth / 2, NodeItem::kHeight / 2);
  event->acceptProposedAction();
  emit operator_dropped(op, at);
}

}  // namespace sluice::studio

// The meta-object code compiled with this file (and its unity batch), not in a separate
// mocs_compilation unit that parsed Qt's headers again for it.
#include "moc_canvas.cpp"
