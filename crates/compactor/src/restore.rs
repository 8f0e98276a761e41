//! Restoring offloaded blocks to the primary store (compactor-design.md
//! §9.3), what `mira offload restore` runs. This module owns the whole
//! restore: selecting the blocks, the per-partition lease, the copy back,
//! the catalog mark, the final verification, and the events and summary
//! that report it ([`crate::progress`] renders them).
//!
//! 1. **Select** ([`Restorer::plan`]): the offloaded blocks of a tenant (or
//!    every tenant), some signals (default all) and a time range (blocks
//!    overlapping it), or named blocks: a named block already live is
//!    reported "already live", one the catalog does not list (or
//!    tombstoned) is a failure. Blocks are grouped by partition, in time
//!    order.
//! 2. **Per partition**, `concurrency` at a time ([`Restorer::run`]): take
//!    the partition lease as `cli/{host}/{ULID}` with a manifest
//!    `{"v":1,"kind":"restore",...}` (naming no output: a restore writes
//!    only objects the catalog already names, so a crashed restore leaves
//!    nothing for the next holder to clean up). A lease held by another
//!    holder is waited for, with backoff, up to `lease_wait` (a
//!    [`Event::Waiting`] says by whom); then the partition's blocks count
//!    as failed, to be resumed by a re-run.
//! 3. **Per block**: a primary object still present (`!primary_freed`)
//!    with the catalog's size and SHA-256 ([`crate::copy::verify_object`],
//!    one read of it) needs no copy. Otherwise the offload copy is read
//!    through [`Targets::resolve`], hashed and checked against the
//!    catalog's size and SHA-256 **before** anything is written
//!    ([`crate::copy::copy_object`]), written to the same primary key, and
//!    read back and proven the same way. A mismatch of the copy writes
//!    nothing, one of the primary read back fails the block; either way it
//!    stays offloaded. The lease is renewed between blocks once a third of
//!    its time has passed.
//! 4. **Mark**: `MarkRestoredV2` (batches of at most 1,000; a refused batch
//!    is retried block by block) makes the blocks live, pinned until now +
//!    `keep_for`, under the lease; then the lease is released.
//! 5. **Verify**: every restored primary object (and every named block
//!    found already live) is HEADed; a missing or short one is copied again,
//!    at most 3 times. This catches a compactor paused between its lease
//!    check and a DELETE of the primary (content was proven in step 3; a
//!    HEAD is enough to see a delete).
//!
//! Idempotent and resumable: killed after a PUT, the block is still
//! offloaded and a re-run copies and marks it; killed after the mark, it is
//! live and a re-run does not select it; a second run copies nothing. With
//! the `fault-hooks` feature, `MIRA_FAULT_RESTORE=after_put|after_mark`
//! aborts the process at that point.
//!
//! Cancellation: when the `stop` channel turns true, copies in flight
//! finish, no new one starts, what was copied is marked, leases are
//! released, and the summary says `interrupted`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mira_catalog::proto as pb;
use mira_catalog::{CatalogClient, ClientError};
use mira_common::clock::Clock;
use mira_common::retry::Backoff;
use mira_core::ids::{BlockId, Signal, TenantId};
use object_store::ObjectStore;
use object_store::path::Path;
use serde::Serialize;
use tokio::sync::watch;

use crate::copy::{RateLimit, Unproven, copy_object, object_size, verify_object};
use crate::error::Error;
use crate::job::Manifest;
use crate::planner::Partition;
use crate::targets::Targets;

/// Most ids in one `MarkRestoredV2`.
const MARK_BATCH: usize = 1000;
/// Copies of a primary object the verification makes before giving up.
const VERIFY_COPIES: u32 = 3;
/// HEADs of the verification at once.
const VERIFY_CONCURRENCY: usize = 16;
/// Failures kept by name in a [`Summary`] (the rest are counted).
const FAILURES_KEPT: usize = 100;

/// Which blocks to restore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// `None`: every tenant.
    pub tenant: Option<TenantId>,
    /// Empty: every signal.
    pub signals: Vec<Signal>,
    /// Blocks overlapping `[from_ns, to_ns]` (inclusive); `None` is open.
    pub from_ns: Option<i64>,
    pub to_ns: Option<i64>,
    /// Non-empty: only these blocks (the other filters still apply).
    pub block_ids: Vec<BlockId>,
}

