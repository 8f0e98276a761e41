//! The planner: pure. From the catalog's blocks, the partitions other
//! holders lease and the time, it decides what to do next
//! ([`plan`]): which hot blocks to merge, which settled hours to rewrite
//! cold, which tombstoned blocks are past the deletion grace, and how much
//! work is waiting (the backlog the metrics report).
//!
//! Rules (compactor-design.md §5, with the choices of docs/operations.md):
//!
//! - Work never spans partitions: a partition is (tenant, signal, UTC hour
//!   of the block's min time), one object-key prefix.
//! - **Hot tiering** while the hour is recent: an immature hot block
//!   (smaller than `mature_hot_bytes`) has a level, `floor(log8(bytes /
//!   256 KiB))`; a level with at least `merge_factor` blocks, or whose
//!   blocks add up to `mature_hot_bytes`, is merged oldest first, up to
//!   `max_inputs` blocks and `target_hot_bytes`.
//! - **Cold rewrite** once `now ≥ hour end + cold_after` and nothing was
//!   published into the partition for `settle`: its live hot blocks, and
//!   small cold blocks when late data is worth folding in (seed 003's
//!   compaction ratio, 0.25), are packed in time order into bins of about
//!   `target_cold_bytes` of output; each bin is one job.
//! - One job per partition per round: the partition lease serializes them.
//! - Fair: candidates are ordered per tenant (hot merges by blocks removed,
//!   twice as urgent inside the last 24 h; then cold rewrites, oldest
//!   first), and tenants take turns.

use std::collections::{BTreeMap, HashSet};

use mira_core::block::Level;
use mira_core::ids::{BlockId, Signal, TenantId};
use serde::Serialize;

const NANOS_PER_HOUR: i64 = 3_600_000_000_000;
/// Level 0 holds hot blocks under this size.
const LEVEL_BASE_BYTES: u64 = 256 * 1024;
/// Partitions whose hour ended within this long are "recent".
const ACTIVE_WINDOW_NS: i64 = 24 * NANOS_PER_HOUR;
/// Late data folds an existing cold block in only when it is at least this
/// share of the block's hot-equivalent size (seed 003).
const COMPACTION_RATIO: f64 = 0.25;
/// Small cold blocks are merged among themselves once there are this many.
const SMALL_COLD_MERGE: usize = 8;

/// A block's lifecycle state, as far as the planner cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Live,
    Tombstoned { at_ns: i64 },
    Offloaded,
}

/// One catalog block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub id: BlockId,
    pub tenant: TenantId,
    pub signal: Signal,
    pub partition_start_ns: i64,
    pub min_time_ns: i64,
    pub max_time_ns: i64,
    pub rows: u64,
    pub bytes: u64,
    pub level: Level,
    pub created_at_ns: i64,
    pub object_key: String,
    pub state: BlockState,
    /// Marked "do not compact" (a corrupt input).
    pub quarantined: bool,
    /// Its copy in an offload target, when it has one.
    pub offload: Option<OffloadInfo>,
}

/// A block's copy in an offload target, as the catalog records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OffloadInfo {
    pub location: String,
    pub sha256: String,
    pub at_ns: i64,
    pub primary_freed: bool,
    pub pinned_until_ns: i64,
}

impl BlockInfo {
    /// A restore pinned it against offload and retention at `now_ns`.
    pub fn pinned(&self, now_ns: i64) -> bool {
        self.offload.as_ref().is_some_and(|o| o.pinned_until_ns > now_ns)
    }

    /// Its primary object still exists.
    pub fn primary_present(&self) -> bool {
        !self.offload.as_ref().is_some_and(|o| o.primary_freed)
    }
}

/// A partition: the unit of work and of leasing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Partition {
    pub tenant: String,
    pub signal: &'static str,
    pub start_ns: i64,
}

