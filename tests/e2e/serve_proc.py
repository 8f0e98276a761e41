"""`mira serve` as a real process for the end-to-end tests: free ports, a
temporary data directory, readiness, HTTP helpers and an orderly stop."""

import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIRA = os.environ.get("MIRA_BIN", os.path.join(ROOT, "target", "debug", "mira"))

# Every mira process these tests start shares one cluster secret: the
# internal ports (catalog, Raft, recent data) refuse calls without it
# (docs/security.md). Subprocesses inherit the variable.
CLUSTER_SECRET_FILE = os.path.join(tempfile.mkdtemp(prefix="mira-e2e-secret-"), "cluster-secret")
with open(CLUSTER_SECRET_FILE, "w") as _f:
    _f.write("e2e-cluster-secret-" + os.urandom(16).hex() + "\n")
os.environ["MIRA_CLUSTER_SECRET_FILE"] = CLUSTER_SECRET_FILE


_HANDED_OUT = set()


def free_port():
    """A loopback port nobody listens on, never the same one twice in this
    run: the kernel may offer a port again once its probe socket closes,
    and two processes given one port answer each other's requests (a
    compactor answered a querier's 404)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_until(what, check, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def get_json(url, headers=None, context=None):
    """(status, parsed JSON body) of a GET (over TLS with `context`); a
    body that is not JSON comes back as text."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            body = r.read()
            try:
                return r.status, json.loads(body)
            except ValueError:
                return r.status, body.decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, body.decode("utf-8", "replace")


def post(url, body, content_type="application/x-protobuf"):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def varint(n):
    """A protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):
    """A length-delimited protobuf field."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def tls_context(ca_path):
    """A client TLS context trusting only `ca_path`."""
    return ssl.create_default_context(cafile=ca_path)


class Serve:
    """`mira serve` on free ports with its data in a temporary directory;
    with `ca` (a CA file) its ports are expected to speak TLS."""

    def __init__(self, *extra, data_dir=None, ca=None, client_cert=None, http_host="127.0.0.1"):
        self.dir = data_dir or tempfile.mkdtemp(prefix="mira-serve-")
        self.extra = list(extra)
        self.context = tls_context(ca) if ca else None
        if client_cert:
            self.context.load_cert_chain(*client_cert)
        self.scheme = "https" if ca else "http"
        self.query = f"127.0.0.1:{free_port()}"
        self.http = f"{http_host}:{free_port()}"
        self.grpc = f"127.0.0.1:{free_port()}"
        self.catalog = f"127.0.0.1:{free_port()}"
        self.proc = None
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.dir, f"serve-{self.starts}.log"), "w")
        self.proc = subprocess.Popen(
            [MIRA, "serve", "--data-dir", os.path.join(self.dir, "data"), "--listen", self.query,
             "--http-listen", self.http, "--grpc-listen", self.grpc, "--catalog-listen", self.catalog,
             "--shards", "2"] + self.extra,
            stdout=subprocess.DEVNULL, stderr=log)
        wait_until("mira serve ready",
                   lambda: urllib.request.urlopen(f"{self.scheme}://{self.query}/ready", timeout=1,
                                                  context=self.context).status == 200)

    def stop(self):
        """SIGINT: stop accepting, seal and publish, exit."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=90) == 0, self.log()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self):
        with open(os.path.join(self.dir, f"serve-{self.starts}.log")) as f:
            return f.read()[-4000:]

    def api(self, path, headers=None, **params):
        return get_json(f"{self.scheme}://{self.query}/api/mira/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}",
                        headers=headers, context=self.context)

    def get(self, path, headers=None, **params):
        """(status, JSON or text) of GET `path` on the query port."""
        query = urllib.parse.urlencode(params, doseq=True)
        return get_json(f"{self.scheme}://{self.query}{path}{'?' + query if query else ''}", headers=headers,
                        context=self.context)
