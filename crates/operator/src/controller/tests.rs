//! Reconcile scenarios: the Kubernetes API is a `tower_test` mock that
//! asserts each request (method, path, query set, hand-written bodies);
//! the catalog is a real single-member catalog in this process, read
//! back after every scenario.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use mira_catalog::proto as pb;

use super::*;
use crate::conditions::{OFFLOAD_TARGET_READY, READY, find, reason};
use crate::crd::{AttributeExpression, AttributeSelector, MiraRetentionPolicyStatus, Operator};
use crate::fixtures::{ApiServerVerifier, TestCatalog, verify};
use crate::metrics::ReasonLabel;
use crate::tenancy::Tenancy;

const NAME: &str = "k8s/default/test";

fn ready(status: &MiraRetentionPolicyStatus) -> (&str, &str, &str) {
    let c = find(&status.conditions, READY).expect("a Ready condition");
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

async fn run(
    obj: &MiraRetentionPolicy,
    ctx: Arc<Context>,
    verifier: ApiServerVerifier,
    scenario: impl FnOnce(ApiServerVerifier) -> futures::future::BoxFuture<'static, ApiServerVerifier>,
) -> Result<Action, Error> {
    let obj = Arc::new(obj.clone());
    verify(verifier, scenario, async move { reconcile(obj, ctx).await }).await
}

/// Applies `obj` once on a fresh context: status patch, then the events
/// listed; returns the status written.
async fn apply_once(
    catalog: &TestCatalog,
    obj: &MiraRetentionPolicy,
    events: &'static [(&'static str, &'static str, &'static str)],
) -> (Result<Action, Error>, MiraRetentionPolicyStatus) {
    let (ctx, verifier, _) = Context::test(catalog.client());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let o = obj.clone();
    let result = run(obj, ctx, verifier, move |mut v| {
        Box::pin(async move {
            let status = v.status_patch(&o).await;
            for (type_, reason, action) in events {
                v.event(&o, type_, reason, action).await;
            }
            let _ = tx.send(status);
            v
        })
    })
    .await;
    (result, rx.await.expect("the status patch"))
}

#[tokio::test]
async fn an_object_without_the_finalizer_gets_it_and_nothing_else() {
    let catalog = TestCatalog::start().await;
    let (ctx, verifier, _) = Context::test(catalog.client());
    let obj = MiraRetentionPolicy::test();
    let o = obj.clone();
    let action = run(&obj, ctx, verifier, move |mut v| {
        Box::pin(async move {
            v.finalizer_creation(&o).await;
            v
        })
    })
    .await
    .expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert!(
        catalog.policies().await.policies.is_empty(),
        "nothing written before the finalizer"
    );
}

#[tokio::test]
async fn a_new_policy_is_set_in_the_catalog_and_reported_ready_then_a_rerun_is_silent() {
    let catalog = TestCatalog::start().await;
    let obj = MiraRetentionPolicy::test().finalized();
    let (result, status) = apply_once(&catalog, &obj, &[("Normal", "Applied", "SetPolicy")]).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));

    let p = catalog
        .policy(pb::PolicyKind::Retention, NAME)
        .await
        .expect("the policy");
    assert_eq!(p.tenant, "acme");
    assert_eq!(
        p.body_json,
        r#"{"v":1,"retain_s":2592000,"source":{"kind":"MiraRetentionPolicy","namespace":"default","name":"test","uid":"uid-1","generation":1}}"#
    );
    assert!(catalog.policy(pb::PolicyKind::Offload, NAME).await.is_none());
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.catalog_policy.as_deref(), Some(NAME));
    assert_eq!(
        ready(&status),
        ("True", "Applied", "retain 30d for tenant acme (all signals)")
    );
    assert!(find(&status.conditions, OFFLOAD_TARGET_READY).is_none());

    // The watch event of our own patch: same object, same status. Nothing
    // is written to Kubernetes or the catalog.
    let version = catalog.policies().await.version;
    let again = obj.clone().with_status(status);
    let (ctx, verifier, _) = Context::test(catalog.client());
    let action = run(&again, ctx, verifier, |v| Box::pin(async move { v }))
        .await
        .expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert_eq!(catalog.policies().await.version, version, "no catalog write");
}

