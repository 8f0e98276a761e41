//! Retention and offload: what the catalog's policies (validated bodies of
//! `mira_core::policy`, resolved in Loki's order) decide for each block,
//! and carrying it out (compactor-design.md §8–§9).
//!
//! - **Retention**: a block whose every resource's rows are past their
//!   rule is tombstoned whole (`TombstoneV2`, reason retention; its
//!   objects, offload copy included, are deleted after the deletion
//!   grace). A live block where only some resources' rows are past their
//!   rule gets a leased rewrite without those rows ([`RetentionCut`], a
//!   `ReplaceV2` with `dropped_rows`). A narrow block is rewritten once a
//!   resource's rows have all expired; a wide one (spanning over a day) as
//!   soon as any row has. Offloaded blocks are only dropped whole.
//! - **Offload**: a live cold block, created at least `--offload-min-age`
//!   ago, whose every resource resolves to an offload rule with the same
//!   target and is past that rule's `after`, is copied to the target
//!   (hashed), read back and proven by its length and SHA-256
//!   ([`crate::copy::verify_object`]), and marked offloaded
//!   (`MarkOffloadedV2`, whole batches, item by item on a conflict). Its
//!   primary object is deleted after the deletion grace, once the copy is
//!   proven again ([`crate::gc::free_primaries`]).
//! - Blocks a restore pinned are left alone until the pin passes.
//! - Tenant- or signal-only rules decide from the catalog's rows alone;
//!   with selector rules a block's resources are read once (the whole
//!   object) and kept by block id.
//! - Each policy's status (blocks matched, dropped, offloaded; rows and
//!   bytes; the last errors) goes to the catalog (`SetPolicyStatus`) when
//!   it changes, at most once a minute, for `mira policy list` and the
//!   operator. A `dry_run` policy reports what it would drop and drops
//!   nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use mira_catalog::ClientError;
use mira_catalog::proto as pb;
use mira_core::block::{Block, Level};
use mira_core::policy::{PolicyKind, Rule, RuleSet};
use object_store::path::Path;
use serde::Serialize;

use crate::Ctx;
use crate::copy::{copy_object, verify_object};
use crate::error::Error;
use crate::planner::{BlockInfo, BlockState, Job, JobKind, Partition};

const NANOS_PER_S: i64 = 1_000_000_000;
/// Blocks spanning more than this are "wide".
const WIDE_SPAN_NS: i64 = 24 * 3600 * NANOS_PER_S;
/// Most blocks per tombstone or mark command.
const BATCH: usize = 1000;
/// Blocks whose resources are kept in memory.
const RESOURCE_CACHE_BLOCKS: usize = 100_000;

/// The policies of one round.
#[derive(Debug, Default)]
pub struct Policies {
    pub retention: Arc<RuleSet>,
    pub offload: Arc<RuleSet>,
    /// Each policy's last reported status, by (kind, name).
    statuses: HashMap<(PolicyKind, String), PolicyStatus>,
    /// Policy bodies the catalog holds that this build cannot read.
    pub unreadable: Vec<String>,
}

impl Policies {
    pub fn is_empty(&self) -> bool {
        self.retention.is_empty() && self.offload.is_empty()
    }
}

/// What enforcing one policy did (shared with the operator, which reads
/// it back into its custom resources' status).
pub use mira_core::policy::PolicyStatus;

/// Reads the catalog's policies.
pub(crate) async fn load(ctx: &Arc<Ctx>) -> Result<Policies, Error> {
    let reply = ctx
        .catalog
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .map_err(|source| Error::Catalog {
            what: "list policies",
            partition: "*".to_owned(),
            source,
        })?;
    let mut retention = Vec::new();
    let mut offload = Vec::new();
    let mut out = Policies::default();
    for p in reply.policies {
        let kind = if p.kind == pb::PolicyKind::Offload as i32 {
            PolicyKind::Offload
        } else {
            PolicyKind::Retention
        };
        // Targets are checked when enforcing, so a rule naming a target
        // this compactor lacks is reported rather than ignored.
        match Rule::parse(kind, &p.name, &p.tenant, &p.body_json, None) {
            Ok(rule) => match kind {
                PolicyKind::Retention => retention.push(rule),
                PolicyKind::Offload => offload.push(rule),
            },
            Err(e) => out
                .unreadable
                .push(format!("{} policy {:?}: {e}", kind.as_str(), p.name)),
        }
        if let Ok(status) = serde_json::from_str::<PolicyStatus>(&p.status_json) {
            out.statuses.insert((kind, p.name), status);
        }
    }
    out.retention = Arc::new(RuleSet::new(retention));
    out.offload = Arc::new(RuleSet::new(offload));
    Ok(out)
}

