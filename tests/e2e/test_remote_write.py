"""Prometheus remote write into a real `mira serve` from a real Prometheus
(Debian `prometheus` 2.42, remote write 1.0): it scrapes itself and a test
exporter every second and writes everything it scrapes to Mira. The same
samples are then in Prometheus' own TSDB and in Mira, and PromQL must
answer the same from both: 30 queries, instant at an unaligned time and
over a range at an unaligned start and step, and the series API. Then the
hostile bodies: each is a 400 (or 413 / 415) naming the problem, and the
samples acknowledged before are all still there. A second sender,
vmagent (Debian victoria-metrics), writes the same exporter's page as
another tenant, and Mira shows the series Prometheus shows."""

import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cramjam
import pytest

from serve_proc import Serve, field, free_port, get_json, varint, wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="Debian prometheus is installed by .ci/run")

STARTED = time.time()


def exposition():
    """The test exporter's page: a counter of each kind of name, a gauge,
    a histogram, a summary, an info metric, label values that need
    escaping and names Mira must not rename; values a function of time."""
    t = time.time() - STARTED
    n = int(t * 10)
    lines = [
        "# HELP test_requests_total Requests served.",
        "# TYPE test_requests_total counter",
        f'test_requests_total{{code="200",method="GET"}} {3 * n}',
        f'test_requests_total{{code="500",method="GET"}} {n // 7}',
        f'test_requests_total{{code="200",method="POST"}} {n + 0.5}',
        "# HELP test_events Events without the _total suffix.",
        "# TYPE test_events counter",
        f"test_events {2 * n}",
        "# TYPE test_temperature_celsius gauge",
        f'test_temperature_celsius{{room="a"}} {20 + 5 * math.sin(t / 3):.6f}',
        f'test_temperature_celsius{{room="b"}} {-3.25 + (n % 11)}',
        "# TYPE test_latency_seconds histogram",
    ]
    total = 0
    for le, share in (("0.1", 5), ("0.5", 9), ("1", 12), ("+Inf", 13)):
        total = share * n
        lines.append(f'test_latency_seconds_bucket{{le="{le}"}} {total}')
    lines += [
        f"test_latency_seconds_sum {0.37 * total:.4f}",
        f"test_latency_seconds_count {total}",
        "# TYPE test_rpc_duration_seconds summary",
        f'test_rpc_duration_seconds{{quantile="0.5"}} {0.2 + (n % 5) / 100}',
        f'test_rpc_duration_seconds{{quantile="0.99"}} {0.9 + (n % 3) / 100}',
        f"test_rpc_duration_seconds_sum {1.5 * n}",
        f"test_rpc_duration_seconds_count {4 * n}",
        "# TYPE test_build_info gauge",
        'test_build_info{version="1.2.3",revision="abc"} 1',
        '# TYPE test_odd gauge',
        'test_odd{path="/a \\"b\\" \\\\ é",empty=""} 7',
        "# TYPE test__double_underscore gauge",
        f"test__double_underscore {n % 4}",
        "# TYPE test:recorded:rate gauge",
        f"test:recorded:rate {n / 10}",
    ]
    return ("\n".join(lines) + "\n").encode()


class Exporter(BaseHTTPRequestHandler):
    def do_GET(self):
        body = exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


QUERIES = [
    "up",
    'up{job="exporter"}',
    "test_requests_total",
    'test_requests_total{code="200"}',
    "rate(test_requests_total[10s])",
    "sum by (code) (rate(test_requests_total[10s]))",
    "increase(test_requests_total[15s])",
    "test_events",
    "rate(test_events[10s])",
    "test_temperature_celsius",
    "avg_over_time(test_temperature_celsius[20s])",
    "max_over_time(test_temperature_celsius[20s]) - min_over_time(test_temperature_celsius[20s])",
    "delta(test_temperature_celsius[20s])",
    "test_latency_seconds_bucket",
    "histogram_quantile(0.9, sum by (le) (rate(test_latency_seconds_bucket[10s])))",
    "rate(test_latency_seconds_sum[10s]) / rate(test_latency_seconds_count[10s])",
    'test_rpc_duration_seconds{quantile="0.99"}',
    "test_rpc_duration_seconds_sum / test_rpc_duration_seconds_count",
    "test_build_info",
    "test_odd",
    "test__double_underscore",
    "changes(test__double_underscore[20s])",
    "test:recorded:rate",
    'count by (__name__) ({job="exporter", __name__=~"test_.*"})',
    'scrape_samples_scraped{job="exporter"}',
    "scrape_duration_seconds",
    "prometheus_build_info",
    "topk(2, test_requests_total)",
    "test_requests_total offset 5s",
    "irate(test_events[10s])",
    "clamp_min(test_temperature_celsius, 0)",
    'sum(test_requests_total) by (method) > 10',
    "count(up)",
]


