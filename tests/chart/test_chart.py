"""The Helm chart (deploy/helm/mira), rendered offline by Helm's own Go
library (helm-python-sdk) for every values file in its ci/ directory:
lint, the values schema, strict Kubernetes schemas, golden renders,
references between objects, immutable fields, and each feature's
rendered shape. No cluster runs here (docs/operations.md#kubernetes says
what that leaves untested)."""

import base64
import copy
import difflib
import json
import os
import re

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from chart import (CHART, CI, CRDS, GOLDEN, NAMESPACE, RELEASE, VARIANTS, component, find, notes, one,
                   pod_labels, pod_spec, render, render_raw, rendered_variant, strip, values_of, workloads)

BAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad-values")
KUBE_SCHEMA_VERSIONS = ("1.34.0", "1.37.0")
# Kinds not in the Kubernetes schemas, checked against a schema of the
# fields the chart uses instead.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace", "labels"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "namespaceSelector": {"type": "object", "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                                      "additionalProperties": False},
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}, "additionalProperties": False},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["port"],
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string"}, "scrapeTimeout": {"type": "string"},
                                   "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"}}}},
            },
        },
    },
}


CERTIFICATE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": {"type": "object", "required": ["name", "namespace", "labels"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["secretName", "issuerRef", "dnsNames"],
            "properties": {
                "secretName": {"type": "string"},
                "duration": {"type": "string", "pattern": "^([0-9]+(h|m|s))+$"},
                "renewBefore": {"type": "string", "pattern": "^([0-9]+(h|m|s))+$"},
                "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                    "rotationPolicy": {"enum": ["Always", "Never"]}, "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                    "size": {"type": "integer"}}},
                "usages": {"type": "array", "items": {"enum": ["server auth", "client auth", "digital signature",
                                                               "key encipherment"]}},
                "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "ipAddresses": {"type": "array", "items": {"type": "string"}},
                "issuerRef": {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1}, "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                    "group": {"type": "string"}}},
            },
        },
    },
}


def bad_values_files():
    return sorted(f for f in os.listdir(BAD) if f.endswith(".yaml"))


# ---- lint and schema ------------------------------------------------------