/// One resource of a block: its attributes and its rows' time range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRows {
    pub attrs: Vec<(String, String)>,
    pub rows: u64,
    pub min_time_ns: i64,
    pub max_time_ns: i64,
}

/// Blocks' resources, read once per block (blocks never change).
#[derive(Debug, Default)]
pub struct ResourceCache(Mutex<HashMap<mira_core::ids::BlockId, Arc<Vec<ResourceRows>>>>);

impl ResourceCache {
    fn get(&self, id: &mira_core::ids::BlockId) -> Option<Arc<Vec<ResourceRows>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned()
    }

    fn put(&self, id: mira_core::ids::BlockId, v: Arc<Vec<ResourceRows>>) {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= RESOURCE_CACHE_BLOCKS {
            m.clear();
        }
        m.insert(id, v);
    }
}

async fn resources(ctx: &Arc<Ctx>, b: &BlockInfo) -> Result<Arc<Vec<ResourceRows>>, Error> {
    if let Some(v) = ctx.resources.get(&b.id) {
        return Ok(v);
    }
    let block = crate::job::fetch_block(ctx, b).await?;
    let id = b.id;
    let summaries = tokio::task::spawn_blocking(move || mira_core::compact::filter::resource_summaries(&block))
        .await
        .map_err(|e| Error::Internal(format!("resource summary task: {e}")))?
        .map_err(|e| Error::CorruptInput {
            id: id.to_string(),
            reason: e.to_string(),
        })?;
    let rows: Arc<Vec<ResourceRows>> = Arc::new(
        summaries
            .into_iter()
            .map(|s| ResourceRows {
                attrs: s.attrs,
                rows: s.rows,
                min_time_ns: i64::try_from(s.min_time).unwrap_or(i64::MAX),
                max_time_ns: i64::try_from(s.max_time).unwrap_or(i64::MAX),
            })
            .collect(),
    );
    ctx.resources.put(b.id, rows.clone());
    Ok(rows)
}

/// A retention rewrite's rules: a row is dropped when the retention rule
/// of its resource (resolved again when the job reads the block) puts it
/// before the cutoff at `now_ns`.
#[derive(Debug)]
pub struct RetentionCut {
    pub rules: Arc<RuleSet>,
    pub now_ns: i64,
}

impl PartialEq for RetentionCut {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rules, &other.rules) && self.now_ns == other.now_ns
    }
}

impl Eq for RetentionCut {}

impl RetentionCut {
    /// Which rows of `tables` (a block of `tenant`) the rewrite keeps.
    pub fn keep(&self, tenant: &str, tables: &mira_core::convert::TableSet) -> Result<Vec<bool>, mira_core::Error> {
        mira_core::compact::filter::keep_unexpired(tables, |attrs| {
            self.rules
                .resolve(PolicyKind::Retention, tenant, tables.signal, attrs)
                .and_then(|r| retain_cutoff(r, self.now_ns))
                .map(|c| u64::try_from(c).unwrap_or(0))
        })
    }
}

/// Most blocks one cold rewrite splits a partition into; resources of
/// further classes share the last one.
pub const MAX_CLASSES: usize = 4;

/// A resource's policy class: the retention and the offload rule that
/// decide for it (by name; `None`: kept forever / never offloaded).
pub type Class = (Option<String>, Option<String>);

/// A cold rewrite's split by policy class (design §8.4): when selector
/// rules apply to a tenant and signal, the rewrite writes one block per
/// class, so retention and offload later take whole blocks instead of
/// rewriting rows.
#[derive(Debug)]
pub struct ClassSplit {
    pub retention: Arc<RuleSet>,
    pub offload: Arc<RuleSet>,
}