#[tokio::test]
async fn a_selector_change_rewrites_the_body_and_offload_comes_and_goes() {
    let catalog = TestCatalog::start().await;
    catalog
        .client()
        .register_offload_targets(vec!["archive".into()])
        .await
        .expect("register");
    let first = MiraRetentionPolicy::test().finalized();
    let (_, status) = apply_once(&catalog, &first, &[("Normal", "Applied", "SetPolicy")]).await;

    // Generation 2: a selector and offload.
    let mut second = first
        .clone()
        .generation(2)
        .with_offload("7d", "archive")
        .with_status(status);
    second.spec.resource_selector = Some(AttributeSelector {
        match_attributes: [("service.name".to_owned(), "checkout".to_owned())].into(),
        match_expressions: vec![AttributeExpression {
            key: "deployment.environment".into(),
            operator: Operator::NotMatches,
            values: vec!["prod-.*".into()],
        }],
    });
    let (result, status) = apply_once(&catalog, &second, &[]).await;
    result.expect("reconcile");
    let selector = r#""selector":[{"key":"service.name","op":"=","value":"checkout"},{"key":"deployment.environment","op":"!~","value":"prod-.*"}]"#;
    let source =
        r#""source":{"kind":"MiraRetentionPolicy","namespace":"default","name":"test","uid":"uid-1","generation":2}"#;
    let retention = catalog
        .policy(pb::PolicyKind::Retention, NAME)
        .await
        .expect("retention");
    assert_eq!(
        retention.body_json,
        format!(r#"{{"v":1,{selector},"retain_s":2592000,{source}}}"#)
    );
    let offload = catalog.policy(pb::PolicyKind::Offload, NAME).await.expect("offload");
    assert_eq!(
        offload.body_json,
        format!(r#"{{"v":1,{selector},"after_s":604800,"target":"archive",{source}}}"#)
    );
    assert_eq!(status.observed_generation, Some(2));
    let target = find(&status.conditions, OFFLOAD_TARGET_READY).expect("OffloadTargetReady");
    assert_eq!(
        (target.status.as_str(), target.reason.as_str()),
        ("True", reason::TARGET_REGISTERED)
    );
    assert_eq!(ready(&status).0, "True");

    // Generation 3: offload removed.
    let mut third = second.clone().generation(3).with_status(status);
    third.spec.offload = None;
    let (result, status) = apply_once(&catalog, &third, &[]).await;
    result.expect("reconcile");
    assert!(
        catalog.policy(pb::PolicyKind::Offload, NAME).await.is_none(),
        "offload policy deleted"
    );
    assert!(catalog.policy(pb::PolicyKind::Retention, NAME).await.is_some());
    assert!(find(&status.conditions, OFFLOAD_TARGET_READY).is_none());
    assert_eq!(status.observed_generation, Some(3));
}

#[tokio::test]
async fn a_registered_target_a_compactor_cannot_reach_is_reported_with_the_error() {
    let catalog = TestCatalog::start().await;
    let check = |reachable: bool, error: &str| pb::OffloadTargetCheck {
        name: "archive".into(),
        reachable,
        checked_at_ns: 1_764_547_200_000_000_000,
        error: error.into(),
    };
    catalog
        .client()
        .register_offload_target_checks(vec![check(false, "Generic S3 error: connection refused")])
        .await
        .expect("register");
    let obj = MiraRetentionPolicy::test().finalized().with_offload("7d", "archive");
    let (result, status) = apply_once(&catalog, &obj, &[("Warning", "OffloadTargetUnreachable", "SetPolicy")]).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));
    // Registered: the offload policy is set, so offload resumes once the
    // target answers.
    assert!(catalog.policy(pb::PolicyKind::Offload, NAME).await.is_some());
    let target = find(&status.conditions, OFFLOAD_TARGET_READY).expect("OffloadTargetReady");
    assert_eq!(
        (target.status.as_str(), target.reason.as_str()),
        ("False", reason::TARGET_UNREACHABLE)
    );
    assert_eq!(
        target.message,
        "offload target \"archive\" is registered, but a compactor could not reach it at 2025-12-01T00:00:00Z: \
         Generic S3 error: connection refused"
    );
    assert_eq!(ready(&status).0, "False");
    assert_eq!(ready(&status).1, reason::OFFLOAD_TARGET_NOT_READY);
    assert_eq!(status.observed_generation, None);

    // The next check passes: True, and Ready.
    catalog
        .client()
        .register_offload_target_checks(vec![check(true, "")])
        .await
        .expect("register");
    let again = obj.clone().with_status(status);
    let (result, status) = apply_once(&catalog, &again, &[("Normal", "Applied", "SetPolicy")]).await;
    result.expect("reconcile");
    let target = find(&status.conditions, OFFLOAD_TARGET_READY).expect("OffloadTargetReady");
    assert_eq!(
        (target.status.as_str(), target.reason.as_str()),
        ("True", reason::TARGET_REGISTERED)
    );
    assert!(
        target.message.contains("reachable at 2025-12-01T00:00:00Z"),
        "{}",
        target.message
    );
    assert_eq!(ready(&status).0, "True");
}

