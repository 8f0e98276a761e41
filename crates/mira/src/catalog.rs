//! `mira catalog` (run a catalog member) and `mira catalog-admin` (status,
//! membership changes, snapshots against a running cluster).

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Args, Subcommand};
use mira_catalog::{CatalogNode, ClientConfig, Settings, parse_peers, proto};
use mira_common::config::{ConfigError, Duration};

use mira_common::security::{Exposure, SecuritySettings};

use crate::flags::{
    ClusterFlags, ConfigFlags, DataDirFlag, Effective, SecurityFlags, StoreSettings, catalog_client_with, secured,
    set_given,
};

/// Flags of `mira catalog`; defaults are [`Settings::default`]'s.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// This member's id; must appear in --peers [default: 0].
    #[arg(long, env = "MIRA_NODE_ID")]
    pub node_id: Option<u64>,
    /// Address to listen on for gRPC (Raft and client API) and HTTP (/metrics, /ready, /live) [default: 0.0.0.0:7400].
    #[arg(long, env = "MIRA_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Every member as id=host:port, comma separated (this one included) [default: 0=127.0.0.1:7400].
    #[arg(long, env = "MIRA_PEERS")]
    pub peers: Option<String>,
    /// Members refuse Raft traffic carrying another cluster id [default: mira].
    #[arg(long, env = "MIRA_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Build a snapshot after this many log entries [default: 10000].
    #[arg(long, env = "MIRA_CATALOG_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,
    /// Log entries kept behind a snapshot for followers that lag [default: 1000].
    #[arg(long, env = "MIRA_CATALOG_KEEP_LOGS")]
    pub keep_logs: Option<u64>,
    /// Leader heartbeat interval [default: 100ms].
    #[arg(long, env = "MIRA_CATALOG_HEARTBEAT")]
    pub heartbeat: Option<Duration>,
    /// Election timeout (the random range's upper end is twice it) [default: 400ms].
    #[arg(long, env = "MIRA_CATALOG_ELECTION_TIMEOUT")]
    pub election_timeout: Option<Duration>,
    /// Earlier releases' --heartbeat in ms (hidden; one release).
    #[arg(long, env = "MIRA_CATALOG_HEARTBEAT_MS", hide = true, conflicts_with = "heartbeat")]
    pub heartbeat_ms: Option<u64>,
    /// Earlier releases' --election-timeout in ms (hidden; one release).
    #[arg(
        long,
        env = "MIRA_CATALOG_ELECTION_MS",
        hide = true,
        conflicts_with = "election_timeout"
    )]
    pub election_ms: Option<u64>,
    #[command(flatten)]
    pub data: DataDirFlag,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

impl CatalogArgs {
    /// The effective data directory, catalog and security settings, validated.
    pub fn settings(&self) -> Result<(StoreSettings, Settings, SecuritySettings), ConfigError> {
        let file = self.config.load()?;
        let (mut store, mut s, mut sec) = (file.store, file.catalog, file.security);
        self.security.apply(&mut sec);
        sec.validate(Exposure::Member)?;
        self.data.apply(&mut store);
        set_given!(
            self,
            s,
            node_id,
            listen,
            peers,
            cluster_id,
            snapshot_every,
            keep_logs,
            heartbeat,
            election_timeout
        );
        if let Some(ms) = self.heartbeat_ms {
            s.heartbeat = Duration::from_millis(ms);
        }
        if let Some(ms) = self.election_ms {
            s.election_timeout = Duration::from_millis(ms);
        }
        s.validate()?;
        Ok((store, s, sec))
    }
}

