//! Planning a query: which blocks it reads. Published blocks come from the
//! catalog copy and are pruned by time, then by their sidecars before any
//! row section is fetched; the ingesters' recent blocks are merged under
//! the catalog-version contract of `proto/ingester.proto`. Candidates are
//! then read in [`Waves`] that grow, so a limit met early reads few blocks.
//! The limits a query is checked against live here too, and the
//! staleness guard: no plan from a catalog copy older than
//! `--catalog-max-staleness`.

use std::sync::Arc;

use mira_catalog::proto as cpb;
use mira_core::block::Block;
use mira_core::scan::{Predicate, probe};
use mira_core::sidecar::{PruneRule, Verdict};
use mira_core::{BlockId, Signal};

use crate::answer::Gaps;
use crate::stats::Stats;
use crate::{Querier, QueryError};

/// One block a query may read: published (in the object store) or recent
/// (an ingester's open block, whole in memory).
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Block id (published id, or the id a recent block will get).
    pub id: BlockId,
    pub min_time: u64,
    pub max_time: u64,
    pub src: Src,
}

#[derive(Debug, Clone)]
pub(crate) enum Src {
    Published { key: String },
    Recent(Arc<Block>),
}

/// The blocks a query reads and what may be missing from them.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub candidates: Vec<Candidate>,
    pub gaps: Gaps,
}

impl Querier {
    /// Checks a time range against the configured limit and the
    /// requesting tenant's `max_query_range` ([`crate::tenant_limits`]).
    pub(crate) fn check_range(&self, start: u64, end: u64) -> Result<(), QueryError> {
        if start > end {
            return Err(QueryError::BadRequest(format!(
                "time range start {start} is after its end {end}"
            )));
        }
        crate::tenant_limits::check_range(std::time::Duration::from_nanos(end - start))?;
        let max = self.config.max_range.as_nanos() as u64;
        if end - start > max {
            return Err(QueryError::TooBig(format!(
                "the time range covers {}s; the limit (--max-query-range) is {}s",
                (end - start) / 1_000_000_000,
                max / 1_000_000_000
            )));
        }
        Ok(())
    }

    /// Checks a `limit` against the configured maximum.
    pub(crate) fn check_limit(&self, limit: usize) -> Result<(), QueryError> {
        if limit == 0 || limit > self.config.max_limit {
            return Err(QueryError::TooBig(format!(
                "limit {limit} is outside 1..={} (--max-query-limit)",
                self.config.max_limit
            )));
        }
        Ok(())
    }

