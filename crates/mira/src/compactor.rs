//! `mira compactor`: merges small blocks, rewrites settled hours cold,
//! deletes replaced blocks after the grace and sweeps orphans. `--once`
//! runs until nothing is due and exits; `--dry-run` prints the plan as a
//! table and writes nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_common::config::{ByteSize, ConfigError, Duration};
use mira_compactor::planner::Plan;
use mira_compactor::settings::Settings;
use mira_compactor::{Compactor, CompactorConfig};

use mira_common::security::{Exposure, SecuritySettings};

use crate::flags::{
    ConfigFlags, Effective, SecurityFlags, StoreFlags, StoreSettings, catalog_client, secured, set_given,
};

/// Flags of `mira compactor`.
#[derive(Debug, Args)]
pub struct CompactorArgs {
    /// Catalog members, comma separated host:port [default: 127.0.0.1:7400].
    #[arg(long, env = "MIRA_CATALOG")]
    pub catalog: Option<String>,
    #[command(flatten)]
    pub store: StoreFlags,
    #[command(flatten)]
    pub compact: CompactFlags,
    /// Run until no work is due (after a final orphan sweep), then exit 0.
    #[arg(long)]
    pub once: bool,
    /// Print the plan as a table and exit; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// CPU priority (nice, 0 to 19) of the process, so merges and copies
    /// yield the CPU to ingest on a shared machine [default: 10].
    #[arg(long, env = "MIRA_COMPACTOR_NICE")]
    pub nice: Option<i32>,
    #[command(flatten)]
    pub security: SecurityFlags,
    #[command(flatten)]
    pub config: ConfigFlags,
}

