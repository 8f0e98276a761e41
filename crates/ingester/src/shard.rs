//! Shards: each owns one *generation* of open blocks (one builder per
//! tenant) for its signal. A request is decoded into the builder (refused
//! whole on bad input), logged to the WAL in the shard's order, and
//! answered once the WAL wrote it. A generation seals on size, age or the
//! hour boundary. Before sealing, the shard waits until the WAL settled
//! every frame of the generation; rows whose frame failed to be written
//! (and so were answered with an error) are taken out by rebuilding the
//! builders from the written requests only. Its blocks are then uploaded
//! and published with the shard's watermark = the highest WAL sequence in
//! the generation, so a restart replays exactly the frames above it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mira_common::clock::Clock;
use mira_core::convert::{Appended, Limits, LogsBuilder, PointsBuilder, SignalBuilder, SpansBuilder, TableSet};
use mira_core::ids::{BlockId, Signal, TenantId};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};

use crate::error::{IngestError, WalError};
use crate::wal::{Acks, Wal, WalMode, Written};

/// An open block's builder for any signal (boxed: the builders differ
/// in size by hundreds of bytes, and a shard holds one per tenant).
#[derive(Debug)]
pub enum AnyBuilder {
    Logs(Box<LogsBuilder>),
    Traces(Box<SpansBuilder>),
    Metrics(Box<PointsBuilder>),
}

impl AnyBuilder {
    pub fn new(signal: Signal) -> AnyBuilder {
        match signal {
            Signal::Logs => AnyBuilder::Logs(Box::default()),
            Signal::Traces => AnyBuilder::Traces(Box::default()),
            Signal::Metrics => AnyBuilder::Metrics(Box::default()),
        }
    }

    /// Appends an OTLP protobuf request under the attribute limits.
    pub fn append(&mut self, buf: &[u8], limits: &Limits) -> Result<Appended, mira_core::convert::ConvertError> {
        match self {
            AnyBuilder::Logs(b) => b.append_limited(buf, limits),
            AnyBuilder::Traces(b) => b.append_limited(buf, limits),
            AnyBuilder::Metrics(b) => b.append_limited(buf, limits),
        }
    }

    /// [`AnyBuilder::append`] with, for metrics, a series gate between
    /// the limits and the append (see [`crate::series`]).
    pub fn append_gated(
        &mut self,
        buf: &[u8],
        limits: &Limits,
        gate: Option<
            impl FnOnce(
                &mut opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest,
            ) -> (usize, u64),
        >,
    ) -> Result<Appended, mira_core::convert::ConvertError> {
        match (self, gate) {
            (AnyBuilder::Metrics(b), Some(gate)) => b.append_gated(buf, limits, gate),
            (this, _) => this.append(buf, limits),
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            AnyBuilder::Logs(b) => b.rows(),
            AnyBuilder::Traces(b) => b.rows(),
            AnyBuilder::Metrics(b) => b.rows(),
        }
    }

    pub fn approx_bytes(&self) -> usize {
        match self {
            AnyBuilder::Logs(b) => b.approx_bytes(),
            AnyBuilder::Traces(b) => b.approx_bytes(),
            AnyBuilder::Metrics(b) => b.approx_bytes(),
        }
    }

    /// The rows as a block's tables (a metrics block's points ordered by
    /// series: [`mira_core::convert::points_by_series`]); resets the builder.
    pub fn finish(&mut self) -> Result<TableSet, mira_core::convert::ConvertError> {
        match self {
            AnyBuilder::Logs(b) => b.finish(),
            AnyBuilder::Traces(b) => b.finish(),
            AnyBuilder::Metrics(b) => b.finish().and_then(mira_core::convert::points_by_series),
        }
    }
}

/// Requests at least this large are decoded on the blocking pool (a batch
/// of 8192 log records takes milliseconds, which on a runtime worker would
/// hold up every other request's I/O and ack); smaller ones in place, where
/// the hand-off would cost more than it saves.
pub const DECODE_INLINE_MAX: usize = 64 << 10;