/// How a restore runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Lease holder, `cli/{host}/{ULID}` ([`cli_holder`]).
    pub holder: String,
    /// Restored blocks are pinned (not offloaded or dropped again) for this
    /// long.
    pub keep_for: Duration,
    /// Partitions restored at once.
    pub concurrency: usize,
    /// Bytes per second across copies (0: no limit).
    pub rate_bytes: u64,
    /// How long to wait for a partition lease another holder has.
    pub lease_wait: Duration,
    /// Partition lease time to live (renewed once a third has passed).
    pub lease_ttl: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            holder: cli_holder(),
            keep_for: Duration::from_secs(7 * 24 * 3600),
            concurrency: 8,
            rate_bytes: 200 << 20,
            lease_wait: Duration::from_secs(300),
            lease_ttl: Duration::from_secs(60),
        }
    }
}

/// A fresh lease holder for a restore run from this machine:
/// `cli/{host name}/{ULID}`.
pub fn cli_holder() -> String {
    let host = crate::settings::host_name().unwrap_or_else(|| "unknown-host".to_owned());
    format!("cli/{host}/{}", BlockId::new())
}

/// The offloaded blocks of one partition.
#[derive(Clone, Debug)]
pub struct PartitionPlan {
    pub partition: Partition,
    /// In (min time, id) order.
    pub blocks: Vec<pb::Block>,
}

/// A block that could not be restored, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub id: String,
    pub reason: String,
}

/// What a restore will do ([`Restorer::plan`]).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub selection: Selection,
    /// Partitions with offloaded blocks, in time order.
    pub partitions: Vec<PartitionPlan>,
    /// Named blocks that are live already.
    pub already_live: Vec<pb::Block>,
    /// Named blocks that cannot be restored (unknown, tombstoned).
    pub refused: Vec<Failure>,
}

/// The plan in numbers (the first event of a restore, and the dry run's
/// answer).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PlanInfo {
    /// `None`: every tenant.
    pub tenant: Option<String>,
    /// Empty: every signal.
    pub signals: Vec<String>,
    pub from_ns: Option<i64>,
    pub to_ns: Option<i64>,
    /// Blocks named with `--block` (0: selected by the filters).
    pub named_blocks: u64,
    /// Every block the restore reports on: to restore, already live and
    /// refused.
    pub blocks: u64,
    /// Their bytes (refused blocks count none).
    pub bytes: u64,
    pub to_restore: u64,
    pub to_restore_bytes: u64,
    pub already_live: u64,
    pub refused: u64,
    pub partitions: u64,
    /// Seconds the copies take at the rate limit (`None`: no limit).
    pub estimated_s: Option<f64>,
}

impl Plan {
    /// Blocks to restore.
    pub fn to_restore(&self) -> impl Iterator<Item = &pb::Block> {
        self.partitions.iter().flat_map(|p| p.blocks.iter())
    }

    /// The plan in numbers, with the time its copies take at `rate_bytes`
    /// per second (0: no limit, no estimate).
    pub fn info(&self, rate_bytes: u64) -> PlanInfo {
        let to_restore = self.to_restore().count() as u64;
        let to_restore_bytes: u64 = self.to_restore().map(|b| b.bytes).sum();
        let live_bytes: u64 = self.already_live.iter().map(|b| b.bytes).sum();
        let s = &self.selection;
        PlanInfo {
            tenant: s.tenant.as_ref().map(|t| t.as_str().to_owned()),
            signals: s.signals.iter().map(|s| s.as_str().to_owned()).collect(),
            from_ns: s.from_ns,
            to_ns: s.to_ns,
            named_blocks: s.block_ids.len() as u64,
            blocks: to_restore + self.already_live.len() as u64 + self.refused.len() as u64,
            bytes: to_restore_bytes + live_bytes,
            to_restore,
            to_restore_bytes,
            already_live: self.already_live.len() as u64,
            refused: self.refused.len() as u64,
            partitions: self.partitions.len() as u64,
            estimated_s: (rate_bytes > 0).then(|| to_restore_bytes as f64 / rate_bytes as f64),
        }
    }
}

