"""Query measurements (docs/perf.md): `mira serve` (release) over a corpus of
many small blocks, against ClickHouse (chdb, in process) over the same
records in the OpenTelemetry Collector ClickHouse exporter's table shape.

Prints, per query, Mira's warm and cold latency (wall time of the HTTP
request, and the querier's own elapsed_us), ClickHouse's warm latency, the
ratio Mira/ClickHouse, and what Mira's stats say it read. Warm figures are
medians of 7 runs after one warm-up; cold is the first run after a restart
with an empty block cache.

Then the repeated-query case (the result cache, `--result-cache-size`):
a logs filter and a PromQL query, each run first (a predicate no earlier
query used, on warm block and decoded caches; also right after a restart
with empty caches), then repeated identically, then as a dashboard does
with the range sliding by a minute per run; medians and the ratio of the
second run to the first. MIRA_MEASURE_REPEATED_ONLY=1 runs only this case
(no ClickHouse battery).

Usage: scripts/measure/query.sh [log-blocks] [records-per-block]"""

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from serve_proc import free_port, wait_until  # noqa: E402

MIRA = os.environ["MIRA_BIN"]
LOG_BLOCKS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
PER_BLOCK = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
TRACE_BLOCKS = LOG_BLOCKS
SPANS_PER_BLOCK = 500
SERVICES = [f"svc-{i}" for i in range(10)]
METHODS = ["GET", "POST", "PUT", "DELETE"]
if os.environ.get("MIRA_MEASURE_PAST_HOUR"):
    # One whole UTC hour three hours back: one partition per signal, old
    # enough for the compactor's cold rewrite (compactor.py).
    T0 = (int(time.time()) // 3600 - 3) * 3600
    END = T0 + 3480
else:
    END = (int(time.time()) // 60) * 60 - 120
    T0 = END - 3600  # everything lands in the last hour
# OTLP bytes sent per signal (the denominator of bytes stored per wire byte).
WIRE = {"logs": 0, "traces": 0, "metrics": 0}
rng = random.Random(7)


def kv(k, v):
    return KeyValue(key=k, value=AnyValue(string_value=v))


def post(addr, path, body):
    WIRE[path.rsplit("/", 1)[-1]] = WIRE.get(path.rsplit("/", 1)[-1], 0) + len(body)
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200


class Serve:
    def __init__(self, flags=None):
        # Every export its own block (seal size 1 byte) unless told otherwise.
        self.flags = flags if flags is not None else ["--shards", "1", "--seal-size", "1", "--seal-age", "5m"]
        self.dir = tempfile.mkdtemp(prefix="mira-query-")
        self.query, self.http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        self.grpc, self.catalog = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [MIRA, "serve", "--data-dir", os.path.join(self.dir, "data"), "--listen", self.query,
             "--http-listen", self.http, "--grpc-listen", self.grpc, "--catalog-listen", self.catalog]
            + self.flags
            # The blocks stay as sealed unless asked otherwise: the corpus is
            # "many small blocks" (compactor.py compacts them itself).
            + os.environ.get("MIRA_SERVE_ARGS", "--no-compactor").split(),
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "serve.log"), "a"))
        wait_until("serve", lambda: urllib.request.urlopen(f"http://{self.query}/ready", timeout=1).status == 200)

    def restart_cold(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        shutil.rmtree(os.path.join(self.dir, "data", "cache"), ignore_errors=True)
        self.start()

    def get(self, path, params):
        """(milliseconds, parsed JSON) of a GET on the native API."""
        return self.raw(f"/api/mira/v1/{path}", params)

    def prom_post(self, path, params):
        """Milliseconds of a form POST to the Prometheus path."""
        req = urllib.request.Request(f"http://{self.query}/api/v1/{path}", method="POST",
                                     data=urllib.parse.urlencode(params).encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            assert json.loads(r.read())["status"] == "success"
        return (time.perf_counter() - t) * 1000

    def raw(self, path, params):
        """(milliseconds, parsed JSON) of a GET on any path (Loki, Tempo)."""
        t = time.perf_counter()
        with urllib.request.urlopen(f"http://{self.query}{path}?{urllib.parse.urlencode(params)}",
                                    timeout=300) as r:
            body = json.loads(r.read())
        return (time.perf_counter() - t) * 1000, body

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)


def load(serve, scratch):
    """Sends the corpus to Mira and writes the same rows for ClickHouse."""
    logs_rows = open(os.path.join(scratch, "logs.jsonl"), "w")
    n = 0
    span = (END - T0) * 10**9 // (LOG_BLOCKS * PER_BLOCK)
    for b in range(LOG_BLOCKS):
        req = ExportLogsServiceRequest()
        svc = SERVICES[b % len(SERVICES)]
        rl = req.resource_logs.add(resource=Resource(attributes=[kv("service.name", svc)]))
        sl = rl.scope_logs.add()
        for _ in range(PER_BLOCK):
            ts = T0 * 10**9 + n * span
            method = "PATCH" if n == LOG_BLOCKS * PER_BLOCK // 3 else METHODS[n % 4]
            body = f"{method} /api/v1/items/{n % 977} status {200 + (n % 5) * 100} took {n % 313} ms"
            tid, sid = rng.randbytes(16), rng.randbytes(8)
            sl.log_records.add(time_unix_nano=ts, severity_number=9, body=AnyValue(string_value=body),
                               attributes=[kv("http.method", method)], trace_id=tid, span_id=sid)
            logs_rows.write(json.dumps({"Timestamp": ts, "TraceId": tid.hex(), "SpanId": sid.hex(),
                                        "SeverityNumber": 9, "ServiceName": svc, "Body": body,
                                        "ResourceAttributes": {"service.name": svc},
                                        "LogAttributes": {"http.method": method}}) + "\n")
            n += 1
        post(serve.http, "/v1/logs", req.SerializeToString())
    logs_rows.close()

    trace_rows = open(os.path.join(scratch, "traces.jsonl"), "w")
    trace_ids = []
    span_step = (END - T0) * 10**9 // (TRACE_BLOCKS * SPANS_PER_BLOCK)
    k = 0
    for b in range(TRACE_BLOCKS):
        req = ExportTraceServiceRequest()
        svc = SERVICES[b % len(SERVICES)]
        ss = req.resource_spans.add(resource=Resource(attributes=[kv("service.name", svc)])).scope_spans.add()
        for i in range(SPANS_PER_BLOCK):
            if i % 5 == 0:
                tid = rng.randbytes(16)
                trace_ids.append(tid.hex())
                root = rng.randbytes(8)
            sid = root if i % 5 == 0 else rng.randbytes(8)
            start = T0 * 10**9 + k * span_step
            dur = 1_000_000 * (1 + k % 50)
            ss.spans.add(trace_id=tid, span_id=sid, parent_span_id=b"" if i % 5 == 0 else root,
                         name=f"op-{i % 5}", start_time_unix_nano=start, end_time_unix_nano=start + dur,
                         attributes=[kv("http.method", METHODS[k % 4])])
            trace_rows.write(json.dumps({"Timestamp": start, "TraceId": tid.hex(), "SpanId": sid.hex(),
                                         "ParentSpanId": "" if i % 5 == 0 else root.hex(), "SpanName": f"op-{i % 5}",
                                         "ServiceName": svc, "Duration": dur,
                                         "SpanAttributes": {"http.method": METHODS[k % 4]}}) + "\n")
            k += 1
        post(serve.http, "/v1/traces", req.SerializeToString())
    trace_rows.close()

    # A counter per (service, method), one point every 15 s over the hour.
    metric_rows = open(os.path.join(scratch, "metrics.jsonl"), "w")
    for svc in SERVICES:
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add(resource=Resource(attributes=[kv("service.name", svc)]))
        m = rm.scope_metrics.add().metrics.add(name="requests", unit="{request}")
        m.sum.is_monotonic = True
        m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        for method in METHODS:
            for t in range(T0, END + 1, 15):
                v = float((t - T0) * (1 + METHODS.index(method)))
                m.sum.data_points.add(time_unix_nano=t * 10**9, as_double=v, attributes=[kv("http.method", method)])
                metric_rows.write(json.dumps({"ServiceName": svc, "MetricName": "requests",
                                              "Attributes": {"http.method": method}, "TimeUnix": t * 10**9,
                                              "Value": v}) + "\n")
        post(serve.http, "/v1/metrics", req.SerializeToString())
    metric_rows.close()
    return trace_ids


def clickhouse(scratch):
    import chdb.session

    sess = chdb.session.Session(os.path.join(scratch, "ch"))
    sess.query("CREATE DATABASE IF NOT EXISTS otel")
    sess.query("""CREATE TABLE otel.otel_logs (Timestamp DateTime64(9), TraceId String, SpanId String,
        SeverityNumber Int32, ServiceName LowCardinality(String), Body String,
        ResourceAttributes Map(LowCardinality(String), String), LogAttributes Map(LowCardinality(String), String),
        INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
        INDEX idx_body Body TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8)
        ENGINE = MergeTree PARTITION BY toDate(Timestamp) ORDER BY (ServiceName, toUnixTimestamp(Timestamp))""")
    sess.query("""CREATE TABLE otel.otel_traces (Timestamp DateTime64(9), TraceId String, SpanId String,
        ParentSpanId String, SpanName LowCardinality(String), ServiceName LowCardinality(String), Duration UInt64,
        SpanAttributes Map(LowCardinality(String), String),
        INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1)
        ENGINE = MergeTree PARTITION BY toDate(Timestamp) ORDER BY (ServiceName, SpanName, toUnixTimestamp(Timestamp))""")
    sess.query("""CREATE TABLE otel.otel_metrics_sum (ServiceName LowCardinality(String), MetricName String,
        Attributes Map(LowCardinality(String), String), TimeUnix DateTime64(9), Value Float64)
        ENGINE = MergeTree ORDER BY (ServiceName, MetricName, Attributes, toUnixTimestamp64Nano(TimeUnix))""")
    # Times are written as integer nanoseconds; read them as such.
    files = [
        ("otel_logs", "logs", "fromUnixTimestamp64Nano(Timestamp), TraceId, SpanId, SeverityNumber, ServiceName, "
         "Body, ResourceAttributes, LogAttributes",
         "Timestamp Int64, TraceId String, SpanId String, SeverityNumber Int32, ServiceName String, Body String, "
         "ResourceAttributes Map(String, String), LogAttributes Map(String, String)"),
        ("otel_traces", "traces", "fromUnixTimestamp64Nano(Timestamp), TraceId, SpanId, ParentSpanId, SpanName, "
         "ServiceName, Duration, SpanAttributes",
         "Timestamp Int64, TraceId String, SpanId String, ParentSpanId String, SpanName String, ServiceName String, "
         "Duration UInt64, SpanAttributes Map(String, String)"),
        ("otel_metrics_sum", "metrics", "ServiceName, MetricName, Attributes, fromUnixTimestamp64Nano(TimeUnix), Value",
         "ServiceName String, MetricName String, Attributes Map(String, String), TimeUnix Int64, Value Float64"),
    ]
    for table, f, columns, structure in files:
        sess.query(f"INSERT INTO otel.{table} SELECT {columns} FROM file('{scratch}/{f}.jsonl', JSONEachRow, "
                   f"'{structure}')")
    return sess


def timed_ch(sess, sql):
    # ClickHouse 25.3+ remembers which granules matched a filter: a repeated
    # warm query would no longer be a scan.
    sql += (", " if " SETTINGS " in sql else " SETTINGS ") + "use_query_condition_cache = 0"
    t = time.perf_counter()
    res = sess.query(sql, "JSONCompact")
    return (time.perf_counter() - t) * 1000, res


def battery_queries(hour, tid):
    """(name, native path, params, ClickHouse SQL) of the query battery."""
    return [
        ("trace by id", "traces/" + tid, dict(hour),
         f"SELECT * FROM otel.otel_traces WHERE TraceId = '{tid}'"),
        ("newest 100 log lines", "logs", dict(hour, limit=100),
         "SELECT Timestamp, Body, LogAttributes, ResourceAttributes FROM otel.otel_logs ORDER BY Timestamp DESC LIMIT 100"),
        # Every block scanned on both sides: ClickHouse without its skip
        # indexes (the exporter's token Bloom filter on Body would prune),
        # then with them.
        ("body matches nothing", "logs", dict(hour, limit=100, contains="no-such-token"),
         "SELECT Timestamp, Body FROM otel.otel_logs WHERE Body LIKE '%no-such-token%' ORDER BY Timestamp DESC "
         "LIMIT 100 SETTINGS use_skip_indexes = 0"),
        ("  ... CH token index on", "logs", dict(hour, limit=100, contains="no-such-token"),
         "SELECT Timestamp, Body FROM otel.otel_logs WHERE Body LIKE '%no-such-token%' ORDER BY Timestamp DESC LIMIT 100"),
        ("attribute predicate", "logs", dict(hour, limit=100, selector='{http.method="PATCH"}'),
         "SELECT Timestamp, Body FROM otel.otel_logs WHERE LogAttributes['http.method'] = 'PATCH' "
         "ORDER BY Timestamp DESC LIMIT 100"),
        ("sum by rate 5m, 1 h", "metrics/query_range",
         {"query": "sum by (job) (rate(requests_total[5m]))", "start": hour["start"] + 300, "end": hour["end"] - 1,
          "step": 60},
         """SELECT ServiceName, t, sum(r) FROM (
               SELECT ServiceName, Attributes, toStartOfMinute(TimeUnix) AS t,
                      (max(Value) - min(Value)) / 300 AS r
               FROM otel.otel_metrics_sum WHERE MetricName = 'requests'
               GROUP BY ServiceName, Attributes, t) GROUP BY ServiceName, t ORDER BY ServiceName, t"""),
    ]


def battery(serve, sess, queries):
    """Per query: (name, mira warm ms, querier ms, mira cold ms, ClickHouse ms, ratio, cold stats, answer)."""
    rows = []
    for name, path, params, sql in queries:
        serve.restart_cold()
        cold_ms, cold = serve.get(path, params)
        warm = [serve.get(path, params) for _ in range(8)][1:]
        ch = [timed_ch(sess, sql) for _ in range(8)][1:]
        mira_ms = statistics.median(w[0] for w in warm)
        mira_us = statistics.median(w[1]["stats"]["elapsed_us"] for w in warm)
        ch_ms = statistics.median(c[0] for c in ch)
        rows.append((name, mira_ms, mira_us / 1000, cold_ms, ch_ms, mira_ms / ch_ms, cold["stats"], warm[-1][1]))
    return rows


def repeated(serve, hour):
    """The repeated-query case: per query, (name, first ms, first-after-restart ms, repeated ms,
    sliding ms, repeated stats, sliding stats); medians of 7."""
    span = hour["end"] - hour["start"]

    def logs(k, lo=0):
        return "logs", dict(start=hour["start"] + lo, end=hour["end"] + lo, limit=100,
                            contains=f"no-such-token-{k}")

    def logs_attr(k, lo=0):
        # Matches one record; `k` varies a second, always-true matcher.
        return "logs", dict(start=hour["start"] + lo, end=hour["end"] + lo, limit=100,
                            selector=f'{{http.method="PATCH", resource.service.name!="none-{k}"}}')

    def rate(k, lo=0):
        return "metrics/query_range", {
            "query": f'sum by (job) (rate(requests_total{{http_method!="X{k}"}}[5m]))',
            "start": hour["start"] + 300 + lo, "end": hour["end"] - 1 + lo, "step": 60}

    out = []
    for name, q in [("logs body filter", logs), ("logs attribute filter", logs_attr), ("sum by rate 5m, 1 h", rate)]:
        serve.restart_cold()
        cold_ms, _ = serve.get(*q(0))
        # First runs of predicates never seen (block and decoded caches warm).
        first = [serve.get(*q(k))[0] for k in range(1, 8)]
        repeat = [serve.get(*q(1)) for _ in range(7)]
        # A dashboard: the same query, the range 60 s later on each refresh.
        serve.get(*q(100))
        slide = [serve.get(*q(100, 60 * i)) for i in range(1, 8)]
        assert span > 7 * 60
        out.append((name, statistics.median(first), cold_ms, statistics.median(r[0] for r in repeat),
                    statistics.median(r[0] for r in slide), repeat[-1][1]["stats"], slide[-1][1]["stats"]))
    return out


def print_repeated(rows):
    print("# repeated queries (result cache): first run (new predicate, warm caches; after a restart), "
          "identical repeat, sliding range (+60 s per run); medians of 7")
    print(f"{'query':<24} {'first':>9} {'restart':>9} {'repeat':>9} {'rep/first':>9} {'slide':>9} "
          f"{'slide/first':>11}  repeat hits/misses, slide hits/misses")
    for name, first, cold, rep, slide, rs, ss in rows:
        print(f"{name:<24} {first:>7.1f}ms {cold:>7.1f}ms {rep:>7.1f}ms {rep / first:>9.3f} {slide:>7.1f}ms "
              f"{slide / first:>11.3f}  {rs.get('result_cache_hits')}/{rs.get('result_cache_misses')}, "
              f"{ss.get('result_cache_hits')}/{ss.get('result_cache_misses')}")


def main():
    scratch = tempfile.mkdtemp(prefix="mira-query-corpus-")
    serve = Serve()
    t = time.perf_counter()
    trace_ids = load(serve, scratch)
    print(f"# corpus: {LOG_BLOCKS} log blocks x {PER_BLOCK} records, {TRACE_BLOCKS} trace blocks x "
          f"{SPANS_PER_BLOCK} spans, 40 counter series x 241 points; loaded in {time.perf_counter() - t:.1f} s")
    sess = None if os.environ.get("MIRA_MEASURE_REPEATED_ONLY") else clickhouse(scratch)
    hour = {"start": T0, "end": END + 1}
    tid = trace_ids[len(trace_ids) // 2]
    queries = battery_queries(hour, tid)
    # Wait until every block is published (no recent blocks left).
    wait_until("published", lambda: serve.get("logs", dict(hour, limit=1))[1]["stats"]["recent_blocks"] == 0,
               timeout=600)
    rep = repeated(serve, hour)
    if os.environ.get("MIRA_MEASURE_REPEATED_ONLY"):
        serve.stop()
        shutil.rmtree(serve.dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
        print_repeated(rep)
        return
    rows = battery(serve, sess, queries)
    # A Grafana path against the native one on the same query: the PromQL
    # query through /api/v1/query_range as a form POST (Grafana's default),
    # interleaved with the native GET, warm.
    rate = queries[-1][2]
    native, prom = [], []
    for _ in range(15):
        native.append(serve.get("metrics/query_range", rate)[0])
        prom.append(serve.prom_post("query_range", rate))
    n_ms, p_ms = statistics.median(native[1:]), statistics.median(prom[1:])
    # The Loki and Tempo paths against the native one on the same logical
    # query, interleaved, warm (medians of 15 after one warm-up each).
    ns = lambda s: str(s * 10**9)  # noqa: E731
    loki_range = {"start": ns(T0), "end": ns(END + 1), "limit": 100, "direction": "backward"}
    pairs = [
        ("newest 100 log lines", ("logs", dict(hour, limit=100)),
         ("/loki/api/v1/query_range", dict(loki_range, query='{service_name=~".+"}'))),
        ("body matches nothing", ("logs", dict(hour, limit=100, contains="no-such-token")),
         ("/loki/api/v1/query_range", dict(loki_range, query='{service_name=~".+"} |= "no-such-token"'))),
        ("attribute predicate", ("logs", dict(hour, limit=100, selector='{http.method="PATCH"}')),
         ("/loki/api/v1/query_range", dict(loki_range, query='{service_name=~".+"} | http_method="PATCH"'))),
        ("trace by id", ("traces/" + tid, dict(hour)),
         ("/api/traces/" + tid, {"start": T0, "end": END + 1})),
        ("search svc + duration", ("traces/search", dict(hour, service="svc-3", min_duration="40ms", limit=20)),
         ("/api/search", {"q": '{resource.service.name="svc-3" && duration > 40ms}', "limit": 20,
                          "start": T0, "end": END + 1})),
    ]
    grafana = []
    for name, (npath, nparams), (gpath, gparams) in pairs:
        nat, gra = [], []
        for _ in range(16):
            nat.append(serve.get(npath, nparams)[0])
            if gpath.startswith("/api/traces/"):
                t = time.perf_counter()
                urllib.request.urlopen(f"http://{serve.query}{gpath}?{urllib.parse.urlencode(gparams)}",
                                       timeout=300).read()
                gra.append((time.perf_counter() - t) * 1000)
            else:
                gra.append(serve.raw(gpath, gparams)[0])
        grafana.append((name, statistics.median(nat[1:]), statistics.median(gra[1:])))
    # Loki's log-volume query over the hour (Grafana's histogram: a count
    # by level per minute) and ClickHouse's equivalent.
    volume = {"query": 'sum by (detected_level) (count_over_time({service_name="svc-3"}[1m]))',
              "start": ns(T0 + 60), "end": ns(END), "step": "60000ms"}
    vol = [serve.raw("/loki/api/v1/query_range", volume) for _ in range(8)][1:]
    vol_sql = ("SELECT toStartOfMinute(Timestamp) AS t, SeverityNumber, count() FROM otel.otel_logs "
               "WHERE ServiceName = 'svc-3' GROUP BY t, SeverityNumber ORDER BY t")
    vol_ch = [timed_ch(sess, vol_sql) for _ in range(8)][1:]
    search_sql = ("SELECT TraceId, min(Timestamp) FROM otel.otel_traces WHERE ServiceName = 'svc-3' "
                  "AND Duration > 40000000 GROUP BY TraceId ORDER BY min(Timestamp) DESC LIMIT 20")
    search_ch = [timed_ch(sess, search_sql) for _ in range(8)][1:]
    tq = [serve.raw("/api/search", pairs[-1][2][1]) for _ in range(8)][1:]
    serve.stop()
    # The corpus and Mira's data are gigabytes: gone once measured.
    shutil.rmtree(serve.dir, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    print("# Grafana paths against the native path on the same query (warm medians, interleaved)")
    for name, n, g in grafana:
        print(f"#   {name:<24} native {n:>8.1f}ms  grafana path {g:>8.1f}ms  ratio {g / n:.2f}")
    v_ms, vch_ms = statistics.median(v[0] for v in vol), statistics.median(c[0] for c in vol_ch)
    print(f"# Loki log volume (count by level per minute, one service, 1 h): {v_ms:.1f}ms; "
          f"ClickHouse {vch_ms:.1f}ms; ratio {v_ms / vch_ms:.2f}")
    t_ms, tch_ms = statistics.median(t[0] for t in tq), statistics.median(c[0] for c in search_ch)
    print(f"# TraceQL search by service and duration (limit 20): {t_ms:.1f}ms; "
          f"ClickHouse {tch_ms:.1f}ms; ratio {t_ms / tch_ms:.2f}")
    print(f"# sum by rate through /api/v1/query_range (form POST, as Grafana): {p_ms:.1f}ms; "
          f"native path {n_ms:.1f}ms; ratio {p_ms / n_ms:.2f}")
    print(f"{'query':<24} {'mira warm':>10} {'(querier)':>10} {'mira cold':>10} {'clickhouse':>11} {'ratio':>7}  "
          "blocks considered/pruned(time,zone,attr,bloom)/fetched, bytes store/cache (cold)")
    for name, w, wq, c, ch, ratio, st, _ in rows:
        p = st["blocks_pruned"]
        print(f"{name:<24} {w:>8.1f}ms {wq:>8.1f}ms {c:>8.1f}ms {ch:>9.1f}ms {ratio:>7.2f}  "
              f"{st['blocks_considered']}/{p['time']},{p['zone_map']},{p['attr_index']},{p['bloom']}/"
              f"{st['blocks_fetched']}, {st['bytes_from_store']}/{st['bytes_from_cache']}")
    print_repeated(rep)


if __name__ == "__main__":
    main()
