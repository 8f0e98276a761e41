//! `mira catalog` (run a catalog member) and `mira catalog-admin` (status,
//! membership changes, snapshots against a running cluster).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use mira_catalog::{CatalogClient, CatalogNode, ClientConfig, NodeConfig, parse_peers, proto};

/// Flags of `mira catalog`.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// This member's id; must appear in --peers.
    #[arg(long, env = "MIRA_NODE_ID", default_value_t = 0)]
    pub node_id: u64,
    /// Address to listen on for gRPC (Raft and client API) and HTTP (/metrics, /ready).
    #[arg(long, env = "MIRA_LISTEN", default_value = "0.0.0.0:7400")]
    pub listen: SocketAddr,
    /// Every member as id=host:port, comma separated (this one included).
    #[arg(long, env = "MIRA_PEERS", default_value = "0=127.0.0.1:7400")]
    pub peers: String,
    /// Directory of the Raft log (redb) and the state snapshot.
    #[arg(long, env = "MIRA_DATA_DIR", default_value = "./data/catalog")]
    pub data_dir: PathBuf,
    /// Members refuse Raft traffic carrying another cluster id.
    #[arg(long, env = "MIRA_CLUSTER_ID", default_value = "mira")]
    pub cluster_id: String,
    /// Build a snapshot after this many log entries.
    #[arg(long, env = "MIRA_CATALOG_SNAPSHOT_EVERY", default_value_t = 10_000)]
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for followers that lag.
    #[arg(long, env = "MIRA_CATALOG_KEEP_LOGS", default_value_t = 1_000)]
    pub keep_logs: u64,
    /// Leader heartbeat interval, milliseconds.
    #[arg(long, env = "MIRA_CATALOG_HEARTBEAT_MS", default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Election timeout range, milliseconds (min; max is twice min).
    #[arg(long, env = "MIRA_CATALOG_ELECTION_MS", default_value_t = 400)]
    pub election_ms: u64,
}

impl CatalogArgs {
    pub fn node_config(&self) -> anyhow::Result<NodeConfig> {
        let config = NodeConfig {
            node_id: self.node_id,
            listen: self.listen,
            peers: parse_peers(&self.peers)?,
            data_dir: self.data_dir.clone(),
            cluster_id: self.cluster_id.clone(),
            snapshot_every: self.snapshot_every,
            keep_logs: self.keep_logs,
            heartbeat_ms: self.heartbeat_ms,
            election_timeout_ms: (self.election_ms, self.election_ms.saturating_mul(2)),
        };
        config.validate()?;
        Ok(config)
    }
}

/// Runs a member until SIGINT/SIGTERM.
pub async fn run(args: CatalogArgs) -> anyhow::Result<()> {
    let node = CatalogNode::start(args.node_config()?, &crate::process()?).await?;
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
    let endpoints = args
        .catalog
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let client = CatalogClient::new(
        endpoints,
        ClientConfig {
            timeout: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(30),
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
                println!("  {} {} {}", m.id, m.address, if m.voter { "voter" } else { "learner" });
            }
        }
        AdminCommand::SetMembers { members } => {
            let members = parse_peers(&members)?
                .into_iter()
                .map(|(id, address)| proto::Member {
                    id,
                    address,
                    voter: true,
                })
                .collect();
            let reply = client.change_membership(members).await.context("change membership")?;
            for m in reply.members {
                println!("  {} {} {}", m.id, m.address, if m.voter { "voter" } else { "learner" });
            }
        }
        AdminCommand::Snapshot => println!("snapshot at log index {}", client.trigger_snapshot().await?),
        AdminCommand::ForgetIngester { id } => {
            let now = crate::process()?.clock.now_ns();
            // A heartbeat with ttl 0 is the deregistration a clean
            // shutdown sends.
            client.heartbeat(&id, "forgotten-by-admin", now, 0).await?;
            println!("ingester {id:?} is no longer registered");
        }
        AdminCommand::Blocks { tenant, signal } => {
            let signal = match signal.as_str() {
                "traces" => proto::Signal::Traces,
                "metrics" => proto::Signal::Metrics,
                _ => proto::Signal::Logs,
            };
            let reply = client
                .list_blocks(proto::ListBlocksRequest {
                    tenant,
                    signal: signal as i32,
                    min_time_ns: 0,
                    max_time_ns: i64::MAX,
                    states: vec![],
                    linearizable: true,
                })
                .await?;
            for b in reply.blocks {
                println!("{}", b.object_key);
            }
        }
    }
    Ok(())
}
