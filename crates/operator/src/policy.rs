//! The pure mapping from a `MiraRetentionPolicy` to the catalog policies
//! it stands for ([`to_catalog`]): one retention policy and, with
//! `spec.offload`, one offload policy, both named `k8s/<namespace>/<name>`
//! ([`catalog_name`]; the `k8s/` prefix is how the orphan sweep tells the
//! operator's policies from those made with `mira policy`).
//!
//! Bodies are built as `mira_core::policy::PolicyBody` and checked by the
//! same `validate` the catalog runs, so the operator refuses exactly what
//! the catalog would, but names the field of the custom resource
//! (`spec.resourceSelector.matchExpressions[2].values[0]`) instead of the
//! body's. Durations are `[0-9]+(ms|s|m|h|d|w|y)` segments (the CRD's
//! pattern), read by the one duration parser (`mira_common::config`).

use std::fmt;

use kube::ResourceExt;
use mira_catalog::proto as pb;
use mira_core::policy::{self as core, Matcher, PolicyBody, PolicyError, PolicyKind, SelectorOp, Source};

use crate::crd::{KIND, MiraRetentionPolicy, Operator};

/// Prefix of every catalog policy the operator owns.
pub const PREFIX: &str = "k8s/";

/// The catalog name of the policies of object `namespace/name`.
pub fn catalog_name(namespace: &str, name: &str) -> String {
    format!("{PREFIX}{namespace}/{name}")
}

/// The object (namespace, name) an operator-owned catalog policy belongs
/// to; `None` for a policy the operator does not own.
pub fn owner_of(policy_name: &str) -> Option<(&str, &str)> {
    let rest = policy_name.strip_prefix(PREFIX)?;
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then_some((ns, name))
}

/// A spec the operator refuses: the field (its path in the object) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InvalidSpec {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> InvalidSpec {
    InvalidSpec {
        field: field.into(),
        reason: reason.into(),
    }
}

/// What the catalog should hold for one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// `k8s/<namespace>/<name>`.
    pub name: String,
    pub retention: pb::Policy,
    pub offload: Option<pb::Policy>,
    /// One line for the `Ready` condition's message.
    pub summary: String,
}

/// Seconds in a unit of a duration.
fn unit_seconds(unit: &str) -> Option<f64> {
    Some(match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        "y" => 31_557_600.0,
        _ => return None,
    })
}

/// A duration of the CRD's form (`30d`, `1h30m`) in whole seconds, range
/// checked against the catalog's limits (1 h to 100 years).
pub fn parse_duration(field: &str, text: &str) -> Result<u64, InvalidSpec> {
    let shown: String = text.chars().take(64).collect();
    let bad = || {
        invalid(
            field,
            format!("{shown:?} is not a duration like 30d, 12h or 1h30m (units ms, s, m, h, d, w, y)"),
        )
    };
    // The CRD's pattern, checked here too: kubectl may not have been the
    // writer, and humantime alone accepts more (spaces, `days`, `M`).
    let mut rest = text;
    if rest.is_empty() || rest.len() > 64 {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let tail = &rest[digits..];
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        if digits == 0 || unit_seconds(&tail[..unit_len]).is_none() {
            return Err(bad());
        }
        rest = &tail[unit_len..];
    }
    let d = text.parse::<mira_common::config::Duration>().map_err(|_| bad())?.get();
    if d.subsec_nanos() != 0 {
        return Err(invalid(field, format!("{shown} is not a whole number of seconds")));
    }
    let secs = d.as_secs();
    if secs < core::MIN_DURATION_S {
        return Err(invalid(field, format!("{shown} is shorter than the minimum of 1h")));
    }
    if secs > core::MAX_DURATION_S {
        return Err(invalid(field, format!("{shown} is longer than the maximum of 100y")));
    }
    Ok(secs)
}

/// Where a field of a body shows in the object.
fn spec_field(body_field: &str) -> String {
    let (head, tail) = match body_field.find(['.', '[']) {
        Some(i) => body_field.split_at(i),
        None => (body_field, ""),
    };
    match head {
        "signals" => format!("spec.signals{tail}"),
        "selector" => "spec.resourceSelector".to_owned(),
        "retain_s" => "spec.retain".to_owned(),
        "after_s" => "spec.offload.after".to_owned(),
        "target" => "spec.offload.target".to_owned(),
        "priority" => "spec.priority".to_owned(),
        "dry_run" => "spec.dryRun".to_owned(),
        "tenant" | "tenant_glob" => "spec.tenant".to_owned(),
        "name" | "source" => "metadata.name".to_owned(),
        _ => "spec".to_owned(),
    }
}

fn from_policy_error(e: PolicyError) -> InvalidSpec {
    invalid(spec_field(&e.field), e.reason)
}

