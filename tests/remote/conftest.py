"""Servers for the remote-storage tests, started on loopback by the tests themselves and stopped
after them: moto's S3 server (the peers environment, BUILD_DIR/peers, made by
scripts/install-deps.sh) with its signature checks on, for an IAM user the tests make; boto3 as the
independent client that puts the test files in and reads Sluice's outputs back."""
import base64
import json
import os
import sys
import socket
import subprocess
import time

import pytest

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
CLI = os.environ.get("SLUICE_CLI", os.path.join(SOURCE_DIR, "build", "bin", "sluice"))
PEERS = os.environ.get("SLUICE_PEERS_DIR", os.path.join(SOURCE_DIR, "build", "peers"))
DATA = os.path.join(SOURCE_DIR, "tests", "data", "real")


def tfrecord_records(data):
    """The records of TFRecord bytes (length, its CRC, the record, its CRC), as jsonl_sink writes
    them: base64 text."""
    records, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at:at + 8], "little")
        records.append(base64.b64encode(data[at + 12:at + 12 + length]).decode())
        at += 16 + length
    return records


def file_records(path):
    with open(path, "rb") as f:
        return tfrecord_records(f.read())


def stop_process(process):
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, process, what, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {seconds} s")


class S3Server:
    """moto's S3 server. Its first three requests go unchecked (INITIAL_NO_AUTH_ACTION_COUNT): they
    make an IAM user allowed s3:* and its access key; every request after them must carry a
    Signature Version 4 that moto recomputes with botocore from what it received."""

    def __init__(self, root):
        server = os.path.join(PEERS, "bin", "moto_server")
        if not os.path.exists(server):
            pytest.fail(f"{server} is missing: run scripts/install-deps.sh (it makes the peers environment in BUILD_DIR/peers)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.root = root
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
        self.process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(self.port)], env=env, cwd=root,
                                        stdout=subprocess.DEVNULL, stderr=open(os.path.join(root, "moto.log"), "w"), stdin=subprocess.DEVNULL)
        wait_for_port(self.port, self.process, "moto_server")
        import boto3  # Debian's python3-boto3: a client of another version than the server's
        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap")
        iam.create_user(UserName="sluice-tests")
        iam.put_user_policy(UserName="sluice-tests", PolicyName="all-of-s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="sluice-tests")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                                   aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def env(self, **more):
        """The environment a user sets for an S3-compatible store, and nothing of this machine's AWS setup."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key, AWS_REGION="us-east-1",
                   AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
        env.update(more)
        return env

    def upload_tree(self, bucket, folder, prefix):
        """Every file under `folder` as PREFIX/RELATIVE_PATH; returns {key: local path}."""
        uploaded = {}
        for dirpath, _, names in os.walk(folder):
            for name in names:
                local = os.path.join(dirpath, name)
                key = prefix + "/" + os.path.relpath(local, folder)
                self.client.upload_file(local, bucket, key)
                uploaded[key] = local
        return uploaded

    def stop(self):
        stop_process(self.process)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    server = S3Server(str(tmp_path_factory.mktemp("moto")))
    yield server
    server.stop()


def run_cli_cut(args, env, after, sig=None):
    """Runs the CLI and sends it `sig` (SIGTERM by default: a checkpoint, then exit 75) after
    `after` seconds; the finished process."""
    import signal
    run = subprocess.Popen([CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    time.sleep(after)
    run.send_signal(sig if sig is not None else signal.SIGTERM)
    run.stdout_text, run.stderr_text = run.communicate(timeout=60)
    return run


def run_cli(args, env, check=True, timeout=120):
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


class FaultProxy:
    """tests/remote/s3_proxy.py in front of the S3 server: injects faults."""

    def __init__(self, s3, folder):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.faults = os.path.join(folder, "faults.json")
        self.log = os.path.join(folder, "requests.jsonl")
        self.s3 = s3
        self.set_faults([])
        self.process = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "s3_proxy.py"), str(self.port), s3.endpoint,
                                         self.faults, self.log], stdin=subprocess.DEVNULL)
        wait_for_port(self.port, self.process, "the fault proxy")

    def set_faults(self, rules):
        """Rules take effect for the next requests, each counted from zero."""
        tmp = self.faults + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rules, f)
        os.replace(tmp, self.faults)
        time.sleep(0.01)  # a later rewrite gets another modification time
        open(self.log, "w").close()

    def requests(self):
        with open(self.log) as f:
            return [json.loads(line) for line in f]

    def env(self, **more):
        return self.s3.env(AWS_ENDPOINT_URL=self.endpoint, **more)

    def stop(self):
        stop_process(self.process)


@pytest.fixture(scope="session")
def proxy(s3, tmp_path_factory):
    p = FaultProxy(s3, str(tmp_path_factory.mktemp("proxy")))
    yield p
    p.stop()


class Nginx:
    """nginx (Debian's nginx-light) serving `root` over HTTP and HTTPS, with a certificate for
    127.0.0.1 signed by a certificate authority made here (ca.pem: what SSL_CERT_FILE names)."""

    def __init__(self, folder, root):
        self.folder, self.root = folder, root
        self.http_port, self.https_port = free_port(), free_port()
        self.ca = os.path.join(folder, "ca.pem")
        self.make_certificates()
        conf = os.path.join(folder, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""
daemon off;
master_process off;
worker_processes 1;
error_log {folder}/error.log;
pid {folder}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body; proxy_temp_path {folder}/proxy; fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi; scgi_temp_path {folder}/scgi;
    server {{ listen 127.0.0.1:{self.http_port}; root {root}; }}
    server {{
        listen 127.0.0.1:{self.https_port} ssl;
        ssl_certificate {folder}/server.pem; ssl_certificate_key {folder}/server.key;
        root {root};
    }}
}}
""")
        self.process = subprocess.Popen(["nginx", "-c", conf, "-p", folder, "-e", os.path.join(folder, "error.log")],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_port(self.http_port, self.process, "nginx")
        wait_for_port(self.https_port, self.process, "nginx")

    def make_certificates(self):
        def openssl(*args):
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.folder)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=Sluice test CA")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
        with open(os.path.join(self.folder, "san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem",
                "-days", "2", "-extfile", "san.ext")

    def stop(self):
        stop_process(self.process)


@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    server = Nginx(str(tmp_path_factory.mktemp("nginx")), DATA)
    yield server
    server.stop()