impl Partition {
    pub fn of(b: &BlockInfo) -> Partition {
        Partition {
            tenant: b.tenant.as_str().to_owned(),
            signal: b.signal.as_str(),
            start_ns: b.partition_start_ns,
        }
    }

    /// The catalog lease key that serializes work on this partition.
    pub fn lease_key(&self) -> String {
        format!("part/{}/{}/{}", self.tenant, self.signal, self.start_ns)
    }

    pub fn end_ns(&self) -> i64 {
        self.start_ns.saturating_add(NANOS_PER_HOUR)
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.signal, self.start_ns)
    }
}

/// What a job writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Hot blocks into one hot block.
    Merge,
    /// A settled hour's blocks into one cold block.
    Cold,
    /// One block rewritten without rows past their retention rule (the
    /// lifecycle pass plans these, [`crate::lifecycle`]).
    Retention,
}

impl JobKind {
    pub const ALL: [JobKind; 3] = [JobKind::Merge, JobKind::Cold, JobKind::Retention];

    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Merge => "merge",
            JobKind::Cold => "cold",
            JobKind::Retention => "retention",
        }
    }

    /// The output's level; a retention rewrite keeps its input's.
    pub fn output_level(self, input: Level) -> Level {
        match self {
            JobKind::Merge => Level::Hot,
            JobKind::Cold => Level::Cold,
            JobKind::Retention => input,
        }
    }
}

/// One rewrite: `inputs` (one partition, oldest first) into one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub kind: JobKind,
    pub partition: Partition,
    pub inputs: Vec<BlockInfo>,
    /// A retention rewrite's rules.
    pub cut: Option<std::sync::Arc<crate::lifecycle::RetentionCut>>,
    /// A cold rewrite's split of rows by policy class.
    pub split: Option<std::sync::Arc<crate::lifecycle::ClassSplit>>,
}

impl Job {
    pub fn input_bytes(&self) -> u64 {
        self.inputs.iter().map(|b| b.bytes).sum()
    }

    pub fn input_rows(&self) -> u64 {
        self.inputs.iter().map(|b| b.rows).sum()
    }
}

/// The planner's knobs (built from the settings).
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Hot merges ignore blocks younger than this (since creation).
    pub min_block_age_ns: i64,
    /// Fewest blocks of one level merged together.
    pub merge_factor: usize,
    /// Most inputs of one job.
    pub max_inputs: usize,
    /// Hot blocks at least this big wait for the cold rewrite.
    pub mature_hot_bytes: u64,
    /// Largest hot merge output (sum of the inputs).
    pub target_hot_bytes: u64,
    /// Cold output aimed at (estimated from the cold/hot ratio).
    pub target_cold_bytes: u64,
    /// Most hot-equivalent input bytes of one job.
    pub max_job_bytes: u64,
    /// A partition is cold-eligible this long after its hour ends...
    pub cold_after_ns: i64,
    /// ...and once nothing was published into it for this long.
    pub settle_ns: i64,
    /// Tombstoned blocks are deleted this long after their tombstone.
    pub deletion_grace_ns: i64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            min_block_age_ns: 60_000_000_000,
            merge_factor: 8,
            max_inputs: 1000,
            mature_hot_bytes: 32 << 20,
            target_hot_bytes: 128 << 20,
            target_cold_bytes: 64 << 20,
            max_job_bytes: 1 << 30,
            cold_after_ns: NANOS_PER_HOUR,
            settle_ns: 600_000_000_000,
            deletion_grace_ns: NANOS_PER_HOUR,
        }
    }
}

/// Cold bytes per hot byte of a signal, to estimate a cold output (the
/// whole-system figures of docs/perf.md: hot 0.88-0.90 B/B, cold
/// 0.13-0.22 for logs and traces, less for metrics).
pub fn cold_ratio(signal: Signal) -> f64 {
    match signal {
        Signal::Logs => 0.15,
        Signal::Traces => 0.13,
        Signal::Metrics => 0.09,
    }
}

