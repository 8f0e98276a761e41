use mira_core::block::path::block_path;
use mira_core::ids::{BlockId, Signal, TenantId};

use super::*;
use crate::error::{ErrorCode, ServiceError};
use crate::model::{Level, PolicyKind, ReplaceReason};

const HOUR: i64 = 3_600_000_000_000;

fn id(n: u128) -> BlockId {
    BlockId::from_u128(n)
}

fn id_list(ns: &[u128]) -> Vec<BlockId> {
    ns.iter().copied().map(id).collect()
}

fn block(n: u128, tenant: &str, min: i64, max: i64) -> BlockRecord {
    let t = TenantId::new(tenant).expect("tenant");
    let key = block_path(&t, Signal::Logs, min as u64, id(n));
    BlockRecord {
        id: id(n),
        tenant: t,
        signal: Signal::Logs,
        partition_start_ns: min - min % HOUR,
        min_time_ns: min,
        max_time_ns: max,
        rows: 10,
        bytes: 100,
        level: Level::Hot,
        object_key: key.to_string(),
        created_at_ns: 1,
        state: BlockState::Live,
        no_compact: None,
        offload: None,
    }
}

fn publish(blocks: Vec<BlockRecord>) -> Command {
    Command::Publish {
        blocks,
        watermark: None,
    }
}

impl State {
    fn apply_clone_rejects_publish(&self, b: BlockRecord) -> bool {
        self.clone().apply(&publish(vec![b])).is_err()
    }
}

fn ids(state: &State, tenant: &str, min: i64, max: i64, states: &[StateKind]) -> Vec<u128> {
    let tenant = TenantId::new(tenant).expect("tenant");
    state
        .list_blocks(&tenant, Signal::Logs, min, max, states)
        .iter()
        .map(|b| b.id.as_u128())
        .collect()
}

#[test]
fn publish_is_idempotent_and_rejects_a_different_block_under_the_same_id() {
    let mut s = State::new();
    let b = block(1, "t", 10 * HOUR, 10 * HOUR + 5);
    assert_eq!(s.apply(&publish(vec![b.clone()])).expect("first").changes.len(), 1);
    assert!(s.apply(&publish(vec![b.clone()])).expect("again").changes.is_empty());
    let mut other = b.clone();
    other.rows = 11;
    assert!(matches!(
        s.apply(&publish(vec![other])),
        Err(CommandError::AlreadyExists { .. })
    ));
    assert_eq!(s.block_count(), 1);
    assert_eq!(s.block(id(1)).expect("kept").rows, 10);
}

#[test]
fn a_rejected_publish_applies_nothing() {
    let mut s = State::new();
    s.apply(&publish(vec![block(1, "t", 0, 5)])).expect("first");
    let mut clash = block(1, "t", 0, 5);
    clash.bytes = 7;
    let err = s.apply(&publish(vec![block(2, "t", 0, 5), clash])).expect_err("clash");
    assert!(matches!(err, CommandError::AlreadyExists { .. }));
    assert!(s.block(id(2)).is_none(), "half a command must not be applied");
}

#[test]
fn watermarks_only_advance() {
    let mut s = State::new();
    let wm = |seq| Watermark {
        ingester_id: "i-0".into(),
        shard: 3,
        wal_seq: seq,
    };
    s.apply(&Command::Publish {
        blocks: vec![block(1, "t", 0, 1)],
        watermark: Some(wm(10)),
    })
    .expect("publish");
    let err = s
        .apply(&Command::Publish {
            blocks: vec![block(2, "t", 0, 1)],
            watermark: Some(wm(9)),
        })
        .expect_err("regression");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(s.block(id(2)).is_none());
    // The retry of the first publish is accepted and changes nothing.
    let again = s
        .apply(&Command::Publish {
            blocks: vec![block(1, "t", 0, 1)],
            watermark: Some(wm(10)),
        })
        .expect("retry");
    assert!(again.changes.is_empty());
    assert_eq!(s.watermarks(Some("i-0"))[0].wal_seq, 10);
}

#[test]
fn replace_is_atomic_and_only_one_of_two_racing_replaces_wins() {
    let mut s = State::new();
    s.apply(&publish((1..=4).map(|i| block(i, "t", 0, 10)).collect()))
        .expect("seed");
    let a = Command::Replace {
        add: vec![block(10, "t", 0, 10)],
        tombstone: id_list(&[1, 2, 3]),
        now_ns: 5,
        lease: None,
    };
    let b = Command::Replace {
        add: vec![block(11, "t", 0, 10)],
        tombstone: id_list(&[3, 4]),
        now_ns: 5,
        lease: None,
    };
    s.apply(&a).expect("first wins");
    let err = s.apply(&b).expect_err("second loses");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(s.block(id(11)).is_none());
    assert_eq!(s.block(id(4)).expect("4").state, BlockState::Live);
    assert_eq!(ids(&s, "t", 0, 10, &[StateKind::Live]), vec![4, 10]);
    // Retrying the winner is accepted without change.
    assert!(s.apply(&a).expect("retry").changes.is_empty());
}

#[test]
fn replace_of_unknown_blocks_is_not_found() {
    let mut s = State::new();
    let err = s
        .apply(&Command::Replace {
            add: vec![block(10, "t", 0, 10)],
            tombstone: id_list(&[99]),
            now_ns: 5,
            lease: None,
        })
        .expect_err("unknown");
    assert_eq!(err.error_code(), ErrorCode::NotFound);
    assert_eq!(s.block_count(), 0);
}

#[test]
fn lifecycle_tombstone_purge_offload_restore() {
    let mut s = State::new();
    s.apply(&publish(vec![block(1, "t", 0, 1), block(2, "t", 0, 1)]))
        .expect("seed");
    assert_eq!(
        s.apply(&Command::Purge { ids: id_list(&[1]) })
            .expect_err("live")
            .error_code(),
        ErrorCode::Conflict
    );
    s.apply(&Command::Tombstone {
        ids: id_list(&[1]),
        now_ns: 7,
    })
    .expect("tombstone");
    assert_eq!(s.block(id(1)).expect("1").state, BlockState::Tombstoned { at_ns: 7 });
    s.apply(&Command::Purge { ids: id_list(&[1]) }).expect("purge");
    assert!(s.block(id(1)).is_none());
    s.apply(&Command::MarkOffloaded {
        id: id(2),
        location: "s3://cold/x".into(),
    })
    .expect("offload");
    assert!(ids(&s, "t", 0, 1, &[StateKind::Live]).is_empty());
    assert_eq!(ids(&s, "t", 0, 1, &[StateKind::Offloaded]), vec![2]);
    s.apply(&Command::MarkRestored { id: id(2) }).expect("restore");
    assert_eq!(ids(&s, "t", 0, 1, &[StateKind::Live]), vec![2]);
    assert_eq!(
        s.counts(),
        [
            (StateKind::Live, 1),
            (StateKind::Tombstoned, 0),
            (StateKind::Offloaded, 0)
        ]
    );
}

#[test]
fn leases_use_the_command_time() {
    let mut s = State::new();
    let acquire = |holder: &str, now| Command::AcquireLease {
        key: "compact/t/logs".into(),
        holder: holder.into(),
        now_ns: now,
        ttl_ms: 1_000,
    };
    let l = s.apply(&acquire("a", 0)).expect("a").lease.expect("lease");
    assert_eq!(l.expires_at_ns, 1_000_000_000);
    assert_eq!(
        s.apply(&acquire("b", 999_999_999)).expect_err("held").error_code(),
        ErrorCode::Conflict
    );
    // Expired at the command's time: b takes it.
    assert_eq!(
        s.apply(&acquire("b", 1_000_000_000))
            .expect("b")
            .lease
            .expect("l")
            .holder,
        "b"
    );
    let renew_a = Command::RenewLease {
        key: "compact/t/logs".into(),
        holder: "a".into(),
        now_ns: 1_000_000_001,
        ttl_ms: 1_000,
    };
    assert!(s.apply(&renew_a).is_err());
    assert!(
        s.apply(&Command::ReleaseLease {
            key: "compact/t/logs".into(),
            holder: "a".into()
        })
        .is_err()
    );
    s.apply(&Command::ReleaseLease {
        key: "compact/t/logs".into(),
        holder: "b".into(),
    })
    .expect("release");
    assert!(s.leases().is_empty());
}

