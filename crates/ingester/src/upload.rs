//! The uploader of one shard: turns a sealed generation into block objects
//! (hot layout with sidecars), writes each through the object store
//! (retrying with backoff until it is fully written), then publishes them
//! all to the catalog in one command with the shard's WAL watermark, and
//! tells waiters which generation is now published. Generations of a shard
//! are published in order, so the watermark only moves forward.

use std::sync::Arc;
use std::time::Duration;

use mira_catalog::CatalogClient;
use mira_catalog::proto as pb;
use mira_core::block::path::block_path;
use mira_core::tables::write_hot;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::{mpsc, watch};

use crate::shard::Sealed;

/// Where blocks go and who they are published as.
#[derive(Clone)]
pub struct Destination {
    /// Blocks larger than this are uploaded in parts (multipart).
    pub multipart_above: usize,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub store: Arc<dyn ObjectStore>,
    pub catalog: Arc<CatalogClient>,
    pub ingester_id: String,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("ingester_id", &self.ingester_id)
            .finish()
    }
}

const BACKOFF_MAX: Duration = Duration::from_secs(10);

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Runs until `sealed` closes; `published` carries the last published
/// generation number, `versions` the catalog version of that publish.
pub async fn run(
    dest: Destination,
    mut sealed: mpsc::Receiver<Sealed>,
    published: watch::Sender<u64>,
    versions: watch::Sender<u64>,
    view: crate::shard::SharedView,
) {
    while let Some(g) = sealed.recv().await {
        let mut blocks = Vec::with_capacity(g.blocks.len());
        for (tenant, id, tables) in &g.blocks {
            let id = *id;
            let bytes = match write_hot(tables, id, tenant.clone()) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(target: "mira::ingester", %tenant, error = %e, "encoding a block failed; its rows are lost");
                    continue;
                }
            };
            let path = block_path(tenant, g.signal, tables.min_time, id);
            put_until_written(&*dest.store, &path, bytes.clone(), dest.multipart_above).await;
            dest.metrics.bytes_uploaded.inc_by(bytes.len() as u64);
            blocks.push(pb::Block {
                id: id.to_string(),
                tenant: tenant.to_string(),
                signal: match g.signal {
                    mira_core::ids::Signal::Logs => pb::Signal::Logs,
                    mira_core::ids::Signal::Traces => pb::Signal::Traces,
                    mira_core::ids::Signal::Metrics => pb::Signal::Metrics,
                } as i32,
                min_time_ns: i64::try_from(tables.min_time).unwrap_or(i64::MAX),
                max_time_ns: i64::try_from(tables.max_time).unwrap_or(i64::MAX),
                rows: tables.rows as u64,
                bytes: bytes.len() as u64,
                level: pb::Level::Hot as i32,
                object_key: path.to_string(),
                created_at_ns: now_ns(),
                ..Default::default()
            });
        }
        let watermark = (g.max_seq > 0).then(|| pb::Watermark {
            ingester_id: dest.ingester_id.clone(),
            shard: u32::from(g.shard),
            wal_seq: g.max_seq,
        });
        if blocks.is_empty() && watermark.is_none() {
            crate::shard::lock_view(&view).pending.remove(&g.number);
            published.send_replace(g.number);
            continue;
        }
        let published_blocks = blocks.len() as u64;
        let version = publish_until_done(&dest.catalog, blocks, watermark).await;
        // The version moves before the generation leaves the recent view:
        // a recent-data reply that no longer holds it reports a published
        // version at least this high.
        let newest = (*versions.borrow()).max(version);
        versions.send_replace(newest);
        crate::shard::lock_view(&view).pending.remove(&g.number);
        dest.metrics
            .blocks_published
            .get_or_create(&crate::metrics::SignalLabels {
                signal: g.signal.as_str(),
            })
            .inc_by(published_blocks);
        published.send_replace(g.number);
    }
}

/// Part size of multipart uploads (S3's minimum is 5 MiB).
const PART_BYTES: usize = 8 << 20;

/// One attempt: a single put, or a multipart upload that is completed
/// only when every part is written (aborted otherwise). Either way the
/// object appears whole or not at all.
async fn put_once(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: &bytes::Bytes,
    multipart_above: usize,
) -> object_store::Result<()> {
    if bytes.len() <= multipart_above {
        return store.put(path, PutPayload::from(bytes.clone())).await.map(|_| ());
    }
    let upload = store.put_multipart(path).await?;
    let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    w.put(bytes.clone());
    w.finish().await.map(|_| ())
}

async fn put_until_written(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    bytes: bytes::Bytes,
    multipart_above: usize,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match put_once(store, path, &bytes, multipart_above).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(target: "mira::ingester", %path, error = %e, "block upload failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

async fn publish_until_done(catalog: &CatalogClient, blocks: Vec<pb::Block>, watermark: Option<pb::Watermark>) -> u64 {
    let mut backoff = Duration::from_millis(50);
    loop {
        match catalog.publish(blocks.clone(), watermark.clone()).await {
            Ok(version) => return version,
            Err(mira_catalog::ClientError::Rejected(status)) => {
                // Not retryable (a bug or a foreign writer): retrying would
                // wedge the shard. The objects stay in the store for the
                // compactor's orphan sweep; the frames stay in the WAL.
                tracing::error!(target: "mira::ingester", %status, blocks = blocks.len(), "the catalog refused a publish");
                return 0;
            }
            Err(e) => {
                tracing::warn!(target: "mira::ingester", error = %e, blocks = blocks.len(), "publish failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}
