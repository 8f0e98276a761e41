"""Real OTLP clients: the OpenTelemetry Python SDK's exporters (gRPC and
HTTP/protobuf, gzip on) send logs, spans and metrics to `mira ingester`;
the blocks it publishes hold exactly what was sent, attribute types
included. Binaries come from MIRA_BIN (default target/debug/mira)."""

import glob
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from grpc import Compression as GrpcCompression

from serve_proc import MIRA, free_port, wait_until


class Mira:
    """A catalog and an ingester as real processes."""

    def __init__(self, seal_age_s=300):
        self.dir = tempfile.mkdtemp(prefix="mira-e2e-")
        self.catalog = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.grpc = f"127.0.0.1:{free_port()}"
        self.procs = []
        self.procs.append(self._spawn("catalog", ["catalog", "--listen", self.catalog, "--peers", f"0={self.catalog}",
                                                  "--data-dir", os.path.join(self.dir, "catalog")]))
        self.ingester = self._spawn("ingester", ["ingester", "--catalog", self.catalog, "--http-listen", self.http,
                                                 "--grpc-listen", self.grpc, "--data-dir",
                                                 os.path.join(self.dir, "ingester"), "--shards", "2",
                                                 "--seal-age", f"{seal_age_s}s"])
        self.procs.append(self.ingester)
        wait_until("ready", lambda: urllib.request.urlopen(f"http://{self.http}/ready", timeout=1).status == 200)

    def _spawn(self, name, args):
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        return subprocess.Popen([MIRA] + args, stdout=subprocess.DEVNULL, stderr=log)

    def stop_ingester(self):
        """SIGTERM: the ingester seals and publishes what is open."""
        self.ingester.send_signal(signal.SIGTERM)
        assert self.ingester.wait(timeout=120) == 0

    def dump(self):
        """Every published block as an OTLP/JSON export request."""
        files = glob.glob(os.path.join(self.dir, "ingester", "objects", "**", "*.mira"), recursive=True)
        if not files:
            return []
        out = subprocess.run([MIRA, "block-dump"] + files, check=True, capture_output=True, text=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def mira():
    m = Mira()
    yield m
    m.close()


def value(v):
    """(type, python value) of an OTLP/JSON AnyValue."""
    (k, x), = v.items()
    if k == "intValue":
        return ("int", int(x))
    if k == "doubleValue":
        return ("double", float(x))
    if k == "boolValue":
        return ("bool", bool(x))
    if k == "stringValue":
        return ("string", x)
    if k == "arrayValue":
        return ("array", tuple(value(e) for e in x.get("values", [])))
    return (k, json.dumps(x, sort_keys=True))


def attrs(kvs):
    return {kv["key"]: value(kv["value"]) for kv in kvs or []}


RESOURCE = Resource.create({"service.name": "e2e", "deployment.environment": "test", "host.cpus": 2})


def test_logs_over_grpc_and_http_arrive_exactly(mira):
    sent = {}
    for proto, exporter in [
        ("grpc", GrpcLogExporter(endpoint=f"http://{mira.grpc}", insecure=True, compression=GrpcCompression.Gzip)),
        ("http", HttpLogExporter(endpoint=f"http://{mira.http}/v1/logs", compression=HttpCompression.Gzip)),
    ]:
        provider = LoggerProvider(resource=RESOURCE)
        provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        logger = logging.getLogger(f"e2e.{proto}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        handler = LoggingHandler(logger_provider=provider)
        logger.addHandler(handler)
        for i in range(20):
            body = f"{proto} line {i}"
            extra = {"n": i, "ratio": i / 4, "ok": i % 2 == 0, "who": f"user-{i}"}
            logger.warning(body, extra=extra)
            sent[body] = extra
        provider.shutdown()
        logger.removeHandler(handler)
    mira.stop_ingester()
    got = {}
    for req in mira.dump():
        for rl in req.get("resourceLogs", []):
            res = attrs(rl.get("resource", {}).get("attributes"))
            assert res["service.name"] == ("string", "e2e")
            assert res["host.cpus"] == ("int", 2)
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    body = value(r["body"])[1]
                    assert body not in got, f"{body} stored twice"
                    got[body] = (r, attrs(r.get("attributes")))
    assert set(got) == set(sent)
    for body, extra in sent.items():
        r, a = got[body]
        assert a["n"] == ("int", extra["n"])
        assert a["ratio"] == ("double", extra["ratio"])
        assert a["ok"] == ("bool", extra["ok"])
        assert a["who"] == ("string", extra["who"])
        assert r.get("severityText") == "WARN"


def test_spans_over_grpc_and_http_arrive_exactly(mira):
    sent = {}
    for proto, exporter in [
        ("grpc", GrpcSpanExporter(endpoint=f"http://{mira.grpc}", insecure=True, compression=GrpcCompression.Gzip)),
        ("http", HttpSpanExporter(endpoint=f"http://{mira.http}/v1/traces", compression=HttpCompression.Gzip)),
    ]:
        provider = TracerProvider(resource=RESOURCE)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("e2e")
        for i in range(10):
            with tracer.start_as_current_span(f"{proto}-root-{i}") as root:
                root.set_attribute("i", i)
                root.set_attribute("tags", ["a", "b"])
                root.add_event("checkpoint", {"at": 1.5})
                with tracer.start_as_current_span(f"{proto}-child-{i}") as child:
                    child.set_attribute("flag", True)
                sent[f"{proto}-root-{i}"] = format(root.get_span_context().trace_id, "032x")
                sent[f"{proto}-child-{i}"] = format(root.get_span_context().trace_id, "032x")
        provider.shutdown()
    mira.stop_ingester()
    got = {}
    for req in mira.dump():
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    assert s["name"] not in got, f"{s['name']} stored twice"
                    got[s["name"]] = s
    assert set(got) == set(sent)
    for name, trace_id in sent.items():
        s = got[name]
        assert s["traceId"].lower() == trace_id
        a = attrs(s.get("attributes"))
        if "root" in name:
            assert a["i"] == ("int", int(name.rsplit("-", 1)[1]))
            assert a["tags"] == ("array", (("string", "a"), ("string", "b")))
            assert [e["name"] for e in s.get("events", [])] == ["checkpoint"]
            assert attrs(s["events"][0].get("attributes"))["at"] == ("double", 1.5)
        else:
            assert a["flag"] == ("bool", True)
            assert s.get("parentSpanId")


def test_metrics_over_grpc_and_http_arrive(mira):
    for proto, exporter in [
        ("grpc", GrpcMetricExporter(endpoint=f"http://{mira.grpc}", insecure=True, compression=GrpcCompression.Gzip)),
        ("http", HttpMetricExporter(endpoint=f"http://{mira.http}/v1/metrics", compression=HttpCompression.Gzip)),
    ]:
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
        meter = provider.get_meter("e2e")
        counter = meter.create_counter(f"{proto}_requests", unit="1")
        hist = meter.create_histogram(f"{proto}_latency", unit="ms")
        for i in range(10):
            counter.add(2, {"route": "/a"})
            hist.record(i * 10.0, {"route": "/a"})
        provider.shutdown()  # exports once
    mira.stop_ingester()
    got = {}
    for req in mira.dump():
        for rm in req.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    got.setdefault(m["name"], []).append(m)
    for proto in ["grpc", "http"]:
        (c,) = got[f"{proto}_requests"]
        (point,) = c["sum"]["dataPoints"]
        assert value({"intValue": point["asInt"]}) == ("int", 20)
        assert attrs(point.get("attributes")) == {"route": ("string", "/a")}
        (h,) = got[f"{proto}_latency"]
        (hp,) = h["histogram"]["dataPoints"]
        assert int(hp["count"]) == 10
        assert float(hp["sum"]) == 450.0