#[test]
fn ingester_heartbeats_and_expiry() {
    let mut s = State::new();
    let hb = |now, ttl| Command::Heartbeat {
        ingester_id: "i-0".into(),
        address: "10.0.0.1:4400".into(),
        now_ns: now,
        ttl_ms: ttl,
    };
    s.apply(&hb(0, 1_000)).expect("hb");
    assert_eq!(s.live_ingesters(500_000_000).len(), 1);
    assert!(s.live_ingesters(1_000_000_000).is_empty());
    s.apply(&hb(2_000_000_000, 1_000)).expect("hb");
    assert_eq!(s.live_ingesters(2_500_000_000).len(), 1);
    s.apply(&hb(2_100_000_000, 0)).expect("leave");
    assert!(s.live_ingesters(2_500_000_000).is_empty());
}

#[test]
fn policies_are_validated() {
    let mut s = State::new();
    let set = |body: &str| {
        Command::SetPolicy(Policy {
            kind: PolicyKind::Retention,
            name: "default".into(),
            tenant: String::new(),
            body_json: body.into(),
        })
    };
    assert_eq!(
        s.apply(&set("[1]")).expect_err("not object").error_code(),
        ErrorCode::BadRequest
    );
    assert_eq!(
        s.apply(&set("{")).expect_err("bad json").error_code(),
        ErrorCode::BadRequest
    );
    let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(crate::model::MAX_POLICY_BYTES));
    assert_eq!(
        s.apply(&set(&huge)).expect_err("huge").error_code(),
        ErrorCode::BadRequest
    );
    s.apply(&set(r#"{"days": 7}"#)).expect("ok");
    assert_eq!(s.policies(None).len(), 1);
    let delete = Command::DeletePolicy {
        kind: PolicyKind::Retention,
        name: "default".into(),
    };
    assert_eq!(s.apply(&delete).expect("delete").changes.len(), 1);
    assert!(s.apply(&delete).expect("a retried delete succeeds").changes.is_empty());
    assert!(s.policies(None).is_empty());
}

#[test]
fn retried_purges_succeed_and_purged_ids_stay_dead() {
    let mut s = State::new();
    s.apply(&publish(vec![block(1, "t", 0, 1)])).expect("seed");
    s.apply(&Command::Tombstone {
        ids: id_list(&[1]),
        now_ns: 1,
    })
    .expect("tombstone");
    s.apply(&Command::Purge { ids: id_list(&[1]) }).expect("purge");
    assert!(
        s.apply(&Command::Purge { ids: id_list(&[1]) })
            .expect("retry")
            .changes
            .is_empty()
    );
    assert_eq!(
        s.apply(&Command::Purge { ids: id_list(&[2]) })
            .expect_err("never known")
            .error_code(),
        ErrorCode::NotFound
    );
    let err = s.apply(&publish(vec![block(1, "t", 0, 1)])).expect_err("resurrect");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(s.block(id(1)).is_none());
    // The memory survives a snapshot.
    let back = State::from_image(s.to_image());
    assert!(back.apply_clone_rejects_publish(block(1, "t", 0, 1)));
}

#[test]
fn a_retried_tombstone_only_replace_succeeds() {
    let mut s = State::new();
    s.apply(&publish(vec![block(1, "t", 0, 1), block(2, "t", 0, 1)]))
        .expect("seed");
    let r = Command::Replace {
        add: vec![],
        tombstone: id_list(&[1, 2]),
        now_ns: 3,
        lease: None,
    };
    assert_eq!(s.apply(&r).expect("first").changes.len(), 2);
    assert!(s.apply(&r).expect("retry").changes.is_empty());
}

#[test]
fn bad_blocks_are_rejected_with_the_field_named() {
    let mut s = State::new();
    let mut cases = Vec::new();
    let mut b = block(1, "t", HOUR, HOUR + 5);
    b.min_time_ns = -1;
    cases.push((b, "min_time_ns"));
    let mut b = block(1, "t", HOUR, HOUR + 5);
    b.max_time_ns = HOUR - 1;
    cases.push((b, "max_time_ns"));
    let mut b = block(1, "t", HOUR, HOUR + 5);
    b.object_key = "t/logs/1970-01-01/01/01ARZ3NDEKTSV4RRFFQ69G5FAV.mira".into();
    cases.push((b, "object_key"));
    let mut b = block(1, "t", HOUR, HOUR + 5);
    b.rows = 0;
    cases.push((b, "rows"));
    let mut b = block(1, "t", HOUR, HOUR + 5);
    b.partition_start_ns = 0;
    cases.push((b, "partition_start_ns"));
    for (b, field) in cases {
        let err = s.apply(&publish(vec![b])).expect_err(field);
        assert_eq!(err.error_code(), ErrorCode::BadRequest, "{field}");
        assert!(err.to_string().contains(field), "{err} should name {field}");
    }
    assert_eq!(s.block_count(), 0);
}

#[test]
fn list_finds_overlapping_blocks_including_long_ones() {
    let mut s = State::new();
    s.apply(&publish(vec![
        block(1, "t", 0, HOUR - 1),
        block(2, "t", HOUR, 2 * HOUR - 1),
        // A compacted block spanning five hours, and a wide one (60 days).
        block(3, "t", 2 * HOUR, 7 * HOUR),
        block(5, "t", 3 * HOUR, 3 * HOUR + 60 * 24 * HOUR),
        block(4, "u", HOUR, HOUR + 1),
    ]))
    .expect("seed");
    assert_eq!(ids(&s, "t", HOUR, HOUR, &[StateKind::Live]), vec![2]);
    assert_eq!(ids(&s, "t", 6 * HOUR, 6 * HOUR + 1, &[StateKind::Live]), vec![3, 5]);
    assert_eq!(ids(&s, "t", 0, 10 * HOUR, &[StateKind::Live]), vec![1, 2, 3, 5]);
    assert_eq!(ids(&s, "t", 8 * HOUR, 9 * HOUR, &[StateKind::Live]), vec![5]);
    assert!(ids(&s, "t", 62 * 24 * HOUR, 63 * 24 * HOUR, &[StateKind::Live]).is_empty());
    // Purging the wide block takes it out of the listing.
    s.apply(&Command::Tombstone {
        ids: id_list(&[5]),
        now_ns: 1,
    })
    .expect("tombstone");
    s.apply(&Command::Purge { ids: id_list(&[5]) }).expect("purge");
    assert!(ids(&s, "t", 8 * HOUR, 9 * HOUR, &[StateKind::Live, StateKind::Tombstoned]).is_empty());
}

#[test]
fn image_roundtrip_keeps_everything() {
    let mut s = State::new();
    s.apply(&Command::Publish {
        blocks: vec![block(1, "t", 0, 1), block(2, "t", 5, 9)],
        watermark: Some(Watermark {
            ingester_id: "i".into(),
            shard: 0,
            wal_seq: 4,
        }),
    })
    .expect("publish");
    s.apply(&Command::Tombstone {
        ids: id_list(&[2]),
        now_ns: 3,
    })
    .expect("t");
    s.apply(&Command::AcquireLease {
        key: "k".into(),
        holder: "h".into(),
        now_ns: 0,
        ttl_ms: 5,
    })
    .expect("lease");
    let back = State::from_image(
        crate::state_machine::decode_image(&crate::state_machine::encode_image(&s.to_image()).expect("enc"))
            .expect("dec"),
    );
    assert_eq!(back.as_changes(), s.as_changes());
    assert_eq!(back.counts(), s.counts());
}

fn fenced(epoch: u64, blocks: Vec<BlockRecord>, seq: u64, txn: Option<u128>) -> Command {
    Command::FencedPublish {
        ingester_id: "i".into(),
        epoch,
        blocks,
        watermark: Some(Watermark {
            ingester_id: "i".into(),
            shard: 0,
            wal_seq: seq,
        }),
        txn,
    }
}

#[test]
fn a_fenced_epoch_can_no_longer_publish_or_stage() {
    let mut s = State::new();
    let first = s
        .apply(&Command::Fence {
            ingester_id: "i".into(),
        })
        .expect("fence");
    assert_eq!(first.epoch, Some(1));
    s.apply(&fenced(1, vec![block(1, "t", 0, 1)], 5, None))
        .expect("epoch 1 publishes");
    // A second process takes the id over.
    assert_eq!(
        s.apply(&Command::Fence {
            ingester_id: "i".into()
        })
        .expect("fence")
        .epoch,
        Some(2)
    );
    let err = s
        .apply(&fenced(1, vec![block(2, "t", 0, 1)], 6, None))
        .expect_err("old epoch refused");
    assert!(err.to_string().contains("fenced"), "{err}");
    assert!(s.block(id(2)).is_none());
    assert_eq!(s.watermarks(Some("i"))[0].wal_seq, 5);
    let stage = Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 77,
        blocks: vec![block(3, "t", 0, 1)],
    };
    assert!(s.apply(&stage).is_err());
    // Another ingester's epochs are its own.
    assert_eq!(
        s.apply(&Command::Fence {
            ingester_id: "j".into()
        })
        .expect("fence j")
        .epoch,
        Some(1)
    );
}

