//! A running ingester: WAL, pipeline, OTLP servers, catalog lease and WAL
//! sweep, and `/ready`. Start-up order: open the WAL (repairing a torn
//! tail), take a new epoch from the catalog (fencing any older process
//! under this id), read this ingester's watermarks, start the sequence
//! above both the WAL and every watermark, publish every frame above its
//! watermark ([`crate::recover`]), register the lease, then accept
//! traffic. Writes are acknowledged only while the lease is renewed, the
//! WAL writes and nothing is quarantined ([`crate::health`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mira_catalog::{CatalogClient, proto as pb};
use mira_common::Process;
use mira_common::clock::Clock;
use mira_common::http::HttpServer;
use mira_common::retry::Backoff;
use tokio::task::JoinHandle;

use crate::health::Health;
use crate::otlp::{ReceiverConfig, Receivers, grpc_router, http_router};
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::recover::{Replayed, recover};
use crate::upload::Destination;
use crate::wal::{Wal, WalConfig, WalMode};

/// Everything an ingester needs.
#[derive(Clone, Debug)]
pub struct IngesterConfig {
    /// Stable identity (the StatefulSet pod name): keys watermarks and the lease.
    pub ingester_id: String,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// Address queriers reach this ingester at (registered in the catalog).
    pub advertise: String,
    pub data_dir: PathBuf,
    pub wal_mode: WalMode,
    pub pipeline: PipelineConfig,
    pub receivers: ReceiverConfig,
    pub lease_ttl: Duration,
    /// Blocks larger than this are uploaded in parts.
    pub multipart_above: usize,
    /// Most blocks per catalog command (more are staged in chunks).
    pub publish_chunk_blocks: usize,
    /// Skip corrupt WAL frames at start (counted) instead of refusing to start.
    pub wal_skip_corrupt: bool,
}

/// A running ingester.
pub struct IngesterNode {
    pipeline: Option<Arc<Pipeline>>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    servers: Vec<HttpServer>,
    background: Vec<JoinHandle<()>>,
    catalog: Arc<CatalogClient>,
    config: IngesterConfig,
    pub replayed: Replayed,
    metrics: Arc<crate::metrics::Metrics>,
    health: Arc<Health>,
    clock: Clock,
}

impl std::fmt::Debug for IngesterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngesterNode")
            .field("grpc", &self.grpc_addr)
            .field("http", &self.http_addr)
            .finish()
    }
}

