//! `mira ingester`: OTLP in, WAL, sealed blocks into the object store,
//! published to the catalog.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_core::convert::Limits;
use mira_ingester::otlp::ReceiverConfig;
use mira_ingester::shard::SealPolicy;
use mira_ingester::{IngesterConfig, IngesterNode, PipelineConfig, WalMode};

use crate::flags::{StoreFlags, catalog_client};

/// Flags of `mira ingester`.
#[derive(Debug, Args)]
pub struct IngesterArgs {
    /// Stable identity (the pod name); keys WAL watermarks and the catalog lease.
    #[arg(long, env = "MIRA_INGESTER_ID", default_value = "ingester-0")]
    pub ingester_id: String,
    /// OTLP/gRPC listen address.
    #[arg(long, env = "MIRA_GRPC_LISTEN", default_value = "0.0.0.0:4317")]
    pub grpc_listen: SocketAddr,
    /// OTLP/HTTP listen address (also /ready).
    #[arg(long, env = "MIRA_HTTP_LISTEN", default_value = "0.0.0.0:4318")]
    pub http_listen: SocketAddr,
    /// Address queriers reach this ingester at; default: the gRPC listen address.
    #[arg(long, env = "MIRA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Catalog members, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400")]
    pub catalog: String,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub ingest: IngestFlags,
}

/// How the write path behaves (shared by `mira ingester` and `mira serve`).
#[derive(Debug, Args)]
pub struct IngestFlags {
    /// When an export is acknowledged: after write(2), after fsync, or after publish.
    #[arg(long, env = "MIRA_WAL", default_value = "page-cache", value_parser = parse_wal_mode)]
    pub wal: WalMode,
    /// Shards per signal (default: the number of cores).
    #[arg(long, env = "MIRA_SHARDS")]
    pub shards: Option<usize>,
    /// Bytes of requests queued per shard.
    #[arg(long, env = "MIRA_SHARD_QUEUE_BYTES", default_value_t = 64 << 20)]
    pub shard_queue_bytes: usize,
    /// How long a request waits for room before 429 / RESOURCE_EXHAUSTED, ms.
    #[arg(long, env = "MIRA_ADMIT_WAIT_MS", default_value_t = 5_000)]
    pub admit_wait_ms: u64,
    /// Seal a generation at this many bytes of Arrow data.
    #[arg(long, env = "MIRA_SEAL_BYTES", default_value_t = 32 << 20)]
    pub seal_bytes: usize,
    /// Seal a generation at this age, seconds.
    #[arg(long, env = "MIRA_SEAL_AGE_S", default_value_t = 300)]
    pub seal_age_s: u64,
    /// Largest decompressed request, bytes.
    #[arg(long, env = "MIRA_MAX_MESSAGE_BYTES", default_value_t = 16 << 20)]
    pub max_message_bytes: usize,
    /// Most attributes per record, span, event, link, resource or scope; the
    /// rest are dropped and counted in dropped_attributes_count (a metric
    /// data point over the limit is rejected).
    #[arg(long, env = "MIRA_MAX_ATTRIBUTES", default_value_t = 128)]
    pub max_attributes: usize,
    /// Longest string or bytes attribute value; longer ones are truncated
    /// (a metric data point with one is rejected).
    #[arg(long, env = "MIRA_MAX_ATTRIBUTE_VALUE_BYTES", default_value_t = 64 << 10)]
    pub max_attribute_value_bytes: usize,
    /// Export requests read, decoded or awaiting their ack at once (gRPC and
    /// HTTP together); more wait for a slot, up to --admit-wait-ms, before
    /// their body is read.
    #[arg(long, env = "MIRA_MAX_INFLIGHT_REQUESTS", default_value_t = 8)]
    pub max_inflight_requests: usize,
    /// Seconds an HTTP client has to send a request body once it holds a slot (then 408).
    #[arg(long, env = "MIRA_BODY_TIMEOUT_S", default_value_t = 30)]
    pub body_timeout_s: u64,
    /// Blocks larger than this are uploaded as multipart (8 MiB parts).
    #[arg(long, env = "MIRA_MULTIPART_ABOVE_BYTES", default_value_t = 16 << 20)]
    pub multipart_above_bytes: usize,
    /// Refuse requests without X-Scope-OrgID.
    #[arg(long, env = "MIRA_REQUIRE_TENANT")]
    pub require_tenant: bool,
    /// Records, spans and data points older than this (relative to the
    /// ingester's clock) are rejected, reported as an OTLP partial success
    /// (Loki's reject_old_samples_max_age).
    #[arg(long, env = "MIRA_MAX_PAST", default_value = "168h")]
    pub max_past: humantime::Duration,
    /// Records, spans and data points newer than now plus this are rejected
    /// (Loki's creation_grace_period).
    #[arg(long, env = "MIRA_MAX_FUTURE", default_value = "10m")]
    pub max_future: humantime::Duration,
    /// Seconds the ingester's lease in the catalog lasts; renewed at a third
    /// of it. Exports are refused (503) while it cannot be renewed.
    #[arg(long, env = "MIRA_LEASE_TTL_S", default_value_t = 15)]
    pub lease_ttl_s: u64,
    /// At start, skip (and count) the rest of a WAL segment after a corrupt
    /// frame instead of refusing to start.
    #[arg(long, env = "MIRA_WAL_SKIP_CORRUPT")]
    pub wal_skip_corrupt: bool,
    /// Most blocks per catalog publish command; a generation with more
    /// (many tenants) is staged in chunks and made live by its last one.
    #[arg(long, env = "MIRA_PUBLISH_CHUNK_BLOCKS", default_value_t = mira_catalog::model::MAX_BLOCKS_PER_COMMAND, hide = true)]
    pub publish_chunk_blocks: usize,
}