    /// Published blocks of the tenant/signal overlapping `[start, end)`,
    /// plus the ingesters' recent blocks not yet in the catalog copy.
    pub(crate) async fn plan(
        &self,
        tenant: &str,
        signal: Signal,
        start: u64,
        end: u64,
        stats: &Stats,
    ) -> Result<Plan, QueryError> {
        if self.mirror.wait_for(0, self.config.catalog_wait).await.is_none() {
            return Err(QueryError::Unavailable("the catalog has not answered yet".into()));
        }
        // A copy that has not heard from the catalog for long may list
        // blocks a compaction replaced and deleted since (the deletion
        // grace assumes plans are at most this old).
        let bound = self.config.max_staleness;
        if let Err(age) = self.mirror.wait_fresh(bound, self.config.catalog_wait).await {
            return Err(QueryError::StaleCatalog { age, bound });
        }
        let mut state = self.mirror.state();
        let mut plan = Plan::default();
        let now = self.now_ns();
        let (min, max) = (
            start.min(i64::MAX as u64) as i64,
            end.saturating_sub(1).min(i64::MAX as u64) as i64,
        );
        // The registered ingesters from the catalog itself (linearizable),
        // not the local copy, which may lag: an ingester registers before it
        // takes its first export, so every acknowledged row is on one asked
        // here. Those whose lease lapsed are asked too (a crashed ingester
        // keeps acknowledged rows in its WAL until it replays them; a lapse
        // may also be clock skew): no answer makes the result partial,
        // never silently short. Only a clean shutdown deregisters.
        let ingesters = match tokio::time::timeout(
            self.config.catalog_wait,
            self.catalog.list_ingesters(cpb::ListIngestersRequest {
                now_ns: now,
                linearizable: true,
                include_expired: true,
            }),
        )
        .await
        {
            Ok(Ok(reply)) => reply.ingesters,
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.config.catalog_wait),
                };
                plan.gaps.missing(format!(
                    "could not list live ingesters ({why}); recent data from the local catalog copy only"
                ));
                state.live_ingesters(i64::MIN)
            }
        };
        let replies = self
            .recent
            .ask(&ingesters, tenant, signal, min, max, self.config.recent_timeout, stats)
            .await;
        let mut recent = Vec::new();
        let mut need_version = 0;
        for (ingester, reply) in replies {
            match reply {
                Ok(r) => {
                    need_version = need_version.max(r.published_version);
                    recent.push(r);
                }
                Err(e) => {
                    plan.gaps
                        .missing(format!("ingester {ingester} did not answer for recent data: {e}"));
                }
            }
        }
        if need_version > state.version {
            match self.mirror.wait_for(need_version, self.config.catalog_wait).await {
                Some(s) => state = s,
                None => {
                    plan.gaps.missing(format!(
                        "the catalog copy did not reach version {need_version} in time; rows sealed meanwhile may be missing"
                    ));
                    // Recent blocks cannot be merged safely against an
                    // older view: leave them out rather than show rows twice.
                    recent.clear();
                }
            }
        }
        let offloaded = state.blocks_in(cpb::BlockState::Offloaded, tenant, signal, min, max);
        if !offloaded.is_empty() {
            stats.add_offloaded(offloaded.len() as u64);
            plan.gaps.note(offloaded_warning(tenant, signal, &offloaded));
        }
        let all = state.live_blocks(tenant, signal, 0, i64::MAX);
        stats.add_considered(all.len() as u64);
        for b in all {
            if b.max_time_ns < min || b.min_time_ns > max {
                stats.add_pruned(PruneRule::Time);
                continue;
            }
            let id: Result<BlockId, _> = b.id.parse();
            let id = id.map_err(|e| QueryError::Internal(format!("the catalog lists block {:?}: {e}", b.id)))?;
            plan.candidates.push(Candidate {
                id,
                min_time: b.min_time_ns.max(0) as u64,
                max_time: b.max_time_ns.max(0) as u64,
                src: Src::Published { key: b.object_key },
            });
        }
        if plan.candidates.len() > self.config.max_blocks {
            return Err(QueryError::TooBig(format!(
                "the query would read {} blocks; the limit (--max-query-blocks) is {}; narrow the time range",
                plan.candidates.len(),
                self.config.max_blocks
            )));
        }
        for reply in recent {
            for rb in reply.blocks {
                if state.blocks.contains_key(&rb.pending_block_id) {
                    continue;
                }
                let block = Block::from_bytes(rb.block.into(), self.cache.verify().clone()).map_err(|source| {
                    QueryError::RecentBlock {
                        block: rb.pending_block_id.clone(),
                        source,
                    }
                })?;
                let meta = block.meta().clone();
                if meta.max_time < start || meta.min_time >= end {
                    continue;
                }
                // An ingester names the id the rows will be published
                // under; the block carries it too.
                let id = if rb.pending_block_id.is_empty() {
                    meta.block_id
                } else {
                    rb.pending_block_id.parse().map_err(|e| {
                        QueryError::Internal(format!("recent block {:?} from an ingester: {e}", rb.pending_block_id))
                    })?
                };
                stats.add_recent(1);
                plan.candidates.push(Candidate {
                    id,
                    min_time: meta.min_time,
                    max_time: meta.max_time,
                    src: Src::Recent(Arc::new(block)),
                });
            }
        }
        Ok(plan)
    }

    /// Whether the block may hold a row matching `p`, from its sidecars
    /// (published blocks; recent ones are always read).
    pub(crate) async fn may_match(&self, c: &Candidate, p: &Predicate, stats: &Stats) -> Result<bool, QueryError> {
        let Src::Published { key } = &c.src else {
            return Ok(true);
        };
        let (manifest, sidecars) = self.published_sidecars(key, stats).await?;
        let meta = &manifest.meta;
        match sidecars.may_match(&probe(p), meta.min_time, meta.max_time) {
            Verdict::MayMatch => Ok(true),
            Verdict::Pruned(rule) => {
                stats.add_pruned(rule);
                Ok(false)
            }
        }
    }
}

