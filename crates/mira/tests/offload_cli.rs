//! `mira offload list` and `mira offload restore` as real processes beside
//! a real `mira catalog`: blocks are published to a file:// store and
//! offloaded to a file:// target the way the compactor's offload lane does
//! (mira_compactor::testing), then listed and restored by the binary. The
//! restore is killed right after a PUT (the `fault-hooks` build aborts it
//! there) and run again: it completes, each block restored once and byte
//! for byte the original.

#[path = "support/procs.rs"]
mod procs;

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use mira_catalog::CatalogClient;
use mira_catalog::proto as pb;
use mira_compactor::targets::Targets;
use mira_core::convert::{LogsBuilder, SignalBuilder};
use mira_core::ids::TenantId;
use mira_testkit::corpus::{Cardinality, Corpus};
use object_store::ObjectStore;
use procs::{Procs, Role, bin};
use serde_json::Value;

const H: i64 = 3_600_000_000_000;
const MIN: i64 = 60_000_000_000;

struct Env {
    p: Procs,
    catalog: Arc<CatalogClient>,
    primary: Arc<dyn ObjectStore>,
    targets: Targets,
    /// Original bytes by block id.
    originals: HashMap<String, Bytes>,
    seed: u64,
}

fn now_ns() -> i64 {
    mira_common::clock::Clock::system().now_ns()
}

fn hour_start(hours_ago: i64) -> i64 {
    (now_ns() - hours_ago * H).div_euclid(H) * H
}

impl Env {
    async fn new() -> Env {
        let mut p = Procs::new();
        let c = p.add(Role::Catalog, &[]);
        p.start(c);
        p.leader().await;
        let catalog = p.client();
        let primary = mira_core::store::from_url(&format!("file://{}", p.objects().display()), &[])
            .expect("test step")
            .store;
        let targets = Targets::open(
            &[format!("archive=file://{}", p.root.path().join("archive").display())],
            &[],
        )
        .expect("test step");
        Env {
            p,
            catalog,
            primary,
            targets,
            originals: HashMap::new(),
            seed: 0,
        }
    }

    fn objects_url(&self) -> String {
        format!("file://{}", self.p.objects().display())
    }

    fn target_spec(&self) -> String {
        format!("archive=file://{}", self.p.root.path().join("archive").display())
    }

    /// Publishes `n` real logs blocks of `tenant` in the hour starting at
    /// `start`, then offloads them and frees their primary objects.
    async fn offloaded(&mut self, tenant: &str, start: i64, n: usize) -> Vec<pb::Block> {
        let tenant = TenantId::new(tenant).expect("test step");
        let mut blocks = Vec::new();
        for i in 0..n {
            self.seed += 1;
            let mut corpus = Corpus::starting_at(self.seed, Cardinality::Low, (start + (1 + i as i64) * MIN) as u64);
            let mut b = LogsBuilder::default();
            b.append(&corpus.logs(25)).expect("test step");
            let tables = b.finish().expect("test step");
            let (record, bytes) =
                mira_compactor::testing::publish_block(&self.catalog, &self.primary, &tenant, &tables, now_ns())
                    .await
                    .expect("test step");
            self.originals.insert(record.id.clone(), bytes);
            blocks.push(record);
        }
        let target = self.targets.get("archive").expect("test step");
        mira_compactor::testing::offload(&self.catalog, &self.primary, target, &blocks, now_ns(), true)
            .await
            .expect("test step");
        blocks
    }

    /// `mira offload ARGS` with the catalog's address, stdin not a
    /// terminal, and `env`.
    fn cli(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.p.cli();
        cmd.arg("offload")
            .args(args)
            .args(["--catalog", self.p.catalog_addr()])
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        cmd.output().expect("run mira offload")
    }

    fn restore(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let objects = self.objects_url();
        let target = self.target_spec();
        let mut all = vec![
            "restore",
            "--object-store",
            &objects,
            "--offload-target",
            &target,
            "--rate",
            "0",
        ];
        all.extend_from_slice(args);
        self.cli(&all, env)
    }

    async fn blocks(&self, state: pb::BlockState) -> HashMap<String, pb::Block> {
        self.catalog
            .list_all_blocks(&[state])
            .await
            .expect("test step")
            .into_iter()
            .map(|b| (b.id.clone(), b))
            .collect()
    }