impl PartialEq for ClassSplit {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.retention, &other.retention) && Arc::ptr_eq(&self.offload, &other.offload)
    }
}

impl Eq for ClassSplit {}

impl ClassSplit {
    fn class_of(&self, tenant: &str, signal: mira_core::Signal, attrs: &[(String, String)]) -> Class {
        (
            self.retention
                .resolve(PolicyKind::Retention, tenant, signal, attrs)
                .map(|r| r.name.clone()),
            self.offload
                .resolve(PolicyKind::Offload, tenant, signal, attrs)
                .map(|r| r.name.clone()),
        )
    }

    /// The classes of the inputs' resources that hold rows, in the order
    /// first met; the job writes one block for each of the first
    /// [`MAX_CLASSES`] (the last of them also takes every later class).
    pub fn classes(&self, tenant: &str, inputs: &[Block]) -> Result<Vec<Class>, mira_core::Error> {
        let mut out: Vec<Class> = Vec::new();
        for b in inputs {
            for r in mira_core::compact::filter::resource_summaries(b)? {
                let class = self.class_of(tenant, b.meta().signal, &r.attrs);
                if r.rows > 0 && !out.contains(&class) {
                    out.push(class);
                }
            }
        }
        Ok(out)
    }

    /// Which root rows of `tables` go to the block of `class` (`classes`
    /// as [`ClassSplit::classes`] found them).
    pub fn rows_of(
        &self,
        tenant: &str,
        tables: &mira_core::convert::TableSet,
        class: &Class,
        classes: &[Class],
    ) -> Result<Vec<bool>, mira_core::Error> {
        let bucket = |c: &Class| {
            classes
                .iter()
                .position(|x| x == c)
                .map_or(MAX_CLASSES - 1, |i| i.min(MAX_CLASSES - 1))
        };
        let want = bucket(class);
        let per_resource: Vec<bool> = mira_core::compact::filter::resource_attributes(tables)?
            .iter()
            .map(|a| bucket(&self.class_of(tenant, tables.signal, a)) == want)
            .collect();
        Ok(mira_core::compact::filter::row_resources(tables)?
            .iter()
            .map(|&r| per_resource.get(r as usize).copied().unwrap_or(false))
            .collect())
    }
}

/// The class split for cold rewrites of `tenant`'s `signal`, when selector
/// rules make classes differ between its resources.
pub(crate) fn split_for(policies: &Policies, tenant: &str, signal: mira_core::Signal) -> Option<Arc<ClassSplit>> {
    let selectors = policies
        .retention
        .needs_resources(PolicyKind::Retention, tenant, signal)
        || policies.offload.needs_resources(PolicyKind::Offload, tenant, signal);
    selectors.then(|| {
        Arc::new(ClassSplit {
            retention: policies.retention.clone(),
            offload: policies.offload.clone(),
        })
    })
}

/// What one lifecycle pass decided and did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LifecycleReport {
    pub dropped_blocks: usize,
    pub rewrites: usize,
    pub offloaded_blocks: usize,
    pub offloaded_bytes: u64,
    pub errors: Vec<String>,
}

/// Per policy, this run's tallies.
#[derive(Default)]
struct Tally(BTreeMap<(PolicyKind, String), PolicyStatus>);

impl Tally {
    fn of(&mut self, kind: PolicyKind, rule: &Rule) -> &mut PolicyStatus {
        self.0.entry((kind, rule.name.clone())).or_insert_with(|| PolicyStatus {
            generation: rule.body.source.as_ref().and_then(|s| s.generation),
            ..PolicyStatus::default()
        })
    }

    fn error(&mut self, kind: PolicyKind, rule: &Rule, e: String) {
        let s = self.of(kind, rule);
        if s.errors.len() < 5 {
            s.errors.push(e);
        }
    }
}

