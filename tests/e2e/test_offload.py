"""Offload and restore end to end: `mira serve` over moto's S3 server,
with two offload targets, a second moto bucket and a `file://` directory.
Two tenants' logs two days old are rewritten cold; the test takes a byte
copy of every block object and the query answers; offload policies set
with `mira policy set` move each tenant's blocks to one target; `mira
offload list` shows them, queries over the range answer with the offloaded
warning and none of their rows; `mira offload restore` brings them back:
every restored object equals its copy by bytes, the same queries answer
identically (stats normalised), and a second restore copies nothing."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from serve_proc import MIRA, Serve, get_json, wait_until
from test_s3 import BUCKET, Moto

ARCHIVE = "mira-archive"
DAY = 86400 * 10**9
TENANTS = {"offload-s3": "archive", "offload-file": "local"}


def send(serve, tenant, base_ns, n):
    """`n` records of two services at `base_ns` + i seconds."""
    req = ExportLogsServiceRequest()
    for svc in ("api", "worker"):
        rl = req.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", svc
        sl = rl.scope_logs.add()
        for i in range(n):
            lr = sl.log_records.add()
            lr.time_unix_nano = base_ns + i * 10**9
            lr.body.string_value = f"{tenant}-{svc}-{i}"
    r = urllib.request.Request(f"http://{serve.http}/v1/logs", data=req.SerializeToString(), method="POST",
                               headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": tenant})
    with urllib.request.urlopen(r, timeout=30) as resp:
        assert resp.status == 200


def query(serve, tenant, start, end):
    url = f"http://{serve.query}/api/mira/v1/logs?" + urllib.parse.urlencode(
        {"start": start, "end": end, "limit": 1000})
    status, body = get_json(url, {"X-Scope-OrgID": tenant})
    assert status == 200, body
    return body


def normalized(answer):
    a = json.loads(json.dumps(answer))
    a["stats"] = {}
    return a


def compactor_metric(serve, name):
    with urllib.request.urlopen(f"http://{serve.query}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def cold_outputs(serve):
    """Block ids the compactor wrote cold, from its "job done" lines."""
    ids = set()
    for line in re.sub(r"\x1b\[[0-9;]*m", "", serve.log()).splitlines():
        if "job done" in line and re.search(r'kind="?cold\b', line):
            m = re.search(r"output=\"?([0-9A-Z]{26})", line)
            assert m, line
            ids.add(m.group(1))
    return ids


def mira(*args, check=True):
    out = subprocess.run([MIRA] + list(args), capture_output=True, text=True, timeout=300)
    if check:
        assert out.returncode == 0, f"mira {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_offload_to_s3_and_file_then_restore_byte_identical():
    moto = Moto()
    moto.s3().create_bucket(Bucket=ARCHIVE)
    scratch = tempfile.mkdtemp(prefix="mira-offload-")
    local = os.path.join(scratch, "local-archive")
    s3_opts = (f"aws_endpoint=http://127.0.0.1:{moto.port},aws_allow_http=true,aws_region=us-east-1,"
               "aws_access_key_id=test,aws_secret_access_key=test")
    targets = [f"archive=s3://{ARCHIVE}/mira", f"local=file://{local}"]
    serve = Serve("--object-store", f"s3://{BUCKET}", "--object-store-option", s3_opts,
                  "--offload-target", targets[0], "--offload-target", targets[1],
                  "--offload-target-option", s3_opts, "--offload-min-age", "0s",
                  "--plan-interval", "1s", "--min-block-age", "0s", "--settle", "0s", "--cold-after", "1h",
                  "--deletion-grace", "2s", "--seal-age", "1s")
    try:
        base = (time.time_ns() - 2 * DAY) // (3600 * 10**9) * (3600 * 10**9) + 60 * 10**9
        for tenant in TENANTS:
            send(serve, tenant, base, 50)
        start, end = base - 60 * 10**9, base + 3600 * 10**9

        # Sealed, rewritten cold, replaced objects deleted: each tenant's
        # hour is one cold object. (Two objects and an empty backlog alone
        # are not enough: one tenant's just-published hot block is one object
        # before the planner has seen it, and its cold rewrite replaces it.)
        def settled():
            keys = moto.keys()
            return (len(keys) == 2 and all(len(query(serve, t, start, end)["lines"]) == 100 for t in TENANTS)
                    and {k.rsplit("/", 1)[1][:-len(".mira")] for k in keys} <= cold_outputs(serve)
                    and compactor_metric(serve, "mira_compactor_tombstoned_pending_blocks") == 0
                    and compactor_metric(serve, 'mira_compactor_backlog_partitions{kind="cold"}') == 0)
        wait_until("two cold objects", settled, timeout=120)
        originals = {}
        for key in moto.keys():
            originals[key] = moto.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        before = {t: normalized(query(serve, t, start, end)) for t in TENANTS}
        assert all(not b["warnings"] for b in before.values()), before

        # A policy naming a target no compactor registered is refused; ours are.
        refused = mira("policy", "set", "bad", "--catalog", serve.catalog, "--kind", "offload",
                       "--after", "1h", "--target", "nowhere", check=False)
        assert refused.returncode == 2 and "policy field `target`" in refused.stderr, refused
        for tenant, target in TENANTS.items():
            mira("policy", "set", f"{tenant}-1d", "--catalog", serve.catalog, "--kind", "offload",
                 "--tenant", tenant, "--after", "1d", "--target", target)

        def listed():
            out = mira("offload", "list", "--catalog", serve.catalog, "--all-tenants", "--output", "json")
            return json.loads(out.stdout)
        wait_until("both tenants offloaded and primaries freed",
                   lambda: len(moto.keys()) == 0 and len(listed()) == 2, timeout=120)
        table = mira("offload", "list", "--catalog", serve.catalog, "--all-tenants").stdout
        for tenant in TENANTS:
            assert tenant in table, table
        assert f"s3://{ARCHIVE}/mira/" in table and f"file://{local}/" in table, table
        # The copies are the originals.
        for key, data in originals.items():
            tenant = key.split("/")[0]
            if TENANTS[tenant] == "archive":
                copy = moto.s3().get_object(Bucket=ARCHIVE, Key=f"mira/{key}")["Body"].read()
            else:
                with open(os.path.join(local, key), "rb") as f:
                    copy = f.read()
            assert copy == data, key
        for tenant in TENANTS:
            during = query(serve, tenant, start, end)
            assert during["lines"] == [] and during["stats"]["blocks_offloaded"] == 1, during
            assert "offloaded in range" in during["warnings"][0] and "mira offload restore" in during["warnings"][0]

        # Restore each tenant; the primaries come back byte for byte.
        common = ["--catalog", serve.catalog, "--object-store", f"s3://{BUCKET}", "--object-store-option", s3_opts,
                  "--offload-target", targets[0], "--offload-target", targets[1],
                  "--offload-target-option", s3_opts, "--yes", "--output", "json"]
        for tenant in TENANTS:
            out = mira("offload", "restore", "--tenant", tenant, *common)
            events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
            summary = events[-1]
            assert summary["event"] == "summary" and summary["restored"] == 1 and summary["failed"] == 0, events
        assert sorted(moto.keys()) == sorted(originals)
        for key, data in originals.items():
            restored = moto.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert restored == data, f"{key} differs from the original"
        for tenant in TENANTS:
            wait_until(f"{tenant} answering again",
                       lambda t=tenant: normalized(query(serve, t, start, end)) == before[t], timeout=60)
        # A second restore copies nothing.
        for tenant in TENANTS:
            out = mira("offload", "restore", "--tenant", tenant, *common)
            summary = json.loads(out.stdout.splitlines()[-1])
            assert summary["restored"] == 0 and summary["failed"] == 0, summary
        # Restored blocks are pinned: two more compactor rounds, and the
        # policies (which still match them) have not offloaded them again.
        rounds = compactor_metric(serve, "mira_compactor_plans_total")
        wait_until("two compactor rounds over the restored blocks",
                   lambda: compactor_metric(serve, "mira_compactor_plans_total") >= rounds + 2)
        assert sorted(moto.keys()) == sorted(originals)
        for tenant in TENANTS:
            assert normalized(query(serve, tenant, start, end)) == before[tenant]
    finally:
        serve.kill()
        moto.stop()
        shutil.rmtree(scratch, ignore_errors=True)