/// Appends one request to `b` under `limits`, with the active-series gate
/// for metrics when `series_limit` > 0.
fn decode(
    b: &mut AnyBuilder,
    payload: &[u8],
    limits: &Limits,
    series: &crate::series::ActiveSeries,
    tenant: &TenantId,
    series_limit: u64,
) -> Result<Appended, mira_core::convert::ConvertError> {
    let gate = (series_limit > 0).then_some(
        |req: &mut opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest| {
            series.gate(tenant, series_limit, req)
        },
    );
    b.append_gated(payload, limits, gate)
}

/// What the caller waits on before acknowledging.
#[derive(Debug)]
pub enum AckWait {
    /// The WAL write (page-cache or fsync mode).
    Wal(oneshot::Receiver<Result<Written, WalError>>),
    /// WAL off: the generation's publish (of `tenant`'s block).
    Published {
        generation: u64,
        tenant: TenantId,
        published: watch::Receiver<Progress>,
    },
}

/// How far a shard's uploader got: the last generation it finished with,
/// those of them it could not publish and the tenants' blocks it set aside
/// in published ones (`--wal off` only: quarantined and dropped, their
/// clients answered with an error), and whether publishing stopped for
/// good (fenced), in which case no later generation will be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub published: u64,
    pub failed: std::collections::BTreeSet<u64>,
    pub failed_tenants: std::collections::BTreeSet<(u64, TenantId)>,
    pub stopped: bool,
}

impl AckWait {
    /// Waits for the ack; returns the WAL's timings of the frame (`None`
    /// with the WAL off).
    pub async fn wait(self) -> Result<Option<Written>, IngestError> {
        match self {
            AckWait::Wal(rx) => Ok(Some(rx.await.map_err(|_| WalError::Stopped)??)),
            AckWait::Published {
                generation,
                tenant,
                mut published,
            } => {
                let p = published
                    .wait_for(|p| p.published >= generation || p.stopped)
                    .await
                    .map_err(|_| IngestError::Unavailable("the shard stopped before publishing".to_owned()))?;
                if p.published >= generation
                    && !p.failed.contains(&generation)
                    && !p.failed_tenants.contains(&(generation, tenant))
                {
                    Ok(None)
                } else {
                    Err(IngestError::Unavailable(
                        "the ingester cannot publish (see its log and /metrics); nothing of this request was stored"
                            .to_owned(),
                    ))
                }
            }
        }
    }
}

/// A request accepted into a shard.
#[derive(Debug)]
pub struct Accepted {
    /// Rows appended and what the attribute limits did.
    pub appended: Appended,
    pub ack: AckWait,
    /// Time queued for the shard (from [`Work::sent`]).
    pub queued: Duration,
    /// Time decoding into the builder.
    pub decode: Duration,
}

/// Work for a shard: one export request.
#[derive(Debug)]
pub struct Work {
    pub tenant: TenantId,
    pub payload: Bytes,
    pub permit: OwnedSemaphorePermit,
    pub reply: oneshot::Sender<Result<Accepted, IngestError>>,
    /// When it was sent to the shard.
    pub sent: Instant,
}

/// What a shard holds that is not yet published, for the recent-data
/// service: the request payloads of the open generation and of each sealed
/// generation until its publish is done, each tenant's with the block id it
/// will be published under (chosen when the tenant's open block starts, so
/// a querier can tell rows it already has from the catalog).
#[derive(Debug, Default)]
pub struct ShardView {
    pub open: HashMap<TenantId, (BlockId, Vec<Bytes>)>,
    pub pending: BTreeMap<u64, Vec<(TenantId, BlockId, Vec<Bytes>)>>,
}

pub type SharedView = Arc<Mutex<ShardView>>;

pub fn lock_view(v: &SharedView) -> std::sync::MutexGuard<'_, ShardView> {
    v.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A sealed generation on its way to the store and the catalog.
#[derive(Debug)]
pub struct Sealed {
    pub signal: Signal,
    pub shard: u16,
    pub number: u64,
    /// Highest WAL sequence in the generation (0 when nothing was logged).
    pub max_seq: u64,
    /// Each tenant's block, with the id chosen when its open block began;
    /// `Err` when building it failed (the generation can never be
    /// published: the uploader quarantines it).
    pub blocks: Vec<(TenantId, BlockId, Result<TableSet, String>)>,
    /// The requests the blocks were built from, per tenant (what a
    /// quarantine keeps).
    pub requests: Vec<(TenantId, Vec<Bytes>)>,
}

