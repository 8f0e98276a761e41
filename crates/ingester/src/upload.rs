//! The uploader of one shard: turns a sealed generation into block objects
//! (hot layout with sidecars), writes each through the object store
//! (retrying with backoff until it is fully written), then publishes them
//! to the catalog with the shard's WAL watermark under this process's
//! epoch, and tells waiters which generation is now published.
//! Generations of a shard are published in order, so the watermark only
//! moves forward, and never past a generation that is not published.
//!
//! A generation with more blocks than one catalog command may carry (many
//! tenants) is staged in chunks under a transaction id and made live,
//! with the watermark, by the last command; a crash between chunks leaves
//! only staged blocks, which the next process's fence drops, so a replay
//! publishes them once.
//!
//! When publishing cannot go through:
//! - the catalog unreachable: retried with backoff, forever;
//! - fenced (another process took the id): publishing stops for good, the
//!   ingester refuses writes, the WAL keeps every frame;
//! - one tenant's block cannot be built or encoded, or fails the checks the
//!   catalog runs on every new block ([`check_new_block`]): that tenant's
//!   requests of the generation are written (and synced) to the quarantine
//!   directory, its block is left out, and the other tenants' blocks are
//!   published with the watermark, so one bad record never holds up the
//!   rest. The ingester keeps taking writes; `/ready` names the quarantine
//!   and `mira_ingester_quarantined` counts it ([`crate::health`]). If the
//!   copy cannot be written, the generation is held as below;
//! - the whole publish refused (a bug, or the catalog refusing this
//!   ingester): the generation is written whole to the quarantine
//!   directory, the ingester refuses writes and says so on `/metrics`, and
//!   the publish is retried slowly; the watermark never passes it, so the
//!   WAL keeps its frames for a restart after the fix.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::CatalogClient;
use mira_catalog::pb_impl::block::check_new_block;
use mira_catalog::proto as pb;
use mira_common::clock::Clock;
use mira_common::retry::Backoff;
use mira_core::block::path::block_path;
use mira_core::ids::{BlockId, TenantId};
use mira_core::tables::write_hot;
use object_store::ObjectStore;
use tokio::sync::{mpsc, watch};

use crate::health::Health;
use crate::metrics::ReasonLabels;
use crate::shard::{Progress, Sealed};

/// Where blocks go and who they are published as.
#[derive(Clone)]
pub struct Destination {
    /// Blocks larger than this are uploaded in parts (multipart).
    pub multipart_above: usize,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub store: Arc<dyn ObjectStore>,
    pub catalog: Arc<CatalogClient>,
    pub ingester_id: String,
    /// This process's epoch (from the catalog's fence at start).
    pub epoch: u64,
    /// Most blocks per catalog command; more are staged in chunks.
    pub chunk_blocks: usize,
    /// Where unpublishable generations are written.
    pub quarantine_dir: PathBuf,
    pub health: Arc<Health>,
    /// Stamps blocks' creation time; the shards' seal age and window.
    pub clock: Clock,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("ingester_id", &self.ingester_id)
            .field("epoch", &self.epoch)
            .finish()
    }
}

const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Retry period of a publish the catalog refused.
const REFUSED_RETRY: Duration = Duration::from_secs(30);

/// A generation published: the catalog version, and the tenants whose
/// block was set aside in the quarantine directory instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    pub version: u64,
    pub quarantined: Vec<TenantId>,
}

/// Why a generation was not published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpublished {
    /// Another process took over the id: nothing more is published.
    Fenced,
    /// Refused or unencodable: written to the quarantine directory.
    Quarantined,
}

/// What to do when the catalog refuses a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRefusal {
    /// Keep retrying slowly while refusing writes (a running ingester with
    /// a WAL: the frames wait in it).
    Retry,
    /// Give the generation up (`--wal off`: nothing was acknowledged yet,
    /// its clients are answered with an error and retry; publishing it
    /// later would duplicate their retries).
    Drop,
    /// Return [`Unpublished::Quarantined`] (start-up recovery: the process
    /// stops with an error naming the quarantine).
    Stop,
}