#[tokio::test]
async fn an_unregistered_offload_target_is_reported_and_only_retention_is_set() {
    let catalog = TestCatalog::start().await;
    let obj = MiraRetentionPolicy::test().finalized().with_offload("7d", "cold");
    let (result, status) = apply_once(&catalog, &obj, &[("Warning", "OffloadTargetNotFound", "SetPolicy")]).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));
    assert!(catalog.policy(pb::PolicyKind::Retention, NAME).await.is_some());
    assert!(catalog.policy(pb::PolicyKind::Offload, NAME).await.is_none());
    let target = find(&status.conditions, OFFLOAD_TARGET_READY).expect("OffloadTargetReady");
    assert_eq!(
        (target.status.as_str(), target.reason.as_str()),
        ("False", reason::TARGET_NOT_REGISTERED)
    );
    assert!(target.message.contains("\"cold\""), "{}", target.message);
    assert_eq!(ready(&status).1, reason::OFFLOAD_TARGET_NOT_READY);
    assert_eq!(status.observed_generation, None, "not all of the spec is applied");
}

#[tokio::test]
async fn invalid_specs_are_reported_with_the_field_and_nothing_is_written() {
    let catalog = TestCatalog::start().await;
    let mut in_without_values = MiraRetentionPolicy::test().finalized();
    in_without_values.spec.resource_selector = Some(AttributeSelector {
        match_expressions: vec![AttributeExpression {
            key: "env".into(),
            operator: Operator::In,
            values: vec![],
        }],
        ..AttributeSelector::default()
    });
    let mut bad_unit = MiraRetentionPolicy::test().finalized();
    bad_unit.spec.retain = "5x".into();
    let cases = [
        (
            MiraRetentionPolicy::test().finalized().with_offload("30d", "archive"),
            "spec.offload.after: 30d is not shorter than retain 30d",
        ),
        (bad_unit, "spec.retain: \"5x\" is not a duration"),
        (
            in_without_values,
            "spec.resourceSelector.matchExpressions[0].values: operator In takes at least one value",
        ),
    ];
    for (obj, message) in cases {
        let (result, status) = apply_once(&catalog, &obj, &[("Warning", "InvalidSpec", "Validate")]).await;
        assert_eq!(result.expect("reconcile"), Action::await_change());
        let (s, r, m) = ready(&status);
        assert_eq!((s, r), ("False", "InvalidSpec"));
        assert!(m.starts_with(message), "{m}");
        assert_eq!(status.observed_generation, None);
    }
    assert!(catalog.policies().await.policies.is_empty(), "nothing written");
}

