"""PromQL side by side (docs/perf.md, "PromQL against VictoriaMetrics"):
the same counter and histogram points go to `mira serve` (release) as OTLP
and into VictoriaMetrics (Debian package `victoria-metrics`) through its
Prometheus import; Mira is then restarted so every point is read from
published blocks. Each expression of the battery runs as a range query
(50 minutes at a 60 s step) against both, alternately, after a warm-up,
each run one second later than the one before; answers are compared (same series, values within 1e-6 relative) and the
medians and the ratio Mira / VictoriaMetrics printed.

Shape (scale 1): 1,000 counter series (10 `svc` x 100 `instance`), 240
points each (an hour at 15 s), and 100 histograms (10 `svc` x 10
`instance`, 5 bounds: 600 bucket series). Scale 10 has ten times the
instances.

Usage: scripts/measure/promql.sh [scale] [runs]
(PROMQL_ONLY=<text> runs only the expressions containing it.)"""

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from serve_proc import Serve, free_port, get_json, post, wait_until  # noqa: E402
from test_promql_reference import canon, close  # noqa: E402

VM = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
SCALE = int(sys.argv[1]) if len(sys.argv) > 1 else 1
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 9
SERVICES = [f"svc-{i}" for i in range(10)]
INSTANCES = [f"i-{i:04d}" for i in range(100 * SCALE)]
HIST_INSTANCES = INSTANCES[: 10 * SCALE]
STEP = 15
END = (int(time.time()) // 3600) * 3600 - 3600
START = END - 3600 + STEP
TIMES = list(range(START, END + 1, STEP))
BOUNDS = [0.05, 0.1, 0.5, 1.0, 5.0]
SHAPE = [30, 40, 20, 6, 3, 1]

EXPRESSIONS = [
    "sum by (svc) (rate(requests_total[5m]))",
    "sum(rate(requests_total[5m]))",
    "topk(5, increase(requests_total[10m]))",
    'sum by (svc) (rate(requests_total{instance=~"i-00.0"}[5m]))',
    "max by (svc) (requests_total)",
    "histogram_quantile(0.9, sum by (le, svc) (rate(latency_seconds_bucket[5m])))",
]


def kv(k, v):
    return KeyValue(key=k, value=AnyValue(string_value=v))


def rate_of(s, i):
    # Distinct per series, so topk has no ties.
    return 1.0 + s * 0.37 + i * 0.0011


def counter_value(s, i, t):
    return 1000.0 + rate_of(s, i) * (t - START)


def hist_counts(s, k):
    return [c * (k + 10 + s) for c in SHAPE]


CHUNK = 100  # instances per request (bodies stay a few MB at any scale)


def otlp_requests():
    """One OTLP export per service and CHUNK instances."""
    for s, svc, lo in ((s, svc, lo) for s, svc in enumerate(SERVICES) for lo in range(0, len(INSTANCES), CHUNK)):
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add(resource=Resource(attributes=[kv("service.name", "bench")]))
        sm = rm.scope_metrics.add()
        counter = sm.metrics.add(name="requests")
        counter.sum.is_monotonic = True
        counter.sum.aggregation_temporality = m.AGGREGATION_TEMPORALITY_CUMULATIVE
        hist = sm.metrics.add(name="latency", unit="s")
        hist.histogram.aggregation_temporality = m.AGGREGATION_TEMPORALITY_CUMULATIVE
        for i, inst in list(enumerate(INSTANCES))[lo:lo + CHUNK]:
            attrs = [kv("svc", svc), kv("instance", inst)]
            for t in TIMES:
                counter.sum.data_points.add(time_unix_nano=t * 10**9, start_time_unix_nano=(START - 1000) * 10**9,
                                            as_double=counter_value(s, i, t), attributes=attrs)
        for i, inst in list(enumerate(HIST_INSTANCES))[lo:lo + CHUNK]:
            attrs = [kv("svc", svc), kv("instance", inst)]
            for k, t in enumerate(TIMES):
                counts = hist_counts(s, k)
                hist.histogram.data_points.add(time_unix_nano=t * 10**9, start_time_unix_nano=(START - 1000) * 10**9,
                                               count=sum(counts), sum=0.2 * sum(counts), bucket_counts=counts,
                                               explicit_bounds=BOUNDS, attributes=attrs)
        yield req.SerializeToString()


def prometheus_text():
    """The same points as Mira names them, for VictoriaMetrics' import."""
    base = 'job="bench",service_name="bench"'
    for s, svc, lo in ((s, svc, lo) for s, svc in enumerate(SERVICES) for lo in range(0, len(INSTANCES), CHUNK)):
        lines = []
        for i, inst in list(enumerate(INSTANCES))[lo:lo + CHUNK]:
            labels = f'{base},svc="{svc}",instance="{inst}"'
            for t in TIMES:
                lines.append(f"requests_total{{{labels}}} {counter_value(s, i, t)!r} {t * 1000}")
        for inst in HIST_INSTANCES[lo:lo + CHUNK]:
            labels = f'{base},svc="{svc}",instance="{inst}"'
            for k, t in enumerate(TIMES):
                cumulative = 0
                for bound, c in zip(BOUNDS + [math.inf], hist_counts(s, k)):
                    cumulative += c
                    le = "+Inf" if bound == math.inf else repr(bound)
                    lines.append(f'latency_seconds_bucket{{{labels},le="{le}"}} {cumulative} {t * 1000}')
        yield ("\n".join(lines) + "\n").encode()


def timed(url, params):
    """(milliseconds, parsed JSON) of a form POST, as Grafana sends it."""
    req = urllib.request.Request(url, method="POST", data=urllib.parse.urlencode(params).encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        body = r.read()
    ms = (time.perf_counter() - t) * 1000
    return ms, json.loads(body)


def compare(expr, ours, ref):
    a = canon(ours["data"]["result"], ours["data"]["resultType"])
    b = canon(ref["data"]["result"], ref["data"]["resultType"])
    if set(a) != set(b):
        return f"series differ: {len(a)} vs {len(b)}"
    for k in a:
        if len(a[k]) != len(b[k]) or not all(close(x, y) for x, y in zip(a[k], b[k])):
            return f"values differ for {sorted(k)}"
    return "equal"


def main():
    series = len(SERVICES) * (len(INSTANCES) + len(HIST_INSTANCES) * (len(BOUNDS) + 1))
    print(f"scale {SCALE}: {series} series x {len(TIMES)} points = {series * len(TIMES)} samples; {RUNS} runs each")
    vm_dir = tempfile.mkdtemp(prefix="mira-vm-")
    vm_addr = f"127.0.0.1:{free_port()}"
    vm_log = open(os.path.join(vm_dir, "vm.log"), "w")
    vm = subprocess.Popen([VM, f"-storageDataPath={vm_dir}/data", f"-httpListenAddr={vm_addr}",
                           "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache",
                           "-loggerLevel=ERROR"], stdout=vm_log, stderr=vm_log)
    mira = Serve("--no-compactor")
    try:
        wait_until("victoria-metrics", lambda: urllib.request.urlopen(f"http://{vm_addr}/health", timeout=1).status == 200)
        for body in prometheus_text():
            assert post(f"http://{vm_addr}/api/v1/import/prometheus", body, "text/plain")[0] == 204
        urllib.request.urlopen(f"http://{vm_addr}/internal/force_flush", timeout=60).read()
        for body in otlp_requests():
            assert post(f"http://{mira.http}/v1/metrics", body)[0] == 200
        # Everything sealed and published, then read back from blocks only.
        mira.stop()
        mira.start()

        def count(addr, prefix):
            _, r = get_json(f"http://{addr}{prefix}/api/v1/query?" + urllib.parse.urlencode(
                {"query": "count(requests_total)", "time": END}))
            return r["data"]["result"] and int(float(r["data"]["result"][0]["value"][1]))

        want = len(SERVICES) * len(INSTANCES)
        wait_until("VictoriaMetrics to hold the import", lambda: count(vm_addr, "") == want, timeout=120)
        wait_until("Mira to answer for every series", lambda: count(mira.query, "") == want, timeout=120)
        params = {"start": START + 600, "end": END, "step": 60}
        print(f"{'expression':<78} {'mira ms':>8} {'vm ms':>8} {'ratio':>6}  answers")
        ratios = []
        # PROMQL_ONLY=<text>: only the expressions containing it (to
        # profile one).
        only = os.environ.get("PROMQL_ONLY", "")
        for expr in [e for e in EXPRESSIONS if only in e]:
            p = dict(params, query=expr)
            ours, ref = [], []
            # The first run of each is the warm-up (and the answer compared).
            _, a = timed(f"http://{mira.query}/api/v1/query_range", p)
            _, b = timed(f"http://{vm_addr}/api/v1/query_range", p)
            verdict = compare(expr, a, b)
            # Each run moves the range one second later (as a dashboard's
            # refresh does), so neither side answers from a whole-answer
            # cache: Mira keeps whole answers of published blocks, and
            # VictoriaMetrics runs with its rollup cache off.
            for i in range(1, RUNS + 1):
                pi = dict(p, start=p["start"] + i, end=p["end"] + i)
                ours.append(timed(f"http://{mira.query}/api/v1/query_range", pi)[0])
                ref.append(timed(f"http://{vm_addr}/api/v1/query_range", pi)[0])
            mo, vo = statistics.median(ours), statistics.median(ref)
            ratios.append(mo / vo)
            print(f"{expr:<78} {mo:8.1f} {vo:8.1f} {mo / vo:6.2f}  {verdict}", flush=True)
        print(f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}")
    finally:
        mira.kill()
        vm.kill()
        vm.wait()
        shutil.rmtree(vm_dir, ignore_errors=True)
        shutil.rmtree(mira.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
