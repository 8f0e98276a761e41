"""The Helm chart under test, rendered offline with Helm's own Go library
(helm-python-sdk): the chart directory, the ci/ values files, rendering
into parsed objects, and the pods' command lines as Kubernetes would run
them."""

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