#[test]
fn staged_blocks_are_unlisted_until_the_commit_and_a_fence_drops_them() {
    let mut s = State::new();
    s.apply(&Command::Fence {
        ingester_id: "i".into(),
    })
    .expect("fence");
    let stage = |blocks| Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 9,
        blocks,
    };
    s.apply(&stage(vec![block(1, "t", 0, 1), block(2, "u", 0, 1)]))
        .expect("chunk 1");
    // A retried chunk is a no-op; a different block under a staged id is not.
    s.apply(&stage(vec![block(1, "t", 0, 1)])).expect("retry");
    let mut other = block(1, "t", 0, 1);
    other.rows = 99;
    assert!(s.apply(&stage(vec![other])).is_err());
    s.apply(&stage(vec![block(3, "v", 0, 1)])).expect("chunk 2");
    assert!(
        ids(&s, "t", 0, 10, &[StateKind::Live]).is_empty(),
        "staged is not listed"
    );
    assert_eq!(s.staged(9).expect("staged").blocks.len(), 3);
    // The image carries staged publishes and epochs across a snapshot.
    let mut s = State::from_image(s.to_image());
    let commit = fenced(1, vec![block(4, "w", 0, 1)], 40, Some(9));
    let applied = s.apply(&commit).expect("commit");
    assert_eq!(applied.changes.len(), 5, "watermark + 4 blocks");
    assert_eq!(ids(&s, "t", 0, 10, &[StateKind::Live]), vec![1]);
    assert_eq!(ids(&s, "w", 0, 10, &[StateKind::Live]), vec![4]);
    assert!(s.staged(9).is_none());
    // A retried commit after success changes nothing.
    assert!(s.apply(&commit).expect("retry").changes.is_empty());

    // A fence drops what was staged: a half-staged publish of a crashed
    // process never becomes live.
    s.apply(&Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 10,
        blocks: vec![block(5, "t", 0, 1)],
    })
    .expect("stage");
    s.apply(&Command::Fence {
        ingester_id: "i".into(),
    })
    .expect("fence");
    assert!(s.staged(10).is_none());
    let err = s.apply(&fenced(2, vec![], 50, Some(10))).expect_err("dropped stage");
    assert_eq!(err.error_code(), ErrorCode::NotFound);
    assert!(s.block(id(5)).is_none());
    assert_eq!(s.epoch("i"), 2);
}

#[test]
fn a_retried_commit_without_a_watermark_is_recognised() {
    // `--wal off` publishes carry no watermark: the blocks of the last
    // command tell a retry after a lost answer from a dropped stage.
    let mut s = State::new();
    s.apply(&Command::Fence {
        ingester_id: "i".into(),
    })
    .expect("fence");
    s.apply(&Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 5,
        blocks: vec![block(1, "t", 0, 1)],
    })
    .expect("stage");
    let commit = Command::FencedPublish {
        ingester_id: "i".into(),
        epoch: 1,
        blocks: vec![block(2, "u", 0, 1)],
        watermark: None,
        txn: Some(5),
    };
    assert_eq!(s.apply(&commit).expect("commit").changes.len(), 2);
    assert!(s.apply(&commit).expect("retry").changes.is_empty());
    // A commit whose last blocks are not in was never applied: its stage
    // is gone (a fence), so it is refused rather than half applied.
    let other = Command::FencedPublish {
        ingester_id: "i".into(),
        epoch: 1,
        blocks: vec![block(3, "u", 0, 1)],
        watermark: None,
        txn: Some(5),
    };
    assert_eq!(
        s.apply(&other).expect_err("unknown stage").error_code(),
        ErrorCode::NotFound
    );
    assert!(s.block(id(3)).is_none());
}

#[test]
fn a_whole_chunked_publish_retried_after_a_lost_commit_answer_changes_nothing() {
    // The ingester retries the whole publish (stages, then commit) when
    // the commit's answer is lost: staging what is live already is a no-op
    // and the commit is recognised, instead of a refusal that would
    // quarantine a published generation.
    let mut s = State::new();
    s.apply(&Command::Fence {
        ingester_id: "i".into(),
    })
    .expect("fence");
    let stage = Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 7,
        blocks: vec![block(1, "t", 0, 1), block(2, "t", 0, 1)],
    };
    let commit = fenced(1, vec![block(3, "u", 0, 1)], 9, Some(7));
    s.apply(&stage).expect("stage");
    assert_eq!(s.apply(&commit).expect("commit").changes.len(), 4);
    assert!(s.apply(&stage).expect("stage again").changes.is_empty());
    assert!(s.staged(7).is_none(), "nothing staged twice");
    assert!(s.apply(&commit).expect("commit again").changes.is_empty());
    assert_eq!(ids(&s, "t", 0, 10, &[StateKind::Live]), vec![1, 2]);
    // A different block under a live id is still refused.
    let mut other = block(1, "t", 0, 1);
    other.rows = 1234;
    let clash = Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 8,
        blocks: vec![other],
    };
    assert_eq!(
        s.apply(&clash).expect_err("clash").error_code(),
        ErrorCode::AlreadyExists
    );
}

// ---- compactor additions: ReplaceV2, Abandon, quarantine, lease jobs ----

const PART_KEY: &str = "part/t/logs/36000000000000";

fn rows(mut b: BlockRecord, rows: u64) -> BlockRecord {
    b.rows = rows;
    b
}

fn acquire_job(key: &str, holder: &str, now_ns: i64, ttl_ms: i64, job: Option<&str>) -> Command {
    Command::AcquireLeaseJob {
        key: key.into(),
        holder: holder.into(),
        now_ns,
        ttl_ms,
        job: job.map(str::to_owned),
    }
}

fn renew_job(key: &str, holder: &str, now_ns: i64, ttl_ms: i64, job: Option<&str>) -> Command {
    Command::RenewLeaseJob {
        key: key.into(),
        holder: holder.into(),
        now_ns,
        ttl_ms,
        job: job.map(str::to_owned),
    }
}

fn replace_v2(add: Vec<BlockRecord>, tombstone: &[u128], now_ns: i64, holder: &str) -> Command {
    Command::ReplaceV2 {
        add,
        tombstone: id_list(tombstone),
        now_ns,
        lease_key: PART_KEY.into(),
        lease_holder: holder.into(),
        reason: ReplaceReason::Merge,
        dropped_rows: 0,
    }
}

/// Blocks 1..=3 of tenant t, partition 10 h, 10 rows each, and the
/// partition's lease held by "c" from 0 for 60 s.
fn compactable() -> State {
    let mut s = State::new();
    s.apply(&publish(
        (1..=3)
            .map(|i| block(i, "t", 10 * HOUR + i as i64, 10 * HOUR + 100))
            .collect(),
    ))
    .expect("seed");
    s.apply(&acquire_job(PART_KEY, "c", 0, 60_000, None)).expect("lease");
    s
}

fn out(n: u128, rows_: u64) -> BlockRecord {
    rows(block(n, "t", 10 * HOUR + 1, 10 * HOUR + 100), rows_)
}

