//! `mira querier`: the query API over the catalog, the object store and
//! the live ingesters.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_common::config::{ByteSize, ConfigError, Duration};
use mira_querier::server::QuerierServer;
use mira_querier::settings::Settings;
use mira_querier::{Querier, QuerierConfig};

use mira_common::security::{Exposure, SecuritySettings};

use crate::flags::{
    ConfigFlags, Effective, SecurityFlags, StoreFlags, StoreSettings, catalog_client, secured, set_given,
};

/// Flags of `mira querier`.
#[derive(Debug, Args)]
pub struct QuerierArgs {
    /// Catalog members, comma separated host:port [default: 127.0.0.1:7400].
    #[arg(long, env = "MIRA_CATALOG")]
    pub catalog: Option<String>,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub query: QueryFlags,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

/// How queries run (shared by `mira querier` and `mira serve`); defaults
/// are [`Settings::default`]'s.
#[derive(Debug, Args)]
pub struct QueryFlags {
    /// Query API listen address, also /metrics, /ready and /live [default: 0.0.0.0:3100].
    #[arg(long, env = "MIRA_QUERY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Block cache directory [default: <data-dir>/cache].
    #[arg(long, env = "MIRA_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Most the block cache holds on disk (a size, or bytes) [default: 10GiB].
    #[arg(long, env = "MIRA_CACHE_SIZE")]
    pub cache_size: Option<ByteSize>,
    /// Most decoded tables kept in memory for reuse by later scans (a size,
    /// or bytes; 0 keeps none) [default: 1GiB].
    #[arg(long, env = "MIRA_DECODED_CACHE_SIZE")]
    pub decoded_cache_size: Option<ByteSize>,
    /// Most per-block query results kept in memory, so a repeated query
    /// skips evaluating its predicate on blocks that did not change (a
    /// size, or bytes; 0 keeps none) [default: 256MiB].
    #[arg(long, env = "MIRA_RESULT_CACHE_SIZE")]
    pub result_cache_size: Option<ByteSize>,
    /// Most concurrent range GETs to the object store [default: 32].
    #[arg(long, env = "MIRA_MAX_FETCHES")]
    pub max_fetches: Option<usize>,
    /// Threads scanning blocks [default: the number of cores].
    #[arg(long, env = "MIRA_QUERY_THREADS")]
    pub query_threads: Option<usize>,
    /// Most scan threads one tenant's queries hold at once, so others keep
    /// threads while it runs long jobs [default: half of --query-threads,
    /// rounded up].
    #[arg(long, env = "MIRA_TENANT_QUERY_THREADS")]
    pub tenant_query_threads: Option<usize>,
    /// Most blocks one query may read after pruning by time (then 422) [default: 20000].
    #[arg(long, env = "MIRA_MAX_QUERY_BLOCKS")]
    pub max_query_blocks: Option<usize>,
    /// Longest time range one query may cover (then 422) [default: 744h].
    #[arg(long, env = "MIRA_MAX_QUERY_RANGE")]
    pub max_query_range: Option<Duration>,
    /// Largest `limit` a query may ask for (then 422) [default: 10000].
    #[arg(long, env = "MIRA_MAX_QUERY_LIMIT")]
    pub max_query_limit: Option<usize>,
    /// Most series one PromQL query may select (then 422) [default: 500000].
    #[arg(long, env = "MIRA_MAX_QUERY_SERIES")]
    pub max_query_series: Option<usize>,
    /// Most samples one PromQL query may load, over all its series, in the
    /// window it reads (then 422) [default: 50000000].
    #[arg(long, env = "MIRA_MAX_QUERY_SAMPLES")]
    pub max_query_samples: Option<usize>,
    /// Most spans of one trace a TraceQL search evaluates (then 422) [default: 100000].
    #[arg(long, env = "MIRA_MAX_SPANS_PER_TRACE")]
    pub max_spans_per_trace: Option<usize>,
    /// Most live tails (Loki `tail` WebSockets) at once, all tenants
    /// together (then 429) [default: 100].
    #[arg(long, env = "MIRA_MAX_TAILS")]
    pub max_tails: Option<usize>,
    /// Longest a live tail runs before it is closed [default: 1h].
    #[arg(long, env = "MIRA_TAIL_MAX_DURATION")]
    pub tail_max_duration: Option<Duration>,
    /// Longest a live tail runs without a new line to send before it is
    /// closed [default: 10m].
    #[arg(long, env = "MIRA_TAIL_IDLE_TIMEOUT")]
    pub tail_idle_timeout: Option<Duration>,
    /// How long an ingester may take to return its recent data before the
    /// answer is marked partial [default: 2s].
    #[arg(long, env = "MIRA_RECENT_TIMEOUT")]
    pub recent_timeout: Option<Duration>,
    /// Longest a query may run before it is cancelled and answered 504 [default: 120s].
    #[arg(long, env = "MIRA_QUERY_TIMEOUT")]
    pub query_timeout: Option<Duration>,
    /// Oldest the catalog copy's last update may be when a query is planned;
    /// older, the query waits briefly for a fresh one, then answers 503 [default: 15s].
    #[arg(long, env = "MIRA_CATALOG_MAX_STALENESS")]
    pub catalog_max_staleness: Option<Duration>,
    /// Earlier releases' --max-query-range in hours (hidden; one release).
    #[arg(
        long,
        env = "MIRA_MAX_QUERY_RANGE_H",
        hide = true,
        conflicts_with = "max_query_range"
    )]
    pub max_query_range_h: Option<u64>,
    /// Earlier releases' --recent-timeout in ms (hidden; one release).
    #[arg(long, env = "MIRA_RECENT_TIMEOUT_MS", hide = true, conflicts_with = "recent_timeout")]
    pub recent_timeout_ms: Option<u64>,
}

