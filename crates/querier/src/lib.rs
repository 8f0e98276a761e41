//! mira-querier: the read path.
//!
//! The crate root holds the [`Querier`] (its runtime config, built from
//! what an operator configures, [`settings`]; the scan pool) and the
//! query stages: `plan` decides which blocks a query reads (the
//! watch-maintained catalog copy, [`mira_catalog::Mirror`], the ingesters'
//! recent data, [`recent`], pruning by time and by block sidecars, waves),
//! `blocks` reads a block (manifest, sidecars, sections through the
//! local block cache, [`cache`]; decode and scan on the pool), and every
//! query answers one [`Answer`] shape ([`answer`]) with its counters
//! ([`stats`]); what a published block gave a query is kept in the
//! result cache ([`results`]), so a repeated query skips the block's
//! predicate evaluation. On top sit the queries: logs ([`logs`]), traces
//! ([`traces`]), PromQL over metric points ([`promql`]) and labels
//! ([`labels`]), served by the native HTTP API under `/api/mira/v1/`
//! ([`api`]), by Prometheus' HTTP API under `/api/v1/` ([`prom_api`]) and
//! by Tempo's trace-by-id and tag endpoints ([`tempo_api`]); [`server`]
//! puts them and the process's probes on one port. Every query endpoint
//! runs under one layer ([`attempt`]): the query timeout, and one re-plan
//! when a compaction deleted a planned block; planning refuses a catalog
//! copy that has not heard from the catalog for too long.

pub mod answer;
pub mod api;
pub mod attempt;
mod blocks;
pub mod cache;
pub mod error;
pub mod labels;
pub mod logql;
pub mod logs;
pub mod loki_api;
mod parse_error;
mod plan;
pub mod pool;
pub mod prom_api;
pub mod promql;
pub mod recent;
pub mod results;
pub mod selector;
pub mod server;
pub mod settings;
pub mod stats;
pub mod tempo_api;
mod tenant_limits;
pub mod traceql;
pub mod traces;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::{CatalogClient, Mirror};
use mira_common::clock::Clock;
use object_store::ObjectStore;

pub use answer::Answer;
pub use error::QueryError;

/// Querier settings (the `mira querier` / `mira serve` flags).
#[derive(Debug, Clone)]
pub struct QuerierConfig {
    /// Directory of the block cache.
    pub cache_dir: PathBuf,
    /// Largest total size of cached sections, bytes.
    pub cache_bytes: u64,
    /// Largest total size of decoded tables kept in memory, bytes.
    pub decoded_cache_bytes: u64,
    /// Largest total size of per-block query results kept in memory,
    /// bytes (0: none; [`results`]).
    pub result_cache_bytes: u64,
    /// Most concurrent range GETs to the object store.
    pub max_fetches: usize,
    /// Threads of the scan pool.
    pub threads: usize,
    /// Most scan pool threads one tenant's jobs hold at once; `None`:
    /// half the pool, rounded up.
    pub tenant_threads: Option<usize>,
    /// Most published blocks one query may read after pruning by time.
    pub max_blocks: usize,
    /// Longest time range one query may cover.
    pub max_range: Duration,
    /// Largest `limit` a query may ask for.
    pub max_limit: usize,
    /// Most series one PromQL query may select (then 422).
    pub max_series: usize,
    /// Most samples one PromQL query may load in its window (then 422).
    pub max_samples: usize,
    /// Most spans of one trace a TraceQL search evaluates (then 422).
    pub max_spans_per_trace: usize,
    /// Most live tails the querier runs at once, all tenants together.
    pub max_tails: usize,
    /// Longest a live tail runs before it is closed (1000).
    pub tail_max_duration: Duration,
    /// Longest a live tail runs without a line to send before it is
    /// closed (1000).
    pub tail_idle_timeout: Duration,
    /// How long an ingester may take to answer for its recent data.
    pub recent_timeout: Duration,
    /// How long to wait for the catalog copy to catch up (or for a fresh
    /// update when it is stale).
    pub catalog_wait: Duration,
    /// Longest a query may run (then 504).
    pub query_timeout: Duration,
    /// Oldest the catalog copy's last update may be when planning.
    pub max_staleness: Duration,
}