/// How one block ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockResult {
    /// Live again (copied back, or its primary object was still there).
    Restored,
    /// Already live; nothing done.
    Skipped,
    /// Not restored (the reason says why); still offloaded, re-run to
    /// resume.
    Failed,
}

/// One block's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockEvent {
    pub id: String,
    pub tenant: String,
    pub signal: String,
    pub partition_start_ns: i64,
    pub result: BlockResult,
    pub bytes: u64,
    /// Whether its object was copied back (its bytes were in a `Copied`
    /// event); false for a block whose primary object was still present.
    pub copied: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl BlockEvent {
    fn of(b: &pb::Block, result: BlockResult, copied: bool, reason: Option<String>) -> BlockEvent {
        BlockEvent {
            id: b.id.clone(),
            tenant: b.tenant.clone(),
            signal: signal_name(b.signal).to_owned(),
            partition_start_ns: b.partition_start_ns,
            result,
            bytes: b.bytes,
            copied,
            reason,
        }
    }

    fn failed(f: &Failure) -> BlockEvent {
        BlockEvent {
            id: f.id.clone(),
            tenant: String::new(),
            signal: String::new(),
            partition_start_ns: 0,
            result: BlockResult::Failed,
            bytes: 0,
            copied: false,
            reason: Some(f.reason.clone()),
        }
    }
}

/// A partition's lease phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionResult {
    /// The lease is held; its blocks are being restored.
    Started,
    /// Its blocks were marked and the lease released.
    Done,
    /// Given up (lease never free, or lost); its blocks count as failed.
    Failed,
    /// Stopped while waiting for its lease, or part way (what was copied
    /// is marked, the lease released).
    Interrupted,
}