/// The verdict of the retention rules on one block.
enum Retain<'a> {
    Keep,
    /// Every row is past its rule; the rule deciding each resource's rows.
    DropWhole(Vec<(&'a Rule, u64)>),
    /// Some resources' rows go.
    Cut(RetentionCut, Vec<(&'a Rule, u64)>),
}

fn retain_cutoff(rule: &Rule, now_ns: i64) -> Option<i64> {
    let s = i64::try_from(rule.body.retain_s?).ok()?;
    Some(now_ns.saturating_sub(s.saturating_mul(NANOS_PER_S)))
}

async fn retention_verdict<'a>(
    ctx: &Arc<Ctx>,
    rules: &'a Arc<RuleSet>,
    b: &BlockInfo,
    now_ns: i64,
) -> Result<Retain<'a>, Error> {
    let (tenant, signal) = (b.tenant.as_str(), b.signal);
    if !rules.needs_resources(PolicyKind::Retention, tenant, signal) {
        let Some(rule) = rules.resolve_default(PolicyKind::Retention, tenant, signal) else {
            return Ok(Retain::Keep);
        };
        return Ok(match retain_cutoff(rule, now_ns) {
            Some(c) if b.max_time_ns < c => Retain::DropWhole(vec![(rule, b.rows)]),
            _ => Retain::Keep,
        });
    }
    // Nothing can have expired before the shortest rule that could apply.
    let shortest = rules
        .rules(PolicyKind::Retention)
        .filter(|r| r.applies_to(tenant, signal))
        .filter_map(|r| retain_cutoff(r, now_ns))
        .max();
    if shortest.is_none_or(|c| b.min_time_ns >= c) {
        return Ok(Retain::Keep);
    }
    let res = resources(ctx, b).await?;
    let decided: Vec<(Option<&Rule>, &ResourceRows)> = res
        .iter()
        .map(|r| (rules.resolve(PolicyKind::Retention, tenant, signal, &r.attrs), r))
        .collect();
    let expired = |rule: Option<&Rule>, r: &ResourceRows| {
        rule.and_then(|x| retain_cutoff(x, now_ns))
            .is_some_and(|c| r.max_time_ns < c)
    };
    if decided.iter().all(|(rule, r)| expired(*rule, r)) {
        return Ok(Retain::DropWhole(
            decided
                .iter()
                .filter_map(|(rule, r)| rule.map(|x| (x, r.rows)))
                .collect(),
        ));
    }
    let wide = b.max_time_ns - b.min_time_ns > WIDE_SPAN_NS;
    let cut_due = decided.iter().any(|(rule, r)| {
        let cutoff = rule.and_then(|x| retain_cutoff(x, now_ns));
        cutoff.is_some_and(|c| if wide { r.min_time_ns < c } else { r.max_time_ns < c })
    });
    if !cut_due || b.state != BlockState::Live {
        return Ok(Retain::Keep);
    }
    let cut = RetentionCut {
        rules: rules.clone(),
        now_ns,
    };
    let by_rule = decided
        .iter()
        .filter(|(rule, r)| expired(*rule, r))
        .filter_map(|(rule, r)| rule.map(|x| (x, r.rows)))
        .collect();
    Ok(Retain::Cut(cut, by_rule))
}

/// Where one block goes, if an offload rule says so now.
async fn offload_target<'a>(
    ctx: &Arc<Ctx>,
    rules: &'a RuleSet,
    b: &BlockInfo,
    now_ns: i64,
) -> Result<Option<&'a Rule>, Error> {
    let (tenant, signal) = (b.tenant.as_str(), b.signal);
    let due = |rule: &Rule, max_time: i64| {
        rule.body
            .after_s
            .and_then(|s| i64::try_from(s).ok())
            .is_some_and(|s| max_time < now_ns.saturating_sub(s.saturating_mul(NANOS_PER_S)))
    };
    if !rules.needs_resources(PolicyKind::Offload, tenant, signal) {
        return Ok(rules
            .resolve_default(PolicyKind::Offload, tenant, signal)
            .filter(|r| due(r, b.max_time_ns)));
    }
    let res = resources(ctx, b).await?;
    let mut chosen: Option<&Rule> = None;
    for r in res.iter() {
        let Some(rule) = rules.resolve(PolicyKind::Offload, tenant, signal, &r.attrs) else {
            return Ok(None);
        };
        if !due(rule, r.max_time_ns) || chosen.is_some_and(|c| c.body.target != rule.body.target) {
            return Ok(None);
        }
        chosen = chosen.or(Some(rule));
    }
    Ok(chosen)
}