/// How compaction runs (shared by `mira compactor` and `mira serve`);
/// defaults are [`Settings::default`]'s.
#[derive(Debug, Args)]
pub struct CompactFlags {
    /// HTTP listen address: /metrics, /ready, /live, status [default: 0.0.0.0:7600].
    #[arg(long, env = "MIRA_COMPACTOR_LISTEN")]
    pub compactor_listen: Option<SocketAddr>,
    /// Lease holder name [default: the host name].
    #[arg(long, env = "MIRA_COMPACTOR_ID")]
    pub compactor_id: Option<String>,
    /// Leased jobs at once [default: 2].
    #[arg(long, env = "MIRA_COMPACTOR_JOBS")]
    pub compactor_jobs: Option<usize>,
    /// Threads merging and encoding [default: the number of cores].
    #[arg(long, env = "MIRA_COMPACTOR_THREADS")]
    pub compactor_threads: Option<usize>,
    /// Memory reserved across running jobs [default: 2GiB].
    #[arg(long, env = "MIRA_COMPACTOR_MEMORY_LIMIT")]
    pub memory_limit: Option<ByteSize>,
    /// How often to plan [default: 30s].
    #[arg(long, env = "MIRA_PLAN_INTERVAL")]
    pub plan_interval: Option<Duration>,
    /// Partition lease time to live [default: 60s].
    #[arg(long, env = "MIRA_PARTITION_LEASE_TTL")]
    pub partition_lease_ttl: Option<Duration>,
    /// Hot merges ignore blocks younger than this [default: 60s].
    #[arg(long, env = "MIRA_MIN_BLOCK_AGE")]
    pub min_block_age: Option<Duration>,
    /// Fewest blocks of one size level merged together [default: 8].
    #[arg(long, env = "MIRA_MERGE_FACTOR")]
    pub merge_factor: Option<usize>,
    /// Most input blocks of one job [default: 1000].
    #[arg(long, env = "MIRA_MAX_INPUTS")]
    pub max_inputs: Option<usize>,
    /// Hot blocks at least this big wait for the cold rewrite [default: 32MiB].
    #[arg(long, env = "MIRA_MATURE_HOT_BYTES")]
    pub mature_hot_bytes: Option<ByteSize>,
    /// Largest hot merge output [default: 128MiB].
    #[arg(long, env = "MIRA_TARGET_HOT_BYTES")]
    pub target_hot_bytes: Option<ByteSize>,
    /// Cold output aimed at [default: 64MiB].
    #[arg(long, env = "MIRA_TARGET_COLD_BYTES")]
    pub target_cold_bytes: Option<ByteSize>,
    /// Most hot-equivalent input of one job [default: 1GiB].
    #[arg(long, env = "MIRA_MAX_JOB_BYTES")]
    pub max_job_bytes: Option<ByteSize>,
    /// An hour is rewritten cold this long after it ends [default: 1h].
    #[arg(long, env = "MIRA_COLD_AFTER")]
    pub cold_after: Option<Duration>,
    /// ...once nothing was published into it for this long [default: 10m].
    #[arg(long, env = "MIRA_SETTLE")]
    pub settle: Option<Duration>,
    /// Replaced objects are deleted this long after the swap [default: 1h].
    #[arg(long, env = "MIRA_DELETION_GRACE")]
    pub deletion_grace: Option<Duration>,
    /// Unreferenced objects older than this are deleted [default: 24h].
    #[arg(long, env = "MIRA_ORPHAN_GRACE")]
    pub orphan_grace: Option<Duration>,
    /// How often the orphan sweep lists the store [default: 24h].
    #[arg(long, env = "MIRA_ORPHAN_SWEEP_INTERVAL")]
    pub orphan_sweep_interval: Option<Duration>,
    /// An offload target NAME=URL (file:///abs/dir, s3://bucket/prefix,
    /// ...), the name offload policies use; repeatable.
    #[arg(long = "offload-target", env = "MIRA_OFFLOAD_TARGETS", value_delimiter = ',')]
    pub offload_targets: Vec<String>,
    /// object_store option key=value for the offload targets; repeatable.
    #[arg(
        long = "offload-target-option",
        env = "MIRA_OFFLOAD_TARGET_OPTIONS",
        value_delimiter = ','
    )]
    pub offload_target_options: Vec<String>,
    /// Blocks younger than this are never offloaded [default: 1h].
    #[arg(long, env = "MIRA_OFFLOAD_MIN_AGE")]
    pub offload_min_age: Option<Duration>,
    /// Blocks copied to targets at once [default: 4].
    #[arg(long, env = "MIRA_OFFLOAD_CONCURRENCY")]
    pub offload_concurrency: Option<usize>,
    /// Most bytes per second copied to targets, e.g. 50MiB (0: no limit)
    /// [default: 0].
    #[arg(long, env = "MIRA_OFFLOAD_RATE")]
    pub offload_rate: Option<ByteSize>,
    /// Most of the catalog's time retention, offload and purge commands
    /// take, in percent (1 to 100) [default: 10].
    #[arg(long, env = "MIRA_CATALOG_SHARE_PERCENT")]
    pub catalog_share_percent: Option<u32>,
}

impl CompactFlags {
    /// Overrides `s` with every flag (or variable) given.
    pub fn apply(&self, s: &mut Settings) {
        set_given!(
            self,
            s,
            memory_limit,
            plan_interval,
            min_block_age,
            merge_factor,
            max_inputs,
            mature_hot_bytes,
            target_hot_bytes,
            target_cold_bytes,
            max_job_bytes,
            cold_after,
            settle,
            deletion_grace,
            orphan_grace,
            orphan_sweep_interval,
            offload_min_age,
            offload_concurrency,
            offload_rate,
            catalog_share_percent,
        );
        if !self.offload_targets.is_empty() {
            s.offload_targets.clone_from(&self.offload_targets);
        }
        if !self.offload_target_options.is_empty() {
            s.offload_target_options.clone_from(&self.offload_target_options);
        }
        if self.compactor_id.is_some() {
            s.compactor_id.clone_from(&self.compactor_id);
        }
        if let Some(l) = self.compactor_listen {
            s.listen = l;
        }
        if let Some(j) = self.compactor_jobs {
            s.jobs = j;
        }
        if self.compactor_threads.is_some() {
            s.threads = self.compactor_threads;
        }
        if let Some(t) = self.partition_lease_ttl {
            s.lease_ttl = t;
        }
    }
}

impl CompactorArgs {
    /// The effective store, compactor and security settings, validated.
    pub fn settings(&self) -> Result<(StoreSettings, Settings, SecuritySettings), ConfigError> {
        let file = self.config.load()?;
        let (mut store, mut s, mut sec) = (file.store, file.compactor, file.security);
        self.security.apply(&mut sec);
        sec.validate(Exposure::Client)?;
        self.store.apply(&mut store)?;
        set_given!(self, s, catalog, nice);
        self.compact.apply(&mut s);
        store.validate()?;
        s.validate()?;
        Ok((store, s, sec))
    }
}