#[derive(Debug)]
struct Generation {
    number: u64,
    builders: HashMap<TenantId, AnyBuilder>,
    max_seq: u64,
    rows: usize,
    /// Exports accepted (with or without rows): in `off` mode each waits
    /// for this generation's publish, so even an empty one is sealed.
    accepted: usize,
    /// Every frame's WAL outcome.
    acks: Arc<Acks>,
    /// (sequence, tenant, request) of each logged export, to rebuild the
    /// builders without the frames the WAL failed to write.
    logged: Vec<(u64, TenantId, Bytes)>,
    /// When the generation took its first export (by the clock).
    started_ns: i64,
    hour: u64,
}

/// The accepted time window at `now`, never past the last time a block
/// can be published with (so a record the window takes is publishable
/// whatever `future` is).
pub(crate) fn window_at(clock: &Clock, (past, future): (Duration, Duration)) -> mira_core::convert::TimeWindow {
    let now = u64::try_from(clock.now_ns()).unwrap_or(0);
    mira_core::convert::TimeWindow {
        min_ns: now.saturating_sub(u64::try_from(past.as_nanos()).unwrap_or(u64::MAX)),
        max_ns: now
            .saturating_add(u64::try_from(future.as_nanos()).unwrap_or(u64::MAX))
            .min(mira_core::block::path::LAST_PUBLISHABLE_NS),
    }
}

fn hour_of(ns: i64) -> u64 {
    u64::try_from(ns / 3_600_000_000_000).unwrap_or(0)
}

impl Generation {
    fn new(number: u64, clock: &Clock) -> Generation {
        let now = clock.now_ns();
        Generation {
            number,
            builders: HashMap::new(),
            max_seq: 0,
            rows: 0,
            accepted: 0,
            acks: Acks::new(),
            logged: Vec::new(),
            started_ns: now,
            hour: hour_of(now),
        }
    }

    fn approx_bytes(&self) -> usize {
        self.builders.values().map(AnyBuilder::approx_bytes).sum()
    }
}

/// Sealing thresholds.
#[derive(Clone, Copy, Debug)]
pub struct SealPolicy {
    pub max_bytes: usize,
    pub max_age: Duration,
}

/// One shard's task.
pub struct Shard {
    pub view: SharedView,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub signal: Signal,
    pub id: u16,
    pub wal: Wal,
    pub policy: SealPolicy,
    pub limits: Limits,
    /// Accepted times: (before now, after now).
    pub window: (Duration, Duration),
    /// Decides the seal age, the hour boundary and the time window.
    pub clock: Clock,
    pub sealed: mpsc::Sender<Sealed>,
    pub published: watch::Receiver<Progress>,
    /// The per-tenant active-series limit (metrics).
    pub series: Arc<crate::series::ActiveSeries>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("signal", &self.signal)
            .field("id", &self.id)
            .finish()
    }
}

