//! `mira ingester`: OTLP in, WAL, sealed blocks into the object store,
//! published to the catalog.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_common::config::{ByteSize, ConfigError, Duration};
use mira_ingester::{IngesterNode, Settings, WalMode};

use mira_common::security::{Exposure, SecuritySettings};

use crate::flags::{ConfigFlags, Effective, SecurityFlags, StoreFlags, catalog_client, secured, set_given};

/// Flags of `mira ingester`.
#[derive(Debug, Args)]
pub struct IngesterArgs {
    /// Stable identity (the pod name); keys WAL watermarks and the catalog lease [default: ingester-0].
    #[arg(long = "ingester-id", env = "MIRA_INGESTER_ID")]
    pub id: Option<String>,
    /// Address queriers reach this ingester at [default: the gRPC listen address].
    #[arg(long, env = "MIRA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Catalog members, comma separated host:port [default: 127.0.0.1:7400].
    #[arg(long, env = "MIRA_CATALOG")]
    pub catalog: Option<String>,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub ingest: IngestFlags,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

/// How the write path behaves (shared by `mira ingester` and `mira serve`);
/// defaults are [`Settings::default`]'s.
#[derive(Debug, Args)]
pub struct IngestFlags {
    /// OTLP/gRPC listen address [default: 0.0.0.0:4317].
    #[arg(long, env = "MIRA_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// OTLP/HTTP listen address, also /metrics, /ready and /live [default: 0.0.0.0:4318].
    #[arg(long, env = "MIRA_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// When an export is acknowledged: after write(2), after fsync, or after publish [default: page-cache].
    #[arg(long, env = "MIRA_WAL", value_parser = parse_wal_mode)]
    pub wal: Option<WalMode>,
    /// Shards per signal [default: the number of cores].
    #[arg(long, env = "MIRA_SHARDS")]
    pub shards: Option<usize>,
    /// Requests queued per shard [default: 64MiB].
    #[arg(long, env = "MIRA_SHARD_QUEUE_SIZE")]
    pub shard_queue_size: Option<ByteSize>,
    /// How long a request waits for room before 429 / RESOURCE_EXHAUSTED [default: 5s].
    #[arg(long, env = "MIRA_ADMIT_WAIT")]
    pub admit_wait: Option<Duration>,
    /// Seal a generation at this much Arrow data [default: 32MiB].
    #[arg(long, env = "MIRA_SEAL_SIZE")]
    pub seal_size: Option<ByteSize>,
    /// Seal a generation at this age [default: 5m].
    #[arg(long, env = "MIRA_SEAL_AGE")]
    pub seal_age: Option<Duration>,
    /// Largest decompressed request [default: 16MiB].
    #[arg(long, env = "MIRA_MAX_MESSAGE_SIZE")]
    pub max_message_size: Option<ByteSize>,
    /// Most attributes per record, span, event, link, resource or scope; the
    /// rest are dropped and counted in dropped_attributes_count (a metric
    /// data point over the limit is rejected) [default: 128].
    #[arg(long, env = "MIRA_MAX_ATTRIBUTES")]
    pub max_attributes: Option<usize>,
    /// Longest string or bytes attribute value; longer ones are truncated
    /// (a metric data point with one is rejected) [default: 64KiB].
    #[arg(long, env = "MIRA_MAX_ATTRIBUTE_VALUE_SIZE")]
    pub max_attribute_value_size: Option<ByteSize>,
    /// Export requests read, decoded or awaiting their ack at once (gRPC and
    /// HTTP together); more wait for a slot, up to --admit-wait, before
    /// their body is read [default: 8].
    #[arg(long, env = "MIRA_MAX_INFLIGHT_REQUESTS")]
    pub max_inflight_requests: Option<usize>,
    /// How long an HTTP client has to send a request body once it holds a slot (then 408) [default: 30s].
    #[arg(long, env = "MIRA_BODY_TIMEOUT")]
    pub body_timeout: Option<Duration>,
    /// Most memory one export request may take to decode, estimated from
    /// what it holds (records, attributes, events, buckets) on the wire
    /// before anything is decoded; past it, 413 / RESOURCE_EXHAUSTED naming
    /// the counts [default: 256MiB].
    #[arg(long, env = "MIRA_MAX_DECODED_SIZE")]
    pub max_decoded_size: Option<ByteSize>,
    /// Most decoded memory (the same estimate) of all export requests being
    /// decoded or awaiting their ack at once; more wait up to --admit-wait,
    /// then 429 / RESOURCE_EXHAUSTED [default: 1GiB].
    #[arg(long, env = "MIRA_MAX_INFLIGHT_DECODED_SIZE")]
    pub max_inflight_decoded_size: Option<ByteSize>,
    /// Blocks larger than this are uploaded as multipart (8 MiB parts) [default: 16MiB].
    #[arg(long, env = "MIRA_MULTIPART_ABOVE")]
    pub multipart_above: Option<ByteSize>,
    /// Refuse requests without X-Scope-OrgID.
    #[arg(long, env = "MIRA_REQUIRE_TENANT", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub require_tenant: Option<bool>,
    /// Records, spans and data points older than this (relative to the
    /// ingester's clock) are rejected, reported as an OTLP partial success
    /// (Loki's reject_old_samples_max_age) [default: 168h].
    #[arg(long, env = "MIRA_MAX_PAST")]
    pub max_past: Option<Duration>,
    /// Records, spans and data points newer than now plus this are rejected
    /// (Loki's creation_grace_period) [default: 10m].
    #[arg(long, env = "MIRA_MAX_FUTURE")]
    pub max_future: Option<Duration>,
    /// How long the ingester's lease in the catalog lasts; renewed at a third
    /// of it. Exports are refused (503) while it cannot be renewed [default: 15s].
    #[arg(long, env = "MIRA_LEASE_TTL")]
    pub lease_ttl: Option<Duration>,
    /// At start, skip (and count) the rest of a WAL segment after a corrupt
    /// frame instead of refusing to start.
    #[arg(long, env = "MIRA_WAL_SKIP_CORRUPT", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub wal_skip_corrupt: Option<bool>,
    /// Most blocks per catalog publish command; a generation with more
    /// (many tenants) is staged in chunks and made live by its last one.
    #[arg(long, env = "MIRA_PUBLISH_CHUNK_BLOCKS", hide = true)]
    pub publish_chunk_blocks: Option<usize>,
    #[command(flatten)]
    pub old: OldIngestFlags,
}

/// The flags of earlier releases, with their units (hidden; one release).
#[derive(Debug, Args)]
pub struct OldIngestFlags {
    #[arg(
        long,
        env = "MIRA_SHARD_QUEUE_BYTES",
        hide = true,
        conflicts_with = "shard_queue_size"
    )]
    pub shard_queue_bytes: Option<u64>,
    #[arg(long, env = "MIRA_ADMIT_WAIT_MS", hide = true, conflicts_with = "admit_wait")]
    pub admit_wait_ms: Option<u64>,
    #[arg(long, env = "MIRA_SEAL_BYTES", hide = true, conflicts_with = "seal_size")]
    pub seal_bytes: Option<u64>,
    #[arg(long, env = "MIRA_SEAL_AGE_S", hide = true, conflicts_with = "seal_age")]
    pub seal_age_s: Option<u64>,
    #[arg(
        long,
        env = "MIRA_MAX_MESSAGE_BYTES",
        hide = true,
        conflicts_with = "max_message_size"
    )]
    pub max_message_bytes: Option<u64>,
    #[arg(
        long,
        env = "MIRA_MAX_ATTRIBUTE_VALUE_BYTES",
        hide = true,
        conflicts_with = "max_attribute_value_size"
    )]
    pub max_attribute_value_bytes: Option<u64>,
    #[arg(long, env = "MIRA_BODY_TIMEOUT_S", hide = true, conflicts_with = "body_timeout")]
    pub body_timeout_s: Option<u64>,
    #[arg(
        long,
        env = "MIRA_MULTIPART_ABOVE_BYTES",
        hide = true,
        conflicts_with = "multipart_above"
    )]
    pub multipart_above_bytes: Option<u64>,
    #[arg(long, env = "MIRA_LEASE_TTL_S", hide = true, conflicts_with = "lease_ttl")]
    pub lease_ttl_s: Option<u64>,
}