/// A matcher's error, named at the expression it came from (`path`);
/// `value_field` is where the single operand sits in the object.
fn matcher_error(path: &str, value_field: &str, e: PolicyError) -> InvalidSpec {
    let field = match e.field.strip_prefix("selector").unwrap_or(&e.field) {
        "" => path.to_owned(),
        ".value" => format!("{path}{value_field}"),
        ".values" => format!("{path}.values"),
        other if other.starts_with(".values[") => format!("{path}{other}"),
        ".key" => format!("{path}.key"),
        other => format!("{path}{other}"),
    };
    invalid(field, e.reason)
}

/// The catalog policies `obj` stands for, or why it is invalid.
pub fn to_catalog(obj: &MiraRetentionPolicy) -> Result<Desired, InvalidSpec> {
    let spec = &obj.spec;
    let namespace = obj.namespace().unwrap_or_default();
    let name = catalog_name(&namespace, &obj.name_any());
    let tenant = match spec.tenant.as_str() {
        "*" => String::new(),
        t => t.to_owned(),
    };
    if !tenant.is_empty() {
        mira_core::ids::TenantId::new(&tenant).map_err(|e| invalid("spec.tenant", e.to_string()))?;
    }
    let mut signals = Vec::with_capacity(spec.signals.len());
    for (i, s) in spec.signals.iter().enumerate() {
        if signals.contains(&s.core()) {
            return Err(invalid(format!("spec.signals[{i}]"), format!("duplicate signal {s:?}")));
        }
        signals.push(s.core());
    }
    signals.sort();

    let mut selector = Vec::new();
    if let Some(sel) = &spec.resource_selector {
        let n = sel.match_attributes.len() + sel.match_expressions.len();
        if n > core::MAX_MATCHERS {
            return Err(invalid(
                "spec.resourceSelector",
                format!(
                    "{n} matchers (matchAttributes and matchExpressions), more than the {} allowed",
                    core::MAX_MATCHERS
                ),
            ));
        }
        for (k, v) in &sel.match_attributes {
            let key: String = k.chars().take(64).collect();
            let path = format!("spec.resourceSelector.matchAttributes[{key:?}]");
            let m = Matcher::new(k, SelectorOp::Eq, vec![v.clone()]).map_err(|e| matcher_error(&path, "", e))?;
            selector.push(m);
        }
        for (i, x) in sel.match_expressions.iter().enumerate() {
            let path = format!("spec.resourceSelector.matchExpressions[{i}]");
            let op = x.operator.core();
            let wants = match x.operator {
                Operator::Exists | Operator::DoesNotExist => Some(0),
                Operator::Equals | Operator::NotEquals | Operator::Matches | Operator::NotMatches => Some(1),
                Operator::In | Operator::NotIn => None,
            };
            let count_ok = match wants {
                Some(n) => x.values.len() == n,
                None => !x.values.is_empty(),
            };
            if !count_ok {
                let need = match wants {
                    Some(0) => "no values".to_owned(),
                    Some(n) => format!("exactly {n} value"),
                    None => "at least one value".to_owned(),
                };
                return Err(invalid(
                    format!("{path}.values"),
                    format!("operator {:?} takes {need}, got {}", x.operator, x.values.len()),
                ));
            }
            let m = Matcher::new(&x.key, op, x.values.clone()).map_err(|e| matcher_error(&path, ".values[0]", e))?;
            selector.push(m);
        }
    }

    let retain_s = parse_duration("spec.retain", &spec.retain)?;
    let source = Source {
        kind: Some(KIND.to_owned()),
        namespace: Some(namespace.clone()),
        name: Some(obj.name_any()),
        uid: obj.uid(),
        generation: obj.metadata.generation.and_then(|g| u64::try_from(g).ok()),
    };
    let retention_body = PolicyBody {
        signals: signals.clone(),
        selector: selector.clone(),
        priority: spec.priority,
        retain_s: Some(retain_s),
        dry_run: spec.dry_run,
        source: Some(source.clone()),
        ..PolicyBody::default()
    };
    let retention = checked(PolicyKind::Retention, &name, &tenant, &retention_body)?;

    let offload = match &spec.offload {
        None => None,
        Some(o) => {
            let after_s = parse_duration("spec.offload.after", &o.after)?;
            if after_s >= retain_s {
                return Err(invalid(
                    "spec.offload.after",
                    format!(
                        "{} is not shorter than retain {}: data would be deleted before it is offloaded",
                        o.after, spec.retain
                    ),
                ));
            }
            let body = PolicyBody {
                signals,
                selector,
                priority: spec.priority,
                after_s: Some(after_s),
                target: Some(o.target.clone()),
                source: Some(source),
                ..PolicyBody::default()
            };
            Some(checked(PolicyKind::Offload, &name, &tenant, &body)?)
        }
    };

    let who = if tenant.is_empty() {
        "every tenant".to_owned()
    } else {
        format!("tenant {tenant}")
    };
    let what = if spec.signals.is_empty() {
        "all signals".to_owned()
    } else {
        let names: Vec<&str> = retention_body.signals.iter().map(|s| s.as_str()).collect();
        names.join(", ")
    };
    let mut summary = format!("retain {} for {who} ({what})", spec.retain);
    if let Some(o) = &spec.offload {
        summary.push_str(&format!("; offload to {} after {}", o.target, o.after));
    }
    Ok(Desired {
        name,
        retention,
        offload,
        summary,
    })
}

