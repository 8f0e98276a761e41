//! Garbage collection: objects of replaced blocks deleted once the
//! deletion grace has passed (then the catalog forgets them with `Purge`),
//! and the orphan sweep: objects under the store that no catalog entry
//! names, older than the orphan grace (a crashed job's output the next
//! lease holder never saw, an ingester's upload whose publish was
//! refused), fenced with `Abandon` and deleted under the partition lease.

use std::collections::HashSet;
use std::sync::Arc;

use futures::TryStreamExt;
use mira_catalog::proto as pb;
use mira_core::block::path::parse_block_path;
use mira_core::ids::BlockId;

use crate::Ctx;
use crate::copy::{CheckFailed, RateLimit, Unproven, copy_object, verify_object};
use crate::error::Error;
use crate::job::{self, Manifest};
use crate::planner::{BlockInfo, Partition};

/// Most ids per Purge command.
const PURGE_BATCH: usize = 1000;

/// Deletes the objects of `blocks` (tombstoned, past the grace), then
/// purges them from the catalog. Returns how many were purged.
pub(crate) async fn purge(ctx: &Arc<Ctx>, blocks: &[BlockInfo]) -> Result<usize, Error> {
    let mut purged = 0;
    for batch in blocks.chunks(PURGE_BATCH) {
        for (i, b) in batch.iter().enumerate() {
            if b.primary_present() {
                job::delete_object(ctx, &b.object_key, "purge").await?;
            }
            if i == 0 {
                job::fault_point("during_delete");
            }
            if let Some(copy) = &b.offload {
                delete_copy(ctx, &copy.location, &b.object_key).await?;
            }
        }
        let ids: Vec<String> = batch.iter().map(|b| b.id.to_string()).collect();
        ctx.pacer
            .run(ctx.catalog.write(pb::write_request::Command::Purge(pb::Purge { ids })))
            .await
            .map_err(|source| Error::Catalog {
                what: "purge",
                partition: "*".to_owned(),
                source,
            })?;
        purged += batch.len();
    }
    Ok(purged)
}

/// Deletes a block's offload copy; one already gone counts as deleted.
async fn delete_copy(ctx: &Arc<Ctx>, location: &str, object_key: &str) -> Result<(), Error> {
    let (store, path) = ctx.targets.resolve(location, object_key)?;
    job::delete_in(ctx, &*store, &path, "offload_copy").await
}

/// What [`free_primaries`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Freed {
    /// Primary objects deleted and recorded so.
    pub freed: usize,
    /// Partitions another holder leased (tried again next round).
    pub leased: u64,
    /// Primaries kept because their copy failed its check.
    pub kept: usize,
}

