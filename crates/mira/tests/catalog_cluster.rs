//! The catalog as a 3-member cluster of real `mira catalog` processes:
//! leader kills under load, restart from disk through a snapshot, racing
//! replaces and watch across a leader change.

#[path = "support/procs.rs"]
mod procs;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientConfig};
use mira_testkit::EPOCH_NS;
use mira_testkit::net::wait_for;
use procs::{Procs, Role};

const TENANT: &str = "acme";

/// The flags of every member: snapshots and log purges as given, fast
/// heartbeats and elections.
fn member_flags(snapshot_every: u64, keep_logs: u64) -> Vec<String> {
    [
        "--snapshot-every",
        &snapshot_every.to_string(),
        "--keep-logs",
        &keep_logs.to_string(),
        "--heartbeat",
        "50ms",
        "--election-timeout",
        "300ms",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A cluster of `n` catalog members (all of the harness's processes).
fn cluster(n: usize, snapshot_every: u64, keep_logs: u64) -> Procs {
    let flags = member_flags(snapshot_every, keep_logs);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // A leader that removes itself forgets registrations only after it
    // stepped down (a fault hook): the race CI once lost, made certain.
    Procs::catalogs(
        n,
        &flags,
        &[
            ("MIRA_LOG", "info,openraft=warn"),
            ("MIRA_TEST_FORGET_AFTER_STEP_DOWN", "1"),
        ],
    )
}

/// A publishable block of tenant `tenant` with a fresh id, `seq` seconds
/// after [`EPOCH_NS`].
fn block(tenant: &str, seq: i64) -> pb::Block {
    mira_catalog::testing::block(tenant, EPOCH_NS + seq * 1_000_000_000, 500_000_000)
}

/// Waits until every running member serves exactly `expected` blocks and
/// returns their listings.
async fn converged(c: &Procs, expected: usize) -> Vec<Vec<pb::Block>> {
    let n = c.iter().count();
    wait_for("all members to converge", Duration::from_secs(60), || async {
        let mut all = Vec::new();
        for i in 0..n {
            let blocks = c.blocks_on(i, TENANT).await?;
            if blocks.len() != expected {
                return None;
            }
            all.push(blocks);
        }
        Some(all)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_survive_two_leader_kills() {
    let mut c = cluster(3, 2_000, 500);
    c.leader().await;
    let client = c.client();
    const CLIENTS: usize = 4;
    const BATCH: usize = 5;
    const TOTAL: usize = 20_000;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..CLIENTS {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes: Vec<(Vec<String>, bool)> = Vec::new();
            for b in 0..TOTAL / CLIENTS / BATCH {
                let blocks: Vec<pb::Block> = (0..BATCH)
                    .map(|k| block(TENANT, ((w * TOTAL + b * BATCH + k) % 80_000) as i64))
                    .collect();
                let ids = blocks.iter().map(|b| b.id.clone()).collect();
                let ok = client.publish(blocks, None).await.is_ok();
                outcomes.push((ids, ok));
                done.fetch_add(BATCH, Ordering::Relaxed);
            }
            outcomes
        }));
    }
    // Kill the leader twice while the clients run; restart it each time so
    // the cluster keeps a quorum for the next kill.
    let mut killed = Vec::new();
    for threshold in [TOTAL / 4, TOTAL * 5 / 8] {
        wait_for("publishes to progress", Duration::from_secs(120), || async {
            (done.load(Ordering::Relaxed) >= threshold).then_some(())
        })
        .await;
        let leader = c.leader().await;
        c.kill(leader);
        killed.push(leader);
        let new_leader = c.leader().await;
        assert_ne!(new_leader, leader);
        c.start(leader);
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.extend(t.await.expect("client task"));
    }
    let ok: Vec<&String> = outcomes.iter().filter(|(_, ok)| *ok).flat_map(|(ids, _)| ids).collect();
    assert!(
        ok.len() >= TOTAL * 9 / 10,
        "only {} of {TOTAL} publishes succeeded",
        ok.len()
    );

    // The final count is what the leader holds (linearizable).
    let final_count = client
        .list_blocks(pb::ListBlocksRequest {
            tenant: TENANT.into(),
            signal: pb::Signal::Logs as i32,
            min_time_ns: 0,
            max_time_ns: i64::MAX,
            states: vec![],
            linearizable: true,
            ..Default::default()
        })
        .await
        .expect("linearizable list")
        .blocks
        .len();
    let listings = converged(&c, final_count).await;
    let sent: HashSet<&str> = outcomes
        .iter()
        .flat_map(|(ids, _)| ids.iter().map(String::as_str))
        .collect();
    for (i, blocks) in listings.iter().enumerate() {
        // Every member applied the same log: the same records, field for
        // field (a command applied twice or out of order on one member
        // would show here), and nothing that no client sent.
        assert_eq!(blocks, &listings[0], "member {i} differs from member 0");
        if let Some(b) = blocks.iter().find(|b| !sent.contains(b.id.as_str())) {
            panic!("member {i} lists block {} that no client published", b.id);
        }
        let counts: HashMap<&str, usize> = blocks.iter().map(|b| (b.id.as_str(), 1)).collect();
        for id in &ok {
            assert_eq!(
                counts.get(id.as_str()),
                Some(&1),
                "member {i} lacks acknowledged block {id}"
            );
        }
        for (ids, acked) in &outcomes {
            let present = ids.iter().filter(|id| counts.contains_key(id.as_str())).count();
            assert!(
                present == 0 || present == ids.len(),
                "member {i}: a publish (acknowledged: {acked}) is half there ({present} of {})",
                ids.len()
            );
        }
    }
    assert_eq!(killed.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_from_disk_catches_up_through_a_snapshot() {
    // Snapshot often and keep few entries behind it, so the stopped member
    // falls behind the purged log.
    let mut c = cluster(3, 300, 50);
    let leader = c.leader().await;
    let follower = (leader + 1) % 3;
    let client = c.client();
    for i in 0..200 {
        client.publish(vec![block(TENANT, i)], None).await.expect("publish");
    }
    let behind = c.status(follower).await.expect("follower status").applied_index;
    c.kill(follower);
    for i in 200..2_000 {
        client
            .publish(vec![block(TENANT, i)], None)
            .await
            .expect("publish while a member is down");
    }
    let purged = wait_for("the leader to purge its log", Duration::from_secs(30), || async {
        let l = c.leader().await;
        let s = c.status(l).await?;
        (s.purged_index > behind).then_some(s.purged_index)
    })
    .await;
    c.start(follower);
    let listings = converged(&c, 2_000).await;
    let s = c.status(follower).await.expect("restarted follower status");
    assert!(
        s.snapshot_index >= purged,
        "the follower must have installed a snapshot past the purged log ({} < {purged})",
        s.snapshot_index
    );
    let want: HashSet<&str> = listings[leader].iter().map(|b| b.id.as_str()).collect();
    let got: HashSet<&str> = listings[follower].iter().map(|b| b.id.as_str()).collect();
    assert_eq!(want, got);

    // A second restart finds everything on its own disk.
    c.kill(follower);
    c.start(follower);
    converged(&c, 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replaces_one_wins() {
    let c = cluster(3, 10_000, 1_000);
    c.leader().await;
    let a = c.client();
    let b = c.client();
    let mut seq = 0;
    for round in 0..20 {
        let blocks: Vec<pb::Block> = (0..10)
            .map(|_| {
                seq += 1;
                block(TENANT, seq)
            })
            .collect();
        let ids: Vec<String> = blocks.iter().map(|b| b.id.clone()).collect();
        a.publish(blocks, None).await.expect("seed");
        seq += 1;
        let merged_a = block(TENANT, seq);
        seq += 1;
        let merged_b = block(TENANT, seq);
        let replace = |add: pb::Block, old: &[String]| pb::Replace {
            add: vec![add],
            tombstone: old.to_vec(),
            now_ns: EPOCH_NS,
            ..Default::default()
        };
        let ra = replace(merged_a.clone(), &ids[0..6]);
        let rb = replace(merged_b.clone(), &ids[4..10]);
        let (x, y) = tokio::join!(a.replace(ra), b.replace(rb));
        assert!(
            x.is_ok() != y.is_ok(),
            "round {round}: exactly one replace wins ({x:?}, {y:?})"
        );
        let loser = x.as_ref().err().or(y.as_ref().err()).expect("a loser");
        assert_eq!(loser.code(), tonic::Code::FailedPrecondition, "round {round}: {loser}");
        assert!(loser.to_string().contains("no longer live"), "{loser}");
        let (winner_new, winner_old, loser_new, survivors) = if x.is_ok() {
            (&merged_a, &ids[0..6], &merged_b, &ids[6..10])
        } else {
            (&merged_b, &ids[4..10], &merged_a, &ids[0..4])
        };
        let all = a
            .list_blocks(pb::ListBlocksRequest {
                tenant: TENANT.into(),
                signal: pb::Signal::Logs as i32,
                min_time_ns: 0,
                max_time_ns: i64::MAX,
                states: vec![pb::BlockState::Live as i32, pb::BlockState::Tombstoned as i32],
                linearizable: true,
                ..Default::default()
            })
            .await
            .expect("list");
        let state: HashMap<&str, i32> = all.blocks.iter().map(|b| (b.id.as_str(), b.state)).collect();
        assert_eq!(state.get(winner_new.id.as_str()), Some(&(pb::BlockState::Live as i32)));
        assert_eq!(
            state.get(loser_new.id.as_str()),
            None,
            "the losing replace added nothing"
        );
        for id in winner_old {
            assert_eq!(state.get(id.as_str()), Some(&(pb::BlockState::Tombstoned as i32)));
        }
        for id in survivors {
            assert_eq!(state.get(id.as_str()), Some(&(pb::BlockState::Live as i32)));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_delivers_every_change_in_order_across_a_leader_change() {
    let mut c = cluster(3, 10_000, 1_000);
    c.leader().await;
    let client = c.client();
    let watcher = c.client();
    let mut stream = watcher.watch(0);
    let mut published = Vec::new();
    for i in 0..300 {
        let b = block(TENANT, i);
        client.publish(vec![b.clone()], None).await.expect("publish");
        published.push(b.id);
    }
    // Kill the leader, then (if it is another) the member the watch is
    // attached to (a fresh client watches the first member).
    let leader = c.leader().await;
    c.kill(leader);
    for i in 300..450 {
        let b = block(TENANT, i);
        client
            .publish(vec![b.clone()], None)
            .await
            .expect("publish after the leader died");
        published.push(b.id);
    }
    c.start(leader);
    if leader != 0 {
        c.leader().await;
        c.kill(0);
    }
    for i in 450..600 {
        let b = block(TENANT, i);
        client
            .publish(vec![b.clone()], None)
            .await
            .expect("publish after the watched member died");
        published.push(b.id);
    }
    if leader != 0 {
        c.start(0);
    }

    let mut seen: Vec<String> = Vec::new();
    let mut last_version = 0;
    let want: HashSet<&String> = published.iter().collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < published.len() {
        let event = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("watch stalled")
            .expect("watch ended");
        assert!(!event.reset, "history covers the whole test; no reset expected");
        if event.changes.is_empty() {
            // Progress and heartbeats never go back.
            assert!(event.version >= last_version, "{} after {last_version}", event.version);
        } else {
            assert!(
                event.version > last_version,
                "changes go forward: {} after {last_version}",
                event.version
            );
        }
        last_version = event.version;
        for ch in event.changes {
            if let Some(pb::change::Change::Block(b)) = ch.change {
                assert!(want.contains(&b.id), "unexpected block {}", b.id);
                seen.push(b.id);
            }
        }
    }
    // Every publish exactly once, in the order they were acknowledged.
    assert_eq!(seen, published);
}

/// Adds a member, then removes the leader by asking the leader itself
/// (the case where the leader steps down after the change and cannot
/// commit what it proposes later), then brings the removed id back on an
/// empty disk: that only works if its registration was forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed_through_raft() {
    let mut c = cluster(3, 10_000, 1_000);
    c.leader().await;
    let client = c.client();
    for i in 0..50 {
        client.publish(vec![block(TENANT, i)], None).await.expect("publish");
    }
    let new = c.add(Role::Catalog, &[]);
    (c[new].flags, c[new].env) = (c[0].flags.clone(), c[0].env.clone());
    c.start(new);
    let all: Vec<pb::Member> = c
        .iter()
        .map(|m| pb::Member {
            id: m.id,
            address: m.addr.clone(),
            voter: true,
            incarnation: String::new(),
        })
        .collect();
    let reply = client.change_membership(all.clone()).await.expect("add member 3");
    assert_eq!(reply.members.iter().filter(|m| m.voter).count(), 4);
    converged(&c, 50).await;

    // The leader removes itself, then stops: the other three keep serving
    // writes.
    let leader = c.leader().await;
    let gone = c[leader].id;
    let survivor = if leader == new { 0 } else { new };
    let old_incarnation = wait_for("the leader to be registered", Duration::from_secs(30), || async {
        let s = c.status(survivor).await?;
        s.members
            .iter()
            .find(|m| m.id == gone && !m.incarnation.is_empty())
            .map(|m| m.incarnation.clone())
    })
    .await;
    let without_leader: Vec<pb::Member> = all.iter().filter(|m| m.id != gone).cloned().collect();
    let to_leader = CatalogClient::new(
        vec![c[leader].addr.clone()],
        ClientConfig {
            timeout: Duration::from_secs(30),
            dialer: c.dialer(),
            ..ClientConfig::default()
        },
    );
    let reply = to_leader
        .change_membership(without_leader)
        .await
        .expect("the leader removes itself");
    assert!(reply.members.iter().all(|m| m.id != gone), "{reply:?}");
    c.kill(leader);
    for i in 50..80 {
        client
            .publish(vec![block(TENANT, i)], None)
            .await
            .expect("publish after removal");
    }
    let status = c.status(survivor).await.expect("status");
    assert_eq!(status.members.iter().filter(|m| m.voter).count(), 3);
    wait_for("the survivor to have every block", Duration::from_secs(30), || async {
        (c.blocks_on(survivor, TENANT).await?.len() == 80).then_some(())
    })
    .await;

    // The removed id comes back on an empty disk and is added again: its
    // old registration was forgotten, so it registers anew and catches up.
    std::fs::remove_dir_all(&c[leader].dir).expect("wipe the removed member");
    c.start(leader);
    let reply = client.change_membership(all).await.expect("add the id back");
    assert_eq!(reply.members.iter().filter(|m| m.voter).count(), 4);
    wait_for(
        "the re-added member to have every block",
        Duration::from_secs(60),
        || async { (c.blocks_on(leader, TENANT).await?.len() == 80).then_some(()) },
    )
    .await;
    let back = wait_for(
        "the re-added member to register anew",
        Duration::from_secs(60),
        || async {
            let s = c.status(survivor).await?;
            s.members
                .iter()
                .find(|m| m.id == gone && !m.incarnation.is_empty() && m.incarnation != old_incarnation)
                .map(|m| m.incarnation.clone())
        },
    )
    .await;
    let ready = mira_testkit::http::get(&c[leader].addr, "/ready")
        .await
        .expect("/ready");
    assert_eq!(ready.status, 200, "{back}: {}", String::from_utf8_lossy(&ready.body));
}

/// Backup and restore as docs/operations.md gives them: `catalog-admin
/// snapshot`, copy `<data-dir>/catalog/state/snapshot.bin`, later a member
/// whose `<data-dir>/catalog` holds only that file serves exactly what
/// was published before the backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restored_from_a_backup_snapshot_serves_what_the_backup_held() {
    let mut c = cluster(1, 10_000, 1_000);
    let client = c.client();
    let before: Vec<pb::Block> = (0..50).map(|i| block(TENANT, i)).collect();
    client.publish(before.clone(), None).await.expect("publish");
    let out = c
        .cli()
        .args(["catalog-admin", "--catalog", &c[0].addr, "snapshot"])
        .output()
        .expect("catalog-admin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("snapshot at log index"));
    let catalog_dir = c[0].dir.join("catalog");
    let backup = std::fs::read(catalog_dir.join("state/snapshot.bin")).expect("the snapshot file");
    // Published after the backup: not in it.
    client.publish(vec![block(TENANT, 999)], None).await.expect("publish");
    c.stop(0);
    std::fs::remove_dir_all(&catalog_dir).expect("wipe");
    std::fs::create_dir_all(catalog_dir.join("state")).expect("mkdir");
    std::fs::write(catalog_dir.join("state/snapshot.bin"), backup).expect("restore");
    c.start(0);
    let restored = converged(&c, before.len()).await.remove(0);
    let want: HashSet<&str> = before.iter().map(|b| b.id.as_str()).collect();
    let got: HashSet<&str> = restored.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(got, want);
    // And it takes writes again, after the snapshot's index.
    client
        .publish(vec![block(TENANT, 1_000)], None)
        .await
        .expect("publish after restore");
    converged(&c, before.len() + 1).await;
}