/// Hot-equivalent size: what the block would take hot.
fn hot_equivalent(b: &BlockInfo) -> u64 {
    match b.level {
        Level::Hot => b.bytes,
        Level::Cold => (b.bytes as f64 / cold_ratio(b.signal)) as u64,
    }
}

/// Estimated cold output of a block.
fn cold_estimate(b: &BlockInfo) -> u64 {
    match b.level {
        Level::Hot => (b.bytes as f64 * cold_ratio(b.signal)) as u64,
        Level::Cold => b.bytes,
    }
}

/// The hot tiering level of a block.
pub fn level_of(bytes: u64) -> u32 {
    let mut l = 0;
    let mut edge = LEVEL_BASE_BYTES * 8;
    while bytes >= edge {
        l += 1;
        edge = edge.saturating_mul(8);
    }
    l
}

/// Work waiting, per job kind (the backlog the metrics report).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Backlog {
    /// Partitions with work of this kind.
    pub partitions: u64,
    /// Input bytes of that work (the first job of each partition).
    pub bytes: u64,
    /// How long the oldest of it has waited past its trigger, seconds.
    pub oldest_pending_s: f64,
}

/// What to do next.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Rewrites in the order to run them, at most one per partition.
    pub jobs: Vec<Job>,
    /// Tombstoned blocks past the deletion grace: delete (the primary
    /// object and any offload copy), then purge.
    pub purge: Vec<BlockInfo>,
    /// Offloaded blocks whose primary object is past the deletion grace:
    /// delete it under the partition lease.
    pub free_primary: Vec<BlockInfo>,
    /// Per job kind.
    pub backlog: BTreeMap<JobKind, Backlog>,
    /// Partitions skipped because another holder leases them.
    pub leased_elsewhere: u64,
    /// Most live objects in one partition.
    pub max_partition_objects: u64,
    /// Live partitions.
    pub partitions: u64,
    /// Tombstoned blocks waiting for the grace: count and bytes.
    pub tombstoned_pending: (u64, u64),
    /// Live blocks marked "do not compact".
    pub quarantined: u64,
}

/// Plans from every block the catalog lists; `leased` holds the lease keys
/// another holder owns right now (those partitions are skipped).
pub fn plan(blocks: &[BlockInfo], leased: &HashSet<String>, now_ns: i64, rules: &Rules) -> Plan {
    let mut out = Plan::default();
    let mut parts: BTreeMap<Partition, Vec<&BlockInfo>> = BTreeMap::new();
    for b in blocks {
        match b.state {
            BlockState::Live => {
                if b.quarantined {
                    out.quarantined += 1;
                }
                parts.entry(Partition::of(b)).or_default().push(b);
            }
            BlockState::Tombstoned { at_ns } => {
                if at_ns.saturating_add(rules.deletion_grace_ns) <= now_ns {
                    out.purge.push(b.clone());
                } else {
                    out.tombstoned_pending.0 += 1;
                    out.tombstoned_pending.1 += b.bytes;
                }
            }
            BlockState::Offloaded => {
                let offloaded_at = b.offload.as_ref().map_or(0, |o| o.at_ns);
                if b.primary_present() && offloaded_at.saturating_add(rules.deletion_grace_ns) <= now_ns {
                    out.free_primary.push(b.clone());
                }
            }
        }
    }
    out.free_primary.sort_by_key(|b| (b.partition_start_ns, b.id));
    out.purge.sort_by_key(|b| (b.partition_start_ns, b.id));
    out.partitions = parts.len() as u64;
    // Candidates per tenant, each list in priority order.
    // Per tenant: hot merges with their score, and cold rewrites.
    type Candidates = (Vec<(u64, Job)>, Vec<Job>);
    let mut per_tenant: BTreeMap<String, Candidates> = BTreeMap::new();
    for (part, mut members) in parts {
        out.max_partition_objects = out.max_partition_objects.max(members.len() as u64);
        members.sort_by_key(|b| (b.min_time_ns, b.id));
        let Some((job, pending_since)) = partition_job(&part, &members, now_ns, rules) else {
            continue;
        };
        let backlog = out.backlog.entry(job.kind).or_default();
        backlog.partitions += 1;
        backlog.bytes += job.input_bytes();
        backlog.oldest_pending_s = backlog
            .oldest_pending_s
            .max(now_ns.saturating_sub(pending_since).max(0) as f64 / 1e9);
        if leased.contains(&part.lease_key()) {
            out.leased_elsewhere += 1;
            continue;
        }
        let entry = per_tenant.entry(part.tenant.clone()).or_default();
        match job.kind {
            JobKind::Merge => {
                let removed = job.inputs.len() as u64 - 1;
                let urgent = part.end_ns() > now_ns.saturating_sub(ACTIVE_WINDOW_NS);
                entry.0.push((if urgent { removed * 2 } else { removed }, job));
            }
            JobKind::Cold | JobKind::Retention => entry.1.push(job),
        }
    }
    // Within a tenant: hot merges by score (recent partitions first on a
    // tie), then cold rewrites oldest first. Tenants with more work go
    // first in each turn.
    let mut queues: Vec<std::collections::VecDeque<Job>> = per_tenant
        .into_values()
        .map(|(mut hot, mut cold)| {
            hot.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.partition.start_ns.cmp(&a.1.partition.start_ns)));
            cold.sort_by_key(|j| j.partition.start_ns);
            hot.into_iter().map(|(_, j)| j).chain(cold).collect()
        })
        .collect();
    queues.sort_by_key(|q| std::cmp::Reverse(q.len()));
    while queues.iter().any(|q| !q.is_empty()) {
        for q in &mut queues {
            if let Some(j) = q.pop_front() {
                out.jobs.push(j);
            }
        }
    }
    out
}