/// What a restore reports, in order: per partition `Waiting` (maybe),
/// `Partition` started, `Copied` and `Block` per block, `Partition` done;
/// then `Verify` for each object copied again or missing; and last the
/// `Summary`. The caller reports the plan itself (a plan is made before a
/// run, and a dry run has no run).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Plan(PlanInfo),
    /// The partition lease `lease` is held by `holder`; waiting.
    Waiting {
        lease: String,
        holder: String,
    },
    Partition {
        lease: String,
        result: PartitionResult,
        blocks: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A block's object was copied back (before its mark).
    Copied {
        id: String,
        bytes: u64,
    },
    Block(BlockEvent),
    /// The verification found a primary object missing: `copied_again`
    /// (now present) or `failed`.
    Verify {
        id: String,
        result: VerifyResult,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Summary(Summary),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyResult {
    CopiedAgain,
    Failed,
}

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Blocks made live by this run (copied, or whose primary object was
    /// still present), verified present.
    pub restored: u64,
    pub restored_bytes: u64,
    /// Of those, copied back from their offload copy.
    pub copied: u64,
    pub copied_bytes: u64,
    /// Named blocks that were live already.
    pub already_live: u64,
    /// Blocks not restored (or restored without a primary object after
    /// the verification's copies): re-run to resume.
    pub failed: u64,
    /// Blocks not attempted because the run was interrupted.
    pub not_started: u64,
    pub seconds: f64,
    /// Bytes copied per second over the run.
    pub rate_bytes_per_s: f64,
    /// Primary objects the verification found present.
    pub verified: u64,
    /// Of those, copied again by the verification.
    pub copied_again: u64,
    pub interrupted: bool,
    /// The first failures by block (all are counted in `failed`).
    pub failures: Vec<Failure>,
}

impl Summary {
    fn fail(&mut self, f: Failure) {
        self.failed += 1;
        if self.failures.len() < FAILURES_KEPT {
            self.failures.push(f);
        }
    }
}

/// Where to send events (called from the restoring task; keep it quick).
pub type Events<'a> = &'a (dyn Fn(&Event) + Send + Sync);

/// What one partition's restore did.
#[derive(Default)]
struct PartitionOutcome {
    restored: Vec<pb::Block>,
    copied: u64,
    copied_bytes: u64,
    failed: Vec<Failure>,
    not_started: u64,
}

/// Why a partition lease was not taken.
enum LeaseWait {
    Interrupted,
    Failed(String),
}

/// Restores offloaded blocks (see the module doc).
#[derive(Clone, Debug)]
pub struct Restorer {
    catalog: Arc<CatalogClient>,
    primary: Arc<dyn ObjectStore>,
    targets: Targets,
    clock: Clock,
}

fn signal_name(v: i32) -> &'static str {
    mira_catalog::pb_impl::signal::from_pb(v).map_or("unknown", Signal::as_str)
}

/// Resolves when `stop` turns true (never, once its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Restorer {
    /// A restorer writing to `primary` (the store the catalog's object keys
    /// are in), reading copies through `targets`.
    pub fn new(catalog: Arc<CatalogClient>, primary: Arc<dyn ObjectStore>, targets: Targets, clock: Clock) -> Restorer {
        Restorer {
            catalog,
            primary,
            targets,
            clock,
        }
    }

    /// Reads the catalog and says what a restore of `sel` would do
    /// ([`select`]).
    pub async fn plan(&self, sel: &Selection) -> Result<Plan, Error> {
        select(&self.catalog, sel).await
    }

    /// Restores what `plan` selected (see the module doc), reporting to
    /// `events`; `stop` turning true interrupts it. Never fails as a
    /// whole: every block ends restored, already live, failed or not
    /// started, as the summary (also the last event) counts.
    pub async fn run(&self, plan: &Plan, opts: &Options, events: Events<'_>, stop: watch::Receiver<bool>) -> Summary {
        let started = Instant::now();
        let rate = RateLimit::new(opts.rate_bytes);
        let mut summary = Summary::default();
        for b in &plan.already_live {
            summary.already_live += 1;
            events(&Event::Block(BlockEvent::of(
                b,
                BlockResult::Skipped,
                false,
                Some("already live".to_owned()),
            )));
        }
        for f in &plan.refused {
            events(&Event::Block(BlockEvent::failed(f)));
            summary.fail(f.clone());
        }
        let outcomes: Vec<PartitionOutcome> = futures::stream::iter(plan.partitions.iter())
            .map(|p| self.restore_partition(p, opts, &rate, events, stop.clone()))
            .buffer_unordered(opts.concurrency.max(1))
            .collect()
            .await;
        let mut restored = Vec::new();
        for o in outcomes {
            summary.copied += o.copied;
            summary.copied_bytes += o.copied_bytes;
            summary.not_started += o.not_started;
            for f in o.failed {
                summary.fail(f);
            }
            summary.restored += o.restored.len() as u64;
            summary.restored_bytes += o.restored.iter().map(|b| b.bytes).sum::<u64>();
            restored.extend(o.restored);
        }
        // Named blocks found live are checked too: a re-run with --block
        // repairs one whose primary object went missing.
        let live_ids: HashSet<&str> = plan.already_live.iter().map(|b| b.id.as_str()).collect();
        restored.extend(
            plan.already_live
                .iter()
                .filter(|b| !b.offload_location.is_empty())
                .cloned(),
        );
        let verified = self.verify(&restored, &rate, events).await;
        summary.verified = verified.verified;
        summary.copied_again = verified.copied_again;
        for (b, f) in verified.failed {
            if live_ids.contains(b.id.as_str()) {
                summary.already_live -= 1;
            } else {
                summary.restored -= 1;
                summary.restored_bytes -= b.bytes;
            }
            summary.fail(f);
        }
        summary.interrupted = *stop.borrow();
        summary.seconds = started.elapsed().as_secs_f64();
        summary.rate_bytes_per_s = if summary.seconds > 0.0 {
            summary.copied_bytes as f64 / summary.seconds
        } else {
            0.0
        };
        events(&Event::Summary(summary.clone()));
        summary
    }

    async fn restore_partition(
        &self,
        part: &PartitionPlan,
        opts: &Options,
        rate: &RateLimit,
        events: Events<'_>,
        mut stop: watch::Receiver<bool>,
    ) -> PartitionOutcome {
        let mut out = PartitionOutcome::default();
        let key = part.partition.lease_key();
        let n = part.blocks.len() as u64;
        let partition_event = |result, reason| {
            events(&Event::Partition {
                lease: key.clone(),
                result,
                blocks: n,
                reason,
            });
        };
        // `copied`: its bytes were reported in a `Copied` event already.
        let fail_copied = |out: &mut PartitionOutcome, b: &pb::Block, copied: bool, reason: String| {
            events(&Event::Block(BlockEvent::of(
                b,
                BlockResult::Failed,
                copied,
                Some(reason.clone()),
            )));
            out.failed.push(Failure {
                id: b.id.clone(),
                reason,
            });
        };
        let fail = |out: &mut PartitionOutcome, b: &pb::Block, reason: String| fail_copied(out, b, false, reason);
        if *stop.borrow() {
            out.not_started = n;
            return out;
        }
        let manifest = Manifest {
            v: 1,
            kind: "restore".to_owned(),
            started_ns: self.clock.now_ns(),
            inputs: part.blocks.len(),
            outputs: Vec::new(),
        };
        match self.acquire(&key, opts, &manifest.to_json(), events, &mut stop).await {
            Ok(()) => {}
            Err(LeaseWait::Interrupted) => {
                out.not_started = n;
                partition_event(PartitionResult::Interrupted, None);
                return out;
            }
            Err(LeaseWait::Failed(reason)) => {
                for b in &part.blocks {
                    fail(&mut out, b, reason.clone());
                }
                partition_event(PartitionResult::Failed, Some(reason));
                return out;
            }
        }
        partition_event(PartitionResult::Started, None);
        let mut renewed = Instant::now();
        let mut ready: Vec<(&pb::Block, bool)> = Vec::new();
        let mut lost: Option<String> = None;
        for (i, b) in part.blocks.iter().enumerate() {
            if *stop.borrow() {
                out.not_started += (part.blocks.len() - i) as u64;
                break;
            }
            if renewed.elapsed() >= opts.lease_ttl / 3 {
                if let Err(reason) = self.renew(&key, opts).await {
                    for b in &part.blocks[i..] {
                        fail(&mut out, b, reason.clone());
                    }
                    lost = Some(reason);
                    break;
                }
                renewed = Instant::now();
            }
            match self.restore_block(b, rate).await {
                Ok(copied) => {
                    if copied {
                        out.copied += 1;
                        out.copied_bytes += b.bytes;
                        events(&Event::Copied {
                            id: b.id.clone(),
                            bytes: b.bytes,
                        });
                    }
                    ready.push((b, copied));
                }
                Err(e) => fail(&mut out, b, e.to_string()),
            }
        }
        if lost.is_none() && !ready.is_empty() {
            // Confirms the lease with a full time to live before the mark.
            if let Err(reason) = self.renew(&key, opts).await {
                lost = Some(reason);
            }
        }
        let marked: Vec<Result<(), String>> = match &lost {
            Some(reason) => ready.iter().map(|_| Err(reason.clone())).collect(),
            None => self.mark(&key, opts, &ready).await,
        };
        let any_marked = marked.iter().any(Result::is_ok);
        for ((b, copied), result) in ready.into_iter().zip(marked) {
            match result {
                Ok(()) => {
                    events(&Event::Block(BlockEvent::of(b, BlockResult::Restored, copied, None)));
                    out.restored.push(b.clone());
                }
                Err(reason) => {
                    // Still offloaded: the copy counts for nothing (a
                    // re-run writes the same bytes again).
                    if copied {
                        out.copied -= 1;
                        out.copied_bytes -= b.bytes;
                    }
                    fail_copied(&mut out, b, copied, format!("not marked restored: {reason}"));
                }
            }
        }
        if any_marked {
            crate::fault::point(crate::fault::RESTORE, "after_mark");
        }
        if lost.is_none() {
            self.release(&key, opts).await;
        }
        let result = if lost.is_some() {
            PartitionResult::Failed
        } else if out.not_started > 0 {
            PartitionResult::Interrupted
        } else {
            PartitionResult::Done
        };
        partition_event(result, lost);
        out
    }

    /// Takes the lease `key`, waiting (with backoff, up to
    /// `opts.lease_wait`) while another holder has it.
    async fn acquire(
        &self,
        key: &str,
        opts: &Options,
        manifest: &str,
        events: Events<'_>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), LeaseWait> {
        let ttl_ms = i64::try_from(opts.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let deadline = Instant::now() + opts.lease_wait;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut told: Option<String> = None;
        loop {
            match self
                .catalog
                .acquire_lease(
                    key,
                    &opts.holder,
                    self.clock.now_ns(),
                    ttl_ms,
                    Some(manifest.to_owned()),
                )
                .await
            {
                Ok(_) => return Ok(()),
                // Held by another holder (a conflict).
                Err(ClientError::Rejected(s)) if s.code() == tonic::Code::FailedPrecondition => {}
                Err(e) => return Err(LeaseWait::Failed(format!("lease {key}: {e}"))),
            }
            let holder = self.holder_of(key).await;
            if told.as_deref() != Some(holder.as_str()) {
                events(&Event::Waiting {
                    lease: key.to_owned(),
                    holder: holder.clone(),
                });
                told = Some(holder.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LeaseWait::Failed(format!(
                    "lease {key} held by {holder} for longer than the lease wait ({}s)",
                    opts.lease_wait.as_secs()
                )));
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay().min(left)) => {}
                () = stopped(stop) => return Err(LeaseWait::Interrupted),
            }
        }
    }

    /// Who holds `key` now (for the waiting message).
    async fn holder_of(&self, key: &str) -> String {
        match self.catalog.list_leases(pb::ListLeasesRequest::default()).await {
            Ok(r) => r
                .leases
                .into_iter()
                .find(|l| l.key == key)
                .map_or_else(|| "another holder".to_owned(), |l| l.holder),
            Err(_) => "another holder".to_owned(),
        }
    }

    async fn renew(&self, key: &str, opts: &Options) -> Result<(), String> {
        let ttl_ms = i64::try_from(opts.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        self.catalog
            .renew_lease(key, &opts.holder, self.clock.now_ns(), ttl_ms, None)
            .await
            .map(|_| ())
            .map_err(|e| format!("lease {key} lost: {e}"))
    }

    async fn release(&self, key: &str, opts: &Options) {
        if let Err(e) = self.catalog.release_lease(key, &opts.holder).await {
            // It expires on its own within its time to live.
            tracing::warn!(target: "mira::compactor", lease = key, error = %e, "lease release failed");
        }
    }

    /// Makes `blocks` live and pinned under the lease `key`; one result per
    /// block.
    async fn mark(&self, key: &str, opts: &Options, blocks: &[(&pb::Block, bool)]) -> Vec<Result<(), String>> {
        let mut out = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(MARK_BATCH) {
            let ids: Vec<String> = chunk.iter().map(|(b, _)| b.id.clone()).collect();
            match self.mark_ids(key, opts, ids).await {
                Ok(()) => out.extend(chunk.iter().map(|_| Ok(()))),
                Err(ClientError::Rejected(_)) if chunk.len() > 1 => {
                    // One block changed meanwhile (tombstoned, say): the
                    // others still go through.
                    for (b, _) in chunk {
                        out.push(
                            self.mark_ids(key, opts, vec![b.id.clone()])
                                .await
                                .map_err(|e| e.to_string()),
                        );
                    }
                }
                Err(e) => out.extend(chunk.iter().map(|_| Err(e.to_string()))),
            }
        }
        out
    }

    async fn mark_ids(&self, key: &str, opts: &Options, ids: Vec<String>) -> Result<(), ClientError> {
        let now = self.clock.now_ns();
        self.catalog
            .mark_restored_v2(ids, now.saturating_add(ns(opts.keep_for)), now, (key, &opts.holder))
            .await
            .map(|_| ())
    }

    /// Puts the primary object of `b` in place; returns whether it was
    /// copied (false: the primary was still there, proven by the catalog's
    /// length and SHA-256; one that is not is copied back over).
    async fn restore_block(&self, b: &pb::Block, rate: &RateLimit) -> Result<bool, Error> {
        if !b.primary_freed {
            let path = Path::from(b.object_key.as_str());
            let in_place = if b.offload_sha256.is_empty() {
                object_size(&self.primary, &path).await? == Some(b.bytes)
            } else {
                match verify_object(&self.primary, &path, (b.bytes, &b.offload_sha256)).await {
                    Ok(()) => true,
                    Err(failed) if failed.reason == Unproven::Unreadable => {
                        return Err(failed.into_error(&b.object_key));
                    }
                    Err(failed) => {
                        if failed.reason != Unproven::Missing {
                            tracing::warn!(target: "mira::compactor", block = %b.id, reason = %failed, "the primary object left in place is not the block; copying it back");
                        }
                        false
                    }
                }
            };
            if in_place {
                return Ok(false);
            }
        }
        self.copy_back(b, rate).await?;
        crate::fault::point(crate::fault::RESTORE, "after_put");
        Ok(true)
    }

    /// Copies the offload copy of `b` to its primary key, checked against
    /// the catalog's size and SHA-256 before anything is written, then
    /// reads the primary back and proves it ([`verify_object`]).
    async fn copy_back(&self, b: &pb::Block, rate: &RateLimit) -> Result<(), Error> {
        if b.offload_location.is_empty() {
            return Err(Error::BadRecord {
                id: b.id.clone(),
                reason: "no offload location to restore from".to_owned(),
            });
        }
        let (store, path) = self.targets.resolve(&b.offload_location, &b.object_key)?;
        let sha256 = (!b.offload_sha256.is_empty()).then_some(b.offload_sha256.as_str());
        let primary = Path::from(b.object_key.as_str());
        let copied = copy_object((&store, &path), (&self.primary, &primary), (b.bytes, sha256), rate).await?;
        verify_object(&self.primary, &primary, (copied.bytes, &copied.sha256))
            .await
            .map_err(|failed| failed.into_error(&b.object_key))
    }

    /// HEADs the primary object of every block; one missing (or of another
    /// size) is copied again from its offload copy, at most 3 times.
    pub async fn verify(&self, blocks: &[pb::Block], rate: &RateLimit, events: Events<'_>) -> Verified {
        let results: Vec<(&pb::Block, Result<bool, String>)> = futures::stream::iter(blocks)
            .map(|b| async move { (b, self.verify_one(b, rate).await) })
            .buffer_unordered(VERIFY_CONCURRENCY)
            .collect()
            .await;
        let mut out = Verified::default();
        for (b, r) in results {
            match r {
                Ok(copied_again) => {
                    out.verified += 1;
                    if copied_again {
                        out.copied_again += 1;
                        events(&Event::Verify {
                            id: b.id.clone(),
                            result: VerifyResult::CopiedAgain,
                            reason: None,
                        });
                    }
                }
                Err(reason) => {
                    events(&Event::Verify {
                        id: b.id.clone(),
                        result: VerifyResult::Failed,
                        reason: Some(reason.clone()),
                    });
                    out.failed.push((
                        b.clone(),
                        Failure {
                            id: b.id.clone(),
                            reason,
                        },
                    ));
                }
            }
        }
        out
    }

    /// Whether the primary object of `b` is in place (true: after copying
    /// it again).
    async fn verify_one(&self, b: &pb::Block, rate: &RateLimit) -> Result<bool, String> {
        let path = Path::from(b.object_key.as_str());
        let mut last = String::new();
        for attempt in 0..=VERIFY_COPIES {
            match object_size(&self.primary, &path).await {
                Ok(Some(n)) if n == b.bytes => return Ok(attempt > 0),
                Ok(Some(n)) => last = format!("the primary object has {n} bytes, the catalog records {}", b.bytes),
                Ok(None) => last = "the primary object is missing".to_owned(),
                Err(e) => last = e.to_string(),
            }
            if attempt == VERIFY_COPIES {
                break;
            }
            tracing::warn!(target: "mira::compactor", block = %b.id, reason = %last, "restored block failed verification; copying it again");
            if let Err(e) = self.copy_back(b, rate).await {
                last = e.to_string();
            }
        }
        Err(format!(
            "after {VERIFY_COPIES} copies: {last} (re-run with --block {} to repair)",
            b.id
        ))
    }
}

/// Every block of `states` under the selection's tenant, `signal` and
/// time range, paging through the catalog.
async fn list(
    catalog: &CatalogClient,
    sel: &Selection,
    signal: i32,
    states: &[pb::BlockState],
) -> Result<Vec<pb::Block>, Error> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let reply = catalog
            .list_blocks(pb::ListBlocksRequest {
                tenant: sel.tenant.as_ref().map(|t| t.as_str().to_owned()).unwrap_or_default(),
                signal,
                min_time_ns: sel.from_ns.unwrap_or(0),
                max_time_ns: sel.to_ns.unwrap_or(i64::MAX),
                states: states.iter().map(|s| *s as i32).collect(),
                linearizable: true,
                page_token,
                ..Default::default()
            })
            .await
            .map_err(|source| Error::Catalog {
                what: "list blocks to restore",
                partition: sel.tenant.as_ref().map_or("*", |t| t.as_str()).to_owned(),
                source,
            })?;
        out.extend(reply.blocks);
        if reply.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = reply.next_page_token;
    }
}

