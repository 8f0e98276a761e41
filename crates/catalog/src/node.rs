//! A catalog member: opens its stores, starts openraft, serves gRPC (Raft +
//! client API) and the process's probes (`/metrics`, `/ready`, `/live`) on one port, and bootstraps
//! the cluster from the static peer list.
//!
//! **A member that lost its data directory does not come back under its
//! id.** Raft's safety rests on a member never forgetting its vote; a
//! StatefulSet pod whose volume was deleted returns with the same ordinal,
//! so the same id, on an empty disk. Each data directory therefore has an
//! incarnation (a ULID in [`MEMBER_FILE`], made once the directory passed
//! the check below), which the member registers in the replicated state
//! once it has joined ([`crate::model::Command::RegisterMember`]). A member
//! starting on an empty directory keeps its Raft port closed (no vote, no
//! entries: [`RaftGate`]) and asks its peers first ([`check_data_dir`]):
//! if one knows its id under an incarnation, it refuses to start
//! ([`Error::LostDataDir`]); it opens once enough peers answered that any
//! registration would have been seen (`n - quorum + 1` of them; a
//! registration is held by a quorum). The lowest id initializes a cluster
//! only on the same evidence, with none of those peers initialized, so a
//! wiped member 0 never bootstraps a second cluster beside the running
//! one. `set-members` forgets the ids it removes, after which an empty
//! directory may join under the id as a new member.

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
use crate::error::ClientError;
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

/// The file in a member's data directory naming the directory's
/// incarnation: `<node id> <ULID>`.
pub const MEMBER_FILE: &str = "member";

/// Whether this member takes Raft traffic (votes, entries, snapshots).
#[derive(Debug, Default)]
pub struct RaftGate(std::sync::Mutex<Option<String>>);

impl RaftGate {
    fn closed_because(why: String) -> RaftGate {
        RaftGate(std::sync::Mutex::new(Some(why)))
    }

    /// Why it is closed; `None` when open.
    pub fn closed(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set(&self, why: Option<String>) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }
}

/// Reads `<data dir>/member`: `Some((id, incarnation))`, or `None` when
/// absent; a file of another member's id is refused.
fn read_member_file(dir: &std::path::Path, node_id: NodeId) -> Result<Option<String>, Error> {
    let path = dir.join(MEMBER_FILE);
    let storage = |e: std::io::Error| Error::Storage {
        path: path.display().to_string(),
        source: e.into(),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(storage(e)),
    };
    let mut words = text.split_whitespace();
    match (
        words.next().and_then(|w| w.parse::<NodeId>().ok()),
        words.next(),
        words.next(),
    ) {
        (Some(id), Some(inc), None) if id == node_id && !inc.is_empty() && inc.len() <= 64 => Ok(Some(inc.to_owned())),
        (Some(id), Some(_), None) => Err(bad(
            "catalog.node_id",
            format!(
                "{} belongs to catalog member {id}, not {node_id}: a data directory keeps its member id",
                path.display()
            ),
        )),
        _ => Err(storage(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "expected `<member id> <incarnation>`",
        ))),
    }
}

/// Writes `<data dir>/member` durably (temp file, fsync, rename, fsync dir).
fn write_member_file(dir: &std::path::Path, node_id: NodeId, incarnation: &str) -> Result<(), Error> {
    let path = dir.join(MEMBER_FILE);
    let tmp = dir.join(format!("{MEMBER_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{node_id} {incarnation}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| Error::Storage {
        path: path.display().to_string(),
        source: e.into(),
    })
}

/// What the peers said about this member and the cluster.
#[derive(Debug, Default)]
struct PeerView {
    /// Peers of this cluster id that answered.
    answered: usize,
    /// Some answering peer belongs to an initialized cluster.
    initialized: bool,
    /// (peer, incarnation) when a peer knows this id under an incarnation.
    registered: Option<(NodeId, String)>,
}

/// How many of the other members must answer before an empty member may
/// conclude it was never registered: a registration is committed on a
/// quorum, of which at most one (this member) has forgotten it.
fn peers_needed(members: usize) -> usize {
    if members <= 1 {
        return 0;
    }
    members - (members / 2 + 1) + 1
}

