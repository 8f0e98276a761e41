//! A catalog member: opens its stores, starts openraft, serves gRPC (Raft +
//! client API) and the process's probes (`/metrics`, `/ready`, `/live`) on one port, and bootstraps
//! the cluster from the static peer list.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mira_common::Process;
use mira_common::http::HttpServer;
use mira_proto::catalog::catalog_server::CatalogServer;
use mira_proto::catalog::raft_server::RaftServer;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tokio::task::JoinHandle;

use crate::client::{CatalogClient, ClientConfig};
use crate::error::Error;
use crate::log_store::LogStore;
use crate::metrics::{Metrics, Reading};
use crate::network::{MAX_RAFT_MESSAGE, Network};
use crate::service::{CatalogService, RaftService};
use crate::state_machine::{Catalog, StateMachine};
use crate::types::{NodeId, Raft};

/// Configuration of one member.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: NodeId,
    /// Address to bind (gRPC and HTTP).
    pub listen: SocketAddr,
    /// Every member (this one included): id → address others reach it at.
    pub peers: BTreeMap<NodeId, String>,
    pub data_dir: PathBuf,
    /// Members refuse Raft traffic from another cluster id.
    pub cluster_id: String,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot (for slow followers).
    pub keep_logs: u64,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
}

impl NodeConfig {
    /// A single-member catalog (the `mira serve` shape).
    pub fn single(listen: SocketAddr, data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            node_id: 0,
            listen,
            peers: BTreeMap::from([(0, listen.to_string())]),
            data_dir,
            cluster_id: "mira".to_owned(),
            snapshot_every: 10_000,
            keep_logs: 1_000,
            heartbeat_ms: 100,
            election_timeout_ms: (400, 800),
        }
    }

    /// Checks the configuration, naming the bad field.
    pub fn validate(&self) -> Result<(), Error> {
        if !self.peers.contains_key(&self.node_id) {
            return Err(bad(
                "catalog.peers",
                format!("this member's id {} is not in the peer list", self.node_id),
            ));
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 128 {
            return Err(bad("catalog.cluster_id", "must be 1..=128 bytes"));
        }
        if self.snapshot_every == 0 {
            return Err(bad("catalog.snapshot_every", "must be at least 1"));
        }
        if self.heartbeat_ms == 0 || self.election_timeout_ms.0 <= self.heartbeat_ms {
            return Err(bad(
                "catalog.election_timeout",
                "must exceed the heartbeat, which must be at least 1 ms",
            ));
        }
        if self.election_timeout_ms.1 <= self.election_timeout_ms.0 {
            return Err(bad("catalog.election_timeout", "max must exceed min"));
        }
        Ok(())
    }
}

fn bad(field: &str, reason: impl Into<String>) -> Error {
    Error::Config(mira_common::config::ConfigError::new(field, reason))
}

/// Parses `0=host:port,1=host:port`.
pub fn parse_peers(s: &str) -> Result<BTreeMap<NodeId, String>, Error> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| bad("catalog.peers", format!("{part:?} is not id=host:port")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| bad("catalog.peers", format!("{id:?} is not a member id")))?;
        let addr = addr.trim();
        if addr.is_empty() || addr.contains(char::is_whitespace) {
            return Err(bad("catalog.peers", format!("bad address {addr:?} for member {id}")));
        }
        if out.insert(id, addr.to_owned()).is_some() {
            return Err(bad("catalog.peers", format!("member {id} named twice")));
        }
    }
    if out.is_empty() {
        return Err(bad("catalog.peers", "empty"));
    }
    Ok(out)
}

/// A running member.
pub struct CatalogNode {
    raft: Raft,
    catalog: Arc<Catalog>,
    local_addr: SocketAddr,
    server: Option<HttpServer>,
    bootstrap: JoinHandle<()>,
}

impl std::fmt::Debug for CatalogNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogNode")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

#[derive(Clone)]
struct HttpState {
    raft: Raft,
    catalog: Arc<Catalog>,
    metrics: Arc<Metrics>,
    log: LogStore,
}

/// Sets the gauges read from Raft and the state (before each scrape).
async fn refresh_metrics(s: HttpState) {
    let m = s.raft.metrics().borrow().clone();
    let blocks = s.catalog.read(|state, _| state.counts()).map(|(k, n)| (k.as_str(), n));
    let log = s.log.clone();
    let log_entries = tokio::task::spawn_blocking(move || log.len()).await.unwrap_or(0);
    s.metrics.set(&Reading {
        term: m.current_term,
        leader: m.current_leader,
        is_leader: m.current_leader == Some(m.id),
        applied: m.last_applied.map_or(0, |l| l.index),
        last_log: m.last_log_index.unwrap_or(0),
        log_entries,
        snapshot: m.snapshot.map_or(0, |l| l.index),
        blocks,
    });
}

