#include "new_plugin.hpp"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "sluice/core/atomic_file.hpp"
#include "sluice/error.hpp"

namespace fs = std::filesystem;

namespace {

struct KindTemplate {
  std::string kind;
  std::string summary;   // the operator's one-line doc
  std::string pipeline;  // a pipeline using it, for the README and pipeline.txtpb
};

const std::vector<KindTemplate>& kind_templates() {
  static const std::vector<KindTemplate> kinds{
      {"source", "Counts from start: count elements, each with its square",
       "stage { id: \"numbers\" op: \"@NAME@\" params { key: \"count\" value: \"5\" } }\n"
       "stage { id: \"out\" op: \"jsonl_sink\" input: \"numbers\" params { key: \"path\" value: \"out.jsonl\" } }"},
      {"map", "Multiplies an int64 field by a factor",
       "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"5\" } }\n"
       "stage { id: \"scaled\" op: \"@NAME@\" input: \"numbers\" params { key: \"factor\" value: \"3\" } }\n"
       "stage { id: \"out\" op: \"jsonl_sink\" input: \"scaled\" params { key: \"path\" value: \"out.jsonl\" } }"},
      {"filter", "Keeps the elements whose int64 field is a multiple of divisor",
       "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"10\" } }\n"
       "stage { id: \"kept\" op: \"@NAME@\" input: \"numbers\" params { key: \"divisor\" value: \"3\" } }\n"
       "stage { id: \"out\" op: \"jsonl_sink\" input: \"kept\" params { key: \"path\" value: \"out.jsonl\" } }"},
      {"expand", "Repeats each element copies times, numbering the copies",
       "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"3\" } }\n"
       "stage { id: \"copies\" op: \"@NAME@\" input: \"numbers\" params { key: \"copies\" value: \"2\" } }\n"
       "stage { id: \"out\" op: \"jsonl_sink\" input: \"copies\" params { key: \"path\" value: \"out.jsonl\" } }"},
      {"aggregate", "Sums the int64 field 'value' over consecutive groups of size elements",
       "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"10\" } }\n"
       "stage { id: \"sums\" op: \"@NAME@\" input: \"numbers\" params { key: \"size\" value: \"4\" } }\n"
       "stage { id: \"out\" op: \"jsonl_sink\" input: \"sums\" params { key: \"path\" value: \"out.jsonl\" } }"},
      {"sink", "Writes an int64 field of each element to a text file, a line each",
       "stage { id: \"numbers\" op: \"range\" params { key: \"count\" value: \"5\" } }\n"
       "stage { id: \"out\" op: \"@NAME@\" input: \"numbers\" params { key: \"path\" value: \"out.txt\" } }"},
  };
  return kinds;
}

const char* template_text(const std::string& name) {
  for (const auto& file : plugin_template_files())
    if (name == file.name) return file.text;
  throw sluice::Error("the CLI was built without the template " + name + " (resources/new_plugin): rebuild it");
}

std::string replaced(std::string text, const std::map<std::string, std::string>& values) {
  for (const auto& [key, value] : values)
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) text.replace(at, key.size(), value);
  return text;
}

// my_scale -> MyScale
std::string class_name(const std::string& name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& new_plugin_kinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> k;
    for (const auto& t : kind_templates()) k.push_back(t.kind);
    return k;
  }();
  return kinds;
}

std::string write_new_plugin(const NewPluginRequest& request, const sluice::Registry& registry) {
  const std::string& name = request.name;
  const bool valid = !name.empty() && name.size() <= 64 && std::islower(static_cast<unsigned char>(name[0])) &&
                     std::all_of(name.begin(), name.end(), [](char c) { return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_'; });
  if (!valid)
    throw sluice::Error(fmt::format("plugin name '{}' is not usable: write it in lower-case letters, digits and underscores, starting with a "
                                    "letter, at most 64 characters (it names the operator in pipeline files, the library and its C++ class)",
                                    name));
  if (auto taken = registry.find(name))
    throw sluice::Error(fmt::format("an operator named '{}' exists already (plugin '{}', {}); the host would refuse a second one: pick "
                                    "another name",
                                    name, taken->plugin_name, taken->library_path));
  const auto kind = std::find_if(kind_templates().begin(), kind_templates().end(), [&](const KindTemplate& k) { return k.kind == request.kind; });
  if (kind == kind_templates().end())
    throw sluice::Error(fmt::format("--kind {} is not a kind of operator a project can be made for: one of {}", request.kind,
                                    fmt::join(new_plugin_kinds(), ", ")));

  const fs::path dir = fs::absolute(request.dir.empty() ? fs::path(name) : fs::path(request.dir)).lexically_normal();
  std::error_code ec;
  if (fs::exists(dir, ec) && (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)))
    throw sluice::Error(fmt::format("{} exists and is not an empty folder: pick another --dir, or remove it first", dir.string()));
  // The project is written in a folder of its own beside the target and renamed into place once
  // whole: an interrupted new-plugin leaves a .partial folder, never a project with files missing.
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::current_path();
  fs::create_directories(parent, ec);
  std::string pattern = (parent / (dir.filename().string() + ".partial-XXXXXX")).string();
  if (ec || !::mkdtemp(pattern.data()))
    throw sluice::Error(fmt::format("cannot create a folder in {}: {}", parent.string(), ec ? ec.message() : std::strerror(errno)));
  const fs::path staging = pattern;

  std::string summary_lower = kind->summary;
  summary_lower[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(summary_lower[0])));
  const std::map<std::string, std::string> values{{"@NAME@", name},
                                                   {"@CLASS@", class_name(name)},
                                                   {"@KIND@", kind->kind},
                                                   {"@SUMMARY@", kind->summary},
                                                   {"@SUMMARY_LOWER@", summary_lower}};
  const std::string pipeline = replaced(kind->pipeline, values);
  std::map<std::string, std::string> readme_values = values;
  readme_values["@PIPELINE@"] = pipeline;
  const std::string test = replaced(template_text("test_main.cpp"), {{"@TESTS@", template_text((kind->kind + "_test.inc").c_str())}});
  const std::vector<std::pair<std::string, std::string>> files{
      {"CMakeLists.txt", replaced(template_text("CMakeLists.txt"), values)},
      {name + ".hpp", replaced(template_text((kind->kind + ".hpp").c_str()), values)},
      {name + ".cpp", replaced(template_text("plugin.cpp"), values)},
      {name + "_test.cpp", replaced(test, values)},
      {"README.md", replaced(template_text("README.md"), readme_values)},
      {"pipeline.txtpb", "# A pipeline using " + name + ": sluice run pipeline.txtpb --plugin-dir build\n" + pipeline + "\n"},
  };
  try {
    for (const auto& [file, text] : files) sluice::write_file_atomically(staging / file, text);
    fs::permissions(staging, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    if (fs::exists(dir)) fs::remove(dir);  // the empty folder it was asked to fill
    fs::rename(staging, dir);
  } catch (const std::exception& e) {
    fs::remove_all(staging, ec);
    throw sluice::Error(fmt::format("cannot write the project to {}: {}", dir.string(), e.what()));
  }
  return (request.dir.empty() ? fs::path(name) : fs::path(request.dir)).string();
}
