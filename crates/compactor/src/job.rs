//! Running one rewrite job, step by step (compactor-design.md §4, §10):
//!
//! 1. take the partition lease, with a manifest naming no output yet;
//! 2. clean up after an expired previous holder whose manifest names
//!    outputs (fence each with `Abandon`, then delete its object);
//! 3. write the output's id and key into the manifest **before** any PUT;
//! 4. reserve memory, fetch every input whole, check it is the block the
//!    catalog lists and verify every section (a corrupt input is
//!    quarantined and the job abandoned);
//! 5. merge on the rewrite pool (hot, or the cold codec) and check the
//!    output holds exactly the inputs' rows;
//! 6. PUT the output, renew the lease, and commit everything with one
//!    `ReplaceV2` (the catalog checks the partition, the row count, the
//!    lease and that every input is still live);
//! 7. release the lease.
//!
//! A crash at any step loses nothing and doubles nothing: until the Replace
//! the output is invisible to queries, and the next lease holder (or the
//! orphan sweep) removes it; after it, the inputs are tombstoned and
//! deleted after the grace. With the `fault-hooks` feature,
//! `MIRA_FAULT_COMPACTOR=<step>` aborts the process at a step
//! (`after_lease`, `after_manifest`, `after_fetch`, `after_put`,
//! `after_replace`, `during_delete`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use mira_catalog::ClientError;
use mira_catalog::proto as pb;
use mira_common::retry::Backoff;
use mira_core::block::path::block_path;
use mira_core::block::{Block, Level, VerifyCache};
use mira_core::ids::BlockId;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::Ctx;
use crate::error::Error;
use crate::planner::{BlockInfo, Job, JobKind, Partition};

/// The manifest a lease carries while a job runs: what it may have written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub v: u32,
    pub kind: String,
    pub started_ns: i64,
    pub inputs: usize,
    pub outputs: Vec<Output>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub id: String,
    pub key: String,
}

