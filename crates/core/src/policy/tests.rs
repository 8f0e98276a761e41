use proptest::prelude::*;
use serde_json::json;

use super::resolve::{glob_match, precedence};
use super::*;

const R: PolicyKind = PolicyKind::Retention;
const O: PolicyKind = PolicyKind::Offload;

fn targets() -> Vec<String> {
    vec!["archive".to_owned(), "cold-1".to_owned()]
}

fn round_trip(kind: PolicyKind, tenant: &str, body: &str) -> PolicyBody {
    let t = targets();
    let b = validate(kind, "k8s/shop/checkout-short", tenant, body, Some(&t)).expect("valid body");
    let json = b.to_json();
    let again = validate(kind, "k8s/shop/checkout-short", tenant, &json, Some(&t)).expect("canonical body is valid");
    assert_eq!(again, b, "{json}");
    assert_eq!(again.to_json(), json, "canonical form is stable");
    b
}

#[test]
fn valid_bodies_round_trip() {
    let full = json!({"v": 1, "signals": ["traces", "logs"], "tenant_glob": "auditlogs-*",
        "selector": [
            {"key": "service.name", "op": "=", "value": "checkout"},
            {"key": "deployment.environment", "op": "in", "values": ["dev", "test"]},
            {"key": "k8s.namespace.name", "op": "!=", "value": "kube-system"},
            {"key": "host.name", "op": "=~", "value": "web-[0-9]+"},
            {"key": "team", "op": "!~", "value": "\"odd\\\\chars\u{e9}"},
            {"key": "tier", "op": "notin", "values": ["gold"]},
            {"key": "cloud.region", "op": "exists"},
            {"key": "debug", "op": "!exists"}],
        "priority": -10, "retain_s": 604800, "dry_run": true,
        "source": {"kind": "MiraRetentionPolicy", "namespace": "shop", "name": "checkout-short",
                   "uid": "0b6c4f1e", "generation": 3}});
    let b = round_trip(R, "", &full.to_string());
    assert_eq!(b.signals, vec![Signal::Logs, Signal::Traces], "signals are sorted");
    assert_eq!(b.selector.len(), 8);
    assert_eq!(b.selector[1].op(), SelectorOp::In);
    assert_eq!(b.selector[1].values(), ["dev", "test"]);
    assert_eq!(b.selector[3].value(), Some("web-[0-9]+"));
    assert_eq!((b.priority, b.retain_s, b.dry_run), (-10, Some(604_800), true));
    assert_eq!(b.source.as_ref().and_then(|s| s.generation), Some(3));

    let offload = json!({"v": 1, "after_s": 172800, "target": "archive",
        "selector": [{"key": "service.name", "op": "=", "value": ""}], "source": {"uid": "u"}});
    let b = round_trip(O, "acme", &offload.to_string());
    assert_eq!(
        (b.after_s, b.target.as_deref(), b.retain_s),
        (Some(172_800), Some("archive"), None)
    );

    // Minimal bodies, and `null` / `[]` read as absent; the canonical form
    // leaves defaults out, in the schema's field order.
    let minimal = round_trip(R, "acme", r#"{"retain_s": 3600, "v": 1}"#);
    assert_eq!(minimal.to_json(), r#"{"v":1,"retain_s":3600}"#);
    let nulls = r#"{"v":1,"retain_s":3600,"signals":[],"selector":[],"tenant_glob":null,"source":null,"priority":0}"#;
    assert_eq!(round_trip(R, "acme", nulls), minimal);
    let b = round_trip(
        O,
        "",
        r#"{"v":1,"target":"cold-1","after_s":3600,"priority":2,"signals":["metrics"]}"#,
    );
    assert_eq!(
        b.to_json(),
        r#"{"v":1,"signals":["metrics"],"priority":2,"after_s":3600,"target":"cold-1"}"#
    );
    assert_eq!(
        round_trip(R, "", &format!(r#"{{"v":1,"retain_s":{MAX_DURATION_S}}}"#)).retain_s,
        Some(MAX_DURATION_S)
    );

    // A body built in code serializes to what validation accepts.
    let built = PolicyBody {
        selector: vec![Matcher::new("env", SelectorOp::In, vec!["dev".into()]).expect("matcher")],
        retain_s: Some(7200),
        ..PolicyBody::default()
    };
    assert_eq!(round_trip(R, "", &built.to_json()), built);
    let bad = Matcher::new("env", SelectorOp::Eq, vec![]).expect_err("= needs one value");
    assert_eq!(bad.field, "selector");
}

#[test]
fn hostile_bodies_name_their_field() {
    let big_selector: Vec<Value> = (0..33)
        .map(|i| json!({"key": format!("k{i}"), "op": "exists"}))
        .collect();
    let big_selector = json!({"v": 1, "retain_s": 3600, "selector": big_selector}).to_string();
    let oversized = format!(
        r#"{{"v":1,"retain_s":3600,"source":{{"uid":"{}"}}}}"#,
        "x".repeat(MAX_BODY_BYTES)
    );
    let long_value = json!({"v": 1, "retain_s": 3600,
        "selector": [{"key": "a", "op": "=", "value": "x".repeat(MAX_TEXT_BYTES + 1)}]})
    .to_string();
    let many_values = json!({"v": 1, "retain_s": 3600,
        "selector": [{"key": "a", "op": "in", "values": vec!["x"; MAX_SET_VALUES + 1]}]})
    .to_string();
    let sel = |m: &str| format!(r#"{{"v":1,"retain_s":3600,"selector":[{{"key":"a","op":"exists"}},{m}]}}"#);
    let ret = |extra: &str| format!(r#"{{"v":1,"retain_s":3600{extra}}}"#);
    let off = |extra: &str| format!(r#"{{"v":1,"after_s":7200{extra}}}"#);
    let long_name = "n".repeat(MAX_NAME_BYTES + 1);
    // (kind, name, tenant, body, expected field)
    let cases: Vec<(PolicyKind, &str, &str, String, &str)> = vec![
        (R, "p", "", ret(r#","retain":3600"#), "retain"),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"=","value":"b","vaule":"c"}"#),
            "selector[1].vaule",
        ),
        (
            R,
            "p",
            "",
            ret(r#","source":{"kind":"K","generaton":3}"#),
            "source.generaton",
        ),
        (R, "p", "", r#"{"v":2,"retain_s":3600}"#.into(), "v"),
        (R, "p", "", r#"{"v":"1","retain_s":3600}"#.into(), "v"),
        (R, "p", "", r#"{"retain_s":3600}"#.into(), "v"),
        (R, "p", "", r#"{"v":1,"retain_s":-5}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":0}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":3599}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":"7d"}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":3600.0}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":1e20}"#.into(), "retain_s"),
        (
            R,
            "p",
            "",
            format!(r#"{{"v":1,"retain_s":{}}}"#, MAX_DURATION_S + 1),
            "retain_s",
        ),
        (R, "p", "", r#"{"v":1}"#.into(), "retain_s"),
        (R, "p", "", r#"{"v":1,"retain_s":null}"#.into(), "retain_s"),
        (O, "p", "", off(r#","target":"archive","retain_s":3600"#), "retain_s"),
        (R, "p", "", ret(r#","after_s":7200"#), "after_s"),
        (R, "p", "", ret(r#","target":"archive""#), "target"),
        (O, "p", "", r#"{"v":1,"target":"archive"}"#.into(), "after_s"),
        (
            O,
            "p",
            "",
            r#"{"v":1,"after_s":60,"target":"archive"}"#.into(),
            "after_s",
        ),
        (O, "p", "", off(""), "target"),
        (O, "p", "", off(r#","target":"Archive""#), "target"),
        (O, "p", "", off(r#","target":"-archive""#), "target"),
        (O, "p", "", off(&format!(r#","target":"{}""#, "a".repeat(64))), "target"),
        (O, "p", "", off(r#","target":"glacier""#), "target"),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"=~","value":"(unclosed"}"#),
            "selector[1].value",
        ),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"!~","value":"a)|(b"}"#),
            "selector[1].value",
        ),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"in","values":[]}"#),
            "selector[1].values",
        ),
        (R, "p", "", sel(r#"{"key":"a","op":"in"}"#), "selector[1].values"),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"in","value":"x","values":["x"]}"#),
            "selector[1].value",
        ),
        (R, "p", "", sel(r#"{"key":"a","op":"="}"#), "selector[1].value"),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"=","value":"x","values":["x"]}"#),
            "selector[1].values",
        ),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"exists","value":"x"}"#),
            "selector[1].value",
        ),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"=","value":5}"#),
            "selector[1].value",
        ),
        (
            R,
            "p",
            "",
            sel(r#"{"key":"a","op":"~=","value":"x"}"#),
            "selector[1].op",
        ),
        (R, "p", "", sel(r#"{"op":"exists"}"#), "selector[1].key"),
        (R, "p", "", sel(r#"{"key":"","op":"exists"}"#), "selector[1].key"),
        (R, "p", "", sel(r#""service.name=checkout""#), "selector[1]"),
        (R, "p", "", ret(r#","selector":{"key":"a","op":"exists"}"#), "selector"),
        (R, "p", "", big_selector, "selector"),
        (R, "p", "", long_value, "selector[0].value"),
        (R, "p", "", many_values, "selector[0].values"),
        (R, "p", "", oversized, "body"),
        (R, "p", "acme", ret(r#","tenant_glob":"auditlogs-*""#), "tenant_glob"),
        (R, "p", "", ret(r#","tenant_glob":"audit/logs""#), "tenant_glob"),
        (R, "p", "", ret(r#","tenant_glob":"""#), "tenant_glob"),
        (
            R,
            "p",
            "",
            ret(r#","signals":["logs","traces","events"]"#),
            "signals[2]",
        ),
        (R, "p", "", ret(r#","signals":["logs","logs"]"#), "signals[1]"),
        (R, "p", "", ret(r#","signals":"logs""#), "signals"),
        (
            R,
            "p",
            "",
            ret(&format!(r#","signals":[{}]"#, vec![r#""logs""#; 17].join(","))),
            "signals",
        ),
        (R, "p", "", ret(r#","priority":2147483648"#), "priority"),
        (R, "p", "", ret(r#","priority":"high""#), "priority"),
        (R, "p", "", ret(r#","dry_run":"yes""#), "dry_run"),
        (R, "p", "", ret(r#","source":{"generation":-1}"#), "source.generation"),
        (R, "p", "", ret(r#","source":{"uid":7}"#), "source.uid"),
        (R, "p", "", ret(r#","source":"k8s""#), "source"),
        (R, "", "", ret(""), "name"),
        (R, "bad name!", "", ret(""), "name"),
        (R, &long_name, "", ret(""), "name"),
        (R, "p", "ac/me", ret(""), "tenant"),
        (R, "p", "", "retain_s: 3600".into(), "body"),
        (R, "p", "", r#"[{"v":1,"retain_s":3600}]"#.into(), "body"),
        (R, "p", "", r#"{"v":1,"retain_s":3600,"retain_s":1}"#.into(), "body"),
        (R, "p", "", format!("{}1{}", "[".repeat(200), "]".repeat(200)), "body"),
    ];
    let t = targets();
    for (kind, name, tenant, body, field) in &cases {
        let e = validate(*kind, name, tenant, body, Some(&t)).expect_err(body);
        assert_eq!(e.field, *field, "{body}: {e}");
    }
    // Without a target list, any well-formed target name is accepted.
    assert!(validate(O, "p", "", &off(r#","target":"glacier""#), None).is_ok());
}

#[test]
fn errors_read_well() {
    let body = r#"{"v":1,"retain_s":3600,"selector":[{"key":"a","op":"exists"},{"key":"b","op":"~=","value":"x"}]}"#;
    let e = validate(R, "p", "", body, None).expect_err("unknown op");
    assert_eq!(
        e.to_string(),
        "policy field `selector[1].op`: unknown operator \"~=\" (expected one of =, !=, =~, !~, in, notin, exists, !exists)"
    );
    let t = targets();
    let e = validate(O, "p", "", r#"{"v":1,"after_s":3600,"target":"x"}"#, Some(&t)).expect_err("unknown target");
    assert_eq!(e.reason, "unknown offload target \"x\" (configured: archive, cold-1)");
    let e = validate(R, "p", "", r#"{"v":1,"retain_s":-5}"#, None).expect_err("negative");
    assert_eq!(e.reason, "expected a whole number of seconds, got -5");
    let e = validate(O, "p", "", r#"{"v":1,"after_s":3600,"target":"a","retain_s":9}"#, None).expect_err("kind");
    assert_eq!(
        e.to_string(),
        "policy field `retain_s`: not allowed in an offload policy"
    );
    assert!(crate::Error::from(e).is_invalid_input());
}

fn matcher(op: &str, operand: Value) -> Matcher {
    let mut m = json!({"key": "k", "op": op});
    if let (Some(o), Some(arity)) = (m.as_object_mut(), SelectorOp::parse(op).map(SelectorOp::arity)) {
        match arity {
            Arity::One => o.insert("value".into(), operand),
            Arity::Many => o.insert("values".into(), operand),
            Arity::None => None,
        };
    }
    let body = json!({"v": 1, "retain_s": 3600, "selector": [m]}).to_string();
    let mut b = validate(R, "p", "", &body, None).expect("valid matcher");
    b.selector.pop().expect("one matcher")
}

#[test]
fn matchers_follow_prometheus_on_absent_attributes() {
    // (op, operand, attribute value, matches)
    let cases = [
        ("=", json!("x"), Some("x"), true),
        ("=", json!("x"), None, false),
        ("=", json!(""), None, true),
        ("=", json!(""), Some(""), true),
        ("!=", json!("x"), None, true),
        ("!=", json!("x"), Some("x"), false),
        ("!=", json!(""), None, false),
        ("=~", json!(".*"), None, true),
        ("=~", json!(".+"), None, false),
        ("=~", json!("web-[0-9]+"), Some("web-12"), true),
        ("=~", json!("web"), Some("web-12"), false),
        ("=~", json!("a|b"), Some("ab"), false),
        ("!~", json!(".+"), None, true),
        ("!~", json!(".*"), None, false),
        ("!~", json!("web"), Some("web-1"), true),
        ("in", json!(["dev", "test"]), Some("dev"), true),
        ("in", json!(["dev", "test"]), Some("prod"), false),
        ("in", json!([""]), None, false),
        ("notin", json!(["dev"]), None, true),
        ("notin", json!(["dev"]), Some("dev"), false),
        ("notin", json!(["dev"]), Some("prod"), true),
        ("exists", Value::Null, Some(""), true),
        ("exists", Value::Null, None, false),
        ("!exists", Value::Null, None, true),
        ("!exists", Value::Null, Some("x"), false),
    ];
    for (op, operand, value, want) in cases {
        let m = matcher(op, operand.clone());
        assert_eq!(m.matches(value), want, "k {op} {operand} on {value:?}");
    }
}

#[test]
fn tenant_globs_match_whole_tenants() {
    for (glob, tenant, want) in [
        ("auditlogs-*", "auditlogs-eu", true),
        ("auditlogs-*", "auditlogs-", true),
        ("auditlogs-*", "x-auditlogs-eu", false),
        ("a?c", "abc", true),
        ("a?c", "ac", false),
        ("*-prod", "shop-prod", true),
        ("*-prod", "shop-prod-2", false),
        ("*a*b*", "xxaxxbxx", true),
        ("*a*b*", "xxbxxaxx", false),
        ("*", "", true),
        ("acme", "acme", true),
        ("acme", "acme2", false),
    ] {
        assert_eq!(glob_match(glob, tenant), want, "{glob} on {tenant}");
    }
}

/// A rule from a compact description: (kind, name, tenant, extra body
/// fields as JSON without braces).
fn rule(kind: PolicyKind, name: &str, tenant: &str, extra: &str) -> Rule {
    let duration = match kind {
        PolicyKind::Retention => r#""retain_s":3600"#,
        PolicyKind::Offload => r#""after_s":3600,"target":"archive""#,
    };
    let sep = if extra.is_empty() { "" } else { "," };
    Rule::parse(
        kind,
        name,
        tenant,
        &format!(r#"{{"v":1,{duration}{sep}{extra}}}"#),
        None,
    )
    .expect("valid rule")
}

fn sel(matchers: &str) -> String {
    format!(r#""selector":[{matchers}]"#)
}

/// A resolution case: tenant, signal, resource attributes, expected rule.
type Case<'a> = (&'a str, Signal, &'a [(&'a str, &'a str)], Option<&'a str>);

#[test]
fn resolution_follows_the_five_steps() {
    let svc = |v: &str| format!(r#"{{"key":"service.name","op":"=","value":"{v}"}}"#);
    let env = |v: &str| format!(r#"{{"key":"env","op":"=","value":"{v}"}}"#);
    let rules = vec![
        rule(R, "acme-checkout", "acme", &sel(&svc("checkout"))),
        rule(
            R,
            "acme-cart",
            "acme",
            &format!(r#"{},"priority":5"#, sel(&svc("cart"))),
        ),
        rule(
            R,
            "acme-cart-dev",
            "acme",
            &format!(r#"{},"priority":1"#, sel(&[svc("cart"), env("dev")].join(","))),
        ),
        rule(R, "dev", "", &sel(&env("dev"))),
        rule(
            R,
            "audit-debug",
            "",
            &format!(r#""tenant_glob":"audit-*",{}"#, sel(&env("debug"))),
        ),
        rule(R, "acme", "acme", ""),
        rule(R, "acme-low", "acme", r#""priority":-1"#),
        rule(R, "default", "", ""),
        rule(R, "audit-default", "", r#""tenant_glob":"audit-*","priority":1"#),
        rule(R, "metrics-default", "", r#""signals":["metrics"],"priority":9"#),
        rule(O, "archive-all", "", ""),
    ];
    let set = RuleSet::new(rules);
    let l = Signal::Logs;
    // (tenant, signal, attributes, expected retention rule)
    let cases: &[Case] = &[
        // 1: a tenant selector rule beats a global one.
        (
            "acme",
            l,
            &[("service.name", "checkout"), ("env", "dev")],
            Some("acme-checkout"),
        ),
        // 1: priority first (5 over 1), though acme-cart-dev has more matchers.
        (
            "acme",
            l,
            &[("service.name", "cart"), ("env", "dev")],
            Some("acme-cart"),
        ),
        // 2: a global selector rule beats the tenant's default.
        ("acme", l, &[("service.name", "web"), ("env", "dev")], Some("dev")),
        ("globex", l, &[("env", "dev")], Some("dev")),
        // 2: a glob rule only for tenants it matches.
        ("audit-eu", l, &[("env", "debug")], Some("audit-debug")),
        ("globex", l, &[("env", "debug")], Some("default")),
        // 3: the tenant's default, highest priority first.
        ("acme", l, &[("service.name", "web")], Some("acme")),
        ("acme", l, &[], Some("acme")),
        // 4: the global default; a glob default outranks by priority.
        ("globex", l, &[("service.name", "web")], Some("default")),
        ("audit-eu", l, &[], Some("audit-default")),
        // Signals filter: the metrics default applies to metrics only, and
        // only after the tenant's own default (step 3 before 4).
        ("globex", Signal::Metrics, &[], Some("metrics-default")),
        ("acme", Signal::Metrics, &[], Some("acme")),
    ];
    for (tenant, signal, attrs, want) in cases {
        let got = set.resolve(R, tenant, *signal, *attrs).map(|r| r.name.as_str());
        assert_eq!(got, *want, "{tenant} {signal} {attrs:?}");
    }
    // Offload rules resolve separately from retention rules.
    let got = set.resolve(O, "acme", l, &[("env", "dev")]).map(|r| r.name.as_str());
    assert_eq!(got, Some("archive-all"));

    // 5: nothing applies: keep forever.
    let only_acme = RuleSet::new(vec![
        rule(R, "acme", "acme", ""),
        rule(R, "logs", "", r#""signals":["logs"]"#),
    ]);
    assert!(
        only_acme
            .resolve(R, "globex", Signal::Traces, &[("env", "dev")])
            .is_none()
    );
    assert!(only_acme.resolve(O, "acme", l, &[("env", "dev")]).is_none());
    assert_eq!(
        only_acme
            .resolve(R, "globex", l, &[("a", "b")])
            .map(|r| r.name.as_str()),
        Some("logs")
    );
}

#[test]
fn ties_break_by_matchers_then_name() {
    let a = r#"{"key":"a","op":"exists"}"#;
    let b = r#"{"key":"b","op":"exists"}"#;
    let two = sel(&format!("{a},{b}"));
    for (rules, want) in [
        // Same priority: more matchers wins, whatever the names.
        (vec![rule(R, "a-one", "", &sel(a)), rule(R, "z-two", "", &two)], "z-two"),
        // Same priority and matcher count: the smaller name wins.
        (
            vec![rule(R, "beta", "", &sel(a)), rule(R, "alpha", "", &sel(b))],
            "alpha",
        ),
        (vec![rule(R, "beta", "", ""), rule(R, "alpha", "", "")], "alpha"),
        // Priority before matcher count.
        (
            vec![
                rule(R, "one", "", &format!(r#"{},"priority":1"#, sel(a))),
                rule(R, "two", "", &two),
            ],
            "one",
        ),
    ] {
        for order in [rules.clone(), rules.into_iter().rev().collect()] {
            let got = RuleSet::new(order)
                .resolve(R, "t", Signal::Logs, &[("a", "1"), ("b", "2")])
                .map(|r| r.name.clone());
            assert_eq!(got.as_deref(), Some(want));
        }
    }
}

#[test]
fn needs_resources_only_when_a_selector_rule_applies() {
    let env = sel(r#"{"key":"env","op":"=","value":"dev"}"#);
    let set = RuleSet::new(vec![
        rule(R, "acme", "acme", ""),
        rule(R, "default", "", ""),
        rule(R, "acme-dev", "acme", &format!(r#""signals":["logs"],{env}"#)),
        rule(R, "audit-dev", "", &format!(r#""tenant_glob":"audit-*",{env}"#)),
        rule(O, "globex-dev", "globex", &env),
    ]);
    assert!(set.needs_resources(R, "acme", Signal::Logs));
    assert!(
        !set.needs_resources(R, "acme", Signal::Traces),
        "acme-dev is for logs only"
    );
    assert!(
        !set.needs_resources(R, "globex", Signal::Logs),
        "no retention selector rule for globex"
    );
    assert!(set.needs_resources(O, "globex", Signal::Logs));
    assert!(set.needs_resources(R, "audit-eu", Signal::Metrics));
    assert!(!set.needs_resources(O, "acme", Signal::Logs));
    // Without selector rules, the default is the answer for any resource.
    let name = |r: Option<&Rule>| r.map(|r| r.name.clone());
    let dev = [("env", "dev")];
    assert_eq!(
        name(set.resolve_default(R, "acme", Signal::Traces)),
        Some("acme".into())
    );
    assert_eq!(name(set.resolve(R, "acme", Signal::Traces, &dev)), Some("acme".into()));
    assert_eq!(
        name(set.resolve_default(R, "globex", Signal::Logs)),
        Some("default".into())
    );
    assert_eq!(
        name(set.resolve(R, "acme", Signal::Logs, &dev)),
        Some("acme-dev".into())
    );
    assert!(!RuleSet::default().needs_resources(R, "acme", Signal::Logs));
}

/// Steps 1-5 applied directly to an unindexed list.
fn oracle<'a>(
    rules: &'a [Rule],
    kind: PolicyKind,
    tenant: &str,
    signal: Signal,
    attrs: &[(String, String)],
) -> Option<&'a Rule> {
    let step = |tenant_specific: bool, with_selector: bool| {
        (rules.iter())
            .filter(|r| r.kind == kind && r.applies_to(tenant, signal))
            .filter(|r| r.tenant.is_empty() != tenant_specific && r.body.selector.is_empty() != with_selector)
            .filter(|r| r.body.matches(attrs))
            .min_by(|a, b| precedence(a, b).then_with(|| a.body.to_json().cmp(&b.body.to_json())))
    };
    step(true, true)
        .or_else(|| step(false, true))
        .or_else(|| step(true, false))
        .or_else(|| step(false, false))
}

fn arb_rule() -> impl Strategy<Value = Rule> {
    let matcher = (
        prop::sample::select(vec!["k1", "k2"]),
        prop::sample::select(SelectorOp::ALL.to_vec()),
        "[xy]?",
    )
        .prop_map(|(key, op, v)| match op.arity() {
            Arity::None => json!({"key": key, "op": op.as_str()}),
            Arity::One => json!({"key": key, "op": op.as_str(), "value": v}),
            Arity::Many => json!({"key": key, "op": op.as_str(), "values": [v, "x"]}),
        });
    let signals = prop::sample::subsequence(vec!["logs", "traces", "metrics"], 0..=2);
    let tenant = prop::sample::select(vec!["", "", "a", "b"]);
    let glob = prop::option::of(prop::sample::select(vec!["a*", "?", "c"]));
    (
        prop::bool::ANY,
        0..4u8,
        tenant,
        glob,
        signals,
        prop::collection::vec(matcher, 0..3),
        0..3i32,
        1..4u64,
    )
        .prop_map(|(offload, name, tenant, glob, signals, selector, priority, hours)| {
            let mut body = json!({"v": 1, "signals": signals, "selector": selector, "priority": priority});
            if let (Some(o), Some(g)) = (body.as_object_mut(), glob.filter(|_| tenant.is_empty())) {
                o.insert("tenant_glob".into(), g.into());
            }
            let kind = if offload { O } else { R };
            if let Some(o) = body.as_object_mut() {
                if offload {
                    o.insert("after_s".into(), (hours * 3600).into());
                    o.insert("target".into(), "archive".into());
                } else {
                    o.insert("retain_s".into(), (hours * 3600).into());
                }
            }
            Rule::parse(kind, &format!("r{name}"), tenant, &body.to_string(), None).expect("generated rule is valid")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn resolution_ignores_rule_order(
        (rules, shuffled) in prop::collection::vec(arb_rule(), 0..12)
            .prop_flat_map(|rules| (Just(rules.clone()), Just(rules).prop_shuffle())),
        queries in prop::collection::vec((
            prop::sample::select(vec!["a", "b", "c"]),
            prop::sample::select(Signal::ALL.to_vec()),
            prop::option::of("[xy]?"),
            prop::option::of("[xy]?"),
        ), 1..8),
    ) {
        let set = RuleSet::new(rules.clone());
        let reordered = RuleSet::new(shuffled);
        for (tenant, signal, k1, k2) in queries {
            let attrs: Vec<(String, String)> = [("k1", k1), ("k2", k2)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
                .collect();
            for kind in PolicyKind::ALL {
                let got = set.resolve(kind, tenant, signal, &attrs);
                prop_assert_eq!(got, reordered.resolve(kind, tenant, signal, &attrs));
                prop_assert_eq!(got, oracle(&rules, kind, tenant, signal, &attrs));
                if !set.needs_resources(kind, tenant, signal) {
                    prop_assert_eq!(got, set.resolve_default(kind, tenant, signal));
                }
            }
        }
    }
}