/// Deletes the primary objects of offloaded blocks past the grace, per
/// partition under its lease (so no restore of the partition runs
/// meanwhile), then records it. Right before each delete the block's copy
/// is proven again ([`crate::copy::verify_object`]: the length and SHA-256
/// the catalog recorded); a copy that is missing, short or changed keeps
/// its primary (counted, logged) and is written again from the primary,
/// to be proven again, and the primary freed, on a later round.
pub(crate) async fn free_primaries(ctx: &Arc<Ctx>, blocks: &[BlockInfo]) -> Result<Freed, Error> {
    let mut out = Freed::default();
    let rate = RateLimit::new(ctx.config.offload.rate_bytes);
    let mut by_partition: std::collections::BTreeMap<Partition, Vec<&BlockInfo>> = Default::default();
    for b in blocks {
        by_partition.entry(Partition::of(b)).or_default().push(b);
    }
    for (partition, members) in by_partition {
        let manifest = Manifest {
            v: 1,
            kind: "free_primary".to_owned(),
            started_ns: ctx.clock.now_ns(),
            ..Manifest::default()
        };
        let lease = match job::acquire(ctx, &partition, &manifest).await {
            Ok(l) => l,
            Err(Error::Conflict { .. }) => {
                out.leased += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut freed = Vec::with_capacity(members.len());
        let result = async {
            for b in &members {
                if let Err(failed) = check_copy(ctx, b).await {
                    out.kept += 1;
                    ctx.metrics.verify_failed("before_free", failed.reason);
                    tracing::error!(target: "mira::compactor", block = %b.id, reason = %failed, "offload copy failed its check: the primary object is kept; writing the copy again");
                    repair_copy(ctx, b, &rate).await;
                    continue;
                }
                job::delete_object(ctx, &b.object_key, "offloaded").await?;
                freed.push(b.id.to_string());
            }
            job::fault_point("after_free_primary");
            if freed.is_empty() {
                return Ok(());
            }
            ctx.pacer
                .run(ctx.catalog.mark_primary_freed(
                    freed.clone(),
                    ctx.clock.now_ns(),
                    (&lease.key, &ctx.config.holder),
                ))
                .await
                .map(|_| ())
                .map_err(|source| Error::Catalog {
                    what: "mark primary freed",
                    partition: partition.to_string(),
                    source,
                })
        }
        .await;
        job::release(ctx, lease).await;
        result?;
        out.freed += freed.len();
    }
    Ok(out)
}

/// Proves the offload copy of `b` against what the catalog recorded.
async fn check_copy(ctx: &Arc<Ctx>, b: &BlockInfo) -> Result<(), CheckFailed> {
    let Some(copy) = &b.offload else {
        return Err(CheckFailed {
            reason: Unproven::Missing,
            detail: "the catalog records no offload copy".to_owned(),
        });
    };
    let (store, path) = ctx
        .targets
        .resolve(&copy.location, &b.object_key)
        .map_err(|e| CheckFailed {
            reason: Unproven::Unreadable,
            detail: e.to_string(),
        })?;
    verify_object(&store, &path, (b.bytes, &copy.sha256)).await
}

/// Writes the offload copy of `b` again from its primary object (checked
/// against the catalog's length and SHA-256 before anything is written),
/// then reads it back; what fails is logged (the copy is checked again
/// next round either way).
async fn repair_copy(ctx: &Arc<Ctx>, b: &BlockInfo, rate: &RateLimit) {
    let Some(copy) = &b.offload else { return };
    let repaired = async {
        let (store, path) = ctx.targets.resolve(&copy.location, &b.object_key)?;
        let src = object_store::path::Path::from(b.object_key.as_str());
        copy_object((&ctx.store, &src), (&store, &path), (b.bytes, Some(&copy.sha256)), rate).await?;
        verify_object(&store, &path, (b.bytes, &copy.sha256))
            .await
            .map_err(|failed| failed.into_error(&copy.location))
    }
    .await;
    match repaired {
        Ok(()) => {
            tracing::warn!(target: "mira::compactor", block = %b.id, location = %copy.location, "offload copy written again from the primary; its primary is freed once a later round proves it")
        }
        Err(e) => {
            tracing::error!(target: "mira::compactor", block = %b.id, error = %e, "offload copy could not be written again; the primary object is kept")
        }
    }
}

/// What one sweep found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SweepReport {
    pub objects: usize,
    pub orphans_deleted: usize,
    /// Unknown objects younger than the grace (an upload in flight).
    pub young_unknown: usize,
}

/// Lists the whole store and deletes block objects the catalog does not
/// name that are older than the orphan grace. The catalog is read after
/// the listing, so a block published meanwhile is known.
pub(crate) async fn sweep_orphans(ctx: &Arc<Ctx>) -> Result<SweepReport, Error> {
    let objects: Vec<object_store::ObjectMeta> =
        ctx.store
            .list(None)
            .try_collect()
            .await
            .map_err(|source| Error::Store {
                op: "LIST",
                key: "/".to_owned(),
                source,
            })?;
    let known: HashSet<BlockId> = crate::view::load(ctx).await?.blocks.iter().map(|b| b.id).collect();
    let now_ns = ctx.clock.now_ns();
    let mut report = SweepReport {
        objects: objects.len(),
        ..SweepReport::default()
    };
    for o in objects {
        let Ok(loc) = parse_block_path(&o.location) else {
            continue; // not a block object: not ours to judge
        };
        if known.contains(&loc.block_id) {
            continue;
        }
        let modified_ns = o.last_modified.timestamp_nanos_opt().unwrap_or(i64::MAX);
        if modified_ns.saturating_add(ctx.config.orphan_grace_ns) > now_ns {
            report.young_unknown += 1;
            continue;
        }
        let partition = Partition {
            tenant: loc.tenant.as_str().to_owned(),
            signal: loc.signal.as_str(),
            start_ns: i64::try_from(loc.hour_start).unwrap_or(i64::MAX),
        };
        // Under the lease, so no job of ours is between its PUT and commit.
        let manifest = Manifest {
            v: 1,
            kind: "orphan_sweep".to_owned(),
            started_ns: now_ns,
            ..Manifest::default()
        };
        let lease = match job::acquire(ctx, &partition, &manifest).await {
            Ok(l) => l,
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        };
        let deleted = job::abandon_output(ctx, &loc.block_id.to_string(), o.location.as_ref(), "sweep").await;
        job::release(ctx, lease).await;
        if deleted? {
            tracing::warn!(target: "mira::compactor", key = %o.location, "orphan object deleted (no catalog entry names it)");
            report.orphans_deleted += 1;
        }
    }
    Ok(report)
}
