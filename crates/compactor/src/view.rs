//! The compactor's view of the catalog, read fresh each round: every block
//! of every tenant (all states) and the partition leases with their job
//! manifests.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mira_catalog::proto as pb;
use mira_core::block::Level;
use mira_core::ids::{BlockId, TenantId};

use crate::Ctx;
use crate::error::Error;
use crate::job::Manifest;
use crate::planner::{BlockInfo, BlockState, OffloadInfo};

/// One round's snapshot.
#[derive(Debug, Default)]
pub struct View {
    pub blocks: Vec<BlockInfo>,
    /// Lease keys held by another holder right now.
    pub leased: HashSet<String>,
    /// Manifests naming outputs of leases nobody works under any more
    /// (expired, or ours from an unanswered commit), by lease key: the
    /// next job on the partition cleans them up first.
    pub stale_manifests: HashMap<String, Manifest>,
    /// Lease keys this compactor holds.
    pub held: usize,
}

pub(crate) async fn load(ctx: &Arc<Ctx>) -> Result<View, Error> {
    let catalog = |what: &'static str| {
        move |source| Error::Catalog {
            what,
            partition: "*".to_owned(),
            source,
        }
    };
    let listed = ctx
        .catalog
        .list_all_blocks(&[
            pb::BlockState::Live,
            pb::BlockState::Tombstoned,
            pb::BlockState::Offloaded,
        ])
        .await
        .map_err(catalog("list blocks"))?;
    let mut blocks = Vec::with_capacity(listed.len());
    for b in &listed {
        match block_info(b) {
            Ok(info) => blocks.push(info),
            Err(e) => tracing::warn!(target: "mira::compactor", error = %e, "catalog block skipped"),
        }
    }
    let leases = ctx
        .catalog
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .map_err(catalog("list leases"))?
        .leases;
    let now = ctx.clock.now_ns();
    let mut view = View {
        blocks,
        ..View::default()
    };
    for l in leases {
        if !l.key.starts_with("part/") {
            continue;
        }
        let own = l.holder == ctx.config.holder;
        if own && l.expires_at_ns > now {
            view.held += 1;
        }
        if !own && l.expires_at_ns > now {
            view.leased.insert(l.key);
        } else if let Some(m) = Manifest::parse(&l.job).filter(|m| !m.outputs.is_empty()) {
            // An expired holder's, or one of ours left by a job whose
            // commit went unanswered (no job of ours runs while a round
            // reads the view).
            view.stale_manifests.insert(l.key, m);
        }
    }
    Ok(view)
}

fn block_info(b: &pb::Block) -> Result<BlockInfo, Error> {
    let bad = |reason: String| Error::BadRecord {
        id: b.id.clone(),
        reason,
    };
    let id: BlockId = b.id.parse().map_err(|e: mira_core::Error| bad(e.to_string()))?;
    let tenant = TenantId::new(&b.tenant).map_err(|e| bad(e.to_string()))?;
    let signal = mira_catalog::pb_impl::signal::from_pb(b.signal).ok_or_else(|| bad(format!("signal {}", b.signal)))?;
    let state = match pb::BlockState::try_from(b.state) {
        Ok(pb::BlockState::Live) => BlockState::Live,
        Ok(pb::BlockState::Tombstoned) => BlockState::Tombstoned {
            at_ns: b.tombstoned_at_ns,
        },
        Ok(pb::BlockState::Offloaded) => BlockState::Offloaded,
        _ => return Err(bad(format!("state {}", b.state))),
    };
    Ok(BlockInfo {
        id,
        tenant,
        signal,
        partition_start_ns: b.partition_start_ns,
        min_time_ns: b.min_time_ns,
        max_time_ns: b.max_time_ns,
        rows: b.rows,
        bytes: b.bytes,
        level: if b.level == pb::Level::Cold as i32 {
            Level::Cold
        } else {
            Level::Hot
        },
        created_at_ns: b.created_at_ns,
        object_key: b.object_key.clone(),
        state,
        quarantined: !b.no_compact_reason.is_empty(),
        offload: (!b.offload_location.is_empty()).then(|| OffloadInfo {
            location: b.offload_location.clone(),
            sha256: b.offload_sha256.clone(),
            at_ns: b.offloaded_at_ns,
            primary_freed: b.primary_freed,
            pinned_until_ns: b.pinned_until_ns,
        }),
    })
}