#[tokio::test]
async fn catalog_down_then_back_reports_unavailable_backs_off_and_recovers() {
    let mut catalog = TestCatalog::not_started();
    let (ctx, verifier, metrics) = Context::test(catalog.client());
    let applied = MiraRetentionPolicyStatus {
        observed_generation: Some(1),
        ..MiraRetentionPolicyStatus::default()
    };
    let obj = MiraRetentionPolicy::test()
        .finalized()
        .generation(2)
        .with_status(applied);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let o = obj.clone();
    let arc = Arc::new(obj.clone());
    let catalog_ref = &mut catalog;
    let metrics_ref = &metrics;
    let result = verify(
        verifier,
        move |mut v| async move {
            let status = v.status_patch(&o).await;
            v.event(&o, "Warning", "CatalogUnavailable", "SetPolicy").await;
            let _ = tx.send(status);
            v
        },
        async move {
            let r = reconcile(arc.clone(), ctx.clone()).await;
            let err = r.as_ref().expect_err("catalog down");
            assert_eq!(err.metric_label(), "CatalogUnavailable");
            assert!(!ctx.catalog_up());
            // What the controller does with the error: count it, retry
            // after the object's backoff.
            let _ = error_policy(arc.clone(), err, ctx.clone());
            let errors = metrics_ref
                .errors
                .get_or_create(&ReasonLabel {
                    reason: "CatalogUnavailable",
                })
                .get();
            assert_eq!(errors, 1);
            // The object's retries: 5 s doubling to 5 min, each in its
            // upper half (error_policy above took the first).
            let key = ObjectRef::from_obj(&*arc);
            let mut ceiling = Duration::from_secs(10);
            for _ in 0..8 {
                let d = ctx.next_backoff(&key);
                assert!(
                    d >= ceiling / 2 && d <= ceiling,
                    "{d:?} outside [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
                ceiling = (ceiling * 2).min(BACKOFF_MAX);
            }
            assert_eq!(ceiling, BACKOFF_MAX);

            // The catalog comes back: the probe says so once (the
            // controller then reconciles every object).
            catalog_ref.restart().await;
            let (recovered, mut trigger) = tokio::sync::mpsc::channel(1);
            let probe = tokio::spawn(probe_catalog(ctx.clone(), recovered, Duration::from_millis(50)));
            trigger.recv().await.expect("the probe saw the catalog come back");
            probe.abort();
            let _ = probe.await;
            assert!(ctx.catalog_up());
            r
        },
    )
    .await;
    assert!(result.is_err());
    let status = rx.await.expect("status");
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "CatalogUnavailable"));
    assert!(m.contains("catalog unavailable"), "{m}");
    assert_eq!(status.observed_generation, Some(1), "not advanced");
    let cond = find(&status.conditions, READY).expect("Ready");
    assert_eq!(cond.observed_generation, Some(2));

    // Reconciled again, the object is applied.
    let again = obj.clone().with_status(status);
    let (result, status) = apply_once(&catalog, &again, &[("Normal", "Applied", "SetPolicy")]).await;
    result.expect("reconcile");
    assert_eq!(ready(&status).0, "True");
    assert_eq!(status.observed_generation, Some(2));
    assert!(catalog.policy(pb::PolicyKind::Retention, NAME).await.is_some());
}

#[tokio::test]
async fn delete_removes_both_policies_then_the_finalizer() {
    let catalog = TestCatalog::start().await;
    catalog
        .client()
        .register_offload_targets(vec!["archive".into()])
        .await
        .expect("register");
    let obj = MiraRetentionPolicy::test().finalized().with_offload("7d", "archive");
    let (_, status) = apply_once(&catalog, &obj, &[("Normal", "Applied", "SetPolicy")]).await;
    assert!(catalog.policy(pb::PolicyKind::Offload, NAME).await.is_some());

    let deleting = obj.clone().with_status(status).needs_delete();
    let (ctx, verifier, _) = Context::test(catalog.client());
    let o = deleting.clone();
    let action = run(&deleting, ctx, verifier, move |mut v| {
        Box::pin(async move {
            v.event(&o, "Normal", "Deleted", "DeletePolicy").await;
            v.finalizer_removal(&o).await;
            v
        })
    })
    .await
    .expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert!(catalog.policies().await.policies.is_empty(), "both policies gone");
}

