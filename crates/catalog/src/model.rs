//! The catalog's records and commands and their validation; how their ids
//! are persisted ([`stored`]). The mapping to and from the gRPC messages
//! is in [`crate::pb_impl`].
//!
//! Validation here is stateless (a well-formed command); the state machine
//! adds the checks that depend on the current state. Both run on every
//! member, so a command is accepted or rejected identically everywhere.

pub mod stored;

use mira_core::block::path::parse_block_path;
use mira_core::ids::{BlockId, Signal, TenantId};
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::error::CommandError;

/// Most blocks one command may carry.
pub const MAX_BLOCKS_PER_COMMAND: usize = 10_000;
/// Largest policy body, bytes of JSON.
pub const MAX_POLICY_BYTES: usize = 64 * 1024;
/// Longest key, holder, ingester id, address, name or location.
pub const MAX_NAME_LEN: usize = 512;
/// Longest lease.
pub const MAX_TTL_MS: i64 = 24 * 3600 * 1000;
/// Largest lease job manifest, bytes.
pub const MAX_JOB_BYTES: usize = 16 * 1024;
/// Longest quarantine reason, bytes.
pub const MAX_REASON_LEN: usize = 1024;
const NANOS_PER_HOUR: i64 = 3_600_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Level {
    Hot,
    Cold,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockState {
    Live,
    Tombstoned { at_ns: i64 },
    Offloaded { location: String },
}

impl BlockState {
    pub fn kind(&self) -> StateKind {
        match self {
            BlockState::Live => StateKind::Live,
            BlockState::Tombstoned { .. } => StateKind::Tombstoned,
            BlockState::Offloaded { .. } => StateKind::Offloaded,
        }
    }
}

/// A block state without its payload, for filtering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StateKind {
    Live,
    Tombstoned,
    Offloaded,
}

impl StateKind {
    pub const ALL: [StateKind; 3] = [StateKind::Live, StateKind::Tombstoned, StateKind::Offloaded];

    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Live => "live",
            StateKind::Tombstoned => "tombstoned",
            StateKind::Offloaded => "offloaded",
        }
    }
}

/// One block as the catalog knows it. Persisted in the Raft log and in
/// snapshots: fields are only ever appended, and the ids keep their
/// [`stored`] forms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRecord {
    #[serde(with = "stored::block_id")]
    pub id: BlockId,
    #[serde(with = "stored::tenant")]
    pub tenant: TenantId,
    #[serde(with = "stored::signal")]
    pub signal: Signal,
    pub partition_start_ns: i64,
    pub min_time_ns: i64,
    pub max_time_ns: i64,
    pub rows: u64,
    pub bytes: u64,
    pub level: Level,
    pub object_key: String,
    pub created_at_ns: i64,
    pub state: BlockState,
    /// Why the block is quarantined from compaction
    /// ([`Command::MarkNoCompact`]). Not part of the record's persisted
    /// form (so never in a log entry): a snapshot keeps the marks beside
    /// the blocks (`StateImage::no_compact`).
    #[serde(skip)]
    pub no_compact: Option<String>,
    /// The block's copy in an offload target, when it has one: an
    /// `Offloaded` block's, kept after a restore (so re-offloading costs
    /// nothing) and after a tombstone (so GC deletes it too). Not part of
    /// the record's persisted form; a snapshot keeps it beside the blocks
    /// (`StateImageExt::offload`).
    #[serde(skip)]
    pub offload: Option<OffloadCopy>,
}

/// A block's copy in an offload target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadCopy {
    /// The copy's full URL (`{target URL}/{object key}`).
    pub location: String,
    /// SHA-256 of the object, lowercase hex; empty for copies marked
    /// before hashes were recorded ([`Command::MarkOffloaded`]).
    pub sha256: String,
    /// When the copy was marked.
    pub at_ns: i64,
    /// The primary object was deleted ([`Command::MarkPrimaryFreed`]);
    /// false again once restored.
    pub primary_freed: bool,
    /// A restored block is neither offloaded nor dropped by retention
    /// before this time ([`Command::MarkRestoredV2`]).
    pub pinned_until_ns: i64,
}

impl BlockRecord {
    /// The partition the block belongs to: (tenant, signal, hour start).
    pub fn partition(&self) -> (&TenantId, Signal, i64) {
        (&self.tenant, self.signal, self.partition_start_ns)
    }

