//! A catalog member whose data directory is lost (a StatefulSet pod whose
//! volume was deleted comes back with the same ordinal, so the same id, on
//! an empty disk) refuses to start under its old id, with real `mira
//! catalog` processes over sockets; a wiped member 0 never bootstraps a
//! second cluster beside the running one; and the documented recovery
//! (set-members without the id, start the empty member, set-members with
//! it) brings the id back as a new member.

#[path = "support/procs.rs"]
mod procs;

use std::time::Duration;

use mira_catalog::proto as pb;
use mira_testkit::net::wait_for;
use procs::{Procs, child_exit};

fn cluster() -> Procs {
    Procs::catalogs(
        3,
        &["--heartbeat", "50ms", "--election-timeout", "300ms"],
        &[("MIRA_LOG", "info,openraft=warn")],
    )
}

/// Waits until some member reports every member registered; returns the
/// incarnations by id.
async fn registered(c: &Procs, ids: &[u64]) -> Vec<(u64, String)> {
    wait_for("every member registered", Duration::from_secs(60), || async {
        for i in 0..c.iter().count() {
            if !c.is_running(i) {
                continue;
            }
            let Some(s) = c.status(i).await else { continue };
            let regs: Vec<(u64, String)> = s
                .members
                .iter()
                .filter(|m| !m.incarnation.is_empty())
                .map(|m| (m.id, m.incarnation.clone()))
                .collect();
            if regs.iter().map(|(id, _)| *id).collect::<Vec<_>>() == ids {
                return Some(regs);
            }
        }
        None
    })
    .await
}

fn wipe(c: &Procs, i: usize) {
    std::fs::remove_dir_all(&c[i].dir).expect("wipe data dir");
    assert!(!c[i].dir.exists());
}

async fn publish(c: &Procs, n: i64) {
    let block = mira_catalog::testing::block("acme", mira_testkit::EPOCH_NS + n * 1_000_000_000, 1);
    c.client().publish(vec![block], None).await.expect("publish");
}

async fn live_blocks(c: &Procs, i: usize) -> Option<usize> {
    c.blocks_on(i, "acme").await.map(|b| b.len())
}

fn admin(c: &Procs, members: &[usize]) -> String {
    let list: Vec<String> = members.iter().map(|&i| format!("{}={}", c[i].id, c[i].addr)).collect();
    let out = c
        .cli()
        .args([
            "catalog-admin",
            "--catalog",
            &c.catalog_addrs().join(","),
            "set-members",
            &list.join(","),
        ])
        .output()
        .expect("catalog-admin");
    assert!(
        out.status.success(),
        "set-members: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_member_that_lost_its_data_directory_refuses_to_start_and_rejoins_after_set_members() {
    let mut c = cluster();
    c.leader().await;
    let before = registered(&c, &[0, 1, 2]).await;
    publish(&c, 1).await;

    // Member 1 loses its volume and comes back under the same id.
    c.kill(1);
    wipe(&c, 1);
    c.start(1);
    let mut child = c.take(1);
    let status = child_exit(&mut child, "the wiped member");
    assert!(!status.success(), "a wiped member must not start");
    let logs = c.logs();
    assert!(logs.contains("catalog member 1 refuses to start"), "{logs}");
    assert!(logs.contains("lost its data"), "{logs}");
    let (_, old) = before.iter().find(|(id, _)| *id == 1).expect("member 1 was registered");
    assert!(
        logs.contains(old.as_str()),
        "the message names the registered incarnation"
    );
    // It did not write itself a new identity, and the cluster serves on.
    assert!(!c[1].dir.join("catalog").join("member").exists());
    publish(&c, 2).await;
    assert_eq!(live_blocks(&c, 0).await, Some(2));

    // The recovery: remove the id, start the empty member, add it back.
    admin(&c, &[0, 2]);
    registered(&c, &[0, 2]).await;
    c.start(1);
    admin(&c, &[0, 1, 2]);
    let after = registered(&c, &[0, 1, 2]).await;
    let (_, new) = after
        .iter()
        .find(|(id, _)| *id == 1)
        .expect("member 1 registered again");
    assert_ne!(new, old, "a new data directory is a new incarnation");
    wait_for(
        "the rejoined member to hold the blocks",
        Duration::from_secs(60),
        || async { (live_blocks(&c, 1).await == Some(2)).then_some(()) },
    )
    .await;
    let s = c.status(1).await.expect("status");
    assert!(s.members.iter().any(|m| m.id == 1 && m.voter));
}

#[tokio::test]
async fn a_wiped_member_0_never_bootstraps_a_second_cluster() {
    let mut c = cluster();
    c.leader().await;
    registered(&c, &[0, 1, 2]).await;
    publish(&c, 1).await;

    // Every member down; member 0's disk is lost; member 0 starts first,
    // alone: it may not initialize a cluster of its own while its peers
    // cannot answer.
    for i in 0..3 {
        c.kill(i);
    }
    wipe(&c, 0);
    c.start(0);
    let addr = c[0].addr.clone();
    wait_for("the wiped member to answer status", Duration::from_secs(30), || async {
        c.status(0).await.map(|_| ())
    })
    .await;
    let s = c.status(0).await.expect("status");
    assert!(s.members.is_empty(), "it initialized a cluster alone: {s:?}");
    let ready = mira_testkit::http::get(&addr, "/ready").await.expect("/ready");
    assert_eq!(ready.status, 503);
    assert!(String::from_utf8_lossy(&ready.body).contains("empty data directory"));

    // The peers come back: they know member 0, so it refuses to start,
    // and they form the cluster with its data.
    c.start(1);
    c.start(2);
    let mut child = c.take(0);
    let status = child_exit(&mut child, "the wiped member 0");
    assert!(!status.success());
    assert!(c.logs().contains("catalog member 0 refuses to start"));
    wait_for(
        "the survivors to serve the published block",
        Duration::from_secs(60),
        || async { (live_blocks(&c, 1).await == Some(1)).then_some(()) },
    )
    .await;
    let s: pb::StatusReply = c.status(2).await.expect("status");
    assert_eq!(s.members.len(), 3, "still the one cluster of three");
}

#[tokio::test]
async fn a_fresh_cluster_starts_whatever_order_its_members_come_up_in() {
    // Members 1 and 2 first, member 0 last: nobody initializes until the
    // lowest id sees enough peers, then every member registers once.
    let mut c = Procs::new();
    for _ in 0..3 {
        c.add(
            procs::Role::Catalog,
            &["--heartbeat", "50ms", "--election-timeout", "300ms"],
        );
    }
    c.start(2);
    c.start(1);
    wait_for("members 1 and 2 to answer", Duration::from_secs(30), || async {
        (c.status(1).await.is_some() && c.status(2).await.is_some()).then_some(())
    })
    .await;
    assert!(c.status(1).await.expect("status").members.is_empty());
    c.start(0);
    c.leader().await;
    registered(&c, &[0, 1, 2]).await;
    publish(&c, 1).await;
    // A restart on its own disk is not a lost one.
    c.kill(2);
    c.start(2);
    wait_for("member 2 to serve again", Duration::from_secs(60), || async {
        (live_blocks(&c, 2).await == Some(1)).then_some(())
    })
    .await;
}
