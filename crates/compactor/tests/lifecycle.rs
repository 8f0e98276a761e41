//! Retention and offload against a real single-member catalog, with the
//! manual clock: two tenants' logs over several days under a global
//! default, a tenant default and a selector rule shorter than it; after
//! enforcement exactly the rows the resolution keeps are live, and the
//! dropped blocks' objects are gone after the grace. Offload to a
//! `file://` target: copies equal the originals, primaries freed after the
//! grace, and a copy deleted with its block when retention drops it.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_compactor::copy::sha256_hex;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::logs::v1::{ResourceLogs, ScopeLogs};
use support::*;

const DAY_S: u64 = 86_400;

async fn set_policy(env: &Env, kind: pb::PolicyKind, name: &str, tenant: &str, body: &str) {
    env.catalog
        .set_policy(pb::Policy {
            kind: kind as i32,
            name: name.into(),
            tenant: tenant.into(),
            body_json: body.into(),
            ..Default::default()
        })
        .await
        .expect("set policy");
}

fn service(rl: &ResourceLogs) -> String {
    rl.resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Every live record, flattened, sorted.
async fn live_sorted(env: &Env) -> Vec<Vec<u8>> {
    let mut all: Vec<Vec<u8>> = env.live_records().await.into_values().flatten().collect();
    all.sort();
    all
}

/// The records `keep(tenant, service, time)` keeps, flattened, sorted.
fn expected(env: &Env, keep: impl Fn(&str, &str, u64) -> bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (tenant, _, req) in &env.requests {
        for rl in &req.resource_logs {
            let svc = service(rl);
            for sl in &rl.scope_logs {
                for r in &sl.log_records {
                    let t = if r.time_unix_nano != 0 {
                        r.time_unix_nano
                    } else {
                        r.observed_time_unix_nano
                    };
                    if keep(tenant, &svc, t) {
                        // The record alone, flattened as the live side is.
                        let one = ExportLogsServiceRequest {
                            resource_logs: vec![ResourceLogs {
                                scope_logs: vec![ScopeLogs {
                                    log_records: vec![r.clone()],
                                    ..sl.clone()
                                }],
                                ..rl.clone()
                            }],
                        };
                        out.extend(mira_testkit::flatten::logs(&one));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_exactly_what_the_rules_resolve_and_deletes_the_rest_after_the_grace() {
    let mut env = Env::new().await;
    // Hours ending 2, 30, 54 and 78 hours ago: each block's rows lie wholly
    // on one side of the 1, 2 and 3 day cutoffs.
    for tenant in ["acme", "globex"] {
        for ago in [2, 30, 54, 78] {
            let hour = env.hour_start(ago);
            env.publish(tenant, hour, 2, 60, ago * H).await;
        }
    }
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "default",
        "",
        &format!(r#"{{"v":1,"retain_s":{}}}"#, 3 * DAY_S),
    )
    .await;
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "acme",
        "acme",
        &format!(r#"{{"v":1,"retain_s":{}}}"#, 2 * DAY_S),
    )
    .await;
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "acme-checkout",
        "acme",
        &format!(
            r#"{{"v":1,"retain_s":{},"selector":[{{"key":"service.name","op":"=","value":"checkout"}}]}}"#,
            DAY_S
        ),
    )
    .await;
    // Traces only: must not touch logs.
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "traces",
        "",
        r#"{"v":1,"retain_s":3600,"signals":["traces"]}"#,
    )
    .await;
    let now = env.clock.now_ns() as u64;
    let day = DAY_S * 1_000_000_000;
    let want = expected(&env, |tenant, svc, t| {
        let retain = match (tenant, svc) {
            ("acme", "checkout") => day,
            ("acme", _) => 2 * day,
            _ => 3 * day,
        };
        t >= now - retain
    });
    let before = live_sorted(&env).await.len();
    assert!(
        want.len() < before && !want.is_empty(),
        "the rules must drop some rows and keep some"
    );
    let acme_checkout_1d = expected(&env, |tenant, svc, t| {
        tenant == "acme" && svc == "checkout" && t < now - day && t >= now - 2 * day
    });
    assert!(
        !acme_checkout_1d.is_empty(),
        "the corpus must have checkout rows a day old"
    );

    let c = env.compactor("c1");
    let report = c.run_until_idle().await.expect("enforce");
    assert!(report.lifecycle.errors.is_empty(), "{:?}", report.lifecycle.errors);
    assert!(report.lifecycle.dropped_blocks >= 4, "{report:?}");
    assert!(
        report.lifecycle.rewrites >= 1,
        "the selector rule rewrites acme's day-old blocks: {report:?}"
    );
    assert!(
        live_sorted(&env).await == want,
        "live rows differ from what the resolution keeps"
    );

    // Statuses for the operator: what each rule dropped.
    let policies = env
        .catalog
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .expect("list")
        .policies;
    let status = |name: &str| -> serde_json::Value {
        let p = policies.iter().find(|p| p.name == name).expect("policy");
        serde_json::from_str(&p.status_json).expect("status json")
    };
    assert!(status("default")["blocks_dropped"].as_u64().expect("count") >= 2);
    assert!(status("acme")["blocks_dropped"].as_u64().expect("count") >= 2);
    assert_eq!(status("traces")["blocks_matched"], 0);

    // After the grace only live objects remain (twice: the rewritten
    // blocks settle and go cold meanwhile, replacing them once more).
    for _ in 0..2 {
        env.manual.advance(Duration::from_secs(11 * 60));
        c.run_until_idle().await.expect("purge");
    }
    let live: HashSet<String> = env
        .blocks(pb::BlockState::Live)
        .await
        .into_iter()
        .map(|b| b.object_key)
        .collect();
    let keys: HashSet<String> = env.object_keys().await.into_iter().collect();
    assert_eq!(keys, live, "the bucket holds exactly the live objects");
    assert!(live_sorted(&env).await == want);
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_copies_blocks_frees_primaries_after_the_grace_and_retention_deletes_both() {
    let mut env = Env::new().await;
    let target_dir = env.dir.path().join("archive");
    let target_url = format!("file://{}", target_dir.display());
    for ago in [30, 54] {
        let hour = env.hour_start(ago);
        env.publish("acme", hour, 3, 40, ago * H).await;
    }
    let recent = env.hour_start(2);
    env.publish("acme", recent, 2, 40, 2 * H).await;
    let all_records = live_sorted(&env).await;
    let mut config = env.config("c1");
    config.offload.target_specs = vec![format!("archive={target_url}")];
    config.offload.min_age_ns = 0;
    config.offload.concurrency = 2;
    let process = mira_common::Process::new(env.clock.clone());
    let c =
        mira_compactor::Compactor::new(config, &process, env.store.clone(), env.catalog.clone()).expect("compactor");
    // The catalog refuses a policy naming a target no compactor has
    // registered; one round registers ours.
    let body = format!(r#"{{"v":1,"after_s":{},"target":"archive"}}"#, DAY_S);
    let refused = env
        .catalog
        .set_policy(pb::Policy {
            kind: pb::PolicyKind::Offload as i32,
            name: "archive-1d".into(),
            body_json: body.clone(),
            ..Default::default()
        })
        .await;
    assert!(refused.is_err(), "{refused:?}");
    c.run_round().await.expect("a round");
    set_policy(&env, pb::PolicyKind::Offload, "archive-1d", "acme", &body).await;
    let report = c.run_until_idle().await.expect("offload");
    assert!(report.lifecycle.errors.is_empty(), "{:?}", report.lifecycle.errors);
    let offloaded = env.blocks(pb::BlockState::Offloaded).await;
    assert_eq!(offloaded.len(), 2, "the two old hours, each one cold block");
    assert!(
        offloaded
            .iter()
            .all(|b| b.level == pb::Level::Cold as i32 && !b.primary_freed)
    );
    for b in &offloaded {
        let path = Path::from(b.object_key.as_str());
        let primary = env
            .store
            .get(&path)
            .await
            .expect("primary")
            .bytes()
            .await
            .expect("bytes");
        let copy = std::fs::read(target_dir.join(&b.object_key)).expect("the copy");
        assert!(copy == primary.to_vec(), "the copy equals the primary");
        assert_eq!(b.offload_sha256, sha256_hex(&copy));
        assert_eq!(b.offload_location, format!("{target_url}/{}", b.object_key));
    }
    // Queries see only the recent hour now.
    let recent_rows: usize = env.live_records().await.values().map(Vec::len).sum();
    assert_eq!(recent_rows, 80);

    // After the grace the primaries are deleted and recorded so.
    env.manual.advance(Duration::from_secs(11 * 60));
    let report = c.run_until_idle().await.expect("free");
    assert_eq!(report.primaries_freed, 2, "{report:?}");
    for b in env.blocks(pb::BlockState::Offloaded).await {
        assert!(b.primary_freed);
        let gone = env.store.head(&Path::from(b.object_key.as_str())).await;
        assert!(matches!(gone, Err(object_store::Error::NotFound { .. })), "{gone:?}");
        assert!(target_dir.join(&b.object_key).exists());
    }
    assert!(all_records.len() > recent_rows);

    // Retention of offloaded blocks deletes their copies after the grace.
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "short",
        "acme",
        &format!(r#"{{"v":1,"retain_s":{}}}"#, DAY_S),
    )
    .await;
    c.run_until_idle().await.expect("drop");
    assert!(env.blocks(pb::BlockState::Offloaded).await.is_empty());
    env.manual.advance(Duration::from_secs(11 * 60));
    c.run_until_idle().await.expect("purge");
    for b in &offloaded {
        assert!(!target_dir.join(&b.object_key).exists(), "copy of {} deleted", b.id);
    }
    assert_eq!(live_sorted(&env).await.len(), recent_rows);
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_rewrite_splits_rows_by_policy_class_so_retention_drops_whole_blocks() {
    let mut env = Env::new().await;
    let hour = env.hour_start(30);
    env.publish("acme", hour, 3, 60, 30 * H).await;
    let checkout = |days: u64| {
        format!(
            r#"{{"v":1,"retain_s":{},"selector":[{{"key":"service.name","op":"=","value":"checkout"}}]}}"#,
            days * DAY_S
        )
    };
    set_policy(
        &env,
        pb::PolicyKind::Retention,
        "acme",
        "acme",
        &format!(r#"{{"v":1,"retain_s":{}}}"#, 4 * DAY_S),
    )
    .await;
    set_policy(&env, pb::PolicyKind::Retention, "acme-checkout", "acme", &checkout(3)).await;
    let everything = live_sorted(&env).await;
    let c = env.compactor("c1");
    let report = c.run_until_idle().await.expect("cold rewrite");
    assert!(report.lifecycle.errors.is_empty(), "{:?}", report.lifecycle.errors);
    assert!(live_sorted(&env).await == everything, "the split keeps every row once");
    let live = env.blocks(pb::BlockState::Live).await;
    assert_eq!(live.len(), 2, "one cold block per class: {live:?}");
    assert!(live.iter().all(|b| b.level == pb::Level::Cold as i32));
    // Each block holds one class: checkout's resources, or the others.
    let mut checkout_blocks = 0;
    for b in &live {
        let bytes = env
            .store
            .get(&Path::from(b.object_key.as_str()))
            .await
            .expect("object")
            .bytes()
            .await
            .expect("bytes");
        let block =
            mira_core::block::Block::from_bytes(bytes, std::sync::Arc::new(mira_core::block::VerifyCache::new(4)))
                .expect("block");
        let services: HashSet<String> = mira_core::compact::filter::resource_summaries(&block)
            .expect("resources")
            .into_iter()
            .filter(|r| r.rows > 0)
            .filter_map(|r| r.attrs.into_iter().find(|(k, _)| k == "service.name").map(|(_, v)| v))
            .collect();
        if services.contains("checkout") {
            assert_eq!(services.len(), 1, "{services:?}");
            checkout_blocks += 1;
        }
    }
    assert_eq!(checkout_blocks, 1);
    // The checkout rule shortened: its block goes whole, nothing is rewritten.
    set_policy(&env, pb::PolicyKind::Retention, "acme-checkout", "acme", &checkout(1)).await;
    let report = c.run_until_idle().await.expect("retention");
    assert_eq!(
        (report.lifecycle.dropped_blocks, report.lifecycle.rewrites),
        (1, 0),
        "{report:?}"
    );
    let now = env.clock.now_ns() as u64;
    let want = expected(&env, |_, svc, t| svc != "checkout" || t >= now - DAY_S * 1_000_000_000);
    assert!(live_sorted(&env).await == want);
    env.node.shutdown().await;
}

/// Blocks in `hours_ago` hours offloaded by a compactor to a `file://`
/// target (primaries not yet freed); returns the compactor, the target's
/// directory and the offloaded blocks with their primaries' bytes.
async fn offloaded(
    env: &mut Env,
    hours_ago: &[i64],
) -> (
    std::sync::Arc<mira_compactor::Compactor>,
    std::path::PathBuf,
    Vec<(pb::Block, bytes::Bytes)>,
) {
    let target_dir = env.dir.path().join("archive");
    for &ago in hours_ago {
        let hour = env.hour_start(ago);
        env.publish("acme", hour, 1, 40, ago * H).await;
    }
    let mut config = env.config("c1");
    config.offload.target_specs = vec![format!("archive=file://{}", target_dir.display())];
    config.offload.min_age_ns = 0;
    let process = mira_common::Process::new(env.clock.clone());
    let c =
        mira_compactor::Compactor::new(config, &process, env.store.clone(), env.catalog.clone()).expect("compactor");
    c.run_round().await.expect("a round registers the target");
    let body = format!(r#"{{"v":1,"after_s":{},"target":"archive"}}"#, DAY_S);
    set_policy(env, pb::PolicyKind::Offload, "archive-1d", "acme", &body).await;
    let report = c.run_until_idle().await.expect("offload");
    assert!(report.lifecycle.errors.is_empty(), "{:?}", report.lifecycle.errors);
    let mut out = Vec::new();
    for b in env.blocks(pb::BlockState::Offloaded).await {
        let primary = env
            .store
            .get(&Path::from(b.object_key.as_str()))
            .await
            .expect("primary");
        out.push((b, primary.bytes().await.expect("bytes")));
    }
    out.sort_by_key(|(b, _)| b.min_time_ns);
    assert_eq!(out.len(), hours_ago.len());
    (c, target_dir, out)
}

fn verify_failures(c: &mira_compactor::Compactor, stage: &str, reason: &str) -> u64 {
    c.ctx()
        .metrics
        .offload_verify_failures
        .get_or_create(&mira_compactor::metrics::VerifyLabels {
            stage: stage.into(),
            reason: reason.into(),
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_short_or_missing_copy_keeps_its_primary_until_written_again_and_proven() {
    let mut env = Env::new().await;
    let (c, target_dir, blocks) = offloaded(&mut env, &[30, 54, 78]).await;
    // After the write (and the mark), the copies go bad in the target: one
    // bit flipped (same size), one truncated, one deleted.
    let copy = |b: &pb::Block| target_dir.join(&b.object_key);
    let mut flipped = std::fs::read(copy(&blocks[0].0)).expect("copy");
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x01;
    std::fs::write(copy(&blocks[0].0), &flipped).expect("flip");
    let short = std::fs::read(copy(&blocks[1].0)).expect("copy");
    std::fs::write(copy(&blocks[1].0), &short[..short.len() - 10]).expect("truncate");
    std::fs::remove_file(copy(&blocks[2].0)).expect("delete");

    env.manual.advance(Duration::from_secs(11 * 60));
    let report = c.run_round().await.expect("a round past the grace");
    assert_eq!((report.primaries_freed, report.primaries_kept), (0, 3), "{report:?}");
    for (b, bytes) in &blocks {
        let primary = env.store.get(&Path::from(b.object_key.as_str())).await.expect("kept");
        assert!(
            primary.bytes().await.expect("bytes") == *bytes,
            "the primary of {} is whole",
            b.id
        );
    }
    assert!(
        env.blocks(pb::BlockState::Offloaded)
            .await
            .iter()
            .all(|b| !b.primary_freed)
    );
    for reason in ["content", "size", "missing"] {
        assert_eq!(verify_failures(&c, "before_free", reason), 1, "{reason}");
    }
    // The copies were written again from the primaries; the next round
    // proves them and frees the primaries.
    let report = c.run_round().await.expect("the next round");
    assert_eq!((report.primaries_freed, report.primaries_kept), (3, 0), "{report:?}");
    for (b, bytes) in &blocks {
        assert!(
            std::fs::read(copy(b)).expect("copy") == bytes.to_vec(),
            "the copy of {} is whole",
            b.id
        );
        let gone = env.store.head(&Path::from(b.object_key.as_str())).await;
        assert!(matches!(gone, Err(object_store::Error::NotFound { .. })), "{gone:?}");
    }
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_found_at_the_target_is_reused_only_when_it_is_still_the_block() {
    let mut env = Env::new().await;
    let (c, target_dir, blocks) = offloaded(&mut env, &[30]).await;
    let (b, bytes) = &blocks[0];
    // Restored within the grace (the primary is still there), briefly
    // pinned; meanwhile its copy, kept in the target, changes.
    let targets = mira_compactor::targets::Targets::open(&[format!("archive=file://{}", target_dir.display())], &[])
        .expect("targets");
    let restorer =
        mira_compactor::restore::Restorer::new(env.catalog.clone(), env.store.clone(), targets, env.clock.clone());
    let sel = mira_compactor::restore::Selection {
        block_ids: vec![b.id.parse().expect("id")],
        ..Default::default()
    };
    let plan = restorer.plan(&sel).await.expect("plan");
    let opts = mira_compactor::restore::Options {
        keep_for: Duration::from_secs(60),
        ..Default::default()
    };
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let summary = restorer
        .run(&plan, &opts, &|_: &mira_compactor::restore::Event| {}, rx)
        .await;
    assert_eq!(summary.restored, 1, "{summary:?}");
    let copy = target_dir.join(&b.object_key);
    let mut flipped = bytes.to_vec();
    flipped[bytes.len() / 2] ^= 0x01;
    std::fs::write(&copy, &flipped).expect("flip");

    // Past the pin, the block is offloaded again: the changed copy is not
    // trusted but written again.
    env.manual.advance(Duration::from_secs(2 * 60));
    let report = c.run_until_idle().await.expect("offload again");
    assert!(report.lifecycle.errors.is_empty(), "{:?}", report.lifecycle.errors);
    assert_eq!(report.lifecycle.offloaded_blocks, 1, "{report:?}");
    assert!(
        std::fs::read(&copy).expect("copy") == bytes.to_vec(),
        "the copy is the block again"
    );
    assert_eq!(verify_failures(&c, "existing", "content"), 1);
    env.node.shutdown().await;
}
