#pragma once
// `sluice new-plugin`: a ready out-of-tree plugin project written from the templates in
// resources/new_plugin (compiled into the CLI, see CMakeLists.txt).
#include <string>
#include <vector>

#include "sluice/core/registry.hpp"

struct TemplateFile {
  const char* name;
  const char* text;
};
// The files of resources/new_plugin, by file name.
const std::vector<TemplateFile>& plugin_template_files();

struct NewPluginRequest {
  std::string name;
  std::string kind;  // source, map, filter, expand, aggregate, sink
  std::string dir;   // empty: ./NAME
};

// The operator kinds a project can be made for, in the order help lists them.
const std::vector<std::string>& new_plugin_kinds();

// Writes the project; returns its folder. Throws sluice::Error saying what to change (a bad or
// taken name, a folder that is not empty). `registry`: the operators a new name must not clash with.
std::string write_new_plugin(const NewPluginRequest& request, const sluice::Registry& registry);
