"""Ack latency below saturation (docs/perf.md, issue 18 item 4); run by
scripts/measure/ack-latency.sh, which builds the binary.

For each WAL mode: the capacity first (`mira loadgen` at 4 unpaced
connections, OTLP/gRPC, batch 8192 low-cardinality log records, as fast as
acknowledged), then 4 connections paced at FRACTIONS of that capacity. Each
point runs against a fresh `mira ingester`, on a quiet disk (the data of the
point before deleted and `sync` run: otherwise the kernel writing back
gigabytes of an earlier point's WAL slows this point's WAL writes). Prints records/s, the ack p50 /
p99 the load generator saw, and where the ingester's time went: the mean and
the p50 of each phase of `mira_ingester_phase_seconds{signal="logs"}`,
diffed before and after the point (see docs/api.md for the phases).

Environment: MIRA_BIN (the ingester measured), LOADGEN_BIN (the `mira` whose
loadgen drives it; default MIRA_BIN), WALS ("page-cache fsync"), FRACTIONS
("0.25 0.5 0.75"), CONNS (4), BATCH (8192), INGESTER_FLAGS (extra flags).
Argument: seconds per point (default 10).
"""

import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PHASES = ["slot", "body", "admission", "shard_queue", "decode", "wal_queue", "wal_write", "reply", "total"]


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def wait_ready(http, proc, log):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"ingester exited:\n{open(log).read()[-2000:]}")
        try:
            get(f"http://{http}/ready")
            return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"ingester not ready in 60 s:\n{open(log).read()[-2000:]}")


LINE = re.compile(r'^mira_ingester_(phase_seconds|wal_write_seconds|wal_fsync_seconds|runtime_lag_seconds)'
                  r'_(bucket|sum|count)(?:\{([^}]*)\})? (\S+)$')
# The WAL's own group timings and the runtime's lateness, beside the phases.
PROBES = ["wal_write_seconds", "wal_fsync_seconds", "runtime_lag_seconds"]


def phases(http):
    """name -> {"sum": s, "count": n, "buckets": [(le, cumulative)]}: each
    phase of logs, and the PROBES."""
    out = {}
    for line in get(f"http://{http}/metrics").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        metric, kind, labels, value = m.groups()
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        if metric == "phase_seconds":
            if lab.get("signal") != "logs":
                continue
            name = lab["phase"]
        else:
            name = metric
        p = out.setdefault(name, {"sum": 0.0, "count": 0.0, "buckets": []})
        if kind == "bucket":
            le = float("inf") if lab["le"] == "+Inf" else float(lab["le"])
            p["buckets"].append((le, float(value)))
        else:
            p[kind] = float(value)
    return out


def diff(after, before):
    out = {}
    for name, a in after.items():
        b = before.get(name, {"sum": 0.0, "count": 0.0, "buckets": []})
        bb = dict(b["buckets"])
        out[name] = {
            "sum": a["sum"] - b["sum"],
            "count": a["count"] - b["count"],
            "buckets": [(le, c - bb.get(le, 0.0)) for le, c in sorted(a["buckets"])],
        }
    return out


def quantile(p, q):
    """Linear interpolation inside the bucket holding the q-quantile."""
    n = p["count"]
    if n <= 0:
        return None
    rank = q * n
    lo, below = 0.0, 0.0
    for le, c in p["buckets"]:
        if c >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(c - below, 1e-9)
        lo, below = le, c
    return lo


