#pragma once
// Where a remote URI points and how to reach it: s3://BUCKET/KEY, gs://BUCKET/KEY (Google Cloud
// Storage's S3-compatible XML API), http:// and https:// URLs; and the settings of S3 requests,
// read as the AWS tools read them (environment first, then ~/.aws/credentials and ~/.aws/config).
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/remote/s3_signature.hpp"

namespace sluice::remote {

struct RemoteLocation {
  enum class Scheme { S3, GS, Http, Https };
  Scheme scheme = Scheme::S3;
  std::string bucket;  // s3, gs
  std::string key;     // s3, gs: the object's key ("" for a bucket); http(s): unused
  std::string url;     // http(s): the URL as given
};

// The location a path names, or nullopt for a local path. Throws std::invalid_argument naming the
// URI when it is malformed (s3:// without a bucket, a scheme Sluice does not read).
std::optional<RemoteLocation> parse_remote_uri(std::string_view path);

// Reads one environment variable; empty for unset. Tests give their own.
using Environment = std::function<std::string(const std::string&)>;
Environment process_environment();

struct S3Settings {
  std::string endpoint;   // https://s3.REGION.amazonaws.com, or AWS_ENDPOINT_URL(_S3), or GCS's
  std::string region;     // AWS_REGION, AWS_DEFAULT_REGION, the profile's region; us-east-1
  bool path_style = false;  // ENDPOINT/BUCKET/KEY rather than BUCKET.ENDPOINT/KEY (custom endpoints)
  bool anonymous = true;    // no credentials found: unsigned requests (public buckets)
  Credentials credentials;
  std::string credentials_from;  // where they came from, for messages ("AWS_ACCESS_KEY_ID", "profile default in FILE"); never a value
};

// The settings of requests to `scheme`'s store (S3 or GS) as the AWS CLI would resolve them:
// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; AWS_REGION, AWS_DEFAULT_REGION; AWS_ACCESS_KEY_ID with
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; else the profile AWS_PROFILE (or "default") of
// AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and AWS_CONFIG_FILE (~/.aws/config, whose
// sections are "profile NAME"). Throws std::invalid_argument naming the variable, file or
// profile that is wrong (a key id without a secret, a named profile that does not exist), never
// a secret.
S3Settings s3_settings(RemoteLocation::Scheme scheme, const Environment& environment);

// What s3_settings would read from `environment` now: the variables above and the size and
// modification time of the two files, digested (SHA-256, so that no secret is kept in it). Equal
// digests give equal settings; a changed one means settings must be resolved again, as boto3
// resolves them again for each new client.
std::string settings_digest(const Environment& environment);

// The URL of an object (or of its bucket, for an empty key): path-style or virtual-hosted.
std::string object_url(const S3Settings& settings, const std::string& bucket, const std::string& key);

}  // namespace sluice::remote