#[tokio::test]
async fn delete_with_the_catalog_down_keeps_the_finalizer() {
    let catalog = TestCatalog::not_started();
    let (ctx, verifier, _) = Context::test(catalog.client());
    let deleting = MiraRetentionPolicy::test().finalized().needs_delete();
    let o = deleting.clone();
    let result = run(&deleting, ctx, verifier, move |mut v| {
        Box::pin(async move {
            let status = v.status_patch(&o).await;
            assert_eq!(ready(&status).1, "CatalogUnavailable");
            v.event(&o, "Warning", "CatalogUnavailable", "SetPolicy").await;
            // No finalizer removal follows.
            v
        })
    })
    .await;
    let err = result.expect_err("catalog down");
    assert_eq!(err.metric_label(), "CatalogUnavailable");
}

#[tokio::test]
async fn the_orphan_sweep_deletes_only_operator_policies_without_an_object() {
    let catalog = TestCatalog::start().await;
    let client = catalog.client();
    let set = |name: &str, tenant: &str| pb::Policy {
        kind: pb::PolicyKind::Retention as i32,
        name: name.to_owned(),
        tenant: tenant.to_owned(),
        body_json: r#"{"v":1,"retain_s":86400}"#.to_owned(),
        status_json: String::new(),
    };
    for name in ["k8s/default/gone", "k8s/default/kept", "k8s/other/gone", "manual-1d"] {
        client.set_policy(set(name, "acme")).await.expect("set");
    }
    let exists = |ns: &str, name: &str| (ns, name) == ("default", "kept");

    // An operator of one namespace leaves the others alone.
    let deleted = sweep_orphans(&client, Some("default"), exists).await.expect("sweep");
    assert_eq!(deleted, ["k8s/default/gone"]);
    let deleted = sweep_orphans(&client, None, exists).await.expect("sweep");
    assert_eq!(deleted, ["k8s/other/gone"]);
    let mut left: Vec<String> = catalog.policies().await.policies.into_iter().map(|p| p.name).collect();
    left.sort();
    assert_eq!(left, ["k8s/default/kept", "manual-1d"]);
}

#[tokio::test]
async fn compactor_counts_show_in_the_status() {
    let catalog = TestCatalog::start().await;
    let obj = MiraRetentionPolicy::test().finalized();
    let (_, status) = apply_once(&catalog, &obj, &[("Normal", "Applied", "SetPolicy")]).await;
    catalog
        .client()
        .set_policy_status(
            pb::PolicyKind::Retention,
            NAME,
            r#"{"generation":1,"last_run_ns":1764547200000000000,"blocks_dropped":40,"rows_dropped":1200,"bytes_dropped":52428800,"errors":["one"]}"#.to_owned(),
        )
        .await
        .expect("status");
    let (result, status) = apply_once(&catalog, &obj.clone().with_status(status), &[]).await;
    result.expect("reconcile");
    assert_eq!(status.blocks_dropped, Some(40));
    assert_eq!(status.bytes_dropped, Some(52_428_800));
    assert_eq!(status.rows_dropped, Some(1200));
    assert_eq!(status.last_enforced.as_deref(), Some("2025-12-01T00:00:00Z"));
    assert_eq!(status.enforcement_errors, ["one"]);
}

// ---- namespaces and the tenants they may govern ---------------------------

/// The operator's namespace is `obs`; `team-s` is granted `team-s` by the
/// settings; annotations count unless `annotation` is false.
fn tenancy(annotation: bool) -> Tenancy {
    Tenancy::new("obs", &["team-s=team-s".to_owned()], annotation, "test").expect("tenancy")
}