def prom_query(base, path, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    status, body = get_json(url)
    assert status == 200, (url, status, body)
    assert body["status"] == "success", body
    return body["data"]


def canonical(data):
    """Result as sorted (labels, values) with values as floats."""
    kind = data["resultType"]
    result = data["result"]
    if kind == "scalar":
        return [((), ((result[0], float(result[1])),))]
    out = []
    for s in result:
        labels = tuple(sorted(s["metric"].items()))
        if kind == "vector":
            values = ((s["value"][0], float(s["value"][1])),)
        else:
            values = tuple((t, float(v)) for t, v in s["values"])
        out.append((labels, values))
    return sorted(out)


def same(a, b):
    if len(a) != len(b):
        return False
    for (la, va), (lb, vb) in zip(a, b):
        if la != lb or len(va) != len(vb):
            return False
        for (ta, xa), (tb, xb) in zip(va, vb):
            if abs(ta - tb) > 1e-6:
                return False
            if math.isnan(xa) or math.isnan(xb):
                if not (math.isnan(xa) and math.isnan(xb)):
                    return False
            elif not math.isclose(xa, xb, rel_tol=1e-12, abs_tol=1e-12):
                return False
    return True


@pytest.fixture(scope="module")
def setup():
    serve = Serve()
    exporter = ThreadingHTTPServer(("127.0.0.1", free_port()), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    work = tempfile.mkdtemp(prefix="mira-prom-")
    prom_addr = f"127.0.0.1:{free_port()}"
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{{targets: ["{prom_addr}"]}}]
  - job_name: exporter
    static_configs: [{{targets: ["127.0.0.1:{exporter.server_address[1]}"]}}]
remote_write:
  - url: http://{serve.http}/api/v1/write
    queue_config: {{batch_send_deadline: 500ms, min_backoff: 50ms, max_backoff: 1s}}
    metadata_config: {{send: true, send_interval: 2s}}
"""
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write(config)
    log = open(os.path.join(work, "prometheus.log"), "w")
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/tsdb",
         f"--web.listen-address={prom_addr}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://{prom_addr}"
    try:
        wait_until("prometheus ready", lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=1).status == 200)
        # Twenty scrapes of the exporter in Prometheus' own TSDB, then an
        # unaligned time a few seconds back that both stores hold
        # everything up to.
        def scrapes():
            data = prom_query(base, "/api/v1/query", query='count_over_time(up{job="exporter"}[1m])')
            return data["result"] and float(data["result"][0]["value"][1]) >= 20

        wait_until("20 scrapes of the exporter", scrapes, timeout=90)
        at = time.time() - 3.371

        def sent_past(t):
            data = prom_query(base, "/api/v1/query",
                              query="min(prometheus_remote_storage_queue_highest_sent_timestamp_seconds)")
            return data["result"] and float(data["result"][0]["value"][1]) > t + 1.5

        wait_until("remote write sent past the evaluation time", lambda: sent_past(at), timeout=60)
        yield serve, base, at, prom
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        exporter.shutdown()
        serve.kill()


@pytest.mark.parametrize("query", QUERIES)
def test_promql_over_remote_written_samples_equals_prometheus(setup, query):
    serve, base, at, _ = setup
    mira = f"http://{serve.query}"
    want = canonical(prom_query(base, "/api/v1/query", query=query, time=f"{at:.3f}"))
    got = canonical(prom_query(mira, "/api/v1/query", query=query, time=f"{at:.3f}"))
    assert want, f"Prometheus has no answer for {query}: the test's data is wrong"
    assert same(got, want), f"{query}\nmira:       {got}\nprometheus: {want}"
    rng = dict(query=query, start=f"{at - 13.7:.3f}", end=f"{at:.3f}", step="2.3")
    want = canonical(prom_query(base, "/api/v1/query_range", **rng))
    got = canonical(prom_query(mira, "/api/v1/query_range", **rng))
    assert same(got, want), f"range {query}\nmira:       {got}\nprometheus: {want}"


def test_series_read_back_with_the_labels_prometheus_shows(setup):
    serve, base, at, _ = setup
    params = {"match[]": '{job="exporter"}', "start": f"{at - 10:.3f}", "end": f"{at:.3f}"}
    want = sorted(tuple(sorted(s.items())) for s in prom_query(base, "/api/v1/series", **params))
    got = sorted(tuple(sorted(s.items())) for s in prom_query(f"http://{serve.query}", "/api/v1/series", **params))
    assert want, "Prometheus has no exporter series: the test's data is wrong"
    assert got == want


def post_rw(serve, body, content_type="application/x-protobuf", encoding="snappy", raw=False):
    data = body if raw else bytes(cramjam.snappy.compress_raw(body))
    headers = {"Content-Type": content_type, "X-Prometheus-Remote-Write-Version": "0.1.0"}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(f"http://{serve.http}/api/v1/push", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}


def series(labels, samples):
    """A 1.0 TimeSeries: labels as given (in their order), samples (ms, value)."""
    import struct
    out = b""
    for k, v in labels:
        out += field(1, field(1, k.encode()) + field(2, v.encode()))
    for t, v in samples:
        out += field(2, b"\x09" + struct.pack("<d", v) + b"\x10" + varint(t))
    return field(1, out)


def test_hostile_bodies_are_refused_with_the_problem_named_and_nothing_lost(setup):
    serve, _, _, _ = setup
    mira = f"http://{serve.query}"
    now = int(time.time() * 1000)
    acked = series([("__name__", "hostile_probe"), ("job", "probe")], [(now, 42.0)])
    status, text, headers = post_rw(serve, acked)
    assert status == 204, text
    assert headers.get("x-prometheus-remote-write-samples-written") == "1"
    cases = [
        # (body, snappy it?, content type, expected status, words)
        # Snappy bombs: a block declaring 2 GiB, and 20 MiB of zeros in
        # about 1 MiB (the decompressed limit is 16 MiB).
        (varint(1 << 31) + b"\0" * 16, False, None, 413, "exceeds"),
        (bytes(cramjam.snappy.compress_raw(b"\0" * (20 << 20))), False, None, 413, "exceeds"),
        (b"\x10not snappy at all", False, None, 400, "malformed snappy body"),
        (b"\x0a\x7f\x0a", True, None, 400, "malformed remote write request"),
        (series([("__name__", "x"), ("b", "1"), ("a", "1")], [(now, 1.0)]), True, None, 400, "not sorted"),
        (series([("__name__", "x"), ("a", "1"), ("a", "2")], [(now, 1.0)]), True, None, 400, "duplicate label name"),
        (series([("", "x"), ("__name__", "x")], [(now, 1.0)]), True, None, 400, "empty label name"),
        (series([("job", "x")], [(now, 1.0)]), True, None, 400, "without a metric name"),
        (field(4, b"") + field(4, b"__name__") + field(5, field(1, varint(1) + varint(99))), True,
         "application/x-protobuf;proto=io.prometheus.write.v2.Request", 400, "symbol reference 99 is out of range"),
        (acked, True, "application/x-protobuf;proto=io.prometheus.write.v3.Request", 415, "unsupported remote write message"),
    ]
    for body, snap, ctype, want_status, words in cases:
        data = bytes(cramjam.snappy.compress_raw(body)) if snap else body
        status, text, _ = post_rw(serve, data, content_type=ctype or "application/x-protobuf", raw=True)
        assert status == want_status and words in text, (body[:40], status, text)
    # A sample too old: refused with the reason, its neighbour written.
    mixed = series([("__name__", "hostile_old")], [(now - 30 * 24 * 3600 * 1000, 1.0)]) + \
        series([("__name__", "hostile_probe"), ("job", "probe"), ("x", "1")], [(now, 43.0)])
    status, text, headers = post_rw(serve, mixed)
    assert status == 400 and "too old" in text, text
    assert headers.get("x-prometheus-remote-write-samples-written") == "1"
    wait_until("the probes read back", lambda: len(
        prom_query(mira, "/api/v1/query", query="hostile_probe", time=f"{now / 1000:.3f}")["result"]) == 2)
    got = prom_query(mira, "/api/v1/query", query="hostile_probe", time=f"{now / 1000:.3f}")["result"]
    assert sorted(float(s["value"][1]) for s in got) == [42.0, 43.0]
    assert serve.proc.poll() is None


def test_acknowledged_remote_write_survives_kill_9_and_a_wal_mode_change():
    """Every sample acknowledged (204) before a kill -9 reads back after a
    restart with another WAL mode, and nothing that was not sent does."""
    serve = Serve("--wal", "fsync")
    try:
        now = int(time.time() * 1000)
        acked = set()
        for i in range(40):
            body = series([("__name__", "rw_kill_probe"), ("i", str(i))], [(now, float(i))])
            status, text, _ = post_rw(serve, body)
            assert status == 204, text
            acked.add(str(i))
        serve.proc.kill()
        serve.proc.wait()
        serve.extra = ["--wal", "page-cache"]
        serve.start()
        base = f"http://{serve.query}"

        def read():
            result = prom_query(base, "/api/v1/query", query="rw_kill_probe", time=f"{now / 1000:.3f}")["result"]
            return {s["metric"]["i"]: float(s["value"][1]) for s in result}

        wait_until("the acknowledged samples read back", lambda: set(read()) == acked)
        assert read() == {i: float(i) for i in acked}
    finally:
        serve.kill()


VMAGENT = shutil.which("vmagent") or "/usr/bin/vmagent"


@pytest.mark.skipif(not os.path.exists(VMAGENT), reason="vmagent (Debian victoria-metrics) is installed by .ci/run")
def test_vmagent_remote_writes_the_series_prometheus_shows(setup):
    """A second real sender: vmagent (Debian victoria-metrics) scrapes its
    own copy of the test exporter and remote-writes it, as another tenant
    (`-remoteWrite.headers`). Mira shows the exporter's series with the
    labels Prometheus shows for its scrape of the same page."""
    serve, base, at, _ = setup
    exporter = ThreadingHTTPServer(("127.0.0.1", free_port()), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    work = tempfile.mkdtemp(prefix="mira-vmagent-")
    target = f"127.0.0.1:{exporter.server_address[1]}"
    with open(os.path.join(work, "scrape.yml"), "w") as f:
        f.write(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: exporter
    static_configs: [{{targets: ["{target}"]}}]
""")
    log = open(os.path.join(work, "vmagent.log"), "w")
    vm = subprocess.Popen(
        [VMAGENT, f"-promscrape.config={work}/scrape.yml", f"-remoteWrite.url=http://{serve.http}/api/v1/write",
         "-remoteWrite.headers=X-Scope-OrgID:vmagent", f"-remoteWrite.tmpDataPath={work}/queue",
         "-remoteWrite.flushInterval=500ms", f"-httpListenAddr=127.0.0.1:{free_port()}", "-loggerLevel=WARN"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        def names(labelsets):
            return sorted(tuple(sorted((k, v) for k, v in s.items() if k != "instance")) for s in labelsets
                          if s["__name__"].startswith("test") or s["__name__"] == "up")

        params = {"match[]": '{job="exporter"}', "start": f"{at - 10:.3f}", "end": f"{time.time() + 5:.3f}"}
        want = names(prom_query(base, "/api/v1/series", **params))
        assert want, "Prometheus has no exporter series: the test's data is wrong"

        def got():
            status, body = get_json(f"http://{serve.query}/api/v1/series?{urllib.parse.urlencode(params)}",
                                    headers={"X-Scope-OrgID": "vmagent"})
            assert status == 200, body
            return body["data"]

        wait_until("vmagent's series in Mira", lambda: names(got()) == want, timeout=60)
        # Its own instance, and nothing of Prometheus' tenant.
        assert {s.get("instance") for s in got()} == {target}
        assert vm.poll() is None
    finally:
        vm.terminate()
        vm.wait(timeout=30)
        exporter.shutdown()
