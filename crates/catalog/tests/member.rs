//! A single-member catalog over real sockets: hostile requests, restart
//! from disk, watch resets, `/metrics` and `/ready`.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use mira_catalog::proto as pb;
use mira_catalog::proto::catalog_client::CatalogClient as Grpc;
use mira_catalog::proto::raft_client::RaftClient;
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig};
use mira_core::ids::BlockId;
use mira_testkit::EPOCH_NS;
use mira_testkit::http;
use mira_testkit::net::free_addr;
use tonic::Code;
use tonic::transport::Channel;

fn block(seq: i64) -> pb::Block {
    mira_catalog::testing::block("t", EPOCH_NS + seq * 1_000_000, 10)
}

async fn start(dir: &std::path::Path, addr: SocketAddr, snapshot_every: u64) -> CatalogNode {
    let mut config = NodeConfig::single(addr, dir.to_path_buf());
    config.snapshot_every = snapshot_every;
    config.keep_logs = 10;
    let node = CatalogNode::start(config, &mira_common::Process::default())
        .await
        .expect("start");
    node.wait_for_leader(Duration::from_secs(20)).await.expect("leader");
    node
}

fn client(addr: SocketAddr) -> CatalogClient {
    CatalogClient::new(vec![addr.to_string()], ClientConfig::default())
}

async fn raw(addr: SocketAddr) -> Grpc<Channel> {
    Grpc::connect(format!("http://{addr}"))
        .await
        .expect("connect")
        .max_encoding_message_size(64 << 20)
}

async fn everything(c: &CatalogClient) -> (Vec<pb::Block>, Vec<pb::Policy>, Vec<pb::Lease>, Vec<pb::Watermark>) {
    let blocks = c
        .list_blocks(pb::ListBlocksRequest {
            tenant: "t".into(),
            signal: pb::Signal::Logs as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![1, 2, 3],
            linearizable: true,
            ..Default::default()
        })
        .await
        .expect("list")
        .blocks;
    let policies = c
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .expect("policies")
        .policies;
    let leases = c
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .expect("leases")
        .leases;
    let wm = c
        .get_watermarks(pb::GetWatermarksRequest::default())
        .await
        .expect("watermarks")
        .watermarks;
    (blocks, policies, leases, wm)
}

fn write(cmd: pb::write_request::Command) -> pb::WriteRequest {
    pb::WriteRequest { command: Some(cmd) }
}

/// A SetPolicy of `kind` (1 retention, 2 offload) for `tenant`.
fn policy(kind: i32, tenant: &str, body_json: &str) -> pb::WriteRequest {
    write(pb::write_request::Command::SetPolicy(pb::SetPolicy {
        policy: Some(pb::Policy {
            kind,
            name: "hostile".into(),
            tenant: tenant.into(),
            body_json: body_json.into(),
            ..Default::default()
        }),
    }))
}

