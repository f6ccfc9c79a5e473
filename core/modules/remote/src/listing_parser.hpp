#pragma once
// One page of an S3 ListObjectsV2 answer (ListBucketResult), parsed as its bytes arrive (expat):
// a page of a million keys costs the objects it lists, not a copy of its text and a tree of it.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sluice/remote/object_store.hpp"

namespace sluice::remote {

class ListingPage {
 public:
  ListingPage();
  ~ListingPage();
  ListingPage(const ListingPage&) = delete;
  ListingPage& operator=(const ListingPage&) = delete;

  // The next bytes of the answer's body; false once the text is not XML (error() says where).
  bool feed(const char* data, std::size_t size);
  // After the last bytes: false when the body is not a whole ListBucketResult document.
  bool finish();
  const std::string& error() const { return error_; }

  std::vector<ListedObject> objects;
  bool truncated = false;
  std::string next_token;

 private:
  struct Parser;
  std::unique_ptr<Parser> parser_;
  std::string error_;
};

}  // namespace sluice::remote