impl Manifest {
    pub fn parse(job: &str) -> Option<Manifest> {
        if job.is_empty() {
            return None;
        }
        serde_json::from_str(job).ok()
    }

    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What a finished job did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct JobReport {
    pub inputs: usize,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub rows: u64,
    /// Rows a retention rewrite dropped.
    pub dropped_rows: u64,
    pub output_id: String,
    /// Seconds the merge and encoding ran on the pool.
    pub rewrite_s: f64,
}

/// Aborts the process at `step` when `MIRA_FAULT_COMPACTOR` names it
/// ([`crate::fault`]).
pub(crate) fn fault_point(step: &str) {
    crate::fault::point(crate::fault::COMPACTOR, step);
}

fn conflict_or_catalog(what: &'static str, partition: &Partition, e: ClientError) -> Error {
    match e {
        ClientError::Rejected(_) | ClientError::Endpoint(_) => Error::Conflict {
            what,
            partition: partition.to_string(),
            source: e,
        },
        ClientError::Unavailable { .. } => Error::Catalog {
            what,
            partition: partition.to_string(),
            source: e,
        },
    }
}

/// A held partition lease, renewed in the background until dropped.
pub(crate) struct LeaseGuard {
    pub key: String,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl LeaseGuard {
    fn check(&self) -> Result<(), Error> {
        if self.lost.load(Ordering::Acquire) {
            return Err(Error::LeaseLost {
                key: self.key.clone(),
                reason: "a renewal was refused".to_owned(),
            });
        }
        Ok(())
    }
}

/// Takes the lease of `partition` with `manifest`, renewing it every third
/// of its time to live until the guard is dropped.
pub(crate) async fn acquire(ctx: &Arc<Ctx>, partition: &Partition, manifest: &Manifest) -> Result<LeaseGuard, Error> {
    let key = partition.lease_key();
    let ttl_ms = i64::try_from(ctx.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    ctx.catalog
        .acquire_lease(
            &key,
            &ctx.config.holder,
            ctx.clock.now_ns(),
            ttl_ms,
            Some(manifest.to_json()),
        )
        .await
        .map_err(|e| {
            if matches!(e, ClientError::Rejected(_)) {
                ctx.metrics.lease_conflicts.inc();
            }
            conflict_or_catalog("lease", partition, e)
        })?;
    let lost = Arc::new(AtomicBool::new(false));
    let renewer = {
        let (ctx, key, lost) = (ctx.clone(), key.clone(), lost.clone());
        tokio::spawn(async move {
            let period = ctx.config.lease_ttl / 3;
            let mut failures = 0;
            loop {
                tokio::time::sleep(period).await;
                match ctx
                    .catalog
                    .renew_lease(&key, &ctx.config.holder, ctx.clock.now_ns(), ttl_ms, None)
                    .await
                {
                    Ok(_) => failures = 0,
                    Err(ClientError::Unavailable { .. }) if failures == 0 => failures += 1,
                    Err(e) => {
                        tracing::warn!(target: "mira::compactor", lease = %key, error = %e, "lease renewal failed; the job stops before its commit");
                        lost.store(true, Ordering::Release);
                        return;
                    }
                }
            }
        })
    };
    Ok(LeaseGuard { key, lost, renewer })
}

/// Renews the lease now, replacing its manifest.
async fn renew(ctx: &Arc<Ctx>, lease: &LeaseGuard, partition: &Partition, manifest: &Manifest) -> Result<(), Error> {
    lease.check()?;
    let ttl_ms = i64::try_from(ctx.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    ctx.catalog
        .renew_lease(
            &lease.key,
            &ctx.config.holder,
            ctx.clock.now_ns(),
            ttl_ms,
            Some(manifest.to_json()),
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            ClientError::Rejected(s) => {
                ctx.metrics.lease_lost.inc();
                Error::LeaseLost {
                    key: lease.key.clone(),
                    reason: s.message().to_owned(),
                }
            }
            other => conflict_or_catalog("lease renewal", partition, other),
        })
}

pub(crate) async fn release(ctx: &Arc<Ctx>, lease: LeaseGuard) {
    let key = lease.key.clone();
    drop(lease);
    if let Err(e) = ctx.catalog.release_lease(&key, &ctx.config.holder).await {
        // It expires on its own; the next holder finds an empty manifest.
        tracing::warn!(target: "mira::compactor", lease = %key, error = %e, "lease release failed");
    }
}

/// Fences `id` so no commit can ever reference it, then deletes its object.
/// Returns whether the object was removed (false: the block was committed
/// meanwhile, and is left alone).
pub(crate) async fn abandon_output(ctx: &Arc<Ctx>, id: &str, key: &str, origin: &str) -> Result<bool, Error> {
    match ctx.catalog.abandon(vec![id.to_owned()]).await {
        Ok(_) => {}
        Err(ClientError::Rejected(s)) => {
            tracing::info!(target: "mira::compactor", block = id, reason = s.message(), "output was committed; kept");
            return Ok(false);
        }
        Err(e) => {
            return Err(Error::Catalog {
                what: "abandon",
                partition: key.to_owned(),
                source: e,
            });
        }
    }
    delete_object(ctx, key, origin).await?;
    ctx.metrics
        .orphans_deleted
        .get_or_create(&crate::metrics::OriginLabels {
            origin: origin.to_owned(),
        })
        .inc();
    Ok(true)
}

/// Deletes an object of the primary store; one that is already gone
/// counts as deleted.
pub(crate) async fn delete_object(ctx: &Arc<Ctx>, key: &str, why: &str) -> Result<(), Error> {
    delete_in(ctx, &*ctx.store, &Path::from(key), why).await
}

/// Deletes `path` from `store` (the primary or an offload target),
/// counted by `why`; one that is already gone counts as deleted.
pub(crate) async fn delete_in(
    ctx: &Arc<Ctx>,
    store: &dyn object_store::ObjectStore,
    path: &Path,
    why: &str,
) -> Result<(), Error> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {
            ctx.metrics
                .deleted_objects
                .get_or_create(&crate::metrics::Metrics::kind(why))
                .inc();
            Ok(())
        }
        Err(source) => Err(Error::Store {
            op: "DELETE",
            key: path.to_string(),
            source,
        }),
    }
}

/// Cleans up after an expired holder whose manifest names outputs: each
/// output not committed is fenced and deleted.
pub(crate) async fn take_over(ctx: &Arc<Ctx>, previous: &Manifest) -> Result<(), Error> {
    for out in &previous.outputs {
        abandon_output(ctx, &out.id, &out.key, "takeover").await?;
    }
    Ok(())
}

/// Runs `job` under its partition lease. `previous` is the manifest of an
/// expired lease on the partition (cleaned up first).
pub(crate) async fn run(ctx: &Arc<Ctx>, job: &Job, previous: Option<Manifest>) -> Result<JobReport, Error> {
    let partition = &job.partition;
    let mut manifest = Manifest {
        v: 1,
        kind: job.kind.as_str().to_owned(),
        started_ns: ctx.clock.now_ns(),
        inputs: job.inputs.len(),
        outputs: Vec::new(),
    };
    let lease = acquire(ctx, partition, &manifest).await?;
    fault_point("after_lease");
    let outcome = run_leased(ctx, job, &lease, &mut manifest, previous).await;
    match &outcome {
        Ok(_) => release(ctx, lease).await,
        Err(Error::Catalog { .. }) | Err(Error::LeaseLost { .. }) => {
            // The commit's outcome is unknown, or someone else may hold
            // the partition now: the manifest stays for the next holder.
            drop(lease);
        }
        Err(_) => {
            // Definitely not committed: remove what was written.
            let mut cleaned = true;
            for out in &manifest.outputs {
                if let Err(e) = abandon_output(ctx, &out.id, &out.key, "abandoned").await {
                    tracing::warn!(target: "mira::compactor", block = %out.id, error = %e, "could not abandon an output; the next holder will");
                    cleaned = false;
                }
            }
            if cleaned {
                release(ctx, lease).await;
            }
        }
    }
    outcome
}

async fn run_leased(
    ctx: &Arc<Ctx>,
    job: &Job,
    lease: &LeaseGuard,
    manifest: &mut Manifest,
    previous: Option<Manifest>,
) -> Result<JobReport, Error> {
    let partition = &job.partition;
    if let Some(prev) = previous {
        take_over(ctx, &prev).await?;
    }
    let first = job
        .inputs
        .first()
        .ok_or_else(|| Error::Internal("a job without inputs".to_owned()))?;
    let min_time = job
        .inputs
        .iter()
        .map(|b| b.min_time_ns)
        .min()
        .unwrap_or(first.min_time_ns);
    let out_id = BlockId::new();
    let out_key = block_path(
        &first.tenant,
        first.signal,
        u64::try_from(min_time).unwrap_or(0),
        out_id,
    );
    manifest.outputs.push(Output {
        id: out_id.to_string(),
        key: out_key.to_string(),
    });
    renew(ctx, lease, partition, manifest).await?;
    fault_point("after_manifest");

    let input_bytes = job.input_bytes();
    let _memory = ctx.reserve(estimate_memory(job)).await?;
    let fetched = match fetch_inputs(ctx, job).await {
        Ok(f) => Arc::new(f),
        Err(Error::CorruptInput { id, reason }) => {
            quarantine(ctx, &id, &reason).await;
            return Err(Error::CorruptInput { id, reason });
        }
        Err(e) => return Err(e),
    };
    fault_point("after_fetch");
    lease.check()?;

    let kind = job.kind;
    let level = kind.output_level(first.level);
    let pool = ctx.pool.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let inputs = Arc::clone(&fetched);
    let (cut, split, tenant) = (job.cut.clone(), job.split.clone(), first.tenant.as_str().to_owned());
    pool.spawn(move || {
        let started = Instant::now();
        let result = merge(
            kind,
            level,
            &inputs,
            out_id,
            (cut.as_deref(), split.as_deref()),
            &tenant,
        );
        let _ = tx.send((result, started.elapsed()));
    });
    let (merged, took) = rx
        .await
        .map_err(|_| Error::Internal("the rewrite pool dropped a job".to_owned()))?;
    let (outputs, dropped_rows) = match merged {
        Ok(m) if m.outputs.is_empty() => {
            // Every row is past its rule: the block goes whole.
            ctx.catalog
                .tombstone_v2(
                    job.inputs.iter().map(|b| b.id.to_string()).collect(),
                    ctx.clock.now_ns(),
                    pb::TombstoneReason::Retention,
                )
                .await
                .map_err(|e| conflict_or_catalog("retention tombstone", partition, e))?;
            return Ok(JobReport {
                inputs: job.inputs.len(),
                input_bytes,
                rows: job.input_rows(),
                dropped_rows: m.dropped_rows,
                ..JobReport::default()
            });
        }
        Ok(m) => (m.outputs, m.dropped_rows),
        Err(e) => return Err(blame_input(ctx, job, &fetched, e).await),
    };
    ctx.metrics
        .rewrite_cpu_seconds
        .get_or_create(&crate::metrics::Metrics::kind(kind.as_str()))
        .inc_by(took.as_secs_f64());
    // Outputs beyond the first (a cold rewrite split by policy class) are
    // named in the manifest before anything is written.
    let mut written = Vec::with_capacity(outputs.len());
    for (id, bytes) in outputs {
        let out = Block::from_bytes(bytes.clone(), Arc::new(VerifyCache::new(64))).map_err(|e| Error::Merge {
            partition: partition.to_string(),
            source: e.into(),
        })?;
        let meta = out.meta().clone();
        let key = if id == out_id {
            out_key.clone()
        } else {
            let key = block_path(&first.tenant, first.signal, meta.min_time, id);
            manifest.outputs.push(Output {
                id: id.to_string(),
                key: key.to_string(),
            });
            key
        };
        written.push((id, key, bytes, meta));
    }
    if written.len() > 1 {
        renew(ctx, lease, partition, manifest).await?;
    }
    let rows_in = job.input_rows();
    let rows_out: u64 = written.iter().map(|(_, _, _, m)| m.rows).sum();
    let out_min = written.iter().map(|(_, _, _, m)| m.min_time).min();
    let same_start = kind == JobKind::Retention || out_min.and_then(|t| i64::try_from(t).ok()) == Some(min_time);
    if rows_out + dropped_rows != rows_in || !same_start {
        // Never commit blocks that do not hold exactly their inputs (less
        // what retention dropped).
        return Err(Error::Internal(format!(
            "merged blocks of {partition} hold {rows_out} rows from {out_min:?} ({dropped_rows} dropped), expected {rows_in} from {min_time}"
        )));
    }
    for (_, key, bytes, _) in &written {
        put(ctx, &Path::from(key.as_ref()), bytes).await?;
    }
    fault_point("after_put");

    let records: Vec<pb::Block> = written
        .iter()
        .map(|(id, key, bytes, meta)| pb::Block {
            id: id.to_string(),
            tenant: first.tenant.as_str().to_owned(),
            signal: mira_catalog::pb_impl::signal::to_pb(first.signal),
            partition_start_ns: first.partition_start_ns,
            min_time_ns: i64::try_from(meta.min_time).unwrap_or(min_time),
            max_time_ns: i64::try_from(meta.max_time).unwrap_or(i64::MAX),
            rows: meta.rows,
            bytes: bytes.len() as u64,
            level: match level {
                Level::Hot => pb::Level::Hot,
                Level::Cold => pb::Level::Cold,
            } as i32,
            object_key: key.to_string(),
            created_at_ns: ctx.clock.now_ns(),
            state: pb::BlockState::Live as i32,
            ..Default::default()
        })
        .collect();
    // Confirms the lease with a full time to live before the commit.
    renew(ctx, lease, partition, manifest).await?;
    let replace = pb::ReplaceV2 {
        add: records,
        tombstone: job.inputs.iter().map(|b| b.id.to_string()).collect(),
        now_ns: ctx.clock.now_ns(),
        lease_key: lease.key.clone(),
        lease_holder: ctx.config.holder.clone(),
        reason: match kind {
            JobKind::Merge => pb::ReplaceReason::Merge,
            JobKind::Cold => pb::ReplaceReason::Cold,
            JobKind::Retention => pb::ReplaceReason::RetentionRewrite,
        } as i32,
        dropped_rows,
    };
    commit(ctx, partition, replace).await?;
    fault_point("after_replace");

    let output_bytes: u64 = written.iter().map(|(_, _, b, _)| b.len() as u64).sum();
    let label = crate::metrics::Metrics::kind(kind.as_str());
    let m = &ctx.metrics;
    m.input_bytes.get_or_create(&label).inc_by(input_bytes);
    m.output_bytes.get_or_create(&label).inc_by(output_bytes);
    m.input_blocks.get_or_create(&label).inc_by(job.inputs.len() as u64);
    m.output_blocks.get_or_create(&label).inc_by(written.len() as u64);
    m.rows.get_or_create(&label).inc_by(rows_in);
    Ok(JobReport {
        inputs: job.inputs.len(),
        input_bytes,
        output_bytes,
        rows: rows_in,
        dropped_rows,
        output_id: written
            .iter()
            .map(|(id, ..)| id.to_string())
            .collect::<Vec<_>>()
            .join(","),
        rewrite_s: took.as_secs_f64(),
    })
}

/// Peak memory of a job: the inputs, their decoded tables and the output.
fn estimate_memory(job: &Job) -> u64 {
    let bytes = job.input_bytes();
    match job.kind {
        JobKind::Merge => bytes.saturating_mul(3),
        // Cold inputs decode to several times their size.
        JobKind::Cold | JobKind::Retention => job
            .inputs
            .iter()
            .map(|b| match b.level {
                Level::Hot => b.bytes.saturating_mul(3),
                Level::Cold => b.bytes.saturating_mul(12),
            })
            .sum(),
    }
}

/// Fetches every input whole and checks it is the block the catalog lists,
/// with every section's checksum verified.
async fn fetch_inputs(ctx: &Arc<Ctx>, job: &Job) -> Result<Vec<Block>, Error> {
    futures::stream::iter(job.inputs.iter().cloned())
        .map(|b| {
            let ctx = ctx.clone();
            async move {
                let block = fetch_block(&ctx, &b).await?;
                for s in block.manifest().sections.clone() {
                    block.section_bytes(&s.name).map_err(|e| Error::CorruptInput {
                        id: b.id.to_string(),
                        reason: format!("section {}: {e}", s.name),
                    })?;
                }
                Ok(block)
            }
        })
        .buffered(8)
        .try_collect()
        .await
}

/// Reads a block's object whole (from the primary store, or from its
/// offload copy once the primary was freed) and checks it is the block the
/// catalog lists: id, tenant, signal and rows.
pub(crate) async fn fetch_block(ctx: &Arc<Ctx>, b: &BlockInfo) -> Result<Block, Error> {
    let (store, path) = match (&b.offload, b.primary_present()) {
        (Some(copy), false) => ctx.targets.resolve(&copy.location, &b.object_key)?,
        _ => (ctx.store.clone(), Path::from(b.object_key.as_str())),
    };
    let data = with_retries("GET", &path, || async { store.get(&path).await?.bytes().await }).await?;
    let corrupt = |reason: String| Error::CorruptInput {
        id: b.id.to_string(),
        reason,
    };
    let block = Block::from_bytes(data, Arc::new(VerifyCache::new(64))).map_err(|e| corrupt(e.to_string()))?;
    let m = block.meta();
    if m.block_id != b.id || m.tenant != b.tenant || m.signal != b.signal || m.rows != b.rows {
        return Err(corrupt(format!(
            "the object holds block {} of {}/{} with {} rows, not the catalog's",
            m.block_id, m.tenant, m.signal, m.rows
        )));
    }
    Ok(block)
}

/// What a job's merge wrote: its blocks (none: a retention rewrite kept
/// no row) and the rows it dropped.
struct Merged {
    outputs: Vec<(BlockId, Bytes)>,
    dropped_rows: u64,
}

/// Merges the inputs: a retention rewrite through its cut; a cold rewrite
/// with a class split into one block per policy class (the first keeps
/// `id`); anything else into one block.
fn merge(
    kind: JobKind,
    level: Level,
    inputs: &[Block],
    id: BlockId,
    (cut, split): (
        Option<&crate::lifecycle::RetentionCut>,
        Option<&crate::lifecycle::ClassSplit>,
    ),
    tenant: &str,
) -> Result<Merged, mira_core::Error> {
    match (kind, cut, split) {
        (JobKind::Retention, Some(cut), _) => {
            let out =
                mira_core::compact::merge_blocks_filtered(inputs, id, level, &|_, tables| cut.keep(tenant, tables))?;
            Ok(Merged {
                outputs: out.bytes.map(|b| (id, b)).into_iter().collect(),
                dropped_rows: out.dropped_rows,
            })
        }
        (JobKind::Cold, _, Some(split)) => {
            let classes = split.classes(tenant, inputs)?;
            if classes.len() < 2 {
                return Ok(Merged {
                    outputs: vec![(id, mira_core::compact::merge_blocks_at(inputs, id, level)?)],
                    dropped_rows: 0,
                });
            }
            let mut outputs = Vec::with_capacity(classes.len().min(crate::lifecycle::MAX_CLASSES));
            for (k, class) in classes.iter().take(crate::lifecycle::MAX_CLASSES).enumerate() {
                let out_id = if k == 0 { id } else { BlockId::new() };
                let out = mira_core::compact::merge_blocks_filtered(inputs, out_id, level, &|_, tables| {
                    split.rows_of(tenant, tables, class, &classes)
                })?;
                outputs.extend(out.bytes.map(|b| (out_id, b)));
            }
            Ok(Merged {
                outputs,
                dropped_rows: 0,
            })
        }
        _ => Ok(Merged {
            outputs: vec![(id, mira_core::compact::merge_blocks_at(inputs, id, level)?)],
            dropped_rows: 0,
        }),
    }
}

/// A merge failed: finds the input that cannot be read on its own, marks
/// it do-not-compact, and names it; otherwise the merge itself failed.
async fn blame_input(ctx: &Arc<Ctx>, job: &Job, inputs: &[Block], e: mira_core::Error) -> Error {
    for (info, block) in job.inputs.iter().zip(inputs) {
        if let Err(reason) = mira_core::compact::merge_tables(std::slice::from_ref(block)) {
            let reason = reason.to_string();
            quarantine(ctx, &info.id.to_string(), &reason).await;
            return Error::CorruptInput {
                id: info.id.to_string(),
                reason,
            };
        }
    }
    Error::Merge {
        partition: job.partition.to_string(),
        source: e,
    }
}

/// Marks a block do-not-compact so later plans leave it out.
pub(crate) async fn quarantine(ctx: &Arc<Ctx>, id: &str, reason: &str) {
    let reason: String = reason.chars().take(400).collect();
    tracing::error!(target: "mira::compactor", block = id, reason, "input block is corrupt: quarantined (left live and queryable, never compacted)");
    if let Err(e) = ctx.catalog.mark_no_compact(vec![id.to_owned()], &reason).await {
        tracing::warn!(target: "mira::compactor", block = id, error = %e, "could not mark the block do-not-compact");
    }
}

/// Runs one object-store request `op` on `path`, retrying transient
/// failures (up to 5 attempts, backing off); NotFound is final.
pub(crate) async fn with_retries<T, F, Fut>(op: &'static str, path: &Path, f: F) -> Result<T, Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt >= 4 || matches!(e, object_store::Error::NotFound { .. }) => {
                return Err(Error::Store {
                    op,
                    key: path.to_string(),
                    source: e,
                });
            }
            Err(e) => {
                tracing::warn!(target: "mira::compactor", op, key = %path, error = %e, "object store request failed; retrying");
                attempt += 1;
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

async fn put(ctx: &Arc<Ctx>, path: &Path, bytes: &Bytes) -> Result<(), Error> {
    with_retries("PUT", path, || {
        mira_core::store::put_whole(&*ctx.store, path, bytes, mira_core::store::PART_BYTES)
    })
    .await
}

/// Sends the Replace, retrying while the catalog does not answer (it is
/// idempotent: a retry of an applied Replace succeeds with no change).
async fn commit(ctx: &Arc<Ctx>, partition: &Partition, replace: pb::ReplaceV2) -> Result<(), Error> {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut attempt = 0;
    loop {
        match ctx.catalog.replace_v2(replace.clone()).await {
            Ok(_) => return Ok(()),
            Err(e @ ClientError::Unavailable { .. }) if attempt >= 3 => {
                return Err(conflict_or_catalog("replace", partition, e));
            }
            Err(ClientError::Unavailable { .. }) => {
                attempt += 1;
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(conflict_or_catalog("replace", partition, e)),
        }
    }
}