#[tokio::test]
async fn hostile_requests_get_clear_statuses_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let node = start(dir.path(), addr, 10_000).await;
    let c = client(addr);
    c.publish(vec![block(1), block(2)], None).await.expect("seed");
    c.write(pb::write_request::Command::AcquireLease(pb::AcquireLease {
        key: "k".into(),
        holder: "h".into(),
        now_ns: EPOCH_NS,
        ttl_ms: 60_000,
        ..Default::default()
    }))
    .await
    .expect("lease");
    let before = everything(&c).await;
    let mut g = raw(addr).await;

    use pb::write_request::Command as C;
    let mut bad_id = block(3);
    bad_id.id = "not-a-ulid".into();
    let mut negative = block(3);
    negative.min_time_ns = -5;
    let mut reversed = block(3);
    reversed.max_time_ns = reversed.min_time_ns - 1;
    let mut bad_signal = block(3);
    bad_signal.signal = 99;
    let mut bad_key = block(3);
    bad_key.object_key = "../../etc/passwd".into();
    let mut stray_state = block(3);
    stray_state.state = pb::BlockState::Tombstoned as i32;
    let too_many: Vec<pb::Block> = (0..10_001).map(block).collect();
    let cases: Vec<(&str, pb::WriteRequest, Code, &str)> = vec![
        (
            "no command",
            pb::WriteRequest { command: None },
            Code::InvalidArgument,
            "command",
        ),
        (
            "bad id",
            write(C::Publish(pb::Publish {
                blocks: vec![bad_id],
                watermark: None,
            })),
            Code::InvalidArgument,
            "ULID",
        ),
        (
            "negative time",
            write(C::Publish(pb::Publish {
                blocks: vec![negative],
                watermark: None,
            })),
            Code::InvalidArgument,
            "negative",
        ),
        (
            "reversed times",
            write(C::Publish(pb::Publish {
                blocks: vec![reversed],
                watermark: None,
            })),
            Code::InvalidArgument,
            "max_time_ns",
        ),
        (
            "unknown signal",
            write(C::Publish(pb::Publish {
                blocks: vec![bad_signal],
                watermark: None,
            })),
            Code::InvalidArgument,
            "signal",
        ),
        (
            "hostile key",
            write(C::Publish(pb::Publish {
                blocks: vec![bad_key],
                watermark: None,
            })),
            Code::InvalidArgument,
            "object_key",
        ),
        (
            "publish tombstoned",
            write(C::Publish(pb::Publish {
                blocks: vec![stray_state],
                watermark: None,
            })),
            Code::InvalidArgument,
            "live",
        ),
        (
            "too many blocks",
            write(C::Publish(pb::Publish {
                blocks: too_many,
                watermark: None,
            })),
            Code::InvalidArgument,
            "at most 10000",
        ),
        (
            "empty publish",
            write(C::Publish(pb::Publish::default())),
            Code::InvalidArgument,
            "blocks",
        ),
        (
            "unknown tombstone",
            write(C::Tombstone(pb::Tombstone {
                ids: vec![BlockId::new().to_string()],
                now_ns: EPOCH_NS,
            })),
            Code::NotFound,
            "not found",
        ),
        (
            "unknown purge",
            write(C::Purge(pb::Purge {
                ids: vec![BlockId::new().to_string()],
            })),
            Code::NotFound,
            "not found",
        ),
        (
            "purge live",
            write(C::Purge(pb::Purge {
                ids: vec![before.0[0].id.clone()],
            })),
            Code::FailedPrecondition,
            "not tombstoned",
        ),
        (
            "replace unknown",
            write(C::Replace(pb::Replace {
                add: vec![block(9)],
                tombstone: vec![BlockId::new().to_string()],
                now_ns: EPOCH_NS,
                ..Default::default()
            })),
            Code::NotFound,
            "not found",
        ),
        (
            "restore unknown",
            write(C::MarkRestored(pb::MarkRestored {
                id: BlockId::new().to_string(),
            })),
            Code::NotFound,
            "not found",
        ),
        (
            "overflowing lease",
            write(C::AcquireLease(pb::AcquireLease {
                key: "x".into(),
                holder: "h".into(),
                now_ns: i64::MAX - 10,
                ttl_ms: 1_000,
                ..Default::default()
            })),
            Code::InvalidArgument,
            "overflows",
        ),
        (
            "negative ttl",
            write(C::AcquireLease(pb::AcquireLease {
                key: "x".into(),
                holder: "h".into(),
                now_ns: EPOCH_NS,
                ttl_ms: -1,
                ..Default::default()
            })),
            Code::InvalidArgument,
            "ttl_ms",
        ),
        (
            "lease held",
            write(C::AcquireLease(pb::AcquireLease {
                key: "k".into(),
                holder: "other".into(),
                now_ns: EPOCH_NS,
                ttl_ms: 1_000,
                ..Default::default()
            })),
            Code::FailedPrecondition,
            "held by",
        ),
        (
            "huge key",
            write(C::AcquireLease(pb::AcquireLease {
                key: "k".repeat(100_000),
                holder: "h".into(),
                now_ns: EPOCH_NS,
                ttl_ms: 1_000,
                ..Default::default()
            })),
            Code::InvalidArgument,
            "key",
        ),
        (
            "policy not json",
            write(C::SetPolicy(pb::SetPolicy {
                policy: Some(pb::Policy {
                    kind: 1,
                    name: "p".into(),
                    tenant: String::new(),
                    body_json: "{nope".into(),
                    ..Default::default()
                }),
            })),
            Code::InvalidArgument,
            "body_json",
        ),
        (
            "oversized policy",
            write(C::SetPolicy(pb::SetPolicy {
                policy: Some(pb::Policy {
                    kind: 1,
                    name: "p".into(),
                    tenant: String::new(),
                    body_json: format!("{{\"a\":\"{}\"}}", "x".repeat(1 << 20)),
                    ..Default::default()
                }),
            })),
            Code::InvalidArgument,
            "at most 65536",
        ),
        (
            "unknown policy kind",
            write(C::SetPolicy(pb::SetPolicy {
                policy: Some(pb::Policy {
                    kind: 7,
                    name: "p".into(),
                    tenant: String::new(),
                    body_json: "{}".into(),
                    ..Default::default()
                }),
            })),
            Code::InvalidArgument,
            "kind",
        ),
        (
            "policy with an unknown field",
            policy(1, "", r#"{"v":1,"retain_s":86400,"retian_s":3600}"#),
            Code::InvalidArgument,
            "policy field `retian_s`",
        ),
        (
            "policy with a negative duration",
            policy(1, "", r#"{"v":1,"retain_s":-5}"#),
            Code::InvalidArgument,
            "policy field `retain_s`",
        ),
        (
            "policy with a zero duration",
            policy(1, "", r#"{"v":1,"retain_s":0}"#),
            Code::InvalidArgument,
            "policy field `retain_s`",
        ),
        (
            "retain shorter than the minimum",
            policy(1, "acme", r#"{"v":1,"retain_s":60}"#),
            Code::InvalidArgument,
            "policy field `retain_s`",
        ),
        (
            "policy with an invalid regex",
            policy(
                1,
                "",
                r#"{"v":1,"retain_s":86400,"selector":[{"key":"service.name","op":"=~","value":"(unclosed"}]}"#,
            ),
            Code::InvalidArgument,
            "policy field `selector[0].value`",
        ),
        (
            "offload to a target no compactor registered",
            policy(2, "", r#"{"v":1,"after_s":86400,"target":"nowhere"}"#),
            Code::InvalidArgument,
            "policy field `target`",
        ),
        (
            "offload unknown",
            write(C::MarkOffloaded(pb::MarkOffloaded {
                id: BlockId::new().to_string(),
                location: "s3://x/y".into(),
            })),
            Code::NotFound,
            "not found",
        ),
    ];
    for (name, req, code, needle) in cases {
        let err = g.write(req).await.expect_err(name);
        assert_eq!(err.code(), code, "{name}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{name}: {:?} should mention {needle:?}",
            err.message()
        );
    }

    // A message over the 16 MiB limit is refused by the transport.
    let huge = write(C::SetPolicy(pb::SetPolicy {
        policy: Some(pb::Policy {
            kind: 1,
            name: "p".into(),
            tenant: String::new(),
            body_json: "x".repeat(17 << 20),
            ..Default::default()
        }),
    }));
    let err = g.write(huge).await.expect_err("oversized message");
    assert!(
        matches!(err.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{err:?}"
    );

    let list = |min, max, signal, tenant: &str, states: Vec<i32>| pb::ListBlocksRequest {
        tenant: tenant.into(),
        signal,
        min_time_ns: min,
        max_time_ns: max,
        states,
        linearizable: false,
        ..Default::default()
    };
    for (name, req, needle) in [
        ("reversed range", list(10, 5, 1, "t", vec![]), "max_time_ns"),
        ("negative range", list(-1, 5, 1, "t", vec![]), "negative"),
        ("bad signal", list(0, 5, 9, "t", vec![]), "signal"),
        ("bad tenant", list(0, 5, 1, "a/b", vec![]), "tenant"),
        ("bad state", list(0, 5, 1, "t", vec![42]), "state"),
        (
            "bad page token",
            pb::ListBlocksRequest {
                page_token: "t/1/x".into(),
                ..list(0, 5, 1, "t", vec![])
            },
            "page_token",
        ),
        (
            "huge limit",
            pb::ListBlocksRequest {
                limit: 100_001,
                ..list(0, 5, 1, "t", vec![])
            },
            "limit",
        ),
        (
            "partition not an hour",
            pb::ListBlocksRequest {
                partition_start_ns: Some(5),
                ..list(0, 5, 1, "t", vec![])
            },
            "partition_start_ns",
        ),
    ] {
        let err = g.list_blocks(req).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "{name}");
        assert!(err.message().contains(needle), "{name}: {}", err.message());
    }

    // A stray member of another cluster, and garbage Raft payloads.
    let mut r = RaftClient::connect(format!("http://{addr}"))
        .await
        .expect("raft connect");
    let err = r
        .vote(pb::RaftRequest {
            cluster_id: "other".into(),
            payload: vec![1, 2, 3],
        })
        .await
        .expect_err("stray");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("cluster id mismatch"), "{}", err.message());
    for payload in [vec![], vec![0xff; 64], vec![7; 3]] {
        let err = r
            .append_entries(pb::RaftRequest {
                cluster_id: "mira".into(),
                payload,
            })
            .await
            .expect_err("garbage");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }

    assert_eq!(everything(&c).await, before, "rejected requests changed the catalog");
    // And it keeps serving.
    c.publish(vec![block(50)], None).await.expect("publish after abuse");
    assert_eq!(everything(&c).await.0.len(), before.0.len() + 1);
    node.shutdown().await;
}

#[tokio::test]
async fn restart_from_disk_and_watch_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let node = start(dir.path(), addr, 50).await;
    let c = client(addr);
    let mut ids = Vec::new();
    for i in 0..120 {
        let b = block(i);
        ids.push(b.id.clone());
        c.publish(vec![b], None).await.expect("publish");
    }
    c.write(pb::write_request::Command::Publish(pb::Publish {
        blocks: vec![],
        watermark: Some(pb::Watermark {
            ingester_id: "ing-0".into(),
            shard: 2,
            wal_seq: 77,
        }),
    }))
    .await
    .expect("watermark");
    node.shutdown().await;

    let node = start(dir.path(), addr, 50).await;
    let c = std::sync::Arc::new(client(addr));
    let (blocks, _, _, wm) = everything(&c).await;
    let mut got: Vec<String> = blocks.into_iter().map(|b| b.id).collect();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want, "restart lost or doubled blocks");
    assert_eq!(
        wm,
        vec![pb::Watermark {
            ingester_id: "ing-0".into(),
            shard: 2,
            wal_seq: 77
        }]
    );

    // The restarted member's history starts at its snapshot, so a watch from
    // version 0 begins with a full reset.
    let mut stream = c.watch(0);
    let mut reset_blocks = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("watch stalled")
            .expect("watch ended");
        assert!(e.reset, "first events are the reset");
        for ch in e.changes {
            if let Some(pb::change::Change::Block(b)) = ch.change {
                reset_blocks.push(b.id);
            }
        }
        if e.reset_done {
            break;
        }
    }
    reset_blocks.sort();
    assert_eq!(reset_blocks, want);
    let b = block(500);
    c.publish(vec![b.clone()], None).await.expect("publish");
    let next = loop {
        let e = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("watch stalled")
            .expect("watch ended");
        if !e.changes.is_empty() {
            break e;
        }
    };
    assert!(!next.reset);
    assert!(matches!(&next.changes[0].change, Some(pb::change::Change::Block(x)) if x.id == b.id));
    node.shutdown().await;
}