    /// Same block as published (everything but the lifecycle state), so a
    /// retried publish is recognised after a compaction tombstoned it.
    pub fn same_publish(&self, other: &BlockRecord) -> bool {
        self.id == other.id
            && self.tenant == other.tenant
            && self.signal == other.signal
            && self.partition_start_ns == other.partition_start_ns
            && self.min_time_ns == other.min_time_ns
            && self.max_time_ns == other.max_time_ns
            && self.rows == other.rows
            && self.bytes == other.bytes
            && self.level == other.level
            && self.object_key == other.object_key
            && self.created_at_ns == other.created_at_ns
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    pub ingester_id: String,
    pub shard: u32,
    pub wal_seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngesterLease {
    pub ingester_id: String,
    pub address: String,
    pub expires_at_ns: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub key: String,
    pub holder: String,
    pub expires_at_ns: i64,
    /// The holder's job manifest, opaque to the catalog; empty: none.
    pub job: String,
}

/// Why a [`Command::ReplaceV2`] rewrote its blocks. Persisted in the Raft
/// log: variants are only ever appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplaceReason {
    /// Hot blocks merged into a larger hot block.
    Merge,
    /// A partition rewritten into cold blocks.
    Cold,
    /// Rows past their retention removed; the only reason that drops rows.
    RetentionRewrite,
}

impl ReplaceReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplaceReason::Merge => "merge",
            ReplaceReason::Cold => "cold",
            ReplaceReason::RetentionRewrite => "retention_rewrite",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyKind {
    Retention,
    Offload,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Retention => "retention",
            PolicyKind::Offload => "offload",
        }
    }

    /// The same kind in `mira_core::policy`, which validates bodies.
    pub fn to_core(self) -> mira_core::policy::PolicyKind {
        match self {
            PolicyKind::Retention => mira_core::policy::PolicyKind::Retention,
            PolicyKind::Offload => mira_core::policy::PolicyKind::Offload,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub kind: PolicyKind,
    pub name: String,
    /// Empty: every tenant.
    pub tenant: String,
    pub body_json: String,
}

/// A replicated command. Each is applied whole or not at all. Persisted in
/// the Raft log: variants and fields are only ever appended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Publish {
        blocks: Vec<BlockRecord>,
        watermark: Option<Watermark>,
    },
    Replace {
        add: Vec<BlockRecord>,
        #[serde(with = "stored::block_ids")]
        tombstone: Vec<BlockId>,
        now_ns: i64,
        lease: Option<(String, String)>,
    },
    Tombstone {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
        now_ns: i64,
    },
    Purge {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
    },
    MarkOffloaded {
        #[serde(with = "stored::block_id")]
        id: BlockId,
        location: String,
    },
    MarkRestored {
        #[serde(with = "stored::block_id")]
        id: BlockId,
    },
    SetPolicy(Policy),
    DeletePolicy {
        kind: PolicyKind,
        name: String,
    },
    AcquireLease {
        key: String,
        holder: String,
        now_ns: i64,
        ttl_ms: i64,
    },
    RenewLease {
        key: String,
        holder: String,
        now_ns: i64,
        ttl_ms: i64,
    },
    ReleaseLease {
        key: String,
        holder: String,
    },
    /// Registers or renews an ingester; `ttl_ms == 0` deregisters it.
    Heartbeat {
        ingester_id: String,
        address: String,
        now_ns: i64,
        ttl_ms: i64,
    },
    // Variants below were added after the first release: new variants go
    // at the end so entries already in a Raft log decode as they were.
    /// Takes the next epoch of an ingester id and drops its staged publishes.
    Fence {
        ingester_id: String,
    },
    /// Holds blocks of a publish too large for one command under `txn`.
    Stage {
        ingester_id: String,
        epoch: u64,
        txn: u128,
        blocks: Vec<BlockRecord>,
    },
    /// An ingester's publish, refused unless `epoch` is current: `blocks`
    /// and everything staged under `txn` become live with the watermark.
    FencedPublish {
        ingester_id: String,
        epoch: u64,
        blocks: Vec<BlockRecord>,
        watermark: Option<Watermark>,
        txn: Option<u128>,
    },
    /// The compactor's swap (see [`Command::validate`] and
    /// `State::apply`): like `Replace`, plus a required lease, one
    /// partition, conserved rows, never-seen outputs and unquarantined
    /// inputs.
    ReplaceV2 {
        add: Vec<BlockRecord>,
        #[serde(with = "stored::block_ids")]
        tombstone: Vec<BlockId>,
        now_ns: i64,
        lease_key: String,
        lease_holder: String,
        reason: ReplaceReason,
        /// Rows of `tombstone` not carried into `add` (retention only).
        dropped_rows: u64,
    },
    /// Fences ids the catalog does not hold into the purged set, so a late
    /// publish or replace of them is refused.
    Abandon {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
    },
    /// Quarantines blocks from compaction; they stay queryable.
    MarkNoCompact {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
        reason: String,
    },
    /// Lifts a quarantine.
    ClearNoCompact {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
    },
    /// `AcquireLease` with a job manifest: `Some` sets it, `None` keeps the
    /// holder's own; also prunes leases expired for over an hour.
    AcquireLeaseJob {
        key: String,
        holder: String,
        now_ns: i64,
        ttl_ms: i64,
        job: Option<String>,
    },
    /// `RenewLease` with a job manifest: `Some` replaces it, `None` keeps it.
    RenewLeaseJob {
        key: String,
        holder: String,
        now_ns: i64,
        ttl_ms: i64,
        job: Option<String>,
    },
    /// Live, unpinned blocks become `Offloaded` with their copy's
    /// location and hash. Whole or nothing; a retry with the same copy is
    /// a no-op.
    MarkOffloadedV2 {
        items: Vec<OffloadItem>,
    },
    /// The primary objects of offloaded blocks were deleted, under the
    /// partition lease.
    MarkPrimaryFreed {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
        now_ns: i64,
        lease_key: String,
        lease_holder: String,
    },
    /// Offloaded blocks are live again (their primary object restored,
    /// byte-identical), pinned until `pin_until_ns`, under the partition
    /// lease. Live blocks: the pin is extended.
    MarkRestoredV2 {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
        pin_until_ns: i64,
        now_ns: i64,
        lease_key: String,
        lease_holder: String,
    },
    /// `Tombstone` that says why, and works on live and offloaded blocks
    /// (their copies stay recorded so GC deletes them). Pinned blocks
    /// refuse the whole command.
    TombstoneV2 {
        #[serde(with = "stored::block_ids")]
        ids: Vec<BlockId>,
        now_ns: i64,
        reason: TombstoneReason,
    },
    /// What enforcing a policy did last (JSON written by the compactor),
    /// kept beside the policy for the operator.
    SetPolicyStatus {
        kind: PolicyKind,
        name: String,
        status_json: String,
    },
    /// Offload target names a compactor can write to; a policy naming
    /// another is refused. Names are only added.
    RegisterOffloadTargets {
        names: Vec<String>,
    },
    /// Records the incarnation of a member's data directory (see
    /// `node::check_data_dir`); refused when another incarnation holds
    /// the id, unless `replace`.
    RegisterMember {
        node_id: u64,
        incarnation: String,
        replace: bool,
    },
    /// Drops a member's registration (its id left the membership).
    ForgetMember {
        node_id: u64,
    },
    /// [`Command::RegisterOffloadTargets`] with the compactor's
    /// reachability check of each name (appended: the log holds postcard,
    /// so the earlier variant keeps its shape).
    RegisterOffloadTargetsV2 {
        names: Vec<String>,
        checks: Vec<TargetCheck>,
    },
}