/// `--wal`: the mode names, with clap's list of possible values.
fn parse_wal_mode(s: &str) -> Result<WalMode, String> {
    s.parse()
}

impl IngestFlags {
    /// Overrides `s` with every flag (or variable) given.
    pub fn apply(&self, s: &mut Settings) {
        set_given!(
            self,
            s,
            grpc_listen,
            http_listen,
            wal,
            shard_queue_size,
            admit_wait,
            seal_size,
            seal_age,
            max_message_size,
            max_attributes,
            max_attribute_value_size,
            max_inflight_requests,
            body_timeout,
            max_decoded_size,
            max_inflight_decoded_size,
            multipart_above,
            max_past,
            max_future,
            lease_ttl,
            publish_chunk_blocks,
            require_tenant,
            wal_skip_corrupt,
        );
        if self.shards.is_some() {
            s.shards = self.shards;
        }
        let o = &self.old;
        let secs = Duration::from_secs;
        for (old, new) in [
            (o.shard_queue_bytes, &mut s.shard_queue_size),
            (o.seal_bytes, &mut s.seal_size),
            (o.max_message_bytes, &mut s.max_message_size),
            (o.max_attribute_value_bytes, &mut s.max_attribute_value_size),
            (o.multipart_above_bytes, &mut s.multipart_above),
        ] {
            if let Some(v) = old {
                *new = ByteSize(v);
            }
        }
        for (old, new) in [
            (o.seal_age_s, &mut s.seal_age),
            (o.body_timeout_s, &mut s.body_timeout),
            (o.lease_ttl_s, &mut s.lease_ttl),
        ] {
            if let Some(v) = old {
                *new = secs(v);
            }
        }
        if let Some(ms) = o.admit_wait_ms {
            s.admit_wait = Duration::from_millis(ms);
        }
    }
}