#[tokio::test]
async fn metrics_and_ready_on_the_same_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let node = start(dir.path(), addr, 10_000).await;
    client(addr).publish(vec![block(1)], None).await.expect("publish");
    let ready = http::get(addr, "/ready").await.expect("/ready");
    assert_eq!(ready.status, 200, "{}", ready.text());
    let m = http::get(addr, "/metrics").await.expect("/metrics").text();
    for name in [
        "mira_catalog_raft_term 1",
        "mira_catalog_raft_leader_id 0",
        "mira_catalog_raft_applied_index",
        "mira_catalog_raft_log_entries",
        "mira_catalog_blocks{state=\"live\"} 1",
        "mira_catalog_command_duration_seconds_count{command=\"publish\",outcome=\"ok\"} 1",
    ] {
        assert!(m.contains(name), "/metrics lacks {name}:\n{m}");
    }
    node.shutdown().await;
}

#[tokio::test]
async fn restore_from_a_snapshot_file_into_an_empty_member() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let node = start(dir.path(), addr, 1_000_000).await;
    let c = client(addr);
    let mut want = Vec::new();
    for i in 0..30 {
        let b = block(i);
        want.push(b.id.clone());
        c.publish(vec![b], None).await.expect("publish");
    }
    let index = c.trigger_snapshot().await.expect("snapshot");
    assert!(index >= 30, "snapshot at {index}");
    node.shutdown().await;

    // Backup: the snapshot file alone. Restore: a new data dir holding only it.
    let restored = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(restored.path().join("state")).expect("mkdir");
    std::fs::copy(
        dir.path().join("state/snapshot.bin"),
        restored.path().join("state/snapshot.bin"),
    )
    .expect("copy snapshot");
    let node = start(restored.path(), addr, 1_000_000).await;
    let c = client(addr);
    let (blocks, ..) = everything(&c).await;
    let mut got: Vec<String> = blocks.into_iter().map(|b| b.id).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    let v = c.publish(vec![block(99)], None).await.expect("writes after restore");
    assert!(v > index, "versions continue after the snapshot ({v} <= {index})");
    node.shutdown().await;
}