/// Runs until `sealed` closes; `progress` carries the last published
/// generation number, `versions` the catalog version of that publish.
pub async fn run(
    dest: Destination,
    on_refusal: OnRefusal,
    mut sealed: mpsc::Receiver<Sealed>,
    progress: watch::Sender<Progress>,
    versions: watch::Sender<u64>,
    view: crate::shard::SharedView,
) {
    while let Some(g) = sealed.recv().await {
        let (version, set_aside) = match publish_generation(&dest, &g, on_refusal).await {
            Ok(p) => (p.version, p.quarantined),
            Err(Unpublished::Quarantined) => {
                crate::shard::lock_view(&view).pending.remove(&g.number);
                progress.send_modify(|p| {
                    p.failed.insert(g.number);
                    p.published = g.number;
                });
                continue;
            }
            Err(Unpublished::Fenced) => {
                // Nothing more from this process is published.
                progress.send_modify(|p| p.stopped = true);
                // Drain so shards never block on a full queue; each waiter
                // in off mode learns it will not be published.
                while sealed.recv().await.is_some() {}
                return;
            }
        };
        // The version moves before the generation leaves the recent view:
        // a recent-data reply that no longer holds it reports a published
        // version at least this high.
        let newest = (*versions.borrow()).max(version);
        versions.send_replace(newest);
        crate::shard::lock_view(&view).pending.remove(&g.number);
        progress.send_modify(|p| {
            p.failed_tenants.extend(set_aside.into_iter().map(|t| (g.number, t)));
            p.published = g.number;
        });
    }
}

