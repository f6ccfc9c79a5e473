"""http:// and https:// URLs served by nginx on loopback: ranged reads give the files' bytes, TLS
is verified against the certificate authority SSL_CERT_FILE or CURL_CA_BUNDLE names, and what
cannot work fails at once with the URL and what to do."""
import os

import pytest

from conftest import DATA, file_records
from test_faults import run_records

SHARDS = ["tfrecord/pets_examples.record", "tfrecord/tfx_mnist.tfrecord"]


def local_records(relative):
    return file_records(os.path.join(DATA, relative))


def plain_env(**more):
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "CURL_CA_BUNDLE")}
    env.update(more)
    return env


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_files_over_http_are_the_local_bytes(nginx, tmp_path, scheme):
    port = nginx.http_port if scheme == "http" else nginx.https_port
    urls = ",".join(f"{scheme}://127.0.0.1:{port}/{s}" for s in SHARDS)
    got, done = run_records(tmp_path, plain_env(SSL_CERT_FILE=nginx.ca), urls)
    assert got == [r for s in SHARDS for r in local_records(s)]


def test_curl_ca_bundle_names_the_authority_too(nginx, tmp_path):
    got, done = run_records(tmp_path, plain_env(CURL_CA_BUNDLE=nginx.ca), f"https://127.0.0.1:{nginx.https_port}/{SHARDS[1]}")
    assert got == local_records(SHARDS[1])


def test_a_certificate_that_does_not_verify_fails_at_once(nginx, tmp_path):
    url = f"https://127.0.0.1:{nginx.https_port}/{SHARDS[1]}"
    got, done = run_records(tmp_path, plain_env(), url, check=False)
    assert done.returncode != 0 and url in done.stderr and "certificate" in done.stderr.lower(), done.stderr
    assert "not retried" in done.stderr and "SSL_CERT_FILE" in done.stderr


def test_a_missing_file_is_named(nginx, tmp_path):
    url = f"http://127.0.0.1:{nginx.http_port}/tfrecord/none.tfrecord"
    got, done = run_records(tmp_path, plain_env(), url, check=False)
    assert done.returncode != 0 and url in done.stderr and "HTTP 404" in done.stderr and "no file at this URL" in done.stderr, done.stderr


def test_wildcards_need_a_listing_http_does_not_have(nginx, tmp_path):
    got, done = run_records(tmp_path, plain_env(), f"http://127.0.0.1:{nginx.http_port}/tfrecord/*.tfrecord", check=False)
    assert done.returncode != 0 and "no listing" in done.stderr, done.stderr
