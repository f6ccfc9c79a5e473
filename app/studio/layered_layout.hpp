#pragma once
// Where each stage goes when the studio lays a pipeline out: Graphviz's `dot`, left to right.

#include <map>
#include <optional>
#include <string>

#include "pipeline.pb.h"

namespace sluice::studio {

// A stage's node on the canvas, in scene units.
constexpr double kNodeWidth = 190, kNodeHeight = 84;
// A pipeline deeper than kLayersInOneRow layers goes on in rows below, again from the left, at
// most kLayersPerRow to a row and as many in each as it takes: a long chain then fits a window
// (wider than high) at a zoom where its nodes still read.
constexpr int kLayersInOneRow = 5, kLayersPerRow = 4;

// How many layers each row holds for a pipeline this deep: all of them up to kLayersInOneRow,
// else rows of at most kLayersPerRow, balanced (six layers are two rows of three).
int layers_per_row(int layers);

struct NodePlace {
  double x = 0, y = 0;  // the node's top-left corner in scene units
};

// Layers as Graphviz's `dot` draws them: every stage one layer right of its furthest input, the
// order within a layer chosen so that edges cross as little as the graph allows, a stage's inputs
// in the order of its ports (input 0 on top), in rows as layers_per_row says.
// Nodes are `width` x `height`; the placement starts at (0, 0). Returns nothing, with the reason in `error`, when Graphviz cannot lay it out.
std::optional<std::map<std::string, NodePlace>> layered_places(const spec::PipelineSpec& spec, double width, double height,
                                                               std::string* error);

}  // namespace sluice::studio
