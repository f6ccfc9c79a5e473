#include "sluice/remote/store_config.hpp"
#include "text.hpp"
#include "sluice/remote/s3_signature.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

namespace sluice::remote {
namespace {

using Sections = std::map<std::string, std::map<std::string, std::string>>;

// The INI files of the AWS tools: [section] headers, key = value lines, # and ; comments.
// Absent files are empty; nothing read here is ever quoted back but section and key names.
Sections read_ini(const std::string& path) {
  Sections sections;
  std::ifstream in(path);
  std::string section, line;
  while (std::getline(in, line)) {
    const std::string text = trim(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      section = trim(std::string_view(text).substr(1, text.size() - 2));
      sections[section];
      continue;
    }
    const auto equals = text.find('=');
    if (equals == std::string::npos || section.empty()) continue;
    sections[section][trim(std::string_view(text).substr(0, equals))] = trim(std::string_view(text).substr(equals + 1));
  }
  return sections;
}

std::string home_file(const Environment& env, const char* variable, const char* under_home) {
  std::string given = env(variable);
  if (!given.empty()) return given;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + under_home;
}

std::string value_in(const Sections& sections, const std::string& section, const std::string& key) {
  auto s = sections.find(section);
  if (s == sections.end()) return "";
  auto v = s->second.find(key);
  return v == s->second.end() ? "" : v->second;
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) {
    const char* v = std::getenv(name.c_str());
    return v ? std::string(v) : std::string();
  };
}

std::optional<RemoteLocation> parse_remote_uri(std::string_view path) {
  const auto colon = path.find("://");
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string scheme(path.substr(0, colon));
  RemoteLocation at;
  if (scheme == "http" || scheme == "https") {
    at.scheme = scheme == "http" ? RemoteLocation::Scheme::Http : RemoteLocation::Scheme::Https;
    if (path.size() == colon + 3) throw std::invalid_argument(std::string(path) + ": no host after " + scheme + "://");
    at.url = std::string(path);
    return at;
  }
  if (scheme != "s3" && scheme != "gs")
    throw std::invalid_argument(std::string(path) + ": Sluice reads s3://, gs://, http:// and https:// URIs, not " + scheme + "://");
  at.scheme = scheme == "s3" ? RemoteLocation::Scheme::S3 : RemoteLocation::Scheme::GS;
  const std::string_view rest = path.substr(colon + 3);
  const auto slash = rest.find('/');
  at.bucket = std::string(rest.substr(0, slash));
  at.key = slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  if (at.bucket.empty()) throw std::invalid_argument(std::string(path) + ": no bucket (write " + scheme + "://BUCKET/KEY)");
  return at;
}

S3Settings s3_settings(RemoteLocation::Scheme scheme, const Environment& env) {
  S3Settings s;
  const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
  const std::string credentials_file = home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  const std::string config_file = home_file(env, "AWS_CONFIG_FILE", ".aws/config");
  const Sections credentials = credentials_file.empty() ? Sections() : read_ini(credentials_file);
  const Sections config = config_file.empty() ? Sections() : read_ini(config_file);
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  if (!env("AWS_PROFILE").empty() && !credentials.count(profile) && !config.count(config_section))
    throw std::invalid_argument("AWS_PROFILE names profile '" + profile + "', which neither " + credentials_file + " nor " + config_file +
                                " holds");

  s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = env("AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = value_in(config, config_section, "region");
  if (s.region.empty()) s.region = "us-east-1";

  std::string endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = value_in(config, config_section, "endpoint_url");
  if (scheme == RemoteLocation::Scheme::GS) {
    // STORAGE_EMULATOR_HOST: where Google's own client libraries send gs:// requests instead
    // (an emulator or a proxy), HOST:PORT or a URL.
    std::string host = env("STORAGE_EMULATOR_HOST");
    while (!host.empty() && host.back() == '/') host.pop_back();
    if (!host.empty() && host.find("://") == std::string::npos) host = "http://" + host;
    if (!host.empty() && host.rfind("http://", 0) != 0 && host.rfind("https://", 0) != 0)
      throw std::invalid_argument("STORAGE_EMULATOR_HOST '" + host + "' is neither HOST:PORT nor an http:// or https:// URL");
    s.endpoint = host.empty() ? "https://storage.googleapis.com" : host;
    s.path_style = true;
    s.region = "auto";
  } else if (!endpoint.empty()) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0)
      throw std::invalid_argument("the S3 endpoint '" + endpoint + "' (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or endpoint_url) is not an http:// or https:// URL");
    s.endpoint = endpoint;
    s.path_style = true;  // custom stores (MinIO, Ceph, test servers) answer at ENDPOINT/BUCKET
  } else {
    s.endpoint = "https://s3." + s.region + ".amazonaws.com";
  }

  const std::string id = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (!id.empty() || !secret.empty()) {
    if (id.empty() || secret.empty())
      throw std::invalid_argument(std::string(id.empty() ? "AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID"
                                                         : "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY") +
                                  "; set both, or neither to use " + credentials_file);
    s.credentials = {id, secret, env("AWS_SESSION_TOKEN")};
    s.credentials_from = "AWS_ACCESS_KEY_ID";
  } else {
    for (const auto& [file, sections, section] : {std::tuple{credentials_file, &credentials, profile}, std::tuple{config_file, &config, config_section}}) {
      const std::string key_id = value_in(*sections, section, "aws_access_key_id");
      const std::string key = value_in(*sections, section, "aws_secret_access_key");
      if (key_id.empty() && key.empty()) continue;
      if (key_id.empty() || key.empty())
        throw std::invalid_argument("profile '" + profile + "' in " + file + " gives " +
                                    (key_id.empty() ? "aws_secret_access_key without aws_access_key_id" : "aws_access_key_id without aws_secret_access_key"));
      s.credentials = {key_id, key, value_in(*sections, section, "aws_session_token")};
      s.credentials_from = "profile " + profile + " in " + file;
      break;
    }
  }
  s.anonymous = s.credentials.access_key_id.empty();
  return s;
}

std::string settings_digest(const Environment& env) {
  std::string read;
  for (const char* name : {"AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HOME", "AWS_REGION", "AWS_DEFAULT_REGION",
                           "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                           "STORAGE_EMULATOR_HOST"})
    read += std::string(name) + '=' + env(name) + '\n';
  for (const std::string& file : {home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), home_file(env, "AWS_CONFIG_FILE", ".aws/config")}) {
    struct stat st {};
    if (!file.empty() && ::stat(file.c_str(), &st) == 0)
      read += file + ' ' + std::to_string(st.st_size) + ' ' + std::to_string(st.st_mtim.tv_sec) + '.' + std::to_string(st.st_mtim.tv_nsec) + '\n';
  }
  return sha256_hex(read);
}

std::string object_url(const S3Settings& settings, const std::string& bucket, const std::string& key) {
  const std::string path = key.empty() ? "" : "/" + uri_encode(key, true);
  if (settings.path_style) return settings.endpoint + "/" + uri_encode(bucket, false) + (path.empty() ? "/" : path);
  const auto scheme_end = settings.endpoint.find("://") + 3;
  return settings.endpoint.substr(0, scheme_end) + bucket + "." + settings.endpoint.substr(scheme_end) + (path.empty() ? "/" : path);
}

}  // namespace sluice::remote
