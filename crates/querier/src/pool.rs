//! The scan pool: every query's CPU work (decodes, scans, evaluation) on
//! one fixed set of threads (`--query-threads`), shared fairly across
//! tenants and stopped with its query.
//!
//! - **Fair**: jobs wait in one FIFO queue per tenant; a free thread takes
//!   the next job of the next tenant in turn (round robin), so one
//!   tenant's heavy queries queue behind each other, not in front of
//!   another tenant's. At most as many jobs run as the pool has threads,
//!   and at most `--tenant-query-threads` of one tenant (half the pool by
//!   default) while another tenant is active (has jobs queued or running,
//!   or had one in the last second): a job runs to its next cancellation
//!   check once started, so a tenant holding every thread with long jobs
//!   would make the next tenant wait for them; the cap keeps threads for
//!   the others. A tenant alone uses the whole pool. A job's own parallel
//!   parts (rayon `par_iter`) use the threads the running jobs leave
//!   idle.
//! - **Cancelled with its query**: a request runs in a [`scope`] (the
//!   query layer, [`crate::attempt`], sets it up under the query
//!   timeout). Dropping the scope (the timeout fired, the client went
//!   away) raises the request's [`Cancel`] flag: its queued jobs are
//!   dropped without running, and running ones see [`Cancel::is_set`] at
//!   their next check (every row range, every evaluation step, every
//!   1,024 lines, every trace) and return early. Counted in
//!   `mira_querier_cancelled_jobs_total{stage}`, the time from the flag
//!   to the job's thread being free in
//!   `mira_querier_cancel_release_seconds`.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// One request's cancellation flag, shared by all its jobs: when it was
/// raised, once it is.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<OnceLock<Instant>>);

impl Cancel {
    /// True once the request was dropped: stop and return.
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    fn raise(&self) {
        let _ = self.0.set(Instant::now());
    }

    fn raised_at(&self) -> Option<Instant> {
        self.0.get().copied()
    }
}

/// Who a request runs for and its flag (the task-local of [`scope`]).
#[derive(Debug, Clone)]
struct Scope {
    tenant: Arc<str>,
    cancel: Cancel,
}

tokio::task_local! {
    static SCOPE: Scope;
}

thread_local! {
    /// The flag of the job running on this pool thread.
    static CURRENT: RefCell<Option<Cancel>> = const { RefCell::new(None) };
}

/// Raises the flag when the request's future is dropped (finished,
/// timed out or abandoned).
struct RaiseOnDrop(Cancel);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.raise();
    }
}

/// Runs `fut` as one request of `tenant`: the pool jobs it submits queue
/// under the tenant and are cancelled when `fut` is dropped.
pub(crate) async fn scope<F: Future>(tenant: &str, fut: F) -> F::Output {
    let cancel = Cancel::default();
    let _raise = RaiseOnDrop(cancel.clone());
    SCOPE
        .scope(
            Scope {
                tenant: Arc::from(tenant),
                cancel,
            },
            fut,
        )
        .await
}

/// The flag of the job running on this thread (a never-raised one outside
/// a job). Take it before a `par_iter`: its closures run on other threads.
pub fn current() -> Cancel {
    CURRENT.with(|c| c.borrow().clone()).unwrap_or_default()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Debug)]
struct Metrics {
    cancelled: Family<StageLabels, Counter>,
    release: Histogram,
}

type Task = Box<dyn FnOnce() + Send>;

struct Job {
    tenant: Arc<str>,
    cancel: Cancel,
    run: Task,
}

#[derive(Default)]
struct Queues {
    running: usize,
    /// Running jobs by tenant (tenants with none are absent).
    running_of: HashMap<Arc<str>, usize>,
    /// When each tenant last submitted or finished a job (kept for the
    /// activity window).
    seen: HashMap<Arc<str>, Instant>,
    /// Tenants with queued jobs, in turn order.
    turn: VecDeque<Arc<str>>,
    queued: HashMap<Arc<str>, VecDeque<Job>>,
}

