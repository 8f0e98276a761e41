use mira_core::block::path::block_path;
use mira_core::ids::{BlockId, Signal, TenantId};

use super::*;
use crate::error::{ErrorCode, ServiceError};
use crate::model::{Level, PolicyKind};

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