def loadgen(binary, grpc, conns, batch, secs, rate):
    cmd = [binary, "loadgen", "--target", grpc, "--conns", str(conns), "--batch", str(batch), "--for", str(secs)]
    if rate:
        cmd += ["--rate", str(rate)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    m = re.search(r"([0-9]+) records/s.*p50 ([0-9.]+) ms, p99 ([0-9.]+) ms.*; ([0-9]+) failed", out)
    if not m:
        sys.exit(f"unreadable loadgen output: {out}")
    return float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main():
    secs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    binary = os.environ["MIRA_BIN"]
    lg = os.environ.get("LOADGEN_BIN") or binary
    wals = os.environ.get("WALS", "page-cache fsync").split()
    fractions = [float(f) for f in os.environ.get("FRACTIONS", "0.25 0.5 0.75").split()]
    conns = int(os.environ.get("CONNS", "4"))
    batch = int(os.environ.get("BATCH", "8192"))
    extra = shlex.split(os.environ.get("INGESTER_FLAGS", ""))
    ticks = os.sysconf("SC_CLK_TCK")
    work = tempfile.mkdtemp()
    env = dict(os.environ)
    env["MIRA_CLUSTER_SECRET_FILE"] = subprocess.run(
        ["scripts/cluster-secret.sh", work], check=True, capture_output=True, text=True
    ).stdout.strip()
    cat = f"127.0.0.1:{port()}"
    procs = []
    catalog = subprocess.Popen(
        [binary, "catalog", "--listen", cat, "--peers", f"0={cat}", "--data-dir", f"{work}/catalog"],
        stderr=open(f"{work}/catalog.log", "w"),
        env=env,
    )
    procs.append(catalog)
    os.environ["MIRA_CLUSTER_SECRET_FILE"] = env["MIRA_CLUSTER_SECRET_FILE"]
    rows = []
    try:
        for wal in wals:
            capacity = None
            for point in ["max"] + fractions:
                grpc, http = f"127.0.0.1:{port()}", f"127.0.0.1:{port()}"
                data = f"{work}/ingester-{wal}-{point}"
                log = f"{work}/ingester.log"
                ing = subprocess.Popen(
                    [binary, "ingester", "--ingester-id", f"ack-{wal}-{point}", "--catalog", cat,
                     "--grpc-listen", grpc, "--http-listen", http, "--data-dir", data, "--wal", wal] + extra,
                    stderr=open(log, "w"),
                    env=env,
                )
                procs.append(ing)
                wait_ready(http, ing, log)
                rate = 0
                if point != "max":
                    rate = max(1, round(point * capacity / batch))
                before, t0 = phases(http), cpu_ticks(ing.pid)
                rps, p50, p99, failed = loadgen(lg, grpc, conns, batch, secs, rate)
                after, t1 = phases(http), cpu_ticks(ing.pid)
                ing.terminate()
                ing.wait()
                procs.remove(ing)
                # The next point starts on a quiet disk: this one's WAL and
                # blocks gone, nothing of them left to write back.
                subprocess.run(["rm", "-rf", data], check=True)
                os.sync()
                if point == "max":
                    capacity = rps
                    label = f"{conns} unpaced"
                else:
                    label = f"{conns} @ {point:.0%} ({rate} req/s)"
                d = diff(after, before)
                cores = (t1 - t0) / ticks / secs
                rows.append((wal, label, rps, rps / capacity, p50, p99, failed, cores, d))
                print(f"{wal:<10} {label:<26} {rps:>11,.0f} records/s ({rps / capacity:.2f} of capacity), "
                      f"ack p50 {p50:.1f} ms p99 {p99:.1f} ms, {failed} failed, ingester {cores:.2f} cores",
                      flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        subprocess.run(["rm", "-rf", work])
    print()
    print("| WAL | conns | records/s | of capacity | ack p50 | ack p99 | ingester cores |")
    print("|---|---|---|---|---|---|---|")
    for wal, label, rps, frac, p50, p99, failed, cores, _ in rows:
        print(f"| {wal} | {label} | {rps:,.0f} | {frac:.2f} | {p50:.1f} ms | {p99:.1f} ms | {cores:.2f} |")
    print()
    print("Phases (mira_ingester_phase_seconds, logs): mean / p50 in ms; n = requests observed")
    print("| WAL | conns | n | " + " | ".join(PHASES) + " |")
    print("|---|---|---|" + "---|" * len(PHASES))
    for wal, label, *_, d in rows:
        n = d.get("total", {}).get("count", 0)
        cells = []
        for name in PHASES:
            p = d.get(name)
            if not p or p["count"] <= 0:
                cells.append("—")
                continue
            cells.append(f"{p['sum'] / p['count'] * 1e3:.2f} / {quantile(p, 0.5) * 1e3:.2f}")
        print(f"| {wal} | {label} | {n:.0f} | " + " | ".join(cells) + " |")
    print()
    print("WAL groups (write(2), fdatasync) and runtime lag (lateness of a 10 ms tick): mean / p50 in ms")
    print("| WAL | conns | groups | write | fdatasync | runtime lag |")
    print("|---|---|---|---|---|---|")
    for wal, label, *_, d in rows:
        groups = d.get("wal_write_seconds", {}).get("count", 0)
        cells = []
        for name in PROBES:
            p = d.get(name)
            if not p or p["count"] <= 0:
                cells.append("—")
                continue
            cells.append(f"{p['sum'] / p['count'] * 1e3:.2f} / {quantile(p, 0.5) * 1e3:.2f}")
        print(f"| {wal} | {label} | {groups:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