#[test]
fn replace_v2_swaps_under_the_lease_and_a_retry_changes_nothing() {
    let mut s = compactable();
    let cmd = replace_v2(vec![out(10, 20)], &[1, 2], 5, "c");
    assert_eq!(s.apply(&cmd).expect("swap").changes.len(), 3);
    assert_eq!(ids(&s, "t", 0, 20 * HOUR, &[StateKind::Live]), vec![10, 3]);
    assert_eq!(s.block(id(1)).expect("1").state, BlockState::Tombstoned { at_ns: 5 });
    let before = s.to_image();
    // The retry is accepted, even after the lease is gone.
    s.apply(&Command::ReleaseLease {
        key: PART_KEY.into(),
        holder: "c".into(),
    })
    .expect("release");
    assert!(s.apply(&cmd).expect("retry").changes.is_empty());
    let after = s.to_image();
    assert_eq!((after.blocks, after.purged), (before.blocks, before.purged));
}

#[test]
fn replace_v2_needs_the_lease_held_by_the_caller_at_its_time() {
    let mut s = compactable();
    let err = s
        .apply(&replace_v2(vec![out(10, 10)], &[1], 5, "other"))
        .expect_err("other holder");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(err.to_string().contains("held by \"c\""), "{err}");
    let err = s
        .apply(&replace_v2(vec![out(10, 10)], &[1], 60_000_000_000, "c"))
        .expect_err("expired");
    assert!(err.to_string().contains("expired"), "{err}");
    s.apply(&Command::ReleaseLease {
        key: PART_KEY.into(),
        holder: "c".into(),
    })
    .expect("release");
    let err = s
        .apply(&replace_v2(vec![out(10, 10)], &[1], 5, "c"))
        .expect_err("not held");
    assert!(err.to_string().contains("not held"), "{err}");
    assert!(s.block(id(10)).is_none());
    assert_eq!(ids(&s, "t", 0, 20 * HOUR, &[StateKind::Live]), vec![1, 2, 3]);
    // The lease is required.
    let mut no_lease = replace_v2(vec![out(10, 10)], &[1], 5, "c");
    if let Command::ReplaceV2 { lease_key, .. } = &mut no_lease {
        lease_key.clear();
    }
    let err = s.apply(&no_lease).expect_err("no lease");
    assert_eq!(err.error_code(), ErrorCode::BadRequest);
    assert!(err.to_string().contains("lease_key"), "{err}");
}

#[test]
fn replace_v2_checks_its_shape_before_the_state() {
    let mut s = compactable();
    let cases = [
        (replace_v2(vec![], &[1], 5, "c"), "add"),
        (replace_v2(vec![out(10, 10)], &[], 5, "c"), "tombstone"),
        (
            Command::ReplaceV2 {
                add: vec![out(10, 9)],
                tombstone: id_list(&[1]),
                now_ns: 5,
                lease_key: PART_KEY.into(),
                lease_holder: "c".into(),
                reason: ReplaceReason::Cold,
                dropped_rows: 1,
            },
            "dropped_rows",
        ),
        (
            replace_v2(
                vec![out(10, 5), rows(block(11, "t", 11 * HOUR, 11 * HOUR + 1), 5)],
                &[1],
                5,
                "c",
            ),
            "partition",
        ),
    ];
    for (cmd, needle) in cases {
        let err = s.apply(&cmd).expect_err(needle);
        assert_eq!(err.error_code(), ErrorCode::BadRequest, "{needle}");
        assert!(err.to_string().contains(needle), "{err} should name {needle}");
    }
    assert_eq!(ids(&s, "t", 0, 20 * HOUR, &[StateKind::Live]), vec![1, 2, 3]);
}

#[test]
fn replace_v2_stays_in_one_partition() {
    let mut s = compactable();
    s.apply(&publish(vec![
        block(4, "t", 11 * HOUR, 11 * HOUR + 1),
        block(5, "u", 10 * HOUR + 1, 10 * HOUR + 2),
    ]))
    .expect("other partitions");
    for other in [4, 5] {
        let err = s
            .apply(&replace_v2(vec![out(10, 20)], &[1, other], 5, "c"))
            .expect_err("two partitions");
        assert_eq!(err.error_code(), ErrorCode::BadRequest);
        let msg = err.to_string();
        assert!(
            msg.contains(&id(10).to_string()) && msg.contains(&id(other).to_string()),
            "{msg}"
        );
    }
    // Outputs in another partition than their inputs.
    let err = s
        .apply(&replace_v2(
            vec![rows(block(10, "t", 11 * HOUR, 11 * HOUR + 1), 10)],
            &[1],
            5,
            "c",
        ))
        .expect_err("moved partition");
    assert!(err.to_string().contains(&id(1).to_string()), "{err}");
    assert!(s.block(id(10)).is_none());
}

#[test]
fn replace_v2_conserves_rows() {
    let mut s = compactable();
    let err = s
        .apply(&replace_v2(vec![out(10, 19)], &[1, 2], 5, "c"))
        .expect_err("a row lost");
    assert_eq!(err.error_code(), ErrorCode::BadRequest);
    let msg = err.to_string();
    assert!(
        msg.contains("hold 20 rows") && msg.contains("19 plus 0 dropped"),
        "{msg}"
    );
    let err = s
        .apply(&replace_v2(vec![out(10, 21)], &[1, 2], 5, "c"))
        .expect_err("a row doubled");
    assert!(err.to_string().contains("21 plus 0"), "{err}");
    assert!(s.block(id(10)).is_none());
    // A retention rewrite accounts for what it drops.
    let retention = Command::ReplaceV2 {
        add: vec![out(10, 15)],
        tombstone: id_list(&[1, 2]),
        now_ns: 5,
        lease_key: PART_KEY.into(),
        lease_holder: "c".into(),
        reason: ReplaceReason::RetentionRewrite,
        dropped_rows: 5,
    };
    s.apply(&retention).expect("balanced with drops");
    assert_eq!(s.block(id(10)).expect("10").rows, 15);
}

#[test]
fn replace_v2_never_adds_a_known_purged_or_abandoned_id() {
    let mut s = compactable();
    s.apply(&Command::Abandon { ids: id_list(&[10]) }).expect("abandon");
    let err = s
        .apply(&replace_v2(vec![out(10, 10)], &[1], 5, "c"))
        .expect_err("abandoned");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(err.to_string().contains("purged or abandoned"), "{err}");
    // Purged after a life in the catalog.
    s.apply(&publish(vec![block(11, "t", 10 * HOUR + 1, 10 * HOUR + 2)]))
        .expect("11");
    s.apply(&Command::Tombstone {
        ids: id_list(&[11]),
        now_ns: 1,
    })
    .expect("tombstone");
    s.apply(&Command::Purge { ids: id_list(&[11]) }).expect("purge");
    let err = s
        .apply(&replace_v2(vec![out(11, 10)], &[1], 5, "c"))
        .expect_err("purged");
    assert!(err.to_string().contains("purged or abandoned"), "{err}");
    // A live id under a different block.
    let err = s.apply(&replace_v2(vec![out(3, 10)], &[1], 5, "c")).expect_err("known");
    assert_eq!(err.error_code(), ErrorCode::AlreadyExists);
    assert_eq!(ids(&s, "t", 0, 20 * HOUR, &[StateKind::Live]), vec![1, 2, 3]);
}

#[test]
fn replace_v2_refuses_quarantined_inputs() {
    let mut s = compactable();
    s.apply(&Command::MarkNoCompact {
        ids: id_list(&[2]),
        reason: "section checksum mismatch".into(),
    })
    .expect("mark");
    let err = s
        .apply(&replace_v2(vec![out(10, 20)], &[1, 2], 5, "c"))
        .expect_err("quarantined");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    let msg = err.to_string();
    assert!(
        msg.contains(&id(2).to_string()) && msg.contains("section checksum mismatch"),
        "{msg}"
    );
    assert!(s.block(id(10)).is_none());
    s.apply(&Command::ClearNoCompact { ids: id_list(&[2]) }).expect("clear");
    s.apply(&replace_v2(vec![out(10, 20)], &[1, 2], 5, "c"))
        .expect("no longer quarantined");
}