/// The compactor's calls end to end: a lease with a job, ReplaceV2,
/// Abandon, quarantine marks in listings and a watch reset, listing every tenant
/// page by page and by partition, all surviving a restart from a snapshot.
#[tokio::test]
async fn compactor_calls_and_their_state_survive_a_snapshot() {
    const HOUR: i64 = 3_600_000_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let node = start(dir.path(), addr, 10_000).await;
    let c = client(addr);
    let hour = EPOCH_NS - EPOCH_NS % HOUR;
    let inputs: Vec<pb::Block> = (0..3)
        .map(|i| mira_catalog::testing::block("t", hour + i, 10))
        .collect();
    let others: Vec<pb::Block> = (0..4)
        .map(|i| mira_catalog::testing::block("u", hour + i, 10))
        .collect();
    c.publish(inputs.iter().chain(&others).cloned().collect(), None)
        .await
        .expect("publish");

    let key = format!("part/t/logs/{hour}");
    let lease = c
        .acquire_lease(&key, "c-1/01J", EPOCH_NS, 60_000, Some(r#"{"v":1}"#.into()))
        .await
        .expect("acquire");
    assert_eq!(lease.job, r#"{"v":1}"#);
    let lease = c
        .renew_lease(&key, "c-1/01J", EPOCH_NS + 1, 60_000, None)
        .await
        .expect("renew");
    assert_eq!(lease.job, r#"{"v":1}"#, "renewing without a job keeps it");

    let mut merged = mira_catalog::testing::block("t", hour, 20);
    merged.rows = 3;
    let replace = pb::ReplaceV2 {
        add: vec![merged.clone()],
        tombstone: inputs.iter().map(|b| b.id.clone()).collect(),
        now_ns: EPOCH_NS + 2,
        lease_key: key.clone(),
        lease_holder: "c-1/01J".into(),
        reason: pb::ReplaceReason::Merge as i32,
        dropped_rows: 0,
    };
    c.replace_v2(replace.clone()).await.expect("replace");
    c.replace_v2(replace.clone()).await.expect("a retry succeeds");
    let err = c
        .replace_v2(pb::ReplaceV2 {
            reason: pb::ReplaceReason::Unspecified as i32,
            ..replace
        })
        .await
        .expect_err("no reason");
    assert_eq!(err.code(), Code::InvalidArgument);

    let fenced = BlockId::new().to_string();
    c.abandon(vec![fenced.clone()]).await.expect("abandon");
    let err = c.abandon(vec![merged.id.clone()]).await.expect_err("known");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains(&merged.id), "{err}");

    c.mark_no_compact(vec![others[0].id.clone()], "bad footer")
        .await
        .expect("mark");

    let all = c.list_all_blocks(&[pb::BlockState::Live]).await.expect("all");
    let mut live: Vec<String> = all.iter().map(|b| b.id.clone()).collect();
    live.sort();
    let mut want: Vec<String> = others.iter().map(|b| b.id.clone()).chain([merged.id.clone()]).collect();
    want.sort();
    assert_eq!(live, want);
    // The same, two at a time.
    let mut paged = Vec::new();
    let mut page_token = String::new();
    loop {
        let r = c
            .list_blocks(pb::ListBlocksRequest {
                max_time_ns: i64::MAX,
                limit: 2,
                page_token,
                ..Default::default()
            })
            .await
            .expect("page");
        assert!(r.blocks.len() <= 2);
        paged.extend(r.blocks.into_iter().map(|b| b.id));
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    assert_eq!(paged, all.iter().map(|b| b.id.clone()).collect::<Vec<_>>());
    let in_partition = |p: i64| pb::ListBlocksRequest {
        max_time_ns: i64::MAX,
        partition_start_ns: Some(p),
        states: vec![pb::BlockState::Tombstoned as i32],
        ..Default::default()
    };
    let tombstoned = c.list_blocks(in_partition(hour)).await.expect("partition").blocks;
    assert_eq!(tombstoned.len(), 3);
    assert!(
        c.list_blocks(in_partition(hour + HOUR))
            .await
            .expect("next hour")
            .blocks
            .is_empty()
    );

    // Everything survives a restart from the snapshot alone.
    c.trigger_snapshot().await.expect("snapshot");
    node.shutdown().await;
    let node = start(dir.path(), addr, 10_000).await;
    let c = std::sync::Arc::new(client(addr));
    let leases = c
        .list_leases(pb::ListLeasesRequest { linearizable: true })
        .await
        .expect("leases")
        .leases;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].job, r#"{"v":1}"#);
    let again = c.list_all_blocks(&[pb::BlockState::Live]).await.expect("all");
    assert_eq!(again, all);
    assert_eq!(
        again.iter().filter(|b| !b.no_compact_reason.is_empty()).count(),
        1,
        "the mark survives"
    );
    // A watch from before the snapshot starts with a reset: the rows carry
    // their marks.
    let mut watch = c.watch(0);
    let mut reset = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("watch stalled")
            .expect("watch ended");
        reset.extend(e.changes.into_iter().filter_map(|ch| match ch.change {
            Some(pb::change::Change::Block(b)) => Some(b),
            _ => None,
        }));
        if e.reset_done {
            break;
        }
    }
    let marked = reset.iter().find(|b| b.id == others[0].id).expect("marked block");
    assert_eq!(marked.no_compact_reason, "bad footer");
    assert!(
        reset
            .iter()
            .filter(|b| b.id != others[0].id)
            .all(|b| b.no_compact_reason.is_empty())
    );
    let mut late = mira_catalog::testing::block("t", hour, 1);
    late.object_key = late.object_key.replace(&late.id, &fenced);
    late.id = fenced;
    let err = c.publish(vec![late], None).await.expect_err("abandoned id");
    assert_eq!(err.code(), Code::FailedPrecondition);
    c.release_lease(&key, "c-1/01J").await.expect("release");
    assert!(
        c.list_leases(pb::ListLeasesRequest::default())
            .await
            .expect("leases")
            .leases
            .is_empty()
    );
    node.shutdown().await;
}