/// Uploads and publishes one generation; returns the catalog version (and
/// the tenants set aside), or why it was not published.
pub async fn publish_generation(
    dest: &Destination,
    g: &Sealed,
    on_refusal: OnRefusal,
) -> Result<Published, Unpublished> {
    let mut blocks = Vec::with_capacity(g.blocks.len());
    let mut set_aside = Vec::new();
    for (tenant, id, tables) in &g.blocks {
        let (block, path, bytes) = match encode_block(dest, g, tenant, *id, tables).await {
            Ok(Some(b)) => b,
            Ok(None) => continue,
            Err(why) => {
                // This tenant's rows can never be published: kept aside,
                // the others go on.
                match quarantine(dest, g, Some(tenant), &why) {
                    Ok(dir) => {
                        dest.health.quarantine_noted(format!(
                            "{}: tenant {tenant}'s block of {} generation {} (shard {}): {why}",
                            dir.display(),
                            g.signal.as_str(),
                            g.number,
                            g.shard
                        ));
                        dest.health.export(&dest.metrics);
                        set_aside.push(tenant.clone());
                        continue;
                    }
                    Err(_) => {
                        // No copy kept: the generation is held (a later
                        // watermark would cover these frames).
                        dest.health.set_quarantined(true);
                        dest.health.export(&dest.metrics);
                        if on_refusal != OnRefusal::Retry {
                            return Err(Unpublished::Quarantined);
                        }
                        return std::future::pending().await;
                    }
                }
            }
        };
        put_until_written(&*dest.store, &path, bytes.clone(), dest.multipart_above).await;
        dest.metrics.bytes_uploaded.inc_by(bytes.len() as u64);
        blocks.push(block);
    }
    #[cfg(feature = "fault-hooks")]
    if let Ok(t) = std::env::var("MIRA_FAULT_REFUSE_PUBLISH")
        && let Some(b) = blocks.iter().find(|b| b.tenant == t).cloned()
    {
        // A command the catalog refuses whole (a block named twice), as a
        // bug would send: no block check sees it.
        blocks.push(b);
    }
    let watermark = (g.max_seq > 0).then(|| pb::Watermark {
        ingester_id: dest.ingester_id.clone(),
        shard: u32::from(g.shard),
        wal_seq: g.max_seq,
    });
    if blocks.is_empty() && watermark.is_none() {
        return Ok(Published {
            version: 0,
            quarantined: set_aside,
        });
    }
    let published_blocks = blocks.len() as u64;
    // One transaction per generation: a retried stage of the same blocks
    // is a no-op, a retried commit after a lost answer is recognised.
    let txn = BlockId::new().to_string();
    let mut backoff = Backoff::new(Duration::from_millis(50), BACKOFF_MAX);
    let mut quarantined: Option<Option<PathBuf>> = None;
    loop {
        match publish_once(dest, &blocks, watermark.clone(), &txn).await {
            Ok(version) => {
                if let Some(copy) = quarantined {
                    tracing::info!(target: "mira::ingester", shard = g.shard, generation = g.number, "a quarantined generation was published after all");
                    // Its copy is no longer needed.
                    if let Some(dir) = copy
                        && let Err(e) = std::fs::remove_dir_all(&dir)
                    {
                        tracing::warn!(target: "mira::ingester", dir = %dir.display(), error = %e, "could not remove the quarantine copy of a generation published after all");
                    }
                    dest.health.set_quarantined(false);
                    dest.health.export(&dest.metrics);
                }
                dest.metrics
                    .blocks_published
                    .get_or_create(&crate::metrics::SignalLabels {
                        signal: g.signal.as_str(),
                    })
                    .inc_by(published_blocks);
                return Ok(Published {
                    version,
                    quarantined: set_aside,
                });
            }
            Err(mira_catalog::ClientError::Rejected(status)) if is_fenced(&status) => {
                dest.metrics
                    .publish_failures
                    .get_or_create(&ReasonLabels { reason: "fenced" })
                    .inc();
                tracing::error!(target: "mira::ingester", %status, "fenced: another process publishes as this ingester id; this one stops publishing and refuses writes (its WAL is left as it is)");
                dest.health.set_fenced();
                dest.health.export(&dest.metrics);
                return Err(Unpublished::Fenced);
            }
            Err(mira_catalog::ClientError::Rejected(status)) => {
                dest.metrics
                    .publish_failures
                    .get_or_create(&ReasonLabels { reason: "rejected" })
                    .inc();
                if quarantined.is_none() {
                    let copy = quarantine(dest, g, None, &format!("the catalog refused the publish: {status}"));
                    quarantined = Some(copy.ok());
                    dest.health.set_quarantined(true);
                    dest.health.export(&dest.metrics);
                }
                if on_refusal != OnRefusal::Retry {
                    return Err(Unpublished::Quarantined);
                }
                tracing::error!(target: "mira::ingester", %status, blocks = blocks.len(), retry_in_s = REFUSED_RETRY.as_secs(), "the catalog refused a publish; the generation is quarantined, its WAL frames kept, writes refused");
                tokio::time::sleep(REFUSED_RETRY).await;
            }
            Err(e) => {
                dest.metrics
                    .publish_failures
                    .get_or_create(&ReasonLabels { reason: "unavailable" })
                    .inc();
                tracing::warn!(target: "mira::ingester", error = %e, blocks = blocks.len(), "publish failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

fn is_fenced(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition && status.message().contains("is fenced")
}

/// One attempt at the whole publish: a single fenced publish, or the
/// blocks staged in chunks under `txn` and made live by the last command
/// (with the watermark), which always carries blocks of its own.
async fn publish_once(
    dest: &Destination,
    blocks: &[pb::Block],
    watermark: Option<pb::Watermark>,
    txn: &str,
) -> Result<u64, mira_catalog::ClientError> {
    use pb::write_request::Command;
    let chunk = dest.chunk_blocks.max(1);
    let (direct, txn) = if blocks.len() <= chunk {
        (blocks.to_vec(), String::new())
    } else {
        let txn = txn.to_owned();
        let (staged, last) = blocks.split_at(blocks.len() - chunk);
        for part in staged.chunks(chunk) {
            dest.catalog
                .write(Command::Stage(pb::Stage {
                    ingester_id: dest.ingester_id.clone(),
                    epoch: dest.epoch,
                    txn: txn.clone(),
                    blocks: part.to_vec(),
                }))
                .await?;
            #[cfg(feature = "fault-hooks")]
            if std::env::var_os("MIRA_FAULT_ABORT_AFTER_STAGE").is_some() {
                // A kill -9 between two chunks of one publish.
                std::process::abort();
            }
        }
        (last.to_vec(), txn)
    };
    let reply = dest
        .catalog
        .write(Command::FencedPublish(pb::FencedPublish {
            ingester_id: dest.ingester_id.clone(),
            epoch: dest.epoch,
            blocks: direct,
            watermark,
            txn,
        }))
        .await?;
    Ok(reply.version)
}

/// One tenant's block of `g` encoded and checked as the catalog will check
/// it: `(block, object path, bytes)` to upload, `None` when it has no rows,
/// or why it can never be published.
async fn encode_block(
    dest: &Destination,
    g: &Sealed,
    tenant: &TenantId,
    id: BlockId,
    tables: &Result<mira_core::convert::TableSet, String>,
) -> Result<Option<(pb::Block, object_store::path::Path, bytes::Bytes)>, String> {
    let tables = tables
        .as_ref()
        .map_err(|e| format!("building tenant {tenant}'s block failed: {e}"))?;
    // Encoding takes tens of milliseconds: on the blocking pool, so the
    // runtime's workers keep serving requests meanwhile.
    let (t, owner) = (tables.clone(), tenant.clone());
    let bytes = match tokio::task::spawn_blocking(move || write_hot(&t, id, owner)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(format!("encoding tenant {tenant}'s block failed: {e}")),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is stopping; the WAL keeps the frames.
        Err(_) => return std::future::pending().await,
    };
    let path = block_path(tenant, g.signal, tables.min_time, id);
    #[allow(unused_mut)]
    let mut block = pb::Block {
        id: id.to_string(),
        tenant: tenant.to_string(),
        signal: mira_catalog::pb_impl::signal::to_pb(g.signal),
        min_time_ns: i64::try_from(tables.min_time).unwrap_or(i64::MAX),
        max_time_ns: i64::try_from(tables.max_time).unwrap_or(i64::MAX),
        rows: tables.rows as u64,
        bytes: bytes.len() as u64,
        level: pb::Level::Hot as i32,
        object_key: path.to_string(),
        created_at_ns: dest.clock.now_ns(),
        ..Default::default()
    };
    #[cfg(feature = "fault-hooks")]
    if std::env::var("MIRA_FAULT_REFUSE_TENANT").is_ok_and(|t| t == tenant.as_str()) {
        // A block the catalog would refuse (a negative time), as a bug would
        // make.
        block.created_at_ns = -1;
    }
    if tables.rows == 0 {
        return Ok(None);
    }
    check_new_block(&block).map_err(|e| format!("the catalog would refuse tenant {tenant}'s block: {e}"))?;
    Ok(Some((block, path, bytes)))
}

/// Writes what of a generation cannot be published (`tenant`'s requests,
/// or every tenant's) to `quarantine/{signal}-{shard}-{generation}-{ulid}/`:
/// the requests as WAL frames (`frames.wal`, readable by the same frame
/// reader) and the reason, synced to disk; returns the directory.
fn quarantine(dest: &Destination, g: &Sealed, tenant: Option<&TenantId>, why: &str) -> std::io::Result<PathBuf> {
    dest.metrics.quarantined.inc();
    let dir = dest.quarantine_dir.join(format!(
        "{}-{}-{}-{}",
        g.signal.as_str(),
        g.shard,
        g.number,
        BlockId::new()
    ));
    let mut frames = Vec::new();
    let mut n = 0u64;
    for (t, payloads) in &g.requests {
        if tenant.is_some_and(|only| only != t) {
            continue;
        }
        for p in payloads {
            n += 1;
            mira_core::wal::encode_frame(&mut frames, n, g.signal, g.shard, t, p);
        }
    }
    let tenants = tenant.map_or_else(
        || "every tenant of the generation".to_owned(),
        |t| format!("tenant {t}"),
    );
    let reason = format!(
        "{why}\ningester {} epoch {} shard {} generation {} wal_seq_max {} requests {n} of {tenants}\n",
        dest.ingester_id, dest.epoch, g.shard, g.number, g.max_seq
    );
    match write_synced(&dir, &[("frames.wal", &frames), ("reason.txt", reason.as_bytes())]) {
        Ok(()) => {
            tracing::error!(target: "mira::ingester", dir = %dir.display(), reason = why, requests = n, tenants, "generation quarantined");
            Ok(dir)
        }
        Err(e) => {
            tracing::error!(target: "mira::ingester", dir = %dir.display(), error = %e, reason = why, "could not write the quarantine copy; the WAL still holds the frames");
            Err(e)
        }
    }
}

/// Creates `dir` with `files`, each synced, then the directory and its
/// parent, so the copy survives a crash once this returns.
fn write_synced(dir: &std::path::Path, files: &[(&str, &[u8])]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in files {
        let mut f = std::fs::File::create(dir.join(name))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::File::open(dir)?.sync_all()?;
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

async fn put_until_written(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
    multipart_above: usize,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), BACKOFF_MAX);
    loop {
        match mira_core::store::put_whole(store, path, &bytes, multipart_above).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(target: "mira::ingester", %path, error = %e, "block upload failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}