/// Reads the catalog and says what a restore of `sel` would do: the
/// offloaded blocks by partition (what `mira offload list` shows, too),
/// and for named blocks which are live already or cannot be restored.
pub async fn select(catalog: &CatalogClient, sel: &Selection) -> Result<Plan, Error> {
    let named = !sel.block_ids.is_empty();
    let states: &[pb::BlockState] = if named {
        &[
            pb::BlockState::Live,
            pb::BlockState::Offloaded,
            pb::BlockState::Tombstoned,
        ]
    } else {
        &[pb::BlockState::Offloaded]
    };
    let signals: Vec<i32> = if sel.signals.is_empty() {
        vec![pb::Signal::Unspecified as i32]
    } else {
        sel.signals
            .iter()
            .map(|s| mira_catalog::pb_impl::signal::to_pb(*s))
            .collect()
    };
    let mut listed = Vec::new();
    for s in signals {
        listed.extend(list(catalog, sel, s, states).await?);
    }
    let mut plan = Plan {
        selection: sel.clone(),
        ..Plan::default()
    };
    let offloaded: Vec<pb::Block> = if named {
        let mut by_id: HashMap<String, pb::Block> = listed.into_iter().map(|b| (b.id.clone(), b)).collect();
        let mut seen = HashSet::new();
        let mut offloaded = Vec::new();
        for id in &sel.block_ids {
            let id = id.to_string();
            if !seen.insert(id.clone()) {
                continue;
            }
            match by_id.remove(&id) {
                Some(b) if b.state == pb::BlockState::Offloaded as i32 => offloaded.push(b),
                Some(b) if b.state == pb::BlockState::Live as i32 => plan.already_live.push(b),
                Some(_) => plan.refused.push(Failure {
                    id,
                    reason: "the block is tombstoned: nothing to restore".to_owned(),
                }),
                None => plan.refused.push(Failure {
                    id,
                    reason: "no such block in the catalog under the tenant, signal and time given".to_owned(),
                }),
            }
        }
        offloaded
    } else {
        listed
    };
    let mut parts: BTreeMap<(i64, String, &'static str), Vec<pb::Block>> = BTreeMap::new();
    for b in offloaded {
        let Some(signal) = mira_catalog::pb_impl::signal::from_pb(b.signal) else {
            plan.refused.push(Failure {
                reason: format!("the catalog lists it with signal {}, unknown to this build", b.signal),
                id: b.id,
            });
            continue;
        };
        parts
            .entry((b.partition_start_ns, b.tenant.clone(), signal.as_str()))
            .or_default()
            .push(b);
    }
    plan.partitions = parts
        .into_iter()
        .map(|((start_ns, tenant, signal), mut blocks)| {
            blocks.sort_by(|a, b| (a.min_time_ns, &a.id).cmp(&(b.min_time_ns, &b.id)));
            PartitionPlan {
                partition: Partition {
                    tenant,
                    signal,
                    start_ns,
                },
                blocks,
            }
        })
        .collect();
    Ok(plan)
}

/// What the verification found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Primary objects present (after copying again where needed).
    pub verified: u64,
    pub copied_again: u64,
    /// Still missing after the copies.
    pub failed: Vec<(pb::Block, Failure)>,
}
