//! Per-query counters, returned as `stats` in every response: what was
//! planned, pruned (by which rule), fetched, verified and scanned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mira_core::sidecar::PruneRule;
use serde::Serialize;

/// Shared by the tasks of one query.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    blocks_considered: AtomicU64,
    pruned: [AtomicU64; 4],
    blocks_fetched: AtomicU64,
    sections_verified: AtomicU64,
    bytes_from_store: AtomicU64,
    bytes_from_cache: AtomicU64,
    rows_scanned: AtomicU64,
    recent_blocks: AtomicU64,
    ingesters_asked: AtomicU64,
    blocks_offloaded: AtomicU64,
    result_cache_hits: AtomicU64,
    result_cache_misses: AtomicU64,
    result_cache_bytes: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            blocks_considered: AtomicU64::new(0),
            pruned: Default::default(),
            blocks_fetched: AtomicU64::new(0),
            sections_verified: AtomicU64::new(0),
            bytes_from_store: AtomicU64::new(0),
            bytes_from_cache: AtomicU64::new(0),
            rows_scanned: AtomicU64::new(0),
            recent_blocks: AtomicU64::new(0),
            ingesters_asked: AtomicU64::new(0),
            blocks_offloaded: AtomicU64::new(0),
            result_cache_hits: AtomicU64::new(0),
            result_cache_misses: AtomicU64::new(0),
            result_cache_bytes: AtomicU64::new(0),
        }
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Stats {
    pub fn add_considered(&self, n: u64) {
        add(&self.blocks_considered, n);
    }

    pub fn add_pruned(&self, rule: PruneRule) {
        let i = PruneRule::ALL.iter().position(|r| *r == rule).unwrap_or(0);
        add(&self.pruned[i], 1);
    }

    pub fn add_fetched(&self) {
        add(&self.blocks_fetched, 1);
    }

    pub fn add_verified(&self) {
        add(&self.sections_verified, 1);
    }

    pub fn add_store_bytes(&self, n: u64) {
        add(&self.bytes_from_store, n);
    }

    /// Bytes read from the disk cache; `verified` when they were hashed now.
    pub fn add_cache_bytes(&self, n: u64, verified: bool) {
        add(&self.bytes_from_cache, n);
        if verified {
            self.add_verified();
        }
    }

    pub fn add_rows(&self, n: u64) {
        add(&self.rows_scanned, n);
    }

    pub fn add_recent(&self, n: u64) {
        add(&self.recent_blocks, n);
    }

    pub fn add_ingester(&self) {
        add(&self.ingesters_asked, 1);
    }

    /// Blocks in the query's range that are offloaded (not read).
    pub fn add_offloaded(&self, n: u64) {
        add(&self.blocks_offloaded, n);
    }

    /// A block's result served by the result cache (`bytes`: its entry).
    pub fn add_result_hit(&self, bytes: u64) {
        add(&self.result_cache_hits, 1);
        add(&self.result_cache_bytes, bytes);
    }

    /// A block's result the result cache did not hold.
    pub fn add_result_miss(&self) {
        add(&self.result_cache_misses, 1);
    }

    pub fn snapshot(&self) -> StatsJson {
        let pruned = |r: PruneRule| get(&self.pruned[PruneRule::ALL.iter().position(|x| *x == r).unwrap_or(0)]);
        StatsJson {
            blocks_considered: get(&self.blocks_considered),
            blocks_pruned: Pruned {
                time: pruned(PruneRule::Time),
                zone_map: pruned(PruneRule::ZoneMap),
                attr_index: pruned(PruneRule::AttrIndex),
                bloom: pruned(PruneRule::Bloom),
            },
            blocks_fetched: get(&self.blocks_fetched),
            sections_verified: get(&self.sections_verified),
            bytes_from_store: get(&self.bytes_from_store),
            bytes_from_cache: get(&self.bytes_from_cache),
            rows_scanned: get(&self.rows_scanned),
            recent_blocks: get(&self.recent_blocks),
            ingesters_asked: get(&self.ingesters_asked),
            blocks_offloaded: get(&self.blocks_offloaded),
            result_cache_hits: get(&self.result_cache_hits),
            result_cache_misses: get(&self.result_cache_misses),
            result_cache_bytes: get(&self.result_cache_bytes),
            elapsed_us: self.started.elapsed().as_micros() as u64,
        }
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Pruned {
    pub time: u64,
    pub zone_map: u64,
    pub attr_index: u64,
    pub bloom: u64,
}

/// The JSON form.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct StatsJson {
    /// Published blocks of the tenant and signal the plan looked at.
    pub blocks_considered: u64,
    pub blocks_pruned: Pruned,
    /// Blocks whose rows were read: from their row sections, or (the
    /// `result_cache_hits` among them) from the result cache.
    pub blocks_fetched: u64,
    /// Sections CRC-checked by this query (others were checked before).
    pub sections_verified: u64,
    pub bytes_from_store: u64,
    pub bytes_from_cache: u64,
    pub rows_scanned: u64,
    /// Open (unpublished) blocks merged from ingesters.
    pub recent_blocks: u64,
    pub ingesters_asked: u64,
    /// Blocks in the range that are offloaded to a second store: not read
    /// (the warnings say how to restore them).
    #[serde(default)]
    pub blocks_offloaded: u64,
    /// Blocks whose result came from the result cache (their predicate
    /// was not evaluated again).
    #[serde(default)]
    pub result_cache_hits: u64,
    /// Published blocks whose result the result cache did not hold.
    #[serde(default)]
    pub result_cache_misses: u64,
    /// Bytes of the result cache entries the hits used.
    #[serde(default)]
    pub result_cache_bytes: u64,
    pub elapsed_us: u64,
}
