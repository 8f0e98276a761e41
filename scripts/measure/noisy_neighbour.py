"""Noisy neighbour (docs/perf.md "Noisy neighbour"; issue 29 item 10).

One `mira serve`; two well-behaved tenants (`calm-a`, `calm-b`) each ingest
with `mira loadgen` (OTLP/gRPC, 2 connections, batch 1000 log records, 5
requests/s: 5,000 records/s each, 8 services) and
run Grafana-like queries over the last 5 minutes of one service, in a
loop: its newest 100 lines, its lines per level per minute (LogQL), and a
PromQL rate. Windows alternate:
"quiet" (the calm tenants alone) and "noisy" (the same, while tenant
`hostile` sends, in loops of its own, the worst requests known: 16 MiB of
empty spans in 16 KiB of gzip, a 5.6 M-object JSON body, PromQL nested
3,000 deep, an instant count_over_time over ten years, a TraceQL
structural query over its own 3,000-span trace, a LogQL regex over
everything, and a LogQL range query of 10,900 one-hour windows over its
own lines that runs past the query timeout). Prints per window the
calm tenants' acknowledged records/s and their queries' p50/p99, then the
ratios noisy/quiet (each noisy window against the quiet ones around it),
the hostile answers by status, and whether the process is the same one
(pid) and still ready, and whether every record the calm tenants' load
generators had acknowledged is counted by a query at the end (nothing
lost). Target: rate >= 0.8, p99 <= 2x, no restart, nothing lost.

Usage: python3 noisy_neighbour.py MIRA_BIN [SECONDS_PER_WINDOW] [ROUNDS]
Bounded: every loop stops with its window; every request has a timeout.
"""
import collections
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# Set from the command line (or by a script importing this one).
BIN = "mira"
DUR = 10.0
ROUNDS = 3
CALM = ["calm-a", "calm-b"]


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):
    return bytes([num << 3 | 2]) + varint(len(payload)) + payload


EMPTY_SPANS = gzip.compress(field(1, field(2, bytes([0x12, 0]) * ((16 << 20) // 2 - 32))))
JSON_SPANS = gzip.compress(
    ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + ",".join(["{}"] * ((16 << 20) // 3 - 32)) + "]}]}]}").encode()
)


def request(method, url, tenant, body=None, headers=None, timeout=30):
    h = {"X-Scope-OrgID": tenant}
    h.update(headers or {})
    req = urllib.request.Request(url, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except Exception:  # timeouts, resets
        return 0


def serve():
    """A ready `mira serve` of BIN in a fresh directory: (process, query
    address, OTLP/HTTP address, OTLP/gRPC address)."""
    work = tempfile.mkdtemp()
    q, http, grpc, cat, comp = (f"127.0.0.1:{port()}" for _ in range(5))
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write("noisy-neighbour-cluster-secret-0123\n")
    env = dict(os.environ, MIRA_CLUSTER_SECRET_FILE=secret)
    log = open(os.path.join(work, "serve.log"), "w")
    proc = subprocess.Popen(
        [BIN, "serve", "--data-dir", os.path.join(work, "data"), "--listen", q, "--http-listen", http,
         "--grpc-listen", grpc, "--catalog-listen", cat, "--compactor-listen", comp, "--query-timeout", "5s"],
        stdout=subprocess.DEVNULL, stderr=log, env=env)
    for _ in range(600):
        if request("GET", f"http://{q}/ready", "x", timeout=2) == 200:
            break
        time.sleep(0.1)
    return proc, q, http, grpc


def main():
    proc, q, http, grpc = serve()
    try:
        run(q, http, grpc, proc)
    finally:
        proc.kill()
        proc.wait()


def calm_queries(q, tenant, stop, latencies, errors):
    end = lambda: int(time.time())
    qs = [
        ("/loki/api/v1/query_range", lambda: {"query": '{service_name="checkout"}', "limit": "100",
                                               "start": str(end() - 300), "end": str(end())}),
        ("/loki/api/v1/query_range", lambda: {"query": 'sum by (detected_level) (count_over_time({service_name="checkout"}[1m]))',
                                               "start": str(end() - 300), "end": str(end()), "step": "15"}),
        ("/api/v1/query_range", lambda: {"query": 'sum(rate({__name__=~".+"}[1m]))',
                                          "start": str(end() - 300), "end": str(end()), "step": "15"}),
    ]
    i = 0
    while not stop.is_set():
        path, params = qs[i % len(qs)]
        i += 1
        t = time.monotonic()
        status = request("GET", f"http://{q}{path}?{urllib.parse.urlencode(params())}", tenant, timeout=30)
        latencies.append(time.monotonic() - t)
        if status != 200:
            errors[status] += 1


def hostile(q, http, stop, answers):
    now = int(time.time())
    shots = [
        ("POST", f"http://{http}/v1/traces", EMPTY_SPANS,
         {"content-type": "application/x-protobuf", "content-encoding": "gzip"}),
        ("POST", f"http://{http}/v1/traces", JSON_SPANS,
         {"content-type": "application/json", "content-encoding": "gzip"}),
        ("GET", f"http://{q}/api/v1/query?" + urllib.parse.urlencode(
            {"query": "abs(" * 3000 + "m" + ")" * 3000, "time": str(now)}), None, {}),
        ("GET", f"http://{q}/api/v1/query?" + urllib.parse.urlencode(
            {"query": "count_over_time({__name__=~\".+\"}[3650d])", "time": str(now)}), None, {}),
        ("GET", f"http://{q}/loki/api/v1/query?" + urllib.parse.urlencode(
            {"query": 'count_over_time({service_name=~".+"} |~ "(a|b|c)*x"[3650d])', "time": str(now)}), None, {}),
        ("GET", f"http://{q}/api/search?" + urllib.parse.urlencode(
            {"q": "{ } >> { } >> { }", "start": str(now - 3600), "end": str(now + 60)}), None, {}),
        ("GET", f"http://{q}/loki/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": 'count_over_time({service_name=~".+"}[1h])', "start": str(now - 3600), "end": str(now),
             "step": "0.33"}), None, {}),
    ]
    i = 0
    while not stop.is_set():
        method, url, body, headers = shots[i % len(shots)]
        i += 1
        answers[request(method, url, "hostile", body, headers, timeout=30)] += 1


ACKED = collections.Counter()


# Requests per second of each calm tenant's load generator (of 1,000
# records): a steady load, as a well-behaved tenant's collectors send, not
# as fast as acknowledged (which measures the machine's capacity, shared
# on two cores by whatever else runs, not the tenant's share).
RATE = 5


def loadgen(grpc, tenant, seconds, rate=RATE):
    """Records/s acknowledged; the records counted in ACKED[tenant]."""
    out = subprocess.run([BIN, "loadgen", "--target", grpc, "--tenant", tenant, "--conns", "2", "--batch", "1000",
                          "--rate", str(rate), "--for", str(int(seconds))], capture_output=True, text=True)
    rate = 0.0
    for word in out.stdout.split(";")[0].split(","):
        toks = word.split()
        if "records/s" in toks:
            rate = float(toks[toks.index("records/s") - 1])
        elif word.strip().endswith(" records"):
            ACKED[tenant] += int(word.split()[0])
    return rate


def chain_trace(n):
    """One trace of `n` spans, each the child of the one before (OTLP JSON)."""
    now = time.time_ns()
    spans = [{"traceId": "ab" * 16, "spanId": f"{i + 1:016x}", "parentSpanId": f"{i:016x}" if i else "",
              "name": f"op-{i % 7}", "startTimeUnixNano": str(now - 10**9 + i), "endTimeUnixNano": str(now - i)}
             for i in range(n)]
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "deep"}}]}, "scopeSpans": [{"spans": spans}]}]}).encode()