/// A compactor's reachability check of one offload target (never its URL
/// or credentials).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub name: String,
    pub reachable: bool,
    pub checked_at_ns: i64,
    /// Why it is unreachable (at most [`MAX_TARGET_ERROR_BYTES`]).
    pub error: String,
}

/// Longest [`TargetCheck::error`].
pub const MAX_TARGET_ERROR_BYTES: usize = 256;

/// One block marked offloaded by [`Command::MarkOffloadedV2`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadItem {
    #[serde(with = "stored::block_id")]
    pub id: BlockId,
    pub location: String,
    pub sha256: String,
    pub at_ns: i64,
}

/// Why [`Command::TombstoneV2`] tombstoned blocks. Persisted: variants are
/// only ever appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TombstoneReason {
    /// Every row is past its retention rule.
    Retention,
    /// An operator's request.
    Manual,
}

impl TombstoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TombstoneReason::Retention => "retention",
            TombstoneReason::Manual => "manual",
        }
    }
}

impl Command {
    /// A short name for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Publish { .. } => "publish",
            Command::Replace { .. } => "replace",
            Command::Tombstone { .. } => "tombstone",
            Command::Purge { .. } => "purge",
            Command::MarkOffloaded { .. } => "mark_offloaded",
            Command::MarkRestored { .. } => "mark_restored",
            Command::SetPolicy(_) => "set_policy",
            Command::DeletePolicy { .. } => "delete_policy",
            Command::AcquireLease { .. } => "acquire_lease",
            Command::RenewLease { .. } => "renew_lease",
            Command::ReleaseLease { .. } => "release_lease",
            Command::Heartbeat { .. } => "heartbeat",
            Command::Fence { .. } => "fence",
            Command::Stage { .. } => "stage",
            Command::FencedPublish { .. } => "fenced_publish",
            Command::ReplaceV2 { .. } => "replace_v2",
            Command::Abandon { .. } => "abandon",
            Command::MarkNoCompact { .. } => "mark_no_compact",
            Command::ClearNoCompact { .. } => "clear_no_compact",
            Command::AcquireLeaseJob { .. } => "acquire_lease",
            Command::RenewLeaseJob { .. } => "renew_lease",
            Command::MarkOffloadedV2 { .. } => "mark_offloaded",
            Command::MarkPrimaryFreed { .. } => "mark_primary_freed",
            Command::MarkRestoredV2 { .. } => "mark_restored",
            Command::TombstoneV2 { .. } => "tombstone",
            Command::SetPolicyStatus { .. } => "set_policy_status",
            Command::RegisterOffloadTargets { .. } | Command::RegisterOffloadTargetsV2 { .. } => {
                "register_offload_targets"
            }
            Command::RegisterMember { .. } => "register_member",
            Command::ForgetMember { .. } => "forget_member",
        }
    }

    /// Stateless validation: everything that can be checked without the
    /// catalog's state.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            Command::Publish { blocks, watermark } => {
                check_count("blocks", blocks.len())?;
                check_distinct("blocks", blocks.iter().map(|b| b.id))?;
                for b in blocks {
                    validate_block(b)?;
                }
                if let Some(w) = watermark {
                    check_name("watermark.ingester_id", &w.ingester_id)?;
                }
                if blocks.is_empty() && watermark.is_none() {
                    return Err(CommandError::invalid("blocks", "a publish needs blocks or a watermark"));
                }
                Ok(())
            }
            Command::Replace {
                add,
                tombstone,
                now_ns,
                lease,
            } => {
                validate_replace(add, tombstone, *now_ns)?;
                if let Some((key, holder)) = lease {
                    check_name("lease_key", key)?;
                    check_name("lease_holder", holder)?;
                }
                Ok(())
            }
            Command::ReplaceV2 {
                add,
                tombstone,
                now_ns,
                lease_key,
                lease_holder,
                reason,
                dropped_rows,
            } => {
                validate_replace(add, tombstone, *now_ns)?;
                check_name("lease_key", lease_key)?;
                check_name("lease_holder", lease_holder)?;
                nonempty("tombstone", tombstone.len())?;
                // Everything dropped is a tombstone, not a replace.
                nonempty("add", add.len())?;
                if *dropped_rows != 0 && *reason != ReplaceReason::RetentionRewrite {
                    return Err(CommandError::invalid(
                        "dropped_rows",
                        format!(
                            "{dropped_rows} rows dropped by a {} replace; only a retention rewrite drops rows",
                            reason.as_str()
                        ),
                    ));
                }
                check_one_partition("add", add.iter())
            }
            Command::Abandon { ids } | Command::ClearNoCompact { ids } => check_ids("ids", ids),
            Command::MarkNoCompact { ids, reason } => {
                check_ids("ids", ids)?;
                check_text("reason", reason, MAX_REASON_LEN)
            }
            Command::AcquireLeaseJob {
                key,
                holder,
                now_ns,
                ttl_ms,
                job,
            }
            | Command::RenewLeaseJob {
                key,
                holder,
                now_ns,
                ttl_ms,
                job,
            } => {
                check_name("key", key)?;
                check_name("holder", holder)?;
                check_time("now_ns", *now_ns)?;
                check_ttl(*now_ns, *ttl_ms, false)?;
                match job {
                    Some(j) if j.len() > MAX_JOB_BYTES => Err(CommandError::invalid(
                        "job",
                        format!("{} bytes, at most {MAX_JOB_BYTES}", j.len()),
                    )),
                    _ => Ok(()),
                }
            }
            Command::MarkOffloadedV2 { items } => {
                check_count("items", items.len())?;
                nonempty("items", items.len())?;
                check_distinct("items", items.iter().map(|i| i.id))?;
                for i in items {
                    check_name("location", &i.location)?;
                    check_time("at_ns", i.at_ns)?;
                    if i.sha256.len() != 64 || !i.sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                        return Err(CommandError::invalid(
                            "sha256",
                            format!("{:?} is not 64 lowercase hex digits", i.sha256),
                        ));
                    }
                }
                Ok(())
            }
            Command::MarkPrimaryFreed {
                ids,
                now_ns,
                lease_key,
                lease_holder,
            } => {
                check_ids("ids", ids)?;
                nonempty("ids", ids.len())?;
                check_time("now_ns", *now_ns)?;
                check_name("lease_key", lease_key)?;
                check_name("lease_holder", lease_holder)
            }
            Command::MarkRestoredV2 {
                ids,
                pin_until_ns,
                now_ns,
                lease_key,
                lease_holder,
            } => {
                check_ids("ids", ids)?;
                nonempty("ids", ids.len())?;
                check_time("pin_until_ns", *pin_until_ns)?;
                check_time("now_ns", *now_ns)?;
                check_name("lease_key", lease_key)?;
                check_name("lease_holder", lease_holder)
            }
            Command::TombstoneV2 { ids, now_ns, .. } => {
                check_ids("ids", ids)?;
                nonempty("ids", ids.len())?;
                check_time("now_ns", *now_ns)
            }
            Command::SetPolicyStatus { name, status_json, .. } => {
                check_name("name", name)?;
                check_text("status_json", status_json, MAX_JOB_BYTES)
            }
            Command::RegisterOffloadTargets { names } => {
                nonempty("names", names.len())?;
                if names.len() > 64 {
                    return Err(CommandError::invalid(
                        "names",
                        format!("{} names, at most 64", names.len()),
                    ));
                }
                names.iter().try_for_each(|n| check_name("names", n))
            }
            Command::RegisterMember { incarnation, .. } => {
                check_name("incarnation", incarnation)?;
                nonempty("incarnation", incarnation.len())
            }
            Command::ForgetMember { .. } => Ok(()),
            Command::RegisterOffloadTargetsV2 { names, checks } => {
                Command::RegisterOffloadTargets { names: names.clone() }.validate()?;
                for c in checks {
                    if !names.contains(&c.name) {
                        return Err(CommandError::invalid(
                            "checks",
                            format!("a check of {:?}, which is not among the names", c.name),
                        ));
                    }
                    check_time("checks.checked_at_ns", c.checked_at_ns)?;
                    if c.error.len() > MAX_TARGET_ERROR_BYTES {
                        return Err(CommandError::invalid(
                            "checks.error",
                            format!("{} bytes, at most {MAX_TARGET_ERROR_BYTES}", c.error.len()),
                        ));
                    }
                }
                Ok(())
            }
            Command::Tombstone { ids, now_ns } => {
                check_count("ids", ids.len())?;
                nonempty("ids", ids.len())?;
                check_distinct("ids", ids.iter().copied())?;
                check_time("now_ns", *now_ns)
            }
            Command::Purge { ids } => check_ids("ids", ids),
            Command::MarkOffloaded { location, .. } => check_name("location", location),
            Command::MarkRestored { .. } => Ok(()),
            Command::SetPolicy(p) => validate_policy(p),
            Command::DeletePolicy { name, .. } => check_name("name", name),
            Command::AcquireLease {
                key,
                holder,
                now_ns,
                ttl_ms,
            }
            | Command::RenewLease {
                key,
                holder,
                now_ns,
                ttl_ms,
            } => {
                check_name("key", key)?;
                check_name("holder", holder)?;
                check_time("now_ns", *now_ns)?;
                check_ttl(*now_ns, *ttl_ms, false)
            }
            Command::ReleaseLease { key, holder } => {
                check_name("key", key)?;
                check_name("holder", holder)
            }
            Command::Heartbeat {
                ingester_id,
                address,
                now_ns,
                ttl_ms,
            } => {
                check_name("ingester_id", ingester_id)?;
                check_name("address", address)?;
                check_time("now_ns", *now_ns)?;
                check_ttl(*now_ns, *ttl_ms, true)
            }
            Command::Fence { ingester_id } => check_name("ingester_id", ingester_id),
            Command::Stage {
                ingester_id, blocks, ..
            } => {
                check_name("ingester_id", ingester_id)?;
                check_count("blocks", blocks.len())?;
                nonempty("blocks", blocks.len())?;
                check_distinct("blocks", blocks.iter().map(|b| b.id))?;
                blocks.iter().try_for_each(validate_block)
            }
            Command::FencedPublish {
                ingester_id,
                blocks,
                watermark,
                txn,
                ..
            } => {
                check_name("ingester_id", ingester_id)?;
                check_count("blocks", blocks.len())?;
                check_distinct("blocks", blocks.iter().map(|b| b.id))?;
                blocks.iter().try_for_each(validate_block)?;
                if let Some(w) = watermark
                    && &w.ingester_id != ingester_id
                {
                    return Err(CommandError::invalid(
                        "watermark.ingester_id",
                        format!("{:?} is not the publishing ingester {ingester_id:?}", w.ingester_id),
                    ));
                }
                if blocks.is_empty() && watermark.is_none() && txn.is_none() {
                    return Err(CommandError::invalid("blocks", "a publish needs blocks or a watermark"));
                }
                Ok(())
            }
        }
    }
}

