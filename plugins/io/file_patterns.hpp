#pragma once
// File patterns matched into files: globs ('*', '?', '[...]' within a segment, '**' across
// folders), braces ({000..009} and {a,b}), remote URIs listed through storage. Part of
// sluice_io_formats: list_files and random_access use it, and so does the Parquet plugin.
#include <optional>
#include <string>
#include <vector>

#include "sluice/storage.hpp"

namespace sluice::io {

// A file the patterns matched: a local path, or an object with its size and ETag as the listing
// gave them (a URI without wildcards is not listed: its size is 0 and its ETag empty until opened).
struct MatchedFile {
  std::string path;
  std::optional<StoredObject> object;
};
// Every file or object the patterns match (globs, {a,b} and {000..009}, and remote URIs listed
// through `storage`), in pattern order; a pattern matching nothing is a DataError naming it.
std::vector<MatchedFile> match_files(const std::vector<std::string>& patterns, Storage* storage);

bool has_wildcard(const std::string& s);
// The expansions of a pattern's braces, in order (nested, several in one pattern).
void expand_braces(const std::string& pattern, std::vector<std::string>& out);
// The local files one pattern (braces expanded) matches, sorted.
std::vector<std::string> glob(const std::string& pattern);
// What a pattern that matches nothing runs into: the deepest folder before its first wildcard.
std::string why_nothing_matches(const std::string& pattern);
// The objects a remote pattern matches, and how many were listed under its prefix.
struct RemoteMatches {
  std::vector<StoredObject> objects;
  std::size_t listed = 0;  // objects under the prefix, matching or not
  std::string prefix;
};
RemoteMatches remote_glob(const std::string& pattern, Storage* storage);

}  // namespace sluice::io
