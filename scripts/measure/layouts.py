"""Scan layouts against ClickHouse (docs/perf.md): runs the `layouts`
example of mira-core (release), which builds a low-cardinality log corpus
(testkit's, 26 records given `http.method="PATCH"`) as 10 sealed blocks,
one merged hot block (arrival order and clustered by resource) and one
cold block of each, and times the querier's way of scanning them (blocks
in parallel, each block's row ranges in parallel and pruned by the
`row_ranges` sidecar; "whole" rows scan each block as one task, as before
row ranges), with the querier's decoded-table cache warm ("ranges",
"whole") and empty ("first": a block's first query, which decodes what it
reads); then loads the same records into chdb in the OpenTelemetry
Collector ClickHouse exporter's table shape and times the same queries
(`use_query_condition_cache = 0`). Prints each Mira figure with its ratio
to ClickHouse. Mira's figures are in-process scans (no HTTP round trip,
about 1 ms on the native API).

Usage: scripts/measure/layouts.sh [records] [threads]"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import chdb.session

EXAMPLE = os.environ["LAYOUTS_BIN"]
RECORDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
THREADS = sys.argv[2] if len(sys.argv) > 2 else "2"

SQL = {
    "service+body": "SELECT Timestamp, Body FROM otel.otel_logs WHERE ServiceName = 'frontend' AND Body LIKE "
                    "'%no-such-token%' ORDER BY Timestamp DESC LIMIT 100",
    "rare-attr": "SELECT Timestamp, Body FROM otel.otel_logs WHERE LogAttributes['http.method'] = 'PATCH' "
                 "ORDER BY Timestamp DESC LIMIT 100",
    "body-nothing": "SELECT Timestamp, Body FROM otel.otel_logs WHERE Body LIKE '%no-such-token%' "
                    "ORDER BY Timestamp DESC LIMIT 100",
}


def timed_ch(sess, sql, skip_indexes):
    sql += " SETTINGS use_query_condition_cache = 0" + ("" if skip_indexes else ", use_skip_indexes = 0")
    sess.query(sql, "JSONCompact")
    ms = []
    for _ in range(7):
        t = time.perf_counter()
        sess.query(sql, "JSONCompact")
        ms.append((time.perf_counter() - t) * 1000)
    return statistics.median(ms)


def main():
    scratch = tempfile.mkdtemp(prefix="mira-layouts-")
    try:
        out = subprocess.run([EXAMPLE, scratch, str(RECORDS), THREADS], check=True, capture_output=True,
                             text=True)
        sys.stderr.write(out.stderr)
        sess = chdb.session.Session(os.path.join(scratch, "ch"))
        sess.query("CREATE DATABASE IF NOT EXISTS otel")
        sess.query("""CREATE TABLE otel.otel_logs (Timestamp DateTime64(9), TraceId String, SpanId String,
            SeverityNumber Int32, ServiceName LowCardinality(String), Body String,
            ResourceAttributes Map(LowCardinality(String), String), LogAttributes Map(LowCardinality(String), String),
            INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
            INDEX idx_body Body TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8)
            ENGINE = MergeTree PARTITION BY toDate(Timestamp) ORDER BY (ServiceName, toUnixTimestamp(Timestamp))""")
        sess.query(f"""INSERT INTO otel.otel_logs SELECT fromUnixTimestamp64Nano(Timestamp), TraceId, SpanId,
            SeverityNumber, ServiceName, Body, ResourceAttributes, LogAttributes
            FROM file('{scratch}/logs.jsonl', JSONEachRow, 'Timestamp Int64, TraceId String, SpanId String,
            SeverityNumber Int32, ServiceName String, Body String, ResourceAttributes Map(String, String),
            LogAttributes Map(String, String)')""")
        sess.query("OPTIMIZE TABLE otel.otel_logs FINAL")
        ch = {q: (timed_ch(sess, sql, False), timed_ch(sess, sql, True)) for q, sql in SQL.items()}
        # The 1,000 x 1,000 full scan: the first million records.
        sess.query("CREATE TABLE otel.first AS otel.otel_logs")
        sess.query("INSERT INTO otel.first SELECT * FROM otel.otel_logs ORDER BY Timestamp LIMIT 1000000")
        sess.query("OPTIMIZE TABLE otel.first FINAL")
        ch["body-nothing-1M"] = tuple(
            timed_ch(sess, SQL["body-nothing"].replace("otel.otel_logs", "otel.first"), s) for s in (False, True))
        print(f"# {RECORDS} records, {THREADS} threads; ClickHouse warm medians of 7 (skip indexes off / on)")
        for q, (off, on) in ch.items():
            print(f"#   clickhouse {q:<16} {off:8.2f} ms / {on:8.2f} ms")
        for line in out.stdout.splitlines():
            if line.startswith("RESULT"):
                _, layout, mode, q, ms, *rest = line.split()
                off, on = ch[q]
                print(f"{layout:<18} {mode:<7} {q:<16} {float(ms):8.2f} ms  ratio {float(ms) / off:6.2f} "
                      f"(CH skip idx on: {float(ms) / on:6.2f})  {' '.join(rest)}")
            else:
                print(line)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
