//! The committed CRD is what the types generate (regenerate with
//! `MIRA_BLESS=1 cargo test -p mira-operator --test crd`, or
//! `mira crd > deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml`),
//! and its schema is structural: every node typed, conditions a map keyed
//! by `type`, nothing that keeps unknown fields, the print columns and
//! names `kubectl get mrp` relies on.

use std::path::PathBuf;

use serde_json::Value;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml")
}

fn generated() -> String {
    mira_operator::crd::crd_yaml().expect("render the CRD")
}

#[test]
fn the_committed_crd_is_what_the_types_generate() {
    let want = generated();
    let path = committed_path();
    if std::env::var_os("MIRA_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write the CRD");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from the generated CRD; run `mira crd > deploy/helm/mira/crds/miraretentionpolicies.mira.dev.yaml` \
         (or MIRA_BLESS=1 cargo test -p mira-operator --test crd) and commit it",
        path.display()
    );
}

fn crd() -> Value {
    let text = generated();
    serde_saphyr::from_str(&text).expect("the CRD parses as YAML")
}

/// Every schema node below `path` has a type (or is an int-or-string /
/// preserve-unknown node, which must not occur here).
fn check_typed(node: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else { return };
    if obj.contains_key("x-kubernetes-preserve-unknown-fields") {
        problems.push(format!("{path}: x-kubernetes-preserve-unknown-fields"));
    }
    if !obj.contains_key("type") {
        problems.push(format!("{path}: no type"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            check_typed(v, &format!("{path}.{k}"), problems);
        }
    }
    if let Some(items) = obj.get("items") {
        check_typed(items, &format!("{path}[]"), problems);
    }
    if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
        check_typed(extra, &format!("{path}{{}}"), problems);
    }
}

#[test]
fn the_schema_is_structural_with_conditions_as_a_map() {
    let crd = crd();
    assert_eq!(crd["metadata"]["name"], "miraretentionpolicies.mira.dev");
    let spec = &crd["spec"];
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["shortNames"], serde_json::json!(["mrp"]));
    assert_eq!(spec["names"]["categories"], serde_json::json!(["mira"]));
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut problems = Vec::new();
    check_typed(schema, "", &mut problems);
    assert!(problems.is_empty(), "not structural: {problems:?}");

    let s = &schema["properties"]["spec"];
    let required: Vec<&str> = (s["required"].as_array().expect("required"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["retain", "tenant"]);
    assert_eq!(
        s["properties"]["retain"]["pattern"],
        mira_operator::crd::DURATION_PATTERN
    );
    assert_eq!(s["properties"]["tenant"]["pattern"], mira_operator::crd::TENANT_PATTERN);
    assert_eq!(
        s["properties"]["offload"]["properties"]["target"]["pattern"],
        mira_operator::crd::TARGET_PATTERN
    );
    assert_eq!(s["properties"]["signals"]["x-kubernetes-list-type"], "set");
    assert_eq!(
        s["properties"]["signals"]["items"]["enum"],
        serde_json::json!(["logs", "traces", "metrics"])
    );
    let ops = &s["properties"]["resourceSelector"]["properties"]["matchExpressions"]["items"]["properties"]["operator"]
        ["enum"];
    assert_eq!(
        ops,
        &serde_json::json!([
            "In",
            "NotIn",
            "Exists",
            "DoesNotExist",
            "Equals",
            "NotEquals",
            "Matches",
            "NotMatches"
        ])
    );

    let conditions = &schema["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
    let cond_required = conditions["items"]["required"].as_array().expect("required");
    assert!(cond_required.contains(&Value::from("type")), "{cond_required:?}");
    for count in ["blocksDropped", "bytesDropped", "blocksOffloaded", "bytesOffloaded"] {
        assert_eq!(
            schema["properties"]["status"]["properties"][count]["format"], "int64",
            "{count}"
        );
    }

    let columns: Vec<&str> = (version["additionalPrinterColumns"].as_array().expect("columns"))
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Tenant",
            "Signals",
            "Retain",
            "Offload-After",
            "Ready",
            "Reason",
            "Dropped",
            "Offloaded",
            "Age"
        ]
    );
    assert_eq!(version["selectableFields"][0]["jsonPath"], ".spec.tenant");
}