def counted(q, tenant):
    """Log records of `tenant` queries count over the last two hours, one
    query per service (each well inside the query timeout); -1 when one
    fails."""
    def get(path, params):
        req = urllib.request.Request(f"http://{q}{path}?{urllib.parse.urlencode(params)}",
                                     headers={"X-Scope-OrgID": tenant})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["data"]
    now = time.time()
    try:
        services = get("/loki/api/v1/label/service_name/values", {"start": str(now - 7200), "end": str(now + 60)})
        total = 0
        for svc in services:
            result = get("/loki/api/v1/query", {"query": f'sum(count_over_time({{service_name="{svc}"}}[2h]))',
                                                "time": str(now + 60)})["result"]
            total += int(float(result[0]["value"][1])) if result else 0
        return total
    except Exception:
        return -1


def run(q, http, grpc, proc):
    loadgen(grpc, "calm-a", 3)  # warm-up
    loadgen(grpc, "hostile", 3)  # the hostile tenant's own lines, for its heavy queries
    status = request("POST", f"http://{http}/v1/traces", "hostile", chain_trace(3000),
                     {"content-type": "application/json"})
    print(f"hostile 3,000-span trace: {status}", flush=True)
    quiet, noisy = [], []
    for r in range(ROUNDS):
        for kind, into in (("quiet", quiet), ("noisy", noisy)):
            rate, p50, p99, errors, answers = window(q, http, grpc, kind == "noisy")
            into.append((rate, p50, p99))
            print(f"round {r + 1} {kind}: calm {rate:9.0f} records/s, query p50 {p50 * 1000:7.1f} ms, "
                  f"p99 {p99 * 1000:7.1f} ms, calm query errors {dict(errors)}"
                  + (f", hostile answers {dict(answers)}" if kind == "noisy" else ""), flush=True)
    rate, p50, p99, _, _ = window(q, http, grpc, False)
    quiet.append((rate, p50, p99))
    print(f"closing quiet: calm {rate:9.0f} records/s, query p50 {p50 * 1000:7.1f} ms, p99 {p99 * 1000:7.1f} ms")
    ratio = lambda k: statistics.mean(n[k] / ((quiet[i][k] + quiet[i + 1][k]) / 2) for i, n in enumerate(noisy))
    alive = proc.poll() is None and request("GET", f"http://{q}/ready", "x", timeout=5) == 200
    print(f"ratio noisy/quiet: ingest rate {ratio(0):.2f}, query p50 {ratio(1):.2f}x, p99 {ratio(2):.2f}x")
    print(f"process {proc.pid} {'still running and ready' if alive else 'NOT running or not ready'}")
    for t in CALM:
        deadline, seen = time.monotonic() + 120, -1
        while time.monotonic() < deadline:
            seen = counted(q, t)
            if seen == ACKED[t]:
                break
            time.sleep(0.5)
        print(f"{t}: acknowledged {ACKED[t]} records, the query counts {seen}: "
              + ("nothing lost" if seen == ACKED[t] else "MISMATCH"), flush=True)


if __name__ == "__main__":
    BIN = sys.argv[1]
    DUR = float(sys.argv[2]) if len(sys.argv) > 2 else DUR
    ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else ROUNDS
    main()