/// Applies `obj` once with `tenancy`: a GET of its Namespace answered
/// with annotation `annotation.1` when `annotation.0`, then the status
/// patch and the events listed; returns the status written.
async fn apply_with(
    catalog: &TestCatalog,
    tenancy: Tenancy,
    obj: &MiraRetentionPolicy,
    annotation: (bool, Option<&'static str>),
    events: &'static [(&'static str, &'static str, &'static str)],
) -> (Result<Action, Error>, MiraRetentionPolicyStatus) {
    let (ctx, verifier, _) = Context::test_with(catalog.client(), tenancy);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let o = obj.clone();
    let result = run(obj, ctx, verifier, move |mut v| {
        Box::pin(async move {
            if annotation.0 {
                v.namespace_get(&o.namespace().expect("namespace"), annotation.1).await;
            }
            let status = v.status_patch(&o).await;
            for (type_, reason, action) in events {
                v.event(&o, type_, reason, action).await;
            }
            let _ = tx.send(status);
            v
        })
    })
    .await;
    (result, rx.await.expect("the status patch"))
}

const REFUSED: &[(&str, &str, &str)] = &[("Warning", "TenantNotAllowed", "Validate")];
const APPLIED: &[(&str, &str, &str)] = &[("Normal", "Applied", "SetPolicy")];

#[tokio::test]
async fn a_tenant_the_namespace_may_not_govern_is_refused_and_nothing_is_set() {
    let catalog = TestCatalog::start().await;
    let obj = MiraRetentionPolicy::test().finalized().in_namespace("team-a", "team-b");
    let (result, status) = apply_with(&catalog, tenancy(true), &obj, (true, Some("team-a")), REFUSED).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "TenantNotAllowed"));
    assert!(
        m.starts_with(
            "namespace \"team-a\" may not govern tenant \"team-b\"; namespace \"team-a\" may govern: team-a;"
        ),
        "{m}"
    );
    assert_eq!(status.catalog_policy, None);
    assert_eq!(status.observed_generation, None);

    // Reconciled again unchanged: the Namespace is read, nothing written.
    let version = catalog.policies().await.version;
    let again = obj.clone().with_status(status);
    let (ctx, verifier, _) = Context::test_with(catalog.client(), tenancy(true));
    let action = run(&again, ctx, verifier, |mut v| {
        Box::pin(async move {
            v.namespace_get("team-a", Some("team-a")).await;
            v
        })
    })
    .await
    .expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert_eq!(catalog.policies().await.version, version, "no catalog write");

    // No annotation at all: not even the tenant named like the namespace.
    let same = MiraRetentionPolicy::test().finalized().in_namespace("team-a", "team-a");
    let (result, status) = apply_with(&catalog, tenancy(true), &same, (true, None), REFUSED).await;
    result.expect("reconcile");
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "TenantNotAllowed"));
    assert!(m.contains("namespace \"team-a\" may govern no tenant"), "{m}");
    assert!(catalog.policies().await.policies.is_empty(), "nothing written");
}

#[tokio::test]
async fn a_tenant_the_annotation_grants_is_applied() {
    let catalog = TestCatalog::start().await;
    let obj = MiraRetentionPolicy::test()
        .finalized()
        .in_namespace("team-a", "team-a-dev");
    let (result, status) = apply_with(
        &catalog,
        tenancy(true),
        &obj,
        (true, Some("team-a, team-a-dev")),
        APPLIED,
    )
    .await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));
    assert_eq!(ready(&status).0, "True");
    let p = catalog
        .policy(pb::PolicyKind::Retention, "k8s/team-a/test")
        .await
        .expect("the policy");
    assert_eq!(p.tenant, "team-a-dev");
}

