#pragma once
// Remote objects (s3://, gs://, http(s)://) read by the host for its own use and for the Python
// face (a tfds dataset's metadata in a bucket): through the environment's settings, as
// --checkpoint and --metrics-log are. Failures throw DataError naming the URI.
#include <string>
#include <vector>

namespace sluice {

// A whole object as text: meant for small ones (metadata files).
std::string read_remote_text(const std::string& uri);
// The URIs of every object whose URI begins with `prefix` (s3:// or gs://), sorted.
std::vector<std::string> list_remote(const std::string& prefix);

}  // namespace sluice