/// One pass over every block: drops, retention rewrites (returned as jobs
/// for the round to run) and offloads.
pub(crate) async fn run(ctx: &Arc<Ctx>, blocks: &[BlockInfo], policies: &Policies) -> (LifecycleReport, Vec<Job>) {
    let now_ns = ctx.clock.now_ns();
    let mut report = LifecycleReport {
        errors: policies.unreadable.clone(),
        ..LifecycleReport::default()
    };
    let mut tally = Tally::default();
    let mut jobs = Vec::new();
    if policies.is_empty() {
        return (report, jobs);
    }
    let mut drops: Vec<(&BlockInfo, Vec<(&Rule, u64)>)> = Vec::new();
    let mut offloads: Vec<(&BlockInfo, &Rule)> = Vec::new();
    for b in blocks {
        if matches!(b.state, BlockState::Tombstoned { .. }) || b.pinned(now_ns) {
            continue;
        }
        match retention_verdict(ctx, &policies.retention, b, now_ns).await {
            Ok(Retain::Keep) => {}
            Ok(Retain::DropWhole(by_rule)) => {
                let dry = by_rule.iter().any(|(r, _)| r.body.dry_run);
                for (rule, rows) in &by_rule {
                    let s = tally.of(PolicyKind::Retention, rule);
                    s.blocks_matched += 1;
                    if dry {
                        s.would_drop_blocks += 1;
                        s.would_drop_rows += rows;
                    }
                }
                if !dry {
                    drops.push((b, by_rule));
                }
                continue;
            }
            Ok(Retain::Cut(cut, by_rule)) => {
                let dry = by_rule.iter().any(|(r, _)| r.body.dry_run);
                for (rule, rows) in &by_rule {
                    let s = tally.of(PolicyKind::Retention, rule);
                    s.blocks_matched += 1;
                    if dry {
                        s.would_drop_rows += rows;
                    }
                }
                if !dry {
                    jobs.push(Job {
                        kind: JobKind::Retention,
                        partition: Partition::of(b),
                        inputs: vec![b.clone()],
                        cut: Some(Arc::new(cut)),
                        split: None,
                    });
                }
                continue;
            }
            Err(e) => {
                report.errors.push(format!("retention of block {}: {e}", b.id));
                continue;
            }
        }
        if b.state != BlockState::Live
            || b.level != Level::Cold
            || b.created_at_ns.saturating_add(ctx.config.offload.min_age_ns) > now_ns
            || policies.offload.is_empty()
        {
            continue;
        }
        match offload_target(ctx, &policies.offload, b, now_ns).await {
            Ok(Some(rule)) => {
                tally.of(PolicyKind::Offload, rule).blocks_matched += 1;
                if !rule.body.dry_run {
                    offloads.push((b, rule));
                }
            }
            Ok(None) => {}
            Err(e) => report.errors.push(format!("offload of block {}: {e}", b.id)),
        }
    }
    let blocks: Vec<&BlockInfo> = drops.iter().map(|(b, _)| *b).collect();
    let failed = drop_blocks(ctx, &blocks, now_ns, &mut report).await;
    for (b, by_rule) in drops.into_iter().filter(|(b, _)| !failed.contains(&b.id)) {
        report.dropped_blocks += 1;
        for (rule, rows) in by_rule {
            let s = tally.of(PolicyKind::Retention, rule);
            s.blocks_dropped += 1;
            s.rows_dropped += rows;
            s.bytes_dropped += b.bytes.saturating_mul(rows) / b.rows.max(1);
        }
    }
    offload_blocks(ctx, &offloads, &mut tally, &mut report).await;
    report.rewrites = jobs.len();
    write_statuses(ctx, policies, tally, now_ns).await;
    (report, jobs)
}