/// The next job of one partition (live members sorted by (min time, id)),
/// and since when it has been pending.
fn partition_job(part: &Partition, members: &[&BlockInfo], now_ns: i64, rules: &Rules) -> Option<(Job, i64)> {
    let usable: Vec<&BlockInfo> = members.iter().copied().filter(|b| !b.quarantined).collect();
    let cold_at = part.end_ns().saturating_add(rules.cold_after_ns);
    // Cold blocks are this compactor's own outputs, not arriving data.
    let newest_publish = members
        .iter()
        .filter(|b| b.level == Level::Hot)
        .map(|b| b.created_at_ns)
        .max()
        .unwrap_or(i64::MIN);
    let settled = newest_publish.saturating_add(rules.settle_ns) <= now_ns;
    if now_ns >= cold_at {
        if !settled {
            return None;
        }
        let inputs = cold_inputs(&usable, rules)?;
        let job = Job {
            kind: JobKind::Cold,
            partition: part.clone(),
            inputs,
            cut: None,
            split: None,
        };
        return Some((job, cold_at.max(newest_publish.saturating_add(rules.settle_ns))));
    }
    merge_inputs(&usable, now_ns, rules).map(|inputs| {
        let since = inputs.iter().map(|b| b.created_at_ns).min().unwrap_or(now_ns);
        let job = Job {
            kind: JobKind::Merge,
            partition: part.clone(),
            inputs,
            cut: None,
            split: None,
        };
        (job, since)
    })
}

