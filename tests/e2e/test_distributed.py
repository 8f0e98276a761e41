"""The distributed roles as separate processes: three catalog members, two
ingesters and two queriers over moto's S3 server. What the OpenTelemetry
SDK sent through either ingester is answered by either querier exactly as
`mira serve` answers it: first from the ingesters' open blocks, then from
the published blocks in S3."""

import os
import subprocess
import tempfile
import urllib.parse
import urllib.request

from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from serve_proc import MIRA, free_port, get_json, wait_until
from test_s3 import BUCKET, Moto
from test_serve import check_everything, send_everything


class Querier:
    def __init__(self, addr):
        self.query = addr

    def api(self, path, **params):
        return get_json(f"http://{self.query}/api/mira/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}")


class Ingester:
    def __init__(self, http, grpc):
        self.http, self.grpc = http, grpc


def send_other_logs(http, n):
    import logging
    provider = LoggerProvider(resource=Resource.create({"service.name": "other"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"http://{http}/v1/logs")))
    logger = logging.getLogger("e2e-distributed")
    logger.propagate = False
    handler = LoggingHandler(logger_provider=provider)
    logger.addHandler(handler)
    for i in range(n):
        logger.error("other-%d", i)
    provider.shutdown()
    logger.removeHandler(handler)


def test_three_catalogs_two_ingesters_two_queriers_over_s3():
    moto = Moto()
    d = tempfile.mkdtemp(prefix="mira-dist-")
    procs = []

    def spawn(name, args):
        p = subprocess.Popen([MIRA] + args, stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, f"{name}.log"), "w"))
        procs.append(p)
        return p

    store = ["--object-store", f"s3://{BUCKET}", "--object-store-option",
             f"aws_endpoint=http://127.0.0.1:{moto.port},aws_allow_http=true,aws_region=us-east-1,"
             "aws_access_key_id=test,aws_secret_access_key=test"]
    try:
        members = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        peers = ",".join(f"{i}={a}" for i, a in enumerate(members))
        for i, a in enumerate(members):
            spawn(f"catalog-{i}", ["catalog", "--node-id", str(i), "--listen", a, "--peers", peers,
                                   "--data-dir", os.path.join(d, f"catalog-{i}")])
        catalog = ",".join(members)
        ingesters = []
        for name in ("a", "b"):
            http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            spawn(f"ingester-{name}", ["ingester", "--ingester-id", f"ingester-{name}", "--catalog", catalog,
                                       "--http-listen", http, "--grpc-listen", grpc, "--shards", "2",
                                       "--seal-age", "5m", "--data-dir", os.path.join(d, f"ingester-{name}")]
                  + store)
            ingesters.append(Ingester(http, grpc))
        queriers = []
        for name in ("1", "2"):
            addr = f"127.0.0.1:{free_port()}"
            spawn(f"querier-{name}", ["querier", "--listen", addr, "--catalog", catalog,
                                      "--data-dir", os.path.join(d, f"querier-{name}")] + store)
            queriers.append(Querier(addr))
        for i in ingesters:
            wait_until("ingester ready", lambda: urllib.request.urlopen(f"http://{i.http}/ready", timeout=1).status == 200)
        for q in queriers:
            wait_until("querier ready", lambda: urllib.request.urlopen(f"http://{q.query}/ready", timeout=1).status == 200)

        trace_id = send_everything(ingesters[0])
        send_other_logs(ingesters[1].http, 7)
        for q in queriers:
            stats = check_everything(q, trace_id)
            assert stats["recent_blocks"] > 0 and stats["ingesters_asked"] == 2, stats
            status, other = q.api("logs", selector='{resource.service.name="other"}')
            assert [l["record"]["body"]["stringValue"] for l in other["lines"]] == \
                [f"other-{i}" for i in reversed(range(7))], other
            status, every = q.api("logs", limit=1000)
            assert len(every["lines"]) == 27, every["stats"]

        # Ingesters stop (seal, publish to S3); queriers answer the same from the bucket.
        for p in procs[3:5]:
            p.terminate()
            assert p.wait(timeout=90) == 0
        assert any(k.endswith(".mira") for k in moto.keys())
        for q in queriers:
            stats = check_everything(q, trace_id)
            assert stats["recent_blocks"] == 0 and stats["blocks_considered"] > 0, stats
            status, every = q.api("logs", limit=1000)
            assert len(every["lines"]) == 27 and not every["partial"], every["stats"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        moto.stop()