/// One lease heartbeat; on success the lease counts from when it was sent.
async fn heartbeat(catalog: &CatalogClient, config: &IngesterConfig, health: &Health, clock: &Clock) -> bool {
    let ttl_ms = i64::try_from(config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    let sent = clock.now_ns();
    match catalog
        .heartbeat(&config.ingester_id, &config.advertise, sent, ttl_ms)
        .await
    {
        Ok(_) => {
            health.lease_renewed(sent, config.lease_ttl);
            true
        }
        Err(e) => {
            tracing::warn!(target: "mira::ingester", error = %e, "could not renew the lease in the catalog");
            health.catalog_unreachable();
            false
        }
    }
}

/// The first lease heartbeat, retried until the catalog takes it.
async fn register(catalog: &CatalogClient, config: &IngesterConfig, health: &Health, clock: &Clock) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while !heartbeat(catalog, config, health, clock).await {
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// A new epoch for this ingester id, retried until the catalog answers.
async fn fence(catalog: &CatalogClient, id: &str) -> Result<u64, crate::error::StartError> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match catalog.fence(id).await {
            Ok(epoch) => return Ok(epoch),
            Err(mira_catalog::ClientError::Rejected(status)) => {
                return Err(crate::error::StartError::Catalog(status.message().to_owned()));
            }
            Err(e) => {
                tracing::warn!(target: "mira::ingester", error = %e, "catalog unreachable at start; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

async fn watermarks(catalog: &CatalogClient, id: &str) -> HashMap<u16, u64> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match catalog
            .get_watermarks(pb::GetWatermarksRequest {
                ingester_id: id.to_owned(),
                linearizable: true,
            })
            .await
        {
            Ok(r) => {
                return r
                    .watermarks
                    .into_iter()
                    .filter_map(|w| u16::try_from(w.shard).ok().map(|s| (s, w.wal_seq)))
                    .collect();
            }
            Err(e) => {
                tracing::warn!(target: "mira::ingester", error = %e, "catalog unreachable at start; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Notes every quarantine copy a previous process left (a directory with
/// a `reason.txt`), so `/ready` and `mira_ingester_quarantined` report them.
fn note_quarantine_copies(dir: &std::path::Path, health: &Health) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut found: Vec<(PathBuf, String)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let reason = std::fs::read_to_string(e.path().join("reason.txt")).ok()?;
            Some((e.path(), reason.lines().next().unwrap_or_default().to_owned()))
        })
        .collect();
    found.sort();
    if !found.is_empty() {
        tracing::warn!(target: "mira::ingester", dir = %dir.display(), copies = found.len(), "the data directory holds quarantined rows that are not published (see /ready)");
    }
    for (path, reason) in found {
        health.quarantine_noted(format!("{}: {reason}", path.display()));
    }
}

impl IngesterNode {
    /// Starts the ingester; returns once it accepts traffic.
    pub async fn start(
        mut config: IngesterConfig,
        process: &Process,
        catalog: Arc<CatalogClient>,
        store: Arc<dyn object_store::ObjectStore>,
    ) -> Result<IngesterNode, crate::error::StartError> {
        let wal_dir = config.data_dir.join("wal");
        let mut wal_config = WalConfig::new(wal_dir.clone(), config.wal_mode);
        wal_config.limits = config.pipeline.limits;
        wal_config.skip_corrupt = config.wal_skip_corrupt;
        let (wal, last_seq, repair) = Wal::open(&wal_config)?;
        if repair.torn_bytes > 0 {
            tracing::warn!(target: "mira::ingester", bytes = repair.torn_bytes, "cut a torn WAL tail");
        }
        // Fence before reading the watermarks: from here on an older
        // process under this id publishes nothing, so they cannot move.
        let epoch = fence(&catalog, &config.ingester_id).await?;
        let marks = watermarks(&catalog, &config.ingester_id).await;
        // Sequences continue above everything the catalog holds for this
        // id, even when the WAL was swept empty or the volume is new.
        wal.raise_floor(marks.values().copied().max().unwrap_or(0));
        let clock = process.clock.clone();
        let metrics = Arc::new(process.telemetry.register("ingester", crate::metrics::Metrics::new));
        let health = Arc::new(Health::new(wal.clone(), clock.clone()));
        {
            let (ready, notes) = (health.clone(), health.clone());
            process.telemetry.readiness("ingester", move || ready.readiness());
            process.telemetry.ready_notes("ingester", move || notes.notes());
        }
        let quarantine_dir = config.data_dir.join("quarantine");
        note_quarantine_copies(&quarantine_dir, &health);
        health.export(&metrics);
        {
            let m = metrics.clone();
            wal.on_group(move |g| {
                m.wal_write.observe(g.write.as_secs_f64());
                m.wal_fsync.observe(g.fsync.as_secs_f64());
                m.wal_group_frames.observe(g.frames as f64);
                tracing::debug!(target: "mira::ingester::probe", frames = g.frames, bytes = g.bytes, write_us = g.write.as_micros() as u64, fsync_us = g.fsync.as_micros() as u64, "wal group");
            });
        }
        let dest = Destination {
            multipart_above: config.multipart_above,
            metrics: metrics.clone(),
            store,
            catalog: catalog.clone(),
            ingester_id: config.ingester_id.clone(),
            epoch,
            chunk_blocks: config.publish_chunk_blocks,
            quarantine_dir,
            health: health.clone(),
            clock: clock.clone(),
        };
        let replayed = recover(
            &dest,
            &wal,
            config.pipeline.limits,
            config.wal_skip_corrupt,
            &marks,
            config.pipeline.seal.max_bytes,
        )
        .await?;
        tracing::info!(target: "mira::ingester", frames = replayed.frames, skipped = replayed.skipped, generations = replayed.generations, last_seq, epoch, "WAL recovered");
        let series = Arc::new(crate::series::ActiveSeries::new(
            process.security.limits.clone(),
            process.clock.clone(),
        ));
        let pipeline = Arc::new(Pipeline::start_with_series(config.pipeline, wal.clone(), dest, series));

        let receivers = Receivers::new(
            pipeline.clone(),
            config.receivers.clone(),
            process.security.auth.clone(),
            process.security.limits.clone(),
        );
        let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen)
            .await
            .map_err(|e| crate::error::StartError::Listen(config.grpc_listen.to_string(), e))?;
        let http_listener = tokio::net::TcpListener::bind(config.http_listen)
            .await
            .map_err(|e| crate::error::StartError::Listen(config.http_listen.to_string(), e))?;
        let grpc_addr = grpc_listener
            .local_addr()
            .map_err(|e| crate::error::StartError::Listen(config.grpc_listen.to_string(), e))?;
        let http_addr = http_listener
            .local_addr()
            .map_err(|e| crate::error::StartError::Listen(config.http_listen.to_string(), e))?;
        let http = http_router(receivers.clone())
            .merge(crate::push::http_router(receivers.clone()))
            .merge(process.telemetry.router());
        // Recent data answers cluster members only (the querier's dialer
        // sends the cluster credential).
        let recent = tonic::service::Routes::new(process.security.guard.wrap(
            "recent",
            mira_proto::ingester::recent_server::RecentServer::new(crate::recent::RecentService::new(pipeline.clone())),
        ))
        .into_axum_router();
        // An advertised address with port 0 (a test binding any port) names
        // the port actually bound.
        if let Ok(a) = config.advertise.parse::<SocketAddr>()
            && a.port() == 0
        {
            config.advertise = SocketAddr::new(a.ip(), grpc_addr.port()).to_string();
        }
        // Registered before the first export is taken: a querier that asks
        // the catalog for live ingesters after an ack finds this one.
        register(&catalog, &config, &health, &clock).await;
        let tls = process.security.tls.clone();
        process.security.warn_if_open("ingester", grpc_addr);
        process.security.warn_if_open("ingester", http_addr);
        let servers = vec![
            HttpServer::spawn(
                grpc_listener,
                grpc_router(receivers).merge(recent),
                "ingester",
                tls.clone(),
            )
            .map_err(|e| crate::error::StartError::Listen(grpc_addr.to_string(), e))?,
            HttpServer::spawn(http_listener, http, "ingester", tls)
                .map_err(|e| crate::error::StartError::Listen(http_addr.to_string(), e))?,
        ];

        // Runtime lag: how late a 10 ms tick fires.
        let lag = {
            let m = metrics.clone();
            tokio::spawn(async move {
                let period = Duration::from_millis(10);
                loop {
                    let t = std::time::Instant::now();
                    tokio::time::sleep(period).await;
                    let late = t.elapsed().saturating_sub(period);
                    m.runtime_lag.observe(late.as_secs_f64());
                }
            })
        };
        // Lease in the catalog, renewed at a third of its ttl (a tenth
        // after a failure); writes stop being acknowledged when it lapses.
        let lease = {
            let catalog = catalog.clone();
            let config = config.clone();
            let health = health.clone();
            let metrics = metrics.clone();
            let clock = clock.clone();
            tokio::spawn(async move {
                loop {
                    let ok = heartbeat(&catalog, &config, &health, &clock).await;
                    health.export(&metrics);
                    // The lease counts from when the renewal was sent: one
                    // that took long to go through (the catalog was away)
                    // leaves little of it, so renew again at once.
                    let ttl = config.lease_ttl;
                    let wait = if !ok {
                        ttl / 10
                    } else if health.lease_remaining() < ttl * 2 / 3 {
                        Duration::ZERO
                    } else {
                        ttl / 3
                    };
                    tokio::time::sleep(wait).await;
                }
            })
        };
        // WAL sweep: delete segments every shard has published past.
        let sweep = {
            let catalog = catalog.clone();
            let id = config.ingester_id.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    if let Ok(r) = catalog
                        .get_watermarks(pb::GetWatermarksRequest {
                            ingester_id: id.clone(),
                            linearizable: false,
                        })
                        .await
                    {
                        let marks: HashMap<u16, u64> = r
                            .watermarks
                            .into_iter()
                            .filter_map(|w| u16::try_from(w.shard).ok().map(|s| (s, w.wal_seq)))
                            .collect();
                        match wal.sweep(|s| marks.get(&s).copied().unwrap_or(0)) {
                            Ok(n) if n > 0 => tracing::info!(target: "mira::ingester", segments = n, "swept WAL"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(target: "mira::ingester", error = %e, "WAL sweep failed"),
                        }
                    }
                }
            })
        };
        Ok(IngesterNode {
            pipeline: Some(pipeline),
            grpc_addr,
            http_addr,
            servers,
            background: vec![lease, sweep, lag],
            catalog,
            config,
            replayed,
            metrics,
            health,
            clock,
        })
    }

    /// The probes and counters served on `/metrics`.
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.metrics.clone()
    }

    /// What `/ready` reports (WAL recovered and writable, lease renewed,
    /// not fenced, nothing quarantined, catalog reachable).
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Ordered shutdown: stop accepting, seal and publish every open
    /// generation, leave the catalog.
    pub async fn shutdown(mut self) {
        for s in &mut self.servers {
            s.stop();
        }
        for s in self.servers.drain(..) {
            if tokio::time::timeout(Duration::from_secs(10), s.shutdown())
                .await
                .is_err()
            {
                tracing::warn!(target: "mira::ingester", "a server did not drain in 10 s");
            }
        }
        for b in self.background.drain(..) {
            b.abort();
        }
        if let Some(p) = self.pipeline.take() {
            match Arc::try_unwrap(p) {
                Ok(p) => p.shutdown(Duration::from_secs(60)).await,
                Err(_) => {
                    tracing::warn!(target: "mira::ingester", "pipeline still shared at shutdown; the WAL keeps open data")
                }
            }
        }
        let _ = self
            .catalog
            .heartbeat(&self.config.ingester_id, &self.config.advertise, self.clock.now_ns(), 0)
            .await;
    }
}