#[test]
fn abandon_fences_unknown_ids_and_refuses_known_ones() {
    let mut s = State::new();
    assert!(
        s.apply(&Command::Abandon { ids: id_list(&[5]) })
            .expect("unknown")
            .changes
            .is_empty()
    );
    // Already purged (here: abandoned) is a no-op.
    s.apply(&Command::Abandon { ids: id_list(&[5]) }).expect("again");
    let err = s.apply(&publish(vec![block(5, "t", 0, 1)])).expect_err("late publish");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    s.apply(&publish(vec![block(1, "t", 0, 1), block(6, "t", 0, 1)]))
        .expect("seed");
    let err = s
        .apply(&Command::Replace {
            add: vec![block(5, "t", 0, 1)],
            tombstone: id_list(&[1]),
            now_ns: 2,
            lease: None,
        })
        .expect_err("late replace");
    assert!(err.to_string().contains("purged or abandoned"), "{err}");
    assert_eq!(s.block(id(1)).expect("1").state, BlockState::Live);
    // A known id rejects the whole command, naming it; the unknown one in
    // the same command is not fenced.
    let err = s.apply(&Command::Abandon { ids: id_list(&[7, 6]) }).expect_err("known");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert!(err.to_string().contains(&id(6).to_string()), "{err}");
    s.apply(&publish(vec![block(7, "t", 0, 1)])).expect("7 was not fenced");
    // The fence survives a snapshot.
    let back = State::from_image(s.to_image());
    assert!(back.apply_clone_rejects_publish(block(5, "t", 0, 1)));
}

#[test]
fn quarantine_marks_keep_blocks_queryable_and_travel_with_the_row() {
    let mut s = State::new();
    s.apply(&publish(vec![block(1, "t", 0, 1), block(2, "t", 0, 1)]))
        .expect("seed");
    let mark = |reason: &str| Command::MarkNoCompact {
        ids: id_list(&[1]),
        reason: reason.into(),
    };
    let applied = s.apply(&mark("bad footer")).expect("mark");
    assert!(
        matches!(&applied.changes[..], [Change::Block(b)] if b.id == id(1) && b.no_compact.as_deref() == Some("bad footer"))
    );
    assert!(s.apply(&mark("bad footer")).expect("same again").changes.is_empty());
    assert_eq!(s.apply(&mark("worse")).expect("new reason").changes.len(), 1);
    assert_eq!(ids(&s, "t", 0, 1, &[StateKind::Live]), vec![1, 2], "still listed");
    assert_eq!(s.block(id(1)).expect("1").no_compact.as_deref(), Some("worse"));
    assert_eq!(
        s.apply(&Command::MarkNoCompact {
            ids: id_list(&[1, 9]),
            reason: "x".into()
        })
        .expect_err("unknown")
        .error_code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        s.apply(&mark("")).expect_err("empty reason").error_code(),
        ErrorCode::BadRequest
    );
    // Marks survive a snapshot and rebuild the same rows for watchers.
    let back = State::from_image(s.to_image());
    assert_eq!(back.as_changes(), s.as_changes());
    assert_eq!(back.block(id(1)).expect("1").no_compact.as_deref(), Some("worse"));
    let cleared = s
        .apply(&Command::ClearNoCompact { ids: id_list(&[1, 2]) })
        .expect("clear");
    assert!(matches!(&cleared.changes[..], [Change::Block(b)] if b.id == id(1) && b.no_compact.is_none()));
    assert!(s.to_image().no_compact.is_empty());
    // Purging drops the mark; clearing a purged id is a no-op.
    s.apply(&mark("again")).expect("mark");
    s.apply(&Command::Tombstone {
        ids: id_list(&[1]),
        now_ns: 1,
    })
    .expect("tombstone");
    s.apply(&Command::Purge { ids: id_list(&[1]) }).expect("purge");
    assert!(s.to_image().no_compact.is_empty());
    assert!(
        s.apply(&Command::ClearNoCompact { ids: id_list(&[1]) })
            .expect("purged")
            .changes
            .is_empty()
    );
    assert_eq!(
        s.apply(&Command::ClearNoCompact { ids: id_list(&[9]) })
            .expect_err("never known")
            .error_code(),
        ErrorCode::NotFound
    );
}

#[test]
fn lease_jobs_are_set_kept_replaced_and_cleared() {
    let mut s = State::new();
    let job = |a: Applied| a.lease.expect("lease").job;
    assert_eq!(
        job(s.apply(&acquire_job("k", "a", 0, 1_000, Some("j1"))).expect("a")),
        "j1"
    );
    assert_eq!(job(s.apply(&renew_job("k", "a", 1, 1_000, None)).expect("keep")), "j1");
    assert_eq!(
        job(s.apply(&renew_job("k", "a", 2, 1_000, Some("j2"))).expect("replace")),
        "j2"
    );
    let old_renew = Command::RenewLease {
        key: "k".into(),
        holder: "a".into(),
        now_ns: 3,
        ttl_ms: 1_000,
    };
    assert_eq!(job(s.apply(&old_renew).expect("old renew keeps")), "j2");
    assert_eq!(s.leases()[0].job, "j2", "listed with its job");
    // Its own lease, expired and taken again: still its manifest.
    assert_eq!(
        job(s
            .apply(&acquire_job("k", "a", 5_000_000_000, 1_000, None))
            .expect("again")),
        "j2"
    );
    // Another holder takes the expired lease: the manifest is not its own.
    let taken = s
        .apply(&acquire_job("k", "b", 10_000_000_000, 1_000, None))
        .expect("takeover");
    assert!(matches!(&taken.changes[..], [Change::LeaseSet(l)] if l.holder == "b" && l.job.is_empty()));
    s.apply(&renew_job("k", "b", 10_000_000_001, 1_000, Some("jb")))
        .expect("b's job");
    s.apply(&Command::ReleaseLease {
        key: "k".into(),
        holder: "b".into(),
    })
    .expect("release");
    assert!(
        job(s
            .apply(&acquire_job("k", "b", 10_000_000_002, 1_000, None))
            .expect("fresh"))
        .is_empty()
    );
    // Too large a manifest.
    let huge = "x".repeat(crate::model::MAX_JOB_BYTES + 1);
    let err = s
        .apply(&renew_job("k", "b", 10_000_000_003, 1_000, Some(&huge)))
        .expect_err("huge");
    assert_eq!(err.error_code(), ErrorCode::BadRequest);
    assert!(err.to_string().contains("job"), "{err}");
    // Renewing someone else's lease is refused and keeps their job.
    assert!(
        s.apply(&renew_job("k", "a", 10_000_000_003, 1_000, Some("steal")))
            .is_err()
    );
    assert!(s.leases()[0].job.is_empty());
}

#[test]
fn acquiring_prunes_long_expired_leases_in_key_order() {
    let commands: Vec<Command> = (0..70)
        .rev()
        .map(|i| acquire_job(&format!("k{i:03}"), "dead", 0, 1_000, Some("m")))
        .chain([acquire_job("recent", "r", HOUR, 1_000, None)])
        .collect();
    let (mut a, mut b) = (State::new(), State::new());
    for c in &commands {
        a.apply(c).expect("a");
        b.apply(c).expect("b");
    }
    // The old acquire never prunes (log entries replay as they did).
    a.apply(&Command::AcquireLease {
        key: "old".into(),
        holder: "o".into(),
        now_ns: 3 * HOUR,
        ttl_ms: 1_000,
    })
    .expect("old acquire");
    assert_eq!(a.leases().len(), 72);
    let now = 1_000_000_000 + HOUR + 1;
    let applied = a.apply(&acquire_job("new", "n", now, 1_000, None)).expect("new");
    let released: Vec<String> = applied
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::LeaseReleased(k) => Some(k.clone()),
            _ => None,
        })
        .collect();
    let expected: Vec<String> = (0..LEASES_PRUNED_PER_ACQUIRE).map(|i| format!("k{i:03}")).collect();
    assert_eq!(released, expected);
    let left: Vec<String> = a.leases().into_iter().map(|l| l.key).collect();
    assert!(left.contains(&"k064".to_owned()) && left.contains(&"recent".to_owned()));
    assert!(left.contains(&"old".to_owned()) && left.contains(&"new".to_owned()));
    // Expired exactly an hour ago is not yet pruned.
    let next = a
        .apply(&acquire_job("new2", "n", 1_000_000_000 + HOUR, 1_000, None))
        .expect("new2");
    assert!(next.changes.iter().all(|c| !matches!(c, Change::LeaseReleased(_))));
    // Another member applying the same log ends in the same state.
    b.apply(&Command::AcquireLease {
        key: "old".into(),
        holder: "o".into(),
        now_ns: 3 * HOUR,
        ttl_ms: 1_000,
    })
    .expect("old acquire");
    b.apply(&acquire_job("new", "n", now, 1_000, None)).expect("new");
    b.apply(&acquire_job("new2", "n", 1_000_000_000 + HOUR, 1_000, None))
        .expect("new2");
    assert_eq!(a.to_image(), b.to_image());
}