impl Shard {
    /// Runs until `work` closes, then seals what is open.
    pub async fn run(self, mut work: mpsc::Receiver<Work>) {
        let mut generation = Generation::new(1, &self.clock);
        let tick_every = (self.policy.max_age / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                item = work.recv() => {
                    let Some(item) = item else { break };
                    self.handle(&mut generation, item).await;
                    if generation.approx_bytes() >= self.policy.max_bytes {
                        self.seal(&mut generation).await;
                    }
                }
                _ = tick.tick() => {
                    if generation.accepted > 0
                        && (self.clock.since_ns(generation.started_ns) >= self.policy.max_age
                            || generation.hour != hour_of(self.clock.now_ns()))
                    {
                        self.seal(&mut generation).await;
                    }
                }
            }
        }
        self.seal(&mut generation).await;
    }

    async fn handle(&self, g: &mut Generation, item: Work) {
        let Work {
            tenant,
            payload,
            permit,
            reply,
            sent,
        } = item;
        let queued = sent.elapsed();
        let mut b = g
            .builders
            .remove(&tenant)
            .unwrap_or_else(|| AnyBuilder::new(self.signal));
        let t = Instant::now();
        let limits = Limits {
            window: Some(window_at(&self.clock, self.window)),
            ..self.limits
        };
        let series_limit = if self.signal == Signal::Metrics {
            self.series.limit(&tenant)
        } else {
            0
        };
        let appended = if payload.len() < DECODE_INLINE_MAX {
            let appended = decode(&mut b, &payload, &limits, &self.series, &tenant, series_limit);
            g.builders.insert(tenant.clone(), b);
            appended
        } else {
            // Milliseconds of CPU: on the blocking pool, so the runtime's
            // workers keep reading other requests and waking acks.
            let (series, t2, p2) = (self.series.clone(), tenant.clone(), payload.clone());
            let decoded = tokio::task::spawn_blocking(move || {
                let appended = decode(&mut b, &p2, &limits, &series, &t2, series_limit);
                (b, appended)
            })
            .await;
            match decoded {
                Ok((b, appended)) => {
                    g.builders.insert(tenant.clone(), b);
                    appended
                }
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {
                    // Cancelled (the runtime is stopping) and the builder
                    // with it: rebuilt from the requests it held.
                    self.rebuild(g, &tenant);
                    let _ = reply.send(Err(IngestError::Unavailable("the ingester is stopping".to_owned())));
                    return;
                }
            }
        };
        let took = t.elapsed();
        self.metrics
            .append
            .get_or_create(&crate::metrics::SignalLabels {
                signal: self.signal.as_str(),
            })
            .observe(took.as_secs_f64());
        tracing::debug!(target: "mira::ingester::probe", shard = self.id, bytes = payload.len(), append_us = took.as_micros() as u64, "append");
        let mut appended = match appended {
            Ok(a) => a,
            Err(e) => {
                let _ = reply.send(Err(IngestError::Invalid(format!("{e}"))));
                return;
            }
        };
        // Rows outside the time window were refused: the WAL, the recent
        // view and any rebuild keep the request without them, so a replay
        // (which applies no window) rebuilds exactly the accepted rows.
        let payload = appended.kept.take().map_or(payload, Bytes::from);
        g.rows += appended.rows;
        g.accepted += 1;
        lock_view(&self.view)
            .open
            .entry(tenant.clone())
            .or_insert_with(|| (BlockId::new(), Vec::new()))
            .1
            .push(payload.clone());
        let ack = if self.wal.mode() == WalMode::Off {
            AckWait::Published {
                generation: g.number,
                tenant: tenant.clone(),
                published: self.published.clone(),
            }
        } else {
            let ticket = g.acks.ticket();
            match self
                .wal
                .submit(self.signal, self.id, tenant.clone(), payload.clone(), Some(ticket))
                .await
            {
                Ok((seq, rx)) => {
                    g.max_seq = g.max_seq.max(seq);
                    g.logged.push((seq, tenant, payload));
                    AckWait::Wal(rx)
                }
                Err(e) => {
                    // Never logged: its rows come out at seal.
                    g.logged.push((0, tenant, payload));
                    let _ = reply.send(Err(e.into()));
                    return;
                }
            }
        };
        drop(permit);
        let _ = reply.send(Ok(Accepted {
            appended,
            ack,
            queued,
            decode: took,
        }));
    }

    /// Rebuilds `tenant`'s builder from the requests of the open generation
    /// (the recent view holds them as they were appended).
    fn rebuild(&self, g: &mut Generation, tenant: &TenantId) {
        let payloads = lock_view(&self.view)
            .open
            .get(tenant)
            .map(|(_, p)| p.clone())
            .unwrap_or_default();
        let mut b = AnyBuilder::new(self.signal);
        for p in &payloads {
            // The same bytes under the same limits appended before.
            let _ = b.append(p, &self.limits);
        }
        if !payloads.is_empty() {
            g.builders.insert(tenant.clone(), b);
        }
    }

    /// Rebuilds the builders (and the recent view) from the requests whose
    /// frames the WAL wrote, leaving out `failed` (answered with an error).
    fn drop_unlogged(&self, g: &mut Generation, failed: &[u64]) {
        let failed: std::collections::HashSet<u64> = failed.iter().copied().collect();
        let mut builders: HashMap<TenantId, AnyBuilder> = HashMap::new();
        let mut kept: HashMap<TenantId, Vec<Bytes>> = HashMap::new();
        let mut rows = 0;
        for (seq, tenant, payload) in &g.logged {
            if *seq == 0 || failed.contains(seq) {
                continue;
            }
            let b = builders
                .entry(tenant.clone())
                .or_insert_with(|| AnyBuilder::new(self.signal));
            // The same bytes under the same limits appended before.
            if let Ok(a) = b.append(payload, &self.limits) {
                rows += a.rows;
            }
            kept.entry(tenant.clone()).or_default().push(payload.clone());
        }
        let dropped = g.logged.len() - kept.values().map(Vec::len).sum::<usize>();
        tracing::warn!(target: "mira::ingester", shard = self.id, requests = dropped, "rows whose WAL write failed were left out of the generation (their clients were answered with an error)");
        let mut view = lock_view(&self.view);
        view.open.retain(|t, _| kept.contains_key(t));
        for (tenant, payloads) in kept {
            if let Some(entry) = view.open.get_mut(&tenant) {
                entry.1 = payloads;
            }
        }
        g.builders = builders;
        g.rows = rows;
    }

    async fn seal(&self, g: &mut Generation) {
        if g.accepted == 0 {
            g.started_ns = self.clock.now_ns();
            g.hour = hour_of(g.started_ns);
            return;
        }
        // Every frame of the generation written or failed first: a failed
        // one was answered with an error and its rows must not be published.
        let failed = g.acks.settled().await;
        if !failed.is_empty() || g.logged.iter().any(|(seq, _, _)| *seq == 0) {
            self.drop_unlogged(g, &failed);
        }
        let next = Generation::new(g.number + 1, &self.clock);
        let old = std::mem::replace(g, next);
        let mut blocks = Vec::new();
        // Tens of milliseconds for a full generation: on the blocking pool,
        // so the runtime's workers keep serving requests meanwhile.
        let builders = old.builders;
        let finished = match tokio::task::spawn_blocking(move || {
            let mut finished = Vec::new();
            for (tenant, mut b) in builders {
                if b.rows() == 0 {
                    continue;
                }
                let built = b.finish().map_err(|e| {
                    tracing::error!(target: "mira::ingester", %tenant, error = %e, "building a block failed; the generation will be quarantined");
                    e.to_string()
                });
                finished.push((tenant, built));
            }
            finished
        })
        .await
        {
            Ok(f) => f,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {
                // Cancelled: the runtime is stopping. The WAL keeps the
                // generation's frames (no watermark covers them).
                tracing::warn!(target: "mira::ingester", shard = self.id, "stopping while sealing; the WAL keeps the generation");
                return;
            }
        };
        let mut requests = Vec::with_capacity(finished.len());
        {
            // One step, so a recent-data snapshot sees these rows either as
            // open or as pending, never as neither.
            let mut view = lock_view(&self.view);
            let mut open = std::mem::take(&mut view.open);
            let mut pending = Vec::with_capacity(finished.len());
            for (tenant, tables) in finished {
                let (id, payloads) = open.remove(&tenant).unwrap_or_else(|| (BlockId::new(), Vec::new()));
                pending.push((tenant.clone(), id, payloads.clone()));
                requests.push((tenant.clone(), payloads));
                blocks.push((tenant, id, tables));
            }
            view.pending.insert(old.number, pending);
        }
        let sealed = Sealed {
            signal: self.signal,
            shard: self.id,
            number: old.number,
            max_seq: old.max_seq,
            blocks,
            requests,
        };
        if self.sealed.send(sealed).await.is_err() {
            tracing::error!(target: "mira::ingester", shard = self.id, "uploader stopped; a sealed generation was dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However large `--max-future` is, the window stops at the last
    /// publishable time: a record at 2^63 ns is refused as too new.
    #[test]
    fn the_window_never_reaches_past_the_last_publishable_time() {
        use mira_core::block::path::LAST_PUBLISHABLE_NS;
        let (clock, _manual) = Clock::manual(std::time::UNIX_EPOCH + Duration::from_secs(1_765_000_000));
        let huge = Duration::from_secs(u64::MAX / 4);
        let w = window_at(&clock, (Duration::from_secs(60), huge));
        assert_eq!(w.max_ns, LAST_PUBLISHABLE_NS);
        assert!(!w.contains(1 << 63));
        assert!(!w.contains(u64::MAX));
        let w = window_at(&clock, (Duration::from_secs(60), Duration::from_secs(600)));
        assert_eq!(w.max_ns, 1_765_000_600 * 1_000_000_000);
    }
}
