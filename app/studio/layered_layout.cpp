#include "layered_layout.hpp"

#include <graphviz/gvc.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

namespace sluice::studio {

namespace {
// Graphviz reports through a process-wide callback; the studio lays out on its GUI thread only.
std::string* graphviz_errors = nullptr;
int collect_graphviz_error(char* message) {
  if (graphviz_errors && message) *graphviz_errors += message;
  return 0;
}

// Graphviz measures in points and inches (72 points): the studio's scene units count as points.
std::string inches(double points) { return std::to_string(points / 72.0); }

// The gaps between nodes: wide enough between layers for an edge's buffer bar, and between the
// nodes of one layer for an edge to pass.
constexpr double kLayerGap = 90, kNodeGap = 46;
// Between two rows of layers: room for the edges that go back to the left through it.
constexpr double kRowGap = 70;

// The first layers_per_row layers in the first row; the next as many under them, from the
// left, each row with its own top.
void fold_into_rows(std::map<std::string, NodePlace>& places, double height) {
  std::vector<double> layers;  // the left edges of the layers, left to right
  for (const auto& [id, place] : places) layers.push_back(place.x);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  const std::size_t per_row = layers_per_row(static_cast<int>(layers.size()));
  if (layers.size() <= per_row) return;
  auto row_of = [&](double x) { return static_cast<std::size_t>(std::lower_bound(layers.begin(), layers.end(), x) - layers.begin()) / per_row; };
  const std::size_t rows = (layers.size() + per_row - 1) / per_row;
  std::vector<double> top(rows, std::numeric_limits<double>::max()), bottom(rows, 0);
  for (const auto& [id, place] : places) {
    const auto r = row_of(place.x);
    top[r] = std::min(top[r], place.y);
    bottom[r] = std::max(bottom[r], place.y + height);
  }
  std::vector<double> row_y(rows, 0);
  for (std::size_t r = 1; r < rows; ++r) row_y[r] = row_y[r - 1] + (bottom[r - 1] - top[r - 1]) + kRowGap;
  for (auto& [id, place] : places) {
    const auto r = row_of(place.x);
    place = {place.x - layers[r * per_row], place.y - top[r] + row_y[r]};
  }
}
}  // namespace

int layers_per_row(int layers) {
  if (layers <= kLayersInOneRow) return std::max(1, layers);
  const int rows = (layers + kLayersPerRow - 1) / kLayersPerRow;
  return (layers + rows - 1) / rows;
}

std::optional<std::map<std::string, NodePlace>> layered_places(const spec::PipelineSpec& spec, double width, double height,
                                                               std::string* error) {
  std::string errors;
  graphviz_errors = &errors;
  agseterr(AGERR);
  agseterrf(collect_graphviz_error);
  // One context for the process: Debian's Graphviz 2.42 leaks about 3.6 kB with every context
  // it frees (gvContext's plugin configuration), so a context per layout grew with each Arrange.
  static GVC_t* const context = gvContext();
  std::unique_ptr<Agraph_t, int (*)(Agraph_t*)> graph(agopen(const_cast<char*>("pipeline"), Agdirected, nullptr), agclose);
  auto set_default = [&](int kind, const char* name, const std::string& value) {
    agattr(graph.get(), kind, const_cast<char*>(name), const_cast<char*>(value.c_str()));
  };
  set_default(AGRAPH, "rankdir", "LR");
  // A merge's inputs keep the order of its ports, so that its edges come in without crossing.
  set_default(AGRAPH, "ordering", "in");
  set_default(AGRAPH, "ranksep", inches(kLayerGap));
  set_default(AGRAPH, "nodesep", inches(kNodeGap));
  set_default(AGNODE, "shape", "box");
  set_default(AGNODE, "fixedsize", "true");
  set_default(AGNODE, "width", inches(width));
  set_default(AGNODE, "height", inches(height));
  set_default(AGNODE, "label", "");

  std::map<std::string, Agnode_t*> nodes;
  for (const auto& st : spec.stage())
    if (!nodes.count(st.id())) nodes[st.id()] = agnode(graph.get(), const_cast<char*>(st.id().c_str()), 1);
  for (const auto& st : spec.stage())
    for (const auto& in : st.input())
      if (auto from = nodes.find(in); from != nodes.end() && in != st.id())
        agedge(graph.get(), from->second, nodes[st.id()], nullptr, 1);

  const bool laid_out = gvLayout(context, graph.get(), "dot") == 0;
  graphviz_errors = nullptr;
  if (!laid_out) {
    if (error) *error = errors.empty() ? "Graphviz's dot layout is not available" : errors;
    return std::nullopt;
  }
  // Graphviz's y axis points up and its coordinates are node centres.
  std::map<std::string, NodePlace> places;
  double left = std::numeric_limits<double>::max(), top = std::numeric_limits<double>::max();
  for (const auto& [id, node] : nodes) {
    const NodePlace place{ND_coord(node).x - width / 2, -ND_coord(node).y - height / 2};
    left = std::min(left, place.x);
    top = std::min(top, place.y);
    places[id] = place;
  }
  for (auto& [id, place] : places) place = {std::round(place.x - left), std::round(place.y - top)};
  gvFreeLayout(context, graph.get());
  fold_into_rows(places, height);
  return places;
}

}  // namespace sluice::studio