/// `Replace` and `ReplaceV2`: at most [`MAX_BLOCKS_PER_COMMAND`] each way,
/// something to do, no block named twice or both added and tombstoned,
/// well-formed new blocks.
fn validate_replace(add: &[BlockRecord], tombstone: &[BlockId], now_ns: i64) -> Result<(), CommandError> {
    check_count("add", add.len())?;
    check_count("tombstone", tombstone.len())?;
    if add.is_empty() && tombstone.is_empty() {
        return Err(CommandError::invalid("replace", "nothing to add or tombstone"));
    }
    check_distinct("add", add.iter().map(|b| b.id))?;
    check_distinct("tombstone", tombstone.iter().copied())?;
    if let Some(b) = add.iter().find(|b| tombstone.contains(&b.id)) {
        return Err(CommandError::invalid(
            "replace",
            format!("block {} is both added and tombstoned", b.id),
        ));
    }
    for b in add {
        validate_block(b)?;
    }
    check_time("now_ns", now_ns)
}

/// Every block in one partition; otherwise names the first two that differ.
pub(crate) fn check_one_partition<'a>(
    field: &str,
    mut blocks: impl Iterator<Item = &'a BlockRecord>,
) -> Result<(), CommandError> {
    let Some(first) = blocks.next() else { return Ok(()) };
    match blocks.find(|b| b.partition() != first.partition()) {
        None => Ok(()),
        Some(b) => Err(CommandError::invalid(
            field,
            format!(
                "blocks of one partition only: block {} is in {}, block {} in {}",
                first.id,
                partition_name(first),
                b.id,
                partition_name(b)
            ),
        )),
    }
}

