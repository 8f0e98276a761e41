//! The catalog's records and commands, their validation, and their mapping
//! to and from the gRPC messages in `proto/catalog.proto`.
//!
//! Validation here is stateless (a well-formed command); the state machine
//! adds the checks that depend on the current state. Both run on every
//! member, so a command is accepted or rejected identically everywhere.

use mira_core::block::path::parse_block_path;
use mira_core::ids::{BlockId, Signal, TenantId};
use mira_proto::catalog as pb;
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

/// One block as the catalog knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRecord {
    pub id: u128,
    pub tenant: String,
    /// [`Signal::code`].
    pub signal: u8,
    pub partition_start_ns: i64,
    pub min_time_ns: i64,
    pub max_time_ns: i64,
    pub rows: u64,
    pub bytes: u64,
    pub level: Level,
    pub object_key: String,
    pub created_at_ns: i64,
    pub state: BlockState,
}

impl BlockRecord {
    pub fn block_id(&self) -> BlockId {
        BlockId::from_u128(self.id)
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyKind {
    Retention,
    Offload,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub kind: PolicyKind,
    pub name: String,
    /// Empty: every tenant.
    pub tenant: String,
    pub body_json: String,
}

/// A replicated command. Each is applied whole or not at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Publish {
        blocks: Vec<BlockRecord>,
        watermark: Option<Watermark>,
    },
    Replace {
        add: Vec<BlockRecord>,
        tombstone: Vec<u128>,
        now_ns: i64,
        lease: Option<(String, String)>,
    },
    Tombstone {
        ids: Vec<u128>,
        now_ns: i64,
    },
    Purge {
        ids: Vec<u128>,
    },
    MarkOffloaded {
        id: u128,
        location: String,
    },
    MarkRestored {
        id: u128,
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
                check_count("add", add.len())?;
                check_count("tombstone", tombstone.len())?;
                if add.is_empty() && tombstone.is_empty() {
                    return Err(CommandError::invalid("replace", "nothing to add or tombstone"));
                }
                check_distinct("add", add.iter().map(|b| b.id))?;
                check_distinct("tombstone", tombstone.iter().copied())?;
                if let Some(id) = add.iter().find(|b| tombstone.contains(&b.id)) {
                    return Err(CommandError::invalid(
                        "replace",
                        format!("block {} is both added and tombstoned", id.block_id()),
                    ));
                }
                for b in add {
                    validate_block(b)?;
                }
                check_time("now_ns", *now_ns)?;
                if let Some((key, holder)) = lease {
                    check_name("lease_key", key)?;
                    check_name("lease_holder", holder)?;
                }
                Ok(())
            }
            Command::Tombstone { ids, now_ns } => {
                check_count("ids", ids.len())?;
                nonempty("ids", ids.len())?;
                check_distinct("ids", ids.iter().copied())?;
                check_time("now_ns", *now_ns)
            }
            Command::Purge { ids } => {
                check_count("ids", ids.len())?;
                nonempty("ids", ids.len())?;
                check_distinct("ids", ids.iter().copied())
            }
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

fn check_distinct(field: &str, ids: impl Iterator<Item = u128>) -> Result<(), CommandError> {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if !seen.insert(id) {
            return Err(CommandError::invalid(
                field,
                format!("block {} named twice", BlockId::from_u128(id)),
            ));
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
    if s.is_empty() {
        return Err(CommandError::invalid(field, "must not be empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(CommandError::invalid(
            field,
            format!("{} bytes, at most {MAX_NAME_LEN}", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(CommandError::invalid(field, "contains control characters"));
    }
    Ok(())
}

fn validate_block(b: &BlockRecord) -> Result<(), CommandError> {
    let id = b.block_id();
    let field = |f: &str| format!("block {id}: {f}");
    TenantId::new(&b.tenant).map_err(|e| CommandError::invalid(field("tenant"), e.to_string()))?;
    let signal = Signal::from_code(b.signal).ok_or_else(|| CommandError::invalid(field("signal"), "unknown signal"))?;
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
    let loc = parse_block_path(&Path::from(b.object_key.as_str()))
        .map_err(|e| CommandError::invalid(field("object_key"), e.to_string()))?;
    if loc.tenant.as_str() != b.tenant || loc.signal != signal || loc.block_id != id {
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

// ---- proto mapping ----

pub fn parse_block_id(field: &str, s: &str) -> Result<u128, CommandError> {
    s.parse::<ulid::Ulid>()
        .map(u128::from)
        .map_err(|e| CommandError::invalid(field, format!("{:?} is not a ULID: {e}", truncate(s))))
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

pub fn signal_from_pb(field: &str, v: i32) -> Result<u8, CommandError> {
    match pb::Signal::try_from(v) {
        Ok(pb::Signal::Logs) => Ok(Signal::Logs.code()),
        Ok(pb::Signal::Traces) => Ok(Signal::Traces.code()),
        Ok(pb::Signal::Metrics) => Ok(Signal::Metrics.code()),
        _ => Err(CommandError::invalid(field, format!("unknown signal {v}"))),
    }
}

pub fn signal_to_pb(code: u8) -> pb::Signal {
    match Signal::from_code(code) {
        Some(Signal::Logs) => pb::Signal::Logs,
        Some(Signal::Traces) => pb::Signal::Traces,
        Some(Signal::Metrics) => pb::Signal::Metrics,
        None => pb::Signal::Unspecified,
    }
}

pub fn state_kind_from_pb(v: i32) -> Result<StateKind, CommandError> {
    match pb::BlockState::try_from(v) {
        Ok(pb::BlockState::Live) => Ok(StateKind::Live),
        Ok(pb::BlockState::Tombstoned) => Ok(StateKind::Tombstoned),
        Ok(pb::BlockState::Offloaded) => Ok(StateKind::Offloaded),
        _ => Err(CommandError::invalid("states", format!("unknown block state {v}"))),
    }
}

fn policy_kind_from_pb(v: i32) -> Result<PolicyKind, CommandError> {
    match pb::PolicyKind::try_from(v) {
        Ok(pb::PolicyKind::Retention) => Ok(PolicyKind::Retention),
        Ok(pb::PolicyKind::Offload) => Ok(PolicyKind::Offload),
        _ => Err(CommandError::invalid("kind", format!("unknown policy kind {v}"))),
    }
}

/// `None` for "unspecified" (every kind).
pub fn policy_kind_filter_from_pb(v: i32) -> Result<Option<PolicyKind>, CommandError> {
    if v == pb::PolicyKind::Unspecified as i32 {
        return Ok(None);
    }
    policy_kind_from_pb(v).map(Some)
}

fn policy_kind_to_pb(k: PolicyKind) -> pb::PolicyKind {
    match k {
        PolicyKind::Retention => pb::PolicyKind::Retention,
        PolicyKind::Offload => pb::PolicyKind::Offload,
    }
}

/// A block as sent in a publish or replace (its state must be live or
/// unspecified; partition start is taken from the object key).
pub fn block_from_pb(b: &pb::Block) -> Result<BlockRecord, CommandError> {
    let id = parse_block_id("block.id", &b.id)?;
    let level = match pb::Level::try_from(b.level) {
        Ok(pb::Level::Hot) | Ok(pb::Level::Unspecified) => Level::Hot,
        Ok(pb::Level::Cold) => Level::Cold,
        Err(_) => {
            return Err(CommandError::invalid(
                "block.level",
                format!("unknown level {}", b.level),
            ));
        }
    };
    match pb::BlockState::try_from(b.state) {
        Ok(pb::BlockState::Live) | Ok(pb::BlockState::Unspecified) => {}
        _ => return Err(CommandError::invalid("block.state", "new blocks are live")),
    }
    let key = Path::from(b.object_key.as_str());
    let partition_start_ns = parse_block_path(&key)
        .ok()
        .and_then(|l| i64::try_from(l.hour_start).ok())
        .unwrap_or(-1);
    Ok(BlockRecord {
        id,
        tenant: b.tenant.clone(),
        signal: signal_from_pb("block.signal", b.signal)?,
        partition_start_ns,
        min_time_ns: b.min_time_ns,
        max_time_ns: b.max_time_ns,
        rows: b.rows,
        bytes: b.bytes,
        level,
        object_key: b.object_key.clone(),
        created_at_ns: b.created_at_ns,
        state: BlockState::Live,
    })
}

pub fn block_to_pb(b: &BlockRecord) -> pb::Block {
    let (state, offload_location, tombstoned_at_ns) = match &b.state {
        BlockState::Live => (pb::BlockState::Live, String::new(), 0),
        BlockState::Tombstoned { at_ns } => (pb::BlockState::Tombstoned, String::new(), *at_ns),
        BlockState::Offloaded { location } => (pb::BlockState::Offloaded, location.clone(), 0),
    };
    pb::Block {
        id: b.block_id().to_string(),
        tenant: b.tenant.clone(),
        signal: signal_to_pb(b.signal) as i32,
        partition_start_ns: b.partition_start_ns,
        min_time_ns: b.min_time_ns,
        max_time_ns: b.max_time_ns,
        rows: b.rows,
        bytes: b.bytes,
        level: match b.level {
            Level::Hot => pb::Level::Hot,
            Level::Cold => pb::Level::Cold,
        } as i32,
        object_key: b.object_key.clone(),
        created_at_ns: b.created_at_ns,
        state: state as i32,
        offload_location,
        tombstoned_at_ns,
    }
}

pub fn watermark_to_pb(w: &Watermark) -> pb::Watermark {
    pb::Watermark {
        ingester_id: w.ingester_id.clone(),
        shard: w.shard,
        wal_seq: w.wal_seq,
    }
}

fn watermark_from_pb(w: &pb::Watermark) -> Watermark {
    Watermark {
        ingester_id: w.ingester_id.clone(),
        shard: w.shard,
        wal_seq: w.wal_seq,
    }
}

pub fn ingester_to_pb(i: &IngesterLease) -> pb::IngesterLease {
    pb::IngesterLease {
        ingester_id: i.ingester_id.clone(),
        address: i.address.clone(),
        expires_at_ns: i.expires_at_ns,
    }
}

pub fn lease_to_pb(l: &Lease) -> pb::Lease {
    pb::Lease {
        key: l.key.clone(),
        holder: l.holder.clone(),
        expires_at_ns: l.expires_at_ns,
    }
}

pub fn policy_to_pb(p: &Policy) -> pb::Policy {
    pb::Policy {
        kind: policy_kind_to_pb(p.kind) as i32,
        name: p.name.clone(),
        tenant: p.tenant.clone(),
        body_json: p.body_json.clone(),
    }
}

/// The command a write request carries, validated.
pub fn command_from_pb(req: &pb::WriteRequest) -> Result<Command, CommandError> {
    use pb::write_request::Command as C;
    let cmd = match req.command.as_ref() {
        None => return Err(CommandError::invalid("command", "missing")),
        Some(C::Publish(p)) => Command::Publish {
            blocks: p.blocks.iter().map(block_from_pb).collect::<Result<_, _>>()?,
            watermark: p.watermark.as_ref().map(watermark_from_pb),
        },
        Some(C::Replace(r)) => Command::Replace {
            add: r.add.iter().map(block_from_pb).collect::<Result<_, _>>()?,
            tombstone: ids_from_pb("tombstone", &r.tombstone)?,
            now_ns: r.now_ns,
            lease: match (r.lease_key.is_empty(), r.lease_holder.is_empty()) {
                (true, true) => None,
                (false, false) => Some((r.lease_key.clone(), r.lease_holder.clone())),
                _ => return Err(CommandError::invalid("lease_key", "lease key and holder go together")),
            },
        },
        Some(C::Tombstone(t)) => Command::Tombstone {
            ids: ids_from_pb("ids", &t.ids)?,
            now_ns: t.now_ns,
        },
        Some(C::Purge(p)) => Command::Purge {
            ids: ids_from_pb("ids", &p.ids)?,
        },
        Some(C::MarkOffloaded(m)) => Command::MarkOffloaded {
            id: parse_block_id("id", &m.id)?,
            location: m.location.clone(),
        },
        Some(C::MarkRestored(m)) => Command::MarkRestored {
            id: parse_block_id("id", &m.id)?,
        },
        Some(C::SetPolicy(s)) => {
            let p = s
                .policy
                .as_ref()
                .ok_or_else(|| CommandError::invalid("policy", "missing"))?;
            Command::SetPolicy(Policy {
                kind: policy_kind_from_pb(p.kind)?,
                name: p.name.clone(),
                tenant: p.tenant.clone(),
                body_json: p.body_json.clone(),
            })
        }
        Some(C::DeletePolicy(d)) => Command::DeletePolicy {
            kind: policy_kind_from_pb(d.kind)?,
            name: d.name.clone(),
        },
        Some(C::AcquireLease(l)) => Command::AcquireLease {
            key: l.key.clone(),
            holder: l.holder.clone(),
            now_ns: l.now_ns,
            ttl_ms: l.ttl_ms,
        },
        Some(C::RenewLease(l)) => Command::RenewLease {
            key: l.key.clone(),
            holder: l.holder.clone(),
            now_ns: l.now_ns,
            ttl_ms: l.ttl_ms,
        },
        Some(C::ReleaseLease(l)) => Command::ReleaseLease {
            key: l.key.clone(),
            holder: l.holder.clone(),
        },
        Some(C::Heartbeat(h)) => Command::Heartbeat {
            ingester_id: h.ingester_id.clone(),
            address: h.address.clone(),
            now_ns: h.now_ns,
            ttl_ms: h.ttl_ms,
        },
        Some(C::Fence(f)) => Command::Fence {
            ingester_id: f.ingester_id.clone(),
        },
        Some(C::Stage(st)) => Command::Stage {
            ingester_id: st.ingester_id.clone(),
            epoch: st.epoch,
            txn: parse_block_id("txn", &st.txn)?,
            blocks: st.blocks.iter().map(block_from_pb).collect::<Result<_, _>>()?,
        },
        Some(C::FencedPublish(p)) => Command::FencedPublish {
            ingester_id: p.ingester_id.clone(),
            epoch: p.epoch,
            blocks: p.blocks.iter().map(block_from_pb).collect::<Result<_, _>>()?,
            watermark: p.watermark.as_ref().map(watermark_from_pb),
            txn: if p.txn.is_empty() {
                None
            } else {
                Some(parse_block_id("txn", &p.txn)?)
            },
        },
    };
    cmd.validate()?;
    Ok(cmd)
}

fn ids_from_pb(field: &str, ids: &[String]) -> Result<Vec<u128>, CommandError> {
    if ids.len() > MAX_BLOCKS_PER_COMMAND {
        return Err(CommandError::invalid(
            field,
            format!("{} entries, at most {MAX_BLOCKS_PER_COMMAND} per command", ids.len()),
        ));
    }
    ids.iter().map(|s| parse_block_id(field, s)).collect()
}