/// Tombstones `blocks` for retention, in batches; a batch refused (a block
/// pinned or changed meanwhile) is retried block by block. Returns the
/// blocks not tombstoned.
async fn drop_blocks(
    ctx: &Arc<Ctx>,
    blocks: &[&BlockInfo],
    now_ns: i64,
    report: &mut LifecycleReport,
) -> std::collections::HashSet<mira_core::ids::BlockId> {
    let mut failed = std::collections::HashSet::new();
    for batch in blocks.chunks(BATCH) {
        let ids: Vec<String> = batch.iter().map(|b| b.id.to_string()).collect();
        match ctx
            .pacer
            .run(
                ctx.catalog
                    .tombstone_v2(ids.clone(), now_ns, pb::TombstoneReason::Retention),
            )
            .await
        {
            Ok(_) => {}
            Err(ClientError::Rejected(_)) => {
                for b in batch {
                    if let Err(e) = ctx
                        .catalog
                        .tombstone_v2(vec![b.id.to_string()], now_ns, pb::TombstoneReason::Retention)
                        .await
                    {
                        report.errors.push(format!("drop {}: {e}", b.id));
                        failed.insert(b.id);
                    }
                }
            }
            Err(e) => {
                report.errors.push(format!("drop {} blocks: {e}", batch.len()));
                failed.extend(batch.iter().map(|b| b.id));
            }
        }
    }
    ctx.metrics
        .retention_dropped_blocks
        .inc_by((blocks.len() - failed.len()) as u64);
    failed
}

/// Copies each block to its rule's target and marks the copies.
async fn offload_blocks(ctx: &Arc<Ctx>, todo: &[(&BlockInfo, &Rule)], tally: &mut Tally, report: &mut LifecycleReport) {
    let rate = Arc::new(crate::copy::RateLimit::new(ctx.config.offload.rate_bytes));
    // Owned per copy, so the copies run as tasks of their own.
    let copies: Vec<(usize, BlockInfo, String)> = todo
        .iter()
        .enumerate()
        .map(|(i, (b, rule))| (i, (*b).clone(), rule.body.target.clone().unwrap_or_default()))
        .collect();
    let results: Vec<(usize, Result<pb::OffloadItem, Error>)> = futures::stream::iter(copies)
        .map(|(i, b, target)| {
            let (ctx, rate) = (ctx.clone(), rate.clone());
            async move { (i, offload_one(&ctx, &b, &target, &rate).await) }
        })
        .buffer_unordered(ctx.config.offload.concurrency.max(1))
        .collect()
        .await;
    let mut items = Vec::new();
    for (i, r) in results {
        let (b, rule) = todo[i];
        match r {
            Ok(item) => items.push((item, b, rule)),
            Err(e) => {
                tally.error(PolicyKind::Offload, rule, format!("block {}: {e}", b.id));
                report.errors.push(format!("offload of block {}: {e}", b.id));
            }
        }
    }
    crate::job::fault_point("after_offload_copy");
    for batch in items.chunks(BATCH) {
        let marked: Vec<&(pb::OffloadItem, &BlockInfo, &Rule)> = match ctx
            .pacer
            .run(
                ctx.catalog
                    .mark_offloaded_v2(batch.iter().map(|(i, _, _)| i.clone()).collect()),
            )
            .await
        {
            Ok(_) => batch.iter().collect(),
            Err(ClientError::Rejected(_)) => {
                let mut ok = Vec::new();
                for entry in batch {
                    match ctx.catalog.mark_offloaded_v2(vec![entry.0.clone()]).await {
                        Ok(_) => ok.push(entry),
                        Err(e) => report.errors.push(format!("mark {} offloaded: {e}", entry.0.id)),
                    }
                }
                ok
            }
            Err(e) => {
                report
                    .errors
                    .push(format!("mark {} blocks offloaded: {e}", batch.len()));
                Vec::new()
            }
        };
        for (_, b, rule) in marked {
            let s = tally.of(PolicyKind::Offload, rule);
            s.blocks_offloaded += 1;
            s.bytes_offloaded += b.bytes;
            report.offloaded_blocks += 1;
            report.offloaded_bytes += b.bytes;
            ctx.metrics.offloaded_blocks.inc();
            ctx.metrics.offloaded_bytes.inc_by(b.bytes);
        }
    }
}