#[test]
fn query_blocks_pages_across_tenants_signals_and_partitions() {
    let mut s = State::new();
    let mut blocks = Vec::new();
    for (n, tenant) in [(1, "t"), (20, "u"), (40, "a")] {
        for k in 0..6u128 {
            let min = (10 + (k % 3) as i64) * HOUR + k as i64;
            blocks.push(block(n + k, tenant, min, min + 10));
        }
    }
    let mut trace = block(90, "t", 10 * HOUR + 7, 10 * HOUR + 9);
    trace.signal = Signal::Traces;
    trace.object_key = block_path(&trace.tenant, Signal::Traces, (10 * HOUR + 7) as u64, id(90)).to_string();
    blocks.push(trace);
    // A wide block starting in partition 10 h.
    blocks.push(block(91, "t", 10 * HOUR + 3, 10 * HOUR + 40 * 24 * HOUR));
    s.apply(&publish(blocks)).expect("seed");
    s.apply(&Command::Tombstone {
        ids: id_list(&[2]),
        now_ns: 1,
    })
    .expect("tombstone");

    let brute = |q: &BlockQuery<'_>| -> Vec<BlockId> {
        let mut all: Vec<&BlockRecord> = s
            .to_image()
            .blocks
            .iter()
            .filter_map(|b| s.block(b.id))
            .filter(|b| {
                q.tenant.is_none_or(|t| *t == b.tenant)
                    && q.signal.is_none_or(|x| x == b.signal)
                    && b.min_time_ns <= q.max_time_ns
                    && b.max_time_ns >= q.min_time_ns
                    && q.partition_start_ns.is_none_or(|p| p == b.partition_start_ns)
                    && q.states.contains(&b.state.kind())
            })
            .collect();
        all.sort_by_key(|b| (b.tenant.clone(), b.signal, b.min_time_ns, b.id));
        all.into_iter().map(|b| b.id).collect()
    };
    let t = TenantId::new("t").expect("t");
    let live = [StateKind::Live];
    let both = [StateKind::Live, StateKind::Tombstoned];
    let queries = [
        (None, None, 0, i64::MAX, None, &live[..]),
        (None, None, 0, i64::MAX, None, &both[..]),
        (Some(&t), None, 0, i64::MAX, None, &live[..]),
        (None, Some(Signal::Logs), 0, i64::MAX, Some(10 * HOUR), &both[..]),
        (
            Some(&t),
            Some(Signal::Logs),
            10 * HOUR + 20,
            11 * HOUR,
            Some(10 * HOUR),
            &live[..],
        ),
        (None, None, 11 * HOUR, 11 * HOUR + 2, None, &live[..]),
        (None, None, 0, i64::MAX, Some(12 * HOUR), &live[..]),
    ];
    for (tenant, signal, min, max, partition, states) in queries {
        let base = BlockQuery {
            tenant,
            signal,
            min_time_ns: min,
            max_time_ns: max,
            partition_start_ns: partition,
            states,
            after: None,
            limit: usize::MAX,
        };
        let want = brute(&base);
        assert!(!want.is_empty());
        let (whole, next) = s.query_blocks(&base);
        assert_eq!(whole.iter().map(|b| b.id).collect::<Vec<_>>(), want);
        assert!(next.is_none());
        for limit in [1, 2, 5] {
            let mut got = Vec::new();
            let mut cursor: Option<BlockCursor> = None;
            loop {
                let page_query = BlockQuery {
                    after: cursor.as_ref(),
                    limit,
                    ..base.clone()
                };
                let (page, next) = s.query_blocks(&page_query);
                assert!(page.len() <= limit);
                got.extend(page.iter().map(|b| b.id));
                match next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            assert_eq!(got, want, "limit {limit}");
        }
    }
    // The stream listing is unchanged by paging support.
    assert_eq!(
        ids(&s, "t", 10 * HOUR, 10 * HOUR + 5, &[StateKind::Live]),
        vec![1, 4, 91]
    );
}