#[tokio::test]
async fn every_tenant_is_refused_outside_the_operator_namespace_and_accepted_in_it() {
    let catalog = TestCatalog::start().await;
    // Refused without reading the Namespace: no annotation grants `*`.
    let elsewhere = MiraRetentionPolicy::test().finalized().in_namespace("team-a", "*");
    let (result, status) = apply_with(&catalog, tenancy(true), &elsewhere, (false, None), REFUSED).await;
    result.expect("reconcile");
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "TenantNotAllowed"));
    assert!(
        m.starts_with(
            "tenant \"*\" (every tenant) may be named only in the operator's namespace, not in namespace \"team-a\""
        ),
        "{m}"
    );
    assert!(catalog.policies().await.policies.is_empty());

    let home = MiraRetentionPolicy::test().finalized().in_namespace("obs", "*");
    let (result, status) = apply_with(&catalog, tenancy(true), &home, (false, None), APPLIED).await;
    result.expect("reconcile");
    assert_eq!(ready(&status).0, "True");
    let p = catalog
        .policy(pb::PolicyKind::Retention, "k8s/obs/test")
        .await
        .expect("the policy");
    assert_eq!(p.tenant, "", "every tenant");
}

#[tokio::test]
async fn an_edited_annotation_is_seen_and_removes_the_policies_it_no_longer_allows() {
    let catalog = TestCatalog::start().await;
    catalog
        .client()
        .register_offload_targets(vec!["archive".into()])
        .await
        .expect("register");
    let name = "k8s/team-a/test";
    let obj = MiraRetentionPolicy::test()
        .finalized()
        .in_namespace("team-a", "team-a")
        .with_offload("7d", "archive");
    let (_, status) = apply_with(&catalog, tenancy(true), &obj, (true, Some("team-a")), APPLIED).await;
    assert_eq!(ready(&status).0, "True");
    assert!(catalog.policy(pb::PolicyKind::Retention, name).await.is_some());
    assert!(catalog.policy(pb::PolicyKind::Offload, name).await.is_some());

    // An administrator moves the grant to team-c.
    let again = obj.clone().with_status(status);
    let (result, status) = apply_with(&catalog, tenancy(true), &again, (true, Some("team-c")), REFUSED).await;
    assert_eq!(result.expect("reconcile"), Action::requeue(Duration::from_secs(300)));
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "TenantNotAllowed"));
    assert!(m.contains("may not govern tenant \"team-a\""), "{m}");
    assert!(catalog.policies().await.policies.is_empty(), "both policies removed");
    assert_eq!(status.catalog_policy, None);
    assert!(find(&status.conditions, OFFLOAD_TARGET_READY).is_none());

    // And back: applied again.
    let back = obj.clone().with_status(status);
    let (result, status) = apply_with(&catalog, tenancy(true), &back, (true, Some("team-a")), APPLIED).await;
    result.expect("reconcile");
    assert_eq!(ready(&status).0, "True");
    assert_eq!(status.catalog_policy.as_deref(), Some(name));
    assert!(catalog.policy(pb::PolicyKind::Retention, name).await.is_some());
}

#[tokio::test]
async fn the_settings_grant_without_a_namespace_read_and_annotations_can_be_turned_off() {
    let catalog = TestCatalog::start().await;
    let granted = MiraRetentionPolicy::test().finalized().in_namespace("team-s", "team-s");
    let (result, status) = apply_with(&catalog, tenancy(true), &granted, (false, None), APPLIED).await;
    result.expect("reconcile");
    assert_eq!(ready(&status).0, "True");

    // Annotations off: the Namespace is not read, so nothing grants team-a.
    let obj = MiraRetentionPolicy::test().finalized().in_namespace("team-a", "team-a");
    let (result, status) = apply_with(&catalog, tenancy(false), &obj, (false, None), REFUSED).await;
    result.expect("reconcile");
    let (s, r, m) = ready(&status);
    assert_eq!((s, r), ("False", "TenantNotAllowed"));
    assert!(
        m.contains("grants tenants with the operator's --namespace-tenants"),
        "{m}"
    );
    assert!(
        catalog
            .policy(pb::PolicyKind::Retention, "k8s/team-a/test")
            .await
            .is_none()
    );
}
