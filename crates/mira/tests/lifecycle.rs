//! Offload as real processes: `mira compactor` on a test clock three days
//! ahead (so a minute-old block is days old to it), offloading to a
//! `file://` target under a policy set with `mira policy set`, killed
//! while copying, after the copies and between deleting primaries and
//! recording it (the `fault-hooks` build aborts there, as kill -9 would).
//! After each kill every acknowledged record is in exactly one live or
//! offloaded block, every offloaded block's copy hashes to what the
//! catalog recorded, and no block is both live and without its object; a
//! final run offloads everything and frees every primary.

#[path = "support/procs.rs"]
mod procs;

use std::collections::HashMap;
use std::sync::Arc;

use mira_catalog::proto as pb;
use mira_compactor::copy::sha256_hex;
use mira_core::block::{Block, VerifyCache};
use mira_testkit::http::{self, wait_ready};
use procs::{Procs, Role, child_exit, request};

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

fn flags(target: &str) -> Vec<String> {
    [
        "--min-block-age",
        "0s",
        "--plan-interval",
        "1s",
        "--partition-lease-ttl",
        "3s",
        "--deletion-grace",
        "0s",
        "--settle",
        "0s",
        "--cold-after",
        "1h",
        "--offload-min-age",
        "0s",
        "--offload-target",
        target,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Every block of the default tenant's logs in `states`.
async fn blocks(p: &Procs, states: &[pb::BlockState]) -> Vec<pb::Block> {
    p.client()
        .list_all_blocks(states)
        .await
        .expect("list blocks")
        .into_iter()
        .filter(|b| b.tenant == "default")
        .collect()
}

/// Bodies in an object's bytes, counted into `into`.
fn count_bodies(bytes: Vec<u8>, into: &mut HashMap<String, usize>) {
    let block = Block::from_bytes(bytes.into(), Arc::new(VerifyCache::new(8))).expect("a block");
    let tables = mira_core::tables::read_tables(&block, None).expect("tables");
    let req = mira_core::convert::logs_to_otlp(&tables).expect("otlp");
    for body in mira_testkit::flatten::log_bodies(&req) {
        *into.entry(body).or_insert(0) += 1;
    }
}

/// The invariants after any kill: records `rec-0..n` each in exactly one
/// live block (read from the primary) or offloaded block (read from its
/// copy, which hashes to the catalog's SHA-256); live blocks have their
/// object; a freed primary is gone.
async fn check(p: &Procs, archive: &std::path::Path, n: u64, when: &str) {
    let mut bodies = HashMap::new();
    for b in blocks(p, &[pb::BlockState::Live]).await {
        let bytes = std::fs::read(p.objects().join(&b.object_key))
            .unwrap_or_else(|e| panic!("{when}: live block {} has no object: {e}", b.id));
        count_bodies(bytes, &mut bodies);
    }
    for b in blocks(p, &[pb::BlockState::Offloaded]).await {
        let copy = std::fs::read(archive.join(&b.object_key))
            .unwrap_or_else(|e| panic!("{when}: offloaded block {} has no copy: {e}", b.id));
        assert_eq!(sha256_hex(&copy), b.offload_sha256, "{when}: copy of {}", b.id);
        assert_eq!(copy.len() as u64, b.bytes);
        if b.primary_freed {
            assert!(
                !p.objects().join(&b.object_key).exists(),
                "{when}: freed primary of {} still there",
                b.id
            );
        }
        count_bodies(copy, &mut bodies);
    }
    let dup: Vec<_> = bodies.iter().filter(|(_, c)| **c > 1).take(5).collect();
    assert!(dup.is_empty(), "{when}: records in two blocks: {dup:?}");
    let missing: Vec<String> = (0..n)
        .map(|i| format!("rec-{i}"))
        .filter(|b| !bodies.contains_key(b))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "{when}: acknowledged records in no block: {missing:?}"
    );
    assert_eq!(bodies.len() as u64, n, "{when}: records never acknowledged");
}

#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_killed_while_offloading_loses_nothing_and_a_rerun_finishes() {
    let mut p = Procs::with_ingester();
    let root = p.objects().parent().expect("root").to_path_buf();
    let archive = root.join("archive");
    let clock = root.join("clock");
    std::fs::write(&clock, "3d").expect("clock");
    let clock_env = clock.to_str().expect("path").to_owned();
    let target = format!("archive=file://{}", archive.display());
    let base = flags(&target);
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let c = p.add(Role::Compactor, &base);

    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let n = 300;
    for first in (0..n).step_by(100) {
        let answer = http::post(p.http(), "/v1/logs", &[PB], request(first, 100))
            .await
            .expect("the ingester answers");
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    p.stop_ingester();
    check(&p, &archive, n, "before offload").await;

    // The policy names the target, so the catalog takes it once a
    // compactor registered it (what `mira compactor` does on its first
    // round); `mira policy set` says so until then.
    let policy = |p: &Procs| {
        let catalogs = p.catalog_addrs().join(",");
        p.cli()
            .args([
                "policy",
                "set",
                "archive-1h",
                "--kind",
                "offload",
                "--catalog",
                &catalogs,
                "--after",
                "1h",
                "--target",
                "archive",
            ])
            .output()
            .expect("mira policy set")
    };
    let refused = policy(&p);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("policy field `target`"),
        "{refused:?}"
    );
    p.client()
        .register_offload_targets(vec!["archive".into()])
        .await
        .expect("register");
    let set = policy(&p);
    assert!(set.status.success(), "{set:?}");

    for step in ["during_offload", "after_offload_copy", "after_free_primary"] {
        p.start_with(
            c,
            &base,
            &[("MIRA_FAULT_COMPACTOR", step), ("MIRA_TEST_CLOCK_FILE", &clock_env)],
        );
        let mut child = p.take(c);
        let status = child_exit(&mut child, step);
        assert!(!status.success(), "{step}: the fault hook did not fire ({status:?})");
        check(&p, &archive, n, step).await;
    }
    let mut once = base.clone();
    once.push("--once");
    p.start_with(c, &once, &[("MIRA_TEST_CLOCK_FILE", &clock_env)]);
    let mut child = p.take(c);
    assert!(child_exit(&mut child, "final run").success());
    check(&p, &archive, n, "after the final run").await;
    assert!(
        blocks(&p, &[pb::BlockState::Live]).await.is_empty(),
        "everything is past the rule"
    );
    let offloaded = blocks(&p, &[pb::BlockState::Offloaded]).await;
    assert!(!offloaded.is_empty());
    assert!(
        offloaded.iter().all(|b| b.primary_freed),
        "every primary freed after the grace"
    );
}
