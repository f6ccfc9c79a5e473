// File patterns: globs ('*', '?', '[...]', '**'), braces ({000..009}, {a,b}) and remote URIs
// listed through storage, matched into files (list_files, random_access, parquet_rows).
#include "file_patterns.hpp"

#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>
#include <utility>

#include "sluice/error.hpp"
#include "text_scan.hpp"

namespace fs = std::filesystem;

namespace sluice::io {

bool has_wildcard(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// Expands one pattern: '*', '?', '[...]' within a path segment, '**' across any number of folders.
// '**' does not descend through symbolic links to folders (a link loop would never end, and a link
// would list the same files twice). Each (folder, segment) pair is expanded once, so repeated
// '**' costs the number of folders times the segments, not an exponential walk.
using Visited = std::set<std::pair<std::string, std::size_t>>;
namespace {
void expand(const fs::path& base, const std::vector<std::string>& segments, std::size_t at, std::vector<std::string>& out,
            Visited& visited) {
  std::error_code ec;
  if (!visited.emplace(base.string(), at).second) return;
  if (at == segments.size()) {
    if (fs::is_regular_file(base, ec)) out.push_back(base.string());
    return;
  }
  const std::string& seg = segments[at];
  if (seg == "**") {
    expand(base, segments, at + 1, out, visited);  // zero folders
    for (auto it = fs::recursive_directory_iterator(base.empty() ? fs::path(".") : base,
                                                    fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code kind;
      if (it->is_symlink(kind)) continue;
      if (it->is_directory(kind)) {
        const fs::path found = base.empty() ? it->path().lexically_relative(".") : it->path();
        expand(found, segments, at + 1, out, visited);
      }
    }
    return;
  }
  if (!has_wildcard(seg)) {
    expand(base / seg, segments, at + 1, out, visited);
    return;
  }
  for (fs::directory_iterator it(base.empty() ? fs::path(".") : base, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (fnmatch(seg.c_str(), name.c_str(), FNM_PERIOD) == 0) expand(base.empty() ? fs::path(name) : base / name, segments, at + 1, out, visited);
  }
}
}  // namespace

// Brace patterns as webdataset and the shell write them: number ranges {000000..000999} (zero-padded
// to the wider bound when either is written with a leading zero) and alternatives {train,val},
// nested or several in one pattern; the expansions in order.
constexpr std::size_t kMostBraceExpansions = 10'000'000;
void expand_braces(const std::string& pattern, std::vector<std::string>& out) {
  std::size_t open = std::string::npos;
  int depth = 0;
  std::size_t close = std::string::npos;
  for (std::size_t i = 0; i < pattern.size() && close == std::string::npos; ++i) {
    if (pattern[i] == '{' && depth++ == 0) open = i;
    else if (pattern[i] == '}' && depth > 0 && --depth == 0) close = i;
  }
  if (close == std::string::npos) {
    if (out.size() >= kMostBraceExpansions) throw ParamError("a brace pattern expands to more than 10,000,000 paths");
    out.push_back(pattern);
    return;
  }
  const std::string head = pattern.substr(0, open), body = pattern.substr(open + 1, close - open - 1), tail = pattern.substr(close + 1);
  std::vector<std::string> choices;
  const std::size_t dots = body.find("..");
  if (dots != std::string::npos && scan::whole_number(std::string_view(body).substr(0, dots)) &&
      scan::whole_number(std::string_view(body).substr(dots + 2))) {  // {FROM..TO}
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    const long long from = std::stoll(a), to = std::stoll(b);
    const bool padded = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
    const std::size_t width = padded ? std::max(a.size(), b.size()) : 0;
    if (static_cast<unsigned long long>(to > from ? to - from : from - to) >= kMostBraceExpansions)
      throw ParamError("brace range {" + body + "} names more than 10,000,000 paths");
    for (long long v = from;; v += from <= to ? 1 : -1) {
      std::string digits = std::to_string(v < 0 ? -v : v);
      if (digits.size() + (v < 0) < width) digits.insert(0, width - digits.size() - (v < 0), '0');
      choices.push_back((v < 0 ? "-" : "") + digits);
      if (v == to) break;
    }
  } else {
    int level = 0;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= body.size(); ++i) {
      if (i < body.size()) level += body[i] == '{' ? 1 : body[i] == '}' ? -1 : 0;
      if (i == body.size() || (body[i] == ',' && level == 0)) {
        choices.push_back(body.substr(start, i - start));
        start = i + 1;
      }
    }
    if (choices.size() < 2) {  // {x} is no brace pattern: the braces are part of the name
      std::vector<std::string> tails;
      expand_braces(tail, tails);
      for (const auto& t : tails) out.push_back(head + "{" + body + "}" + t);
      return;
    }
  }
  for (const auto& choice : choices) expand_braces(head + choice + tail, out);
}

std::vector<std::string> glob(const std::string& pattern) {
  std::vector<std::string> segments;
  fs::path p(pattern);
  fs::path base = p.is_absolute() ? p.root_path() : fs::path();
  for (const auto& part : p.relative_path()) {
    if (part == "**" && !segments.empty() && segments.back() == "**") continue;  // '**/**' is '**'
    segments.push_back(part.string());
  }
  std::vector<std::string> out;
  Visited visited;
  expand(base, segments, 0, out, visited);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  // One file reached by several paths (through a link to a folder) is listed once, by the path
  // that sorts first: a dataset must not hold a file twice because of how folders are linked.
  std::set<std::pair<dev_t, ino_t>> seen;
  std::vector<std::string> unique;
  for (auto& path : out) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || seen.emplace(st.st_dev, st.st_ino).second) unique.push_back(std::move(path));
  }
  return unique;
}

// What a pattern that matches nothing runs into: the deepest folder before its first wildcard,
// missing or present. (The host has made a pipeline file's relative patterns absolute already;
// a pattern still relative starts from the current directory.)
std::string why_nothing_matches(const std::string& pattern) {
  fs::path fixed;
  for (const auto& part : fs::path(pattern)) {
    if (part.string().find_first_of("*?[") != std::string::npos) break;
    fixed /= part;
  }
  const bool wildcard = pattern.find_first_of("*?[") != std::string::npos;
  fs::path folder = wildcard ? fixed : fixed.parent_path();
  if (folder.empty()) folder = ".";
  const std::string shown = fs::path(folder).is_relative() ? folder.string() + " (from the current directory " + fs::current_path().string() + ")"
                                                           : folder.string();
  std::error_code error;
  if (!fs::is_directory(folder, error)) return "the folder " + shown + " does not exist";
  return "the folder " + shown + " holds nothing matching it";
}

namespace {
// Remote patterns: the store lists every key under the part before the first wildcard, and the
// keys are matched segment by segment as local paths are ('*', '?', '[...]' within a segment,
// '**' across any number of them).
std::vector<std::string> split_segments(std::string_view text) {
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const auto slash = text.find('/', at);
    parts.emplace_back(text.substr(at, slash == std::string_view::npos ? std::string_view::npos : slash - at));
    if (slash == std::string_view::npos) return parts;
    at = slash + 1;
  }
}

bool segments_match(const std::vector<std::string>& pattern, std::size_t i, const std::vector<std::string>& key, std::size_t j) {
  if (i == pattern.size()) return j == key.size();
  if (pattern[i] == "**") {
    for (std::size_t k = j; k <= key.size(); ++k)
      if (segments_match(pattern, i + 1, key, k)) return true;
    return false;
  }
  if (j == key.size() || fnmatch(pattern[i].c_str(), key[j].c_str(), FNM_PERIOD) != 0) return false;
  return segments_match(pattern, i + 1, key, j + 1);
}
}  // namespace