impl CatalogNode {
    /// Opens the stores, starts Raft and the server; returns once listening.
    /// Bootstrapping (member with the lowest id initializing an empty
    /// cluster) continues in the background.
    pub async fn start(config: NodeConfig, process: &Process) -> Result<CatalogNode, Error> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir).map_err(|e| Error::Storage {
            path: config.data_dir.display().to_string(),
            source: e.into(),
        })?;
        let log = LogStore::open(&config.data_dir.join("raft-log.redb"))?;
        let sm = StateMachine::open(&config.data_dir.join("state"))?;
        let catalog = sm.catalog();
        let raft_config = Config {
            cluster_name: config.cluster_id.clone(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.keep_logs,
            purge_batch_size: 256,
            max_payload_entries: 64,
            ..Default::default()
        }
        .validate()
        .map_err(|e| bad("catalog", e.to_string()))?;
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            Network::new(config.cluster_id.clone(), process.security.dialer.clone()),
            log.clone(),
            sm,
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;

        let metrics = Arc::new(process.telemetry.register("catalog", Metrics::new));
        let catalog_svc = CatalogService {
            raft: raft.clone(),
            catalog: catalog.clone(),
            metrics: metrics.clone(),
            clock: process.clock.clone(),
            node_id: config.node_id,
            cluster_id: config.cluster_id.clone(),
            resets: Arc::new(tokio::sync::Semaphore::new(crate::service::MAX_CONCURRENT_RESETS)),
        };
        let raft_svc = RaftService {
            raft: raft.clone(),
            cluster_id: config.cluster_id.clone(),
        };
        // Both services answer cluster members only (refusals counted in
        // mira_cluster_refused_total); the probes stay open.
        let guard = &process.security.guard;
        let grpc = tonic::service::Routes::new(
            guard.wrap(
                "catalog",
                CatalogServer::new(catalog_svc)
                    .max_decoding_message_size(16 * 1024 * 1024)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE),
            ),
        )
        .add_service(
            guard.wrap(
                "raft",
                RaftServer::new(raft_svc)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE),
            ),
        )
        .into_axum_router();
        let http_state = HttpState {
            raft: raft.clone(),
            catalog: catalog.clone(),
            metrics,
            log,
        };
        {
            let s = http_state.clone();
            process
                .telemetry
                .on_scrape(move || Box::pin(refresh_metrics(s.clone())));
            let raft = raft.clone();
            process.telemetry.readiness("catalog", move || {
                raft.metrics()
                    .borrow()
                    .current_leader
                    .map(|_| ())
                    .ok_or_else(|| "no catalog leader is known".to_owned())
            });
        }
        let http = process.telemetry.router();
        let app = grpc.merge(http);

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| Error::Listen {
                addr: config.listen.to_string(),
                source: e,
            })?;
        let local_addr = listener.local_addr().map_err(|e| Error::Listen {
            addr: config.listen.to_string(),
            source: e,
        })?;
        let server =
            HttpServer::spawn(listener, app, "catalog", process.security.tls.clone()).map_err(|e| Error::Listen {
                addr: config.listen.to_string(),
                source: e,
            })?;
        let bootstrap = tokio::spawn(bootstrap(raft.clone(), config.clone(), process.security.dialer.clone()));
        tracing::info!(target: "mira::catalog", node_id = config.node_id, addr = %local_addr, "catalog member started");
        Ok(CatalogNode {
            raft,
            catalog,
            local_addr,
            server: Some(server),
            bootstrap,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Waits until this member knows a leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, Error> {
        let mut m = self.raft.metrics();
        let wait = async {
            loop {
                if let Some(l) = m.borrow_and_update().current_leader {
                    return Ok(l);
                }
                if m.changed().await.is_err() {
                    return Err(Error::Raft("stopped".to_owned()));
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| Error::Raft(format!("no leader within {timeout:?}")))?
    }

    /// Stops serving and shuts Raft down.
    pub async fn shutdown(mut self) {
        self.bootstrap.abort();
        if let Some(s) = self.server.as_mut() {
            s.stop();
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(target: "mira::catalog", error = %e, "raft shutdown");
        }
        if let Some(server) = self.server.take() {
            // Watch streams keep connections open; do not wait for them
            // forever. Aborting drops the connections, which ends the
            // watch tasks (their receivers go away).
            server.shutdown_within(Duration::from_secs(5)).await;
        }
    }
}

/// The member with the lowest id initializes the cluster when neither it
/// nor any reachable peer has been initialized; the others wait for the
/// leader to reach them.
async fn bootstrap(raft: Raft, config: NodeConfig, dialer: mira_common::cluster::Dialer) {
    let Some((&first, _)) = config.peers.first_key_value() else {
        return;
    };
    if first != config.node_id {
        return;
    }
    loop {
        match raft.is_initialized().await {
            Ok(true) | Err(_) => return,
            Ok(false) => {}
        }
        let others: Vec<String> = config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.node_id)
            .map(|(_, a)| a.clone())
            .collect();
        let mut peer_initialized = false;
        for addr in &others {
            let client = CatalogClient::new(
                vec![addr.clone()],
                ClientConfig {
                    timeout: Duration::from_millis(500),
                    dialer: dialer.clone(),
                    ..ClientConfig::default()
                },
            );
            if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(1), client.status_of_first()).await
                && !status.members.is_empty()
            {
                peer_initialized = true;
            }
        }
        if peer_initialized {
            tracing::info!(target: "mira::catalog", "a peer already belongs to an initialized cluster; waiting to be reached");
            return;
        }
        let members: BTreeMap<NodeId, BasicNode> = config
            .peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(target: "mira::catalog", "initialized the cluster");
                return;
            }
            Err(e) => {
                tracing::warn!(target: "mira::catalog", error = %e, "initialize failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