struct Shared {
    threads: rayon::ThreadPool,
    slots: usize,
    /// Most jobs of one tenant running at once while another is active.
    per_tenant: usize,
    /// How long a tenant counts as active after its last job.
    active: Duration,
    queues: Mutex<Queues>,
    metrics: Metrics,
}

/// The querier's scan pool.
pub(crate) struct ScanPool(Arc<Shared>);

impl std::fmt::Debug for ScanPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanPool").field("threads", &self.0.slots).finish()
    }
}

impl ScanPool {
    /// A pool of `threads` threads, at most `per_tenant` of them running
    /// one tenant's jobs while another tenant has been active within
    /// `active`.
    pub(crate) fn new(
        threads: usize,
        per_tenant: usize,
        active: Duration,
    ) -> Result<ScanPool, rayon::ThreadPoolBuildError> {
        let slots = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(slots)
            .thread_name(|i| format!("mira-scan-{i}"))
            .build()?;
        Ok(ScanPool(Arc::new(Shared {
            threads: pool,
            slots,
            per_tenant: per_tenant.clamp(1, slots),
            active,
            queues: Mutex::new(Queues::default()),
            metrics: Metrics {
                cancelled: Family::default(),
                release: Histogram::new(exponential_buckets(0.000_1, 2.5, 12)),
            },
        })))
    }

    /// Registers `cancelled_jobs_total{stage=queued|running}` and
    /// `cancel_release_seconds` in the querier's sub-registry.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let m = &self.0.metrics;
        registry.register(
            "cancelled_jobs",
            "Scan pool jobs of cancelled queries (timed out or abandoned): dropped while queued, or stopped while running",
            m.cancelled.clone(),
        );
        registry.register(
            "cancel_release_seconds",
            "From a query's cancellation to a running job of it freeing its scan thread",
            m.release.clone(),
        );
    }

    /// Runs `f` on the pool as a job of the current [`scope`]'s tenant and
    /// waits for it without holding a runtime worker.
    pub(crate) async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let scope = SCOPE.try_with(Scope::clone).unwrap_or_else(|_| Scope {
            tenant: Arc::from(""),
            cancel: Cancel::default(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            tenant: scope.tenant.clone(),
            cancel: scope.cancel,
            run: Box::new(move || {
                let _ = tx.send(f());
            }),
        };
        submit(&self.0, scope.tenant, job);
        match rx.await {
            Ok(v) => v,
            // The closure panicked (or its queue was dropped, which only a
            // cancelled request's is, and then nobody awaits this).
            Err(_) => panic!("a scan task panicked"),
        }
    }
}

fn submit(shared: &Arc<Shared>, tenant: Arc<str>, job: Job) {
    let mut guard = shared.queues.lock().unwrap_or_else(PoisonError::into_inner);
    let q: &mut Queues = &mut guard;
    let queue = q.queued.entry(tenant.clone()).or_default();
    if queue.is_empty() {
        q.turn.push_back(tenant.clone());
    }
    queue.push_back(job);
    q.seen.insert(tenant, Instant::now());
    let ready = next_jobs(shared, q);
    drop(guard);
    start(shared, ready);
}

/// Takes jobs off the queues, in tenant turn, while threads are free
/// (passing over tenants at their `per_tenant` share).
fn next_jobs(shared: &Shared, q: &mut Queues) -> Vec<Job> {
    let mut ready = Vec::new();
    let mut passed = 0;
    let active = shared.active;
    q.seen.retain(|_, at| at.elapsed() < active);
    while q.running < shared.slots && passed < q.turn.len() {
        let Some(tenant) = q.turn.pop_front() else { break };
        if q.running_of.get(&tenant).copied().unwrap_or(0) >= shared.per_tenant && others_active(q, &tenant) {
            q.turn.push_back(tenant);
            passed += 1;
            continue;
        }
        passed = 0;
        let Some(queue) = q.queued.get_mut(&tenant) else {
            continue;
        };
        let Some(job) = queue.pop_front() else { continue };
        if queue.is_empty() {
            q.queued.remove(&tenant);
        } else {
            q.turn.push_back(tenant);
        }
        if job.cancel.is_set() {
            shared
                .metrics
                .cancelled
                .get_or_create(&StageLabels { stage: "queued" })
                .inc();
            continue;
        }
        q.running += 1;
        *q.running_of.entry(job.tenant.clone()).or_default() += 1;
        ready.push(job);
    }
    ready
}