RemoteMatches remote_glob(const std::string& pattern, Storage* storage) {
  RemoteMatches found;
  const bool listable = pattern.rfind("s3://", 0) == 0 || pattern.rfind("gs://", 0) == 0;
  if (!has_wildcard(pattern)) {
    // One object, as a local path without wildcards names one file: it is opened, not listed.
    found.objects.push_back({pattern, 0, ""});
    return found;
  }
  if (!listable)
    throw ParamError("pattern '" + pattern + "': an http(s) server has no listing, so its URIs take no wildcards; name each object");
  if (!storage) throw DataError("cannot list " + pattern + ": remote URIs are read through a Sluice engine");
  found.prefix = pattern.substr(0, pattern.find_first_of("*?["));
  auto listed = storage->list(found.prefix);
  found.listed = listed.size();
  const auto wanted = split_segments(pattern.substr(pattern.find("://") + 3));
  for (auto& object : listed)
    if (segments_match(wanted, 0, split_segments(std::string_view(object.uri).substr(object.uri.find("://") + 3)), 0))
      found.objects.push_back(std::move(object));
  return found;
}

std::vector<MatchedFile> match_files(const std::vector<std::string>& patterns, Storage* storage) {
  std::vector<MatchedFile> files;
  for (const auto& written : patterns) {
    std::vector<std::string> expanded;
    expand_braces(written, expanded);
    for (const auto& pattern : expanded) {
      const std::string of_written = pattern == written ? "" : " (of '" + written + "')";
      if (is_remote_uri(pattern)) {
        auto found = remote_glob(pattern, storage);
        if (found.objects.empty())
          throw DataError("pattern '" + pattern + "'" + of_written + " matches none of the " + std::to_string(found.listed) + " objects under " +
                          found.prefix);
        for (auto& object : found.objects) files.push_back({object.uri, std::move(object)});
        continue;
      }
      auto matched = glob(pattern);
      if (matched.empty()) throw DataError("pattern '" + pattern + "'" + of_written + " matches no file: " + why_nothing_matches(pattern));
      for (auto& path : matched) files.push_back({std::move(path), std::nullopt});
    }
  }
  return files;
}

}  // namespace sluice::io