/// Runs a member until SIGINT/SIGTERM.
pub async fn run(args: CatalogArgs) -> anyhow::Result<()> {
    let (store, settings, security) = args.settings()?;
    if args.config.check_config {
        Effective {
            store: Some(&store),
            catalog: Some(&settings),
            security: Some(&security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    let data_dir = std::path::absolute(&store.data_dir)?;
    let process = secured(crate::process()?, &security, Exposure::Member)?;
    let node = CatalogNode::start(settings.build(&data_dir)?, &process).await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::catalog", "stopping");
    node.shutdown().await;
    Ok(())
}

/// Flags of `mira catalog-admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Catalog members to talk to, comma separated host:port.
    #[arg(long, env = "MIRA_CATALOG", default_value = "127.0.0.1:7400")]
    pub catalog: String,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Print the answering member's view: term, leader, indexes, members.
    Status,
    /// Make the voter set exactly these members (id=host:port,...); new ones
    /// join as learners, catch up, then become voters.
    SetMembers { members: String },
    /// Build a snapshot now; prints its log index.
    Snapshot,
    /// Remove an ingester from the registered set (queriers stop asking it
    /// and stop marking answers partial for it). Only for an ingester that
    /// is gone for good: rows still in its WAL are not published by this.
    ForgetIngester {
        /// The ingester's --ingester-id.
        id: String,
    },
    /// Print the object key of every live block of a tenant and signal,
    /// one per line (linearizable), e.g. to feed `mira block-dump`.
    Blocks {
        #[arg(long, default_value = "default")]
        tenant: String,
        #[arg(long, value_parser = ["logs", "traces", "metrics"], default_value = "logs")]
        signal: String,
    },
}

pub async fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let client = catalog_client_with(
        &args.catalog,
        &args.cluster.dialer()?,
        ClientConfig {
            timeout: std::time::Duration::from_secs(60),
            attempt_timeout: std::time::Duration::from_secs(30),
            ..ClientConfig::default()
        },
    );
    match args.command {
        AdminCommand::Status => {
            let s = client.status().await?;
            println!(
                "member {} of cluster {:?}: term {}, leader {}, applied {}, last log {}, snapshot {}",
                s.node_id,
                s.cluster_id,
                s.term,
                s.leader_id
                    .map_or_else(|| "none".to_owned(), |l| format!("{l} ({})", s.leader_address)),
                s.applied_index,
                s.last_log_index,
                s.snapshot_index
            );
            for m in s.members {
                let registered = if m.incarnation.is_empty() {
                    "not registered".to_owned()
                } else {
                    format!("data directory {}", m.incarnation)
                };
                println!(
                    "  {} {} {} ({registered})",
                    m.id,
                    m.address,
                    if m.voter { "voter" } else { "learner" }
                );
            }
        }
        AdminCommand::SetMembers { members } => {
            let members = parse_peers(&members)?
                .into_iter()
                .map(|(id, address)| proto::Member {
                    id,
                    address,
                    voter: true,
                    incarnation: String::new(),
                })
                .collect();
            let reply = client.change_membership(members).await.context("change membership")?;
            for m in reply.members {
                println!("  {} {} {}", m.id, m.address, if m.voter { "voter" } else { "learner" });
            }
        }
        AdminCommand::Snapshot => println!("snapshot at log index {}", client.trigger_snapshot().await?),
        AdminCommand::ForgetIngester { id } => {
            let now = mira_common::clock::Clock::from_env()?.now_ns();
            // A heartbeat with ttl 0 is the deregistration a clean
            // shutdown sends.
            client.heartbeat(&id, "forgotten-by-admin", now, 0).await?;
            println!("ingester {id:?} is no longer registered");
        }
        AdminCommand::Blocks { tenant, signal } => {
            let signal: mira_core::Signal = signal.parse()?;
            let reply = client
                .list_blocks(proto::ListBlocksRequest {
                    tenant,
                    signal: mira_catalog::pb_impl::signal::to_pb(signal),
                    min_time_ns: 0,
                    max_time_ns: i64::MAX,
                    states: vec![],
                    linearizable: true,
                    ..Default::default()
                })
                .await?;
            for b in reply.blocks {
                println!("{}", b.object_key);
            }
        }
    }
    Ok(())
}
