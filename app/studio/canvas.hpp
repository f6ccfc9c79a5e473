#pragma once
// The node canvas: one NodeItem per stage, one EdgeItem per connection, kept in step with the
// Document; live metrics are painted on top (LiveStage) when a run is watched.
#include <QGraphicsObject>
#include <QGraphicsPathItem>
#include <QGraphicsScene>
#include <QGraphicsView>
#include <QHash>
#include <QFontMetrics>
#include <QPointer>
#include <optional>

#include "document.hpp"
#include "layered_layout.hpp"

namespace sluice::studio {

inline constexpr const char* kOperatorMime = "application/x-sluice-operator";

// A buffer as its connection's bar shows it: elements in it (after a run, its mean fill over the
// run), its capacity, and the bytes in it against its byte limit (0: none).
struct BufferView {
  std::uint32_t level = 0, capacity = 0;
  std::uint64_t bytes = 0, byte_limit = 0;
};

// What the canvas draws of a running stage, from the latest snapshot.
struct LiveStage {
  double elements_per_s = 0;
  double bytes_per_s = 0;
  double busy = 0;  // 0..1 of its workers' time
  std::uint32_t buffer_level = 0, buffer_capacity = 0;
  std::uint64_t buffer_bytes = 0, buffer_byte_limit = 0;
  bool fused = false;  // runs inside its input's workers: no buffer before it
  bool bottleneck = false;
  QString bottleneck_reason;
  QStringList devices;  // feed sinks: "cuda:0 11.8 GB/s, ring 3/4" per device
  std::uint64_t skipped = 0;
  QString failure;  // the run failed at this stage: the message
  // Its output buffer as each reader sees it (a tee has one per reader).
  QHash<QString, BufferView> reader_buffers;
  bool averages = false;  // the rates are the ended run's averages, not the last interval's
  QString lost;  // the connection to the run went before it ended: why; the numbers are the last seen
  std::uint32_t workers = 0;       // now (0: not reported)
  bool workers_tuned = false;      // parallelism -1: the autotuner's count, at most max_workers
  std::uint32_t max_workers = 0;
  // Sources that know their size: where the current pass stands (read of its pass_elements).
  std::uint64_t pass_epoch = 0, pass_position = 0;
  std::int64_t pass_elements = 0;
};

class PipelineScene;

class NodeItem final : public QGraphicsObject {
  Q_OBJECT
 public:
  static constexpr double kWidth = kNodeWidth, kHeight = kNodeHeight, kPortRadius = 7;
  NodeItem(PipelineScene& scene, QString id);
  const QString& id() const { return id_; }
  void sync(const spec::Stage& stage, const RegisteredOperator* op, bool has_problem);
  void set_live(const std::optional<LiveStage>& live);
  QString pass_text() const;  // "Epoch 0: 120 of 2048" for a source that knows its size
  const std::optional<LiveStage>& live() const { return live_; }
  // Orange: the bottleneck of the run shown. A lost run's is no longer news: its outline goes
  // with the connection (the tooltip still says what it was when last seen).
  bool outlined_as_bottleneck() const { return live_ && live_->bottleneck && live_->lost.isEmpty(); }
  bool takes_input() const { return input_ports_ > 0; }
  bool gives_output() const { return gives_output_; }
  // Input ports, top to bottom in the order of the stage's inputs: one for most operators, one
  // per input for a combine (and a free one more while it may take more).
  int input_ports() const { return input_ports_; }
  QPointF input_port(int k = 0) const { return mapToScene(input_port_local(k)); }
  QPointF output_port() const { return mapToScene(QPointF(kWidth, kHeight / 2)); }
  // Which port, if any, is under a scene position: 1 output, -1 - k input k, 0 none.
  int port_at(QPointF scene_pos) const;

