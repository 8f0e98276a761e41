"""PromQL answers checked against a reference engine: the same metric points
go to `mira serve` as OTLP and into VictoriaMetrics (Debian package
`victoria-metrics`) in Prometheus text form, named as Mira's OTLP
translation names them; a table of instant and range queries must give
the same series and values (within floating-point tolerance).

Counters grow at a constant rate per series and samples fall on the step
grid, so Prometheus' extrapolated `rate`/`increase` and VictoriaMetrics'
(which does not extrapolate) agree exactly."""

import math
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from serve_proc import Serve, free_port, get_json, post, wait_until

VM = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
STEP = 15  # seconds between samples
END = (int(time.time()) // 3600) * 3600 - 3600  # an hour boundary, an hour or two ago
START = END - 7200
TIMES = list(range(START, END + 1, STEP))
RATES = {("api", "GET"): 3.0, ("api", "POST"): 1.0, ("web", "GET"): 2.0, ("web", "POST"): 0.5}
BOUNDS = [0.1, 0.5, 1.0, 5.0]
SHAPES = {"api": [5, 20, 10, 4, 1], "web": [1, 4, 10, 20, 5]}


def kv(k, v):
    return KeyValue(key=k, value=AnyValue(string_value=v))


def memory(job, t):
    return 1e6 * (3 if job == "api" else 5) + 1000.0 * math.sin((t - START) / 600.0)


def otlp_request():
    """Every point, per service, as one OTLP export."""
    req = ExportMetricsServiceRequest()
    for job in ("api", "web"):
        rm = req.resource_metrics.add(resource=Resource(attributes=[kv("service.name", job)]))
        sm = rm.scope_metrics.add()
        counter = sm.metrics.add(name="http.server.requests", unit="{request}")
        counter.sum.is_monotonic = True
        counter.sum.aggregation_temporality = m.AGGREGATION_TEMPORALITY_CUMULATIVE
        gauge = sm.metrics.add(name="process.memory.usage", unit="By")
        hist = sm.metrics.add(name="http.server.duration", unit="s")
        hist.histogram.aggregation_temporality = m.AGGREGATION_TEMPORALITY_CUMULATIVE
        for i, t in enumerate(TIMES):
            ns = t * 1_000_000_000
            for method in ("GET", "POST"):
                counter.sum.data_points.add(time_unix_nano=ns, start_time_unix_nano=START * 10**9 - 10**12,
                                            as_double=10000.0 + RATES[(job, method)] * (t - START),
                                            attributes=[kv("http.method", method)])
            gauge.gauge.data_points.add(time_unix_nano=ns, as_double=memory(job, t))
            counts = [c * (i + 100) for c in SHAPES[job]]
            hist.histogram.data_points.add(time_unix_nano=ns, start_time_unix_nano=START * 10**9 - 10**12,
                                           count=sum(counts), sum=0.3 * sum(counts), bucket_counts=counts,
                                           explicit_bounds=BOUNDS)
    return req.SerializeToString()


def prometheus_text():
    """The same points as Mira names them, for VictoriaMetrics' import."""
    lines = []
    for job in ("api", "web"):
        base = f'job="{job}",service_name="{job}"'
        for i, t in enumerate(TIMES):
            ms = t * 1000
            for method in ("GET", "POST"):
                v = 10000.0 + RATES[(job, method)] * (t - START)
                lines.append(f'http_server_requests_total{{{base},http_method="{method}"}} {v!r} {ms}')
            lines.append(f"process_memory_usage_bytes{{{base}}} {memory(job, t)!r} {ms}")
            counts = [c * (i + 100) for c in SHAPES[job]]
            cumulative = 0
            for bound, c in zip(BOUNDS + [math.inf], counts):
                cumulative += c
                le = "+Inf" if bound == math.inf else repr(bound)
                lines.append(f'http_server_duration_seconds_bucket{{{base},le="{le}"}} {cumulative} {ms}')
            lines.append(f"http_server_duration_seconds_count{{{base}}} {sum(counts)} {ms}")
            lines.append(f"http_server_duration_seconds_sum{{{base}}} {0.3 * sum(counts)!r} {ms}")
    return ("\n".join(lines) + "\n").encode()


EXPRESSIONS = [
    "http_server_requests_total",
    'http_server_requests_total{http_method="GET"}',
    'http_server_requests_total{job=~"a.*"}',
    "rate(http_server_requests_total[5m])",
    "increase(http_server_requests_total[5m])",
    "sum by (job) (rate(http_server_requests_total[5m]))",
    "avg by (http_method) (rate(http_server_requests_total[5m]))",
    "max by (job) (rate(http_server_requests_total[5m]))",
    "sum(increase(http_server_requests_total[10m]))",
    "process_memory_usage_bytes",
    "max by (job) (process_memory_usage_bytes)",
    "min(process_memory_usage_bytes)",
    "avg(process_memory_usage_bytes)",
    "count by (job) (http_server_requests_total)",
    "histogram_quantile(0.9, sum by (le) (rate(http_server_duration_seconds_bucket[5m])))",
    "histogram_quantile(0.5, sum by (le, job) (rate(http_server_duration_seconds_bucket[5m])))",
    "histogram_quantile(0.99, rate(http_server_duration_seconds_bucket[5m]))",
    "rate(http_server_duration_seconds_sum[5m]) / rate(http_server_duration_seconds_count[5m])",
    # Matchers on `le`: a block's bucket series are chosen before their
    # points are read, without their `le` (querier promql::load).
    'http_server_duration_seconds_bucket{le="0.5"}',
    'sum by (le) (rate(http_server_duration_seconds_bucket{le=~"0.1|.Inf"}[5m]))',
    'http_server_duration_seconds_bucket{le!="+Inf", le=~"0[.].*", job="web"}',
    "sum by (job) (rate(http_server_requests_total[5m])) * 60",
]


def canon(result, result_type):
    """{frozenset(labels): [values]} of a Prometheus API result."""
    out = {}
    if result_type == "vector":
        for s in result:
            out[frozenset(s["metric"].items())] = [float(s["value"][1])]
    elif result_type == "matrix":
        for s in result:
            out[frozenset(s["metric"].items())] = [(int(float(t)), float(v)) for t, v in s["values"]]
    else:
        out[frozenset()] = [float(result[1])]
    return out


def close(a, b):
    if isinstance(a, tuple):
        return a[0] == b[0] and close(a[1], b[1])
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-9 + 1e-6 * max(abs(a), abs(b))


@pytest.fixture(scope="module")
def engines():
    vm_dir = tempfile.mkdtemp(prefix="mira-vm-")
    vm_addr = f"127.0.0.1:{free_port()}"
    vm_log = open(os.path.join(vm_dir, "vm.log"), "w")
    vm = subprocess.Popen([VM, f"-storageDataPath={vm_dir}/data", f"-httpListenAddr={vm_addr}",
                           "-retentionPeriod=100y", "-search.latencyOffset=0s", "-search.disableCache",
                           "-loggerLevel=ERROR"], stdout=vm_log, stderr=vm_log)
    mira = Serve("--seal-age", "3s")
    try:
        wait_until("victoria-metrics", lambda: urllib.request.urlopen(f"http://{vm_addr}/health", timeout=1).status == 200)
        assert post(f"http://{vm_addr}/api/v1/import/prometheus", prometheus_text(), "text/plain")[0] == 204
        urllib.request.urlopen(f"http://{vm_addr}/internal/force_flush", timeout=10).read()
        assert post(f"http://{mira.http}/v1/metrics", otlp_request())[0] == 200

        def vm_has_all():
            _, r = get_json(f"http://{vm_addr}/api/v1/query?" + urllib.parse.urlencode(
                {"query": "count(http_server_requests_total)", "time": END}))
            return r["data"]["result"] and r["data"]["result"][0]["value"][1] == "4"
        wait_until("VictoriaMetrics to hold the import", vm_has_all)
        yield mira, vm_addr
    finally:
        mira.kill()
        vm.kill()
        vm.wait()


def both(mira, vm_addr, kind, params):
    status, ours = mira.api(f"metrics/{kind}", **params)
    assert status == 200, ours
    # The Prometheus path (a form POST, as Grafana sends it) answers the same.
    req = urllib.request.Request(f"http://{mira.query}/api/v1/{kind}", method="POST",
                                 data=urllib.parse.urlencode(params).encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=30) as r:
        prom = json.loads(r.read())
    assert prom["status"] == "success" and prom["data"] == ours["data"], (prom, ours)
    _, ref = get_json(f"http://{vm_addr}/api/v1/{kind}?" + urllib.parse.urlencode(params))
    assert ref["status"] == "success", ref
    return ours, ref


def compare(expr, ours, ref):
    a = canon(ours["data"]["result"], ours["data"]["resultType"])
    b = canon(ref["data"]["result"], ref["data"]["resultType"])
    assert set(a) == set(b), f"{expr}: series differ\nmira: {sorted(map(sorted, a))}\nvm:   {sorted(map(sorted, b))}"
    for k in a:
        assert len(a[k]) == len(b[k]), f"{expr} {sorted(k)}: {len(a[k])} points vs {len(b[k])}"
        bad = [(x, y) for x, y in zip(a[k], b[k]) if not close(x, y)]
        assert not bad, f"{expr} {sorted(k)}: first differences {bad[:3]}"


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_instant_queries_match_victoriametrics(engines, expr):
    mira, vm_addr = engines
    for t in (START + 1800, END - 600, END):
        ours, ref = both(mira, vm_addr, "query", {"query": expr, "time": t})
        assert ref["data"]["result"], f"{expr} at {t}: the reference has no data (bad test)"
        compare(f"{expr} @ {t}", ours, ref)


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_range_queries_match_victoriametrics(engines, expr):
    mira, vm_addr = engines
    ours, ref = both(mira, vm_addr, "query_range", {"query": expr, "start": START + 600, "end": END, "step": 60})
    assert ref["data"]["result"], f"{expr}: the reference has no data (bad test)"
    compare(expr, ours, ref)


# `@` and negative offsets read samples outside [start - range, end]
# (issue 29: they answered empty). Evaluated where every window they name
# holds samples: not at END, where a negative offset reads the future.
SHIFTED = [
    f"http_server_requests_total @ {START + 900}",
    f"rate(http_server_requests_total[5m] @ {END - 1200})",
    "http_server_requests_total offset -5m",
    "sum by (job) (rate(http_server_requests_total[5m] offset -10m))",
    "process_memory_usage_bytes @ start()",
]


@pytest.mark.parametrize("expr", SHIFTED)
def test_at_and_negative_offsets_match_victoriametrics(engines, expr):
    mira, vm_addr = engines
    for t in (START + 1800, END - 1200):
        ours, ref = both(mira, vm_addr, "query", {"query": expr, "time": t})
        assert ref["data"]["result"], f"{expr} at {t}: the reference has no data (bad test)"
        compare(f"{expr} at {t}", ours, ref)
    ours, ref = both(mira, vm_addr, "query_range", {"query": expr, "start": START + 600, "end": END - 1200, "step": 60})
    assert ref["data"]["result"], f"{expr}: the reference has no data (bad test)"
    compare(expr, ours, ref)
