"""Retention and offload measurements (docs/perf.md, issue 14). Phases
(MIRA_PHASES, a comma list; default all four):

- cycle: CYCLE_BYTES (3300MiB) of real cold log blocks (the
  `offload_cycle` example) in `mira serve --no-compactor`'s file://
  store. A plain `cp -r` of the same files on the same volume is the
  baseline; a reference copy is taken before the offload (MIRA_REF_DIR,
  /dev/shm by default, so the disk holds two copies at most). Then
  `mira compactor --once` with no policy (the idle cost of a run), an
  offload policy and `mira compactor --once` (the copy), a second run with
  `--deletion-grace 0s` (primaries freed), `mira offload restore` (rate
  RESTORE_RATE, 0 = none), `diff -r` of every restored block against the
  reference, the same two queries before the offload and after the restore
  (cold cache each time, `elapsed_us` normalised), and a second restore
  that must copy 0 blocks.
- list: `mira offload list` (wall time of the process, median of 5) over an
  empty catalog, then over LIST_BLOCKS (10,000) offloaded catalog rows.
- retention: RETENTION_BLOCKS (100,000) catalog rows, one per (tenant,
  signal, hour) of 10 tenants, all older than 8 days; `mira compactor
  --once` without a policy (baseline), with `retain 7d` (the sweep), then
  with `--deletion-grace 0s` (the purge); the catalog's command counters
  (mira_catalog_command_duration_seconds_count) before and after each.
- ingest: `mira loadgen` at 4 connections against `mira serve
  --no-compactor` in windows of INGEST_S seconds (10), alternating alone
  (A) and while a `mira compactor --once` runs (B; SIGSTOP outside them),
  until the compactor finishes (at most INGEST_MAX_B, 20, B windows), after
  one warm-up window, in two stages, each in a fresh serve: the retention
  sweep of INGEST_RETENTION_BLOCKS (30,000) expired rows, and
  an offload at --offload-rate 50MiB of INGEST_OFFLOAD_BYTES (3.5 x
  INGEST_S x 50 MiB) of cold blocks to a target in INGEST_TARGET_DIR
  (/dev/shm: a second store, not the ingester's disk). COMPACTOR_FLAGS adds flags to both
  compactors, COMP_PREFIX a command prefix, INGEST_STAGES picks the
  stages (sweep,offload); each stage ingests ~170 MiB/s of loadgen data
  into the scratch volume for as long as it runs. Per
  stage: mean B over mean A, each B over the A windows beside it, each
  window's cores, copy rate and catalog commands.

Every phase prints its figures with the ratio to its baseline.
Needs MIRA_BIN (release `mira`) and GEN_BIN (the release example)."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from serve_proc import Serve, free_port, wait_until  # noqa: E402

MIRA = os.environ["MIRA_BIN"]
GEN = os.environ["GEN_BIN"]
MIB = 1 << 20
DAY_S = 86400


def env_bytes(name, default):
    v = os.environ.get(name, default).strip()
    for suffix, mul in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if v.endswith(suffix):
            return int(float(v[: -len(suffix)]) * mul)
    return int(v)


def run(*args, timeout=3600):
    """(wall seconds, stdout) of a process that must succeed."""
    t = time.perf_counter()
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return wall, out.stdout


def timed_sync():
    t = time.perf_counter()
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def gen(*args):
    _, out = run(GEN, *args)
    return json.loads(out.strip().splitlines()[-1])


def metrics(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        return r.read().decode()


def commands(addr, what="count"):
    """The catalog's write commands so far (or, with "sum", the seconds
    they took), by command (all outcomes)."""
    out = {}
    for line in metrics(addr).splitlines():
        if line.startswith(f"mira_catalog_command_duration_seconds_{what}{{"):
            labels, value = line.rsplit(" ", 1)
            cmd = labels.split('command="', 1)[1].split('"', 1)[0]
            out[cmd] = out.get(cmd, 0) + (float(value) if what == "sum" else int(float(value)))
    return out


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Catalog:
    """A single-member `mira catalog`."""

    def __init__(self, scratch):
        self.addr = f"127.0.0.1:{free_port()}"
        self.dir = os.path.join(scratch, "catalog")
        os.makedirs(scratch, exist_ok=True)
        self.proc = subprocess.Popen(
            [MIRA, "catalog", "--listen", self.addr, "--peers", f"0={self.addr}", "--data-dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(scratch, "catalog.log"), "w"))
        wait_until("catalog ready", lambda: urllib.request.urlopen(f"http://{self.addr}/ready", timeout=1).status == 200)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def compactor_args(catalog, data_dir, archive, *flags):
    return [MIRA, "compactor", "--catalog", catalog, "--data-dir", data_dir,
            "--compactor-listen", f"127.0.0.1:{free_port()}", "--offload-target", f"archive=file://{archive}",
            "--offload-min-age", "0s", *flags]


def compact_once(catalog, data_dir, archive, *flags):
    """(wall s, JSON summary) of `mira compactor --once`."""
    wall, out = run(*compactor_args(catalog, data_dir, archive, "--once", *flags))
    return wall, json.loads(out.strip().splitlines()[-1])


def mira(*args):
    return run(MIRA, *args)


def files_under(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".mira"):
                p = os.path.join(dirpath, f)
                out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def mibs(nbytes, secs):
    return nbytes / MIB / secs if secs > 0 else float("inf")


def query(serve, tenant, params):
    url = f"http://{serve.query}/api/mira/v1/logs?" + urllib.parse.urlencode(params)
    req = urllib.request.Request(url, headers={"X-Scope-OrgID": tenant})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        body = json.loads(r.read())
    return time.perf_counter() - t, body


def answers(serve, tenant, queries):
    """Restarts serve with an empty block cache, then each query once:
    (name, seconds, stats, the answer with elapsed_us normalised)."""
    serve.stop()
    shutil.rmtree(os.path.join(serve.dir, "data", "cache"), ignore_errors=True)
    serve.start()
    out = []
    for name, params in queries:
        secs, body = query(serve, tenant, params)
        stats = dict(body.get("stats", {}))
        body.get("stats", {}).pop("elapsed_us", None)
        out.append((name, secs, stats, json.dumps(body, sort_keys=True)))
    return out


def phase_cycle(scratch):
    total = env_bytes("CYCLE_BYTES", "3300MiB")
    print(f"# cycle: {total / MIB:.0f} MiB of cold log blocks, tenant cycle, file:// primary and target on one volume")
    os.makedirs(os.path.join(scratch, "serve"))
    serve = Serve("--no-compactor", data_dir=os.path.join(scratch, "serve"))
    objects = os.path.join(serve.dir, "data", "objects")
    archive = os.path.join(scratch, "archive")
    ref_root = os.environ.get("MIRA_REF_DIR") or "/dev/shm"
    ref = tempfile.mkdtemp(prefix="mira-offload-ref-", dir=ref_root)
    try:
        g = gen("blocks", "--catalog", serve.catalog, "--store", objects, "--tenant", "cycle",
                "--bytes", str(total), "--days-back", "3d")
        files = files_under(os.path.join(objects, "cycle"))
        nbytes = sum(files.values())
        print(f"#   generated {g['blocks']} blocks, {nbytes / MIB:.1f} MiB ({nbytes / (1 << 30):.3f} GiB) in "
              f"{g['seconds']:.1f} s; {len(files)} files")
        assert len(files) == g["blocks"]
        start_s = g["first_hour_ns"] // 10**9
        end_s = g["last_hour_ns"] // 10**9 + 3600
        queries = [("newest 100", dict(start=start_s, end=end_s, limit=100)),
                   ("body matches nothing", dict(start=start_s, end=end_s, limit=100, contains="no-such-token"))]

        # The baseline: a plain copy of the same files, same volume.
        timed_sync()
        t = time.perf_counter()
        subprocess.run(["cp", "-r", os.path.join(objects, "cycle"), os.path.join(scratch, "cp-baseline")], check=True)
        cp_s = time.perf_counter() - t
        cp_sync = timed_sync()
        shutil.rmtree(os.path.join(scratch, "cp-baseline"))
        # The reference, taken before the offload.
        subprocess.run(["cp", "-r", os.path.join(objects, "cycle"), os.path.join(ref, "cycle")], check=True)

        before = answers(serve, "cycle", queries)
        idle_s, idle = compact_once(serve.catalog, os.path.join(serve.dir, "data"), archive)
        mira("policy", "set", "cycle-offload", "--catalog", serve.catalog, "--kind", "offload", "--tenant", "cycle",
             "--after", "1d", "--target", "archive")
        timed_sync()
        off_s, off = compact_once(serve.catalog, os.path.join(serve.dir, "data"), archive)
        off_sync = timed_sync()
        moved = off["lifecycle"]["offloaded_bytes"]
        assert off["lifecycle"]["offloaded_blocks"] == g["blocks"], off
        free_s, freed = compact_once(serve.catalog, os.path.join(serve.dir, "data"), archive, "--deletion-grace", "0s")
        assert freed["primaries_freed"] == g["blocks"], freed
        assert not files_under(os.path.join(objects, "cycle")), "primaries left after freeing"
        _, listed = mira("offload", "list", "--catalog", serve.catalog, "--tenant", "cycle")
        during = answers(serve, "cycle", queries[:1])

        restore = ["offload", "restore", "--catalog", serve.catalog, "--object-store", f"file://{objects}",
                   "--offload-target", f"archive=file://{archive}", "--tenant", "cycle", "--yes", "--output", "json",
                   "--rate", os.environ.get("RESTORE_RATE", "0")]
        timed_sync()
        res_s, out = mira(*restore)
        res_sync = timed_sync()
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary.get("restored") == g["blocks"] and summary.get("failed") == 0, summary
        diff = subprocess.run(["diff", "-r", os.path.join(ref, "cycle"), os.path.join(objects, "cycle")],
                              capture_output=True, text=True)
        restored = files_under(os.path.join(objects, "cycle"))
        after = answers(serve, "cycle", queries)
        res2_s, out2 = mira(*restore)
        summary2 = json.loads(out2.strip().splitlines()[-1])

        cp_rate = mibs(nbytes, cp_s)
        print(f"{'step':<44} {'seconds':>8} {'MiB/s':>8} {'x cp -r':>8}  then sync s")
        print(f"{'cp -r (baseline)':<44} {cp_s:>8.2f} {cp_rate:>8.1f} {1:>8.2f}  {cp_sync:.2f}")
        print(f"{'compactor --once, no policy (idle run)':<44} {idle_s:>8.2f}")
        rate = mibs(moved, off_s)
        print(f"{'compactor --once, offload (whole process)':<44} {off_s:>8.2f} {rate:>8.1f} {rate / cp_rate:>8.2f}  "
              f"{off_sync:.2f}")
        net = mibs(moved, off_s - idle_s)
        print(f"{'  less the idle run':<44} {off_s - idle_s:>8.2f} {net:>8.1f} {net / cp_rate:>8.2f}")
        print(f"{'compactor --once --deletion-grace 0s (free)':<44} {free_s:>8.2f}")
        rrate = mibs(nbytes, res_s)
        print(f"{'mira offload restore':<44} {res_s:>8.2f} {rrate:>8.1f} {rrate / cp_rate:>8.2f}  {res_sync:.2f}")
        print(f"{'second restore':<44} {res2_s:>8.2f}")
        print(f"#   offloaded {off['lifecycle']['offloaded_blocks']} blocks, {moved / MIB:.1f} MiB; primaries freed "
              f"{freed['primaries_freed']}; restore summary {json.dumps(summary)}")
        print(f"#   second restore: {json.dumps(summary2)}; copies 0 blocks: "
              f"{'yes' if summary2.get('restored') == 0 and summary2.get('failed') == 0 else 'NO'}")
        print(f"#   diff -r reference vs restored: {len(restored)} of {len(files)} files back, "
              f"{'no difference' if diff.returncode == 0 and diff.stdout == '' else 'DIFFERENCES: ' + diff.stdout[:500]}")
        print(f"#   while offloaded: newest-100 answer {len(json.loads(during[0][3]).get('lines', []))} lines, "
              f"stats {json.dumps(during[0][2])}")
        print("#   offload list:\n" + "\n".join("#     " + line for line in listed.strip().splitlines()[-4:]))
        for (name, s1, st1, a1), (_, s2, st2, a2) in zip(before, after):
            print(f"#   query {name!r}: before {s1 * 1000:.0f} ms, after restore {s2 * 1000:.0f} ms; "
                  f"{len(json.loads(a1).get('lines', []))} lines; answers "
                  f"{'identical' if a1 == a2 else 'DIFFER'}; stats before {json.dumps(st1)}")
    finally:
        serve.kill()
        shutil.rmtree(ref, ignore_errors=True)
        shutil.rmtree(os.path.join(scratch, "serve"), ignore_errors=True)
        shutil.rmtree(archive, ignore_errors=True)


def median_wall(args, n=5):
    return statistics.median(run(*args)[0] for _ in range(n))


def phase_list(scratch):
    n = int(os.environ.get("LIST_BLOCKS", "10000"))
    cat = Catalog(os.path.join(scratch, "list"))
    try:
        base = [MIRA, "offload", "list", "--catalog", cat.addr, "--all-tenants"]
        empty = median_wall(base)
        g = gen("rows", "--catalog", cat.addr, "--blocks", str(n), "--tenants", "10", "--days-back", "3d",
                "--offloaded-to", f"file://{scratch}/archive")
        _, table = run(*base)
        print(f"# list: {n} offloaded blocks (catalog rows, 10 tenants x 3 signals, one per hour), published in "
              f"{g['seconds']:.1f} s; wall time of the `mira offload list` process, median of 5")
        print(f"{'command':<52} {'ms':>8} {'x empty':>8} {'x target 100 ms':>16}")
        print(f"{'list over an empty catalog (baseline)':<52} {empty * 1000:>8.1f} {1:>8.2f} {empty * 10:>16.2f}")
        for label, extra in (("list (table, by partition)", []), ("list --output json", ["--output", "json"]),
                             ("list --blocks", ["--blocks"]), ("list --blocks --output json",
                                                               ["--blocks", "--output", "json"])):
            w = median_wall(base + extra)
            print(f"{label:<52} {w * 1000:>8.1f} {w / empty:>8.2f} {w * 10:>16.2f}")
        print(f"#   the table's last lines:\n" + "\n".join("#     " + x for x in table.strip().splitlines()[-2:]))
    finally:
        cat.stop()
        shutil.rmtree(os.path.join(scratch, "list"), ignore_errors=True)


def phase_retention(scratch):
    n = int(os.environ.get("RETENTION_BLOCKS", "100000"))
    root = os.path.join(scratch, "retention")
    cat = Catalog(root)
    data = os.path.join(root, "data")
    archive = os.path.join(root, "archive")
    try:
        g = gen("rows", "--catalog", cat.addr, "--blocks", str(n), "--tenants", "10", "--days-back", "8d")
        days = (g["last_hour_ns"] - g["first_hour_ns"]) / 1e9 / DAY_S
        print(f"# retention: {n} blocks (catalog rows, no objects; 10 tenants x 3 signals, one per hour over "
              f"{days:.0f} days, all older than 8 d), published in {g['seconds']:.1f} s")
        c0 = commands(cat.addr)
        idle_s, idle = compact_once(cat.addr, data, archive)
        c1 = commands(cat.addr)
        mira("policy", "set", "keep-7d", "--catalog", cat.addr, "--retain", "7d")
        c2 = commands(cat.addr)
        ret_s, ret = compact_once(cat.addr, data, archive)
        c3 = commands(cat.addr)
        purge_s, purge = compact_once(cat.addr, data, archive, "--deletion-grace", "0s")
        c4 = commands(cat.addr)
        dropped = ret["lifecycle"]["dropped_blocks"]
        d_ret, d_purge = delta(c2, c3), delta(c3, c4)
        print(f"{'run':<48} {'seconds':>8} {'x idle':>7} {'blocks':>8} {'commands':>9} {'per block':>10}")
        print(f"{'compactor --once, no policy (baseline)':<48} {idle_s:>8.2f} {1:>7.2f} {'':>8} "
              f"{sum(delta(c0, c1).values()):>9}")
        print(f"{'compactor --once, retain 7d (the sweep)':<48} {ret_s:>8.2f} {ret_s / idle_s:>7.2f} {dropped:>8} "
              f"{sum(d_ret.values()):>9} {sum(d_ret.values()) / max(dropped, 1):>10.4f}")
        print(f"{'compactor --once --deletion-grace 0s (purge)':<48} {purge_s:>8.2f} {purge_s / idle_s:>7.2f} "
              f"{purge['purged']:>8} {sum(d_purge.values()):>9} {sum(d_purge.values()) / max(purge['purged'], 1):>10.4f}")
        print(f"#   commands: idle {json.dumps(delta(c0, c1))}; sweep {json.dumps(d_ret)}; purge {json.dumps(d_purge)}")
        print(f"#   sweep summary {json.dumps(ret)}")
    finally:
        cat.stop()
        shutil.rmtree(root, ignore_errors=True)


def loadgen(serve, secs):
    _, out = run(MIRA, "loadgen", "--target", serve.grpc, "--conns", "4", "--batch", "8192", "--for", str(secs))
    rate = float(out.split(" records/s")[0].rsplit(" ", 1)[1].replace(",", ""))
    return rate, out.strip()


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ingest_windows(serve, args, log, secs, archive, max_b):
    """Windows A B A B ... A of `secs`: A is loadgen alone, B loadgen while
    the compactor process `args` runs (SIGSTOP between B windows, SIGCONT
    in them), until the compactor has finished or `max_b` B windows ran.
    Returns (rows, the compactor's JSON summary)."""
    comp = None
    rows = []
    try:
        kind = "A"
        while True:
            if kind == "B":
                if comp is None:
                    comp = subprocess.Popen(os.environ.get("COMP_PREFIX", "").split() + args,
                                            stdout=subprocess.PIPE, stderr=log, text=True)
                else:
                    comp.send_signal(signal.SIGCONT)
            arch0, serve0 = sum(files_under(archive).values()), cpu_s(serve.proc.pid)
            comp0 = cpu_s(comp.pid) if comp and comp.poll() is None else 0.0
            cmd0, cmd_s0 = commands(serve.query), commands(serve.query, "sum")
            t = time.perf_counter()
            rate, out = loadgen(serve, secs)
            wall = time.perf_counter() - t
            cmds = delta(cmd0, commands(serve.query))
            cmd_s = sum(delta(cmd_s0, commands(serve.query, "sum")).values())
            running = comp is not None and comp.poll() is None
            comp_cpu = (cpu_s(comp.pid) - comp0) / wall if kind == "B" and running else 0.0
            if kind == "B" and running:
                comp.send_signal(signal.SIGSTOP)
            copied = (sum(files_under(archive).values()) - arch0) / MIB / wall
            rows.append((kind, rate, (cpu_s(serve.proc.pid) - serve0) / wall, comp_cpu, copied,
                         running or kind == "A", out, cmds, cmd_s))
            if kind == "A" and comp is not None and (comp.poll() is not None
                                                      or sum(r[0] == "B" for r in rows) >= max_b):
                break
            kind = "B" if kind == "A" else "A"
        comp.send_signal(signal.SIGCONT)
        summary = json.loads(comp.communicate(timeout=3600)[0].strip().splitlines()[-1])
        return rows, summary
    finally:
        if comp is not None and comp.poll() is None:
            comp.send_signal(signal.SIGCONT)
            comp.kill()
            comp.wait()


def print_windows(title, rows):
    base = statistics.mean(x[1] for x in rows if x[0] == "A")
    print(f"## {title}")
    print(f"{'window':<8} {'records/s':>12} {'x mean A':>9} {'x its As':>9} {'serve cores':>12} "
          f"{'compactor cores':>16} {'copied MiB/s':>13} {'catalog cmds':>13} {'catalog cmd s':>14}")
    ratios = []
    for i, (kind, rate, sc, cc, copied, ok, _, cmds, cmd_s) in enumerate(rows):
        # A B window against the A windows on either side of it.
        near = [rows[j][1] for j in (i - 1, i + 1) if 0 <= j < len(rows) and rows[j][0] == "A"]
        local = rate / statistics.mean(near) if kind == "B" and near else 1.0
        if kind == "B" and ok:
            ratios.append(local)
        note = "" if ok else "  (the compactor had finished)"
        print(f"{kind:<8} {rate:>12,.0f} {rate / base:>9.3f} {local:>9.3f} {sc:>12.2f} {cc:>16.2f} "
              f"{copied:>13.1f} {int(sum(cmds.values())):>13} {cmd_s:>14.2f}{note}")
        print(f"#          catalog commands {json.dumps({k: int(v) for k, v in cmds.items()})}")
    busy = [x[1] for x in rows if x[0] == "B" and x[5]]
    print(f"{title}: mean B (compactor running) / mean A: {statistics.mean(busy) / base:.3f}; each B against its "
          f"neighbours: {', '.join(f'{x:.3f}' for x in ratios)}; lowest {min(ratios):.3f} (target >= 0.9)")
    for kind, *_rest in rows:
        print(f"#   {kind} loadgen: {_rest[5].splitlines()[-1]}")


def phase_ingest(scratch):
    """Two stages, each in a fresh `mira serve --no-compactor` (so the
    scratch volume holds one stage's ingest at a time) and each windows A B
    A B ... A of INGEST_S seconds after one warm-up window (A: loadgen
    alone; B: loadgen while a `mira compactor --once` runs, SIGSTOP outside
    B, so both kinds of window see the same machine) until that compactor
    finishes: the retention sweep of INGEST_RETENTION_BLOCKS expired rows,
    and an offload at --offload-rate 50MiB of INGEST_OFFLOAD_BYTES of cold
    blocks."""
    secs = int(os.environ.get("INGEST_S", "10"))
    max_b = int(os.environ.get("INGEST_MAX_B", "20"))
    total = env_bytes("INGEST_OFFLOAD_BYTES", f"{int(3.5 * secs * 50)}MiB")
    n = int(os.environ.get("INGEST_RETENTION_BLOCKS", "30000"))
    extra = os.environ.get("COMPACTOR_FLAGS", "").split()
    print(f"# ingest: loadgen 4 connections, batch 8192, OTLP/gRPC into mira serve --no-compactor, windows of "
          f"{secs} s after a warm-up window, A alone and B with `mira compactor --once` (stopped outside B)"
          f"{' ' + ' '.join(extra) if extra else ''}"
          f"{' under ' + os.environ['COMP_PREFIX'] if os.environ.get('COMP_PREFIX') else ''}")
    for stage in os.environ.get("INGEST_STAGES", "sweep,offload").split(","):
        root = os.path.join(scratch, "ingest")
        os.makedirs(os.path.join(root, "serve"))
        serve = Serve("--no-compactor", data_dir=os.path.join(root, "serve"))
        data = os.path.join(serve.dir, "data")
        # The target stands for a second store (a bucket elsewhere): by
        # default a directory in /dev/shm, so the copy does not write to the
        # disk the ingester's WAL and blocks go to, which a remote target
        # never does.
        archive_root = tempfile.mkdtemp(prefix="mira-ingest-archive-",
                                        dir=os.environ.get("INGEST_TARGET_DIR", "/dev/shm"))
        archive = os.path.join(archive_root, "archive")
        try:
            def args(*flags):
                a = compactor_args(serve.catalog, data, archive, "--once", "--min-block-age", "1h", *flags, *extra)
                a[a.index("--compactor-listen") + 1] = f"127.0.0.1:{free_port()}"
                return a

            log = open(os.path.join(root, "compactor.log"), "w")
            if stage == "sweep":
                r = gen("rows", "--catalog", serve.catalog, "--blocks", str(n), "--tenants", "10",
                        "--tenant-prefix", "old", "--days-back", "8d")
                compact_once(serve.catalog, data, archive)  # registers the target
                mira("policy", "set", "old-7d", "--catalog", serve.catalog, "--retain", "7d", "--tenant-glob", "old*")
                title, flags = f"retention sweep of {r['blocks']} expired blocks", ()
            else:
                g = gen("blocks", "--catalog", serve.catalog, "--store", os.path.join(data, "objects"), "--tenant",
                        "cycle", "--bytes", str(total), "--days-back", "3d")
                compact_once(serve.catalog, data, archive)  # registers the target
                mira("policy", "set", "cycle-offload", "--catalog", serve.catalog, "--kind", "offload", "--tenant",
                     "cycle", "--after", "1d", "--target", "archive")
                title = f"offload of {g['blocks']} blocks, {g['bytes'] / MIB:.0f} MiB at --offload-rate 50MiB"
                flags = ("--offload-rate", "50MiB")
            warm, _ = loadgen(serve, secs)
            print(f"# {stage}: warm-up window {warm:,.0f} records/s (not counted)")
            rows, summary = ingest_windows(serve, args(*flags), log, secs, archive, max_b)
            print_windows(title, rows)
            life = summary["lifecycle"]
            print(f"#   the compactor: {life['dropped_blocks']} blocks dropped, {life['offloaded_blocks']} offloaded; "
                  f"errors {life['errors'][:3]}")
            sys.stdout.flush()
        finally:
            serve.kill()
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(archive_root, ignore_errors=True)


def main():
    phases = os.environ.get("MIRA_PHASES", "cycle,list,retention,ingest").split(",")
    scratch = tempfile.mkdtemp(prefix="mira-offload-cycle-", dir=os.environ.get("MIRA_SCRATCH"))
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, scratch {scratch}")
    try:
        for p in phases:
            {"cycle": phase_cycle, "list": phase_list, "retention": phase_retention, "ingest": phase_ingest}[p](scratch)
            sys.stdout.flush()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
