"""The Prometheus HTTP API (`/api/v1/*`) as Grafana's Prometheus data source
and Prometheus' own client (`promtool`, client_golang) call it, against
`mira serve` fed by the OpenTelemetry Python SDK: Grafana's health check,
form-encoded POSTs, labels, values and series with `match[]`, Prometheus'
error shapes, tenant isolation, and the same answers as the native API."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from serve_proc import Serve, wait_until

PROMTOOL = shutil.which("promtool")


def call(serve, path, params=None, method="POST", tenant=None, body=None, content_type=None):
    """(status, parsed JSON) of a request as Grafana sends it: POST with a
    form body (no URL parameters), or GET with URL parameters."""
    url = f"http://{serve.query}{path}"
    headers = {}
    data = None
    if method == "POST":
        data = body if body is not None else urllib.parse.urlencode(params or {}, doseq=True).encode()
        headers["Content-Type"] = content_type or "application/x-www-form-urlencoded"
    elif params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    try:
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"http://{s.http}/v1/metrics"),
                                               export_interval_millis=3_600_000)
        provider = MeterProvider(resource=Resource.create({"service.name": "shop"}), metric_readers=[reader])
        meter = provider.get_meter("e2e")
        orders = meter.create_counter("shop.orders", unit="{order}")
        for method, n in (("card", 7), ("cash", 2)):
            orders.add(n, {"payment.method": method})
        latency = meter.create_histogram("shop.latency", unit="s")
        for v in (0.02, 0.2, 1.5):
            latency.record(v)
        provider.shutdown()
        s.sent_at = time.time()

        def arrived():
            _, r = call(s, "/api/v1/query", {"query": "sum(shop_orders_total)", "time": time.time()})
            return r["status"] == "success" and r["data"]["result"]
        wait_until("the counter to be queryable", arrived)
        yield s
    finally:
        s.kill()


def test_grafanas_health_check_answers_scalar_two(serve):
    # pkg/promlib/healthcheck.go: an instant `1+1` over the range 1 s..4 s.
    status, r = call(serve, "/api/v1/query", {"query": "1+1", "time": "4"})
    assert (status, r) == (200, {"status": "success", "data": {"resultType": "scalar", "result": [4, "2"]}})
    # GET works too (Grafana falls back to it; promtool tries POST first).
    status, r = call(serve, "/api/v1/query", {"query": "1+1", "time": "4"}, method="GET")
    assert (status, r["data"]["result"]) == (200, [4, "2"])


def test_instant_and_range_queries_through_form_posts(serve):
    now = time.time()
    status, r = call(serve, "/api/v1/query",
                     {"query": "sum by (payment_method) (shop_orders_total)", "time": f"{now:.3f}"})
    assert status == 200 and r["data"]["resultType"] == "vector", r
    got = {s["metric"]["payment_method"]: s["value"][1] for s in r["data"]["result"]}
    assert got == {"card": "7", "cash": "2"}
    # Times are numbers (seconds), values strings, as Grafana's decoder reads them.
    assert all(isinstance(s["value"][0], (int, float)) for s in r["data"]["result"])
    start, end = int(serve.sent_at) - 60, int(now) + 60
    status, r = call(serve, "/api/v1/query_range",
                     {"query": "sum(shop_orders_total)", "start": start, "end": end, "step": "15"})
    assert status == 200 and r["data"]["resultType"] == "matrix", r
    [series] = r["data"]["result"]
    assert series["metric"] == {}
    assert {v for _, v in series["values"]} == {"9"}
    # The step as a duration, as promtool may send it.
    status, r2 = call(serve, "/api/v1/query_range",
                      {"query": "sum(shop_orders_total)", "start": start, "end": end, "step": "15s"})
    assert (status, r2) == (200, r)


def test_the_prometheus_path_answers_what_the_native_path_answers(serve):
    now = int(time.time())
    for expr in ("shop_orders_total", "sum by (payment_method) (shop_orders_total)",
                 "histogram_quantile(0.5, sum by (le) (shop_latency_seconds_bucket))", "1+1"):
        _, prom = call(serve, "/api/v1/query", {"query": expr, "time": now})
        status, native = serve.api("metrics/query", query=expr, time=now)
        assert status == 200, native
        assert prom["data"] == native["data"], expr
        _, prom = call(serve, "/api/v1/query_range",
                       {"query": expr, "start": now - 300, "end": now, "step": 30})
        _, native = serve.api("metrics/query_range", query=expr, start=now - 300, end=now, step=30)
        assert prom["data"] == native["data"], expr


def test_labels_values_and_series_follow_match(serve):
    now = int(time.time())
    window = {"start": now - 3600, "end": now + 60}
    status, r = call(serve, "/api/v1/labels", window)
    assert status == 200 and {"__name__", "payment_method", "le"} <= set(r["data"]), r
    # Clients ask for labels over all time: the newest --max-query-range of it is answered.
    assert call(serve, "/api/v1/labels", {"start": "0", "end": now + 60}) == (200, r)
    status, r = call(serve, "/api/v1/labels", {**window, "match[]": 'shop_orders_total{payment_method="card"}'})
    assert "payment_method" in r["data"] and "le" not in r["data"], r
    status, r = call(serve, "/api/v1/label/__name__/values", window, method="GET")
    assert status == 200
    assert {"shop_orders_total", "shop_latency_seconds_bucket", "shop_latency_seconds_count"} <= set(r["data"]), r
    status, r = call(serve, "/api/v1/label/payment_method/values", window, method="GET")
    assert r["data"] == ["card", "cash"], r
    status, r = call(serve, "/api/v1/label/payment_method/values", {**window, "limit": "1"}, method="GET")
    assert r["data"] == ["card"], r
    status, r = call(serve, "/api/v1/series", {**window, "match[]": ["shop_orders_total"]})
    assert status == 200
    assert sorted(s["payment_method"] for s in r["data"]) == ["card", "cash"], r
    assert all(s["__name__"] == "shop_orders_total" for s in r["data"])
    # Two match[] are a union.
    status, r = call(serve, "/api/v1/series",
                     {**window, "match[]": ['shop_orders_total{payment_method="card"}', "shop_latency_seconds_count"]})
    assert sorted(s["__name__"] for s in r["data"]) == ["shop_latency_seconds_count", "shop_orders_total"], r
    status, r = call(serve, "/api/v1/series", {**window, "match[]": ["shop_orders_total"], "limit": "1"})
    assert len(r["data"]) == 1 and r["warnings"], r


def test_the_endpoints_grafana_probes_answer_in_prometheus_shape(serve):
    status, r = call(serve, "/api/v1/status/buildinfo", method="GET")
    assert status == 200 and r["status"] == "success"
    # No `features`: Grafana would take the source for Mimir with a ruler.
    assert "features" not in r["data"] and r["data"]["version"], r
    # The exemplar probe at init sends milliseconds; an empty list is the answer.
    assert call(serve, "/api/v1/query_exemplars", {"query": "test", "start": "1700000000000", "end": "1700000600000"}) \
        == (200, {"status": "success", "data": []})
    assert call(serve, "/api/v1/rules", method="GET") == (200, {"status": "success", "data": {"groups": []}})
    assert call(serve, "/api/v1/alerts", method="GET") == (200, {"status": "success", "data": {"alerts": []}})
    # Metadata: each metric's Prometheus type, as Grafana's builder shows it.
    status, r = call(serve, "/api/v1/metadata", method="GET")
    assert (status, r["status"]) == (200, "success"), r
    assert r["data"]["shop_orders_total"] == [{"type": "counter", "help": "", "unit": ""}], r
    assert r["data"]["shop_latency_seconds"] == [{"type": "histogram", "help": "", "unit": ""}], r
    status, r = call(serve, "/api/v1/metadata", {"metric": "shop_orders_total"}, method="GET")
    assert list(r["data"]) == ["shop_orders_total"], r
    # Another tenant sees none of them.
    assert call(serve, "/api/v1/metadata", method="GET", tenant="nobody") == (200, {"status": "success", "data": {}})


@pytest.mark.parametrize("path, params, code, kind, says", [
    ("/api/v1/query", {"query": "sum(rate(x[5m])"}, 400, "bad_data", "parse error"),
    ("/api/v1/query", {"query": "{" * 5000}, 400, "bad_data", ""),
    ("/api/v1/query", {}, 400, "bad_data", "query is required"),
    ("/api/v1/query", {"query": "x", "time": "soon"}, 400, "bad_data", "time="),
    ("/api/v1/query_range", {"query": "x", "start": "100", "end": "50", "step": "15"}, 400, "bad_data", "before start"),
    ("/api/v1/query_range", {"query": "x", "start": "0", "end": "86400", "step": "0.001"}, 422, "execution", "steps"),
    ("/api/v1/query_range", {"query": "x", "start": "0", "end": "1", "step": "-1"}, 400, "bad_data", "step"),
    ("/api/v1/query_range", {"query": "x", "start": "0", "end": "1e20", "step": "60"}, 400, "bad_data", "end="),
    ("/api/v1/series", {"start": "0", "end": "60"}, 400, "bad_data", "match[]"),
    ("/api/v1/series", {"match[]": "sum(x)"}, 400, "bad_data", "not a series selector"),
    ("/api/v1/labels", {"limit": "-3"}, 400, "bad_data", "limit="),
])
def test_bad_requests_get_prometheus_errors_naming_the_problem(serve, path, params, code, kind, says):
    status, r = call(serve, path, params)
    assert (status, r["status"], r["errorType"]) == (code, "error", kind), r
    assert says in r["error"], r
    # The querier keeps serving.
    assert call(serve, "/api/v1/query", {"query": "1+1", "time": "4"})[0] == 200


def test_a_body_that_is_not_a_form_is_refused_and_a_huge_one_too(serve):
    status, r = call(serve, "/api/v1/query", body=b'{"query":"1+1"}', content_type="application/json")
    assert (status, r["errorType"]) == (400, "bad_data") and "form" in r["error"], r
    status, r = call(serve, "/api/v1/query", body=b"query=" + b"a" * (1 << 20))
    assert status in (400, 413), r


def test_a_tenant_sees_only_its_own_series_and_an_empty_tenant_answers_empty(serve):
    now = int(time.time())
    window = {"start": now - 3600, "end": now + 60}
    assert call(serve, "/api/v1/labels", window, tenant="nobody") == (200, {"status": "success", "data": []})
    assert call(serve, "/api/v1/series", {**window, "match[]": "shop_orders_total"}, tenant="nobody") \
        == (200, {"status": "success", "data": []})
    status, r = call(serve, "/api/v1/query", {"query": "shop_orders_total", "time": now}, tenant="nobody")
    assert (status, r["data"]["result"]) == (200, [])


def test_promtool_queries_through_the_prometheus_client(serve):
    assert PROMTOOL, "promtool is missing: install the Debian package prometheus (.ci/run does)"
    url = f"http://{serve.query}"

    def promtool(*args):
        out = subprocess.run([PROMTOOL, "query", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "=> 9 @" in promtool("instant", url, "sum(shop_orders_total)")
    now = int(time.time())
    # The end after the samples (sent less than a second ago, `now` is truncated).
    ranged = promtool("range", f"--start={now - 120}", f"--end={now + 60}", "--step=30s", url, "sum(shop_orders_total)")
    assert "9 @[" in ranged, ranged
    values = promtool("labels", url, "payment_method").split()
    assert values == ["card", "cash"], values
    series = promtool("series", "--match=shop_orders_total", url)
    assert series.count("shop_orders_total") == 2 and 'payment_method="cash"' in series, series