impl IngesterArgs {
    /// The effective store, ingester and security settings (file < variables < flags), validated.
    pub fn settings(&self) -> Result<(crate::flags::StoreSettings, Settings, SecuritySettings), ConfigError> {
        let file = self.config.load()?;
        let (mut store, mut s, mut sec) = (file.store, file.ingester, file.security);
        self.security.apply(&mut sec);
        sec.validate(Exposure::Member)?;
        self.store.apply(&mut store)?;
        set_given!(self, s, id, catalog);
        if self.advertise.is_some() {
            s.advertise.clone_from(&self.advertise);
        }
        self.ingest.apply(&mut s);
        store.validate()?;
        s.validate()?;
        Ok((store, s, sec))
    }
}

/// Starts an ingester (shared by `mira ingester` and `mira serve`).
pub async fn start(
    settings: &Settings,
    process: &Process,
    data_dir: PathBuf,
    store: Arc<dyn object_store::ObjectStore>,
    catalog: Arc<CatalogClient>,
) -> anyhow::Result<IngesterNode> {
    let config = settings.build(data_dir)?;
    let node = IngesterNode::start(config, process, catalog, store).await?;
    tracing::info!(target: "mira::ingester", grpc = %node.grpc_addr(), http = %node.http_addr(), replayed = node.replayed.frames, "ingester ready");
    Ok(node)
}

pub async fn run(args: IngesterArgs) -> anyhow::Result<()> {
    let (store_settings, settings, security) = args.settings()?;
    if args.config.check_config {
        Effective {
            store: Some(&store_settings),
            ingester: Some(&settings),
            security: Some(&security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    let process = secured(crate::process()?, &security, Exposure::Member)?;
    let (data_dir, store) = store_settings.open()?;
    let catalog = catalog_client(&settings.catalog, &process.security.dialer);
    let node = start(&settings, &process, data_dir, store, catalog).await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::ingester", "stopping: sealing and publishing open blocks");
    node.shutdown().await;
    Ok(())
}
