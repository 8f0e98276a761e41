"""The compactor among real processes over moto's S3 server: three `mira
catalog` members, one `mira ingester` sealing every second under `mira
loadgen` (another tenant), two `mira compactor` replicas and one `mira
querier`. While the compactors merge the current hour and rewrite two past
hours cold, cursor walks of the native logs API (newest first, small
pages) are compared with the exact set of acknowledged records: every row
once, in order, none lost across a swap. At the end, once the compactors
are idle and the deletion grace has passed, the bucket holds exactly the
catalog's live objects and each partition is within the planner's bound."""

import datetime
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)

from serve_proc import MIRA, free_port, get_json, wait_until
from test_s3 import BUCKET, Moto

TENANT = "compactor-e2e"
OTHER = "loadgen-e2e"
HOUR = 3600 * 10**9
MERGE_FACTOR = 4
DELETION_GRACE_S = 20
PAGE = 7  # small pages: many page boundaries fall inside a group of ties


class Sender(threading.Thread):
    """Sends records with unique bodies, five per timestamp (ties, as batch
    exporters stamp them: a cursor must not skip or repeat one of five lines
    sharing a time when a merge happens between two pages), over OTLP/HTTP
    (raw protobuf) and remembers which were acknowledged: a past hour's
    records at once (`send_hour`), or current records until halted (the
    thread)."""

    def __init__(self, http):
        super().__init__(daemon=True)
        self.http = http
        self.lock = threading.Lock()
        self.sent = {}       # body -> time, set before the request goes out
        self.acked = {}      # body -> time, HTTP 200 without rejections
        self.uncertain = {}  # body -> time, the request failed: stored or not
        self.halt = threading.Event()
        self.error = None
        self.n = 0
        self.last_ts = 0

    def _post(self, recs):
        req = ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", "compactor-e2e"
        sl = rl.scope_logs.add()
        for body, ts in recs:
            lr = sl.log_records.add()
            lr.time_unix_nano = ts
            lr.body.string_value = body
        with self.lock:
            self.sent.update(recs)
        http_req = urllib.request.Request(f"http://{self.http}/v1/logs", data=req.SerializeToString(),
                                          method="POST", headers={"Content-Type": "application/x-protobuf",
                                                                  "X-Scope-OrgID": TENANT})
        try:
            with urllib.request.urlopen(http_req, timeout=30) as r:
                answer = ExportLogsServiceResponse.FromString(r.read())
                ok = r.status == 200
        except (urllib.error.URLError, OSError):
            ok, answer = False, None
        with self.lock:
            if ok and answer.partial_success.rejected_log_records == 0:
                self.acked.update(recs)
            else:
                self.uncertain.update(recs)
                if answer is not None:
                    self.error = f"partial success: {answer.partial_success}"

    def _records(self, count, ts_of):
        out = []
        for _ in range(count):
            out.append((f"rec-{self.n}", ts_of()))
            self.n += 1
        return out

    def send_hour(self, start):
        """200 records inside the hour starting at `start`, five per
        timestamp, 15 s apart, 25 a request."""
        times = iter(start + (i // 5 + 1) * 15 * 10**9 for i in range(200))
        for _ in range(8):
            self._post(self._records(25, lambda: next(times)))

    def run(self):
        def now():
            if self.n % 5 == 0:
                self.last_ts = max(time.time_ns(), self.last_ts + 1)
            return self.last_ts
        try:
            while not self.halt.is_set():
                self._post(self._records(20, now))
                self.halt.wait(0.2)  # pacing: about 5 requests a second
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)

    def snapshot(self):
        with self.lock:
            return dict(self.sent), dict(self.acked), dict(self.uncertain)


def metrics(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(mira_compactor_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def jobs(addrs, outcome, kind=None):
    """Sum of mira_compactor_jobs_total{outcome=...} over the compactors."""
    total = 0
    for a in addrs:
        for (name, labels), v in metrics(a).items():
            if name == "mira_compactor_jobs_total" and f'outcome="{outcome}"' in labels \
                    and (kind is None or f'kind="{kind}"' in labels):
                total += v
    return total


def walk(querier, start, end):
    """Every line of TENANT in [start, end), newest first, following the
    cursor; (time, body) pairs and whether any page merged recent data."""
    lines, cursor, recent = [], None, 0
    for _ in range(10_000):
        params = {"start": start, "end": end, "limit": PAGE}
        if cursor:
            params["cursor"] = cursor
        status, body = get_json(f"http://{querier}/api/mira/v1/logs?{urllib.parse.urlencode(params)}",
                                headers={"X-Scope-OrgID": TENANT})
        assert status == 200, body
        assert not body["partial"], body["warnings"]
        assert len(body["lines"]) <= PAGE
        lines += [(int(l["timeUnixNano"]), l["record"]["body"]["stringValue"]) for l in body["lines"]]
        recent += body["stats"]["recent_blocks"]
        cursor = body.get("cursor")
        if not cursor:
            return lines, recent
    raise AssertionError("the cursor never ended")


def check_walk(lines):
    """No row twice, times non-increasing; the bodies."""
    bodies = [b for _, b in lines]
    dups = {b for b in bodies if bodies.count(b) > 1} if len(set(bodies)) != len(bodies) else set()
    assert not dups, f"rows returned more than once: {sorted(dups)[:20]}"
    times = [t for t, _ in lines]
    bad = [i for i in range(1, len(times)) if times[i] > times[i - 1]]
    assert not bad, f"not newest first at {bad[:5]}: {lines[bad[0] - 1:bad[0] + 1]}"
    return set(bodies)


def partition_of(key):
    """'YYYY-MM-DD/HH' of an object key tenant/logs/YYYY-MM-DD/HH/id.mira."""
    parts = key.split("/")
    return f"{parts[2]}/{parts[3]}"


def partition_name(start_ns):
    return datetime.datetime.fromtimestamp(start_ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d/%H")


def test_two_compactors_under_load_answer_every_acknowledged_row_once():
    moto = Moto()
    d = tempfile.mkdtemp(prefix="mira-compactor-")
    procs = []

    def spawn(name, args, **kw):
        p = subprocess.Popen([MIRA] + args, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(d, f"{name}.log"), "w"), **kw)
        procs.append(p)
        return p

    def log(name):
        with open(os.path.join(d, f"{name}.log")) as f:
            return f.read()

    store = ["--object-store", f"s3://{BUCKET}", "--object-store-option",
             f"aws_endpoint=http://127.0.0.1:{moto.port},aws_allow_http=true,aws_region=us-east-1,"
             "aws_access_key_id=test,aws_secret_access_key=test"]
    sender = None
    try:
        members = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        peers = ",".join(f"{i}={a}" for i, a in enumerate(members))
        for i, a in enumerate(members):
            spawn(f"catalog-{i}", ["catalog", "--node-id", str(i), "--listen", a, "--peers", peers,
                                   "--data-dir", os.path.join(d, f"catalog-{i}")])
        catalog = ",".join(members)
        http, grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        spawn("ingester", ["ingester", "--ingester-id", "ingester-0", "--catalog", catalog, "--http-listen", http,
                           "--grpc-listen", grpc, "--shards", "1", "--seal-age", "1s",
                           "--data-dir", os.path.join(d, "ingester")] + store)
        querier = f"127.0.0.1:{free_port()}"
        spawn("querier", ["querier", "--listen", querier, "--catalog", catalog,
                          "--data-dir", os.path.join(d, "querier")] + store)
        compactors = []
        for name in ("c1", "c2"):
            addr = f"127.0.0.1:{free_port()}"
            spawn(f"compactor-{name}", [
                "compactor", "--compactor-id", name, "--catalog", catalog, "--compactor-listen", addr,
                "--data-dir", os.path.join(d, f"compactor-{name}"), "--compactor-threads", "1",
                "--min-block-age", "0s", "--merge-factor", str(MERGE_FACTOR), "--plan-interval", "1s",
                "--partition-lease-ttl", "5s", "--deletion-grace", f"{DELETION_GRACE_S}s",
                # A closed hour is rewritten cold once nothing was published
                # into it for 2 s; the current hour only gets hot merges.
                "--cold-after", "0s", "--settle", "2s"] + store)
            compactors.append(addr)
        for addr in [http, querier] + compactors:
            wait_until(f"{addr} ready", lambda: urllib.request.urlopen(f"http://{addr}/ready", timeout=1).status == 200)

        # Background load into another tenant: a block of it at every seal.
        loadgen = spawn("loadgen", ["loadgen", "--target", http, "--protocol", "http", "--signal", "logs",
                                    "--tenant", OTHER, "--conns", "1", "--batch", "100", "--rate", "2",
                                    "--for", "600"])

        hour_now = time.time_ns() // HOUR * HOUR
        past = [hour_now - 3 * HOUR, hour_now - 2 * HOUR]
        query_start = past[0]
        sender = Sender(http)

        def published():
            lines, recent = walk(querier, query_start, time.time_ns() + HOUR)
            return recent == 0 and set(sender.snapshot()[1]) <= check_walk(lines)

        # One past hour at a time, each published before the next is sent: an
        # ingester generation holding two hours' records is one block in the
        # partition of its earliest record.
        for p in past:
            sender.send_hour(p)
            assert sender.error is None, sender.error
            wait_until(f"hour {partition_name(p)} published", published)
        sender.start()

        # Walks while the compactors work and records keep arriving: no row
        # twice, newest first, nothing that was not sent, and every record
        # acknowledged before the walk began is in it.
        walks_during = 0
        deadline = time.time() + 60
        while True:
            assert time.time() < deadline, (f"compaction did not get going: ok jobs "
                                             f"{jobs(compactors, 'ok')}, cold {jobs(compactors, 'ok', 'cold')} ({d})")
            assert sender.error is None, sender.error
            _, acked_before, _ = sender.snapshot()
            lines, _ = walk(querier, query_start, time.time_ns() + HOUR)
            got = check_walk(lines)
            sent, _, _ = sender.snapshot()
            assert got <= set(sent), f"rows never sent: {sorted(got - set(sent))[:10]}"
            missing = set(acked_before) - got
            assert not missing, f"acknowledged rows missing during compaction: {sorted(missing)[:20]} ({d})"
            assert all(sent[b] == t for t, b in lines), "a row's time changed"
            walks_during += 1
            if walks_during >= 3 and jobs(compactors, "ok", "merge") >= 10 and jobs(compactors, "ok", "cold") >= 2:
                break

        sender.halt.set()
        sender.join(60)
        assert not sender.is_alive()
        assert sender.error is None, sender.error
        loadgen.send_signal(signal.SIGTERM)
        loadgen.wait(30)
        _, acked, uncertain = sender.snapshot()
        assert len(acked) > 500, len(acked)

        times = {**uncertain, **acked}

        def exact(lines):
            got = check_walk(lines)
            missing = set(acked) - got
            assert not missing, f"acknowledged rows missing: {sorted(missing)[:20]} ({d})"
            extra = got - set(acked) - set(uncertain)
            assert not extra, f"rows never acknowledged: {sorted(extra)[:20]}"
            assert all(times[b] == t for t, b in lines), "a row's time changed"

        # Everything published (no page merges an ingester's recent data),
        # then the compactors converge; every walk meanwhile is exact.
        walks_after = 0
        published_rounds = None

        def idle():
            nonlocal walks_after, published_rounds
            lines, recent = walk(querier, query_start, time.time_ns() + HOUR)
            exact(lines)
            walks_after += 1
            statuses = [get_json(f"http://{c}/api/mira/v1/compactor/status")[1] for c in compactors]
            if published_rounds is None:
                if recent == 0:
                    published_rounds = [s["rounds"] for s in statuses]
                return False
            return all(s["rounds"] >= r + 2 and not s["running"]
                       and all(b["partitions"] == 0 for b in s["backlog"].values())
                       for s, r in zip(statuses, published_rounds))

        wait_until("the compactors idle", idle, timeout=90)
        idle_ns = time.time_ns()

        # After the deletion grace the replaced objects are deleted: the
        # bucket holds exactly the catalog's live objects of the tenant.
        def live():
            out = subprocess.run([MIRA, "catalog-admin", "--catalog", catalog, "blocks", "--tenant", TENANT],
                                 check=True, capture_output=True, text=True).stdout
            return sorted(out.split())

        def in_bucket():
            return sorted(k for k in moto.keys() if k.startswith(f"{TENANT}/"))

        wait_until("the bucket to hold only live objects", lambda: live() == in_bucket(),
                   timeout=DELETION_GRACE_S + 40)
        keys = live()
        assert keys and all(k.endswith(".mira") for k in keys), keys
        lines, recent = walk(querier, query_start, time.time_ns() + HOUR)
        assert recent == 0
        exact(lines)

        # Cold outputs, from the compactors' "job done" lines.
        cold_ids = set()
        for name in ("c1", "c2"):
            for line in re.sub(r"\x1b\[[0-9;]*m", "", log(f"compactor-{name}")).splitlines():
                if "job done" in line and re.search(r'kind="?cold\b', line):
                    m = re.search(r"output=\"?([0-9A-Z]{26})", line)
                    assert m, line
                    cold_ids.add(m.group(1))
        per_part = {}
        for k in keys:
            per_part.setdefault(partition_of(k), []).append(k.rsplit("/", 1)[1][:-len(".mira")])

        # The bound. Our tenant's data is ~100 KiB, so every hot block is at
        # level 0 (< 2 MiB). With --min-block-age 0s a level holding
        # merge_factor blocks is due, so an idle planner leaves at most
        # merge_factor - 1 = 3 hot blocks in a partition of the current hour.
        # A closed hour (cold_after 0, settled) has its hot blocks rewritten
        # cold in one bin (estimated output far below target_cold): the two
        # past hours, written once at the start, end as exactly 1 cold object.
        # An hour that ended during the test (current records straddling it)
        # may also hold small late cold blocks: at most ceil(E/T) + 7 = 8.
        for p in past:
            objs = per_part.get(partition_name(p))
            assert objs and len(objs) == 1 and objs[0] in cold_ids, (partition_name(p), objs, cold_ids)
        current = partition_name(idle_ns // HOUR * HOUR)
        for part, objs in per_part.items():
            if part in map(partition_name, past):
                continue
            if part == current:
                assert len(objs) <= MERGE_FACTOR - 1, (part, objs)
            else:
                assert len(objs) <= 8 and set(objs) <= cold_ids, (part, objs)

        # The other tenant was written and compacted too.
        other = subprocess.run([MIRA, "catalog-admin", "--catalog", catalog, "blocks", "--tenant", OTHER],
                               check=True, capture_output=True, text=True).stdout.split()
        assert other, "loadgen's tenant has no blocks"
        # One replica may lose every lease race; together they did the work.
        # conflict and lease_lost outcomes are allowed; errors are not.
        assert jobs(compactors, "ok") > 0
        assert jobs(compactors, "error") == 0, [log(f"compactor-{n}") for n in ("c1", "c2")]
        print(f"walks during {walks_during}, after {walks_after}; acked {len(acked)}, uncertain {len(uncertain)}; "
              f"jobs ok {jobs(compactors, 'ok')}, conflict {jobs(compactors, 'conflict')}; "
              f"objects per partition { {p: len(o) for p, o in per_part.items()} }")
    finally:
        if sender is not None:
            sender.halt.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        moto.stop()