/// Starts a compactor loop and its HTTP server.
pub async fn start(
    settings: &Settings,
    config: CompactorConfig,
    process: &Process,
    store: Arc<dyn object_store::ObjectStore>,
    catalog: Arc<CatalogClient>,
) -> anyhow::Result<Running> {
    let compactor = Compactor::new(config, process, store, catalog)?;
    let server = mira_compactor::server::start(compactor.clone(), settings.listen, process).await?;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(compactor.run(rx));
    tracing::info!(target: "mira::compactor", addr = %server.addr(), "compactor ready");
    Ok(Running { server, stop, task })
}

/// A compactor running in this process.
#[derive(Debug)]
pub struct Running {
    server: mira_common::http::HttpServer,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops planning (a job in flight finishes or fails first), then the
    /// HTTP server.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.server.shutdown().await;
    }
}

/// The plan as a table (`--dry-run`).
fn print_plan(plan: &Plan) {
    println!(
        "{:<6} {:<40} {:>7} {:>12} {:>12}",
        "KIND", "PARTITION", "INPUTS", "BYTES", "ROWS"
    );
    for j in &plan.jobs {
        println!(
            "{:<6} {:<40} {:>7} {:>12} {:>12}",
            j.kind.as_str(),
            j.partition.to_string(),
            j.inputs.len(),
            j.input_bytes(),
            j.input_rows()
        );
    }
    let purge_bytes: u64 = plan.purge.iter().map(|b| b.bytes).sum();
    println!(
        "{} jobs; {} blocks past the deletion grace ({} bytes); {} partitions, at most {} objects in one; {} leased elsewhere; {} quarantined",
        plan.jobs.len(),
        plan.purge.len(),
        purge_bytes,
        plan.partitions,
        plan.max_partition_objects,
        plan.leased_elsewhere,
        plan.quarantined
    );
}

/// Sets every thread of the process (and so every thread they start) to
/// nice `nice`: on Linux a nice value belongs to a thread, and new threads
/// inherit their creator's.
fn lower_priority(nice: i32) -> anyhow::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    for task in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = task?.file_name().to_str().and_then(|t| t.parse::<libc::id_t>().ok()) else {
            continue;
        };
        // SAFETY: setpriority takes plain integers and touches no memory of ours.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
            let e = std::io::Error::last_os_error();
            anyhow::bail!("setting nice {nice} on thread {tid}: {e}");
        }
    }
    tracing::info!(target: "mira::compactor", nice, "running at a lower CPU priority");
    Ok(())
}

pub async fn run(args: CompactorArgs) -> anyhow::Result<()> {
    let (store_settings, settings, security) = args.settings()?;
    if args.config.check_config {
        Effective {
            store: Some(&store_settings),
            compactor: Some(&settings),
            security: Some(&security),
            ..Effective::default()
        }
        .print();
        return Ok(());
    }
    lower_priority(settings.nice)?;
    let process = secured(crate::process()?, &security, Exposure::Client)?;
    let (_, store) = store_settings.open()?;
    let mut config = settings.build()?;
    config.once = args.once;
    config.dry_run = args.dry_run;
    let catalog = catalog_client(&settings.catalog, &process.security.dialer);
    if args.dry_run {
        let compactor = Compactor::new(config, &process, store, catalog)?;
        let (plan, _) = compactor.plan().await?;
        print_plan(&plan);
        return Ok(());
    }
    if args.once {
        let compactor = Compactor::new(config, &process, store, catalog)?;
        let server = mira_compactor::server::start(compactor.clone(), settings.listen, &process).await?;
        let report = compactor.run_until_idle().await?;
        println!("{}", serde_json::to_string(&report)?);
        server.shutdown().await;
        return Ok(());
    }
    let running = start(&settings, config, &process, store, catalog).await?;
    crate::shutdown_signal().await;
    tracing::info!(target: "mira::compactor", "stopping");
    running.shutdown().await;
    Ok(())
}
