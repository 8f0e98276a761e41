//! The restore against a real single-member catalog, a file:// primary
//! store and a file:// offload target: real blocks are published, offloaded
//! the way the compactor's offload lane does (copy, MarkOffloadedV2 with
//! the SHA-256, primary deleted and MarkPrimaryFreed under the partition
//! lease), then restored. Every test checks the outcome that matters: the
//! primary objects are byte for byte the originals, the catalog says live
//! and pinned, and what must not be written was not.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, CatalogNode};
use mira_common::clock::Clock;
use mira_compactor::copy::RateLimit;
use mira_compactor::restore::{BlockResult, Event, Options, PartitionResult, Restorer, Selection, Summary};
use mira_compactor::targets::{Target, Targets};
use mira_compactor::testing;
use mira_core::convert::{LogsBuilder, SignalBuilder, TableSet};
use mira_core::ids::{BlockId, TenantId};
use mira_testkit::corpus::{Cardinality, Corpus};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::watch;

const H: i64 = 3_600_000_000_000;
const MIN: i64 = 60_000_000_000;
const KEEP_FOR: Duration = Duration::from_secs(3 * 24 * 3600);

struct Env {
    _dir: tempfile::TempDir,
    _node: CatalogNode,
    catalog: Arc<CatalogClient>,
    primary: Arc<dyn ObjectStore>,
    targets: Targets,
    clock: Clock,
    /// The original bytes of every block published, by id.
    originals: HashMap<String, Bytes>,
    seed: u64,
}

impl Env {
    async fn new() -> Env {
        let dir = tempfile::tempdir().expect("test step");
        let (node, catalog) = support::single_catalog(dir.path()).await;
        let root = format!("file://{}", dir.path().display());
        let primary = mira_core::store::from_url(&format!("{root}/primary"), &[])
            .expect("test step")
            .store;
        let targets = Targets::open(&[format!("archive={root}/archive")], &[]).expect("test step");
        // A clock that stands still: pins are exactly now + keep_for.
        let (clock, _) = Clock::manual(SystemTime::now());
        Env {
            _dir: dir,
            _node: node,
            catalog,
            primary,
            targets,
            clock,
            originals: HashMap::new(),
            seed: 1,
        }
    }

    fn target(&self) -> &Target {
        self.targets.get("archive").expect("test step")
    }

    fn restorer(&self) -> Restorer {
        Restorer::new(
            self.catalog.clone(),
            self.primary.clone(),
            self.targets.clone(),
            self.clock.clone(),
        )
    }

    fn hour_start(&self, hours_ago: i64) -> i64 {
        (self.clock.now_ns() - hours_ago * H).div_euclid(H) * H
    }

    fn tables(&mut self, start_ns: i64, records: usize) -> TableSet {
        self.seed += 1;
        let mut corpus = Corpus::starting_at(self.seed, Cardinality::Low, start_ns as u64);
        let mut b = LogsBuilder::default();
        b.append(&corpus.logs(records)).expect("test step");
        b.finish().expect("test step")
    }

    /// Publishes `n` blocks of `tenant` in the hour starting at
    /// `hour_start`, keeping their bytes.
    async fn publish(&mut self, tenant: &str, hour_start: i64, n: usize) -> Vec<pb::Block> {
        let tenant = TenantId::new(tenant).expect("test step");
        let mut out = Vec::new();
        for i in 0..n {
            let tables = self.tables(hour_start + (1 + i as i64) * MIN, 30);
            let (record, bytes) =
                testing::publish_block(&self.catalog, &self.primary, &tenant, &tables, self.clock.now_ns())
                    .await
                    .expect("test step");
            self.originals.insert(record.id.clone(), bytes);
            out.push(record);
        }
        out
    }