    fn primary_bytes(&self, b: &pb::Block) -> Option<Vec<u8>> {
        std::fs::read(self.p.objects().join(&b.object_key)).ok()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ndjson(out: &Output) -> Vec<Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_offloaded_partitions_as_a_table_and_json_and_restore_reports_in_text() {
    let mut env = Env::new().await;
    let mut acme = Vec::new();
    for hours_ago in [6, 5, 4] {
        acme.extend(env.offloaded("acme", hour_start(hours_ago), 2).await);
    }
    let other = env.offloaded("other", hour_start(6), 1).await;

    let out = env.cli(&["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + 4 + 1, "{table}");
    assert!(lines[0].starts_with("TENANT  SIGNAL  HOUR"), "{table}");
    assert!(lines[0].ends_with("LOCATION"), "{table}");
    assert!(
        lines[5].starts_with("4 partitions, 7 blocks, 175 rows, ") && lines[5].ends_with("(primary copies freed: 7)"),
        "{table}"
    );
    let archive = env.p.root.path().join("archive").display().to_string();
    assert!(
        lines[1..5].iter().all(|l| l.contains(&format!("file://{archive}/"))),
        "{table}"
    );

    let out = env.cli(&["list", "--tenant", "acme", "--output", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let parts: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let parts = parts.as_array().expect("an array");
    assert_eq!(parts.len(), 3);
    assert_eq!(
        parts.iter().map(|p| p["blocks"].as_u64().expect("blocks")).sum::<u64>(),
        6
    );
    assert!(parts.iter().all(|p| p["tenant"] == "acme" && p["primary_freed"] == 2));

    let out = env.cli(&["list", "--all-tenants", "--blocks", "--output", "json"], &[]);
    let blocks: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let blocks = blocks.as_array().expect("an array");
    assert_eq!(blocks.len(), 7);
    for b in blocks {
        let id = b["id"].as_str().expect("id");
        let sha = mira_compactor::copy::sha256_hex(&env.originals[id]);
        assert_eq!(b["sha256"], sha.as_str(), "block {id}");
    }
    let out = env.cli(&["list", "--signal", "traces", "--output", "json"], &[]);
    assert_eq!(text(&out.stdout).trim(), "[]");

    // A dry run prints the plan and writes nothing.
    let out = env.restore(&["--tenant", "other", "--dry-run"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("restore other all signals all time: 1 blocks, "),
        "{stdout}"
    );
    assert!(stdout.contains("to copy: 1 blocks"), "{stdout}");
    assert!(env.primary_bytes(&other[0]).is_none());

    // A restore in text mode (stdout not a terminal): the plan first, the
    // summary last.
    let out = env.restore(&["--tenant", "other"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("restore other all signals all time: 1 blocks"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("done: 1 restored (") && lines[1].ends_with("verified 1 primary objects"),
        "{stdout}"
    );
    assert_eq!(
        env.primary_bytes(&other[0]).as_deref(),
        Some(&env.originals[&other[0].id][..])
    );
    let out = env.cli(&["list", "--output", "json"], &[]);
    let parts: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        parts.as_array().map(Vec::len),
        Some(3),
        "the restored partition is no longer listed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_naming_the_flag() {
    // None of these reaches the catalog (there is none).
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["restore", "--object-store", "file:///tmp/x"],
            &["--tenant", "--all-tenants"],
        ),
        (
            &["restore", "--tenant", "acme", "--dry-run", "--from", "yesterday"],
            &["--from"],
        ),
        (
            &[
                "restore",
                "--tenant",
                "acme",
                "--dry-run",
                "--from",
                "-1d",
                "--to",
                "-2d",
            ],
            &["--from", "--to"],
        ),
        (
            &["restore", "--tenant", "acme", "--dry-run", "--block", "not-a-ulid"],
            &["--block"],
        ),
        (
            &["restore", "--tenant", "acme", "--dry-run", "--signal", "profiles"],
            &["--signal"],
        ),
        (
            &["restore", "--tenant", "acme", "--dry-run", "--rate", "fast"],
            &["--rate"],
        ),
        (&["restore", "--tenant", "Acme Corp", "--dry-run"], &["--tenant"]),
        (&["restore", "--tenant", "acme"], &["--object-store"]),
        (
            &[
                "restore",
                "--tenant",
                "acme",
                "--object-store",
                "file:///tmp/x",
                "--offload-target",
                "archive",
            ],
            &["--offload-target"],
        ),
        (
            &["list", "--tenant", "acme", "--all-tenants"],
            &["--tenant", "--all-tenants"],
        ),
        (&["list", "--output", "yaml"], &["--output"]),
    ];
    for (args, names) in cases {
        let out = Command::new(bin())
            .arg("offload")
            .args(*args)
            .args(["--catalog", "127.0.0.1:1"])
            .stdin(Stdio::null())
            .output()
            .expect("run mira offload");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for n in *names {
            assert!(stderr.contains(n), "{args:?}: the message names {n}: {stderr}");
        }
    }
}

/// The ids of the `block` events of `events` with `result`.
fn block_ids(events: &[Value], result: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["event"] == "block" && e["result"] == result)
        .map(|e| e["id"].as_str().expect("id").to_owned())
        .collect()
}

#[cfg(feature = "fault-hooks")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_killed_after_a_put_or_a_mark_completes_on_a_rerun_each_block_restored_once() {
    let mut env = Env::new().await;
    let mut blocks = Vec::new();
    for hours_ago in [6, 5, 4] {
        blocks.extend(env.offloaded("acme", hour_start(hours_ago), 2).await);
    }
    // One partition at a time, leases that a killed run leaves for 3 s.
    let run = |fault: Option<&str>| {
        let args = [
            "--tenant",
            "acme",
            "--concurrency",
            "1",
            "--partition-lease-ttl",
            "3s",
            "--output",
            "json",
        ];
        match fault {
            Some(step) => env.restore(&args, &[("MIRA_FAULT_RESTORE", step)]),
            None => env.restore(&args, &[]),
        }
    };

    // Aborted right after its first PUT, before any mark.
    let out = run(Some("after_put"));
    assert_eq!(out.status.code(), None, "killed by SIGABRT: {}", text(&out.stderr));
    assert_eq!(
        env.blocks(pb::BlockState::Offloaded).await.len(),
        6,
        "nothing marked before the kill"
    );
    let written = blocks.iter().filter(|b| env.primary_bytes(b).is_some()).count();
    assert_eq!(written, 1, "one object was put before the abort");

    // Aborted right after marking the first partition (having waited out
    // the first run's lease): those blocks are live, the rest offloaded.
    let out = run(Some("after_mark"));
    assert_eq!(out.status.code(), None, "killed by SIGABRT: {}", text(&out.stderr));
    let mut restored = block_ids(&ndjson(&out), "restored");
    assert_eq!(restored.len(), 2, "the first partition was marked");
    assert_eq!(env.blocks(pb::BlockState::Offloaded).await.len(), 4);

    // The re-run completes the rest, as NDJSON from the plan to the summary.
    let out = run(None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events = ndjson(&out);
    assert_eq!(events.first().map(|e| e["event"].clone()), Some("plan".into()));
    let summary = events.last().expect("events");
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["restored"], 4);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["verified"], 4);
    assert_eq!(summary["interrupted"], false);
    restored.extend(block_ids(&events, "restored"));
    restored.sort_unstable();
    let mut want: Vec<String> = blocks.iter().map(|b| b.id.clone()).collect();
    want.sort_unstable();
    assert_eq!(restored, want, "each block restored once");
    let live = env.blocks(pb::BlockState::Live).await;
    for b in &blocks {
        assert!(live.contains_key(&b.id), "block {} is live", b.id);
        assert_eq!(
            env.primary_bytes(b).as_deref(),
            Some(&env.originals[&b.id][..]),
            "block {}",
            b.id
        );
    }

    // Another run finds nothing to do.
    let events = ndjson(&run(None));
    let summary = events.last().expect("events");
    assert_eq!(
        (summary["restored"].as_u64(), summary["copied"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_finishes_what_is_in_flight_releases_leases_and_exits_130() {
    let mut env = Env::new().await;
    let first = env.offloaded("acme", hour_start(5), 1).await;
    let second = env.offloaded("acme", hour_start(4), 1).await;
    // A compactor holds the second partition: the restore does the first,
    // then waits there.
    let held = format!("part/acme/logs/{}", hour_start(4));
    env.catalog
        .acquire_lease(&held, "compactor-9/01TESTHOLDER", now_ns(), 600_000, None)
        .await
        .expect("test step");
    let objects = env.objects_url();
    let target = env.target_spec();
    let mut child = env
        .p
        .cli()
        .args(["offload", "restore", "--catalog", env.p.catalog_addr()])
        .args(["--object-store", &objects, "--offload-target", &target])
        .args(["--tenant", "acme", "--concurrency", "1", "--output", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mira offload restore");
    let stdout = child.stdout.take().expect("stdout");
    let pid = child.id().to_string();
    let lines = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.expect("read stdout");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if v["event"] == "waiting" {
                assert_eq!(v["holder"], "compactor-9/01TESTHOLDER");
                let _ = Command::new("kill").args(["-INT", &pid]).status();
            }
            lines.push(v);
        }
        lines
    })
    .await
    .expect("test step");
    let status = procs::child_exit(&mut child, "mira offload restore after SIGINT");
    assert_eq!(status.code(), Some(130), "{lines:?}");
    assert!(lines.iter().any(|e| e["event"] == "waiting"), "{lines:?}");
    let summary = lines.last().expect("events");
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["interrupted"], true);
    assert_eq!(
        (summary["restored"].as_u64(), summary["not_started"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(env.blocks(pb::BlockState::Live).await.contains_key(&first[0].id));
    assert!(env.blocks(pb::BlockState::Offloaded).await.contains_key(&second[0].id));
    let now = now_ns();
    let leases = env
        .catalog
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .expect("test step");
    assert!(
        !leases
            .leases
            .iter()
            .any(|l| l.holder.starts_with("cli/") && l.expires_at_ns > now),
        "the restore's leases are released: {leases:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_over_ten_thousand_offloaded_blocks() {
    let env = Env::new().await;
    // 10,000 catalog records (no objects: list reads the catalog only),
    // 40 to an hour over 250 hours.
    let base = hour_start(300);
    let records: Vec<pb::Block> = (0..10_000)
        .map(|i| mira_catalog::testing::block("acme", base + (i / 40) * H + (i % 40) * MIN, MIN))
        .collect();
    for chunk in records.chunks(1000) {
        env.catalog.publish(chunk.to_vec(), None).await.expect("test step");
        let items = chunk
            .iter()
            .map(|b| pb::OffloadItem {
                id: b.id.clone(),
                location: format!("s3://mira-archive/mira/{}", b.object_key),
                sha256: "0".repeat(64),
                at_ns: now_ns(),
            })
            .collect();
        env.catalog.mark_offloaded_v2(items).await.expect("test step");
    }
    for (args, what) in [
        (&["list", "--all-tenants"][..], "table"),
        (&["list", "--all-tenants", "--output", "json"][..], "json"),
        (&["list", "--all-tenants", "--blocks"][..], "blocks table"),
    ] {
        let started = Instant::now();
        let out = env.cli(args, &[]);
        let took = started.elapsed();
        assert!(out.status.success(), "{}", text(&out.stderr));
        // The figure is reported, not asserted (speed is measured, not
        // tested); run with MIRA_TEST_BIN=<a release build> for a real one.
        eprintln!("mira offload list ({what}) over 10,000 offloaded blocks: {took:?} (process start included)");
        let stdout = text(&out.stdout);
        match what {
            "json" => {
                let v: Value = serde_json::from_str(&stdout).expect("JSON");
                let parts = v.as_array().expect("array");
                assert_eq!(parts.len(), 250);
                assert_eq!(
                    parts.iter().map(|p| p["blocks"].as_u64().expect("n")).sum::<u64>(),
                    10_000
                );
            }
            "table" => {
                assert!(
                    stdout.ends_with(
                        "250 partitions, 10,000 blocks, 10,000 rows, 9.8 KiB offloaded (primary copies freed: 0)\n"
                    ),
                    "{}",
                    stdout.lines().last().unwrap_or_default()
                );
                assert!(stdout.contains("s3://mira-archive/mira/acme/logs/"));
            }
            _ => assert_eq!(stdout.lines().count(), 10_002),
        }
    }
}