/// Whether a tenant other than `tenant` has jobs queued or running, or had
/// one within the activity window.
fn others_active(q: &Queues, tenant: &Arc<str>) -> bool {
    q.queued
        .keys()
        .chain(q.running_of.keys())
        .chain(q.seen.keys())
        .any(|t| t != tenant)
}

fn start(shared: &Arc<Shared>, jobs: Vec<Job>) {
    for job in jobs {
        let s = shared.clone();
        shared.threads.spawn(move || {
            let cancel = job.cancel.clone();
            let job_tenant = job.tenant.clone();
            CURRENT.with(|c| *c.borrow_mut() = Some(cancel.clone()));
            // A panicking job still frees its slot; its waiter sees the
            // dropped sender and re-raises on its own task.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.run));
            CURRENT.with(|c| *c.borrow_mut() = None);
            if cancel.is_set()
                && let Some(at) = cancel.raised_at()
            {
                s.metrics
                    .cancelled
                    .get_or_create(&StageLabels { stage: "running" })
                    .inc();
                s.metrics.release.observe(at.elapsed().as_secs_f64());
            }
            let mut guard = s.queues.lock().unwrap_or_else(PoisonError::into_inner);
            let q: &mut Queues = &mut guard;
            q.running -= 1;
            q.seen.insert(job_tenant.clone(), Instant::now());
            if let Some(n) = q.running_of.get_mut(&job_tenant) {
                *n -= 1;
                if *n == 0 {
                    q.running_of.remove(&job_tenant);
                }
            }
            let ready = next_jobs(&s, q);
            drop(guard);
            start(&s, ready);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    /// Spins until its request is cancelled, then returns how many turns
    /// it ran.
    fn spin_until_cancelled(started: mpsc::Sender<()>) -> u64 {
        let c = current();
        let _ = started.send(());
        let mut turns = 0u64;
        while !c.is_set() {
            turns += 1;
            std::thread::yield_now();
        }
        turns
    }

    fn counted(pool: &ScanPool, stage: &'static str) -> u64 {
        pool.0.metrics.cancelled.get_or_create(&StageLabels { stage }).get()
    }

    #[tokio::test]
    async fn a_dropped_request_stops_its_running_job_and_drops_its_queued_ones() {
        let pool = Arc::new(ScanPool::new(1, 1, Duration::from_secs(3600)).expect("test"));
        let (started_tx, started_rx) = mpsc::channel();
        let p = pool.clone();
        let heavy = tokio::spawn(scope("a", async move {
            let tx = started_tx.clone();
            let first = p.run(move || spin_until_cancelled(tx));
            let tx = started_tx.clone();
            let second = p.run(move || spin_until_cancelled(tx));
            futures::join!(first, second)
        }));
        tokio::task::spawn_blocking(move || started_rx.recv().expect("test"))
            .await
            .expect("test");
        heavy.abort();
        assert!(heavy.await.expect_err("aborted").is_cancelled());
        // The only thread is free again: another request's job runs.
        let answer = scope("b", pool.run(|| 42)).await;
        assert_eq!(answer, 42);
        assert_eq!(counted(&pool, "running"), 1);
        assert_eq!(counted(&pool, "queued"), 1);
    }

    #[tokio::test]
    async fn a_tenant_with_queued_jobs_does_not_hold_back_another_tenant() {
        let pool = Arc::new(ScanPool::new(1, 1, Duration::from_secs(3600)).expect("test"));
        // Tenant a's first job holds the only thread until released.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel();
        let order = Arc::new(Mutex::new(Vec::new()));
        let p = pool.clone();
        let blocker = tokio::spawn(scope("a", async move {
            p.run(move || {
                let _ = started_tx.send(());
                let _ = release_rx.recv();
            })
            .await
        }));
        tokio::task::spawn_blocking(move || started_rx.recv().expect("test"))
            .await
            .expect("test");
        // Ten more of a's jobs queue, then one of b's.
        let mut waits = Vec::new();
        for i in 0..10 {
            let (p, o) = (pool.clone(), order.clone());
            waits.push(tokio::spawn(scope("a", async move {
                p.run(move || o.lock().expect("test").push(format!("a{i}"))).await
            })));
            tokio::task::yield_now().await;
        }
        while pool
            .0
            .queues
            .lock()
            .expect("test")
            .queued
            .get("a")
            .map_or(0, VecDeque::len)
            < 10
        {
            tokio::task::yield_now().await;
        }
        let (p, o) = (pool.clone(), order.clone());
        waits.push(tokio::spawn(scope("b", async move {
            p.run(move || o.lock().expect("test").push("b".to_owned())).await
        })));
        while !pool.0.queues.lock().expect("test").queued.contains_key("b") {
            tokio::task::yield_now().await;
        }
        release_tx.send(()).expect("test");
        blocker.await.expect("test");
        for w in waits {
            w.await.expect("test");
        }
        let order = order.lock().expect("test");
        // b ran second: after a's next job in turn, not after all ten.
        assert_eq!(order.iter().position(|s| s == "b"), Some(1), "{order:?}");
    }

    #[tokio::test]
    async fn one_tenant_holds_at_most_its_share_of_the_threads() {
        // Two threads, one per tenant while another is active: b has run a
        // job (active for the hour of this test), so a's two blocking jobs
        // run one at a time, and b's next job runs beside a's first.
        let pool = Arc::new(ScanPool::new(2, 1, Duration::from_secs(3600)).expect("test"));
        assert_eq!(scope("b", pool.run(|| 1)).await, 1);
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (started_tx, started_rx) = mpsc::channel::<&'static str>();
        let mut a_jobs = Vec::new();
        for name in ["a1", "a2"] {
            let (p, tx, rx) = (pool.clone(), started_tx.clone(), release_rx.clone());
            a_jobs.push(tokio::spawn(scope("a", async move {
                p.run(move || {
                    let _ = tx.send(name);
                    let _ = rx.lock().expect("test").recv();
                })
                .await
            })));
        }
        let first = tokio::task::spawn_blocking(move || {
            let first = started_rx.recv().expect("test");
            (first, started_rx)
        });
        let (first, started_rx) = first.await.expect("test");
        // b runs while a1 holds a's one thread and a2 waits.
        assert_eq!(scope("b", pool.run(|| 7)).await, 7);
        assert_eq!(
            pool.0
                .queues
                .lock()
                .expect("test")
                .queued
                .get("a")
                .map_or(0, VecDeque::len),
            1
        );
        release_tx.send(()).expect("test");
        let second = tokio::task::spawn_blocking(move || started_rx.recv().expect("test"));
        assert_ne!(second.await.expect("test"), first);
        release_tx.send(()).expect("test");
        for j in a_jobs {
            j.await.expect("test");
        }
    }

    #[tokio::test]
    async fn a_tenant_alone_uses_every_thread() {
        // Two threads, one per tenant while another is active, nobody else
        // active: a's two jobs run at once (each sees the other arrive; a
        // minute's deadline instead of hanging if they ran in turn).
        let pool = Arc::new(ScanPool::new(2, 1, Duration::ZERO).expect("test"));
        let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (p, n) = (pool.clone(), arrived.clone());
                tokio::spawn(scope("a", async move {
                    p.run(move || {
                        n.fetch_add(1, Ordering::SeqCst);
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while n.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                            std::thread::yield_now();
                        }
                        n.load(Ordering::SeqCst) == 2
                    })
                    .await
                }))
            })
            .collect();
        for r in runs {
            assert!(r.await.expect("test"), "a's jobs ran one at a time");
        }
    }
}
