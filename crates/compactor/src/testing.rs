//! Helpers for tests of the restore and of `mira offload` (not used by the
//! compactor itself): publish a real block, and offload blocks the way the
//! compactor's offload lane does (compactor-design.md §9.2): copy each
//! object to the target, hashed; `MarkOffloadedV2` with the copy's location
//! and SHA-256; then, under the partition lease, delete the primary object
//! and `MarkPrimaryFreed`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use mira_catalog::CatalogClient;
use mira_catalog::proto as pb;
use mira_core::block::path::block_path;
use mira_core::block::{Block, VerifyCache};
use mira_core::convert::TableSet;
use mira_core::ids::{BlockId, TenantId};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::copy::{RateLimit, copy_object};
use crate::error::Error;
use crate::planner::Partition;
use crate::targets::Target;

fn internal(what: &str) -> impl Fn(String) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// Writes `tables` as a hot block of `tenant` to `store` and publishes it,
/// created at `created_at_ns`; returns its catalog record and its bytes.
pub async fn publish_block(
    catalog: &CatalogClient,
    store: &Arc<dyn ObjectStore>,
    tenant: &TenantId,
    tables: &TableSet,
    created_at_ns: i64,
) -> Result<(pb::Block, Bytes), Error> {
    let id = BlockId::new();
    let bytes =
        mira_core::tables::write_hot(tables, id, tenant.clone()).map_err(|e| internal("encode")(e.to_string()))?;
    let block = Block::from_bytes(bytes.clone(), Arc::new(VerifyCache::new(8)))
        .map_err(|e| internal("read back")(e.to_string()))?;
    let meta = block.meta().clone();
    let key = block_path(tenant, meta.signal, meta.min_time, id);
    store
        .put(&key, PutPayload::from(bytes.clone()))
        .await
        .map_err(|source| Error::Store {
            op: "PUT",
            key: key.to_string(),
            source,
        })?;
    let record = pb::Block {
        id: id.to_string(),
        tenant: tenant.as_str().to_owned(),
        signal: mira_catalog::pb_impl::signal::to_pb(meta.signal),
        min_time_ns: i64::try_from(meta.min_time).unwrap_or(i64::MAX),
        max_time_ns: i64::try_from(meta.max_time).unwrap_or(i64::MAX),
        rows: meta.rows,
        bytes: bytes.len() as u64,
        level: pb::Level::Hot as i32,
        object_key: key.to_string(),
        created_at_ns,
        ..Default::default()
    };
    catalog
        .publish(vec![record.clone()], None)
        .await
        .map_err(|e| internal("publish")(e.to_string()))?;
    Ok((record, bytes))
}

/// Offloads live `blocks` from `primary` to `target` at `now_ns` and, with
/// `free_primary`, deletes their primary objects, one lease per partition
/// (holder `test-offload/{ULID}`).
pub async fn offload(
    catalog: &CatalogClient,
    primary: &Arc<dyn ObjectStore>,
    target: &Target,
    blocks: &[pb::Block],
    now_ns: i64,
    free_primary: bool,
) -> Result<(), Error> {
    let none = RateLimit::new(0);
    let mut items = Vec::with_capacity(blocks.len());
    for b in blocks {
        let key = Path::from(b.object_key.as_str());
        let copied = copy_object((primary, &key), (&target.store, &key), (b.bytes, None), &none).await?;
        items.push(pb::OffloadItem {
            id: b.id.clone(),
            location: target.location(&b.object_key),
            sha256: copied.sha256,
            at_ns: now_ns,
        });
    }
    for chunk in items.chunks(1000) {
        catalog
            .mark_offloaded_v2(chunk.to_vec())
            .await
            .map_err(|e| internal("mark offloaded")(e.to_string()))?;
    }
    if !free_primary {
        return Ok(());
    }
    let mut by_partition: BTreeMap<String, Vec<&pb::Block>> = BTreeMap::new();
    for b in blocks {
        let signal =
            mira_catalog::pb_impl::signal::from_pb(b.signal).ok_or_else(|| internal("signal")(b.signal.to_string()))?;
        // The catalog fills partition_start_ns on read; a record made here
        // has it from the object key's hour.
        let start_ns = b.min_time_ns.div_euclid(3_600_000_000_000) * 3_600_000_000_000;
        let partition = Partition {
            tenant: b.tenant.clone(),
            signal: signal.as_str(),
            start_ns,
        };
        by_partition.entry(partition.lease_key()).or_default().push(b);
    }
    let holder = format!("test-offload/{}", BlockId::new());
    for (key, blocks) in by_partition {
        catalog
            .acquire_lease(&key, &holder, now_ns, 60_000, None)
            .await
            .map_err(|e| internal("lease")(e.to_string()))?;
        for b in &blocks {
            match primary.delete(&Path::from(b.object_key.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(Error::Store {
                        op: "DELETE",
                        key: b.object_key.clone(),
                        source,
                    });
                }
            }
        }
        let ids = blocks.iter().map(|b| b.id.clone()).collect();
        catalog
            .mark_primary_freed(ids, now_ns, (&key, &holder))
            .await
            .map_err(|e| internal("mark primary freed")(e.to_string()))?;
        catalog
            .release_lease(&key, &holder)
            .await
            .map_err(|e| internal("release")(e.to_string()))?;
    }
    Ok(())
}