fn partition_name(b: &BlockRecord) -> String {
    format!("{}/{}/{}", b.tenant.as_str(), b.signal.as_str(), b.partition_start_ns)
}

/// A non-empty list of distinct ids, at most [`MAX_BLOCKS_PER_COMMAND`].
fn check_ids(field: &str, ids: &[BlockId]) -> Result<(), CommandError> {
    check_count(field, ids.len())?;
    nonempty(field, ids.len())?;
    check_distinct(field, ids.iter().copied())
}

fn nonempty(field: &str, n: usize) -> Result<(), CommandError> {
    if n == 0 {
        return Err(CommandError::invalid(field, "must not be empty"));
    }
    Ok(())
}

fn check_count(field: &str, n: usize) -> Result<(), CommandError> {
    if n > MAX_BLOCKS_PER_COMMAND {
        return Err(CommandError::invalid(
            field,
            format!("{n} entries, at most {MAX_BLOCKS_PER_COMMAND} per command"),
        ));
    }
    Ok(())
}

fn check_distinct(field: &str, ids: impl Iterator<Item = BlockId>) -> Result<(), CommandError> {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            return Err(CommandError::invalid(field, format!("block {id} named twice")));
        }
    }
    Ok(())
}

pub(crate) fn check_time(field: &str, t: i64) -> Result<(), CommandError> {
    if t < 0 {
        return Err(CommandError::invalid(field, format!("negative time {t}")));
    }
    Ok(())
}