/// Asks every other member for its status once (each with a short timeout).
async fn probe_peers(config: &NodeConfig, dialer: &mira_common::cluster::Dialer) -> PeerView {
    let mut view = PeerView::default();
    for (&id, addr) in config.peers.iter().filter(|(id, _)| **id != config.node_id) {
        let client = CatalogClient::new(
            vec![addr.clone()],
            ClientConfig {
                timeout: Duration::from_millis(500),
                dialer: dialer.clone(),
                ..ClientConfig::default()
            },
        );
        let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(1), client.status_of_first()).await else {
            continue;
        };
        if status.cluster_id != config.cluster_id || status.node_id != id {
            tracing::warn!(target: "mira::catalog", peer = id, addr = %addr, cluster = %status.cluster_id, answered_as = status.node_id,
                "a peer address answers for another cluster or member; not counted");
            continue;
        }
        view.answered += 1;
        view.initialized |= !status.members.is_empty();
        if let Some(m) = status
            .members
            .iter()
            .find(|m| m.id == config.node_id && !m.incarnation.is_empty())
        {
            view.registered.get_or_insert((id, m.incarnation.clone()));
        }
    }
    view
}

/// The check of a member starting on an empty data directory (see the
/// module doc): waits until enough peers answered; refuses when one knows
/// this id.
async fn check_data_dir(config: &NodeConfig, dialer: &mira_common::cluster::Dialer) -> Result<(), Error> {
    let need = peers_needed(config.peers.len());
    let mut backoff = mira_common::retry::Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
    let mut last_log = std::time::Instant::now();
    loop {
        let view = probe_peers(config, dialer).await;
        if let Some((peer, incarnation)) = view.registered {
            return Err(Error::LostDataDir {
                node_id: config.node_id,
                data_dir: config.data_dir.display().to_string(),
                peer,
                incarnation,
            });
        }
        if view.answered >= need {
            return Ok(());
        }
        if last_log.elapsed() >= Duration::from_secs(10) {
            tracing::info!(target: "mira::catalog", answered = view.answered, need,
                "empty data directory: waiting for peers to confirm this member id is new");
            last_log = std::time::Instant::now();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Registers this member's incarnation once it is part of a cluster with
/// a leader; a conflict (another incarnation holds the id) closes the gate.
async fn register(
    raft: Raft,
    config: NodeConfig,
    incarnation: String,
    replace: bool,
    gate: Arc<RaftGate>,
    dialer: mira_common::cluster::Dialer,
) {
    let mut metrics = raft.metrics();
    loop {
        let joined = {
            let m = metrics.borrow_and_update();
            m.current_leader.is_some() && m.membership_config.membership().get_node(&config.node_id).is_some()
        };
        if joined {
            break;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
    let client = CatalogClient::new(
        config.peers.values().cloned().collect(),
        ClientConfig {
            dialer,
            ..ClientConfig::default()
        },
    );
    let mut backoff = mira_common::retry::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let cmd = mira_proto::catalog::write_request::Command::RegisterMember(mira_proto::catalog::RegisterMember {
            node_id: config.node_id,
            incarnation: incarnation.clone(),
            replace,
        });
        match client.write(cmd).await {
            Ok(_) => {
                tracing::info!(target: "mira::catalog", node_id = config.node_id, %incarnation, "member registered");
                return;
            }
            Err(ClientError::Rejected(s)) => {
                let why = format!(
                    "catalog member {} is not the data directory that joined the cluster: {}",
                    config.node_id,
                    s.message()
                );
                tracing::error!(target: "mira::catalog", "{why}; no longer taking Raft traffic");
                gate.set(Some(why));
                return;
            }
            Err(e) => {
                tracing::debug!(target: "mira::catalog", error = %e, "member registration; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// A running member.
pub struct CatalogNode {
    raft: Raft,
    catalog: Arc<Catalog>,
    local_addr: SocketAddr,
    server: Option<HttpServer>,
    bootstrap: JoinHandle<()>,
    register: Option<JoinHandle<()>>,
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
        let known = read_member_file(&config.data_dir, config.node_id)?;
        let had_snapshot = config.data_dir.join("state").join("snapshot.bin").exists();
        let log = LogStore::open(&config.data_dir.join("raft-log.redb"))?;
        let sm = StateMachine::open(&config.data_dir.join("state"))?;
        let has_state = {
            use openraft::storage::RaftLogStorage;
            let mut l = log.clone();
            let state = l.get_log_state().await.map_err(|e| Error::Raft(e.to_string()))?;
            let vote = l.read_vote().await.map_err(|e| Error::Raft(e.to_string()))?;
            had_snapshot || state.last_log_id.is_some() || vote.is_some()
        };
        // Empty and never checked: the Raft port stays closed until the
        // peers confirmed this id is new (see the module doc).
        let fresh = known.is_none() && !has_state && config.peers.len() > 1;
        let gate = Arc::new(if fresh {
            RaftGate::closed_because(format!(
                "catalog member {} has an empty data directory and is checking with its peers that it did not lose one",
                config.node_id
            ))
        } else {
            RaftGate::default()
        });
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
            dialer: process.security.dialer.clone(),
        };
        let raft_svc = RaftService {
            raft: raft.clone(),
            cluster_id: config.cluster_id.clone(),
            gate: gate.clone(),
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
            let gate = gate.clone();
            process.telemetry.readiness("catalog", move || {
                if let Some(why) = gate.closed() {
                    return Err(why);
                }
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
        let dialer = process.security.dialer.clone();
        let mut node = CatalogNode {
            raft: raft.clone(),
            catalog,
            local_addr,
            server: Some(server),
            bootstrap: tokio::spawn(async {}),
            register: None,
        };
        let incarnation = match known {
            Some(inc) => inc,
            None if fresh => {
                tracing::info!(target: "mira::catalog", node_id = config.node_id, "empty data directory: asking the peers whether this member id is new");
                if let Err(e) = check_data_dir(&config, &dialer).await {
                    tracing::error!(target: "mira::catalog", "{e}");
                    node.shutdown().await;
                    return Err(e);
                }
                let inc = mira_core::ids::BlockId::new().to_string();
                write_member_file(&config.data_dir, config.node_id, &inc)?;
                gate.set(None);
                inc
            }
            None => {
                // A directory from before incarnations (or a restored
                // snapshot): its Raft state is its own.
                let inc = mira_core::ids::BlockId::new().to_string();
                write_member_file(&config.data_dir, config.node_id, &inc)?;
                inc
            }
        };
        node.bootstrap = tokio::spawn(bootstrap(raft.clone(), config.clone(), dialer.clone()));
        if config.peers.len() > 1 {
            node.register = Some(tokio::spawn(register(
                raft,
                config.clone(),
                incarnation,
                !fresh,
                gate,
                dialer,
            )));
        }
        tracing::info!(target: "mira::catalog", node_id = config.node_id, addr = %local_addr, "catalog member started");
        Ok(node)
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
        if let Some(r) = self.register.take() {
            r.abort();
        }
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

/// The member with the lowest id initializes the cluster when it is not
/// initialized, enough peers answered ([`peers_needed`]) and none of them
/// is; the others wait for the leader to reach them. An unreachable peer
/// is never taken as an uninitialized one.
async fn bootstrap(raft: Raft, config: NodeConfig, dialer: mira_common::cluster::Dialer) {
    let Some((&first, _)) = config.peers.first_key_value() else {
        return;
    };
    if first != config.node_id {
        return;
    }
    // Waits between probes and attempts with the one retry policy.
    let mut backoff = mira_common::retry::Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
    loop {
        match raft.is_initialized().await {
            Ok(true) | Err(_) => return,
            Ok(false) => {}
        }
        let view = probe_peers(&config, &dialer).await;
        if view.initialized {
            tracing::info!(target: "mira::catalog", "a peer already belongs to an initialized cluster; waiting to be reached");
            return;
        }
        if view.answered < peers_needed(config.peers.len()) {
            tracing::debug!(target: "mira::catalog", answered = view.answered, "waiting for peers before initializing");
            tokio::time::sleep(backoff.next_delay()).await;
            continue;
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
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}
