#include "sluice/remote/s3_signature.hpp"
#include "text.hpp"

#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace sluice::remote {
namespace {

std::string hex(const unsigned char* bytes, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
            &length))
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), length);
}

// Leading and trailing spaces dropped, runs of spaces inside made one, as SigV4 asks of values.
std::string trimmed_value(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> sorted_headers(const RequestToSign& request) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : request.headers) headers.emplace_back(lowercase(name), trimmed_value(value));
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string signed_header_names(const std::vector<std::pair<std::string, std::string>>& headers) {
  std::string names;
  for (const auto& [name, value] : headers) names += (names.empty() ? "" : ";") + name;
  return names;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return hex(digest, sizeof digest);
}

std::string uri_encode(std::string_view text, bool keep_slash) {
  static const char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

std::string canonical_request(const RequestToSign& request) {
  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [name, value] : request.query) query.emplace_back(uri_encode(name, false), uri_encode(value, false));
  std::sort(query.begin(), query.end());
  std::string text = request.method + "\n" + uri_encode(request.path.empty() ? "/" : request.path, true) + "\n";
  for (std::size_t i = 0; i < query.size(); ++i) text += (i ? "&" : "") + query[i].first + "=" + query[i].second;
  text += "\n";
  const auto headers = sorted_headers(request);
  for (const auto& [name, value] : headers) text += name + ":" + value + "\n";
  return text + "\n" + signed_header_names(headers) + "\n" + request.payload_sha256;
}

std::string authorization(const RequestToSign& request, const Credentials& credentials) {
  return authorization(request, canonical_request(request), credentials);
}

std::string authorization(const RequestToSign& request, const std::string& canonical, const Credentials& credentials) {
  if (request.amz_date.size() != 16) throw std::invalid_argument("amz_date is not YYYYMMDDTHHMMSSZ");
  const std::string day = request.amz_date.substr(0, 8);
  const std::string scope = day + "/" + request.region + "/" + request.service + "/aws4_request";
  const std::string to_sign = "AWS4-HMAC-SHA256\n" + request.amz_date + "\n" + scope + "\n" + sha256_hex(canonical);
  std::string key = hmac_sha256("AWS4" + credentials.secret_access_key, day);
  key = hmac_sha256(key, request.region);
  key = hmac_sha256(key, request.service);
  key = hmac_sha256(key, "aws4_request");
  const std::string signature = hmac_sha256(key, to_sign);
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + scope + ",SignedHeaders=" +
         signed_header_names(sorted_headers(request)) +
         ",Signature=" + hex(reinterpret_cast<const unsigned char*>(signature.data()), signature.size());
}

}  // namespace sluice::remote
