#pragma once
// AWS Signature Version 4, as S3 and S3-compatible stores (MinIO, Ceph, moto, GCS's XML API with
// HMAC keys) check it on each request.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::remote {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials; sent as x-amz-security-token when set
};

struct RequestToSign {
  std::string method;  // GET, PUT, POST, HEAD, DELETE
  std::string path;    // as given, not yet encoded: "/bucket/photos/a b.jpg"
  std::vector<std::pair<std::string, std::string>> query;    // names and values, not yet encoded
  std::vector<std::pair<std::string, std::string>> headers;  // those to sign, host and x-amz-date among them
  std::string payload_sha256;  // hex; "UNSIGNED-PAYLOAD" for streamed bodies
  std::string region;          // us-east-1
  std::string service = "s3";
  std::string amz_date;        // 20130524T000000Z, the x-amz-date header's value
};

// Hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

// Percent-encodes every byte but A-Z a-z 0-9 - . _ ~ (and '/' when `keep_slash`), as S3 wants a
// path's segments and a query's names and values.
std::string uri_encode(std::string_view text, bool keep_slash);

// The canonical request of SigV4: method, encoded path, sorted encoded query, sorted lower-case
// headers with trimmed values, the signed header names, the payload hash.
std::string canonical_request(const RequestToSign& request);

// The Authorization header's value: AWS4-HMAC-SHA256 Credential=KEY/SCOPE,
// SignedHeaders=..., Signature=HEX.
std::string authorization(const RequestToSign& request, const Credentials& credentials);
// The same from the request's canonical request, made once by a caller that keeps it too.
std::string authorization(const RequestToSign& request, const std::string& canonical, const Credentials& credentials);

}  // namespace sluice::remote
