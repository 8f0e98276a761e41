"""`mira serve` end to end with the OpenTelemetry Python SDK's exporters:
logs, traces and metrics sent; the native query API returns exactly what
was sent (values, attribute types, order), first from open blocks
(read-your-writes), then, after Ctrl-C and a restart, from published ones."""

import logging
import time
import urllib.request

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from serve_proc import Serve

RESOURCE = Resource.create({"service.name": "shop", "deployment.environment": "e2e"})


def attrs(kvs):
    """OTLP/JSON attributes as {key: (type, value)}."""
    return {a["key"]: next(iter(a["value"].items())) for a in kvs}


def send_everything(serve):
    # Logs through the logging module, HTTP/protobuf with gzip.
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(
        endpoint=f"http://{serve.http}/v1/logs", compression=Compression.Gzip)))
    logger = logging.getLogger("e2e-serve")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = LoggingHandler(level=logging.INFO, logger_provider=provider)
    logger.addHandler(handler)
    for i in range(20):
        logger.warning("line-%d", i, extra={"order.id": i, "ratio": i / 4, "vip": i % 2 == 0, "region": "eu"})
        time.sleep(0.002)  # distinct timestamps, so newest-first order is the send order reversed
    provider.shutdown()
    logger.removeHandler(handler)

    # One trace over gRPC: a root and two children, typed attributes, an event.
    tracer_provider = TracerProvider(resource=RESOURCE)
    tracer_provider.add_span_processor(SimpleSpanProcessor(GrpcSpanExporter(endpoint=serve.grpc, insecure=True)))
    tracer = tracer_provider.get_tracer("e2e")
    with tracer.start_as_current_span("checkout", attributes={"cart.items": 3, "paid": True}) as root:
        with tracer.start_as_current_span("reserve", attributes={"warehouse": "b7"}) as child:
            child.add_event("reserved", {"units": 3})
        with tracer.start_as_current_span("charge", attributes={"amount": 19.5}):
            pass
        trace_id = format(root.get_span_context().trace_id, "032x")
    tracer_provider.shutdown()

    # A counter and a histogram, exported once.
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"http://{serve.http}/v1/metrics"),
                                           export_interval_millis=3_600_000)
    meter_provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = meter_provider.get_meter("e2e")
    orders = meter.create_counter("shop.orders", unit="{order}")
    for method, n in (("card", 7), ("cash", 2)):
        orders.add(n, {"payment.method": method})
    latency = meter.create_histogram("shop.latency", unit="s")
    for v in (0.003, 0.02, 0.2, 0.2, 1.5):
        latency.record(v)
    meter_provider.force_flush()
    meter_provider.shutdown()
    return trace_id


