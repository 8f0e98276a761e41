//! The example objects in docs/examples/retention: every `good-*` maps to
//! catalog policies, every `invalid-*` (accepted by the CRD's schema) is
//! refused by the operator naming the field its `# refused:` line gives.
//! The `bad-*` files are refused by the schema itself (checked with a
//! JSON-schema validator in tests/e2e/test_crd_examples.py).

use std::path::PathBuf;

use mira_operator::MiraRetentionPolicy;
use mira_operator::policy::to_catalog;

fn examples(prefix: &str) -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/retention");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("the examples directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".yaml"))
        .map(|n| {
            let text = std::fs::read_to_string(dir.join(&n)).expect("read");
            (n, text)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {prefix}* examples");
    out
}

fn parse(name: &str, text: &str) -> MiraRetentionPolicy {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn good_examples_map_to_catalog_policies() {
    for (name, text) in examples("good-") {
        let obj = parse(&name, &text);
        let d = to_catalog(&obj).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(d.name.starts_with("k8s/"), "{name}");
        assert_eq!(d.offload.is_some(), obj.spec.offload.is_some(), "{name}");
    }
}

#[test]
fn invalid_examples_are_refused_naming_the_field() {
    for (name, text) in examples("invalid-") {
        let want = (text.lines())
            .find_map(|l| l.strip_prefix("# refused: "))
            .unwrap_or_else(|| panic!("{name}: no `# refused:` line"));
        let obj = parse(&name, &text);
        let e = to_catalog(&obj).expect_err(&name);
        assert_eq!(e.field, want, "{name}: {e}");
    }
}
