"""The committed MiraRetentionPolicy CRD's schema, as a JSON-schema
validator reads it, accepts every docs/examples/retention/good-* and
invalid-* object (the operator refuses the latter; see
crates/operator/tests/examples.rs) and refuses every bad-* object at the
field its `# refused:` line names.

Kubernetes refuses unknown fields (kubectl's default server-side field
validation is Strict), so objects with `properties` get
`additionalProperties: false` here; `nullable: true` becomes a "null"
type."""

import copy
import pathlib

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml"
EXAMPLES = ROOT / "docs/examples/retention"


def strict(node):
    """The CRD schema as a draft 2020-12 schema that refuses unknown fields."""
    node = copy.deepcopy(node)
    if isinstance(node, dict):
        for k in list(node):
            if k.startswith("x-kubernetes-"):
                del node[k]
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        return {k: strict(v) for k, v in node.items()}
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def schema():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    s = strict(version["schema"]["openAPIV3Schema"])
    # What the API server adds to every object.
    s["properties"]["apiVersion"] = {"const": "mira.dev/v1alpha1"}
    s["properties"]["kind"] = {"const": "MiraRetentionPolicy"}
    s["properties"]["metadata"] = {"type": "object"}
    s["required"] = sorted(set(s.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def examples(prefix):
    found = sorted(EXAMPLES.glob(prefix + "*.yaml"))
    assert found, f"no {prefix}* examples"
    return found


def path_of(error):
    out = ""
    for p in error.absolute_path:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + p)
    return out


@pytest.mark.parametrize("path", examples("good-") + examples("invalid-"), ids=lambda p: p.name)
def test_schema_accepts(path):
    errors = list(schema().iter_errors(yaml.safe_load(path.read_text())))
    assert not errors, [f"{path_of(e)}: {e.message}" for e in errors]


@pytest.mark.parametrize("path", examples("bad-"), ids=lambda p: p.name)
def test_schema_refuses_naming_the_field(path):
    text = path.read_text()
    want = next(l.removeprefix("# refused: ") for l in text.splitlines() if l.startswith("# refused: "))
    errors = list(schema().iter_errors(yaml.safe_load(text)))
    assert errors, f"{path.name} was accepted"
    fields = set()
    for e in errors:
        p = path_of(e)
        if e.validator == "additionalProperties":
            # The unknown key is in the message, not the path.
            extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
            p = ".".join(x for x in [p] + extra if x)
        elif e.validator == "required":
            missing = [k for k in e.validator_value if k not in e.instance]
            p = ".".join(x for x in [p] + missing if x)
        fields.add(p)
    assert want in fields, f"{path.name}: wanted {want}, got {sorted(fields)}"