  QRectF boundingRect() const override;
  void paint(QPainter* painter, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  // Below this zoom a node draws its name and rate only, larger (see paint).
  static constexpr double kDetailedZoom = 0.75;
  // The live line as the node draws it at `zoom` when zoomed out, and whether it fits the node.
  QString compact_rate_line(double zoom) const;
  bool compact_rate_line_fits(double zoom) const;

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;

 private:
  void paint_body(QPainter* p);
  void paint_detailed_text(QPainter* p);
  void paint_compact_text(QPainter* p, double zoom);
  void paint_busy_gauge(QPainter* p);
  void paint_ports(QPainter* p);
  QString rate_text() const;  // the live line: rates, or the failure's reason
  // The live line when zoomed out, longest first: the first that fits is drawn, so the numbers
  // are never what is cut off.
  QStringList compact_rate_texts() const;
  QString compact_rate_line(const QFontMetrics& metrics) const;
  QColor rate_colour() const;
  void update_tooltip();
  QPointF input_port_local(int k) const { return QPointF(0, kHeight * (k + 1) / (input_ports_ + 1)); }
  PipelineScene& scene_;
  QString id_, op_, summary_;
  int input_ports_ = 1;
  bool gives_output_ = true, known_ = true, has_problem_ = false, per_input_ = false;
  std::optional<LiveStage> live_;
};

class EdgeItem final : public QGraphicsPathItem {
 public:
  // The connection into input `input` of `to` (its port of that number).
  EdgeItem(NodeItem* from, NodeItem* to, int input = 0);
  NodeItem* from() const { return from_; }
  NodeItem* to() const { return to_; }
  int input() const { return input_; }
  void adjust();
  QRectF boundingRect() const override;
  // The line widened to a band a pointer finds without pixel-exact aim, and the fill bar.
  QPainterPath shape() const override;
  void paint(QPainter* painter, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  QRectF fill_bar_rect() const;
  // The buffer it draws, from its producer's live numbers (none: no run shown, or fused stages).
  std::optional<BufferView> buffer() const;
  // Its producer's or consumer's live numbers changed: its bar, shape and tooltip follow.
  void live_changed();
  // Where the buffer's fill bar goes (the scene finds a free place along the edge).
  void set_bar_center(QPointF center);

 private:
  // Its tooltip: the buffer's level, capacity and bytes, or why there is none.
  void update_tooltip();
  NodeItem* from_;
  NodeItem* to_;
  int input_;
  QPointF bar_center_;
};

class PipelineScene final : public QGraphicsScene {
  Q_OBJECT
 public:
  explicit PipelineScene(Document& document, QObject* parent = nullptr);
  ~PipelineScene() override;
  Document& document() { return document_; }
  NodeItem* node(const QString& id) const { return nodes_.value(id); }
  EdgeItem* edge_into(const QString& to, int input = 0) const;
  QStringList selected_stage_ids() const;
  QStringList selected_edge_targets() const;  // consumers of the selected connections
  // The selected connections as (consumer, which of its inputs).
  QList<QPair<QString, int>> selected_edges() const;
  // Selects one stage; `reveal` scrolls it into view (a problem clicked in the list).
  void select_stage(const QString& id, bool reveal = false);
  // The keyboard's way around the canvas (canvas_keys.cpp): from the stage selected last, an
  // arrow key selects a neighbour (Right: a stage it feeds; Left: its input; Up, Down: the
  // nearest stage above or below), which Shift adds to the selection. Nothing selected: the
  // first stage. True when the key was one of these.
  bool select_neighbour(int key, bool extend);
  // The selected stages in the order they were selected (the first is where a connection made
  // from the keyboard starts).
  QStringList selection_order() const;
  // Live values per stage id; an empty map clears them (no run).
  void set_live(const QHash<QString, LiveStage>& live);
  // The run being shown went away without saying how it ended: every node keeps its last numbers,
  // drawn as stale, with why.
  void mark_lost(const QString& why);
  void node_position_changed(NodeItem* node);
  // The text shown while a connection is dragged: where it would go, or why it cannot.
  const QString& drag_hint() const { return drag_hint_; }
  // The hint's plate while a connection is dragged (nullptr otherwise).
  const QGraphicsRectItem* drag_hint_plate() const { return drag_plate_; }

 signals:
  void connection_refused(const QString& reason);
  void hint(const QString& text);

 protected:
  void mousePressEvent(QGraphicsSceneMouseEvent* event) override;
  void mouseMoveEvent(QGraphicsSceneMouseEvent* event) override;
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* event) override;

 private:
  void sync();
  // Puts each edge's fill bar where it covers no node and no other bar: the free point nearest
  // the reading stage along the edge (edges out of one stage share their start, and edges wrapped
  // to the next row share the gap between rows).
  void place_fill_bars();
  NodeItem* node_under(QPointF scene_pos) const;
  // While a connection is dragged out of drag_from_: the stage under the pointer (not its own),
  // why the connection cannot be made there, and the line, label and hint drawn for it.
  // `input`: the input port dropped on, or -1 (the body: the operator's next free input).
  NodeItem* drag_target(QPointF scene_pos, int* input = nullptr) const;
  std::optional<QString> drag_refusal(const NodeItem* target, int input) const;
  void update_drag(QPointF scene_pos);
  void end_connection_drag();

  Document& document_;
  QHash<QString, NodeItem*> nodes_;
  QList<EdgeItem*> edges_;
  QHash<QString, LiveStage> live_;
  // A connection being dragged out of an output port.
  QPointer<NodeItem> drag_from_;
  QGraphicsPathItem* drag_line_ = nullptr;
  QGraphicsRectItem* drag_plate_ = nullptr;
  QGraphicsSimpleTextItem* drag_label_ = nullptr;
  QString drag_hint_;
  QStringList selection_order_;  // kept by the selectionChanged handler the constructor connects
  bool moving_nodes_ = false;
};

// The view: zoom with the wheel, pan with the middle button (or Space and drag), rubber-band
// selection, operators dropped from the palette.
class CanvasView final : public QGraphicsView {
  Q_OBJECT
 public:
  explicit CanvasView(PipelineScene& scene, QWidget* parent = nullptr);
  void zoom_by(double factor);
  void fit();  // the whole pipeline in view (never larger than 1:1); follows resizes until zoomed

 signals:
  void operator_dropped(const QString& op, QPointF scene_pos);
  void context_menu_requested(QPoint view_pos, QPoint global_pos);

 protected:
  void wheelEvent(QWheelEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void drawForeground(QPainter* painter, const QRectF& rect) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void keyReleaseEvent(QKeyEvent* event) override;
  void contextMenuEvent(QContextMenuEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dragMoveEvent(QDragMoveEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  bool panning_ = false, space_held_ = false;
  bool auto_fit_ = false;  // fitted and not zoomed by hand since: follows the window's size
  bool showed_empty_hint_ = true;
  QPoint pan_last_;
};

// "12.3k", "1.2M": rates on small labels.
QString short_number(double value);
// A stage's failure as its node's face shows it: the message's first line without what the node
// already says (the stage's name) and without a URI or path it starts with (the tooltip has the
// whole message), so that the cause comes first.
QString failure_cause(const QString& message);
// "failed: CAUSE" on the face's kFailureLines lines of `width` pixels: what failed (the cause's
// first clause), then why (the rest, over the other lines). A path too long for its line keeps its
// end (the folder's or file's name), and the words after it stay.
constexpr int kFailureLines = 3;
QStringList failure_face_lines(const QString& message, const QFontMetrics& metrics, int width);
// Level/capacity as a colour from starved (red, empty) through green to full (blue).
QColor occupancy_colour(double fill);

}  // namespace sluice::studio