@pytest.mark.parametrize("kube", ["v1.30.0", "v1.35.0"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_strict_has_no_warning_or_error(variant, kube):
    r = helm_python.lint(CHART, values_of(variant), strict=True, kube_version=kube)
    serious = [m for m in r["messages"] if m["severity"] >= 2]
    assert not serious and not r["errors"], serious or r["errors"]


@pytest.mark.parametrize("name", bad_values_files())
def test_bad_values_are_refused_with_a_message_naming_the_problem(name):
    with open(os.path.join(BAD, name)) as f:
        text = f.read()
    expected = re.match(r"# error: (.*)\n", text).group(1)
    values = yaml.safe_load(text)
    with pytest.raises(helm_python.HelmError) as e:
        render_raw(values)
    assert expected in str(e.value), f"{name}: {e.value}"
    if isinstance(e.value, helm_python.HelmValuesError):
        # Lint reports schema violations too (templates/validate.yaml's
        # checks only fail a render).
        r = helm_python.lint(CHART, values, strict=True, kube_version="v1.35.0")
        assert any(expected in m["error"] for m in r["messages"] if m["severity"] >= 2), r


def _keys(node, prefix=""):
    out = set()
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(prefix + k)
            out |= _keys(v, prefix + k + ".")
    return out


def _schema_keys(node, prefix=""):
    """(every declared key, the Mira-owned objects among them)."""
    keys, owned = set(), set()
    for k, v in node.get("properties", {}).items():
        keys.add(prefix + k)
        if v.get("additionalProperties") is False:
            owned.add(prefix + k)
            sub_keys, sub_owned = _schema_keys(v, prefix + k + ".")
            keys |= sub_keys
            owned |= sub_owned
    return keys, owned


def test_values_and_schema_declare_the_same_keys():
    with open(os.path.join(CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    # Only Mira-owned objects (additionalProperties: false) are compared
    # key by key; Kubernetes pass-through objects are free-form.
    declared, owned = _schema_keys(schema)
    in_values = {k for k in _keys(values) if "." not in k or k.rsplit(".", 1)[0] in owned}
    assert in_values - declared == set(), "in values.yaml but not in the schema"
    assert declared - _keys(values) == {"enabled"}, "in the schema but not in values.yaml (only the subchart `enabled` may be)"
    assert schema["properties"]["global"]["type"] == "object"


def test_values_file_stays_small():
    with open(os.path.join(CHART, "values.yaml")) as f:
        assert sum(1 for _ in f) < 600


# ---- Kubernetes schemas ---------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_strictly(variant):
    objs = rendered_variant(variant)
    assert objs
    for o in objs:
        doc = strip(o)
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
            continue
        if doc["kind"] == "Certificate":
            jsonschema.validate(doc, CERTIFICATE_SCHEMA)
            continue
        for version in KUBE_SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError as e:
                raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: no schema known ({e})")


def test_crds_in_the_chart_validate_strictly():
    files = sorted(f for f in os.listdir(CRDS) if f.endswith((".yaml", ".json"))) if os.path.isdir(CRDS) else []
    loaded = helm_python.Chart.load(CHART).crds
    assert len(loaded) == len(files)
    for f in files:
        with open(os.path.join(CRDS, f)) as fh:
            for doc in yaml.safe_load_all(fh):
                assert doc["kind"] == "CustomResourceDefinition"
                kubernetes_validate.validate(doc, KUBE_SCHEMA_VERSIONS[-1], strict=True)
                # The operator's RBAC names this group and plural.
                assert doc["spec"]["group"] == "mira.dev"
                assert doc["spec"]["names"]["plural"] == "miraretentionpolicies"


def test_a_bogus_field_is_caught_by_the_strict_validation():
    """The validation above is not vacuous: an unknown container field fails."""
    sts = copy.deepcopy(strip(one(rendered_variant("default"), "StatefulSet", RELEASE)))
    sts["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_SCHEMA_VERSIONS[-1], strict=True)


# ---- golden renders -------------------------------------------------------

_VOLATILE_LABELS = ("helm.sh/chart", "app.kubernetes.io/version")


def _golden_text(objs):
    """The render sorted by kind/namespace/name, without what changes with
    every release (chart and app version labels, image tags) or every render
    (a Secret the chart generates at random)."""
    def clean(node):
        if isinstance(node, dict) and node.get("kind") == "Secret" and \
                node.get("metadata", {}).get("annotations", {}).get("mira.dev/generated"):
            node = dict(node, data={k: "GENERATED" for k in node["data"]})
        if isinstance(node, dict):
            return {k: clean(v) for k, v in node.items() if k not in _VOLATILE_LABELS and k != "__template__"}
        if isinstance(node, list):
            return [clean(v) for v in node]
        if isinstance(node, str) and re.fullmatch(r"[^\s:]+:[0-9][^\s]*", node) and node.startswith("mira:"):
            return "mira:TAG"
        return node
    docs = sorted((clean(o) for o in objs),
                  key=lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    return "".join("---\n" + yaml.safe_dump(d, sort_keys=True, width=200) for d in docs)


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_render(variant):
    """Regenerate with: MIRA_BLESS=1 scripts/chart-golden.sh"""
    text = _golden_text(rendered_variant(variant))
    path = os.path.join(GOLDEN, f"{variant}.yaml")
    if os.environ.get("MIRA_BLESS") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    assert os.path.exists(path), f"no golden file {path}: run MIRA_BLESS=1 scripts/chart-golden.sh"
    with open(path) as f:
        want = f.read()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), "golden", "rendered", n=2))
        raise AssertionError(f"render differs from {path} (MIRA_BLESS=1 scripts/chart-golden.sh rewrites it):\n{diff[:6000]}")


# ---- references -----------------------------------------------------------

def _matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def _container_ports(obj):
    return {p["name"]: p["containerPort"] for c in pod_spec(obj)["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_service_selectors_match_pods_and_target_ports_exist(variant):
    objs = rendered_variant(variant)
    pods = workloads(objs)
    for svc in find(objs, "Service"):
        sel = svc["spec"]["selector"]
        targets = [w for w in pods if _matches(sel, pod_labels(w))]
        assert targets, f"Service {svc['metadata']['name']} selects no pod template"
        for w in targets:
            ports = _container_ports(w)
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in ports, f"{svc['metadata']['name']} port {p['name']} -> {p['targetPort']} not on {w['metadata']['name']}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_pdbs_hpas_and_service_monitors_point_at_rendered_objects(variant):
    objs = rendered_variant(variant)
    for pdb in find(objs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert [w for w in workloads(objs) if _matches(sel, pod_labels(w))], pdb["metadata"]["name"]
        assert "minAvailable" not in pdb["spec"] and pdb["spec"]["maxUnavailable"] == 1
    for hpa in find(objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        one(objs, ref["kind"], ref["name"])
    for sm in find(objs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        svcs = [s for s in find(objs, "Service") if _matches(sel, s["metadata"]["labels"])]
        assert len(svcs) == 1, f"ServiceMonitor {sm['metadata']['name']} selects {len(svcs)} Services"
        names = {p["name"] for p in svcs[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in names


def _declared_external(values):
    """Secrets and ConfigMaps the values name as pre-existing."""
    o = values.get("objectStore", {})
    out = set()
    for kind in ("s3", "gcs", "azure"):
        if o.get(kind, {}).get("existingSecret"):
            out.add(o[kind]["existingSecret"])
    out |= set(values.get("compactor", {}).get("offload", {}).get("secrets", []))
    sec = values.get("security", {})
    for name in (sec.get("clusterSecret", {}).get("existingSecret"), sec.get("auth", {}).get("tokensSecret"),
                 sec.get("tls", {}).get("secretName"), values.get("test", {}).get("tokenSecret")):
        if name:
            out.add(name)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_referenced_configmaps_secrets_claims_and_accounts_exist(variant):
    objs = rendered_variant(variant)
    values = values_of(variant)
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objs}
    # cert-manager makes the Secret of a Certificate.
    rendered |= {("Secret", c["spec"]["secretName"]) for c in find(objs, "Certificate")}
    external = _declared_external(values)
    for w in workloads(objs) + find(objs, "Pod"):
        spec = pod_spec(w)
        sa = spec.get("serviceAccountName", "default")
        assert sa == "default" or ("ServiceAccount", sa) in rendered, f"{w['metadata']['name']}: ServiceAccount {sa}"
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, f"{w['metadata']['name']}: mount {m['name']}"
            for ref in c.get("envFrom", []):
                name = (ref.get("secretRef") or ref.get("configMapRef"))["name"]
                assert name in external, f"{w['metadata']['name']}: envFrom {name} is neither rendered nor declared"
        for v in volumes.values():
            if "secret" in v:
                assert v["secret"]["secretName"] in external or ("Secret", v["secret"]["secretName"]) in rendered
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in rendered
            if "persistentVolumeClaim" in v:
                raise AssertionError("pods use volumeClaimTemplates, not named claims")
        probe_ports = _container_ports(w)
        for c in spec["containers"]:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in probe_ports


# ---- labels and immutable fields ------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_labelled_and_selectors_carry_no_version(variant):
    for o in rendered_variant(variant):
        labels = o["metadata"]["labels"]
        for k in ("name", "instance", "component", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{k}" in labels, (o["kind"], o["metadata"]["name"], k)
        if o["kind"] in ("Deployment", "StatefulSet"):
            sel = o["spec"]["selector"]["matchLabels"]
            assert set(sel) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}


def _immutable(objs):
    out = {}
    for o in objs:
        if o["kind"] == "StatefulSet":
            s = o["spec"]
            out[o["metadata"]["name"]] = json.dumps([s["selector"], s["serviceName"], s.get("volumeClaimTemplates"),
                                                     s["podManagementPolicy"]], sort_keys=True)
        elif o["kind"] == "Deployment":
            out[o["metadata"]["name"]] = json.dumps(o["spec"]["selector"], sort_keys=True)
    return out


def test_immutable_fields_do_not_change_with_the_chart_or_image_version(tmp_path):
    """A new chart version must not change what a StatefulSet cannot
    change in place (loki#23912): selectors, serviceName, claim templates."""
    import shutil
    values = values_of("distributed")
    before = _immutable(render(values))
    copy_dir = tmp_path / "mira"
    shutil.copytree(CHART, copy_dir)
    chart_yaml = copy_dir / "Chart.yaml"
    text = chart_yaml.read_text().replace("version: 0.1.0", "version: 9.8.7").replace('appVersion: "0.1.0"', 'appVersion: "9.9.9"')
    chart_yaml.write_text(text)
    newer = helm_python.Chart.load(str(copy_dir)).render(dict(values, image={"tag": "other"}), name=RELEASE, namespace=NAMESPACE,
                                                         is_install=True)
    after = _immutable([d for p, t in newer.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d])
    assert "9.8.7" in json.dumps(newer) and before and before == after


# ---- modes, PDBs, HPA -----------------------------------------------------

def test_single_mode_renders_only_serve_and_distributed_no_serve():
    single = rendered_variant("default")
    comps = {component(o) for o in workloads(single)}
    assert comps == {"single", "operator"}
    sts = one(single, "StatefulSet", RELEASE)
    args = pod_spec(sts)["containers"][0]["args"]
    assert args[0] == "serve" and "--catalog-listen=0.0.0.0:7400" in args
    dist = rendered_variant("distributed")
    assert {component(o) for o in workloads(dist)} == {"catalog", "ingester", "querier", "compactor", "operator"}
    assert all(pod_spec(w)["containers"][0]["args"][0] != "serve" for w in workloads(dist))


@pytest.mark.parametrize("variant", VARIANTS)
def test_pdbs_only_over_more_than_one_replica(variant):
    objs = rendered_variant(variant)
    covered = set()
    for pdb in find(objs, "PodDisruptionBudget"):
        covered.add(pdb["metadata"]["labels"]["app.kubernetes.io/component"])
    for w in workloads(objs):
        hpa = find(objs, "HorizontalPodAutoscaler", w["metadata"]["name"])
        n = hpa[0]["spec"]["minReplicas"] if hpa else w["spec"]["replicas"]
        assert (component(w) in covered) == (n > 1), (w["metadata"]["name"], n)


def test_querier_hpa_owns_the_replica_count():
    objs = rendered_variant("ha-hpa")
    dep = one(objs, "Deployment", f"{RELEASE}-querier")
    assert "replicas" not in dep["spec"]
    hpa = one(objs, "HorizontalPodAutoscaler", f"{RELEASE}-querier")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert one(rendered_variant("distributed"), "Deployment", f"{RELEASE}-querier")["spec"]["replicas"] == 2


def test_querier_cache_size_is_ninety_percent_of_its_volume():
    dist = rendered_variant("distributed")
    args = pod_spec(one(dist, "Deployment", f"{RELEASE}-querier"))["containers"][0]["args"]
    assert "--cache-size=9216MiB" in args
    vol = {v["name"]: v for v in pod_spec(one(dist, "Deployment", f"{RELEASE}-querier"))["volumes"]}["cache"]
    assert vol["emptyDir"]["sizeLimit"] == "10Gi"
    ha = rendered_variant("ha-hpa")
    spec = pod_spec(one(ha, "Deployment", f"{RELEASE}-querier"))
    assert "--cache-size=46080MiB" in spec["containers"][0]["args"]
    vol = {v["name"]: v for v in spec["volumes"]}["cache"]
    assert vol["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "fast-ssd"


# ---- catalog and ingester -------------------------------------------------

def _env(c):
    return {e["name"]: e for e in c.get("env", [])}


@pytest.mark.parametrize("variant,members", [("distributed", 3), ("ha-hpa", 5), ("minimal", 1)])
def test_catalog_statefulset(variant, members):
    objs = rendered_variant(variant)
    sts = one(objs, "StatefulSet", f"{RELEASE}-catalog")
    assert sts["spec"]["replicas"] == members and sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = one(objs, "Service", f"{RELEASE}-catalog-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    c = pod_spec(sts)["containers"][0]
    peers = next(a for a in c["args"] if a.startswith("--peers=")).split("=", 1)[1].split(",")
    assert peers == [f"{i}={RELEASE}-catalog-{i}.{RELEASE}-catalog-headless.{NAMESPACE}.svc.cluster.local:7400"
                     for i in range(members)]
    assert _env(c)["MIRA_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert f"--cluster-id={NAMESPACE}/{RELEASE}" in c["args"]
    pdbs = find(objs, "PodDisruptionBudget", f"{RELEASE}-catalog")
    assert len(pdbs) == (1 if members > 1 else 0)


def test_ingester_statefulset():
    objs = rendered_variant("distributed")
    sts = one(objs, "StatefulSet", f"{RELEASE}-ingester")
    spec = pod_spec(sts)
    assert spec["terminationGracePeriodSeconds"] >= 300
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["wal"]
    args = spec["containers"][0]["args"]
    assert "--ingester-id=$(POD_NAME)" in args
    assert f"--advertise=$(POD_NAME).{RELEASE}-ingester-headless.$(POD_NAMESPACE).svc.cluster.local:4317" in args
    assert one(objs, "Service", f"{RELEASE}-ingester-headless")["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_object_store_flags_and_credentials():
    s3 = pod_spec(one(rendered_variant("single-s3"), "StatefulSet", RELEASE))["containers"][0]
    assert "--object-store=s3://mira-blocks/single" in s3["args"]
    assert ("--object-store-option=aws_allow_http=true,aws_endpoint=http://minio.storage.svc:9000,"
            "aws_region=us-east-1,aws_virtual_hosted_style_request=false") in s3["args"]
    assert s3["envFrom"] == [{"secretRef": {"name": "mira-s3"}}]
    gcs = pod_spec(one(rendered_variant("ha-hpa"), "StatefulSet", f"{RELEASE}-ingester"))["containers"][0]
    assert "--object-store=gs://mira-blocks/prod" in gcs["args"] and "envFrom" not in gcs
    az = pod_spec(one(rendered_variant("grafana"), "Deployment", f"{RELEASE}-querier"))["containers"][0]
    assert "--object-store=az://mira" in az["args"]
    assert "--object-store-option=azure_storage_account_name=miraaccount" in az["args"]
    assert az["envFrom"] == [{"secretRef": {"name": "mira-azure"}}]
    # A GCS key file from an existing Secret is mounted and named.
    objs = render({"mode": "distributed", "objectStore": {"type": "gcs", "gcs": {"bucket": "b", "existingSecret": "gcs-key"}}})
    spec = pod_spec(one(objs, "Deployment", f"{RELEASE}-compactor"))
    assert "--object-store-option=google_service_account=/etc/mira/gcs/key.json" in spec["containers"][0]["args"]
    assert {"name": "gcs-credentials", "secret": {"secretName": "gcs-key"}} in spec["volumes"]
    fs = pod_spec(one(rendered_variant("default"), "StatefulSet", RELEASE))["containers"][0]
    assert not [a for a in fs["args"] if a.startswith("--object-store")]


def test_extra_args_render_as_flags():
    args = pod_spec(one(rendered_variant("ha-hpa"), "StatefulSet", f"{RELEASE}-ingester"))["containers"][0]["args"]
    assert "--seal-size=64MiB" in args and "--shards=4" in args and "--wal=fsync" in args
    objs = render({"single": {"extraArgs": {"require-tenant": True, "no-compactor": False, "seal-age": None}}})
    args = pod_spec(one(objs, "StatefulSet", RELEASE))["containers"][0]["args"]
    assert "--require-tenant" in args
    assert not [a for a in args if "no-compactor" in a or "seal-age" in a]


@pytest.mark.parametrize("variant", VARIANTS)
def test_defaults_reach_every_workload(variant):
    values = copy.deepcopy(values_of(variant))
    d = values.setdefault("defaults", {})
    d.setdefault("podAnnotations", {})["probe.example/a"] = "1"
    d.setdefault("extraEnv", []).append({"name": "PROBE_ENV", "value": "x"})
    d["extraVolumes"] = [{"name": "probe-vol", "emptyDir": {}}]
    d["extraVolumeMounts"] = [{"name": "probe-vol", "mountPath": "/probe"}]
    d["nodeSelector"] = {"probe": "yes"}
    d["priorityClassName"] = "probe-priority"
    objs = render(values)
    assert workloads(objs)
    for w in workloads(objs):
        spec = pod_spec(w)
        c = spec["containers"][0]
        assert w["spec"]["template"]["metadata"]["annotations"]["probe.example/a"] == "1", w["metadata"]["name"]
        assert "PROBE_ENV" in _env(c) and {"name": "probe-vol", "mountPath": "/probe"} in c["volumeMounts"]
        assert spec["nodeSelector"] == {"probe": "yes"} and spec["priorityClassName"] == "probe-priority"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("variant", VARIANTS)
def test_topology_spread_is_soft_unless_configured(variant):
    spread = values_of(variant).get("defaults", {}).get("topologySpreadConstraints", "soft")
    for w in workloads(rendered_variant(variant)):
        tsc = pod_spec(w).get("topologySpreadConstraints")
        if spread == "soft":
            assert {t["whenUnsatisfiable"] for t in tsc} == {"ScheduleAnyway"}
            for t in tsc:
                assert t["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == component(w)
        elif spread == "none":
            assert tsc is None
        else:
            assert tsc == spread
        assert "podAntiAffinity" not in (pod_spec(w).get("affinity") or {})


# ---- NetworkPolicies ------------------------------------------------------

def test_network_policies_guard_the_internal_ports_in_distributed_mode():
    objs = rendered_variant("distributed")
    pols = {p["metadata"]["name"]: p for p in find(objs, "NetworkPolicy")}
    assert set(pols) == {f"{RELEASE}-catalog", f"{RELEASE}-ingester"}
    cat = pols[f"{RELEASE}-catalog"]["spec"]
    assert cat["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mira",
                                                                         "app.kubernetes.io/instance": RELEASE}}}],
                               "ports": [{"port": 7400, "protocol": "TCP"}]}]
    # Every Mira pod that talks to the catalog matches the peer selector.
    peer = cat["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for w in workloads(objs) + find(objs, "Pod"):
        assert _matches(peer, pod_labels(w))
    assert not find(rendered_variant("default"), "NetworkPolicy")
    assert not find(rendered_variant("minimal"), "NetworkPolicy")
    single = render({"networkPolicy": {"enabled": True}})
    assert [p["metadata"]["name"] for p in find(single, "NetworkPolicy")] == [RELEASE + "-single"]


def test_otlp_sources_can_be_limited():
    objs = render(dict(values_of("distributed"), networkPolicy={"otlpFrom": [{"namespaceSelector": {"matchLabels": {"otel": "yes"}}}]}))
    ing = one(objs, "NetworkPolicy", f"{RELEASE}-ingester")["spec"]["ingress"]
    assert ing[0]["from"][1] == {"namespaceSelector": {"matchLabels": {"otel": "yes"}}}
    assert [p["port"] for p in ing[0]["ports"]] == [4317, 4318]


# ---- Grafana datasources --------------------------------------------------

def _datasources(objs):
    cm = one(objs, "ConfigMap", f"{RELEASE}-grafana-datasources")
    text = cm["data"]["mira-datasources.yaml"]
    return cm, text, {d["type"]: d for d in yaml.safe_load(text)["datasources"]}


def test_grafana_datasources_configmap():
    objs = rendered_variant("grafana")
    cm, text, ds = _datasources(objs)
    assert cm["metadata"]["labels"]["grafana_datasource"] == "1" and cm["metadata"]["namespace"] == "monitoring"
    assert set(ds) == {"loki", "tempo", "prometheus"}
    url = f"http://{RELEASE}-querier.{NAMESPACE}.svc.cluster.local:3100"
    assert {d["url"] for d in ds.values()} == {url}
    loki, tempo, prom = ds["loki"], ds["tempo"], ds["prometheus"]
    assert loki["jsonData"]["derivedFields"][0]["datasourceUid"] == tempo["uid"]
    assert tempo["jsonData"]["tracesToLogsV2"]["datasourceUid"] == loki["uid"]
    assert tempo["jsonData"]["tracesToMetrics"]["datasourceUid"] == prom["uid"]
    assert tempo["jsonData"]["streamingEnabled"] == {"search": False, "metrics": False}
    assert prom["jsonData"]["httpMethod"] == "POST"
    # Grafana expands ${...} in provisioning files: every variable is $${...}.
    assert loki["jsonData"]["derivedFields"][0]["url"] == "$${__value.raw}"
    assert "$${__span.traceId}" in tempo["jsonData"]["tracesToLogsV2"]["query"]
    assert not re.search(r"(?<!\$)\$\{", text), "an unescaped ${ would be expanded by Grafana"
    for d in ds.values():
        assert d["jsonData"]["httpHeaderName1"] == "X-Scope-OrgID"
        assert d["secureJsonData"]["httpHeaderValue1"] == "team-a"


def test_grafana_datasources_without_tenant_send_no_header_and_point_at_serve():
    objs = render({"grafana": {"datasources": {"enabled": True}}})
    cm, text, ds = _datasources(objs)
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert "X-Scope-OrgID" not in text and "secureJsonData" not in text
    assert ds["loki"]["url"] == f"http://{RELEASE}.{NAMESPACE}.svc.cluster.local:3100"
    assert not find(rendered_variant("default"), "ConfigMap")


# ---- NOTES, RBAC, hooks ---------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_notes_name_the_endpoints_and_the_crd_step(variant):
    values = values_of(variant)
    text = notes(values)
    otlp = f"{RELEASE}-ingester" if values.get("mode") == "distributed" else RELEASE
    query = f"{RELEASE}-querier" if values.get("mode") == "distributed" else RELEASE
    sec = values.get("security", {})
    scheme = "https" if sec.get("tls", {}).get("enabled") else "http"
    assert f"{scheme}://{otlp}.{NAMESPACE}.svc.cluster.local:4318" in text
    assert f"{otlp}.{NAMESPACE}.svc.cluster.local:4317" in text
    assert f"{scheme}://{query}.{NAMESPACE}.svc.cluster.local:3100" in text
    mode = sec.get("auth", {}).get("mode", "none")
    assert f"Authentication: {mode}" in text
    assert ("Bearer <a token" in text) == (mode == "tokens")
    assert "kubectl apply --server-side -f deploy/helm/mira/crds/" in text
    assert f"helm test {RELEASE}" in text


def test_operator_rbac_is_exactly_what_it_needs():
    objs = rendered_variant("distributed")
    role = one(objs, "ClusterRole", f"{NAMESPACE}-{RELEASE}-operator")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): (tuple(r["verbs"]), r.get("resourceNames")) for r in role["rules"]}
    assert rules == {
        (("mira.dev",), ("miraretentionpolicies",)): (("get", "list", "watch", "patch"), None),
        (("mira.dev",), ("miraretentionpolicies/status",)): (("get", "patch", "update"), None),
        (("mira.dev",), ("miraretentionpolicies/finalizers",)): (("update",), None),
        (("events.k8s.io",), ("events",)): (("create", "patch"), None),
        # The mira.dev/tenants annotation: which tenants a namespace may govern.
        (("",), ("namespaces",)): (("get", "list", "watch"), None),
    }
    lease = one(objs, "Role", f"{RELEASE}-operator-lease")["rules"]
    assert lease == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{RELEASE}-operator"],
         "verbs": ["get", "update"]},
    ]
    binding = one(objs, "ClusterRoleBinding", f"{NAMESPACE}-{RELEASE}-operator")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}]
    dep = one(objs, "Deployment", f"{RELEASE}-operator")
    assert pod_spec(dep)["serviceAccountName"] == f"{RELEASE}-operator"
    args = pod_spec(dep)["containers"][0]["args"]
    assert f"--lease-name={RELEASE}-operator" in args and "--identity=$(POD_NAME)" in args
    assert "--lease-namespace=$(POD_NAMESPACE)" in args and "--leader-elect=true" in args


def test_namespaced_operator_uses_a_role_and_may_read_the_offload_secrets():
    objs = rendered_variant("ha-hpa")
    # Cluster-wide only the watched Namespace itself (its mira.dev/tenants
    # annotation), by name.
    (cluster_role,) = find(objs, "ClusterRole")
    assert cluster_role["metadata"]["name"] == f"{NAMESPACE}-{RELEASE}-operator-namespace"
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["observability"], "verbs": ["get", "list", "watch"]},
    ]
    (cluster_binding,) = find(objs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-operator", "namespace": NAMESPACE}]
    role = one(objs, "Role", f"{RELEASE}-operator")
    assert role["metadata"]["namespace"] == "observability"
    lease = one(objs, "Role", f"{RELEASE}-operator-lease")["rules"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mira-archive"], "verbs": ["get"]} in lease
    args = pod_spec(one(objs, "Deployment", f"{RELEASE}-operator"))["containers"][0]["args"]
    assert "--namespace=observability" in args
    comp = pod_spec(one(objs, "Deployment", f"{RELEASE}-compactor"))
    assert {"name": "offload-mira-archive", "mountPath": "/etc/mira/offload/mira-archive", "readOnly": True} in comp["containers"][0]["volumeMounts"]
    assert "--offload-target=archive=gs://mira-archive/prod" in comp["containers"][0]["args"]


def test_operator_namespace_grants_render_as_flags_and_the_annotation_can_be_turned_off():
    values = dict(values_of("distributed"), operator={"namespaceTenants": {"team-b": ["team-b"], "team-a": ["team-a", "team-a-dev"]}})
    objs = render(values)
    args = pod_spec(one(objs, "Deployment", f"{RELEASE}-operator"))["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace-")] == [
        "--namespace-tenants=team-a=team-a,team-a-dev", "--namespace-tenants=team-b=team-b"]
    # Off: no Namespace access, and the operator is told.
    objs = render(dict(values_of("distributed"), operator={"namespaceAnnotation": False}))
    role = one(objs, "ClusterRole", f"{NAMESPACE}-{RELEASE}-operator")
    assert not [r for r in role["rules"] if "namespaces" in r["resources"]]
    args = pod_spec(one(objs, "Deployment", f"{RELEASE}-operator"))["containers"][0]["args"]
    assert "--namespace-annotation=false" in args
    # Watching only the release namespace: it governs everything, nothing to read.
    objs = render(dict(values_of("distributed"), operator={"watchNamespace": NAMESPACE}))
    assert not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding")


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_test_hook(variant):
    pods = find(rendered_variant(variant), "Pod")
    if values_of(variant).get("test", {}).get("enabled", True) is False:
        assert not pods
        return
    (pod,) = pods
    ann = pod["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "test"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    args = pod["spec"]["containers"][0]["args"]
    assert args[0] == "smoke"
    values = values_of(variant)
    dist = values.get("mode") == "distributed"
    tls = values.get("security", {}).get("tls", {}).get("enabled", False)
    scheme = "https" if tls else "http"
    assert f"--otlp={scheme}://{RELEASE}{'-ingester' if dist else ''}.{NAMESPACE}.svc.cluster.local:4318" in args
    assert f"--query={scheme}://{RELEASE}{'-querier' if dist else ''}.{NAMESPACE}.svc.cluster.local:3100" in args
    assert ("--ca=/etc/mira/tls/ca.crt" in args) == tls
    tokens = values.get("security", {}).get("auth", {}).get("mode") == "tokens"
    assert ("--token-file=/etc/mira/smoke/token" in args) == tokens


def test_extra_objects_are_rendered_through_tpl():
    objs = render({"extraObjects": [{"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "{{ .Release.Name }}-extra", "labels": {
                                         "app.kubernetes.io/name": "mira", "app.kubernetes.io/instance": "mira",
                                         "app.kubernetes.io/component": "extra", "app.kubernetes.io/managed-by": "Helm",
                                         "app.kubernetes.io/part-of": "mira"}}, "data": {"a": "b"}}]})
    assert one(objs, "ConfigMap", f"{RELEASE}-extra")["data"] == {"a": "b"}


# ---- security --------------------------------------------------------------

AUTH_ROLES = {"serve", "ingester", "querier", "compactor"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_role_has_the_cluster_secret_and_the_security_values_flags(variant):
    values = values_of(variant)
    sec = values.get("security", {})
    mode = sec.get("auth", {}).get("mode", "none")
    tls = sec.get("tls", {}).get("enabled", False)
    key = sec.get("clusterSecret", {}).get("key", "cluster-secret")
    objs = rendered_variant(variant)
    for w in workloads(objs):
        c = pod_spec(w)["containers"][0]
        args, role = c["args"], c["args"][0]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert f"--cluster-secret-file=/etc/mira/cluster/{key}" in args, w["metadata"]["name"]
        assert "/etc/mira/cluster" in mounts
        assert ("--tls-cert=/etc/mira/tls/tls.crt" in args) == tls
        assert ("/etc/mira/tls" in mounts) == tls
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["scheme"] == ("HTTPS" if tls else "HTTP")
        auth = [a for a in args if a.startswith("--auth")]
        if role in AUTH_ROLES and mode != "none":
            assert f"--auth={mode}" in auth
            assert ("/etc/mira/tokens" in mounts) == (mode == "tokens")
        else:
            assert auth == [], f"{w['metadata']['name']}: {auth}"
            assert "/etc/mira/tokens" not in mounts


def test_the_generated_cluster_secret_is_random_and_named_by_every_pod():
    def secret():
        (s,) = [o for o in render({}) if o["kind"] == "Secret"]
        return s
    a, b = secret(), secret()
    assert a["metadata"]["name"] == f"{RELEASE}-cluster"
    value = base64.b64decode(a["data"]["cluster-secret"])
    assert len(value) == 48 and value.isalnum()
    # Random per install (an upgrade reads the installed one back through
    # lookup, which needs a cluster: docs/operations.md).
    assert a["data"] != b["data"]
    sts = one(rendered_variant("default"), "StatefulSet", RELEASE)
    vols = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert vols["cluster-secret"]["secret"]["secretName"] == f"{RELEASE}-cluster"
    # An existing Secret: none is generated.
    objs = render({"security": {"clusterSecret": {"existingSecret": "mine"}}})
    assert not find(objs, "Secret")


def test_cert_manager_certificate_covers_every_name_clients_dial():
    objs = render({"mode": "distributed", "objectStore": {"type": "s3", "s3": {"bucket": "b"}},
                   "security": {"tls": {"enabled": True, "certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}}})
    (cert,) = find(objs, "Certificate")
    names = set(cert["spec"]["dnsNames"])
    dom = f"{NAMESPACE}.svc.cluster.local"
    for w in workloads(objs):
        for a in pod_spec(w)["containers"][0]["args"]:
            # Every host a role dials: catalog members and ingester pods
            # (one label under a headless Service), the Services.
            for flag in ("--catalog=", "--advertise="):
                if a.startswith(flag):
                    for ep in a[len(flag):].split(","):
                        host = ep.rsplit(":", 1)[0].replace("$(POD_NAME)", "x").replace("$(POD_NAMESPACE)", NAMESPACE)
                        assert host in names or "*." + host.split(".", 1)[1] in names, host
    for svc in (f"{RELEASE}-ingester", f"{RELEASE}-querier"):
        assert f"{svc}.{dom}" in names
    assert cert["spec"]["secretName"] == f"{RELEASE}-tls"


def test_limits_render_as_the_limits_file_of_the_roles_that_enforce_them():
    import tomllib
    values = values_of("secure")
    objs = rendered_variant("secure")
    cm = one(objs, "ConfigMap", f"{RELEASE}-limits")
    parsed = tomllib.loads(cm["data"]["limits.toml"])
    with open(os.path.join(CHART, "values.yaml")) as f:
        chart_defaults = yaml.safe_load(f)["limits"]["defaults"]
    want = dict(chart_defaults, **values["limits"]["defaults"])
    assert parsed == {"defaults": want, "tenants": values["limits"]["tenants"]}
    # Integers stay integers (the file refuses 5000.0 for a count).
    assert isinstance(parsed["tenants"]["helm-test"]["ingest_records_per_second"], int)
    for w in workloads(objs):
        c = pod_spec(w)["containers"][0]
        enforces = c["args"][0] in ("serve", "ingester", "querier")
        assert ("--limits-file=/etc/mira/limits/limits.toml" in c["args"]) == enforces, w["metadata"]["name"]
        assert any(m["name"] == "limits" for m in c["volumeMounts"]) == enforces
    # No limits values: no file, no flag.
    assert not find(rendered_variant("default"), "ConfigMap")
    assert not any("--limits-file" in a for w in workloads(rendered_variant("default"))
                   for a in pod_spec(w)["containers"][0]["args"])
