//! `mira serve`: every role in one process on embedded defaults: a
//! single-member catalog, an ingester (OTLP on 4317/4318) and a querier
//! (API on 3100, also the one `/metrics` and `/ready` of the process).
//! Ctrl-C stops in order: the query API, then the ingester (stop
//! accepting, seal and publish open blocks), then the catalog.

use std::net::SocketAddr;

use clap::Args;
use mira_catalog::{CatalogNode, NodeConfig};

use crate::flags::{StoreFlags, catalog_client};
use crate::ingester::{Identity, IngestFlags};
use crate::querier::QueryFlags;

/// Flags of `mira serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Query API listen address (also /metrics and /ready for the whole process).
    #[arg(long, env = "MIRA_QUERY_LISTEN", default_value = "0.0.0.0:3100")]
    pub listen: SocketAddr,
    /// OTLP/gRPC listen address.
    #[arg(long, env = "MIRA_GRPC_LISTEN", default_value = "0.0.0.0:4317")]
    pub grpc_listen: SocketAddr,
    /// OTLP/HTTP listen address.
    #[arg(long, env = "MIRA_HTTP_LISTEN", default_value = "0.0.0.0:4318")]
    pub http_listen: SocketAddr,
    /// Listen address of the embedded catalog member (local traffic only).
    #[arg(long, env = "MIRA_CATALOG_LISTEN", default_value = "127.0.0.1:7400")]
    pub catalog_listen: SocketAddr,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub ingest: IngestFlags,
    #[command(flatten)]
    pub query: QueryFlags,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let (data_dir, store) = args.store.open()?;
    let query_config = args.query.config(&data_dir)?;
    let process = crate::process()?;
    let catalog = CatalogNode::start(
        NodeConfig::single(args.catalog_listen, data_dir.join("catalog")),
        &process,
    )
    .await?;
    let catalog_addr = catalog.local_addr();
    catalog.wait_for_leader(std::time::Duration::from_secs(30)).await?;
    let client = catalog_client(&catalog_addr.to_string());
    let ingester = crate::ingester::start(
        Identity {
            ingester_id: "serve".into(),
            grpc_listen: args.grpc_listen,
            http_listen: args.http_listen,
            advertise: None,
        },
        &args.ingest,
        &process,
        data_dir.clone(),
        store.clone(),
        client.clone(),
    )
    .await?;
    let server = crate::querier::start(args.listen, query_config, &process, store, client).await?;
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
    ingester.shutdown().await;
    catalog.shutdown().await;
    Ok(())
}
