// Remote storage (remote/): request signing against the examples the S3 documentation prints
// ("Signature Calculations for the Authorization Header", example credentials and date), which a
// store checks byte for byte.
#include <QtTest>

#include <QTemporaryDir>

#include <fstream>
#include <map>

#include "sluice/remote/object_store.hpp"
#include "sluice/remote/s3_signature.hpp"
#include "sluice/remote/store_config.hpp"

using sluice::remote::Credentials;
using sluice::remote::RequestToSign;

namespace {

const Credentials kExample{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
const std::string kHost = "examplebucket.s3.amazonaws.com";
const std::string kDate = "20130524T000000Z";
const std::string kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

RequestToSign documented(std::string method, std::string path, std::vector<std::pair<std::string, std::string>> query,
                         std::vector<std::pair<std::string, std::string>> extra, const std::string& payload) {
  RequestToSign r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.query = std::move(query);
  r.headers = {{"Host", kHost}, {"x-amz-date", kDate}, {"x-amz-content-sha256", payload}};
  r.headers.insert(r.headers.end(), extra.begin(), extra.end());
  r.payload_sha256 = payload;
  r.region = "us-east-1";
  r.amz_date = kDate;
  return r;
}

std::string signature_of(const std::string& authorization) { return authorization.substr(authorization.rfind('=') + 1); }

sluice::remote::Environment environment(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) {
    auto it = variables.find(name);
    return it == variables.end() ? std::string() : it->second;
  };
}

void write(const QString& path, const std::string& text) { std::ofstream(path.toStdString()) << text; }

template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

class TestRemote : public QObject {
  Q_OBJECT
 private slots:
  void signatures_are_the_s3_documentation_s() {
    QCOMPARE(sluice::remote::sha256_hex(""), kEmpty);
    const std::string welcome = sluice::remote::sha256_hex("Welcome to Amazon S3.");
    QCOMPARE(welcome, std::string("44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"));

    // GET Object with a range: the whole header, and the canonical request's hash that the
    // document prints on the string to sign's last line.
    const auto get = documented("GET", "/test.txt", {}, {{"Range", "bytes=0-9"}}, kEmpty);
    QCOMPARE(sluice::remote::sha256_hex(sluice::remote::canonical_request(get)),
             std::string("7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"));
    QCOMPARE(sluice::remote::authorization(get, kExample),
             std::string("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                         "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                         "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));
    // PUT Object: a key with '$' (encoded once), a Date and a storage class signed too.
    const auto put = documented("PUT", "/test$file.text", {},
                                {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}}, welcome);
    QCOMPARE(signature_of(sluice::remote::authorization(put, kExample)),
             std::string("98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"));
    // GET Bucket lifecycle: a query name without a value.
    QCOMPARE(signature_of(sluice::remote::authorization(documented("GET", "/", {{"lifecycle", ""}}, {}, kEmpty), kExample)),
             std::string("fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"));
    // List objects: query parameters given out of order are sorted.
    QCOMPARE(signature_of(sluice::remote::authorization(documented("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, kEmpty), kExample)),
             std::string("34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
  }

  void paths_queries_and_headers_are_canonical() {
    QCOMPARE(sluice::remote::uri_encode("/photos/été 2013/a+b (1)~x_y-z.jpg", true),
             std::string("/photos/%C3%A9t%C3%A9%202013/a%2Bb%20%281%29~x_y-z.jpg"));
    QCOMPARE(sluice::remote::uri_encode("train/*.tfrecord", false), std::string("train%2F%2A.tfrecord"));
    auto r = documented("GET", "", {{"prefix", "a b/"}, {"list-type", "2"}}, {{"X-Custom", "  two   spaces  "}}, kEmpty);
    const std::string canonical = sluice::remote::canonical_request(r);
    QVERIFY2(canonical.find("GET\n/\nlist-type=2&prefix=a%20b%2F\n") == 0, canonical.c_str());
    QVERIFY2(canonical.find("\nx-custom:two spaces\n") != std::string::npos, canonical.c_str());
    // A different secret signs differently, and the secret is in no part of the header.
    const std::string header = sluice::remote::authorization(r, kExample);
    QVERIFY(header.find(kExample.secret_access_key) == std::string::npos);
    QVERIFY(header != sluice::remote::authorization(r, Credentials{kExample.access_key_id, "other", ""}));
  }

  void uris_name_their_store_bucket_and_key() {
    using Scheme = sluice::remote::RemoteLocation::Scheme;
    QVERIFY(!sluice::remote::parse_remote_uri("/data/train-00000.tfrecord"));
    QVERIFY(!sluice::remote::parse_remote_uri("relative/file:with:colons"));
    const auto s3 = sluice::remote::parse_remote_uri("s3://my-bucket/train/a b.tfrecord");
    QVERIFY(s3 && s3->scheme == Scheme::S3);
    QCOMPARE(s3->bucket, std::string("my-bucket"));
    QCOMPARE(s3->key, std::string("train/a b.tfrecord"));
    const auto gs = sluice::remote::parse_remote_uri("gs://b");
    QVERIFY(gs && gs->scheme == Scheme::GS && gs->bucket == "b" && gs->key.empty());
    const auto https = sluice::remote::parse_remote_uri("https://example.com/x.tar?sig=1");
    QVERIFY(https && https->scheme == Scheme::Https && https->url == "https://example.com/x.tar?sig=1");
    QVERIFY(refusal([] { sluice::remote::parse_remote_uri("s3:///key"); }).find("s3:///key: no bucket") == 0);
    QVERIFY(refusal([] { sluice::remote::parse_remote_uri("ftp://host/file"); }).find("not ftp://") != std::string::npos);
  }

  // A refused signature is explained by what the store says it signed: the same request (the
  // secret is wrong), another one (something changed it: the secret was not checked), or nothing
  // (either). A session token in a printed line is left out.
  void a_refused_signature_is_explained_by_what_the_store_signed() {
    const std::string ours = "GET\n/bkt/\nlist-type=2&prefix=shards%2F\nhost:127.0.0.1\nx-amz-security-token:tok-secret\n\nhost\nUNSIGNED";
    auto refused = [&](const std::string& stores) {
      const std::string body = "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>m</Message>" +
                               (stores.empty() ? std::string() : "<CanonicalRequest>" + stores + "</CanonicalRequest>") + "</Error>";
      return std::string(sluice::remote::error_of_answer("s3://bkt/shards/", 403, body, "AWS_ACCESS_KEY_ID", ours).what());
    };
    const std::string same = refused(ours);
    QVERIFY2(same.find("signed the request Sluice signed") != std::string::npos && same.find("secret key does not belong") != std::string::npos,
             same.c_str());
    std::string changed_query = ours;
    changed_query.replace(changed_query.find("%2F"), 3, "/");
    const std::string other = refused(changed_query);
    QVERIFY2(other.find("line 3 of its canonical request is 'list-type=2&prefix=shards/' where Sluice signed "
                        "'list-type=2&prefix=shards%2F'") != std::string::npos, other.c_str());
    QVERIFY2(other.find("secret key does not belong") == std::string::npos, other.c_str());
    std::string changed_token = ours;
    changed_token.replace(changed_token.find("tok-secret"), 3, "TOK");
    const std::string token = refused(changed_token);
    QVERIFY2(token.find("line 5") != std::string::npos && token.find("tok-secret") == std::string::npos && token.find("TOK") == std::string::npos,
             token.c_str());
    const std::string silent = refused("");
    QVERIFY2(silent.find("did not say over what: either the secret key does not belong") != std::string::npos, silent.c_str());
    QVERIFY(silent.find("AWS_ACCESS_KEY_ID") != std::string::npos);
  }

  // As the AWS tools resolve them: the environment, then the profile's files; custom endpoints
  // path-style; never a secret in a refusal.
  void settings_come_from_the_environment_then_the_aws_files() {
    using Scheme = sluice::remote::RemoteLocation::Scheme;
    QTemporaryDir home;
    auto none = sluice::remote::s3_settings(Scheme::S3, environment({{"HOME", home.path().toStdString()}}));
    QVERIFY(none.anonymous);
    QCOMPARE(none.region, std::string("us-east-1"));
    QCOMPARE(sluice::remote::object_url(none, "bucket", "train/a b.tfrecord"),
             std::string("https://bucket.s3.us-east-1.amazonaws.com/train/a%20b.tfrecord"));

    auto local = sluice::remote::s3_settings(Scheme::S3, environment({{"HOME", home.path().toStdString()},
                                                                      {"AWS_ENDPOINT_URL", "http://127.0.0.1:4568/"},
                                                                      {"AWS_DEFAULT_REGION", "eu-west-3"},
                                                                      {"AWS_ACCESS_KEY_ID", "S3RVER"},
                                                                      {"AWS_SECRET_ACCESS_KEY", "S3RVER"}}));
    QVERIFY(!local.anonymous && local.path_style);
    QCOMPARE(local.region, std::string("eu-west-3"));
    QCOMPARE(local.credentials_from, std::string("AWS_ACCESS_KEY_ID"));
    QCOMPARE(sluice::remote::object_url(local, "bucket", "k"), std::string("http://127.0.0.1:4568/bucket/k"));
    QCOMPARE(sluice::remote::object_url(local, "bucket", ""), std::string("http://127.0.0.1:4568/bucket/"));

    QDir(home.path()).mkpath(".aws");
    write(home.filePath(".aws/credentials"), "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = secret-default\n\n"
                                             "[work]\naws_access_key_id=AKIDWORK\naws_secret_access_key=secret-work\naws_session_token = tok\n"
                                             "[broken]\naws_access_key_id = AKIDBROKEN\n");
    write(home.filePath(".aws/config"), "[default]\nregion = us-west-2\n[profile work]\nregion=ap-south-1\n"
                                        "endpoint_url = https://minio.example:9000\n");
    const std::string h = home.path().toStdString();
    auto fallback = sluice::remote::s3_settings(Scheme::S3, environment({{"HOME", h}}));
    QCOMPARE(fallback.credentials.access_key_id, std::string("AKIDDEFAULT"));
    QCOMPARE(fallback.region, std::string("us-west-2"));
    QVERIFY(!fallback.path_style);
    auto work = sluice::remote::s3_settings(Scheme::S3, environment({{"HOME", h}, {"AWS_PROFILE", "work"}}));
    QCOMPARE(work.credentials.session_token, std::string("tok"));
    QCOMPARE(work.region, std::string("ap-south-1"));
    QCOMPARE(work.endpoint, std::string("https://minio.example:9000"));
    QVERIFY(work.credentials_from.find("profile work in ") == 0);
    auto gcs = sluice::remote::s3_settings(Scheme::GS, environment({{"HOME", h}}));
    QCOMPARE(sluice::remote::object_url(gcs, "b", "k"), std::string("https://storage.googleapis.com/b/k"));
    // STORAGE_EMULATOR_HOST, as Google's client libraries take it: HOST:PORT (plain HTTP) or a URL;
    // it moves gs:// only, never s3://.
    auto emulated = sluice::remote::s3_settings(Scheme::GS, environment({{"HOME", h}, {"STORAGE_EMULATOR_HOST", "127.0.0.1:4443/"}}));
    QCOMPARE(sluice::remote::object_url(emulated, "b", "a b"), std::string("http://127.0.0.1:4443/b/a%20b"));
    QCOMPARE(emulated.region, std::string("auto"));
    auto tls = sluice::remote::s3_settings(Scheme::GS, environment({{"HOME", h}, {"STORAGE_EMULATOR_HOST", "https://gcs.example"}}));
    QCOMPARE(tls.endpoint, std::string("https://gcs.example"));
    auto s3_beside = sluice::remote::s3_settings(Scheme::S3, environment({{"HOME", h}, {"STORAGE_EMULATOR_HOST", "127.0.0.1:4443"}}));
    QVERIFY(s3_beside.endpoint.find("4443") == std::string::npos);
    QVERIFY(refusal([&] { sluice::remote::s3_settings(Scheme::GS, environment({{"HOME", h}, {"STORAGE_EMULATOR_HOST", "ftp://x"}})); })
                .find("STORAGE_EMULATOR_HOST 'ftp://x' is neither HOST:PORT nor an http:// or https:// URL") == 0);

    for (const auto& refused : std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
             {{{"HOME", h}, {"AWS_PROFILE", "nobody"}}, "AWS_PROFILE names profile 'nobody'"},
             {{{"HOME", h}, {"AWS_PROFILE", "broken"}}, "profile 'broken' in " + h + "/.aws/credentials gives aws_access_key_id without"},
             {{{"HOME", h}, {"AWS_ACCESS_KEY_ID", "AKIDX"}}, "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY"},
             {{{"HOME", h}, {"AWS_SECRET_ACCESS_KEY", "very-secret"}}, "AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID"},
             {{{"HOME", h}, {"AWS_ENDPOINT_URL", "minio:9000"}}, "is not an http:// or https:// URL"}}) {
      const std::string message = refusal([&] { sluice::remote::s3_settings(Scheme::S3, environment(refused.first)); });
      QVERIFY2(message.find(refused.second) != std::string::npos, message.c_str());
      for (const char* secret : {"secret-default", "secret-work", "very-secret"}) QVERIFY2(message.find(secret) == std::string::npos, message.c_str());
    }
  }
};

QTEST_APPLESS_MAIN(TestRemote)
#include "tst_remote.moc"