fn check_ttl(now_ns: i64, ttl_ms: i64, zero_ok: bool) -> Result<(), CommandError> {
    if ttl_ms < 0 || (ttl_ms == 0 && !zero_ok) || ttl_ms > MAX_TTL_MS {
        return Err(CommandError::invalid(
            "ttl_ms",
            format!("{ttl_ms} is outside 1..={MAX_TTL_MS}"),
        ));
    }
    if now_ns.checked_add(ttl_ms * 1_000_000).is_none() {
        return Err(CommandError::invalid("now_ns", "now + ttl overflows"));
    }
    Ok(())
}

fn check_name(field: &str, s: &str) -> Result<(), CommandError> {
    check_text(field, s, MAX_NAME_LEN)
}

/// Non-empty, at most `max` bytes, no control characters.
fn check_text(field: &str, s: &str, max: usize) -> Result<(), CommandError> {
    if s.is_empty() {
        return Err(CommandError::invalid(field, "must not be empty"));
    }
    if s.len() > max {
        return Err(CommandError::invalid(
            field,
            format!("{} bytes, at most {max}", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(CommandError::invalid(field, "contains control characters"));
    }
    Ok(())
}

/// The tenant and signal are valid by their types (checked where a
/// protobuf block becomes a record, [`crate::pb_impl::block`]).
pub(crate) fn validate_block(b: &BlockRecord) -> Result<(), CommandError> {
    let id = b.id;
    let field = |f: &str| format!("block {id}: {f}");
    check_time(&field("min_time_ns"), b.min_time_ns)?;
    check_time(&field("max_time_ns"), b.max_time_ns)?;
    check_time(&field("created_at_ns"), b.created_at_ns)?;
    if b.max_time_ns < b.min_time_ns {
        return Err(CommandError::invalid(field("max_time_ns"), "before min_time_ns"));
    }
    if b.rows == 0 {
        return Err(CommandError::invalid(field("rows"), "a block holds at least one row"));
    }
    if b.bytes == 0 {
        return Err(CommandError::invalid(field("bytes"), "a block is at least one byte"));
    }
    if b.state != BlockState::Live {
        return Err(CommandError::invalid(field("state"), "new blocks are live"));
    }
    if b.no_compact.is_some() {
        return Err(CommandError::invalid(
            field("no_compact"),
            "new blocks are not quarantined",
        ));
    }
    let loc = parse_block_path(&Path::from(b.object_key.as_str()))
        .map_err(|e| CommandError::invalid(field("object_key"), e.to_string()))?;
    if loc.tenant != b.tenant || loc.signal != b.signal || loc.block_id != id {
        return Err(CommandError::invalid(
            field("object_key"),
            "does not name this block's tenant, signal and id",
        ));
    }
    let hour = i64::try_from(loc.hour_start).map_err(|_| CommandError::invalid(field("object_key"), "hour"))?;
    if b.partition_start_ns != hour {
        return Err(CommandError::invalid(
            field("partition_start_ns"),
            "differs from the object key's hour",
        ));
    }
    if b.min_time_ns < hour || b.min_time_ns >= hour.saturating_add(NANOS_PER_HOUR) {
        return Err(CommandError::invalid(
            field("min_time_ns"),
            "outside the object key's hour partition",
        ));
    }
    Ok(())
}

fn validate_policy(p: &Policy) -> Result<(), CommandError> {
    check_name("policy.name", &p.name)?;
    if !p.tenant.is_empty() {
        TenantId::new(&p.tenant).map_err(|e| CommandError::invalid("policy.tenant", e.to_string()))?;
    }
    if p.body_json.len() > MAX_POLICY_BYTES {
        return Err(CommandError::invalid(
            "policy.body_json",
            format!("{} bytes, at most {MAX_POLICY_BYTES}", p.body_json.len()),
        ));
    }
    match serde_json::from_str::<serde_json::Value>(&p.body_json) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(CommandError::invalid("policy.body_json", "must be a JSON object")),
        Err(e) => Err(CommandError::invalid("policy.body_json", e.to_string())),
    }
}