    async fn offload(&self, blocks: &[pb::Block], free_primary: bool) {
        testing::offload(
            &self.catalog,
            &self.primary,
            self.target(),
            blocks,
            self.clock.now_ns(),
            free_primary,
        )
        .await
        .expect("test step");
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

    async fn primary_bytes(&self, b: &pb::Block) -> Option<Bytes> {
        match self.primary.get(&Path::from(b.object_key.as_str())).await {
            Ok(r) => Some(r.bytes().await.expect("test step")),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("GET {}: {e}", b.object_key),
        }
    }

    fn options(&self) -> Options {
        Options {
            holder: format!("cli/test/{}", BlockId::new()),
            keep_for: KEEP_FOR,
            concurrency: 2,
            rate_bytes: 0,
            lease_wait: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(60),
        }
    }

    /// Plans and runs a restore of `sel`; returns the summary and the
    /// events.
    async fn restore(&self, sel: &Selection, opts: &Options) -> (Summary, Vec<Event>) {
        let restorer = self.restorer();
        let plan = restorer.plan(sel).await.expect("test step");
        let events = Mutex::new(Vec::new());
        let (_stop, rx) = watch::channel(false);
        let sink = |e: &Event| events.lock().expect("test step").push(e.clone());
        let summary = restorer.run(&plan, opts, &sink, rx).await;
        (summary, events.into_inner().expect("test step"))
    }
}

fn acme() -> Selection {
    Selection {
        tenant: Some(TenantId::new("acme").expect("test step")),
        ..Selection::default()
    }
}

fn count(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| f(e)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_blocks_are_byte_identical_live_and_pinned_and_a_second_run_copies_nothing() {
    let mut env = Env::new().await;
    let mut acme_blocks = Vec::new();
    for hours_ago in [5, 4, 3] {
        let start = env.hour_start(hours_ago);
        acme_blocks.extend(env.publish("acme", start, 2).await);
    }
    let other = env.publish("other", env.hour_start(5), 1).await;
    // Two partitions freed, one still within the grace (primary present).
    env.offload(&acme_blocks[..4], true).await;
    env.offload(&acme_blocks[4..], false).await;
    env.offload(&other, true).await;
    for b in &acme_blocks[..4] {
        assert!(env.primary_bytes(b).await.is_none(), "the primary of {} is freed", b.id);
    }

    let opts = env.options();
    let (summary, events) = env.restore(&acme(), &opts).await;
    assert_eq!(summary.restored, 6, "{summary:?}");
    assert_eq!(summary.copied, 4, "the partition within the grace needs no copy");
    assert_eq!(summary.failed, 0, "{:?}", summary.failures);
    assert_eq!(summary.verified, 6);
    assert!(!summary.interrupted);
    let bytes: u64 = acme_blocks.iter().map(|b| b.bytes).sum();
    assert_eq!(summary.restored_bytes, bytes);

    let now = env.clock.now_ns();
    let live = env.blocks(pb::BlockState::Live).await;
    for b in &acme_blocks {
        let got = env.primary_bytes(b).await.expect("restored primary object");
        assert!(got == env.originals[&b.id], "block {}: restored bytes differ", b.id);
        let rec = &live[&b.id];
        assert_eq!(rec.pinned_until_ns, now + KEEP_FOR.as_nanos() as i64, "pin of {}", b.id);
        assert!(!rec.primary_freed);
        assert!(!rec.offload_location.is_empty(), "the offload copy is kept");
    }
    let offloaded = env.blocks(pb::BlockState::Offloaded).await;
    assert!(offloaded.contains_key(&other[0].id), "another tenant is not restored");
    assert!(env.primary_bytes(&other[0]).await.is_none());

    // Events: three partitions started and done, six blocks restored, the
    // summary last; no lease left held.
    let parts = |r: PartitionResult| move |e: &Event| matches!(e, Event::Partition { result, .. } if *result == r);
    assert_eq!(count(&events, parts(PartitionResult::Started)), 3);
    assert_eq!(count(&events, parts(PartitionResult::Done)), 3);
    assert_eq!(
        count(
            &events,
            |e| matches!(e, Event::Block(b) if b.result == BlockResult::Restored)
        ),
        6
    );
    assert_eq!(count(&events, |e| matches!(e, Event::Copied { .. })), 4);
    assert!(matches!(events.last(), Some(Event::Summary(s)) if *s == summary));
    let leases = env
        .catalog
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .expect("test step");
    assert!(
        !leases
            .leases
            .iter()
            .any(|l| l.holder == opts.holder && l.expires_at_ns > now),
        "{leases:?}"
    );

    // A second run finds nothing offloaded and copies nothing.
    let (again, _) = env.restore(&acme(), &env.options()).await;
    assert_eq!((again.restored, again.copied, again.failed), (0, 0, 0), "{again:?}");

    // Named blocks: one live already, one the catalog never saw.
    let unknown = BlockId::new();
    let named = Selection {
        block_ids: vec![acme_blocks[0].id.parse().expect("test step"), unknown],
        ..acme()
    };
    let (s, events) = env.restore(&named, &env.options()).await;
    assert_eq!((s.restored, s.already_live, s.failed, s.copied), (0, 1, 1, 0), "{s:?}");
    assert_eq!(s.failures[0].id, unknown.to_string());
    assert_eq!(
        count(
            &events,
            |e| matches!(e, Event::Block(b) if b.result == BlockResult::Skipped)
        ),
        1
    );
    assert_eq!(s.verified, 1, "a named live block's primary is checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_offload_copy_is_refused_and_nothing_is_written() {
    let mut env = Env::new().await;
    let blocks = env.publish("acme", env.hour_start(4), 2).await;
    env.offload(&blocks, true).await;
    // The first block's copy rots in the target: same size, one bit off.
    let bad = &blocks[0];
    let key = Path::from(bad.object_key.as_str());
    let mut rotten = env.originals[&bad.id].to_vec();
    let mid = rotten.len() / 2;
    rotten[mid] ^= 0x01;
    env.target()
        .store
        .put(&key, PutPayload::from(rotten))
        .await
        .expect("test step");

    let (summary, events) = env.restore(&acme(), &env.options()).await;
    assert_eq!((summary.restored, summary.failed), (1, 1), "{summary:?}");
    assert_eq!(summary.failures[0].id, bad.id);
    assert!(
        summary.failures[0].reason.contains("SHA-256"),
        "{}",
        summary.failures[0].reason
    );
    assert!(
        env.primary_bytes(bad).await.is_none(),
        "nothing written for the bad copy"
    );
    assert!(
        env.blocks(pb::BlockState::Offloaded).await.contains_key(&bad.id),
        "the bad block stays offloaded"
    );
    let good = &blocks[1];
    assert!(env.primary_bytes(good).await.expect("restored") == env.originals[&good.id]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Block(b) if b.id == bad.id && b.result == BlockResult::Failed))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_leased_elsewhere_is_waited_for_then_restored_or_given_up() {
    let mut env = Env::new().await;
    let start = env.hour_start(4);
    let blocks = env.publish("acme", start, 1).await;
    env.offload(&blocks, true).await;
    let key = format!("part/acme/logs/{start}");
    let other = "compactor-1/01TESTHOLDER";
    env.catalog
        .acquire_lease(&key, other, env.clock.now_ns(), 600_000, None)
        .await
        .expect("test step");

    // A short wait: given up, the block counted failed and left offloaded.
    let opts = Options {
        lease_wait: Duration::from_millis(300),
        ..env.options()
    };
    let (s, events) = env.restore(&acme(), &opts).await;
    assert_eq!((s.restored, s.failed), (0, 1), "{s:?}");
    assert!(s.failures[0].reason.contains(other), "{}", s.failures[0].reason);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Waiting { lease, holder } if *lease == key && holder == other))
    );
    assert!(env.primary_bytes(&blocks[0]).await.is_none());

