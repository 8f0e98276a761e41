//! `mira-compactor`: rewrites the blocks ingesters publish so the object
//! count per partition stays bounded and settled hours reach the cold tier,
//! and deletes what it replaced once no query can still be reading it.
//! It depends only on mira-core, mira-common, mira-proto and the catalog
//! client; every decision is the catalog's to accept (one `ReplaceV2` per
//! job), so any number of compactors may run against one catalog.
//!
//! - [`planner`]: pure; from the catalog's blocks and the time, which
//!   partitions to merge (hot tiering), rewrite cold, or purge.
//! - [`view`]: the catalog read each round (blocks of every tenant and
//!   state, partition leases and their job manifests).
//! - [`job`]: one rewrite under its partition lease: manifest, fetch and
//!   verify, merge on the rewrite pool, PUT, Replace, release; takeover
//!   cleanup after a crashed holder; quarantine of corrupt inputs.
//! - [`gc`]: deletion after the grace and purge; the orphan sweep.
//! - [`settings`]: flags and the `[compactor]` table.
//! - [`metrics`]: the `mira_compactor_*` metrics.
//! - [`server`]: `/metrics`, `/ready`, `/live` and
//!   `/api/mira/v1/compactor/status`.
//! - [`error`]: why a job failed, and its outcome label.
//! - [`targets`], [`copy`]: offload targets and the hashed whole-object
//!   copy between stores.
//! - [`restore`]: `mira offload restore`: offloaded blocks copied back to
//!   the primary store under their partition lease, marked live and
//!   pinned, verified; [`progress`] renders its events.
//! - [`fault`]: test-only aborts at named steps (`fault-hooks`).
//! - [`testing`]: helpers for tests (publish a real block, offload blocks
//!   as the offload lane does).

pub mod copy;
pub mod error;
pub mod fault;
pub mod gc;
pub mod job;
pub mod lifecycle;
pub mod metrics;
pub mod pace;
pub mod planner;
pub mod progress;
pub mod restore;
pub mod server;
pub mod settings;
pub mod targets;
pub mod testing;
pub mod view;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mira_catalog::CatalogClient;
use mira_common::Process;
use mira_common::clock::Clock;
use object_store::ObjectStore;
use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit, watch};

pub use error::Error;
use metrics::Metrics;
use planner::{Job, JobKind, Plan, Rules};

/// What a compactor runs with (built by [`settings::Settings::build`]).
#[derive(Clone, Debug)]
pub struct CompactorConfig {
    /// Lease holder: `{compactor id}/{incarnation}`.
    pub holder: String,
    pub jobs: usize,
    pub threads: usize,
    pub memory_limit: u64,
    pub plan_interval: Duration,
    pub lease_ttl: Duration,
    pub orphan_grace_ns: i64,
    pub orphan_sweep_interval: Duration,
    pub rules: Rules,
    pub offload: OffloadConfig,
    /// Most of the catalog's time retention, offload and purge commands
    /// take, in percent ([`pace`]).
    pub catalog_share_percent: u32,
    /// Run until no work is due, then stop.
    pub once: bool,
    /// Plan only; write nothing.
    pub dry_run: bool,
}

/// How the compactor offloads (targets are opened by [`Compactor::new`]).
#[derive(Clone, Debug, Default)]
pub struct OffloadConfig {
    /// `NAME=URL` of each target.
    pub target_specs: Vec<String>,
    pub target_options: Vec<(String, String)>,
    pub min_age_ns: i64,
    pub concurrency: usize,
    /// Bytes per second across copies (0: no limit).
    pub rate_bytes: u64,
}

/// Everything a job needs.
pub struct Ctx {
    pub config: CompactorConfig,
    pub store: Arc<dyn ObjectStore>,
    pub catalog: Arc<CatalogClient>,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    /// Offload targets by name.
    pub targets: targets::Targets,
    /// Blocks' resources read for policies with selectors.
    pub(crate) resources: lifecycle::ResourceCache,
    /// When each policy's status was last written.
    pub(crate) status_written: Mutex<std::collections::HashMap<(mira_core::policy::PolicyKind, String), Instant>>,
    /// Spaces retention, offload and purge commands ([`pace`]).
    pub(crate) pacer: pace::CatalogPacer,
    pool: Arc<rayon::ThreadPool>,
    /// Memory budget in MiB permits.
    memory: Semaphore,
    memory_mib: u32,
    status: Mutex<Status>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").field("holder", &self.config.holder).finish()
    }
}