/// Hot tiering: the lowest level that is due, oldest blocks first.
fn merge_inputs(usable: &[&BlockInfo], now_ns: i64, rules: &Rules) -> Option<Vec<BlockInfo>> {
    let mut levels: BTreeMap<u32, Vec<&BlockInfo>> = BTreeMap::new();
    for b in usable {
        if b.level == Level::Hot
            && b.bytes < rules.mature_hot_bytes
            && b.created_at_ns.saturating_add(rules.min_block_age_ns) <= now_ns
        {
            levels.entry(level_of(b.bytes)).or_default().push(b);
        }
    }
    for blocks in levels.values() {
        let total: u64 = blocks.iter().map(|b| b.bytes).sum();
        if blocks.len() < rules.merge_factor && total < rules.mature_hot_bytes {
            continue;
        }
        let mut take = Vec::new();
        let mut sum = 0u64;
        for b in blocks {
            if take.len() >= rules.max_inputs
                || (!take.is_empty() && sum.saturating_add(b.bytes) > rules.target_hot_bytes.min(rules.max_job_bytes))
            {
                break;
            }
            sum += b.bytes;
            take.push((*b).clone());
        }
        if take.len() >= 2 {
            return Some(take);
        }
    }
    None
}

/// The cold rewrite's first bin: live hot blocks plus the small cold
/// blocks worth folding in, packed in time order.
fn cold_inputs(usable: &[&BlockInfo], rules: &Rules) -> Option<Vec<BlockInfo>> {
    let hot: Vec<&BlockInfo> = usable.iter().copied().filter(|b| b.level == Level::Hot).collect();
    let small_cold: Vec<&BlockInfo> = usable
        .iter()
        .copied()
        .filter(|b| b.level == Level::Cold && b.bytes < rules.target_cold_bytes / 2)
        .collect();
    let late_bytes: u64 = hot.iter().map(|b| b.bytes).sum();
    let fold: Vec<&BlockInfo> = if small_cold.len() >= SMALL_COLD_MERGE {
        small_cold
    } else {
        // Seed 003: rewrite an existing cold block only when the new data
        // is a real share of it, so a partition's lifetime rewrite cost
        // stays a constant multiple of its bytes.
        small_cold
            .into_iter()
            .filter(|c| late_bytes as f64 >= COMPACTION_RATIO * hot_equivalent(c) as f64)
            .collect()
    };
    if hot.is_empty() && fold.len() < SMALL_COLD_MERGE {
        return None;
    }
    let mut inputs: Vec<&BlockInfo> = hot.into_iter().chain(fold).collect();
    inputs.sort_by_key(|b| (b.min_time_ns, b.id));
    // Greedy bins of about target_cold output, bounded by the job limits.
    let mut bins: Vec<(Vec<&BlockInfo>, u64)> = vec![(Vec::new(), 0)];
    let mut job_bytes = 0u64;
    for b in inputs {
        let est = cold_estimate(b);
        let Some((bin, out)) = bins.last_mut() else { break };
        let full = !bin.is_empty()
            && (out.saturating_add(est) > rules.target_cold_bytes
                || bin.len() >= rules.max_inputs
                || job_bytes.saturating_add(hot_equivalent(b)) > rules.max_job_bytes);
        if full {
            bins.push((Vec::new(), 0));
            job_bytes = 0;
        }
        let Some((bin, out)) = bins.last_mut() else { break };
        bin.push(b);
        *out += est;
        job_bytes += hot_equivalent(b);
    }
    // A small last bin joins the one before when that stays near target.
    if bins.len() >= 2 {
        let (last, last_out) = bins[bins.len() - 1].clone();
        let (prev, prev_out) = &bins[bins.len() - 2];
        let joined_bytes: u64 = prev.iter().chain(&last).map(|b| hot_equivalent(b)).sum();
        if last_out < rules.target_cold_bytes / 4
            && prev_out + last_out <= rules.target_cold_bytes * 3 / 2
            && prev.len() + last.len() <= rules.max_inputs
            && joined_bytes <= rules.max_job_bytes
        {
            bins.pop();
            if let Some((prev, out)) = bins.last_mut() {
                prev.extend(last);
                *out += last_out;
            }
        }
    }
    // One cold block alone is already what a rewrite would make.
    bins.into_iter()
        .map(|(bin, _)| bin)
        .find(|bin| bin.len() > 1 || bin.iter().any(|b| b.level == Level::Hot))
        .map(|bin| bin.into_iter().cloned().collect())
}

#[cfg(test)]
mod tests;
