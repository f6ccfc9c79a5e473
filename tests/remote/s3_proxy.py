"""A proxy in front of the test S3 server (moto's, which checks every signature) that does what
networks do. It forwards each request's bytes as they came, so that what was signed still holds.

- It injects faults, read from a JSON file that the test rewrites between runs: a list of rules
  {"key": substring of the path, "method": "GET", "action": ..., "at": byte of the body,
   "times": how many matching requests it hits (-1: all)}, where action is
    "reset"    the body's first `at` bytes, then a TCP reset;
    "truncate" the body's first `at` bytes, then a clean close (fewer bytes than promised);
    "status"   an S3 error answer, `status` and `code` (503 SlowDown, 500 InternalError, 429, 403
               AccessDenied), without asking the server;
    "delay"    `seconds` of silence before the request is forwarded.
- It logs every request as a JSON line (method, path, range, status, fault) for the test to read.

Run as: s3_proxy.py PORT UPSTREAM_URL FAULTS_FILE LOG_FILE
"""
import http.client
import http.server
import json
import os
import socket
import struct
import sys
import threading
import time
from urllib.parse import urlsplit

PORT, UPSTREAM, FAULTS, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
UPSTREAM_HOST = urlsplit(UPSTREAM).netloc

lock = threading.Lock()
rules, rules_mtime, hits = [], None, {}


def current_rules():
    global rules, rules_mtime, hits
    try:
        mtime = os.stat(FAULTS).st_mtime_ns
    except FileNotFoundError:
        return []
    if mtime != rules_mtime:
        with open(FAULTS) as f:
            rules = json.load(f)
        rules_mtime, hits = mtime, {}
    return rules


def fault_for(method, path):
    with lock:
        for i, rule in enumerate(current_rules()):
            if rule.get("key", "") not in path or rule.get("method", method) != method:
                continue
            times = rule.get("times", 1)
            if times >= 0 and hits.get(i, 0) >= times:
                continue
            hits[i] = hits.get(i, 0) + 1
            return rule
    return None


def log(entry):
    with lock, open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def s3_error(status, code, message):
    return status, (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                    f'<RequestId>proxy</RequestId></Error>').encode()


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        entry = {"method": self.command, "path": self.path, "range": self.headers.get("Range", "")}
        rule = fault_for(self.command, self.path)
        if rule and rule["action"] == "status":
            entry.update(status=rule["status"], fault=rule.get("code", "status"))
            log(entry)
            return self.answer(*s3_error(rule["status"], rule.get("code", "InternalError"), "injected by the test proxy"),
                               [("Content-Type", "application/xml")])
        if rule and rule["action"] == "delay":
            time.sleep(rule["seconds"])
        upstream = http.client.HTTPConnection(UPSTREAM_HOST, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        upstream.request(self.command, self.path, body=body or None, headers=headers)
        reply = upstream.getresponse()
        entry.update(status=reply.status, fault=rule["action"] if rule else "")
        log(entry)
        cuts = rule and rule["action"] in ("reset", "truncate")
        length = reply.getheader("Content-Length")
        if not cuts and length is not None and self.command != "HEAD":
            # Passed on as it arrives, so that the proxy's own copying overlaps the server's.
            self.send_response(reply.status)
            self.pass_headers(reply)
            self.send_header("Content-Length", length)
            self.end_headers()
            while chunk := reply.read(1 << 20):
                self.wfile.write(chunk)
            upstream.close()
            return
        data = reply.read()
        upstream.close()
        self.send_response(reply.status)
        self.pass_headers(reply)
        # A HEAD answer's length is the object's, not that of its (absent) body.
        self.send_header("Content-Length", reply.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cuts:
            at = min(rule.get("at", 0), len(data))
            self.wfile.write(data[:at])
            self.wfile.flush()
            if rule["action"] == "reset":  # SO_LINGER 0, closed at once: a RST, not a FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            self.close_connection = True
            return
        self.wfile.write(data)

    def pass_headers(self, reply):
        for name, value in reply.getheaders():
            if name.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(name, value)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

    def finish(self):
        try:
            super().finish()
        except (OSError, ValueError):  # a connection the proxy reset on purpose
            pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: a client opening more connections at once had its
    # connection attempts dropped and sent again a second later.
    request_queue_size = 128

    def handle_error(self, request, client_address):
        pass  # a client that went away (Sluice stops reading what it does not need)


if __name__ == "__main__":
    server = Server(("127.0.0.1", PORT), Proxy)
    server.serve_forever()