/// Copies one block to its target (or finds the copy a restore left
/// there, proven by its content) and returns what to mark. The copy
/// written is read back and proven ([`verify_object`]) before it is
/// marked; a copy left by an attempt that crashed before its mark is not
/// reused but written again (its hash was never recorded).
async fn offload_one(
    ctx: &Arc<Ctx>,
    b: &BlockInfo,
    name: &str,
    rate: &crate::copy::RateLimit,
) -> Result<pb::OffloadItem, Error> {
    let target = ctx.targets.get(name).ok_or_else(|| {
        Error::Internal(format!(
            "offload target {name:?} is not configured on this compactor (--offload-target)"
        ))
    })?;
    let location = target.location(&b.object_key);
    let dst = Path::from(b.object_key.as_str());
    let now = ctx.clock.now_ns();
    // Offloaded before and restored since: the copy is still there, if it
    // is still the bytes the catalog recorded; otherwise it is rewritten
    // from the primary (checked against the same hash).
    let recorded = b
        .offload
        .as_ref()
        .filter(|c| c.location == location && !c.sha256.is_empty())
        .map(|c| c.sha256.as_str());
    if let Some(sha256) = recorded {
        match verify_object(&target.store, &dst, (b.bytes, sha256)).await {
            Ok(()) => {
                return Ok(pb::OffloadItem {
                    id: b.id.to_string(),
                    location,
                    sha256: sha256.to_owned(),
                    at_ns: now,
                });
            }
            Err(failed) => {
                ctx.metrics.verify_failed("existing", failed.reason);
                tracing::warn!(target: "mira::compactor", block = %b.id, reason = %failed, "the block's existing offload copy failed its check; writing it again");
            }
        }
    }
    let src = Path::from(b.object_key.as_str());
    let copied = copy_object((&ctx.store, &src), (&target.store, &dst), (b.bytes, recorded), rate).await?;
    crate::job::fault_point("during_offload");
    if let Err(failed) = verify_object(&target.store, &dst, (copied.bytes, &copied.sha256)).await {
        ctx.metrics.verify_failed("written", failed.reason);
        return Err(failed.into_error(&location));
    }
    Ok(pb::OffloadItem {
        id: b.id.to_string(),
        location,
        sha256: copied.sha256,
        at_ns: now,
    })
}

/// Writes each policy's status when it changed (counts added to the last
/// reported ones), at most once a minute per policy.
async fn write_statuses(ctx: &Arc<Ctx>, policies: &Policies, tally: Tally, now_ns: i64) {
    let all = policies
        .retention
        .rules(PolicyKind::Retention)
        .map(|r| (PolicyKind::Retention, r))
        .chain(
            policies
                .offload
                .rules(PolicyKind::Offload)
                .map(|r| (PolicyKind::Offload, r)),
        );
    let mut tally = tally.0;
    for (kind, rule) in all {
        let key = (kind, rule.name.clone());
        let run = tally.remove(&key).unwrap_or_else(|| PolicyStatus {
            generation: rule.body.source.as_ref().and_then(|s| s.generation),
            ..PolicyStatus::default()
        });
        let last = policies.statuses.get(&key).cloned().unwrap_or_default();
        let next = PolicyStatus {
            generation: run.generation,
            last_run_ns: now_ns,
            blocks_matched: run.blocks_matched,
            blocks_dropped: last.blocks_dropped + run.blocks_dropped,
            rows_dropped: last.rows_dropped + run.rows_dropped,
            bytes_dropped: last.bytes_dropped + run.bytes_dropped,
            blocks_offloaded: last.blocks_offloaded + run.blocks_offloaded,
            bytes_offloaded: last.bytes_offloaded + run.bytes_offloaded,
            would_drop_blocks: run.would_drop_blocks,
            would_drop_rows: run.would_drop_rows,
            errors: run.errors,
        };
        let changed = PolicyStatus {
            last_run_ns: last.last_run_ns,
            ..next.clone()
        } != last;
        let due = {
            let mut written = ctx.status_written.lock().unwrap_or_else(PoisonError::into_inner);
            let due = changed || written.get(&key).is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
            if due {
                written.insert(key.clone(), Instant::now());
            }
            due
        };
        if !due {
            continue;
        }
        let pb_kind = match kind {
            PolicyKind::Retention => pb::PolicyKind::Retention,
            PolicyKind::Offload => pb::PolicyKind::Offload,
        };
        let json = serde_json::to_string(&next).unwrap_or_default();
        if let Err(e) = ctx.catalog.set_policy_status(pb_kind, &rule.name, json).await {
            tracing::warn!(target: "mira::compactor", policy = %rule.name, error = %e, "could not report a policy's status");
        }
    }
}
