"""A store that misbehaves on purpose, on loopback: each test says how it answers (loops in its
listings, pages of a million keys, web pages for objects, cut connections) and reads back the
requests it got as they were sent (the raw request target: nothing normalised)."""
import http.server
import os
import threading
from xml.sax.saxutils import escape


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_one(self):
        store = self.server.store
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with store.lock:
            store.requests.append((self.command, self.path, body))
        store.answer(self)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_one

    def log_message(self, *args):  # quiet: the tests read store.requests
        pass

    def send(self, status, body=b"", content_type="application/xml", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class HostileStore:
    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        self.answer = lambda handler: handler.send(404, b"<Error><Code>NoSuchKey</Code></Error>")
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.store = self
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self, **more):
        """An S3 user's settings pointing at this store (its signatures are not checked)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID="hostile-key", AWS_SECRET_ACCESS_KEY="hostile-secret",
                   AWS_REGION="us-east-1", AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
        env.update(more)
        return env

    def paths(self):
        with self.lock:
            return [(method, path) for method, path, _ in self.requests]

    def reset(self, answer):
        with self.lock:
            self.requests.clear()
        self.answer = answer

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def listing(keys, next_token=None, size=100):
    """A ListObjectsV2 page (ListBucketResult) of `keys`, truncated when `next_token` is given."""
    contents = "".join(f"<Contents><Key>{escape(k)}</Key><LastModified>2026-11-29T00:00:00.000Z</LastModified>"
                       f"<ETag>&quot;0123456789abcdef0123456789abcdef&quot;</ETag><Size>{size}</Size>"
                       f"<StorageClass>STANDARD</StorageClass></Contents>" for k in keys)
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{escape(next_token)}</NextContinuationToken>" if next_token else \
        "<IsTruncated>false</IsTruncated>"
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>bkt</Name><Prefix></Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>{more}{contents}"
            f"</ListBucketResult>").encode()


def query_of(path):
    from urllib.parse import parse_qs, urlsplit
    return {k: v[0] for k, v in parse_qs(urlsplit(path).query, keep_blank_values=True).items()}
