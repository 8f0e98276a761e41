"""Compactor measurements (docs/perf.md): query.py's corpus (1,000 log
blocks x 1,000 records, 1,000 trace blocks x 500 spans, 40 counter series)
placed in one whole UTC hour three hours back, loaded into `mira serve
--no-compactor`; then the query battery against ClickHouse (chdb, the same
records, `use_query_condition_cache = 0`) three times:

1. before compaction (1,000 small blocks per signal);
2. after `mira compactor --once --cold-after 1000h` (hot merge only);
3. after `mira compactor --once --cold-after 0s` (the cold rewrite).

Prints objects and bytes per signal, bytes stored per OTLP wire byte, each
query's warm and cold-cache latency and its ratio to ClickHouse, and the
compactor's own cost (CPU seconds of the process, input MiB per CPU
second, records per CPU second).

Then, unless MIRA_PHASES says otherwise (a comma list of battery, bytes,
lag):

- bytes: testkit's low- and high-cardinality log corpora (no request sent
  twice) sent by `mira loadgen` over OTLP/HTTP into `mira serve
  --no-compactor`, three hours back, then the cold rewrite: bytes in the
  store per OTLP byte acknowledged, sealed and after compaction;
- lag: `mira serve` with its compactor under `mira loadgen` (every export
  sealed at once into the current hour) for LAG_S seconds (120), sampling
  the compactor's backlog, lag and the fullest partition every 5 s.

Usage: scripts/measure/compactor.sh [log-blocks] [records-per-block]"""

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

os.environ["MIRA_MEASURE_PAST_HOUR"] = "1"
os.environ.setdefault("MIRA_SERVE_ARGS", "--no-compactor")
sys.path.insert(0, os.path.dirname(__file__))
import query  # noqa: E402
from query import MIRA, Serve, battery, battery_queries, clickhouse, load, wait_until  # noqa: E402

SIGNALS = ("logs", "traces", "metrics")


def objects(serve):
    """Per signal: (objects, bytes) under the store."""
    root = os.path.join(serve.dir, "data", "objects")
    out = {s: [0, 0] for s in SIGNALS}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".mira"):
                sig = os.path.relpath(dirpath, root).split(os.sep)[1]
                out[sig][0] += 1
                out[sig][1] += os.path.getsize(os.path.join(dirpath, f))
    return out