/// `--wal`: the mode names, with clap's list of possible values.
fn parse_wal_mode(s: &str) -> Result<WalMode, String> {
    s.parse()
}

/// Where the ingester listens and who it is.
#[derive(Debug, Clone)]
pub struct Identity {
    pub ingester_id: String,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub advertise: Option<String>,
}

/// Starts an ingester from flags (shared by `mira ingester` and `mira serve`).
pub async fn start(
    id: Identity,
    flags: &IngestFlags,
    process: &Process,
    data_dir: PathBuf,
    store: Arc<dyn object_store::ObjectStore>,
    catalog: Arc<CatalogClient>,
) -> anyhow::Result<IngesterNode> {
    let shards = flags
        .shards
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    anyhow::ensure!((1..=256).contains(&shards), "shards: {shards} is outside 1..=256");
    anyhow::ensure!(flags.seal_bytes > 0, "seal-bytes must be positive");
    anyhow::ensure!(
        (1..=86_400).contains(&flags.lease_ttl_s),
        "lease-ttl-s: {} is outside 1..=86400",
        flags.lease_ttl_s
    );
    anyhow::ensure!(
        (1..=mira_catalog::model::MAX_BLOCKS_PER_COMMAND).contains(&flags.publish_chunk_blocks),
        "publish-chunk-blocks: {} is outside 1..={}",
        flags.publish_chunk_blocks,
        mira_catalog::model::MAX_BLOCKS_PER_COMMAND
    );
    anyhow::ensure!(
        flags.max_inflight_requests > 0,
        "max-inflight-requests must be positive"
    );
    anyhow::ensure!(flags.max_attributes > 0, "max-attributes must be positive");
    anyhow::ensure!(
        flags.max_attribute_value_bytes > 0,
        "max-attribute-value-bytes must be positive"
    );
    let config = IngesterConfig {
        ingester_id: id.ingester_id,
        grpc_listen: id.grpc_listen,
        http_listen: id.http_listen,
        advertise: id.advertise.unwrap_or_else(|| id.grpc_listen.to_string()),
        data_dir,
        wal_mode: flags.wal,
        pipeline: PipelineConfig {
            shards,
            queue_bytes: flags.shard_queue_bytes,
            admit_wait: Duration::from_millis(flags.admit_wait_ms),
            seal: SealPolicy {
                max_bytes: flags.seal_bytes,
                max_age: Duration::from_secs(flags.seal_age_s.max(1)),
            },
            upload_queue: 2,
            limits: Limits {
                max_attrs: flags.max_attributes,
                max_value_bytes: flags.max_attribute_value_bytes,
                window: None,
            },
            max_past: flags.max_past.into(),
            max_future: flags.max_future.into(),
        },
        receivers: ReceiverConfig {
            max_wire_bytes: flags.max_message_bytes,
            max_message_bytes: flags.max_message_bytes,
            require_tenant: flags.require_tenant,
            max_inflight: flags.max_inflight_requests,
            body_timeout: Duration::from_secs(flags.body_timeout_s.max(1)),
        },
        lease_ttl: Duration::from_secs(flags.lease_ttl_s),
        multipart_above: flags.multipart_above_bytes,
        publish_chunk_blocks: flags.publish_chunk_blocks,
        wal_skip_corrupt: flags.wal_skip_corrupt,
    };
    let node = IngesterNode::start(config, process, catalog, store).await?;
    tracing::info!(target: "mira::ingester", grpc = %node.grpc_addr(), http = %node.http_addr(), replayed = node.replayed.frames, "ingester ready");
    Ok(node)
}

pub async fn run(args: IngesterArgs) -> anyhow::Result<()> {
    let (data_dir, store) = args.store.open()?;
    let id = Identity {
        ingester_id: args.ingester_id.clone(),
        grpc_listen: args.grpc_listen,
        http_listen: args.http_listen,
        advertise: args.advertise.clone(),
    };
    let node = start(
        id,
        &args.ingest,
        &crate::process()?,
        data_dir,
        store,
        catalog_client(&args.catalog),
    )
    .await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::ingester", "stopping: sealing and publishing open blocks");
    node.shutdown().await;
    Ok(())
}