/// A reservation of the memory budget, released on drop.
pub(crate) struct Reservation<'a> {
    _permit: SemaphorePermit<'a>,
    bytes: i64,
    metrics: &'a Metrics,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.metrics.memory_reserved_bytes.dec_by(self.bytes);
    }
}

impl Ctx {
    /// Reserves `bytes` of the memory budget (all of it at most: a job
    /// larger than the budget runs alone), waiting for running jobs.
    pub(crate) async fn reserve(&self, bytes: u64) -> Result<Reservation<'_>, Error> {
        let mib = u32::try_from(bytes.div_ceil(1 << 20))
            .unwrap_or(u32::MAX)
            .clamp(1, self.memory_mib);
        let permit = self.memory.acquire_many(mib).await.map_err(|_| Error::Stopping)?;
        let bytes = i64::from(mib) << 20;
        self.metrics.memory_reserved_bytes.inc_by(bytes);
        Ok(Reservation {
            _permit: permit,
            bytes,
            metrics: &self.metrics,
        })
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What `/api/mira/v1/compactor/status` answers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub holder: String,
    pub rounds: u64,
    pub running: Vec<JobStatus>,
    /// The last 20 finished jobs, newest last.
    pub finished: VecDeque<JobStatus>,
    pub backlog: std::collections::BTreeMap<JobKind, planner::Backlog>,
    pub quarantined_blocks: u64,
    pub partitions: u64,
    pub max_partition_objects: u64,
    pub last_sweep: Option<gc::SweepReport>,
    /// What the last retention and offload pass did.
    pub last_lifecycle: Option<lifecycle::LifecycleReport>,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobStatus {
    pub kind: JobKind,
    pub partition: String,
    pub inputs: usize,
    pub input_bytes: u64,
    pub started_ns: i64,
    pub outcome: Option<String>,
    pub error: Option<String>,
    pub report: Option<job::JobReport>,
}

/// What one round did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundReport {
    pub jobs_ok: usize,
    pub jobs_failed: usize,
    pub purged: usize,
    /// Jobs due that this round did not start (over `--jobs`).
    pub jobs_left: usize,
    /// Partitions with work that another holder leases.
    pub leased_elsewhere: u64,
    /// Offloaded blocks whose primary object was deleted.
    pub primaries_freed: usize,
    /// Offloaded blocks past the grace whose primary object was kept
    /// because their copy failed its check (tried again next round).
    pub primaries_kept: usize,
    pub lifecycle: lifecycle::LifecycleReport,
}

/// A compactor: plans and runs rounds until shut down.
#[derive(Debug)]
pub struct Compactor {
    ctx: Arc<Ctx>,
    ready: watch::Sender<bool>,
    last_sweep: Mutex<Option<Instant>>,
    /// When the offload targets and their checks were last registered.
    targets_registered: Mutex<Option<Instant>>,
}

