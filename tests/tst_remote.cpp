// Remote storage (remote/): request signing against the examples the S3 documentation prints
// ("Signature Calculations for the Authorization Header", example credentials and date), which a
// store checks byte for byte.
#include <QtTest>

#include "sluice/remote/s3_signature.hpp"

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
};

QTEST_APPLESS_MAIN(TestRemote)
#include "tst_remote.moc"