impl QueryFlags {
    /// Overrides `s` with every flag (or variable) given.
    pub fn apply(&self, s: &mut Settings) {
        set_given!(
            self,
            s,
            listen,
            cache_size,
            decoded_cache_size,
            result_cache_size,
            max_fetches,
            max_query_blocks,
            max_query_range,
            max_query_limit,
            max_query_series,
            max_query_samples,
            max_spans_per_trace,
            max_tails,
            tail_max_duration,
            tail_idle_timeout,
            recent_timeout,
            query_timeout,
            catalog_max_staleness,
        );
        if self.cache_dir.is_some() {
            s.cache_dir.clone_from(&self.cache_dir);
        }
        if self.query_threads.is_some() {
            s.query_threads = self.query_threads;
        }
        if self.tenant_query_threads.is_some() {
            s.tenant_query_threads = self.tenant_query_threads;
        }
        if let Some(h) = self.max_query_range_h {
            s.max_query_range = Duration::from_secs(h.saturating_mul(3600));
        }
        if let Some(ms) = self.recent_timeout_ms {
            s.recent_timeout = Duration::from_millis(ms);
        }
    }
}

impl QuerierArgs {
    /// The effective store, querier and security settings, validated.
    pub fn settings(&self) -> Result<(StoreSettings, Settings, SecuritySettings), ConfigError> {
        let file = self.config.load()?;
        let (mut store, mut s, mut sec) = (file.store, file.querier, file.security);
        self.security.apply(&mut sec);
        sec.validate(Exposure::Client)?;
        self.store.apply(&mut store)?;
        set_given!(self, s, catalog);
        self.query.apply(&mut s);
        store.validate()?;
        s.validate()?;
        Ok((store, s, sec))
    }
}

/// Starts the querier and its HTTP server.
pub async fn start(
    listen: SocketAddr,
    config: QuerierConfig,
    process: &Process,
    store: Arc<dyn object_store::ObjectStore>,
    catalog: Arc<CatalogClient>,
) -> anyhow::Result<QuerierServer> {
    let querier = Querier::new(config, process.clock.clone(), store, catalog)?;
    let server = QuerierServer::start(querier, listen, process).await?;
    tracing::info!(target: "mira::querier", addr = %server.addr(), "querier ready");
    Ok(server)
}

pub async fn run(args: QuerierArgs) -> anyhow::Result<()> {
    let (store_settings, settings, security) = args.settings()?;
    if args.config.check_config {
        Effective {
            store: Some(&store_settings),
            querier: Some(&settings),
            security: Some(&security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    let process = secured(crate::process()?, &security, Exposure::Client)?;
    let (data_dir, store) = store_settings.open()?;
    let config = settings.build(&data_dir)?;
    let catalog = catalog_client(&settings.catalog, &process.security.dialer);
    let server = start(settings.listen, config, &process, store, catalog).await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::querier", "stopping");
    server.shutdown().await;
    Ok(())
}
