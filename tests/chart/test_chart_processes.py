"""The distributed render brought up as real processes: three catalog
members, two ingesters, a querier and a compactor, with moto as S3, in a
private network namespace. argv, env and ports come from the rendered
YAML with only these rewrites:
- Service and pod DNS names resolve to loopback addresses (an /etc/hosts
  of the namespace's own), one address per pod; a ClusterIP Service
  resolves to its first pod's;
- a pod's 0.0.0.0 listen address becomes the pod's own address (every pod
  shares the namespace's loopback instead of having a network of its own);
- volumes (/data) become temporary directories;
- downward-API values and envFrom Secrets are what Kubernetes would set
  (pod name, namespace, pod-index label; the test's S3 keys).
Then an OTLP export from the OpenTelemetry SDK goes to the ingester
Service and comes back out of the querier Service's port, and the helm
test hook's command runs against the same Services."""

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from chart import (MIRA, NAMESPACE, RELEASE, SECURE_TOKEN, command_line, find, mounted_secrets, pod_env, pod_names,
                   pod_spec, render, rewrite_mounts, secure_secrets, workloads, write_mounts)

DOMAIN = f"{NAMESPACE}.svc.cluster.local"
MOTO_HOST = f"moto.storage.svc.cluster.local"
SECRET = {"mira-s3": {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}}

VALUES = {
    "mode": "distributed",
    "objectStore": {"type": "s3", "s3": {"bucket": "mira-blocks", "prefix": "e2e", "endpoint": f"http://{MOTO_HOST}:5000",
                                         "region": "us-east-1", "allowHttp": True, "forcePathStyle": True,
                                         "existingSecret": "mira-s3"}},
    "catalog": {"replicas": 3},
    "ingester": {"replicas": 2, "extraArgs": {"shards": 2}},
    "querier": {"replicas": 1},
    "compactor": {"replicas": 1},
    # `mira operator` needs a Kubernetes API server, which cannot run here.
    "operator": {"enabled": False},
    "test": {"tenant": "helm-test", "timeoutSeconds": 90},
}
# The same with tokens, TLS on every port (a certificate of the test's CA
# for the Service and pod names), an existing cluster secret and limits.
SECURE = dict(VALUES, security={"clusterSecret": {"existingSecret": "mira-cluster-secret", "key": "secret"},
                                "auth": {"mode": "tokens", "tokensSecret": "mira-tokens"},
                                "tls": {"enabled": True, "secretName": "mira-tls"}},
              test=dict(VALUES["test"], tokenSecret="mira-smoke-token"),
              # A limits file every ingester and querier loads (generous:
              # the test's own traffic stays under it).
              limits={"defaults": {"ingest_records_per_second": 100000, "max_query_range": "721h"},
                      "tenants": {"chart-e2e": {"max_series": 1000}}})


def _rewrite(arg, ip, data_dir):
    arg = arg.replace("0.0.0.0:", f"{ip}:")
    if arg.startswith("--data-dir=/data") or arg.startswith("--cache-dir=/data"):
        flag, path = arg.split("=", 1)
        arg = f"{flag}={data_dir}{path[len('/data'):]}"
    assert "/data" not in arg, f"a path under /data the test does not map: {arg}"
    return arg