    // A long wait: the restore proceeds once the holder lets go.
    let restorer = env.restorer();
    let plan = restorer.plan(&acme()).await.expect("test step");
    let (waiting_tx, mut waiting) = watch::channel(false);
    let sink = move |e: &Event| {
        if matches!(e, Event::Waiting { .. }) {
            waiting_tx.send_replace(true);
        }
    };
    let (_stop, rx) = watch::channel(false);
    let opts = env.options();
    let release = async {
        tokio::time::timeout(Duration::from_secs(20), waiting.wait_for(|w| *w))
            .await
            .expect("the restore says it waits")
            .expect("test step");
        env.catalog.release_lease(&key, other).await.expect("test step");
    };
    let (summary, ()) = tokio::join!(restorer.run(&plan, &opts, &sink, rx), release);
    assert_eq!((summary.restored, summary.failed), (1, 0), "{summary:?}");
    assert!(env.primary_bytes(&blocks[0]).await.expect("restored") == env.originals[&blocks[0].id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_writes_nothing_and_an_interrupted_run_starts_nothing_new() {
    let mut env = Env::new().await;
    let mut blocks = env.publish("acme", env.hour_start(5), 2).await;
    blocks.extend(env.publish("acme", env.hour_start(4), 1).await);
    env.offload(&blocks, true).await;

    // The plan (what --dry-run prints) reads the catalog only.
    let restorer = env.restorer();
    let plan = restorer.plan(&acme()).await.expect("test step");
    let bytes: u64 = blocks.iter().map(|b| b.bytes).sum();
    let info = plan.info(1 << 20);
    assert_eq!((info.blocks, info.to_restore, info.partitions), (3, 3, 2));
    assert_eq!(info.bytes, bytes);
    assert_eq!(info.estimated_s, Some(bytes as f64 / (1 << 20) as f64));
    for b in &blocks {
        assert!(env.primary_bytes(b).await.is_none());
    }
    assert_eq!(env.blocks(pb::BlockState::Offloaded).await.len(), 3);

    // Stopped before it starts: nothing copied, nothing leased, and the
    // summary says so.
    let (_stop, rx) = watch::channel(true);
    let summary = restorer.run(&plan, &env.options(), &|_: &Event| {}, rx).await;
    assert!(summary.interrupted);
    assert_eq!((summary.restored, summary.not_started, summary.failed), (0, 3, 0));
    for b in &blocks {
        assert!(env.primary_bytes(b).await.is_none());
    }
    let leases = env
        .catalog
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .expect("test step");
    assert!(
        leases.leases.iter().all(|l| !l.holder.starts_with("cli/")),
        "{leases:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verification_copies_a_missing_primary_again() {
    let mut env = Env::new().await;
    let blocks = env.publish("acme", env.hour_start(3), 1).await;
    env.offload(&blocks, true).await;
    let (summary, _) = env.restore(&acme(), &env.options()).await;
    assert_eq!(summary.restored, 1);
    // A paused process deletes the primary after the restore marked it.
    let live = env.blocks(pb::BlockState::Live).await;
    let b = &live[&blocks[0].id];
    env.primary
        .delete(&Path::from(b.object_key.as_str()))
        .await
        .expect("test step");
    let events = Mutex::new(Vec::new());
    let sink = |e: &Event| events.lock().expect("test step").push(e.clone());
    let v = env
        .restorer()
        .verify(std::slice::from_ref(b), &RateLimit::new(0), &sink)
        .await;
    assert_eq!((v.verified, v.copied_again, v.failed.len()), (1, 1, 0));
    assert!(env.primary_bytes(b).await.expect("copied again") == env.originals[&b.id]);
    assert_eq!(
        count(&events.into_inner().expect("test step"), |e| matches!(
            e,
            Event::Verify { .. }
        )),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_left_in_place_is_trusted_only_when_it_is_still_the_block() {
    let mut env = Env::new().await;
    let blocks = env.publish("acme", env.hour_start(4), 2).await;
    // Offloaded, primaries not yet freed; one primary changes meanwhile
    // (same size, one bit off).
    env.offload(&blocks, false).await;
    let bad = &blocks[0];
    let mut rotten = env.originals[&bad.id].to_vec();
    let mid = rotten.len() / 2;
    rotten[mid] ^= 0x01;
    env.primary
        .put(&Path::from(bad.object_key.as_str()), PutPayload::from(rotten))
        .await
        .expect("test step");

    let (summary, _) = env.restore(&acme(), &env.options()).await;
    assert_eq!((summary.restored, summary.failed), (2, 0), "{summary:?}");
    assert_eq!(summary.copied, 1, "only the changed primary is copied back");
    for b in &blocks {
        assert!(
            env.primary_bytes(b).await.expect("restored") == env.originals[&b.id],
            "{}",
            b.id
        );
    }
}
