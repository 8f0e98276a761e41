//! mira-querier: the read path.
//!
//! It owns query planning over a watch-maintained copy of the catalog
//! ([`mira_catalog::Mirror`]), pruning by block sidecars before any row
//! section is fetched, the local block cache ([`cache`]), scans on a
//! dedicated CPU pool, the merge with ingesters' recent (unpublished) data
//! under the catalog-version contract of `proto/ingester.proto`
//! ([`recent`]), the per-query counters ([`stats`]) and the native HTTP API
//! under `/api/mira/v1/` ([`api`]): logs ([`logs`]), traces ([`traces`]),
//! PromQL over metric points ([`promql`]) and labels ([`labels`]).

pub mod api;
pub mod cache;
pub mod error;
pub mod labels;
pub mod logs;
pub mod promql;
pub mod recent;
pub mod selector;
pub mod server;
pub mod settings;
pub mod stats;
pub mod traces;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use mira_catalog::{CatalogClient, Mirror, proto as cpb};
use mira_core::block::{Block, Manifest, decode_section};
use mira_core::convert::TableSet;
use mira_core::scan::{Predicate, ScanOutput, ScanRequest, probe, scan, tables_needed};
use mira_core::sidecar::{ATTR_INDEX_SECTION, ID_BLOOM_SECTION, PruneRule, Sidecars, Verdict, ZONE_MAP_SECTION};
use mira_core::tables::{read_tables, sidecars_from, table_from_batches};
use mira_core::{BlockId, Signal};
use object_store::ObjectStore;

pub use error::QueryError;
use stats::Stats;

/// Querier settings (the `mira querier` / `mira serve` flags).
#[derive(Debug, Clone)]
pub struct QuerierConfig {
    /// Directory of the block cache.
    pub cache_dir: PathBuf,
    /// Largest total size of cached sections, bytes.
    pub cache_bytes: u64,
    /// Most concurrent range GETs to the object store.
    pub max_fetches: usize,
    /// Threads of the scan pool.
    pub threads: usize,
    /// Most published blocks one query may read after pruning by time.
    pub max_blocks: usize,
    /// Longest time range one query may cover.
    pub max_range: Duration,
    /// Largest `limit` a query may ask for.
    pub max_limit: usize,
    /// How long an ingester may take to answer for its recent data.
    pub recent_timeout: Duration,
    /// How long to wait for the catalog copy to catch up.
    pub catalog_wait: Duration,
}

impl QuerierConfig {
    pub fn new(cache_dir: PathBuf) -> QuerierConfig {
        QuerierConfig {
            cache_dir,
            cache_bytes: 10 << 30,
            max_fetches: 32,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_blocks: 20_000,
            max_range: Duration::from_secs(31 * 24 * 3600),
            max_limit: 10_000,
            recent_timeout: Duration::from_secs(2),
            catalog_wait: Duration::from_secs(5),
        }
    }
}

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

/// The blocks a query reads and whether some data may be missing.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub candidates: Vec<Candidate>,
    pub partial: bool,
    pub warnings: Vec<String>,
}

/// The running querier, shared by every request.
#[derive(Debug)]
pub struct Querier {
    pub config: QuerierConfig,
    store: Arc<dyn ObjectStore>,
    catalog: Arc<CatalogClient>,
    mirror: Mirror,
    cache: cache::SectionCache,
    pool: rayon::ThreadPool,
    recent: recent::RecentClients,
}

