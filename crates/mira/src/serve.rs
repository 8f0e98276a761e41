//! `mira serve`: every role in one process on embedded defaults: a
//! single-member catalog, an ingester (OTLP on 4317/4318), a querier (API
//! on 3100) and a compactor (no port of its own: its metrics are on the
//! others'). Every HTTP port answers `/metrics`, `/ready` and `/live` for
//! the whole process. Ctrl-C stops in order: the query API, the compactor
//! (a job in flight finishes), then the ingester (stop accepting, seal and
//! publish open blocks), then the catalog.

use std::net::SocketAddr;

use clap::Args;
use mira_catalog::{CatalogNode, NodeConfig};
use mira_common::config::ConfigError;

use crate::compactor::CompactFlags;
use mira_common::security::Exposure;

use crate::flags::{ConfigFlags, Effective, FileConfig, SecurityFlags, StoreFlags, catalog_client, secured};
use crate::ingester::IngestFlags;
use crate::querier::QueryFlags;

/// Flags of `mira serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Listen address of the embedded catalog member (local traffic only) [default: 127.0.0.1:7400].
    #[arg(long, env = "MIRA_CATALOG_LISTEN")]
    pub catalog_listen: Option<SocketAddr>,
    /// Do not run the compactor in this process.
    #[arg(long, env = "MIRA_NO_COMPACTOR")]
    pub no_compactor: bool,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub ingest: IngestFlags,
    #[command(flatten)]
    pub query: QueryFlags,
    #[command(flatten)]
    pub compact: CompactFlags,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

impl ServeArgs {
    /// The effective settings of every role, validated. The ingester is
    /// always `serve` and both roles use the embedded catalog.
    pub fn settings(&self) -> Result<FileConfig, ConfigError> {
        let mut c = self.config.load()?;
        self.store.apply(&mut c.store)?;
        if let Some(l) = self.catalog_listen {
            c.serve.catalog_listen = l;
        }
        if self.no_compactor {
            c.serve.compactor = false;
        }
        self.ingest.apply(&mut c.ingester);
        self.query.apply(&mut c.querier);
        self.compact.apply(&mut c.compactor);
        self.security.apply(&mut c.security);
        c.security.validate(Exposure::AllInOne)?;
        c.ingester.id = "serve".to_owned();
        c.ingester.catalog = c.serve.catalog_listen.to_string();
        c.querier.catalog.clone_from(&c.ingester.catalog);
        c.compactor.catalog.clone_from(&c.ingester.catalog);
        c.store.validate()?;
        c.ingester.validate()?;
        c.querier.validate()?;
        c.compactor.validate()?;
        Ok(c)
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let c = args.settings()?;
    if args.config.check_config {
        Effective {
            store: Some(&c.store),
            ingester: Some(&c.ingester),
            querier: Some(&c.querier),
            compactor: Some(&c.compactor),
            serve: Some(&c.serve),
            security: Some(&c.security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    // Without --cluster-secret-file, a secret made for this process (its
    // own roles send it) and callers on loopback are trusted (local tools).
    let process = secured(crate::process()?, &c.security, Exposure::AllInOne)?;
    let (data_dir, store) = c.store.open()?;
    let query_config = c.querier.build(&data_dir)?;
    let catalog = CatalogNode::start(
        NodeConfig::single(c.serve.catalog_listen, mira_catalog::settings::catalog_dir(&data_dir)),
        &process,
    )
    .await?;
    let catalog_addr = catalog.local_addr();
    catalog.wait_for_leader(std::time::Duration::from_secs(30)).await?;
    let client = catalog_client(&catalog_addr.to_string(), &process.security.dialer);
    let ingester =
        crate::ingester::start(&c.ingester, &process, data_dir.clone(), store.clone(), client.clone()).await?;
    let (stop_compactor, stopped) = tokio::sync::watch::channel(false);
    let compactor = if c.serve.compactor {
        let compactor = mira_compactor::Compactor::new(c.compactor.build()?, &process, store.clone(), client.clone())?;
        Some(tokio::spawn(compactor.run(stopped)))
    } else {
        None
    };
    let server = crate::querier::start(c.querier.listen, query_config, &process, store, client).await?;
    tracing::info!(
        target: "mira::serve",
        query = %server.addr(),
        otlp_grpc = %ingester.grpc_addr(),
        otlp_http = %ingester.http_addr(),
        data_dir = %data_dir.display(),
        "mira serve ready"
    );
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::serve", "stopping: query API, then ingester (seal and publish), then catalog");
    server.shutdown().await;
    let _ = stop_compactor.send(true);
    if let Some(c) = compactor {
        let _ = c.await;
    }
    ingester.shutdown().await;
    catalog.shutdown().await;
    Ok(())
}
