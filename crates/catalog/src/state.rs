//! The catalog's state and the deterministic rules that change it. Pure:
//! no I/O, no clock (times come from the commands), so every member applies
//! the same log to the same state, and the rules are tested directly. Its
//! serialized forms in snapshots are in [`image`].

pub mod image;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;

use mira_core::ids::{BlockId, Signal, TenantId};
use serde::{Deserialize, Serialize};

pub use self::image::{NoCompactMark, OffloadMark, StateImage, StateImageExt, StateImageExt2};
use crate::error::CommandError;
use crate::model::{
    BlockRecord, BlockState, Command, IngesterLease, Lease, OffloadCopy, Policy, PolicyKind, ReplaceReason, StateKind,
    TargetCheck, Watermark, check_one_partition,
};

/// One observable change, as delivered by watch
/// ([`crate::pb_impl::change`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Block(BlockRecord),
    Purged(BlockId),
    Watermark(Watermark),
    Ingester(IngesterLease),
    LeaseSet(Lease),
    LeaseReleased(String),
    PolicySet(Policy),
    PolicyDeleted(Policy),
}

/// What an accepted command produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub changes: Vec<Change>,
    /// Lease commands: the lease after the command.
    pub lease: Option<Lease>,
    /// Fence: the ingester's new epoch.
    pub epoch: Option<u64>,
}

/// Blocks spanning at most this long are "narrow": a narrow block
/// overlapping `[start, end]` has `min >= start - NARROW_SPAN_NS`.
pub const NARROW_SPAN_NS: i64 = 24 * 3_600_000_000_000;

/// Blocks of one (tenant, signal), ordered by min time. Wide blocks (rare:
/// backfills, clock skew) are kept apart and checked one by one, so they
/// never widen the range scanned for the narrow ones.
#[derive(Clone, Debug, Default)]
struct Stream {
    narrow: BTreeSet<(i64, BlockId)>,
    wide: BTreeSet<(i64, BlockId)>,
}

impl Stream {
    fn set_for(&mut self, b: &BlockRecord) -> &mut BTreeSet<(i64, BlockId)> {
        if b.max_time_ns - b.min_time_ns > NARROW_SPAN_NS {
            &mut self.wide
        } else {
            &mut self.narrow
        }
    }
}

/// The whole catalog.
#[derive(Clone, Debug, Default)]
pub struct State {
    blocks: HashMap<BlockId, BlockRecord>,
    streams: BTreeMap<(TenantId, Signal), Stream>,
    watermarks: BTreeMap<(String, u32), u64>,
    ingesters: BTreeMap<String, IngesterLease>,
    leases: BTreeMap<String, Lease>,
    policies: BTreeMap<(PolicyKind, String), Policy>,
    counts: [u64; 3],
    /// Ids purged most recently (oldest first), so a retried purge succeeds
    /// and a retried publish cannot bring a purged block back.
    purged: VecDeque<BlockId>,
    purged_set: HashSet<BlockId>,
    /// Each ingester id's current epoch (see [`Command::Fence`]).
    epochs: BTreeMap<String, u64>,
    /// Publishes being staged: txn → (ingester, blocks).
    staged: BTreeMap<u128, StagedPublish>,
    /// What enforcing each policy did last ([`Command::SetPolicyStatus`]).
    policy_status: BTreeMap<(PolicyKind, String), String>,
    /// Offload targets compactors registered.
    offload_targets: BTreeSet<String>,
    /// Catalog members' registered data-directory incarnations
    /// ([`Command::RegisterMember`]).
    members: BTreeMap<u64, String>,
    /// The last reachability check registered of each target that has one
    /// ([`Command::RegisterOffloadTargetsV2`]).
    offload_target_checks: BTreeMap<String, TargetCheck>,
}

/// Blocks staged for one publish, not yet listed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedPublish {
    pub ingester_id: String,
    pub blocks: Vec<BlockRecord>,
}

/// Most blocks staged under one transaction.
pub const MAX_STAGED_BLOCKS: usize = 1_000_000;

/// Purged (and abandoned) ids remembered for retries and fencing.
pub const PURGED_MEMORY: usize = 100_000;

/// A lease expired for longer than this is removed by a later acquire
/// ([`Command::AcquireLeaseJob`]).
pub const LEASE_PRUNE_AFTER_NS: i64 = 3_600_000_000_000;
/// Most expired leases one acquire removes.
pub const LEASES_PRUNED_PER_ACQUIRE: usize = 64;

const NANOS_PER_HOUR: i64 = 3_600_000_000_000;

/// Where a paged block listing resumes: after this block, in the listing's
/// order (tenant, signal, min time, id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCursor {
    pub tenant: TenantId,
    pub signal: Signal,
    pub min_time_ns: i64,
    pub id: BlockId,
}

impl BlockCursor {
    fn of(b: &BlockRecord) -> BlockCursor {
        BlockCursor {
            tenant: b.tenant.clone(),
            signal: b.signal,
            min_time_ns: b.min_time_ns,
            id: b.id,
        }
    }
}

/// What [`State::query_blocks`] selects.
#[derive(Clone, Debug)]
pub struct BlockQuery<'a> {
    /// `None`: every tenant.
    pub tenant: Option<&'a TenantId>,
    /// `None`: every signal.
    pub signal: Option<Signal>,
    /// Blocks overlapping `[min_time_ns, max_time_ns]`.
    pub min_time_ns: i64,
    pub max_time_ns: i64,
    /// Only blocks of the hour partition starting here.
    pub partition_start_ns: Option<i64>,
    pub states: &'a [StateKind],
    /// Only blocks after this one.
    pub after: Option<&'a BlockCursor>,
    /// Most blocks returned (at least 1).
    pub limit: usize,
}

/// How [`State::acquire`] treats an existing lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseOp {
    /// Take the lease unless another holder's is unexpired; `prune`: also
    /// drop long-expired leases (only the commands that carry a job do, so
    /// older log entries replay as they did).
    Acquire { prune: bool },
    /// Extend the caller's own unexpired lease.
    Renew,
}

fn state_index(k: StateKind) -> usize {
    match k {
        StateKind::Live => 0,
        StateKind::Tombstoned => 1,
        StateKind::Offloaded => 2,
    }
}