impl Querier {
    pub fn new(
        config: QuerierConfig,
        store: Arc<dyn ObjectStore>,
        catalog: Arc<CatalogClient>,
    ) -> Result<Arc<Querier>, QueryError> {
        let cache = cache::SectionCache::open(&config.cache_dir, config.cache_bytes, config.max_fetches)
            .map_err(|e| QueryError::Internal(format!("block cache at {}: {e}", config.cache_dir.display())))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads.max(1))
            .thread_name(|i| format!("mira-scan-{i}"))
            .build()
            .map_err(|e| QueryError::Internal(format!("scan pool: {e}")))?;
        Ok(Arc::new(Querier {
            store,
            mirror: Mirror::start(catalog.clone()),
            catalog,
            cache,
            pool,
            recent: recent::RecentClients::default(),
            config,
        }))
    }

    pub fn cache(&self) -> &cache::SectionCache {
        &self.cache
    }

    /// True once the catalog copy holds a complete state.
    pub fn ready(&self) -> bool {
        self.mirror.state().synced
    }

    /// Runs CPU work on the scan pool and waits for it without holding a
    /// runtime worker.
    pub(crate) async fn on_pool<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.pool.spawn(move || {
            let _ = tx.send(f());
        });
        match rx.await {
            Ok(v) => v,
            // The closure panicked: surface it on this task.
            Err(_) => panic!("a scan task panicked"),
        }
    }

    /// Checks a time range against the configured limit.
    pub(crate) fn check_range(&self, start: u64, end: u64) -> Result<(), QueryError> {
        if start > end {
            return Err(QueryError::BadRequest(format!(
                "time range start {start} is after its end {end}"
            )));
        }
        let max = self.config.max_range.as_nanos() as u64;
        if end - start > max {
            return Err(QueryError::TooBig(format!(
                "the time range covers {}s; the limit (--max-query-range-h) is {}s",
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
        let Some(mut state) = self.mirror.wait_for(0, self.config.catalog_wait).await else {
            return Err(QueryError::Unavailable("the catalog has not answered yet".into()));
        };
        let mut plan = Plan::default();
        let now = now_ns();
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
                plan.partial = true;
                plan.warnings.push(format!(
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
                    plan.partial = true;
                    plan.warnings
                        .push(format!("ingester {ingester} did not answer for recent data: {e}"));
                }
            }
        }
        if need_version > state.version {
            match self.mirror.wait_for(need_version, self.config.catalog_wait).await {
                Some(s) => state = s,
                None => {
                    plan.partial = true;
                    plan.warnings.push(format!(
                        "the catalog copy did not reach version {need_version} in time; rows sealed meanwhile may be missing"
                    ));
                    // Recent blocks cannot be merged safely against an
                    // older view: leave them out rather than show rows twice.
                    recent.clear();
                }
            }
        }
        let all = state.live_blocks(tenant, signal, 0, i64::MAX);
        stats.add_considered(all.len() as u64);
        for b in all {
            if b.max_time_ns < min || b.min_time_ns > max {
                stats.add_pruned(PruneRule::Time);
                continue;
            }
            let id =
                b.id.parse()
                    .map_err(|e| QueryError::Internal(format!("the catalog lists block {:?}: {e}", b.id)))?;
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
                let block = Block::from_bytes(rb.block.into(), self.cache.verify().clone()).map_err(|e| {
                    QueryError::Internal(format!("recent block {} from an ingester: {e}", rb.pending_block_id))
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
        let manifest = self.manifest(key, stats).await?;
        let sidecars = self.sidecars(key, &manifest, stats).await?;
        let meta = &manifest.meta;
        match sidecars.may_match(&probe(p), meta.min_time, meta.max_time) {
            Verdict::MayMatch => Ok(true),
            Verdict::Pruned(rule) => {
                stats.add_pruned(rule);
                Ok(false)
            }
        }
    }

    async fn manifest(&self, key: &str, stats: &Stats) -> Result<Arc<Manifest>, QueryError> {
        self.cache
            .manifest(&self.store, key, stats)
            .await
            .map_err(|e| QueryError::block(key, e))
    }

    pub(crate) async fn sidecars(
        &self,
        key: &str,
        manifest: &Manifest,
        stats: &Stats,
    ) -> Result<Arc<Sidecars>, QueryError> {
        if let Some(s) = self.cache.sidecars.get(key) {
            return Ok(s);
        }
        let (zone, attrs) = futures::try_join!(
            self.cache.section(&self.store, key, manifest, ZONE_MAP_SECTION, stats),
            self.cache
                .section(&self.store, key, manifest, ATTR_INDEX_SECTION, stats),
        )
        .map_err(|e| QueryError::block(key, e))?;
        let ids = match manifest.section(ID_BLOOM_SECTION) {
            Some(_) => Some(
                self.cache
                    .section(&self.store, key, manifest, ID_BLOOM_SECTION, stats)
                    .await
                    .map_err(|e| QueryError::block(key, e))?,
            ),
            None => None,
        };
        let id = manifest.meta.block_id;
        let (zone_entry, attr_entry) = (
            section_entry(manifest, ZONE_MAP_SECTION)?,
            section_entry(manifest, ATTR_INDEX_SECTION)?,
        );
        let owned = key.to_owned();
        let sidecars = self
            .on_pool(move || {
                let zone = decode_section(id, &zone_entry, zone)?;
                let attrs = decode_section(id, &attr_entry, attrs)?;
                sidecars_from(zone, attrs, ids.as_deref())
            })
            .await
            .map_err(|e| QueryError::corrupt(&owned, e))?;
        let sidecars = Arc::new(sidecars);
        self.cache.sidecars.insert(key, sidecars.clone());
        Ok(sidecars)
    }

    /// Prunes `c` by its sidecars, then reads the tables `req` needs and
    /// scans them on the pool. `None` when the block was pruned.
    pub(crate) async fn scan_candidate(
        &self,
        c: &Candidate,
        signal: Signal,
        req: ScanRequest,
        stats: &Stats,
    ) -> Result<Option<ScanOutput>, QueryError> {
        if !self.may_match(c, &req.predicate, stats).await? {
            return Ok(None);
        }
        stats.add_fetched();
        let raw = self
            .raw_tables(c, &tables_needed(signal, &req.predicate), stats)
            .await?;
        let what = raw.what();
        // Decode and scan in one task on the pool.
        let out = self
            .on_pool(move || raw.decode().and_then(|tables| scan(&tables, &req)))
            .await
            .map_err(|e| match e {
                mira_core::Error::Scan(e) => QueryError::from(e),
                other => QueryError::corrupt(&what, other),
            })?;
        stats.add_rows(out.rows_scanned as u64);
        Ok(Some(out))
    }

    /// The tables a scan of `c` reads; counts the block as fetched.
    pub(crate) async fn scan_tables(
        &self,
        c: &Candidate,
        names: &[&'static str],
        stats: &Stats,
    ) -> Result<TableSet, QueryError> {
        stats.add_fetched();
        self.tables(c, names, stats).await
    }

    /// The named tables of a block: sections fetched (or mapped from the
    /// cache) concurrently, decoded on the scan pool.
    pub(crate) async fn tables(
        &self,
        c: &Candidate,
        names: &[&'static str],
        stats: &Stats,
    ) -> Result<TableSet, QueryError> {
        let raw = self.raw_tables(c, names, stats).await?;
        let what = raw.what();
        self.on_pool(move || raw.decode())
            .await
            .map_err(|e| QueryError::corrupt(&what, e))
    }

    /// The bytes of the named tables' sections, ready to decode.
    pub(crate) async fn raw_tables(
        &self,
        c: &Candidate,
        names: &[&'static str],
        stats: &Stats,
    ) -> Result<Raw, QueryError> {
        match &c.src {
            Src::Recent(block) => Ok(Raw::Recent {
                id: c.id,
                block: block.clone(),
                names: names.to_vec(),
            }),
            Src::Published { key } => {
                let manifest = self.manifest(key, stats).await?;
                let sections = try_join_all(
                    names
                        .iter()
                        .map(|name| self.cache.section(&self.store, key, &manifest, name, stats)),
                )
                .await
                .map_err(|e| QueryError::block(key, e))?;
                let mut parts = Vec::with_capacity(names.len());
                for (name, bytes) in names.iter().zip(sections) {
                    parts.push((*name, section_entry(&manifest, name)?, bytes));
                }
                Ok(Raw::Published {
                    key: key.clone(),
                    meta: manifest.meta.clone(),
                    parts,
                })
            }
        }
    }
}

/// Section bytes of some of a block's tables, fetched and verified but not
/// yet decoded (decoding is CPU work for the scan pool).
#[derive(Debug)]
pub(crate) enum Raw {
    Published {
        key: String,
        meta: mira_core::block::BlockMeta,
        parts: Vec<(&'static str, mira_core::block::SectionEntry, bytes::Bytes)>,
    },
    Recent {
        id: BlockId,
        block: Arc<Block>,
        names: Vec<&'static str>,
    },
}

impl Raw {
    /// The block, for error messages.
    pub fn what(&self) -> String {
        match self {
            Raw::Published { key, .. } => format!("block {key}"),
            Raw::Recent { id, .. } => format!("recent block {id}"),
        }
    }

    pub fn decode(self) -> Result<TableSet, mira_core::Error> {
        match self {
            Raw::Recent { block, names, .. } => read_tables(&block, Some(&names)),
            Raw::Published { meta, parts, .. } => {
                let mut tables = Vec::with_capacity(parts.len());
                for (name, entry, bytes) in parts {
                    let batches = decode_section(meta.block_id, &entry, bytes)?;
                    tables.push((name, table_from_batches(name, batches)?));
                }
                Ok(TableSet::from_tables(meta.signal, tables, meta.min_time, meta.max_time))
            }
        }
    }
}

fn section_entry(manifest: &Manifest, name: &str) -> Result<mira_core::block::SectionEntry, QueryError> {
    manifest
        .section(name)
        .map(|(_, e)| e.clone())
        .ok_or_else(|| QueryError::Internal(format!("block {} has no section {name:?}", manifest.meta.block_id)))
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
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

/// Groups values by block id, keeping first-seen order of ids.
pub(crate) fn group_by_block<T>(items: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for (id, item) in items {
        let i = *index.entry(id.clone()).or_insert_with(|| {
            out.push((id, Vec::new()));
            out.len() - 1
        });
        out[i].1.push(item);
    }
    out
}