/// The catalog policy for `body`, checked by the catalog's own validation
/// (offload targets are checked against the catalog's registry by the
/// controller, not here).
fn checked(kind: PolicyKind, name: &str, tenant: &str, body: &PolicyBody) -> Result<pb::Policy, InvalidSpec> {
    let body_json = body.to_json();
    core::validate(kind, name, tenant, &body_json, None).map_err(from_policy_error)?;
    Ok(pb::Policy {
        kind: match kind {
            PolicyKind::Retention => pb::PolicyKind::Retention,
            PolicyKind::Offload => pb::PolicyKind::Offload,
        } as i32,
        name: name.to_owned(),
        tenant: tenant.to_owned(),
        body_json,
        status_json: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::crd::{AttributeExpression, AttributeSelector, MiraRetentionPolicySpec, OffloadSpec, Signal};

    fn obj(spec: MiraRetentionPolicySpec) -> MiraRetentionPolicy {
        let mut o = MiraRetentionPolicy::new("team-a", spec);
        o.metadata.namespace = Some("obs".into());
        o.metadata.uid = Some("u-1".into());
        o.metadata.generation = Some(4);
        o
    }

    fn spec(retain: &str) -> MiraRetentionPolicySpec {
        MiraRetentionPolicySpec {
            tenant: "acme".into(),
            signals: vec![],
            resource_selector: None,
            retain: retain.into(),
            offload: None,
            priority: 0,
            dry_run: false,
        }
    }

    fn expr(key: &str, operator: Operator, values: &[&str]) -> AttributeExpression {
        AttributeExpression {
            key: key.into(),
            operator,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn a_full_spec_maps_to_both_bodies_written_out() {
        let mut s = spec("30d");
        s.signals = vec![Signal::Traces, Signal::Logs];
        s.resource_selector = Some(AttributeSelector {
            match_attributes: [("service.name".to_owned(), "checkout".to_owned())].into(),
            match_expressions: vec![
                expr("deployment.environment", Operator::In, &["staging", "dev"]),
                expr("k8s.pod.name", Operator::Matches, &["web-.*"]),
                expr("team", Operator::DoesNotExist, &[]),
            ],
        });
        s.offload = Some(OffloadSpec {
            after: "7d".into(),
            target: "archive".into(),
        });
        s.priority = 5;
        let d = to_catalog(&obj(s)).expect("valid");
        assert_eq!(d.name, "k8s/obs/team-a");
        assert_eq!(d.retention.tenant, "acme");
        let selector = r#"[{"key":"service.name","op":"=","value":"checkout"},{"key":"deployment.environment","op":"in","values":["staging","dev"]},{"key":"k8s.pod.name","op":"=~","value":"web-.*"},{"key":"team","op":"!exists"}]"#;
        let source = r#"{"kind":"MiraRetentionPolicy","namespace":"obs","name":"team-a","uid":"u-1","generation":4}"#;
        assert_eq!(
            d.retention.body_json,
            format!(
                r#"{{"v":1,"signals":["logs","traces"],"selector":{selector},"priority":5,"retain_s":2592000,"source":{source}}}"#
            )
        );
        let offload = d.offload.expect("offload");
        assert_eq!(offload.kind, pb::PolicyKind::Offload as i32);
        assert_eq!(
            offload.body_json,
            format!(
                r#"{{"v":1,"signals":["logs","traces"],"selector":{selector},"priority":5,"after_s":604800,"target":"archive","source":{source}}}"#
            )
        );
        assert_eq!(
            d.summary,
            "retain 30d for tenant acme (logs, traces); offload to archive after 7d"
        );
    }

    #[test]
    fn every_tenant_is_the_empty_tenant() {
        let mut s = spec("90d");
        s.tenant = "*".into();
        let d = to_catalog(&obj(s)).expect("valid");
        assert_eq!(d.retention.tenant, "");
        assert!(d.summary.contains("every tenant (all signals)"), "{}", d.summary);
    }

    #[test]
    fn invalid_specs_name_the_field() {
        let cases: Vec<(MiraRetentionPolicySpec, &str, &str)> = vec![
            (spec("5x"), "spec.retain", "not a duration"),
            (spec("30 d"), "spec.retain", "not a duration"),
            (spec("10m"), "spec.retain", "minimum of 1h"),
            (spec("101y"), "spec.retain", "maximum of 100y"),
            (spec("3601500ms"), "spec.retain", "whole number"),
            (spec("99999999999999999999d"), "spec.retain", "not a duration"),
            (
                MiraRetentionPolicySpec {
                    offload: Some(OffloadSpec {
                        after: "30d".into(),
                        target: "archive".into(),
                    }),
                    ..spec("30d")
                },
                "spec.offload.after",
                "not shorter than retain",
            ),
            (
                MiraRetentionPolicySpec {
                    offload: Some(OffloadSpec {
                        after: "1d".into(),
                        target: "Archive!".into(),
                    }),
                    ..spec("30d")
                },
                "spec.offload.target",
                "not a target name",
            ),
            (
                MiraRetentionPolicySpec {
                    tenant: "a/b".into(),
                    ..spec("30d")
                },
                "spec.tenant",
                "a/b",
            ),
            (
                MiraRetentionPolicySpec {
                    signals: vec![Signal::Logs, Signal::Logs],
                    ..spec("30d")
                },
                "spec.signals[1]",
                "duplicate",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_expressions: vec![expr("env", Operator::In, &[])],
                        ..AttributeSelector::default()
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector.matchExpressions[0].values",
                "at least one value",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_expressions: vec![
                            expr("env", Operator::Exists, &[]),
                            expr("svc", Operator::Matches, &["(unclosed"]),
                        ],
                        ..AttributeSelector::default()
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector.matchExpressions[1].values[0]",
                "invalid regex",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_expressions: vec![expr("env", Operator::Exists, &["x"])],
                        ..AttributeSelector::default()
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector.matchExpressions[0].values",
                "takes no values",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_attributes: [(String::new(), "x".to_owned())].into(),
                        ..AttributeSelector::default()
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector.matchAttributes[\"\"].key",
                "empty",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_attributes: (0..20).map(|i| (format!("k{i}"), "v".to_owned())).collect(),
                        match_expressions: (0..13).map(|i| expr(&format!("e{i}"), Operator::Exists, &[])).collect(),
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector",
                "33 matchers",
            ),
            (
                MiraRetentionPolicySpec {
                    resource_selector: Some(AttributeSelector {
                        match_expressions: vec![expr("env", Operator::In, &[&"x".repeat(2000)])],
                        ..AttributeSelector::default()
                    }),
                    ..spec("30d")
                },
                "spec.resourceSelector.matchExpressions[0].values[0]",
                "2000 bytes",
            ),
        ];
        for (s, field, words) in cases {
            let e = to_catalog(&obj(s.clone())).expect_err(&format!("{s:?}"));
            assert_eq!(e.field, field, "{e}");
            assert!(e.reason.contains(words), "{field}: {e}");
        }
    }

    #[test]
    fn a_name_too_long_for_the_catalog_names_metadata() {
        let mut o = obj(spec("30d"));
        o.metadata.name = Some("n".repeat(253));
        let e = to_catalog(&o).expect_err("too long");
        assert_eq!(e.field, "metadata.name", "{e}");
    }

    #[test]
    fn owner_of_reads_back_catalog_name() {
        assert_eq!(owner_of(&catalog_name("obs", "a")), Some(("obs", "a")));
        for other in ["keep-30d", "k8s/", "k8s/obs", "k8s/obs/", "k8s//a", "k8s/a/b/c"] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    #[test]
    fn durations_of_every_unit() {
        for (text, secs) in [
            ("1h", 3600),
            ("90m", 5400),
            ("1h30m", 5400),
            ("3600000ms", 3600),
            ("2d", 172_800),
            ("1w", 604_800),
            ("1y", 31_557_600),
            ("100y", 3_155_760_000),
        ] {
            assert_eq!(parse_duration("f", text), Ok(secs), "{text}");
        }
    }

    proptest! {
        #[test]
        fn segments_add_up(parts in proptest::collection::vec((1u64..500, 0usize..6), 1..5)) {
            const UNITS: [(&str, u64); 6] = [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400), ("w", 604_800), ("y", 31_557_600)];
            let text: String = parts.iter().map(|(n, u)| format!("{n}{}", UNITS[*u].0)).collect();
            let want: u64 = parts.iter().map(|(n, u)| n * UNITS[*u].1).sum();
            let got = parse_duration("f", &text);
            if (core::MIN_DURATION_S..=core::MAX_DURATION_S).contains(&want) {
                prop_assert_eq!(got, Ok(want));
            } else {
                prop_assert_eq!(got.map_err(|e| e.field), Err("f".to_owned()));
            }
        }
    }
}