fn not_found(ids: &[BlockId]) -> CommandError {
    let names: Vec<String> = ids.iter().take(10).map(BlockId::to_string).collect();
    let more = if ids.len() > 10 {
        format!(" and {} more", ids.len() - 10)
    } else {
        String::new()
    };
    CommandError::NotFound {
        what: format!("blocks {}{more}", names.join(", ")),
    }
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `cmd` whole, or returns why not and leaves the state as it was.
    pub fn apply(&mut self, cmd: &Command) -> Result<Applied, CommandError> {
        cmd.validate()?;
        match cmd {
            Command::Publish { blocks, watermark } => self.publish(blocks, watermark.as_ref()),
            Command::Replace {
                add,
                tombstone,
                now_ns,
                lease,
            } => self.replace(add, tombstone, *now_ns, lease.as_ref()),
            Command::Tombstone { ids, now_ns } => self.tombstone(ids, *now_ns),
            Command::Purge { ids } => self.purge(ids),
            Command::MarkOffloaded { id, location } => self.mark_offloaded(*id, location),
            Command::MarkRestored { id } => self.mark_restored(*id),
            Command::SetPolicy(p) => {
                let key = (p.kind, p.name.clone());
                if self.policies.get(&key) == Some(p) {
                    return Ok(Applied::default());
                }
                self.policies.insert(key, p.clone());
                Ok(Applied {
                    changes: vec![Change::PolicySet(p.clone())],
                    ..Default::default()
                })
            }
            // Deleting an absent policy succeeds: a retried delete must not fail.
            Command::DeletePolicy { kind, name } => {
                let key = (*kind, name.clone());
                self.policy_status.remove(&key);
                Ok(match self.policies.remove(&key) {
                    Some(p) => Applied {
                        changes: vec![Change::PolicyDeleted(p)],
                        ..Default::default()
                    },
                    None => Applied::default(),
                })
            }
            Command::AcquireLease {
                key,
                holder,
                now_ns,
                ttl_ms,
            } => self.acquire(key, holder, *now_ns, *ttl_ms, LeaseOp::Acquire { prune: false }, None),
            Command::RenewLease {
                key,
                holder,
                now_ns,
                ttl_ms,
            } => self.acquire(key, holder, *now_ns, *ttl_ms, LeaseOp::Renew, None),
            Command::ReleaseLease { key, holder } => match self.leases.get(key) {
                None => Ok(Applied::default()),
                Some(l) if &l.holder == holder => {
                    self.leases.remove(key);
                    Ok(Applied {
                        changes: vec![Change::LeaseReleased(key.clone())],
                        ..Default::default()
                    })
                }
                Some(l) => Err(CommandError::conflict(format!(
                    "lease {key:?} is held by {:?}, not {holder:?}",
                    l.holder
                ))),
            },
            Command::Heartbeat {
                ingester_id,
                address,
                now_ns,
                ttl_ms,
            } => {
                if *ttl_ms == 0 {
                    return Ok(match self.ingesters.remove(ingester_id) {
                        Some(mut l) => {
                            l.expires_at_ns = *now_ns;
                            Applied {
                                changes: vec![Change::Ingester(l)],
                                ..Default::default()
                            }
                        }
                        None => Applied::default(),
                    });
                }
                let lease = IngesterLease {
                    ingester_id: ingester_id.clone(),
                    address: address.clone(),
                    expires_at_ns: now_ns + ttl_ms * 1_000_000,
                };
                if let Some(old) = self.ingesters.get(ingester_id)
                    && old.expires_at_ns > lease.expires_at_ns
                    && old.address == lease.address
                {
                    // A delayed heartbeat never shortens a lease.
                    return Ok(Applied::default());
                }
                self.ingesters.insert(ingester_id.clone(), lease.clone());
                Ok(Applied {
                    changes: vec![Change::Ingester(lease)],
                    ..Default::default()
                })
            }
            Command::Fence { ingester_id } => {
                let epoch = self.epochs.get(ingester_id).copied().unwrap_or(0) + 1;
                self.epochs.insert(ingester_id.clone(), epoch);
                self.staged.retain(|_, st| &st.ingester_id != ingester_id);
                Ok(Applied {
                    epoch: Some(epoch),
                    ..Default::default()
                })
            }
            Command::Stage {
                ingester_id,
                epoch,
                txn,
                blocks,
            } => self.stage(ingester_id, *epoch, *txn, blocks),
            Command::FencedPublish {
                ingester_id,
                epoch,
                blocks,
                watermark,
                txn,
            } => self.fenced_publish(ingester_id, *epoch, blocks, watermark.as_ref(), *txn),
            Command::ReplaceV2 {
                add,
                tombstone,
                now_ns,
                lease_key,
                lease_holder,
                reason,
                dropped_rows,
            } => self.replace_v2(
                add,
                tombstone,
                *now_ns,
                (lease_key, lease_holder),
                *reason,
                *dropped_rows,
            ),
            Command::Abandon { ids } => self.abandon(ids),
            Command::MarkOffloadedV2 { items } => self.mark_offloaded_v2(items),
            Command::MarkPrimaryFreed {
                ids,
                now_ns,
                lease_key,
                lease_holder,
            } => {
                self.check_lease(lease_key, lease_holder, *now_ns)?;
                self.mark_primary_freed(ids)
            }
            Command::MarkRestoredV2 {
                ids,
                pin_until_ns,
                now_ns,
                lease_key,
                lease_holder,
            } => {
                self.check_lease(lease_key, lease_holder, *now_ns)?;
                self.mark_restored_v2(ids, *pin_until_ns)
            }
            Command::TombstoneV2 { ids, now_ns, .. } => self.tombstone_v2(ids, *now_ns),
            Command::SetPolicyStatus {
                kind,
                name,
                status_json,
            } => {
                let key = (*kind, name.clone());
                if !self.policies.contains_key(&key) {
                    return Err(CommandError::NotFound {
                        what: format!("{} policy {name:?}", kind.as_str()),
                    });
                }
                self.policy_status.insert(key, status_json.clone());
                Ok(Applied::default())
            }
            Command::RegisterOffloadTargets { names } => {
                self.offload_targets.extend(names.iter().cloned());
                Ok(Applied::default())
            }
            Command::RegisterMember {
                node_id,
                incarnation,
                replace,
            } => {
                if let Some(held) = self.members.get(node_id)
                    && held != incarnation
                    && !replace
                {
                    return Err(CommandError::conflict(format!(
                        "catalog member {node_id} is registered with data directory incarnation {held:?}, not {incarnation:?}: \
                         this member's data directory is not the one that joined the cluster"
                    )));
                }
                self.members.insert(*node_id, incarnation.clone());
                Ok(Applied::default())
            }
            Command::ForgetMember { node_id } => {
                self.members.remove(node_id);
                Ok(Applied::default())
            }
            Command::RegisterOffloadTargetsV2 { names, checks } => {
                self.offload_targets.extend(names.iter().cloned());
                for c in checks {
                    self.offload_target_checks.insert(c.name.clone(), c.clone());
                }
                Ok(Applied::default())
            }
            Command::MarkNoCompact { ids, reason } => self.mark_no_compact(ids, Some(reason)),
            Command::ClearNoCompact { ids } => self.mark_no_compact(ids, None),
            Command::AcquireLeaseJob {
                key,
                holder,
                now_ns,
                ttl_ms,
                job,
            } => self.acquire(
                key,
                holder,
                *now_ns,
                *ttl_ms,
                LeaseOp::Acquire { prune: true },
                job.as_deref(),
            ),
            Command::RenewLeaseJob {
                key,
                holder,
                now_ns,
                ttl_ms,
                job,
            } => self.acquire(key, holder, *now_ns, *ttl_ms, LeaseOp::Renew, job.as_deref()),
        }
    }

    fn check_epoch(&self, ingester_id: &str, epoch: u64) -> Result<(), CommandError> {
        let current = self.epochs.get(ingester_id).copied().unwrap_or(0);
        if epoch != current {
            return Err(CommandError::conflict(format!(
                "ingester {ingester_id:?} is fenced: epoch {epoch} is not its current epoch {current} (another process started under this id)"
            )));
        }
        Ok(())
    }

    fn stage(
        &mut self,
        ingester_id: &str,
        epoch: u64,
        txn: u128,
        blocks: &[BlockRecord],
    ) -> Result<Applied, CommandError> {
        self.check_epoch(ingester_id, epoch)?;
        let empty = StagedPublish {
            ingester_id: ingester_id.to_owned(),
            blocks: Vec::new(),
        };
        let current = self.staged.get(&txn).unwrap_or(&empty);
        if current.ingester_id != ingester_id {
            return Err(CommandError::conflict(format!(
                "staged publish {} belongs to ingester {:?}",
                BlockId::from_u128(txn),
                current.ingester_id
            )));
        }
        let mut fresh = Vec::new();
        for b in blocks {
            match self.blocks.get(&b.id) {
                // Published already: a publish retried after its commit's
                // answer was lost stages again what is live; nothing to do.
                Some(o) if o.same_publish(b) => continue,
                Some(_) => {
                    return Err(CommandError::AlreadyExists { id: b.id.to_string() });
                }
                None if self.purged_set.contains(&b.id) => {
                    return Err(CommandError::AlreadyExists { id: b.id.to_string() });
                }
                None => {}
            }
            match current.blocks.iter().find(|o| o.id == b.id) {
                Some(o) if o.same_publish(b) => {}
                Some(_) => {
                    return Err(CommandError::AlreadyExists { id: b.id.to_string() });
                }
                None => fresh.push(b.clone()),
            }
        }
        if current.blocks.len() + fresh.len() > MAX_STAGED_BLOCKS {
            return Err(CommandError::invalid(
                "blocks",
                format!("a staged publish holds at most {MAX_STAGED_BLOCKS} blocks"),
            ));
        }
        if !fresh.is_empty() {
            self.staged
                .entry(txn)
                .or_insert_with(|| empty.clone())
                .blocks
                .extend(fresh);
        }
        Ok(Applied::default())
    }

    fn fenced_publish(
        &mut self,
        ingester_id: &str,
        epoch: u64,
        blocks: &[BlockRecord],
        watermark: Option<&Watermark>,
        txn: Option<u128>,
    ) -> Result<Applied, CommandError> {
        self.check_epoch(ingester_id, epoch)?;
        let mut all: Vec<BlockRecord> = blocks.to_vec();
        if let Some(txn) = txn {
            match self.staged.get(&txn) {
                Some(st) if st.ingester_id == ingester_id => {
                    if let Some(b) = st.blocks.iter().find(|s| blocks.iter().any(|b| b.id == s.id)) {
                        return Err(CommandError::invalid(
                            "blocks",
                            format!("block {} is both staged and in the publish", b.id),
                        ));
                    }
                    all.extend(st.blocks.iter().cloned());
                }
                Some(st) => {
                    return Err(CommandError::conflict(format!(
                        "staged publish {} belongs to ingester {:?}",
                        BlockId::from_u128(txn),
                        st.ingester_id
                    )));
                }
                None => {
                    // Committed already (a retry whose first answer was
                    // lost) when the blocks of the last command and the
                    // watermark are in; otherwise a fence dropped the stage.
                    let done = !blocks.is_empty()
                        && blocks
                            .iter()
                            .all(|b| self.blocks.get(&b.id).is_some_and(|o| o.same_publish(b)))
                        && watermark.is_none_or(|w| {
                            self.watermarks.get(&(w.ingester_id.clone(), w.shard)).copied() >= Some(w.wal_seq)
                        });
                    if done {
                        return Ok(Applied::default());
                    }
                    return Err(CommandError::NotFound {
                        what: format!("staged publish {}", BlockId::from_u128(txn)),
                    });
                }
            }
        }
        let applied = self.publish(&all, watermark)?;
        if let Some(txn) = txn {
            self.staged.remove(&txn);
        }
        Ok(applied)
    }

    fn publish(&mut self, blocks: &[BlockRecord], watermark: Option<&Watermark>) -> Result<Applied, CommandError> {
        let mut fresh = Vec::with_capacity(blocks.len());
        for b in blocks {
            if self.purged_set.contains(&b.id) {
                return Err(CommandError::conflict(format!(
                    "block {} was purged; a purged id is never published again",
                    b.id
                )));
            }
            match self.blocks.get(&b.id) {
                Some(old) if old.same_publish(b) => {}
                Some(_) => {
                    return Err(CommandError::AlreadyExists { id: b.id.to_string() });
                }
                None => fresh.push(b),
            }
        }
        let mut changes = Vec::new();
        if let Some(w) = watermark {
            let key = (w.ingester_id.clone(), w.shard);
            let current = self.watermarks.get(&key).copied();
            match current {
                Some(c) if w.wal_seq < c => {
                    if !fresh.is_empty() {
                        return Err(CommandError::conflict(format!(
                            "watermark of ingester {:?} shard {} would go back from {c} to {}",
                            w.ingester_id, w.shard, w.wal_seq
                        )));
                    }
                    // A retried publish whose blocks are all in: nothing to do.
                }
                Some(c) if w.wal_seq == c => {}
                _ => {
                    self.watermarks.insert(key, w.wal_seq);
                    changes.push(Change::Watermark(w.clone()));
                }
            }
        }
        for b in fresh {
            self.insert_block(b.clone());
            changes.push(Change::Block(b.clone()));
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    fn replace(
        &mut self,
        add: &[BlockRecord],
        tombstone: &[BlockId],
        now_ns: i64,
        lease: Option<&(String, String)>,
    ) -> Result<Applied, CommandError> {
        if self.replace_applied(add, tombstone) {
            return Ok(Applied::default());
        }
        if let Some((key, holder)) = lease {
            self.check_lease(key, holder, now_ns)?;
        }
        self.check_live(tombstone)?;
        self.check_new(add)?;
        Ok(self.swap(add, tombstone, now_ns))
    }

    /// The compactor's replace: [`Self::replace`]'s rules, the lease
    /// required, plus one partition, conserved rows and no quarantined
    /// input, checked in that order.
    fn replace_v2(
        &mut self,
        add: &[BlockRecord],
        tombstone: &[BlockId],
        now_ns: i64,
        (lease_key, lease_holder): (&str, &str),
        reason: ReplaceReason,
        dropped_rows: u64,
    ) -> Result<Applied, CommandError> {
        if self.replace_applied(add, tombstone) {
            return Ok(Applied::default());
        }
        self.check_lease(lease_key, lease_holder, now_ns)?;
        self.check_live(tombstone)?;
        let inputs: Vec<&BlockRecord> = tombstone.iter().filter_map(|id| self.blocks.get(id)).collect();
        check_one_partition("tombstone", add.iter().chain(inputs.iter().copied()))?;
        let rows_in: u128 = inputs.iter().map(|b| u128::from(b.rows)).sum();
        let rows_out: u128 = add.iter().map(|b| u128::from(b.rows)).sum();
        if rows_in != rows_out + u128::from(dropped_rows) {
            return Err(CommandError::invalid(
                "dropped_rows",
                format!(
                    "rows do not balance in a {} replace: the tombstoned blocks hold {rows_in} rows, \
                     the added blocks {rows_out} plus {dropped_rows} dropped",
                    reason.as_str()
                ),
            ));
        }
        self.check_new(add)?;
        let quarantined: Vec<String> = inputs
            .iter()
            .filter_map(|b| b.no_compact.as_ref().map(|r| format!("{} ({r})", b.id)))
            .take(10)
            .collect();
        if !quarantined.is_empty() {
            return Err(CommandError::conflict(format!(
                "blocks quarantined from compaction: {}",
                quarantined.join(", ")
            )));
        }
        Ok(self.swap(add, tombstone, now_ns))
    }

    /// A replace applied already: every new block is in and every old one
    /// is gone from the live set.
    fn replace_applied(&self, add: &[BlockRecord], tombstone: &[BlockId]) -> bool {
        add.iter()
            .all(|b| self.blocks.get(&b.id).is_some_and(|o| o.same_publish(b)))
            && tombstone
                .iter()
                .all(|id| self.blocks.get(id).is_none_or(|o| o.state.kind() != StateKind::Live))
    }

    /// `holder` holds the lease `key` at `now_ns`.
    fn check_lease(&self, key: &str, holder: &str, now_ns: i64) -> Result<(), CommandError> {
        match self.leases.get(key) {
            Some(l) if l.holder == holder && l.expires_at_ns > now_ns => Ok(()),
            Some(l) if l.holder == holder => Err(CommandError::conflict(format!(
                "lease {key:?} expired at {}",
                l.expires_at_ns
            ))),
            Some(l) => Err(CommandError::conflict(format!(
                "lease {key:?} is held by {:?}, not {holder:?}",
                l.holder
            ))),
            None => Err(CommandError::conflict(format!("lease {key:?} is not held"))),
        }
    }

    /// Every block to replace exists and is live.
    fn check_live(&self, tombstone: &[BlockId]) -> Result<(), CommandError> {
        let missing: Vec<BlockId> = tombstone
            .iter()
            .copied()
            .filter(|id| !self.blocks.contains_key(id))
            .collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        let not_live: Vec<String> = tombstone
            .iter()
            .filter(|id| self.blocks.get(id).is_some_and(|b| b.state.kind() != StateKind::Live))
            .take(10)
            .map(BlockId::to_string)
            .collect();
        if !not_live.is_empty() {
            return Err(CommandError::conflict(format!(
                "blocks to replace are no longer live: {}",
                not_live.join(", ")
            )));
        }
        Ok(())
    }

    /// No block to add is known, or was purged or abandoned.
    fn check_new(&self, add: &[BlockRecord]) -> Result<(), CommandError> {
        if let Some(b) = add.iter().find(|b| self.blocks.contains_key(&b.id)) {
            return Err(CommandError::AlreadyExists { id: b.id.to_string() });
        }
        if let Some(b) = add.iter().find(|b| self.purged_set.contains(&b.id)) {
            return Err(CommandError::conflict(format!(
                "block {} was purged or abandoned; its id is never added again",
                b.id
            )));
        }
        Ok(())
    }

    /// Adds `add` and tombstones `tombstone` (all checked).
    fn swap(&mut self, add: &[BlockRecord], tombstone: &[BlockId], now_ns: i64) -> Applied {
        let mut changes = Vec::with_capacity(add.len() + tombstone.len());
        for b in add {
            self.insert_block(b.clone());
            changes.push(Change::Block(b.clone()));
        }
        for id in tombstone {
            changes.push(Change::Block(
                self.set_state(*id, BlockState::Tombstoned { at_ns: now_ns }),
            ));
        }
        Applied {
            changes,
            ..Default::default()
        }
    }

    /// Fences unknown ids into the purged set; an id the catalog holds
    /// rejects the whole command.
    fn abandon(&mut self, ids: &[BlockId]) -> Result<Applied, CommandError> {
        let known: Vec<String> = ids
            .iter()
            .filter(|id| self.blocks.contains_key(id))
            .take(10)
            .map(BlockId::to_string)
            .collect();
        if !known.is_empty() {
            return Err(CommandError::conflict(format!(
                "blocks {} are in the catalog; only unknown ids are abandoned",
                known.join(", ")
            )));
        }
        for id in ids {
            self.remember_purged(*id);
        }
        Ok(Applied::default())
    }

    /// Sets (`Some`) or clears (`None`) the quarantine mark of `ids`. A
    /// purged id counts as cleared; an id never known is not found.
    fn mark_no_compact(&mut self, ids: &[BlockId], reason: Option<&String>) -> Result<Applied, CommandError> {
        let missing: Vec<BlockId> = ids
            .iter()
            .copied()
            .filter(|id| !self.blocks.contains_key(id) && (reason.is_some() || !self.purged_set.contains(id)))
            .collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        let mut changes = Vec::new();
        for id in ids {
            if let Some(b) = self.blocks.get_mut(id)
                && b.no_compact.as_ref() != reason
            {
                b.no_compact = reason.cloned();
                changes.push(Change::Block(b.clone()));
            }
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    fn tombstone(&mut self, ids: &[BlockId], now_ns: i64) -> Result<Applied, CommandError> {
        let missing: Vec<BlockId> = ids.iter().copied().filter(|id| !self.blocks.contains_key(id)).collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        let mut changes = Vec::new();
        for id in ids {
            if self
                .blocks
                .get(id)
                .is_some_and(|b| b.state.kind() != StateKind::Tombstoned)
            {
                changes.push(Change::Block(
                    self.set_state(*id, BlockState::Tombstoned { at_ns: now_ns }),
                ));
            }
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    fn purge(&mut self, ids: &[BlockId]) -> Result<Applied, CommandError> {
        // Already purged (a retry) counts as done; never known is an error.
        let missing: Vec<BlockId> = ids
            .iter()
            .copied()
            .filter(|id| !self.blocks.contains_key(id) && !self.purged_set.contains(id))
            .collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        if let Some(id) = ids.iter().find(|id| {
            self.blocks
                .get(id)
                .is_some_and(|b| b.state.kind() != StateKind::Tombstoned)
        }) {
            return Err(CommandError::conflict(format!(
                "block {id} is not tombstoned; only tombstoned blocks are purged"
            )));
        }
        let mut changes = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(b) = self.blocks.remove(id) {
                self.counts[state_index(b.state.kind())] -= 1;
                if let Some(s) = self.streams.get_mut(&(b.tenant.clone(), b.signal)) {
                    s.set_for(&b).remove(&(b.min_time_ns, b.id));
                }
                self.remember_purged(*id);
                changes.push(Change::Purged(*id));
            }
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    fn mark_offloaded(&mut self, id: BlockId, location: &str) -> Result<Applied, CommandError> {
        let Some(b) = self.blocks.get(&id) else {
            return Err(not_found(&[id]));
        };
        match &b.state {
            BlockState::Offloaded { location: l } if l == location => Ok(Applied::default()),
            BlockState::Live => Ok(Applied {
                changes: vec![Change::Block(self.set_state(
                    id,
                    BlockState::Offloaded {
                        location: location.to_owned(),
                    },
                ))],
                ..Default::default()
            }),
            other => Err(CommandError::conflict(format!(
                "block {id} is {}, only live blocks are offloaded",
                other.kind().as_str()
            ))),
        }
    }

    /// Every item live and unpinned at its `at_ns` (or offloaded already
    /// with the same copy: a retry) becomes offloaded, whole or nothing.
    fn mark_offloaded_v2(&mut self, items: &[crate::model::OffloadItem]) -> Result<Applied, CommandError> {
        let missing: Vec<BlockId> = items
            .iter()
            .map(|i| i.id)
            .filter(|id| !self.blocks.contains_key(id))
            .collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        let mut todo = Vec::new();
        for i in items {
            let Some(b) = self.blocks.get(&i.id) else {
                unreachable_block(i.id)
            };
            let same_copy = b
                .offload
                .as_ref()
                .is_some_and(|c| c.location == i.location && c.sha256 == i.sha256);
            match &b.state {
                BlockState::Offloaded { .. } if same_copy => {}
                BlockState::Live => {
                    if let Some(c) = b.offload.as_ref().filter(|c| c.pinned_until_ns > i.at_ns) {
                        return Err(CommandError::conflict(format!(
                            "block {} is pinned by a restore until {}",
                            i.id, c.pinned_until_ns
                        )));
                    }
                    todo.push(i);
                }
                other => {
                    return Err(CommandError::conflict(format!(
                        "block {} is {}, only live blocks are offloaded",
                        i.id,
                        other.kind().as_str()
                    )));
                }
            }
        }
        let mut changes = Vec::with_capacity(todo.len());
        for i in todo {
            self.set_state(
                i.id,
                BlockState::Offloaded {
                    location: i.location.clone(),
                },
            );
            let Some(b) = self.blocks.get_mut(&i.id) else {
                unreachable_block(i.id)
            };
            b.offload = Some(OffloadCopy {
                location: i.location.clone(),
                sha256: i.sha256.clone(),
                at_ns: i.at_ns,
                primary_freed: false,
                pinned_until_ns: 0,
            });
            changes.push(Change::Block(b.clone()));
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    /// Offloaded blocks of one partition lose their primary object.
    fn mark_primary_freed(&mut self, ids: &[BlockId]) -> Result<Applied, CommandError> {
        let blocks = self.known(ids)?;
        check_one_partition("ids", blocks.iter().copied())?;
        if let Some(b) = blocks.iter().find(|b| b.state.kind() != StateKind::Offloaded) {
            return Err(CommandError::conflict(format!(
                "block {} is {}, only an offloaded block's primary object is freed",
                b.id,
                b.state.kind().as_str()
            )));
        }
        let mut changes = Vec::new();
        for id in ids {
            if let Some(b) = self.blocks.get_mut(id)
                && let Some(c) = b.offload.as_mut()
                && !c.primary_freed
            {
                c.primary_freed = true;
                changes.push(Change::Block(b.clone()));
            }
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    /// Offloaded blocks of one partition are live again and pinned; live
    /// ones get the longer pin.
    fn mark_restored_v2(&mut self, ids: &[BlockId], pin_until_ns: i64) -> Result<Applied, CommandError> {
        let blocks = self.known(ids)?;
        check_one_partition("ids", blocks.iter().copied())?;
        if let Some(b) = blocks.iter().find(|b| b.state.kind() == StateKind::Tombstoned) {
            return Err(CommandError::conflict(format!(
                "block {} is tombstoned, not offloaded",
                b.id
            )));
        }
        let mut changes = Vec::new();
        for id in ids {
            if self
                .blocks
                .get(id)
                .is_some_and(|b| b.state.kind() == StateKind::Offloaded)
            {
                self.set_state(*id, BlockState::Live);
            }
            let Some(b) = self.blocks.get_mut(id) else {
                unreachable_block(*id)
            };
            let before = b.clone();
            let copy = b.offload.get_or_insert_with(OffloadCopy::default);
            copy.primary_freed = false;
            copy.pinned_until_ns = copy.pinned_until_ns.max(pin_until_ns);
            if *b != before {
                changes.push(Change::Block(b.clone()));
            }
        }
        Ok(Applied {
            changes,
            ..Default::default()
        })
    }

    /// Live and offloaded blocks are tombstoned (offload copies kept for
    /// GC); already tombstoned ones are a no-op; a pinned one refuses all.
    fn tombstone_v2(&mut self, ids: &[BlockId], now_ns: i64) -> Result<Applied, CommandError> {
        let blocks = self.known(ids)?;
        if let Some(b) = blocks.iter().find(|b| {
            b.state.kind() != StateKind::Tombstoned && b.offload.as_ref().is_some_and(|c| c.pinned_until_ns > now_ns)
        }) {
            return Err(CommandError::conflict(format!(
                "block {} is pinned by a restore until {}",
                b.id,
                b.offload.as_ref().map_or(0, |c| c.pinned_until_ns)
            )));
        }
        self.tombstone(ids, now_ns)
    }

    /// The records of `ids`, or which of them the catalog does not hold.
    fn known(&self, ids: &[BlockId]) -> Result<Vec<&BlockRecord>, CommandError> {
        let missing: Vec<BlockId> = ids.iter().copied().filter(|id| !self.blocks.contains_key(id)).collect();
        if !missing.is_empty() {
            return Err(not_found(&missing));
        }
        Ok(ids.iter().filter_map(|id| self.blocks.get(id)).collect())
    }

    fn mark_restored(&mut self, id: BlockId) -> Result<Applied, CommandError> {
        let Some(b) = self.blocks.get(&id) else {
            return Err(not_found(&[id]));
        };
        match b.state.kind() {
            StateKind::Live => Ok(Applied::default()),
            StateKind::Offloaded => Ok(Applied {
                changes: vec![Change::Block(self.set_state(id, BlockState::Live))],
                ..Default::default()
            }),
            StateKind::Tombstoned => Err(CommandError::conflict(format!(
                "block {id} is tombstoned, not offloaded"
            ))),
        }
    }

    /// Acquires or renews a lease. `job`: `Some` sets the manifest; `None`
    /// keeps the holder's own (a lease taken from another holder starts
    /// without one).
    fn acquire(
        &mut self,
        key: &str,
        holder: &str,
        now_ns: i64,
        ttl_ms: i64,
        op: LeaseOp,
        job: Option<&str>,
    ) -> Result<Applied, CommandError> {
        let current = self.leases.get(key);
        if let Some(l) = current
            && l.holder != holder
            && l.expires_at_ns > now_ns
        {
            return Err(CommandError::conflict(format!(
                "lease {key:?} is held by {:?} until {}",
                l.holder, l.expires_at_ns
            )));
        }
        // The caller's own unexpired lease: renewing never shortens it.
        let own = current.filter(|l| l.holder == holder && l.expires_at_ns > now_ns);
        if op == LeaseOp::Renew && own.is_none() {
            return Err(match current {
                Some(l) if l.holder == holder => {
                    CommandError::conflict(format!("lease {key:?} expired at {}", l.expires_at_ns))
                }
                _ => CommandError::conflict(format!("lease {key:?} is not held by {holder:?}")),
            });
        }
        let job = match job {
            Some(j) => j.to_owned(),
            None => current
                .filter(|l| l.holder == holder)
                .map_or_else(String::new, |l| l.job.clone()),
        };
        let lease = Lease {
            key: key.to_owned(),
            holder: holder.to_owned(),
            expires_at_ns: (now_ns + ttl_ms * 1_000_000).max(own.map_or(0, |l| l.expires_at_ns)),
            job,
        };
        let mut changes = Vec::new();
        if current != Some(&lease) {
            changes.push(Change::LeaseSet(lease.clone()));
        }
        self.leases.insert(key.to_owned(), lease.clone());
        if op == (LeaseOp::Acquire { prune: true }) {
            self.prune_leases(key, now_ns, &mut changes);
        }
        Ok(Applied {
            changes,
            lease: Some(lease),
            epoch: None,
        })
    }

    /// Removes up to [`LEASES_PRUNED_PER_ACQUIRE`] leases (other than
    /// `keep`) that expired over [`LEASE_PRUNE_AFTER_NS`] before `now_ns`,
    /// in key order, so every member removes the same ones.
    fn prune_leases(&mut self, keep: &str, now_ns: i64, changes: &mut Vec<Change>) {
        let cutoff = now_ns.saturating_sub(LEASE_PRUNE_AFTER_NS);
        let stale: Vec<String> = self
            .leases
            .values()
            .filter(|l| l.key != keep && l.expires_at_ns < cutoff)
            .take(LEASES_PRUNED_PER_ACQUIRE)
            .map(|l| l.key.clone())
            .collect();
        for key in stale {
            self.leases.remove(&key);
            changes.push(Change::LeaseReleased(key));
        }
    }

    fn remember_purged(&mut self, id: BlockId) {
        if self.purged_set.insert(id) {
            self.purged.push_back(id);
            if self.purged.len() > PURGED_MEMORY
                && let Some(old) = self.purged.pop_front()
            {
                self.purged_set.remove(&old);
            }
        }
    }

    fn insert_block(&mut self, b: BlockRecord) {
        let stream = self.streams.entry((b.tenant.clone(), b.signal)).or_default();
        stream.set_for(&b).insert((b.min_time_ns, b.id));
        self.counts[state_index(b.state.kind())] += 1;
        self.blocks.insert(b.id, b);
    }

    /// Sets a known block's state and returns the updated row.
    fn set_state(&mut self, id: BlockId, state: BlockState) -> BlockRecord {
        let Some(b) = self.blocks.get_mut(&id) else {
            unreachable_block(id)
        };
        self.counts[state_index(b.state.kind())] -= 1;
        self.counts[state_index(state.kind())] += 1;
        b.state = state;
        b.clone()
    }

    // ---- reads ----

    /// Blocks of `tenant`/`signal` overlapping `[min, max]` whose state is
    /// in `states`, ordered by min time then id.
    pub fn list_blocks(
        &self,
        tenant: &TenantId,
        signal: Signal,
        min: i64,
        max: i64,
        states: &[StateKind],
    ) -> Vec<&BlockRecord> {
        self.query_blocks(&BlockQuery {
            tenant: Some(tenant),
            signal: Some(signal),
            min_time_ns: min,
            max_time_ns: max,
            partition_start_ns: None,
            states,
            after: None,
            limit: usize::MAX,
        })
        .0
    }

    /// Up to `q.limit` blocks `q` selects, ordered by tenant, signal, min
    /// time and id, and where to resume when more may follow.
    pub fn query_blocks(&self, q: &BlockQuery<'_>) -> (Vec<&BlockRecord>, Option<BlockCursor>) {
        let want = q.limit.max(1).saturating_add(1);
        let mut out = Vec::new();
        let streams: Box<dyn Iterator<Item = (&(TenantId, Signal), &Stream)>> = match (q.tenant, q.signal) {
            (Some(t), Some(s)) => Box::new(self.streams.get_key_value(&(t.clone(), s)).into_iter()),
            _ => Box::new(
                self.streams
                    .iter()
                    .filter(|((t, s), _)| q.tenant.is_none_or(|w| w == t) && q.signal.is_none_or(|w| w == *s)),
            ),
        };
        for ((tenant, signal), stream) in streams {
            let after = match q.after {
                None => None,
                Some(c) => match (tenant, *signal).cmp(&(&c.tenant, c.signal)) {
                    std::cmp::Ordering::Less => continue,
                    std::cmp::Ordering::Equal => Some((c.min_time_ns, c.id)),
                    std::cmp::Ordering::Greater => None,
                },
            };
            self.stream_blocks(stream, q, after, want, &mut out);
            if out.len() >= want {
                break;
            }
        }
        if out.len() > q.limit {
            out.truncate(q.limit.max(1));
            let next = out.last().map(|b| BlockCursor::of(b));
            return (out, next);
        }
        (out, None)
    }

    /// Appends the blocks of one stream `q` selects (after `after`, in
    /// (min time, id) order) to `out`, until it holds `want`.
    fn stream_blocks<'s>(
        &'s self,
        stream: &'s Stream,
        q: &BlockQuery<'_>,
        after: Option<(i64, BlockId)>,
        want: usize,
        out: &mut Vec<&'s BlockRecord>,
    ) {
        let (first, last) = (BlockId::from_u128(0), BlockId::from_u128(u128::MAX));
        // Min times that can overlap [min, max]: any for a wide block, at
        // most a narrow span before `min` for a narrow one; a partition
        // pins them to its hour.
        let mut hi = q.max_time_ns;
        let mut narrow_lo = q.min_time_ns.saturating_sub(NARROW_SPAN_NS);
        let mut wide_lo = i64::MIN;
        if let Some(p) = q.partition_start_ns {
            hi = hi.min(p.saturating_add(NANOS_PER_HOUR - 1));
            narrow_lo = narrow_lo.max(p);
            wide_lo = p;
        }
        let range = |set: &'s BTreeSet<(i64, BlockId)>, lo: i64| {
            let start = match after {
                Some(a) if a >= (lo, first) => Bound::Excluded(a),
                _ => Bound::Included((lo, first)),
            };
            let empty = match start {
                Bound::Excluded(a) | Bound::Included(a) => a > (hi, last),
                Bound::Unbounded => false,
            };
            let iter = (!empty).then(|| set.range((start, Bound::Included((hi, last)))));
            iter.into_iter().flatten().peekable()
        };
        let (mut narrow, mut wide) = (range(&stream.narrow, narrow_lo), range(&stream.wide, wide_lo));
        while out.len() < want {
            let next = match (narrow.peek(), wide.peek()) {
                (Some(n), Some(w)) if n <= w => narrow.next(),
                (_, Some(_)) => wide.next(),
                (Some(_), None) => narrow.next(),
                (None, None) => break,
            };
            let Some(b) = next.and_then(|(_, id)| self.blocks.get(id)) else {
                continue;
            };
            if b.max_time_ns >= q.min_time_ns && q.states.contains(&b.state.kind()) {
                out.push(b);
            }
        }
    }

    pub fn block(&self, id: BlockId) -> Option<&BlockRecord> {
        self.blocks.get(&id)
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks per state (live, tombstoned, offloaded).
    pub fn counts(&self) -> [(StateKind, u64); 3] {
        StateKind::ALL.map(|k| (k, self.counts[state_index(k)]))
    }

    pub fn watermarks(&self, ingester: Option<&str>) -> Vec<Watermark> {
        self.watermarks
            .iter()
            .filter(|((i, _), _)| ingester.is_none_or(|want| want == i))
            .map(|((i, s), seq)| Watermark {
                ingester_id: i.clone(),
                shard: *s,
                wal_seq: *seq,
            })
            .collect()
    }

    /// Every registered ingester, its lease lapsed or not (only a clean
    /// shutdown deregisters one).
    pub fn registered_ingesters(&self) -> Vec<IngesterLease> {
        self.ingesters.values().cloned().collect()
    }

    /// The current epoch of an ingester id (0: never fenced).
    pub fn epoch(&self, ingester_id: &str) -> u64 {
        self.epochs.get(ingester_id).copied().unwrap_or(0)
    }

    /// Blocks staged under `txn`.
    pub fn staged(&self, txn: u128) -> Option<&StagedPublish> {
        self.staged.get(&txn)
    }

    /// Ingesters whose lease runs past `now_ns`.
    pub fn live_ingesters(&self, now_ns: i64) -> Vec<IngesterLease> {
        self.ingesters
            .values()
            .filter(|l| l.expires_at_ns > now_ns)
            .cloned()
            .collect()
    }

    pub fn leases(&self) -> Vec<Lease> {
        self.leases.values().cloned().collect()
    }

    /// What enforcing a policy did last, if reported.
    pub fn policy_status(&self, kind: PolicyKind, name: &str) -> Option<&str> {
        self.policy_status.get(&(kind, name.to_owned())).map(String::as_str)
    }

    /// Registered offload target names, sorted.
    pub fn offload_targets(&self) -> Vec<String> {
        self.offload_targets.iter().cloned().collect()
    }

    /// The last reachability check of each target that has one, by name.
    pub fn offload_target_checks(&self) -> Vec<TargetCheck> {
        self.offload_target_checks.values().cloned().collect()
    }

    pub fn policies(&self, kind: Option<PolicyKind>) -> Vec<Policy> {
        self.policies
            .values()
            .filter(|p| kind.is_none_or(|k| p.kind == k))
            .cloned()
            .collect()
    }

    /// Every record, as the changes that rebuild this state from empty.
    pub fn as_changes(&self) -> Vec<Change> {
        let mut blocks: Vec<&BlockRecord> = self.blocks.values().collect();
        blocks.sort_unstable_by_key(|b| b.id);
        let mut out = Vec::new();
        out.extend(blocks.into_iter().cloned().map(Change::Block));
        out.extend(self.watermarks(None).into_iter().map(Change::Watermark));
        out.extend(self.ingesters.values().cloned().map(Change::Ingester));
        out.extend(self.leases().into_iter().map(Change::LeaseSet));
        out.extend(self.policies(None).into_iter().map(Change::PolicySet));
        out
    }

    pub fn to_image(&self) -> StateImage {
        let mut blocks: Vec<BlockRecord> = self.blocks.values().cloned().collect();
        blocks.sort_unstable_by_key(|b| b.id);
        let no_compact = blocks
            .iter_mut()
            .filter_map(|b| b.no_compact.take().map(|reason| NoCompactMark { id: b.id, reason }))
            .collect();
        let offload = blocks
            .iter_mut()
            .filter_map(|b| b.offload.take().map(|copy| OffloadMark { id: b.id, copy }))
            .collect();
        StateImage {
            blocks,
            watermarks: self.watermarks(None),
            ingesters: self.ingesters.values().cloned().collect(),
            leases: self.leases(),
            policies: self.policies(None),
            purged: self.purged.iter().copied().collect(),
            epochs: self.epochs.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            staged: self.staged.iter().map(|(k, v)| (*k, v.clone())).collect(),
            no_compact,
            ext: StateImageExt {
                offload,
                policy_status: self
                    .policy_status
                    .iter()
                    .map(|((k, n), v)| (*k, n.clone(), v.clone()))
                    .collect(),
                offload_targets: self.offload_targets.iter().cloned().collect(),
            },
            members: self.members.iter().map(|(k, v)| (*k, v.clone())).collect(),
            ext2: StateImageExt2 {
                offload_target_checks: self.offload_target_checks(),
            },
        }
    }

    pub fn from_image(image: StateImage) -> State {
        let mut s = State::new();
        for b in image.blocks {
            s.insert_block(b);
        }
        for w in image.watermarks {
            s.watermarks.insert((w.ingester_id, w.shard), w.wal_seq);
        }
        for i in image.ingesters {
            s.ingesters.insert(i.ingester_id.clone(), i);
        }
        for l in image.leases {
            s.leases.insert(l.key.clone(), l);
        }
        for p in image.policies {
            s.policies.insert((p.kind, p.name.clone()), p);
        }
        for id in image.purged {
            s.remember_purged(id);
        }
        s.epochs = image.epochs.into_iter().collect();
        s.staged = image.staged.into_iter().collect();
        for m in image.no_compact {
            if let Some(b) = s.blocks.get_mut(&m.id) {
                b.no_compact = Some(m.reason);
            }
        }
        for m in image.ext.offload {
            if let Some(b) = s.blocks.get_mut(&m.id) {
                b.offload = Some(m.copy);
            }
        }
        s.policy_status = image
            .ext
            .policy_status
            .into_iter()
            .map(|(k, n, v)| ((k, n), v))
            .collect();
        s.offload_targets = image.ext.offload_targets.into_iter().collect();
        s.members = image.members.into_iter().collect();
        s.offload_target_checks = (image.ext2.offload_target_checks.into_iter())
            .map(|c| (c.name.clone(), c))
            .collect();
        s
    }

    /// Registered catalog members: id → data-directory incarnation.
    pub fn members(&self) -> &BTreeMap<u64, String> {
        &self.members
    }
}

#[cold]
fn unreachable_block(id: BlockId) -> ! {
    // Callers check presence first; reaching this is a bug in this module.
    panic!("catalog state: block {id} vanished during a command")
}

#[cfg(test)]
mod tests;
