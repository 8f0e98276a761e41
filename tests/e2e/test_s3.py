"""The ingester against an S3-compatible server (moto, HTTP on loopback)
through object_store's S3 client: blocks land in the bucket and are
published; with the server stopped during a seal, the upload is retried
after it comes back and the block is published once, nothing lost."""

import base64
import glob
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import boto3
import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor

sys.path.insert(0, os.path.dirname(__file__))
from test_otel_sdk import MIRA, free_port, value, wait_until  # noqa: E402

BUCKET = "mira-blocks"


class Moto:
    def __init__(self):
        self.port = free_port()
        self.proc = None
        self.start()

    def start(self):
        moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
        self.proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until("moto", lambda: urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1).status == 200)
        self.s3().create_bucket(Bucket=BUCKET)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()

    def s3(self):
        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test")

    def keys(self):
        out = self.s3().list_objects_v2(Bucket=BUCKET)
        return [o["Key"] for o in out.get("Contents", [])]


def bodies_in_bucket(moto, scratch):
    """Every log body stored in the bucket's blocks, with its count."""
    paths = []
    for i, key in enumerate(moto.keys()):
        path = os.path.join(scratch, f"{i}.mira")
        moto.s3().download_file(BUCKET, key, path)
        paths.append(path)
    counts = {}
    if not paths:
        return counts
    out = subprocess.run([MIRA, "block-dump"] + paths, check=True, capture_output=True, text=True).stdout
    import json
    for line in out.splitlines():
        for rl in json.loads(line).get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for r in sl.get("logRecords", []):
                    b = value(r["body"])[1]
                    counts[b] = counts.get(b, 0) + 1
    return counts


@pytest.fixture
def start_env():
    """Starts moto, a catalog and an ingester writing to moto's bucket;
    extra ingester flags are appended (--seal-age replaces the default 1s)."""
    started = []

    def start(*extra):
        seal_age = [] if "--seal-age" in extra else ["--seal-age", "1s"]
        moto = Moto()
        d = tempfile.mkdtemp(prefix="mira-s3-")
        catalog = f"127.0.0.1:{free_port()}"
        http = f"127.0.0.1:{free_port()}"
        procs = [subprocess.Popen([MIRA, "catalog", "--listen", catalog, "--peers", f"0={catalog}", "--data-dir",
                                   os.path.join(d, "catalog")], stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(d, "catalog.log"), "w"))]
        ingester = subprocess.Popen(
            [MIRA, "ingester", "--catalog", catalog, "--http-listen", http, "--grpc-listen",
             f"127.0.0.1:{free_port()}", "--data-dir", os.path.join(d, "ingester"), "--shards", "1",
             *seal_age, "--object-store", f"s3://{BUCKET}",
             "--object-store-option",
             f"aws_endpoint=http://127.0.0.1:{moto.port},aws_allow_http=true,aws_region=us-east-1,"
             "aws_access_key_id=test,aws_secret_access_key=test", *extra],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "ingester.log"), "w"))
        procs.append(ingester)
        started.append((moto, procs))
        wait_until("ready", lambda: urllib.request.urlopen(f"http://{http}/ready", timeout=1).status == 200)
        return moto, http, ingester, d

    yield start
    for moto, procs in started:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if moto.proc.poll() is None:
            moto.stop()


def send(http, bodies, batch=False):
    provider = LoggerProvider()
    exporter = OTLPLogExporter(endpoint=f"http://{http}/v1/logs")
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter) if batch else SimpleLogRecordProcessor(exporter))
    logger = logging.getLogger(f"s3.{time.time()}")
    logger.propagate = False
    handler = LoggingHandler(logger_provider=provider)
    logger.addHandler(handler)
    for b in bodies:
        logger.warning(b)
    provider.shutdown()
    logger.removeHandler(handler)


def test_blocks_go_to_s3_and_survive_a_store_outage(start_env):
    moto, http, ingester, scratch = start_env()
    first = [f"before-{i}" for i in range(20)]
    send(http, first)
    wait_until("the first block in the bucket", lambda: len(moto.keys()) >= 1, timeout=60)
    assert bodies_in_bucket(moto, scratch) == {b: 1 for b in first}

    # The store goes away; exports are still acknowledged (WAL), the seal's
    # upload fails and is retried.
    moto.stop()
    second = [f"during-{i}" for i in range(20)]
    send(http, second)
    log = os.path.join(scratch, "ingester.log")
    wait_until("a failed upload", lambda: "block upload failed" in open(log).read(), timeout=60)
    # Back (moto keeps nothing across restarts: the bucket is new and empty).
    moto.start()
    wait_until("the retried block in the bucket", lambda: len(moto.keys()) >= 1, timeout=60)
    ingester.send_signal(15)
    assert ingester.wait(timeout=120) == 0
    assert bodies_in_bucket(moto, scratch) == {b: 1 for b in second}


def test_a_large_block_is_uploaded_in_parts(start_env):
    # One generation (no age seal) of ~12 MiB of incompressible bodies, above
    # a 6 MiB multipart threshold: the block goes up as two 8 MiB-bounded parts.
    moto, http, ingester, scratch = start_env("--seal-age", "1h", "--multipart-above", "6MiB")
    bodies = [f"big-{i} " + base64.b64encode(os.urandom(6000)).decode() for i in range(2000)]
    send(http, bodies, batch=True)
    ingester.send_signal(15)
    assert ingester.wait(timeout=120) == 0
    keys = moto.keys()
    assert len(keys) == 1, keys
    head = moto.s3().head_object(Bucket=BUCKET, Key=keys[0])
    assert head["ContentLength"] > 8 << 20, head["ContentLength"]
    # S3 gives a multipart object the ETag "<md5 of part md5s>-<parts>".
    assert head["ETag"].strip('"').endswith("-2"), head["ETag"]
    assert bodies_in_bucket(moto, scratch) == {b: 1 for b in bodies}
