//! The compactor as a real process beside a real catalog and ingester,
//! killed: at every step of a job (the `fault-hooks` build aborts it there,
//! as kill -9 would), and with kill -9 at random points while it works
//! under load. After each run the live blocks hold exactly the acknowledged
//! records, once each, and once a final `mira compactor --once` has run the
//! store holds only objects the catalog names.

#[path = "support/procs.rs"]
mod procs;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use mira_catalog::proto as pb;
use mira_testkit::http::{self, wait_ready};
use mira_testkit::net::wait_for;
use procs::{Procs, Role, child_exit, published_blocks, published_bodies, request};

const PB: (&str, &str) = ("Content-Type", "application/x-protobuf");

/// Flags of the compactors of these tests: merge any two blocks at once,
/// plan every second, short leases, delete replaced objects at once and
/// unknown ones after a second.
const FLAGS: &[&str] = &[
    "--min-block-age",
    "0s",
    "--merge-factor",
    "2",
    "--plan-interval",
    "1s",
    "--partition-lease-ttl",
    "3s",
    "--deletion-grace",
    "0s",
    "--orphan-grace",
    "1s",
];

async fn export(p: &Procs, first: u64, n: u64) {
    let answer = http::post(p.http(), "/v1/logs", &[PB], request(first, n))
        .await
        .expect("the ingester answers");
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// Sends `batches` batches of 40 records, each published (sealed) before
/// the next, so the partition gains that many blocks. Returns the next
/// record number.
async fn load(p: &Procs, mut next: u64, batches: usize) -> u64 {
    for _ in 0..batches {
        let before = live_rows(p).await;
        export(p, next, 40).await;
        next += 40;
        wait_for("the batch to be published", Duration::from_secs(60), || async {
            (live_rows(p).await >= before + 40).then_some(())
        })
        .await;
    }
    next
}

async fn live_rows(p: &Procs) -> u64 {
    published_blocks(p, "default", pb::Signal::Logs)
        .await
        .iter()
        .map(|b| b.rows)
        .sum()
}

/// The acknowledged records `rec-0 .. rec-{n-1}` are in the live blocks,
/// each exactly once.
async fn assert_exactly_once(p: &Procs, n: u64, when: &str) {
    let counts = published_bodies(p).await;
    let want: HashMap<String, usize> = (0..n).map(|i| (format!("rec-{i}"), 1)).collect();
    let dup: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).take(10).collect();
    assert!(dup.is_empty(), "{when}: live more than once: {dup:?}");
    let missing: Vec<_> = want.keys().filter(|k| !counts.contains_key(*k)).take(10).collect();
    assert!(missing.is_empty(), "{when}: acknowledged but not live: {missing:?}");
    assert_eq!(counts.len(), want.len(), "{when}: live records never acknowledged");
}

/// Jobs the compactor at `addr` finished with outcome ok.
async fn jobs_ok(addr: &str) -> Option<u64> {
    let text = http::get(addr, "/metrics").await?.text();
    Some(
        text.lines()
            .filter(|l| l.starts_with("mira_compactor_jobs_total{") && l.contains("outcome=\"ok\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64,
    )
}

/// Every block object under the store.
fn object_keys(p: &Procs) -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|x| x == "mira") {
                out.insert(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&p.objects(), &p.objects(), &mut out);
    out
}

/// Stops the ingester (it seals and publishes what is open), runs one
/// `mira compactor --once` to the end, and checks exactness and that the
/// store holds only the live objects.
async fn finish_and_check(p: &mut Procs, c: usize, sent: u64) {
    p.stop_ingester();
    assert_exactly_once(p, sent, "before the final run").await;
    let mut flags = FLAGS.to_vec();
    flags.push("--once");
    p.start_with(c, &flags, &[]);
    let mut child = p.take(c);
    // The last orphans must be older than --orphan-grace (1s) when the
    // final sweep lists them: the run itself waits out takeovers first.
    let status = child_exit(&mut child, "compactor --once");
    assert!(status.success(), "compactor --once failed: {status:?}");
    assert_exactly_once(p, sent, "after the final run").await;
    let live: BTreeSet<String> = published_blocks(p, "default", pb::Signal::Logs)
        .await
        .into_iter()
        .map(|b| b.object_key)
        .collect();
    let stored = object_keys(p);
    let stray: Vec<_> = stored.difference(&live).collect();
    assert!(stray.is_empty(), "objects no live block names: {stray:?}");
    let gone: Vec<_> = live.difference(&stored).collect();
    assert!(gone.is_empty(), "live blocks without an object: {gone:?}");
}

#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_killed_at_every_step_of_a_job_loses_and_doubles_nothing() {
    let mut p = Procs::with_ingester();
    let c = p.add(Role::Compactor, FLAGS);
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let mut sent = 0;
    for step in [
        "after_lease",
        "after_manifest",
        "after_fetch",
        "after_put",
        "after_replace",
        "during_delete",
    ] {
        sent = load(&p, sent, 3).await;
        p.start_with(c, FLAGS, &[("MIRA_FAULT_COMPACTOR", step)]);
        let mut child = p.take(c);
        let status = child_exit(&mut child, step);
        assert!(!status.success(), "{step}: the fault hook did not fire ({status:?})");
        assert_exactly_once(&p, sent, step).await;
    }
    finish_and_check(&mut p, c, sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_killed_at_random_under_load_loses_and_doubles_nothing() {
    let trials: usize = std::env::var("MIRA_CRASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut p = Procs::with_ingester();
    let c = p.add(Role::Compactor, FLAGS);
    p.start_ingester(&[]);
    wait_ready(p.http()).await;
    let mut sent = 0;
    for trial in 0..trials {
        sent = load(&p, sent, 2).await;
        p.start_with(c, FLAGS, &[]);
        let addr = p[c].addr.clone();
        // Once it has merged the batches, more load arrives; it is killed
        // as soon as that is published: while it plans, merges, uploads or
        // commits the next merge, or between rounds.
        wait_for("a compactor job", Duration::from_secs(120), || {
            let addr = addr.clone();
            async move { (jobs_ok(&addr).await? >= 1).then_some(()) }
        })
        .await;
        let mut next = sent;
        export(&p, next, 40).await;
        next += 40;
        wait_for("the last batch to be published", Duration::from_secs(60), || async {
            (live_rows(&p).await >= next).then_some(())
        })
        .await;
        p.kill(c);
        sent = next;
        assert_exactly_once(&p, sent, &format!("trial {trial}")).await;
    }
    finish_and_check(&mut p, c, sent).await;
}
