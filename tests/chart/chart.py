"""The Helm chart under test, rendered offline with Helm's own Go library
(helm-python-sdk): the chart directory, the ci/ values files, rendering
into parsed objects, and the pods' command lines as Kubernetes would run
them."""

import base64
import copy
import functools
import os
import re

import helm_python
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "deploy", "helm", "mira")
CI = os.path.join(CHART, "ci")
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
CRDS = os.path.join(CHART, "crds")
MIRA = os.environ.get("MIRA_BIN", os.path.join(ROOT, "target", "debug", "mira"))
RELEASE = "mira"
NAMESPACE = "obs"

VARIANTS = sorted(f[: -len("-values.yaml")] for f in os.listdir(CI) if f.endswith("-values.yaml"))

WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def values_of(variant):
    with open(os.path.join(CI, f"{variant}-values.yaml")) as f:
        return yaml.safe_load(f) or {}


@functools.lru_cache(maxsize=None)
def _chart():
    return helm_python.Chart.load(CHART)


def render_raw(values, name=RELEASE, namespace=NAMESPACE):
    """{template path: text} (NOTES.txt included)."""
    return _chart().render(copy.deepcopy(values), name=name, namespace=namespace, is_install=True)


def render(values, name=RELEASE, namespace=NAMESPACE):
    """Every rendered object (NOTES.txt left out), in template order."""
    out = []
    for path, text in sorted(render_raw(values, name, namespace).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("__template__", path)
                out.append(doc)
    return out


def strip(obj):
    """The object without the test's own bookkeeping key."""
    return {k: v for k, v in obj.items() if k != "__template__"}


def notes(values):
    return next(t for p, t in render_raw(values).items() if p.endswith("NOTES.txt"))


@functools.lru_cache(maxsize=None)
def rendered_variant(variant):
    return tuple(render(values_of(variant)))


def find(objs, kind, name=None):
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def one(objs, kind, name):
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}: {[o['metadata']['name'] for o in objs if o['kind'] == kind]}"
    return found[0]


def workloads(objs):
    return [o for o in objs if o["kind"] in WORKLOAD_KINDS]


def pod_spec(obj):
    if obj["kind"] == "Pod":
        return obj["spec"]
    return obj["spec"]["template"]["spec"]


def pod_labels(obj):
    if obj["kind"] == "Pod":
        return obj["metadata"].get("labels", {})
    return obj["spec"]["template"]["metadata"].get("labels", {})