/// Candidate blocks taken in waves that double in size: a query that a
/// limit satisfies early reads few blocks, one that must read every block
/// soon keeps the scan pool busy instead of waiting on small waves.
#[derive(Debug)]
pub(crate) struct Waves {
    next: usize,
    size: usize,
    len: usize,
}

/// Largest wave, blocks.
const MAX_WAVE: usize = 256;

/// Whether the `limit` newest of `found` (times of what a newest-first
/// search found so far) are final: nothing not yet read, of which the
/// newest is `horizon` (the next block's max time, a trace not yet read
/// whole), can be as new as the `limit`-th. Stopping only then makes a
/// limited answer depend on the rows alone, never on how they are split
/// into blocks (a compaction merges them; blocks overlap in time).
pub(crate) fn newest_settled(found: impl Iterator<Item = u64>, limit: usize, horizon: Option<u64>) -> bool {
    let mut times: Vec<u64> = found.collect();
    if limit == 0 || times.len() < limit {
        return false;
    }
    let (_, kth, _) = times.select_nth_unstable_by(limit - 1, |a, b| b.cmp(a));
    horizon.is_none_or(|h| *kth > h)
}

impl Waves {
    pub fn new(len: usize, threads: usize) -> Waves {
        Waves {
            next: 0,
            size: (threads * 2).max(4),
            len,
        }
    }

    /// Index of the first block the next wave would take.
    pub fn position(&self) -> usize {
        self.next
    }

    pub fn next_wave(&mut self) -> Option<std::ops::Range<usize>> {
        if self.next >= self.len {
            return None;
        }
        let r = self.next..(self.next + self.size).min(self.len);
        self.next = r.end;
        self.size = (self.size * 2).min(MAX_WAVE);
        Some(r)
    }
}

/// What a query over offloaded blocks says: how many, how big, and the
/// command that brings them back.
pub(crate) fn offloaded_warning(tenant: &str, signal: Signal, blocks: &[cpb::Block]) -> String {
    let rfc = |ns: i64| {
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64))
            .to_string()
    };
    let from = blocks.iter().map(|b| b.min_time_ns).min().unwrap_or(0);
    let to = blocks
        .iter()
        .map(|b| b.max_time_ns)
        .max()
        .unwrap_or(0)
        .saturating_add(1);
    let bytes: u64 = blocks.iter().map(|b| b.bytes).sum();
    format!(
        "{} blocks offloaded in range ({:.1} MiB, {} to {}) were not read; restore with `mira offload restore --tenant {tenant} --signal {} --from {} --to {}`",
        blocks.len(),
        bytes as f64 / (1 << 20) as f64,
        rfc(from),
        rfc(to),
        signal.as_str(),
        rfc(from),
        rfc(to),
    )
}

#[cfg(test)]
mod tests {
    use super::newest_settled;

    #[test]
    fn a_newest_first_search_is_settled_only_when_nothing_unread_can_be_newer() {
        // Too few found: never settled.
        assert!(!newest_settled([30, 20].into_iter(), 3, None));
        // Enough, nothing left: settled.
        assert!(newest_settled([30, 20, 10].into_iter(), 2, None));
        // The 2nd newest (20) is newer than anything left (15): settled.
        assert!(newest_settled([10, 30, 20].into_iter(), 2, Some(15)));
        // Something left could be newer (25), or as new (20): not yet.
        assert!(!newest_settled([10, 30, 20].into_iter(), 2, Some(25)));
        assert!(!newest_settled([10, 30, 20].into_iter(), 2, Some(20)));
    }
}