impl QuerierConfig {
    pub fn new(cache_dir: PathBuf) -> QuerierConfig {
        QuerierConfig {
            cache_dir,
            cache_bytes: 10 << 30,
            decoded_cache_bytes: 1 << 30,
            result_cache_bytes: 256 << 20,
            max_fetches: 32,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            tenant_threads: None,
            max_blocks: 20_000,
            max_range: Duration::from_secs(31 * 24 * 3600),
            max_limit: 10_000,
            max_series: 500_000,
            max_samples: 50_000_000,
            max_spans_per_trace: 100_000,
            max_tails: 100,
            tail_max_duration: Duration::from_secs(3600),
            tail_idle_timeout: Duration::from_secs(600),
            recent_timeout: Duration::from_secs(2),
            catalog_wait: Duration::from_secs(5),
            query_timeout: Duration::from_secs(120),
            max_staleness: Duration::from_secs(15),
        }
    }
}

/// The running querier, shared by every request.
#[derive(Debug)]
pub struct Querier {
    pub config: QuerierConfig,
    store: Arc<dyn ObjectStore>,
    catalog: Arc<CatalogClient>,
    mirror: Mirror,
    cache: cache::SectionCache,
    /// Decoded tables of published blocks, shared by every scan.
    decoded: Arc<mira_core::decoded::DecodedCache>,
    /// Per-block query results ([`results`]).
    results: results::ResultCache,
    pool: pool::ScanPool,
    recent: recent::RecentClients,
    /// "Now" of queries without an end, and which ingester leases are live.
    clock: Clock,
    /// Which attributes give a Loki label name, per tenant.
    resolutions: logql::eval::Resolutions,
    /// Re-plans and missing objects ([`attempt`]).
    counters: attempt::Counters,
    /// Live tails running (at most `max_tails`).
    tails: Arc<tokio::sync::Semaphore>,
}

impl Querier {
    pub fn new(
        config: QuerierConfig,
        clock: Clock,
        store: Arc<dyn ObjectStore>,
        catalog: Arc<CatalogClient>,
    ) -> Result<Arc<Querier>, QueryError> {
        let cache =
            cache::SectionCache::open(&config.cache_dir, config.cache_bytes, config.max_fetches).map_err(|source| {
                QueryError::Cache {
                    path: config.cache_dir.clone(),
                    source,
                }
            })?;
        let pool = pool::ScanPool::new(
            config.threads,
            config.tenant_threads.unwrap_or(config.threads.div_ceil(2)),
            Duration::from_secs(1),
        )
        .map_err(QueryError::ScanPool)?;
        let recent = recent::RecentClients::new(catalog.dialer().clone());
        let tails = Arc::new(tokio::sync::Semaphore::new(config.max_tails));
        Ok(Arc::new(Querier {
            store,
            mirror: Mirror::start(catalog.clone()),
            catalog,
            cache,
            decoded: Arc::new(mira_core::decoded::DecodedCache::new(config.decoded_cache_bytes)),
            results: results::ResultCache::new(config.result_cache_bytes),
            pool,
            recent,
            config,
            clock,
            resolutions: Default::default(),
            counters: Default::default(),
            tails,
        }))
    }

    /// Nanoseconds since the epoch by the querier's clock.
    pub(crate) fn now_ns(&self) -> i64 {
        self.clock.now_ns()
    }

    pub fn cache(&self) -> &cache::SectionCache {
        &self.cache
    }

    /// The decoded table cache.
    pub fn decoded(&self) -> &mira_core::decoded::DecodedCache {
        &self.decoded
    }

    /// The result cache.
    pub fn results(&self) -> &results::ResultCache {
        &self.results
    }

    /// True once the catalog copy holds a complete state.
    pub fn ready(&self) -> bool {
        self.mirror.state().synced
    }

    /// Runs CPU work on the scan pool ([`pool`]: in the request's tenant's
    /// turn, cancelled with it) and waits for it without holding a runtime
    /// worker.
    pub(crate) async fn on_pool<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.pool.run(f).await
    }
}