def component(obj):
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(s, env):
    """Kubernetes' $(VAR) expansion of container args: a variable the
    container defines is replaced; $$ is a literal $; an unknown one stays."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = _VAR.match(s, i)
        if m and m.group(1) in env:
            out.append(env[m.group(1)])
            i = m.end()
            continue
        out.append(s[i])
        i += 1
    return "".join(out)


def pod_env(obj, pod_name, namespace=NAMESPACE, secrets=None, ordinal=0):
    """The container's environment as the kubelet would set it: literal
    values, the downward API fields the chart uses, and envFrom Secrets
    taken from `secrets` (name -> {key: value}); a missing Secret fails."""
    secrets = secrets or {}
    c = pod_spec(obj)["containers"][0]
    env = {}
    for ref in c.get("envFrom", []):
        name = ref["secretRef"]["name"] if "secretRef" in ref else ref["configMapRef"]["name"]
        assert name in secrets, f"{obj['metadata']['name']} reads Secret/ConfigMap {name!r}, which the test does not provide"
        env.update(secrets[name])
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": namespace,
        "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
    }
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"unexpected downward API field {path}"
            env[e["name"]] = fields[path]
        else:
            raise AssertionError(f"unexpected env source {e}")
    return env


def pod_names(obj):
    """The pods a workload makes, with their ordinals (a Deployment's
    replicas get made-up suffixes)."""
    name = obj["metadata"]["name"]
    n = obj["spec"].get("replicas", 1)
    if obj["kind"] == "StatefulSet":
        return [(f"{name}-{i}", i) for i in range(n)]
    return [(f"{name}-7c9f8d{i}-x{i}z", i) for i in range(n)]


def command_line(obj, pod_name, env):
    """`mira` argv as the container runs it (the image's entrypoint is mira)."""
    c = pod_spec(obj)["containers"][0]
    assert "command" not in c, "the chart relies on the image's entrypoint"
    return [expand(a, env) for a in c["args"]]


def mounted_secrets(objs, obj, provided=None):
    """{mountPath: {file name: bytes}} for every Secret and ConfigMap volume
    the pod's container mounts, as the kubelet would fill it: an object the
    render makes from its data, any other Secret from `provided` (name ->
    {key: bytes}); one from neither fails."""
    provided = provided or {}
    spec = pod_spec(obj)
    c = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    rendered = {("secret", o["metadata"]["name"]): {k: base64.b64decode(v) for k, v in o.get("data", {}).items()}
                for o in objs if o["kind"] == "Secret"}
    rendered.update({("configMap", o["metadata"]["name"]): {k: v.encode() for k, v in o.get("data", {}).items()}
                     for o in objs if o["kind"] == "ConfigMap"})
    out = {}
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"], {})  # absent: a volumeClaimTemplate
        kind = "secret" if "secret" in v else "configMap" if "configMap" in v else None
        if kind is None:
            continue
        name = v[kind]["secretName" if kind == "secret" else "name"]
        data = rendered.get((kind, name), provided.get(name) if kind == "secret" else None)
        assert data is not None, f"{obj['metadata']['name']} mounts {kind} {name!r}, which neither the render nor the test provides"
        if "items" in v[kind]:
            data = {i["path"]: data[i["key"]] for i in v[kind]["items"]}
        out[m["mountPath"]] = data
    return out


def write_mounts(mounts, root):
    """Writes each mounted Secret's files under `root`; returns {mountPath: directory}."""
    dirs = {}
    for i, (path, files) in enumerate(sorted(mounts.items())):
        d = os.path.join(root, f"mount{i}")
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        dirs[path] = d
    return dirs


def rewrite_mounts(s, dirs):
    """`s` with every mounted path moved to where write_mounts put it."""
    for path, d in dirs.items():
        s = s.replace(path.rstrip("/") + "/", d + "/")
    return s


# The Secrets ci/secure-values.yaml names, made by the test: a CA and a
# certificate for the release's Service and pod names, a tokens file whose
# one token may write and read SECURE_TENANT, that token for the helm test,
# and a cluster secret.
SECURE_TENANT = "helm-test"
SECURE_TOKEN = "chart-test-token-0d6f1b2c9e8a7f3d"


@functools.lru_cache(maxsize=None)
def secure_secrets(release=RELEASE, namespace=NAMESPACE):
    import hashlib
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    from certs import Ca

    ca = Ca("chart test CA")
    dom = f"{namespace}.svc.cluster.local"
    names = [f"{release}-ingester.{dom}", f"{release}-querier.{dom}", f"{release}.{dom}",
             f"*.{release}-catalog-headless.{dom}", f"*.{release}-ingester-headless.{dom}"]
    cert, key, _ = ca.leaf("mira", dns=names)
    digest = hashlib.sha256(SECURE_TOKEN.encode()).hexdigest()
    tokens = (f'[[token]]\nname = "chart-test"\nsha256 = "{digest}"\n'
              f'tenants = ["{SECURE_TENANT}", "chart-e2e"]\nscopes = ["write", "read"]\n')
    return {
        "mira-tls": {"tls.crt": cert, "tls.key": key, "ca.crt": ca.pem()},
        "mira-tokens": {"tokens.toml": tokens.encode()},
        "mira-smoke-token": {"token": SECURE_TOKEN.encode() + b"\n"},
        "mira-cluster-secret": {"secret": b"0123456789abcdef0123456789abcdef"},
    }