def compact(serve, *flags):
    """Runs `mira compactor --once` against serve's catalog and store;
    returns (wall s, CPU s, its JSON summary)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(
        [MIRA, "compactor", "--once", "--catalog", serve.catalog, "--data-dir", os.path.join(serve.dir, "data"),
         "--compactor-listen", f"127.0.0.1:{query.free_port()}", "--min-block-age", "0s", "--deletion-grace", "0s",
         "--settle", "0s", *flags],
        check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(os.path.join(serve.dir, "compactor.log"), "a") as log:
        log.write(out.stderr)
    return wall, cpu, json.loads(out.stdout.strip().splitlines()[-1])


def loadgen(target, *flags):
    """Runs `mira loadgen` over OTLP/HTTP; returns (requests, bytes) acked."""
    out = subprocess.run([MIRA, "loadgen", "--target", target, "--protocol", "http", "--signal", "logs", *flags],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"acked (\d+) requests, (\d+) records, (\d+) bytes", out)
    return int(m.group(1)), int(m.group(3))


def bytes_phase():
    """Bytes stored per OTLP byte through the whole system, before and after
    the cold rewrite, for the low- and high-cardinality corpora."""
    print("# bytes in the store per OTLP byte acknowledged (testkit log corpus, loadgen, 3 h back)")
    for card in ("low", "high"):
        serve = Serve(["--shards", "1"])
        pool = 400
        extra = ["--high-cardinality"] if card == "high" else []
        reqs, wire = loadgen(serve.http, "--batch", "1000", "--conns", "2", "--rate", "20", "--for", "15",
                             "--pool", str(pool), "--past", "3h", *extra)
        assert reqs <= pool, f"{reqs} requests sent from a pool of {pool}: some were repeats"
        serve.stop()  # seals and publishes what is open
        serve.start()
        sealed = objects(serve)["logs"]
        cost = compact(serve, "--cold-after", "0s")
        cold = objects(serve)["logs"]
        serve.stop()
        shutil.rmtree(serve.dir, ignore_errors=True)
        print(f"#   {card:<4}: {reqs} requests, {wire} OTLP bytes; sealed {sealed[0]} objects "
              f"{sealed[1] / wire:.3f} B/B; cold {cold[0]} objects {cold[1] / wire:.3f} B/B; "
              f"cold rewrite {cost[1]:.1f} CPU s, {sealed[1] / 1048576 / cost[1]:.0f} MiB/CPU s")


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + ("{" + want + "}" if want else " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def lag_phase():
    """The compactor inside `mira serve` under load: backlog and lag."""
    secs = int(os.environ.get("LAG_S", "120"))
    os.environ["MIRA_SERVE_ARGS"] = ""  # this serve runs its compactor
    serve = Serve(["--shards", "1", "--seal-size", "1", "--min-block-age", "5s", "--plan-interval", "2s"])
    gen = subprocess.Popen([MIRA, "loadgen", "--target", serve.http, "--protocol", "http", "--signal", "logs",
                            "--batch", "1000", "--conns", "1", "--rate", "10", "--for", str(secs)],
                           stdout=subprocess.PIPE, text=True)
    print(f"# lag: loadgen 10 requests/s x 1,000 records, every request sealed as its own block, for {secs} s")
    print(f"#   {'t s':>5} {'merge backlog':>13} {'oldest merge s':>14} {'fullest partition':>17} {'jobs ok':>8}")
    t0 = time.time()
    while gen.poll() is None:
        time.sleep(5)
        with urllib.request.urlopen(f"http://{serve.query}/metrics", timeout=10) as r:
            text = r.read().decode()
        print(f"#   {time.time() - t0:>5.0f} "
              f"{metric(text, 'mira_compactor_backlog_partitions', kind='merge'):>13.0f} "
              f"{metric(text, 'mira_compactor_oldest_pending_seconds', kind='merge'):>14.1f} "
              f"{metric(text, 'mira_compactor_partition_objects_max'):>17.0f} "
              f"{metric(text, 'mira_compactor_jobs_total', kind='merge', outcome='ok'):>8.0f}")
    print(f"#   loadgen: {gen.stdout.read().strip()}")
    serve.stop()
    shutil.rmtree(serve.dir, ignore_errors=True)


def main():
    phases = os.environ.get("MIRA_PHASES", "battery,bytes,lag").split(",")
    if "battery" in phases:
        battery_phase()
    if "bytes" in phases:
        bytes_phase()
    if "lag" in phases:
        lag_phase()


def battery_phase():
    scratch = tempfile.mkdtemp(prefix="mira-compactor-corpus-")
    serve = Serve()
    t = time.perf_counter()
    trace_ids = load(serve, scratch)
    records = query.LOG_BLOCKS * query.PER_BLOCK + query.TRACE_BLOCKS * query.SPANS_PER_BLOCK + 40 * 233
    print(f"# corpus: {query.LOG_BLOCKS} log blocks x {query.PER_BLOCK} records, {query.TRACE_BLOCKS} trace "
          f"blocks x {query.SPANS_PER_BLOCK} spans, 40 counter series; one hour from "
          f"{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime(query.T0))}; loaded in {time.perf_counter() - t:.1f} s; "
          f"OTLP bytes {query.WIRE}")
    sess = clickhouse(scratch)
    hour = {"start": query.T0, "end": query.END + 1}
    queries = battery_queries(hour, trace_ids[len(trace_ids) // 2])
    wait_until("published", lambda: serve.get("logs", dict(hour, limit=1))[1]["stats"]["recent_blocks"] == 0,
               timeout=600)
    stages = [("before", objects(serve), battery(serve, sess, queries), None)]
    # MIRA_TARGET_HOT (e.g. 32MiB) compares hot merge output sizes;
    # MIRA_STAGES=hot stops after the hot merge.
    hot = ["--cold-after", "1000h", "--target-hot-bytes", os.environ.get("MIRA_TARGET_HOT", "128MiB")]
    if os.environ.get("MIRA_TARGET_HOT"):
        hot += ["--mature-hot-bytes", os.environ["MIRA_TARGET_HOT"]]
    plan = [("hot merge", hot), ("cold", ["--cold-after", "0s"])]
    if os.environ.get("MIRA_STAGES") == "hot":
        plan = plan[:1]
    for stage, flags in plan:
        cost = compact(serve, *flags)
        stages.append((stage, objects(serve), battery(serve, sess, queries), cost))
    serve.stop()
    shutil.rmtree(serve.dir, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)

    print(f"{'stage':<10} " + " ".join(f"{s + ' objects':>15} {s + ' B/B':>12}" for s in SIGNALS)
          + f" {'compactor wall/CPU s':>22} {'MiB/CPU s':>10} {'records/CPU s':>14}")
    prev_bytes = None
    for stage, objs, _, cost in stages:
        line = f"{stage:<10} " + " ".join(
            f"{objs[s][0]:>15} {objs[s][1] / max(query.WIRE.get(s, 1), 1):>12.3f}" for s in SIGNALS)
        if cost:
            wall, cpu, summary = cost
            mib = sum(v[1] for v in prev_bytes.values()) / 1048576
            line += f" {wall:>10.1f} / {cpu:<9.1f} {mib / cpu:>10.1f} {records / cpu:>14.0f}  {summary}"
        print(line)
        prev_bytes = objs
    print(f"{'query':<24} " + " ".join(f"{st[0] + ' warm':>16} {'cold':>8} {'x CH':>6}" for st in stages)
          + f" {'clickhouse':>11}")
    for i, (name, *_rest) in enumerate(stages[0][2]):
        cells = []
        for _, _, rows, _ in stages:
            _, w, _, c, ch, ratio, _, _ = rows[i]
            cells.append(f"{w:>14.1f}ms {c:>6.1f}ms {ratio:>6.2f}")
        print(f"{name:<24} " + " ".join(cells) + f" {stages[0][2][i][4]:>9.1f}ms")
    # The answers must not change with the layout.
    for i, (name, *_rest) in enumerate(stages[0][2]):
        answers = []
        for _, _, rows, _ in stages:
            a = dict(rows[i][7])
            a.pop("stats", None)
            answers.append(json.dumps(a, sort_keys=True))
        same = all(x == answers[0] for x in answers)
        print(f"# {name}: answers {'identical' if same else 'DIFFER'} across the three layouts")


if __name__ == "__main__":
    main()