def _plan(objs, tmp, secure):
    addrs = (str(ipaddress.ip_address("127.0.1.1") + i) for i in range(200))
    hosts, pods, first_ip = [], [], {}
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    for w in workloads(objs):
        spec = pod_spec(w)
        ports = {p["name"]: p["containerPort"] for p in spec["containers"][0]["ports"]}
        probe = spec["containers"][0]["readinessProbe"]["httpGet"]
        for pod, ordinal in pod_names(w):
            ip = next(addrs)
            first_ip.setdefault(w["metadata"]["name"], ip)
            if w["kind"] == "StatefulSet":
                hosts.append([ip, f"{pod}.{w['spec']['serviceName']}.{DOMAIN}"])
            env = pod_env(w, pod, secrets=SECRET, ordinal=ordinal)
            data = os.path.join(tmp, pod)
            dirs = write_mounts(mounted_secrets(objs, w, secure_secrets()), os.path.join(tmp, "mounts", pod))
            argv = [_rewrite(rewrite_mounts(a, dirs), ip, data) for a in command_line(w, pod, env)]
            pods.append({"name": pod, "argv": argv, "env": dict(env, PATH=os.environ.get("PATH", "/usr/bin:/bin"),
                                                                   MIRA_LOG="info,openraft=warn"),
                         "dir": data,
                         "ready": f"{probe['scheme'].lower()}://{ip}:{ports[probe['port']]}{probe['path']}"})
    # A ClusterIP Service resolves to one of its pods (the first).
    for name, svc in services.items():
        if svc["spec"].get("clusterIP") == "None":
            continue
        owner = next(w for w in workloads(objs)
                     if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items()))
        hosts.append([first_ip[owner["metadata"]["name"]], f"{name}.{DOMAIN}"])
    moto_ip = next(addrs)
    hosts.append([moto_ip, MOTO_HOST])
    (hook,) = find(objs, "Pod")
    hook_dirs = write_mounts(mounted_secrets(objs, hook, secure_secrets()), os.path.join(tmp, "mounts", "hook"))
    hook_argv = [rewrite_mounts(a, hook_dirs) for a in hook["spec"]["containers"][0]["args"]]
    scheme = "https" if secure else "http"
    security = {}
    if secure:
        ca = os.path.join(tmp, "ca.crt")
        with open(ca, "wb") as f:
            f.write(secure_secrets()["mira-tls"]["ca.crt"])
        security = {"ca": ca, "auth": {"Authorization": f"Bearer {SECURE_TOKEN}"}}
    return {
        "mira": MIRA,
        "hosts": hosts,
        "pods": pods,
        "moto": {"bin": os.path.join(os.path.dirname(sys.executable), "moto_server"), "ip": moto_ip, "port": 5000,
                 "bucket": "mira-blocks"},
        "checks": {"otlp": f"{scheme}://{RELEASE}-ingester.{DOMAIN}:4318",
                   "query": f"{scheme}://{RELEASE}-querier.{DOMAIN}:3100",
                   "tenant": "chart-e2e", "marker": os.urandom(6).hex(), "smoke_argv": hook_argv,
                   "smoke_env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **security},
    }


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tokens-tls"])
def test_distributed_render_runs_and_answers_through_its_services(secure):
    objs = render(SECURE if secure else VALUES)
    tmp = tempfile.mkdtemp(prefix="mira-chart-e2e-")
    try:
        plan = _plan(objs, tmp, secure)
        roles = sorted({p["argv"][0] for p in plan["pods"]})
        assert roles == ["catalog", "compactor", "ingester", "querier"]
        assert sum(p["argv"][0] == "catalog" for p in plan["pods"]) == 3
        path = os.path.join(tmp, "plan.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_run.py")
        r = subprocess.run(["unshare", "--net", "--mount", "--", sys.executable, runner, path],
                           capture_output=True, text=True, timeout=280, env=dict(os.environ, NETNS_DIR=tmp))
        lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no report (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        report = json.loads(lines[-1])
        assert r.returncode == 0 and report["ok"], json.dumps(report, indent=1)[-12000:]
        assert sorted(report["ready"]) == sorted(p["name"] for p in plan["pods"])
        back = report["read_back"]
        assert len(back["logs"]) == 1 and plan["checks"]["marker"] in back["logs"][0]
        assert float(back["metric_value"]) == 3.0
        if secure:
            # The token grants chart-e2e and helm-test only: another tenant is refused.
            assert back["other_tenant_status"] == 403 and back["other_tenant_logs"] is None
        else:
            assert back["other_tenant_logs"] == []
        assert "ok: logs, traces and metrics written and read back" in report["smoke"]["stdout"]
        assert set(report["ingester_exit"].values()) == {0}
        assert report["after_publish"]["logs"] == back["logs"] and float(report["after_publish"]["metric_value"]) == 3.0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
