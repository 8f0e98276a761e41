//! `mira querier`: the query API over the catalog, the object store and
//! the live ingesters.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_querier::server::QuerierServer;
use mira_querier::{Querier, QuerierConfig};

use crate::flags::{StoreFlags, catalog_client};

/// Flags of `mira querier`.
#[derive(Debug, Args)]
pub struct QuerierArgs {
    /// Query API listen address (also /metrics and /ready).
    #[arg(long, env = "MIRA_QUERY_LISTEN", default_value = "0.0.0.0:3100")]
    pub listen: SocketAddr,
    /// Catalog members, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400")]
    pub catalog: String,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub query: QueryFlags,
}

/// How queries run (shared by `mira querier` and `mira serve`).
#[derive(Debug, Args)]
pub struct QueryFlags {
    /// Block cache directory; default: <data-dir>/cache.
    #[arg(long, env = "MIRA_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the block cache holds on disk.
    #[arg(long, env = "MIRA_CACHE_SIZE", default_value_t = 10 << 30)]
    pub cache_size: u64,
    /// Most concurrent range GETs to the object store.
    #[arg(long, env = "MIRA_MAX_FETCHES", default_value_t = 32)]
    pub max_fetches: usize,
    /// Threads scanning blocks (default: the number of cores).
    #[arg(long, env = "MIRA_QUERY_THREADS")]
    pub query_threads: Option<usize>,
    /// Most blocks one query may read after pruning by time (then 422).
    #[arg(long, env = "MIRA_MAX_QUERY_BLOCKS", default_value_t = 20_000)]
    pub max_query_blocks: usize,
    /// Longest time range one query may cover, hours (then 422).
    #[arg(long, env = "MIRA_MAX_QUERY_RANGE_H", default_value_t = 744)]
    pub max_query_range_h: u64,
    /// Largest `limit` a query may ask for (then 422).
    #[arg(long, env = "MIRA_MAX_QUERY_LIMIT", default_value_t = 10_000)]
    pub max_query_limit: usize,
    /// How long an ingester may take to return its recent data before the
    /// answer is marked partial, ms.
    #[arg(long, env = "MIRA_RECENT_TIMEOUT_MS", default_value_t = 2_000)]
    pub recent_timeout_ms: u64,
}

impl QueryFlags {
    pub fn config(&self, data_dir: &Path) -> anyhow::Result<QuerierConfig> {
        anyhow::ensure!(self.max_fetches > 0, "max-fetches must be positive");
        anyhow::ensure!(self.max_query_limit > 0, "max-query-limit must be positive");
        anyhow::ensure!(self.max_query_range_h > 0, "max-query-range-h must be positive");
        let mut c = QuerierConfig::new(self.cache_dir.clone().unwrap_or_else(|| data_dir.join("cache")));
        c.cache_bytes = self.cache_size;
        c.max_fetches = self.max_fetches;
        if let Some(t) = self.query_threads {
            anyhow::ensure!(t > 0, "query-threads must be positive");
            c.threads = t;
        }
        c.max_blocks = self.max_query_blocks;
        c.max_range = Duration::from_secs(self.max_query_range_h.saturating_mul(3600));
        c.max_limit = self.max_query_limit;
        c.recent_timeout = Duration::from_millis(self.recent_timeout_ms.max(1));
        Ok(c)
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
    let querier = Querier::new(config, store, catalog)?;
    let server = QuerierServer::start(querier, listen, process).await?;
    tracing::info!(target: "mira::querier", addr = %server.addr(), "querier ready");
    Ok(server)
}

pub async fn run(args: QuerierArgs) -> anyhow::Result<()> {
    let (data_dir, store) = args.store.open()?;
    let config = args.query.config(&data_dir)?;
    let server = start(
        args.listen,
        config,
        &crate::process()?,
        store,
        catalog_client(&args.catalog),
    )
    .await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::querier", "stopping");
    server.shutdown().await;
    Ok(())
}