#[test]
fn image_v2_round_trips_every_field() {
    let mut s = compactable();
    s.apply(&Command::MarkNoCompact {
        ids: id_list(&[3]),
        reason: "bad".into(),
    })
    .expect("mark");
    s.apply(&renew_job(PART_KEY, "c", 1, 60_000, Some(r#"{"v":1}"#)))
        .expect("job");
    s.apply(&Command::Abandon { ids: id_list(&[77]) }).expect("abandon");
    s.apply(&Command::Fence {
        ingester_id: "i".into(),
    })
    .expect("fence");
    s.apply(&Command::Stage {
        ingester_id: "i".into(),
        epoch: 1,
        txn: 9,
        blocks: vec![block(50, "t", 0, 1)],
    })
    .expect("stage");
    let image = s.to_image();
    assert_eq!(image.no_compact.len(), 1);
    assert!(image.blocks.iter().all(|b| b.no_compact.is_none()));
    let bytes = crate::state_machine::encode_image(&image).expect("encode");
    assert!(bytes.starts_with(crate::state_machine::IMAGE_MAGIC_V2));
    let back = crate::state_machine::decode_image(&bytes).expect("decode");
    assert_eq!(back, image);
    let rebuilt = State::from_image(back);
    assert_eq!(rebuilt.to_image(), image);
    assert_eq!(rebuilt.as_changes(), s.as_changes());
    assert_eq!(rebuilt.counts(), s.counts());
    assert_eq!(rebuilt.leases()[0].job, r#"{"v":1}"#);
}

/// The commands behind `tests/fixtures/state-image-v1.bin`, which the
/// catalog as of 2026-12-04 (image version 1) encoded from the state they
/// build (the same list, run by that release).
fn golden_v1_commands() -> Vec<Command> {
    let mut trace = block(4, "u", HOUR + 3, HOUR + 9);
    trace.signal = Signal::Traces;
    trace.object_key = block_path(&trace.tenant, Signal::Traces, (HOUR + 3) as u64, id(4)).to_string();
    vec![
        Command::Publish {
            blocks: vec![
                block(1, "t", HOUR, HOUR + 5),
                block(2, "t", HOUR + 1, HOUR + 7),
                block(3, "t", 2 * HOUR, 2 * HOUR + 1),
                trace,
            ],
            watermark: Some(Watermark {
                ingester_id: "i-0".into(),
                shard: 2,
                wal_seq: 41,
            }),
        },
        Command::Tombstone {
            ids: id_list(&[2]),
            now_ns: 7,
        },
        Command::Tombstone {
            ids: id_list(&[3]),
            now_ns: 8,
        },
        Command::Purge { ids: id_list(&[3]) },
        Command::MarkOffloaded {
            id: id(4),
            location: "s3://cold/u/4".into(),
        },
        Command::Heartbeat {
            ingester_id: "i-0".into(),
            address: "10.0.0.1:4400".into(),
            now_ns: 100,
            ttl_ms: 9_000,
        },
        Command::AcquireLease {
            key: "part/t/logs/3600000000000".into(),
            holder: "c-1/01J".into(),
            now_ns: 50,
            ttl_ms: 60_000,
        },
        Command::SetPolicy(Policy {
            kind: PolicyKind::Retention,
            name: "default".into(),
            tenant: "t".into(),
            body_json: r#"{"days":7}"#.into(),
        }),
        Command::Fence {
            ingester_id: "i-0".into(),
        },
        Command::Stage {
            ingester_id: "i-0".into(),
            epoch: 1,
            txn: 77,
            blocks: vec![block(5, "t", HOUR, HOUR + 2)],
        },
    ]
}

#[test]
fn an_image_written_by_version_1_reads_back_whole() {
    let bytes = include_bytes!("../../tests/fixtures/state-image-v1.bin");
    assert!(!bytes.starts_with(crate::state_machine::IMAGE_MAGIC_V2));
    let image = crate::state_machine::decode_image(bytes).expect("decode v1");
    let mut expected = State::new();
    for c in golden_v1_commands() {
        expected.apply(&c).expect("golden command");
    }
    assert_eq!(image, expected.to_image());
    // Field by field, so a mismatch says which.
    assert_eq!(
        image.blocks.iter().map(|b| b.id.as_u128()).collect::<Vec<_>>(),
        vec![1, 2, 4]
    );
    assert_eq!(image.blocks[1].state, BlockState::Tombstoned { at_ns: 7 });
    assert_eq!(
        image.blocks[2].state,
        BlockState::Offloaded {
            location: "s3://cold/u/4".into()
        }
    );
    assert_eq!(image.blocks[2].signal, Signal::Traces);
    assert_eq!(image.watermarks[0].wal_seq, 41);
    assert_eq!(image.ingesters[0].expires_at_ns, 100 + 9_000 * 1_000_000);
    assert_eq!(
        image.leases,
        vec![Lease {
            key: "part/t/logs/3600000000000".into(),
            holder: "c-1/01J".into(),
            expires_at_ns: 50 + 60_000 * 1_000_000,
            job: String::new(),
        }]
    );
    assert_eq!(image.policies[0].body_json, r#"{"days":7}"#);
    assert_eq!(image.purged, id_list(&[3]));
    assert_eq!(image.epochs, vec![("i-0".to_owned(), 1)]);
    assert_eq!(image.staged[0].0, 77);
    assert_eq!(image.staged[0].1.blocks, vec![block(5, "t", HOUR, HOUR + 2)]);
    assert!(image.no_compact.is_empty());
    // Written again, it is a version 2 image holding the same.
    let again = crate::state_machine::encode_image(&image).expect("encode");
    assert!(again.starts_with(crate::state_machine::IMAGE_MAGIC_V2));
    assert_eq!(crate::state_machine::decode_image(&again).expect("v2"), image);
}

// ---- retention and offload: offload copies, pins, tombstone reasons ----

const SHA: &str = "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01";

fn offload_item(n: u128, at_ns: i64) -> crate::model::OffloadItem {
    crate::model::OffloadItem {
        id: id(n),
        location: format!("file:///archive/{n}"),
        sha256: SHA.into(),
        at_ns,
    }
}

fn freed(ns: &[u128], now_ns: i64, holder: &str) -> Command {
    Command::MarkPrimaryFreed {
        ids: id_list(ns),
        now_ns,
        lease_key: PART_KEY.into(),
        lease_holder: holder.into(),
    }
}

fn restored(ns: &[u128], pin_until_ns: i64, now_ns: i64) -> Command {
    Command::MarkRestoredV2 {
        ids: id_list(ns),
        pin_until_ns,
        now_ns,
        lease_key: PART_KEY.into(),
        lease_holder: "c".into(),
    }
}

fn retention(ns: &[u128], now_ns: i64) -> Command {
    Command::TombstoneV2 {
        ids: id_list(ns),
        now_ns,
        reason: crate::model::TombstoneReason::Retention,
    }
}

#[test]
fn offload_marks_whole_or_nothing_and_a_retry_changes_nothing() {
    let mut s = compactable();
    let mark = Command::MarkOffloadedV2 {
        items: vec![offload_item(1, 5), offload_item(2, 5)],
    };
    assert_eq!(s.apply(&mark).expect("mark").changes.len(), 2);
    let b = s.block(id(1)).expect("1");
    assert_eq!(b.state.kind(), StateKind::Offloaded);
    let copy = b.offload.as_ref().expect("copy");
    assert_eq!((copy.sha256.as_str(), copy.at_ns, copy.primary_freed), (SHA, 5, false));
    assert!(s.apply(&mark).expect("retry").changes.is_empty());
    // A different copy of an offloaded block, or a tombstoned block,
    // refuses the whole command: block 3 stays live.
    let mut other = offload_item(1, 6);
    other.location = "file:///elsewhere/1".into();
    let err = s
        .apply(&Command::MarkOffloadedV2 {
            items: vec![offload_item(3, 6), other],
        })
        .expect_err("other copy");
    assert_eq!(err.error_code(), ErrorCode::Conflict);
    assert_eq!(s.block(id(3)).expect("3").state.kind(), StateKind::Live);
    // Offloaded blocks are not live: not planned by queries or merges.
    assert_eq!(ids(&s, "t", 0, 20 * HOUR, &[StateKind::Live]), vec![3]);
}

#[test]
fn freeing_a_primary_needs_the_lease_and_an_offloaded_block() {
    let mut s = compactable();
    s.apply(&Command::MarkOffloadedV2 {
        items: vec![offload_item(1, 5)],
    })
    .expect("mark");
    assert_eq!(
        s.apply(&freed(&[1], 5, "other"))
            .expect_err("not the holder")
            .error_code(),
        ErrorCode::Conflict
    );
    assert_eq!(
        s.apply(&freed(&[1, 2], 5, "c")).expect_err("2 is live").error_code(),
        ErrorCode::Conflict
    );
    assert_eq!(s.apply(&freed(&[1], 5, "c")).expect("freed").changes.len(), 1);
    assert!(
        s.block(id(1))
            .and_then(|b| b.offload.as_ref())
            .expect("copy")
            .primary_freed
    );
    assert!(s.apply(&freed(&[1], 6, "c")).expect("retry").changes.is_empty());
}

#[test]
fn a_restore_makes_blocks_live_and_pins_them_against_offload_and_retention() {
    let mut s = compactable();
    s.apply(&Command::MarkOffloadedV2 {
        items: vec![offload_item(1, 5)],
    })
    .expect("mark");
    s.apply(&freed(&[1], 5, "c")).expect("freed");
    assert_eq!(s.apply(&restored(&[1], 1_000, 7)).expect("restore").changes.len(), 1);
    let b = s.block(id(1)).expect("1");
    assert_eq!(b.state, BlockState::Live);
    let copy = b.offload.as_ref().expect("copy kept");
    assert_eq!((copy.primary_freed, copy.pinned_until_ns), (false, 1_000));
    assert!(
        s.apply(&restored(&[1], 500, 8)).expect("again").changes.is_empty(),
        "a restore of a live block never shortens its pin"
    );
    // Pinned: neither offloaded nor dropped until the pin passes.
    assert!(
        s.apply(&Command::MarkOffloadedV2 {
            items: vec![offload_item(1, 999)]
        })
        .is_err()
    );
    assert_eq!(
        s.apply(&retention(&[1, 2], 999)).expect_err("pinned").error_code(),
        ErrorCode::Conflict
    );
    assert_eq!(s.block(id(2)).expect("2").state, BlockState::Live, "whole or nothing");
    assert_eq!(
        s.apply(&retention(&[1, 2], 1_000)).expect("pin passed").changes.len(),
        2
    );
    // The tombstoned block keeps its copy, so GC deletes it too.
    let b = s.block(id(1)).expect("1");
    assert_eq!(b.state, BlockState::Tombstoned { at_ns: 1_000 });
    assert_eq!(b.offload.as_ref().expect("copy").location, "file:///archive/1");
    assert!(
        s.apply(&restored(&[1], 2_000, 1_001)).is_err(),
        "a tombstoned block is not restored"
    );
}

#[test]
fn retention_tombstones_offloaded_blocks_and_a_retry_changes_nothing() {
    let mut s = compactable();
    s.apply(&Command::MarkOffloadedV2 {
        items: vec![offload_item(1, 5)],
    })
    .expect("mark");
    assert_eq!(s.apply(&retention(&[1, 3], 9)).expect("drop").changes.len(), 2);
    assert!(s.apply(&retention(&[1, 3], 10)).expect("retry").changes.is_empty());
    assert_eq!(
        s.apply(&retention(&[1, 99], 10)).expect_err("unknown").error_code(),
        ErrorCode::NotFound
    );
}

#[test]
fn policy_status_needs_the_policy_and_goes_with_it() {
    let mut s = State::new();
    let status = Command::SetPolicyStatus {
        kind: PolicyKind::Retention,
        name: "short".into(),
        status_json: r#"{"blocks_dropped":1}"#.into(),
    };
    assert_eq!(
        s.apply(&status).expect_err("no policy").error_code(),
        ErrorCode::NotFound
    );
    s.apply(&Command::SetPolicy(Policy {
        kind: PolicyKind::Retention,
        name: "short".into(),
        tenant: String::new(),
        body_json: r#"{"v":1,"retain_s":3600}"#.into(),
    }))
    .expect("policy");
    s.apply(&status).expect("status");
    assert_eq!(
        s.policy_status(PolicyKind::Retention, "short"),
        Some(r#"{"blocks_dropped":1}"#)
    );
    s.apply(&Command::DeletePolicy {
        kind: PolicyKind::Retention,
        name: "short".into(),
    })
    .expect("delete");
    assert_eq!(s.policy_status(PolicyKind::Retention, "short"), None);
    s.apply(&Command::RegisterOffloadTargets {
        names: vec!["b".into(), "a".into()],
    })
    .expect("targets");
    s.apply(&Command::RegisterOffloadTargets {
        names: vec!["a".into()],
    })
    .expect("again");
    assert_eq!(s.offload_targets(), vec!["a".to_owned(), "b".to_owned()]);
}

#[test]
fn offload_copies_statuses_and_targets_survive_an_image_and_older_images_read() {
    let mut s = compactable();
    s.apply(&Command::MarkOffloadedV2 {
        items: vec![offload_item(1, 5), offload_item(2, 5)],
    })
    .expect("mark");
    s.apply(&restored(&[2], 77, 6)).expect("restore");
    s.apply(&Command::SetPolicy(Policy {
        kind: PolicyKind::Offload,
        name: "o".into(),
        tenant: "t".into(),
        body_json: "{}".into(),
    }))
    .expect("policy");
    s.apply(&Command::SetPolicyStatus {
        kind: PolicyKind::Offload,
        name: "o".into(),
        status_json: "{}".into(),
    })
    .expect("status");
    s.apply(&Command::RegisterOffloadTargets {
        names: vec!["a".into()],
    })
    .expect("targets");
    let image = s.to_image();
    assert_eq!(image.ext.offload.len(), 2);
    assert!(image.blocks.iter().all(|b| b.offload.is_none()));
    let bytes = crate::state_machine::encode_image(&image).expect("encode");
    let back = crate::state_machine::decode_image(&bytes).expect("decode");
    assert_eq!(back, image);
    let rebuilt = State::from_image(back);
    assert_eq!(rebuilt.to_image(), image);
    assert_eq!(
        rebuilt
            .block(id(2))
            .and_then(|b| b.offload.as_ref())
            .map(|c| c.pinned_until_ns),
        Some(77)
    );
    // A version 2 image written before the extension existed: the same
    // struct without it, as that release encoded it.
    let raw = postcard::to_stdvec(&image).expect("postcard");
    let mut old = crate::state_machine::IMAGE_MAGIC_V2.to_vec();
    old.extend(zstd::encode_all(raw.as_slice(), 1).expect("zstd"));
    let back = crate::state_machine::decode_image(&old).expect("decode older v2");
    assert_eq!(back.ext, StateImageExt::default());
    assert_eq!(back.blocks, image.blocks);
}

#[test]
fn member_registrations_conflict_replace_forget_and_survive_an_image() {
    let mut s = State::new();
    let reg = |id: u64, inc: &str, replace: bool| Command::RegisterMember {
        node_id: id,
        incarnation: inc.into(),
        replace,
    };
    s.apply(&reg(1, "a", false)).expect("register");
    s.apply(&reg(1, "a", false))
        .expect("the same incarnation again is a no-op");
    let e = s
        .apply(&reg(1, "b", false))
        .expect_err("another incarnation under the id");
    assert!(
        e.to_string()
            .contains("registered with data directory incarnation \"a\""),
        "{e}"
    );
    assert_eq!(s.members().get(&1).map(String::as_str), Some("a"));
    s.apply(&reg(1, "b", true)).expect("replace");
    s.apply(&reg(2, "c", false)).expect("register 2");
    let back = State::from_image(
        crate::state_machine::decode_image(&crate::state_machine::encode_image(&s.to_image()).expect("enc"))
            .expect("dec"),
    );
    assert_eq!(back.members(), s.members());
    s.apply(&Command::ForgetMember { node_id: 1 }).expect("forget");
    s.apply(&Command::ForgetMember { node_id: 1 })
        .expect("forgetting again is a no-op");
    s.apply(&reg(1, "d", false)).expect("a forgotten id registers anew");
    assert!(
        reg(1, "", false)
            .validate()
            .expect_err("empty")
            .to_string()
            .contains("incarnation")
    );
}

#[test]
fn target_checks_are_kept_per_name_and_images_with_the_first_extension_only_read() {
    let check = |name: &str, reachable: bool, at: i64, error: &str| crate::model::TargetCheck {
        name: name.into(),
        reachable,
        checked_at_ns: at,
        error: error.into(),
    };
    let mut s = State::new();
    // A compactor from before the checks: a name and no check.
    s.apply(&Command::RegisterOffloadTargets {
        names: vec!["old".into()],
    })
    .expect("names only");
    s.apply(&Command::RegisterOffloadTargetsV2 {
        names: vec!["a".into(), "b".into()],
        checks: vec![check("a", true, 10, ""), check("b", false, 10, "connection refused")],
    })
    .expect("checks");
    s.apply(&Command::RegisterOffloadTargetsV2 {
        names: vec!["b".into()],
        checks: vec![check("b", true, 20, "")],
    })
    .expect("a later check");
    assert_eq!(s.offload_targets(), ["a", "b", "old"]);
    assert_eq!(
        s.offload_target_checks(),
        [check("a", true, 10, ""), check("b", true, 20, "")],
        "the last check of each name; none for the old registration"
    );
    // A check of a name the command does not register, and a long error,
    // are refused.
    let stray = Command::RegisterOffloadTargetsV2 {
        names: vec!["a".into()],
        checks: vec![check("z", true, 1, "")],
    };
    assert!(stray.validate().is_err());
    let long = Command::RegisterOffloadTargetsV2 {
        names: vec!["a".into()],
        checks: vec![check("a", false, 1, &"x".repeat(300))],
    };
    assert!(long.validate().is_err());

    let image = s.to_image();
    let bytes = crate::state_machine::encode_image(&image).expect("encode");
    let back = crate::state_machine::decode_image(&bytes).expect("decode");
    assert_eq!(back, image);
    assert_eq!(
        State::from_image(back).offload_target_checks(),
        s.offload_target_checks()
    );
    // A version 2 image written with the first extension only (before the
    // checks): read, with no checks and every name.
    let mut raw = postcard::to_stdvec(&image).expect("postcard");
    raw.extend(postcard::to_stdvec(&image.ext).expect("ext"));
    let mut old = crate::state_machine::IMAGE_MAGIC_V2.to_vec();
    old.extend(zstd::encode_all(raw.as_slice(), 1).expect("zstd"));
    let back = crate::state_machine::decode_image(&old).expect("decode the older v2");
    assert_eq!(back.ext, image.ext);
    assert_eq!(back.ext2, StateImageExt2::default());
    let rebuilt = State::from_image(back);
    assert_eq!(rebuilt.offload_targets(), ["a", "b", "old"]);
    assert!(rebuilt.offload_target_checks().is_empty());
    // A catalog from before the checks reads a new image's first
    // extension and ignores what follows it (postcard::from_bytes leaves
    // trailing bytes).
    let raw = zstd::decode_all(&bytes[8..]).expect("zstd");
    let (_, rest): (StateImage, &[u8]) = postcard::take_from_bytes(&raw).expect("image");
    let ext: StateImageExt = postcard::from_bytes(rest).expect("the first extension");
    assert_eq!(ext, image.ext);
}