/// How often a compactor checks its offload targets and registers the
/// result (the catalog's `checked_at_ns` is at most this old while it runs).
pub const TARGET_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Longest an offload target's reachability check may take.
pub const TARGET_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl Compactor {
    pub fn new(
        config: CompactorConfig,
        process: &Process,
        store: Arc<dyn ObjectStore>,
        catalog: Arc<CatalogClient>,
    ) -> Result<Arc<Compactor>, Error> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads)
            .thread_name(|i| format!("mira-compact-{i}"))
            .build()
            .map_err(|e| Error::Internal(format!("rewrite pool: {e}")))?;
        let metrics = Arc::new(process.telemetry.register("compactor", Metrics::new));
        let memory_mib = u32::try_from(config.memory_limit >> 20).unwrap_or(u32::MAX).max(1);
        let targets = targets::Targets::open(&config.offload.target_specs, &config.offload.target_options)?;
        let pacer = pace::CatalogPacer::new(config.catalog_share_percent);
        let ctx = Arc::new(Ctx {
            status: Mutex::new(Status {
                holder: config.holder.clone(),
                ..Status::default()
            }),
            config,
            store,
            catalog,
            clock: process.clock.clone(),
            metrics,
            targets,
            resources: lifecycle::ResourceCache::default(),
            status_written: Mutex::default(),
            pacer,
            pool: Arc::new(pool),
            memory: Semaphore::new(memory_mib as usize),
            memory_mib,
        });
        let (ready, _) = watch::channel(false);
        let compactor = Arc::new(Compactor {
            ctx,
            ready,
            last_sweep: Mutex::new(None),
            targets_registered: Mutex::new(None),
        });
        let ready = compactor.ready.subscribe();
        process.telemetry.readiness("compactor", move || {
            if *ready.borrow() {
                Ok(())
            } else {
                Err("no planning round has read the catalog yet".to_owned())
            }
        });
        Ok(compactor)
    }

    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    pub fn status(&self) -> Status {
        self.ctx.status().clone()
    }

    /// Reads the catalog and plans, without doing anything.
    pub async fn plan(&self) -> Result<(Plan, view::View), Error> {
        let view = view::load(&self.ctx).await?;
        let plan = planner::plan(
            &view.blocks,
            &view.leased,
            self.ctx.clock.now_ns(),
            &self.ctx.config.rules,
        );
        self.record_plan(&plan, &view);
        let _ = self.ready.send(true);
        Ok((plan, view))
    }

    fn record_plan(&self, plan: &Plan, view: &view::View) {
        let m = &self.ctx.metrics;
        m.plans.inc();
        for kind in JobKind::ALL {
            let b = plan.backlog.get(&kind).cloned().unwrap_or_default();
            let label = Metrics::kind(kind.as_str());
            m.backlog_partitions
                .get_or_create(&label)
                .set(i64::try_from(b.partitions).unwrap_or(i64::MAX));
            m.backlog_bytes
                .get_or_create(&label)
                .set(i64::try_from(b.bytes).unwrap_or(i64::MAX));
            m.oldest_pending_seconds.get_or_create(&label).set(b.oldest_pending_s);
        }
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        m.partitions.set(gauge(plan.partitions));
        m.partition_objects_max.set(gauge(plan.max_partition_objects));
        m.tombstoned_pending_blocks.set(gauge(plan.tombstoned_pending.0));
        m.tombstoned_pending_bytes.set(gauge(plan.tombstoned_pending.1));
        m.quarantined_blocks.set(gauge(plan.quarantined));
        m.leases_held.set(gauge(view.held as u64));
        let mut s = self.ctx.status();
        s.rounds += 1;
        s.backlog = plan.backlog.clone();
        s.quarantined_blocks = plan.quarantined;
        s.partitions = plan.partitions;
        s.max_partition_objects = plan.max_partition_objects;
    }

    /// One round: plan, purge what is past the grace, run up to `--jobs`
    /// due jobs at once, and (every `orphan_sweep_interval`) sweep orphans.
    pub async fn run_round(&self) -> Result<RoundReport, Error> {
        let (plan, view) = self.plan().await?;
        let mut report = RoundReport {
            leased_elsewhere: plan.leased_elsewhere,
            ..RoundReport::default()
        };
        if self.ctx.config.dry_run {
            report.jobs_left = plan.jobs.len();
            return Ok(report);
        }
        if !plan.purge.is_empty() {
            report.purged = gc::purge(&self.ctx, &plan.purge).await?;
        }
        if !plan.free_primary.is_empty() {
            let freed = gc::free_primaries(&self.ctx, &plan.free_primary).await?;
            report.primaries_freed = freed.freed;
            report.primaries_kept = freed.kept;
            report.leased_elsewhere += freed.leased;
            self.ctx.metrics.primaries_freed.inc_by(report.primaries_freed as u64);
        }
        self.register_targets().await;
        let mut jobs = plan.jobs;
        let policies = lifecycle::load(&self.ctx).await?;
        let (life, retention_jobs) = lifecycle::run(&self.ctx, &view.blocks, &policies).await;
        for j in jobs.iter_mut().filter(|j| j.kind == JobKind::Cold) {
            if let Some(first) = j.inputs.first() {
                j.split = lifecycle::split_for(&policies, first.tenant.as_str(), first.signal);
            }
        }
        // One job per partition a round: a rewrite planned by size waits
        // for the retention rewrite of its partition.
        let retained: std::collections::HashSet<String> =
            retention_jobs.iter().map(|j| j.partition.lease_key()).collect();
        jobs.retain(|j| !retained.contains(&j.partition.lease_key()));
        jobs.splice(
            0..0,
            retention_jobs
                .into_iter()
                .filter(|j| !view.leased.contains(&j.partition.lease_key())),
        );
        self.ctx.metrics.lifecycle_errors.inc_by(life.errors.len() as u64);
        for e in &life.errors {
            tracing::warn!(target: "mira::compactor", error = %e, "retention or offload step failed");
        }
        self.ctx.status().last_lifecycle = Some(life.clone());
        report.lifecycle = life;
        let take = jobs.len().min(self.ctx.config.jobs.max(1) * 4);
        report.jobs_left = jobs.len() - take;
        let results = jobs.into_iter().take(take).map(|j| {
            let stale = view.stale_manifests.get(&j.partition.lease_key()).cloned();
            self.run_job(j, stale)
        });
        for ok in limit(results, self.ctx.config.jobs).await {
            if ok {
                report.jobs_ok += 1;
            } else {
                report.jobs_failed += 1;
            }
        }
        let due = self
            .last_sweep
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|t| t.elapsed() >= self.ctx.config.orphan_sweep_interval);
        if due {
            self.sweep().await?;
        }
        Ok(report)
    }

    /// Tells the catalog which offload targets this compactor writes to,
    /// so policies naming them are accepted, with a reachability check of
    /// each ([`targets::probe`]): on the first round, then at most every
    /// [`TARGET_CHECK_INTERVAL`] (sooner when a registration failed).
    async fn register_targets(&self) {
        if self.ctx.targets.is_empty() {
            return;
        }
        let due = (self.targets_registered.lock().unwrap_or_else(PoisonError::into_inner))
            .is_none_or(|t| t.elapsed() >= TARGET_CHECK_INTERVAL);
        if !due {
            return;
        }
        let checks = self
            .ctx
            .targets
            .check(self.ctx.clock.now_ns(), TARGET_PROBE_TIMEOUT)
            .await;
        for c in checks.iter().filter(|c| !c.reachable) {
            tracing::warn!(target: "mira::compactor", target_name = c.name, error = c.error, "offload target unreachable");
        }
        let checks = checks
            .into_iter()
            .map(|c| mira_catalog::proto::OffloadTargetCheck {
                name: c.name,
                reachable: c.reachable,
                checked_at_ns: c.checked_at_ns,
                error: c.error,
            })
            .collect();
        match self.ctx.catalog.register_offload_target_checks(checks).await {
            Ok(_) => *self.targets_registered.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now()),
            Err(e) => tracing::warn!(target: "mira::compactor", error = %e, "could not register offload targets"),
        }
    }

    /// Runs the orphan sweep now.
    pub async fn sweep(&self) -> Result<gc::SweepReport, Error> {
        *self.last_sweep.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let r = gc::sweep_orphans(&self.ctx).await?;
        self.ctx.status().last_sweep = Some(r.clone());
        Ok(r)
    }

    async fn run_job(&self, j: Job, stale: Option<job::Manifest>) -> bool {
        let ctx = &self.ctx;
        let kind = j.kind;
        let mut st = JobStatus {
            kind,
            partition: j.partition.to_string(),
            inputs: j.inputs.len(),
            input_bytes: j.input_bytes(),
            started_ns: ctx.clock.now_ns(),
            outcome: None,
            error: None,
            report: None,
        };
        ctx.status().running.push(st.clone());
        let started = Instant::now();
        let result = job::run(ctx, &j, stale).await;
        ctx.metrics
            .job_duration
            .get_or_create(&Metrics::kind(kind.as_str()))
            .observe(started.elapsed().as_secs_f64());
        let ok = result.is_ok();
        match result {
            Ok(r) => {
                tracing::info!(
                    target: "mira::compactor",
                    kind = kind.as_str(),
                    partition = %j.partition,
                    inputs = r.inputs,
                    input_bytes = r.input_bytes,
                    output_bytes = r.output_bytes,
                    rows = r.rows,
                    output = %r.output_id,
                    rewrite_s = r.rewrite_s,
                    took_s = started.elapsed().as_secs_f64(),
                    "job done"
                );
                ctx.metrics.job_done(kind.as_str(), "ok");
                st.outcome = Some("ok".to_owned());
                st.report = Some(r);
            }
            Err(e) => {
                let outcome = e.outcome();
                if outcome == "conflict" {
                    tracing::info!(target: "mira::compactor", kind = kind.as_str(), partition = %j.partition, error = %e, "job not committed");
                } else {
                    tracing::warn!(target: "mira::compactor", kind = kind.as_str(), partition = %j.partition, error = %e, "job failed");
                }
                ctx.metrics.job_done(kind.as_str(), outcome);
                st.outcome = Some(outcome.to_owned());
                st.error = Some(e.to_string());
            }
        }
        let mut s = ctx.status();
        s.running
            .retain(|r| !(r.partition == st.partition && r.started_ns == st.started_ns));
        s.finished.push_back(st);
        while s.finished.len() > 20 {
            s.finished.pop_front();
        }
        ok
    }

    /// Rounds until one finds nothing due and nothing leased by another
    /// holder (`--once`; a crashed holder's lease is waited out), then a
    /// final orphan sweep. Returns the rounds' totals; `jobs_left` counts
    /// work it gave up on (failing jobs, leases that never expired).
    pub async fn run_until_idle(&self) -> Result<RoundReport, Error> {
        let mut total = RoundReport::default();
        // Rounds without progress before giving up: enough to outlast a
        // crashed holder's lease several times over.
        let mut attempts_left =
            20 + (4 * self.ctx.config.lease_ttl.as_secs() / self.ctx.config.plan_interval.as_secs().max(1)) as usize;
        loop {
            let r = self.run_round().await?;
            total.jobs_ok += r.jobs_ok;
            total.jobs_failed += r.jobs_failed;
            total.purged += r.purged;
            total.primaries_freed += r.primaries_freed;
            total.primaries_kept += r.primaries_kept;
            total.lifecycle.dropped_blocks += r.lifecycle.dropped_blocks;
            total.lifecycle.rewrites += r.lifecycle.rewrites;
            total.lifecycle.offloaded_blocks += r.lifecycle.offloaded_blocks;
            total.lifecycle.offloaded_bytes += r.lifecycle.offloaded_bytes;
            total.lifecycle.errors.extend(r.lifecycle.errors.iter().cloned());
            if self.ctx.config.dry_run {
                total.jobs_left = r.jobs_left;
                break;
            }
            let progress =
                r.jobs_ok + r.purged + r.primaries_freed + r.lifecycle.dropped_blocks + r.lifecycle.offloaded_blocks;
            if progress == 0 {
                if r.leased_elsewhere == 0 && r.jobs_failed == 0 {
                    break;
                }
                // Work another holder leases (or a crashed one's lease
                // still runs), or a job that failed: try again shortly.
                if attempts_left == 0 {
                    total.jobs_left = r.jobs_left + r.jobs_failed;
                    total.leased_elsewhere = r.leased_elsewhere;
                    break;
                }
                attempts_left -= 1;
                tokio::time::sleep(self.ctx.config.plan_interval.min(self.ctx.config.lease_ttl)).await;
            }
        }
        if !self.ctx.config.dry_run {
            self.sweep().await?;
        }
        Ok(total)
    }

    /// Runs rounds every `plan_interval` until `stop` turns true; a job in
    /// flight finishes (or fails) before it returns.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = mira_common::retry::Backoff::new(Duration::from_secs(1), self.ctx.config.plan_interval);
        loop {
            let wait = match self.run_round().await {
                Ok(r) => {
                    self.ctx.status().last_error = None;
                    backoff = mira_common::retry::Backoff::new(Duration::from_secs(1), self.ctx.config.plan_interval);
                    if r.jobs_left > 0 || r.jobs_ok > 0 {
                        Duration::ZERO
                    } else {
                        self.ctx.config.plan_interval
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "mira::compactor", error = %e, "planning round failed");
                    self.ctx.status().last_error = Some(e.to_string());
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// Runs `futures` with at most `n` at once, returning their outputs.
async fn limit<F: std::future::Future>(futures: impl IntoIterator<Item = F>, n: usize) -> Vec<F::Output> {
    use futures::StreamExt;
    futures::stream::iter(futures)
        .buffer_unordered(n.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn compactor(memory_limit: u64) -> Arc<Compactor> {
        let mut config = settings::Settings::default().build().expect("test step");
        config.memory_limit = memory_limit;
        let catalog = Arc::new(CatalogClient::new(
            vec!["127.0.0.1:1".to_owned()],
            mira_catalog::ClientConfig::default(),
        ));
        Compactor::new(
            config,
            &Process::default(),
            Arc::new(object_store::memory::InMemory::new()),
            catalog,
        )
        .expect("test step")
    }

    #[tokio::test]
    async fn a_job_waits_for_memory_and_a_job_over_the_limit_runs_alone() {
        let c = compactor(4 << 20);
        let ctx = c.ctx();
        let first = ctx.reserve(3 << 20).await.expect("test step");
        assert_eq!(ctx.metrics.memory_reserved_bytes.get(), 3 << 20);
        // 2 MiB more does not fit beside the first job: it waits.
        let mut second = Box::pin(ctx.reserve(2 << 20));
        assert!((&mut second).now_or_never().is_none());
        drop(first);
        let second = second.await.expect("test step");
        assert_eq!(ctx.metrics.memory_reserved_bytes.get(), 2 << 20);
        drop(second);
        // A job estimated over the whole budget takes all of it, alone.
        let big = ctx.reserve(64 << 20).await.expect("test step");
        assert_eq!(ctx.metrics.memory_reserved_bytes.get(), 4 << 20);
        assert!(ctx.reserve(1).now_or_never().is_none());
        drop(big);
        assert_eq!(ctx.metrics.memory_reserved_bytes.get(), 0);
    }
}