def check_everything(serve, trace_id):
    status, logs = serve.api("logs", limit=100, selector='{resource.service.name="shop"}')
    assert status == 200, logs
    lines = logs["lines"]
    assert [l["record"]["body"]["stringValue"] for l in lines] == [f"line-{i}" for i in reversed(range(20))]
    first = attrs(lines[-1]["record"]["attributes"])
    assert first["order.id"] == ("intValue", "0")
    assert first["ratio"] == ("doubleValue", 0.0)
    assert first["vip"] == ("boolValue", True)
    assert first["region"] == ("stringValue", "eu")
    assert attrs(lines[0]["record"]["attributes"])["ratio"] == ("doubleValue", 4.75)
    assert lines[0]["record"]["severityText"] == "WARN"
    assert attrs(lines[0]["resource"]["attributes"])["deployment.environment"] == ("stringValue", "e2e")
    # A record-attribute selector and a line filter.
    status, some = serve.api("logs", selector='{vip="true", region="eu"}', contains="line-1")
    assert status == 200, some
    assert [l["record"]["body"]["stringValue"] for l in some["lines"]] == [f"line-{i}" for i in (18, 16, 14, 12, 10)]

    status, trace = serve.api(f"traces/{trace_id}")
    assert status == 200, trace
    assert trace["span_count"] == 3
    spans = {s["name"]: s for rs in trace["trace"]["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert set(spans) == {"checkout", "reserve", "charge"}
    assert attrs(spans["checkout"]["attributes"]) == {"cart.items": ("intValue", "3"), "paid": ("boolValue", True)}
    assert attrs(spans["charge"]["attributes"]) == {"amount": ("doubleValue", 19.5)}
    assert spans["reserve"]["events"][0]["name"] == "reserved"
    assert spans["reserve"]["parentSpanId"] == spans["checkout"]["spanId"]
    status, found = serve.api("traces/search", service="shop", name="charge")
    assert status == 200, found
    assert [(t["traceId"], t["rootSpanName"], t["spanCount"]) for t in found["traces"]] == [(trace_id, "checkout", 3)]

    status, q = serve.api("metrics/query", query="sum by (payment_method) (shop_orders_total)")
    assert status == 200, q
    got = {s["metric"]["payment_method"]: float(s["value"][1]) for s in q["data"]["result"]}
    assert got == {"card": 7.0, "cash": 2.0}
    # The SDK's default bounds are 0, 5, 10, ...: every value is in (0, 5].
    status, q = serve.api("metrics/query", query='shop_latency_seconds_bucket{le=~"0|5|.Inf"}')
    assert status == 200, q
    assert [(s["metric"]["le"], float(s["value"][1])) for s in q["data"]["result"]] == \
        [("+Inf", 5.0), ("0", 0.0), ("5", 5.0)]
    status, q = serve.api("metrics/query", query="shop_latency_seconds_sum")
    assert abs(float(q["data"]["result"][0]["value"][1]) - 1.923) < 1e-9, q
    status, q = serve.api("metrics/query", query="shop_latency_seconds_count")
    assert [(s["metric"]["job"], float(s["value"][1])) for s in q["data"]["result"]] == [("shop", 5.0)]

    status, labels = serve.api("labels", signal="logs")
    assert status == 200 and "order.id" in labels["data"] and "resource.service.name" in labels["data"], labels
    status, values = serve.api("label/region/values", signal="logs")
    assert values["data"] == ["eu"], values
    status, labels = serve.api("labels", signal="metrics")
    assert {"__name__", "job", "payment_method", "le", "service_name"} <= set(labels["data"]), labels
    status, names = serve.api("label/__name__/values", signal="metrics")
    assert {"shop_orders_total", "shop_latency_seconds_bucket", "shop_latency_seconds_count"} <= set(names["data"])
    return logs["stats"]


def test_everything_sent_is_answered_before_and_after_a_restart():
    serve = Serve()
    try:
        trace_id = send_everything(serve)
        stats = check_everything(serve, trace_id)
        assert stats["recent_blocks"] > 0, f"read-your-writes: rows came from open blocks ({stats})"
        serve.stop()
        serve.start()
        stats = check_everything(serve, trace_id)
        assert stats["recent_blocks"] == 0 and stats["blocks_considered"] > 0, stats
        # One registry and one probe router for the whole process, served
        # on every HTTP port (query API and OTLP/HTTP) alike.
        for port in (serve.query, serve.http):
            with urllib.request.urlopen(f"http://{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            for family in ("mira_querier_requests", "mira_querier_cache_hits_total", "mira_ingester_inflight_requests",
                           "mira_catalog_raft_term"):
                assert family in text, (port, family)
            # One exposition, not several texts spliced together.
            assert text.count("# EOF") == 1 and text.rstrip().endswith("# EOF"), port
            families = [l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")]
            assert len(families) == len(set(families)), port
            with urllib.request.urlopen(f"http://{port}/live", timeout=10) as r:
                assert (r.status, r.read()) == (200, b"live\n"), port
            with urllib.request.urlopen(f"http://{port}/ready", timeout=10) as r:
                assert (r.status, r.read()) == (200, b"ready\n"), port
    finally:
        serve.kill()
