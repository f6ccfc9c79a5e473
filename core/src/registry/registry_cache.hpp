#pragma once
// The plugin registry cache: what each plugin library offers (registry.proto's Library), kept
// between processes so that a start lists and checks operators without loading any library,
// as GStreamer's registry does. One file, read once, written back atomically (merged with what
// other processes wrote meanwhile) when something new was learnt. A file that is damaged or
// truncated is never trusted: it is rebuilt, with a warning.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "registry.pb.h"

namespace sluice {

// The host's side of a description's key: the plugin ABI and this cache's format. A description
// made by a host of another ABI is not used.
std::string registry_host_key();

// What a library file is now, as a description's key: path, size, modification time, content
// identity and host. False if the file cannot be examined.
bool describe_file_key(const std::filesystem::path& file, registry::Library& key);

// The file's bytes: a first line naming the format, the content's length and checksum, then the
// content (registry.proto's Cache).
std::string encode_registry_cache(const registry::Cache& cache);
// False with `problem` set when the bytes are damaged or truncated, or not a registry cache at all
// (then `ours` is false: the file is not written over); false without a problem for a cache of
// another format.
bool decode_registry_cache(std::string_view bytes, registry::Cache& out, std::string& problem, bool& ours);

class RegistryCache {
 public:
  // $SLUICE_REGISTRY ("off": none), else $XDG_CACHE_HOME/sluice/registry.bin, else
  // ~/.cache/sluice/registry.bin.
  static std::filesystem::path default_file();

  explicit RegistryCache(std::filesystem::path file);  // empty: no cache
  const std::filesystem::path& file() const { return file_; }

  // The description kept for the library `key` describes (describe_file_key), or null.
  const registry::Library* find(const registry::Library& key);
  // Keeps a new description (one that depends on the file alone), to be written by save().
  void remember(const registry::Library& described);
  // Writes the file when something changed; a location that cannot be written (read-only, not a
  // regular file) is left alone: every start then probes what is new, as if there were no cache.
  void save();
  // Why the file could not be used, once (empty when it could).
  std::string take_warning() { return std::exchange(warning_, {}); }

 private:
  void load();
  // The descriptions in the file now, or none with `problem` set when it is damaged.
  bool read_file(registry::Cache& out, std::string& problem, bool& ours) const;

  std::filesystem::path file_;
  bool loaded_ = false, dirty_ = false, writable_ = true;
  std::map<std::pair<std::string, std::string>, registry::Library> entries_;  // by (path, host)
  std::string warning_;
};

}  // namespace sluice
