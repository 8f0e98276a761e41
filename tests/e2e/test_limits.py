"""Per-tenant limits (`--limits-file`, docs/security.md "Limits") seen by the
OpenTelemetry Python SDK's OTLP/HTTP log exporter: a tenant over its
records rate is answered 429, which the SDK retries and finally reports as
a failed export; nothing of the refused batch is stored. Another tenant,
sending at the same time, has every one of its rows stored exactly once."""

import logging
import os
import sys
import threading

from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

sys.path.insert(0, os.path.dirname(__file__))
from serve_proc import Serve, wait_until  # noqa: E402

LIMITS = """
[tenants.capped]
ingest_records_per_second = 1
ingest_records_burst = 10
"""


class Recording(OTLPLogExporter):
    """The SDK's exporter, recording each batch's size and result."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.results = []

    def export(self, batch):
        result = super().export(batch)
        self.results.append((len(batch), result.name))
        return result


def send(serve, tenant, bodies, timeout=10):
    """Sends `bodies` as one batch (one request) through the SDK; returns
    the exporter's record of (batch size, result)."""
    exporter = Recording(endpoint=f"http://{serve.http}/v1/logs", headers={"X-Scope-OrgID": tenant},
                         timeout=timeout)
    provider = LoggerProvider()
    provider.add_log_record_processor(
        BatchLogRecordProcessor(exporter, max_export_batch_size=len(bodies), max_queue_size=len(bodies) * 2,
                                schedule_delay_millis=600_000))
    logger = logging.getLogger(f"limits-{tenant}-{bodies[0]}")
    logger.propagate = False
    handler = LoggingHandler(logger_provider=provider)
    logger.addHandler(handler)
    for b in bodies:
        logger.warning(b)
    provider.force_flush()
    provider.shutdown()
    logger.removeHandler(handler)
    return exporter.results


def lines(serve, tenant):
    status, body = serve.api("logs", headers={"X-Scope-OrgID": tenant}, limit=5000)
    assert status == 200, body
    return [line["record"]["body"].get("stringValue") for line in body["lines"]]


def test_a_capped_tenant_is_refused_and_another_loses_nothing(tmp_path, caplog):
    limits = tmp_path / "limits.toml"
    limits.write_text(LIMITS)
    serve = Serve("--limits-file", str(limits))
    try:
        # The whole burst in one batch: acknowledged.
        kept = [f"capped-kept-{i}" for i in range(10)]
        assert send(serve, "capped", kept) == [(10, "SUCCESS")]

        # While the other tenant sends 20 batches of 50, capped sends 20
        # more records: 10 s of refill away. The SDK is answered 429,
        # retries until its 3 s deadline, and reports a failure.
        free = [[f"free-{b}-{i}" for i in range(50)] for b in range(20)]
        results = []

        def free_sender():
            for batch in free:
                results.extend(send(serve, "free", batch))

        t = threading.Thread(target=free_sender)
        t.start()
        with caplog.at_level(logging.WARNING):
            refused = send(serve, "capped", [f"capped-refused-{i}" for i in range(20)], timeout=3)
        t.join()
        assert refused == [(20, "FAILURE")]
        assert any("429" in r.getMessage() or "Too Many Requests" in r.getMessage() for r in caplog.records), \
            [r.getMessage() for r in caplog.records]
        assert results == [(50, "SUCCESS")] * 20

        # Every row of free exactly once; only capped's acknowledged ones.
        want = sorted(b for batch in free for b in batch)
        wait_until("free's rows", lambda: len(lines(serve, "free")) >= len(want))
        assert sorted(lines(serve, "free")) == want
        wait_until("capped's rows", lambda: len(lines(serve, "capped")) >= len(kept))
        assert sorted(lines(serve, "capped")) == sorted(kept)
        status, text = serve.get("/metrics")
        assert status == 200
        assert 'mira_limits_refusals_total{kind="records"}' in text, text[-2000:]
    finally:
        serve.kill()
