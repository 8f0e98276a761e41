"""Runs a rendered Mira deployment as processes inside a private network
and mount namespace (started by test_chart_processes.py through
`unshare --net --mount`): its own loopback, where every pod has an
address of its own and binds the ports the chart renders, and its own
/etc/hosts, where the Services' and pods' DNS names resolve as cluster
DNS would resolve them. Starts moto as the S3 endpoint, every pod's
process, waits for their readiness probes, sends an OTLP export with the
OpenTelemetry SDK to the ingester Service, reads it back through the
querier Service, runs the helm test hook's command, and prints one JSON
report. Exit 0 when every step passed."""

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE_S = 90
# Set by main() from the plan: the CA that signed the pods' certificate and
# the credential to send (both empty without security values).
CA_FILE = None
AUTH = {}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def wait_until(what, check, timeout=DEADLINE_S):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            r = check()
            if r:
                return r
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def get(url, headers=None, verify=True):
    """GET with the plan's credential; https verified against its CA
    (verify=False: the kubelet's probes, which check no certificate)."""
    req = urllib.request.Request(url, headers={**AUTH, **(headers or {})})
    ctx = None
    if url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=CA_FILE) if verify else ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def setup_namespace(hosts):
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    path = os.path.join(os.environ["NETNS_DIR"], "hosts")
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for ip, name in hosts:
            f.write(f"{ip} {name}\n")
    subprocess.run(["mount", "--bind", path, "/etc/hosts"], check=True)


def otel_export(otlp, tenant, marker):
    """Logs, a span and a gauge through the OpenTelemetry SDK's OTLP/HTTP
    exporters; returns the trace id (hex)."""
    import logging

    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    headers = {"X-Scope-OrgID": tenant, **AUTH}
    tls = {"certificate_file": CA_FILE} if CA_FILE else {}
    resource = Resource.create({"service.name": "chart-e2e"})
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp}/v1/traces", headers=headers, **tls)))
    lp = LoggerProvider(resource=resource)
    lp.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{otlp}/v1/logs", headers=headers,
                                                                         **tls)))
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{otlp}/v1/metrics", headers=headers, **tls),
                                           export_interval_millis=3_600_000)
    mp = MeterProvider(resource=resource, metric_readers=[reader])
    logger = logging.getLogger("chart-e2e")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(LoggingHandler(logger_provider=lp))
    tracer = tp.get_tracer("chart-e2e")
    with tracer.start_as_current_span(f"span-{marker}") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        logger.info("chart e2e %s", marker)
    counter = mp.get_meter("chart-e2e").create_counter("chart.e2e.requests")
    counter.add(3, {"marker": marker})
    reader.force_flush()
    tp.shutdown()
    lp.shutdown()
    mp.shutdown()
    return trace_id


def read_back(query, tenant, marker, trace_id):
    h = {"X-Scope-OrgID": tenant}
    now = time.time_ns()
    q = urllib.parse.urlencode({"query": '{service_name="chart-e2e"}', "start": now - 3_600_000_000_000,
                                "end": now + 60_000_000_000, "limit": 100})

    def logs():
        s, b = get(f"{query}/loki/api/v1/query_range?{q}", h)
        lines = [v[1] for r in json.loads(b)["data"]["result"] for v in r["values"]] if s == 200 else []
        return [line for line in lines if marker in line]

    def trace():
        s, b = get(f"{query}/api/traces/{trace_id}", dict(h, Accept="application/json"))
        return s == 200 and f"span-{marker}".encode() in b and b

    def metric():
        pq = urllib.parse.urlencode({"query": f'chart_e2e_requests_total{{marker="{marker}"}}'})
        s, b = get(f"{query}/api/v1/query?{pq}", h)
        res = json.loads(b)["data"]["result"] if s == 200 else []
        return res and res[0]["value"][1]

    found_logs = wait_until("the log line through the Loki API", logs)
    wait_until("the span through the Tempo API", trace)
    value = wait_until("the counter through the Prometheus API", metric)
    # Another tenant sees none of it.
    s, b = get(f"{query}/loki/api/v1/query_range?{q}", {"X-Scope-OrgID": "someone-else"})
    other = [v for r in json.loads(b)["data"]["result"] for v in r["values"]] if s == 200 else None
    return {"logs": found_logs, "metric_value": value, "other_tenant_logs": other, "other_tenant_status": s}


def main():
    global CA_FILE, AUTH
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    CA_FILE = plan["checks"].get("ca")
    AUTH = plan["checks"].get("auth", {})
    setup_namespace(plan["hosts"])
    report = {"ok": False, "ready": [], "steps": []}
    procs = []

    def spawn(name, argv, env, cwd=None):
        out = open(os.path.join(os.environ["NETNS_DIR"], f"{name}.log"), "w")
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        procs.append((name, p))
        return p

    try:
        moto = plan["moto"]
        spawn("moto", [moto["bin"], "-H", moto["ip"], "-p", str(moto["port"])], dict(os.environ))
        wait_until("moto", lambda: get(f"http://{moto['ip']}:{moto['port']}/")[0] < 500)
        req = urllib.request.Request(f"http://{moto['ip']}:{moto['port']}/{moto['bucket']}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()
        report["steps"].append("moto bucket created")

        for p in plan["pods"]:
            os.makedirs(p["dir"], exist_ok=True)
            spawn(p["name"], [plan["mira"]] + p["argv"], p["env"], cwd=p["dir"])
        for p in plan["pods"]:
            def ready(p=p):
                for name, proc in procs:
                    if name == p["name"] and proc.poll() is not None:
                        raise AssertionError(f"{p['name']} exited with {proc.returncode}")
                return get(p["ready"], verify=False)[0] == 200
            wait_until(f"{p['name']} ready at {p['ready']}", ready)
            report["ready"].append(p["name"])

        c = plan["checks"]
        trace_id = otel_export(c["otlp"], c["tenant"], c["marker"])
        report["steps"].append("OTLP export sent to the ingester Service")
        report["read_back"] = read_back(c["query"], c["tenant"], c["marker"], trace_id)
        report["steps"].append("read back through the querier Service")

        smoke = subprocess.run([plan["mira"]] + c["smoke_argv"], env=c["smoke_env"], capture_output=True, text=True,
                               timeout=150)
        report["smoke"] = {"code": smoke.returncode, "stdout": smoke.stdout, "stderr": smoke.stderr[-2000:]}
        assert smoke.returncode == 0, f"helm test hook command failed: {smoke.stderr[-2000:]}"
        report["steps"].append("helm test hook command passed")

        # An orderly stop, as Kubernetes does it: SIGTERM; the ingesters
        # seal and publish their open blocks before exiting.
        for name, proc in reversed(procs):
            if name.startswith("mira-ingester"):
                proc.send_signal(signal.SIGTERM)
                report.setdefault("ingester_exit", {})[name] = proc.wait(timeout=120)
        # Now only the published blocks in S3 (moto) hold the rows.
        report["after_publish"] = read_back(c["query"], c["tenant"], c["marker"], trace_id)
        report["steps"].append("read back from the object store after the ingesters stopped")
        report["ok"] = True
    except Exception as e:  # the report says what failed; the exit code fails the test
        report["error"] = f"{type(e).__name__}: {e}"
        report["logs"] = {}
        for name, _ in procs:
            try:
                with open(os.path.join(os.environ["NETNS_DIR"], f"{name}.log")) as f:
                    report["logs"][name] = f.read()[-3000:]
            except OSError:
                pass
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(json.dumps(report))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
