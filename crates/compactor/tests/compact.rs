//! The compactor against a real single-member catalog and an in-memory
//! object store: hot merge, cold rewrite, purge after the grace, takeover
//! after a crashed holder, the orphan sweep, a corrupt input, and two
//! compactors at once. Every test checks the outcome that matters: the
//! live blocks hold exactly the records published, once each.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_core::block::path::block_path;
use mira_core::block::{Block, VerifyCache};
use mira_core::ids::{BlockId, Signal, TenantId};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_rewrites_cold_then_deletes_after_the_grace() {
    let mut env = Env::new().await;
    let old = env.hour_start(3);
    let recent = env.hour_start(0);
    env.publish("acme", old, 30, 40, 150 * MIN).await;
    env.publish("acme", recent, 20, 40, 2 * MIN).await;
    let c = env.compactor("c1");
    let report = c.run_until_idle().await.expect("test step");
    assert!(report.jobs_ok >= 2, "{report:?}");
    assert_eq!(report.jobs_failed, 0);

    let live = env.blocks(pb::BlockState::Live).await;
    let by_part = count_by_partition(&live);
    assert_eq!(by_part[&old].len(), 1, "the settled hour is one cold block");
    assert_eq!(by_part[&old][0].level, pb::Level::Cold as i32);
    assert_eq!(
        by_part[&recent].len(),
        1,
        "20 tiny recent blocks merge into one hot block"
    );
    assert_eq!(by_part[&recent][0].level, pb::Level::Hot as i32);
    env.assert_exactly_once().await;

    // The replaced blocks stay (tombstoned, objects kept) for the grace.
    let tomb = env.blocks(pb::BlockState::Tombstoned).await;
    assert_eq!(tomb.len(), 50);
    assert_eq!(env.object_keys().await.len(), 52);
    env.manual.advance(Duration::from_secs(11 * 60));
    let report = c.run_until_idle().await.expect("test step");
    assert_eq!(report.purged, 50);
    assert!(env.blocks(pb::BlockState::Tombstoned).await.is_empty());
    let mut live_keys: Vec<String> = live.iter().map(|b| b.object_key.clone()).collect();
    live_keys.sort();
    assert_eq!(
        env.object_keys().await,
        live_keys,
        "the bucket holds exactly the live objects"
    );
    env.assert_exactly_once().await;

    // A retried ingester publish of a purged input cannot bring it back.
    let again = tomb[0].clone();
    let refused = env
        .catalog
        .publish(
            vec![pb::Block {
                state: 0,
                tombstoned_at_ns: 0,
                ..again
            }],
            None,
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_output_is_removed_and_orphans_are_swept() {
    let mut env = Env::new().await;
    let recent = env.hour_start(0);
    let inputs = env.publish("acme", recent, 10, 20, 2 * MIN).await;
    // A compactor died after writing its manifest and its output.
    let dead_id = BlockId::new();
    let dead_key = block_path(
        &TenantId::new("acme").expect("test step"),
        Signal::Logs,
        inputs[0].min_time_ns as u64,
        dead_id,
    );
    env.store
        .put(&dead_key, PutPayload::from_static(b"half a merge"))
        .await
        .expect("test step");
    let manifest = format!(
        r#"{{"v":1,"kind":"merge","started_ns":1,"inputs":10,"outputs":[{{"id":"{dead_id}","key":"{dead_key}"}}]}}"#
    );
    let key = format!("part/acme/logs/{recent}");
    env.catalog
        .acquire_lease(&key, "dead/1", env.clock.now_ns(), 5_000, Some(manifest))
        .await
        .expect("test step");
    // An ingester's upload whose publish never happened.
    let orphan_id = BlockId::new();
    let orphan_key = block_path(
        &TenantId::new("acme").expect("test step"),
        Signal::Logs,
        inputs[0].min_time_ns as u64,
        orphan_id,
    );
    env.store
        .put(&orphan_key, PutPayload::from_static(b"never published"))
        .await
        .expect("test step");

    let c = env.compactor("c1");
    // While the dead holder's lease runs, its partition is left alone.
    let (plan, _) = c.plan().await.expect("test step");
    assert!(plan.jobs.is_empty());
    assert_eq!(plan.leased_elsewhere, 1);
    env.manual.advance(Duration::from_secs(10));
    c.run_until_idle().await.expect("test step");
    let keys = env.object_keys().await;
    assert!(
        !keys.contains(&dead_key.to_string()),
        "the dead holder's output is deleted"
    );
    assert!(keys.contains(&orphan_key.to_string()), "a young unknown object is kept");
    // The fenced id can never be committed.
    let late = pb::Block {
        id: dead_id.to_string(),
        object_key: dead_key.to_string(),
        ..inputs[0].clone()
    };
    assert!(env.catalog.publish(vec![late], None).await.is_err());
    env.assert_exactly_once().await;

    env.manual.advance(Duration::from_secs(2 * 3600));
    let swept = c.sweep().await.expect("test step");
    assert_eq!(swept.orphans_deleted, 1);
    assert!(!env.object_keys().await.contains(&orphan_key.to_string()));
    env.assert_exactly_once().await;
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_input_is_quarantined_and_other_partitions_go_on() {
    let mut env = Env::new().await;
    let a = env.hour_start(0);
    let b = env.hour_start(1);
    let in_a = env.publish("acme", a, 9, 20, 2 * MIN).await;
    env.publish("acme", b, 8, 20, 2 * MIN).await;
    // Flip a byte inside the first section of one block of partition a.
    let victim = &in_a[3];
    let path = Path::from(victim.object_key.as_str());
    let original = env
        .store
        .get(&path)
        .await
        .expect("test step")
        .bytes()
        .await
        .expect("test step");
    let first = Block::from_bytes(original.clone(), Arc::new(VerifyCache::new(8)))
        .expect("test step")
        .manifest()
        .sections[0]
        .clone();
    let mut bytes = original.to_vec();
    bytes[first.offset as usize + first.length as usize / 2] ^= 0xff;
    env.store.put(&path, PutPayload::from(bytes)).await.expect("test step");

    let c = env.compactor("c1");
    c.run_until_idle().await.expect("test step");
    let live = env.blocks(pb::BlockState::Live).await;
    let quarantined: Vec<&pb::Block> = live.iter().filter(|x| !x.no_compact_reason.is_empty()).collect();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].id, victim.id);
    assert!(
        quarantined[0].no_compact_reason.contains("crc") || quarantined[0].no_compact_reason.contains("CRC"),
        "{}",
        quarantined[0].no_compact_reason
    );
    let by_part = count_by_partition(&live);
    assert_eq!(by_part[&b].len(), 1, "the healthy partition merged");
    assert_eq!(
        by_part[&a].len(),
        2,
        "the other 8 merged; the corrupt block stays live, apart"
    );
    let rows: u64 = by_part[&a].iter().map(|x| x.rows).sum();
    assert_eq!(rows, in_a.iter().map(|x| x.rows).sum::<u64>());
    let metrics = c.status();
    assert_eq!(metrics.quarantined_blocks, 1);
    env.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compactors_at_once_never_both_commit() {
    let mut env = Env::new().await;
    for h in 0..4 {
        let start = env.hour_start(h);
        env.publish("acme", start, 12, 10, if h >= 2 { 150 * MIN } else { 2 * MIN })
            .await;
        env.publish("other", start, 9, 10, if h >= 2 { 150 * MIN } else { 2 * MIN })
            .await;
    }
    let (c1, c2) = (env.compactor("c1"), env.compactor("c2"));
    let (r1, r2) = tokio::join!(c1.run_until_idle(), c2.run_until_idle());
    let (r1, r2) = (r1.expect("test step"), r2.expect("test step"));
    assert!(r1.jobs_ok + r2.jobs_ok >= 8, "{r1:?} {r2:?}");
    let live = env.blocks(pb::BlockState::Live).await;
    // One object per (tenant, partition) at rest.
    let mut per: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for b in &live {
        *per.entry((b.tenant.clone(), b.partition_start_ns)).or_default() += 1;
    }
    assert!(per.values().all(|n| *n == 1), "{per:?}");
    // Every input was tombstoned by exactly one commit: the rows add up.
    let tomb = env.blocks(pb::BlockState::Tombstoned).await;
    assert_eq!(tomb.len(), 4 * 21);
    let mut sent = env.sent.clone();
    let mut got = env.live_records().await;
    for v in sent.values_mut().chain(got.values_mut()) {
        v.sort();
    }
    assert_eq!(got, sent);
    env.node.shutdown().await;
}
