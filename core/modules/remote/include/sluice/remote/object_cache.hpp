#pragma once
// A folder of whole local copies of remote objects (options.remote_cache, --remote-cache), shared
// by the processes of a node: a copy is named by its URI, its ETag and its size, so that it is
// used only for the version it holds; filled under a temporary name and renamed into place once
// whole; the least recently used copies are removed when the folder grows past its bound.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/remote/object_store.hpp"

namespace sluice::remote {

class ObjectCache {
 public:
  ObjectCache(std::string folder, std::uint64_t max_bytes);

  // A descriptor of the copy of `uri` at `version`, or -1 when there is none. Marks it used.
  int open_copy(const std::string& uri, const ObjectVersion& version) const;

  // A copy being filled, written in order from the object's first byte.
  class Filling {
   public:
    Filling(const ObjectCache& cache, std::string final_name, std::uint64_t size);
    ~Filling();  // not committed: the temporary goes
    Filling(const Filling&) = delete;
    Filling& operator=(const Filling&) = delete;
    // False once a write failed (a full disk): the copy is given up, the read goes on.
    bool write(const std::byte* data, std::size_t n);
    // Renames the temporary into place when it holds the whole object, then keeps the folder
    // within its bound. Failures only cost the copy.
    void commit();

   private:
    const ObjectCache& cache_;
    std::string final_name_, temporary_;
    std::uint64_t size_, written_ = 0;
    int fd_ = -1;
  };
  std::unique_ptr<Filling> begin_fill(const std::string& uri, const ObjectVersion& version) const;

  const std::string& folder() const { return folder_; }

 private:
  std::string copy_name(const std::string& uri, const ObjectVersion& version) const;
  // Removes the least recently used copies (and temporaries older than an hour, left by killed
  // processes) until the folder holds at most max_bytes; under an flock of the folder's .lock, so
  // that processes sharing it take turns.
  void keep_within_bound() const;

  std::string folder_;
  std::uint64_t max_bytes_;
};

}  // namespace sluice::remote
