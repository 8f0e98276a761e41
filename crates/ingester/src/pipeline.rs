//! The ingest pipeline: per signal, N shards (lanes) with a bounded byte
//! budget each. Admission is first-fit across the lanes; when all are full
//! a request parks up to `admit_wait`, then is refused as overloaded (the
//! client retries; nothing decoded is dropped). Shards log to the WAL,
//! seal generations, and their uploaders publish them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use mira_core::convert::{Appended, Limits};
use mira_core::ids::{Signal, TenantId};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::IngestError;
use crate::health::Health;
use crate::metrics::Phase;
use crate::shard::{AnyBuilder, Progress, SealPolicy, Shard, SharedView, Work, lock_view};
use crate::upload::{self, Destination};
use crate::wal::Wal;

/// Sizes and waits of the pipeline.
#[derive(Clone, Copy, Debug)]
pub struct PipelineConfig {
    /// Shards per signal.
    pub shards: usize,
    /// Bytes of requests queued per shard before admission waits.
    pub queue_bytes: usize,
    pub admit_wait: Duration,
    pub seal: SealPolicy,
    /// Sealed generations waiting for upload per shard before the shard
    /// stops taking work (bounds memory when the store stalls).
    pub upload_queue: usize,
    /// Attribute limits applied to every request (a replay applies the
    /// limits recorded with the WAL segment instead).
    pub limits: Limits,
    /// Records older than now minus this are rejected.
    pub max_past: Duration,
    /// Records newer than now plus this are rejected.
    pub max_future: Duration,
}

struct Lane {
    tx: mpsc::Sender<Work>,
    room: Arc<Semaphore>,
    versions: watch::Receiver<u64>,
    view: SharedView,
}

struct SignalLanes {
    lanes: Vec<Lane>,
    next: AtomicUsize,
}

/// The running pipeline.
pub struct Pipeline {
    metrics: Arc<crate::metrics::Metrics>,
    health: Arc<Health>,
    signals: Vec<SignalLanes>,
    config: PipelineConfig,
    clock: mira_common::clock::Clock,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn signal_index(s: Signal) -> usize {
    match s {
        Signal::Logs => 0,
        Signal::Traces => 1,
        Signal::Metrics => 2,
    }
}

/// The shard id written to WAL frames and watermarks: unique across signals.
pub fn global_shard(signal: Signal, index: usize, shards: usize) -> u16 {
    u16::try_from(signal_index(signal) * shards + index).unwrap_or(u16::MAX)
}

impl Pipeline {
    /// Starts the shards and uploaders (after the WAL was recovered: every
    /// frame on disk is published, see [`crate::recover`]).
    pub fn start(config: PipelineConfig, wal: Wal, dest: Destination) -> Pipeline {
        let series = Arc::new(crate::series::ActiveSeries::new(
            mira_common::limits::Limiter::unlimited(),
            dest.clock.clone(),
        ));
        Pipeline::start_with_series(config, wal, dest, series)
    }

    /// [`Pipeline::start`] with the per-tenant active-series limit.
    pub fn start_with_series(
        config: PipelineConfig,
        wal: Wal,
        dest: Destination,
        series: Arc<crate::series::ActiveSeries>,
    ) -> Pipeline {
        let metrics = dest.metrics.clone();
        let health = dest.health.clone();
        let on_refusal = if wal.mode() == crate::wal::WalMode::Off {
            upload::OnRefusal::Drop
        } else {
            upload::OnRefusal::Retry
        };
        let shards = config.shards.max(1);
        let mut signals = Vec::new();
        let mut tasks = Vec::new();
        for signal in Signal::ALL {
            let mut lanes = Vec::new();
            for i in 0..shards {
                let (tx, rx) = mpsc::channel(1024);
                let (sealed_tx, sealed_rx) = mpsc::channel(config.upload_queue.max(1));
                let (published_tx, published_rx) = watch::channel(Progress::default());
                let (versions_tx, versions_rx) = watch::channel(0u64);
                let view = SharedView::default();
                let shard = Shard {
                    view: view.clone(),
                    metrics: metrics.clone(),
                    signal,
                    id: global_shard(signal, i, shards),
                    wal: wal.clone(),
                    policy: config.seal,
                    limits: config.limits,
                    window: (config.max_past, config.max_future),
                    clock: dest.clock.clone(),
                    sealed: sealed_tx,
                    published: published_rx,
                    series: series.clone(),
                };
                tasks.push(tokio::spawn(shard.run(rx)));
                tasks.push(tokio::spawn(upload::run(
                    dest.clone(),
                    on_refusal,
                    sealed_rx,
                    published_tx,
                    versions_tx,
                    view.clone(),
                )));
                lanes.push(Lane {
                    tx,
                    room: Arc::new(Semaphore::new(config.queue_bytes)),
                    versions: versions_rx,
                    view,
                });
            }
            signals.push(SignalLanes {
                lanes,
                next: AtomicUsize::new(0),
            });
        }
        Pipeline {
            metrics,
            health,
            signals,
            config,
            clock: dest.clock.clone(),
            tasks,
        }
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// How long a request may wait for room.
    pub fn admit_wait(&self) -> Duration {
        self.config.admit_wait
    }

    /// The record times a request submitted now may hold (`--max-past`,
    /// `--max-future`): what the shards will accept, for receivers that
    /// answer each refused record in their protocol's words.
    pub fn window(&self) -> mira_core::convert::TimeWindow {
        crate::shard::window_at(&self.clock, (self.config.max_past, self.config.max_future))
    }

    /// The attribute limits every request is held to.
    pub fn limits(&self) -> Limits {
        self.config.limits
    }

    /// Counts one export request's outcome (`mira_ingester_requests_total`)
    /// and, when it was accepted, its records and what the limits and the
    /// time window did to them.
    pub fn count(&self, signal: Signal, result: &Result<Appended, IngestError>) {
        let labels = crate::metrics::OutcomeLabels {
            signal: signal.as_str(),
            outcome: match result {
                Ok(_) => "ok",
                Err(IngestError::Invalid(_)) => "invalid",
                Err(IngestError::Overloaded { .. }) => "overloaded",
                Err(IngestError::TooLarge { .. } | IngestError::DecodedTooLarge { .. }) => "too_large",
                Err(IngestError::Timeout(_)) => "timeout",
                Err(IngestError::Unavailable(_)) => "unavailable",
                // Refused on the headers, before a body is read: not
                // counted here (mira_auth_requests_total counts them).
                Err(IngestError::Auth(_)) => "refused",
                // The tenant's records rate (mira_limits_refusals_total
                // counts them by limit).
                Err(IngestError::Limited(_)) => "limited",
            },
        };
        self.metrics.requests.get_or_create(&labels).inc();
        if let Ok(appended) = result {
            self.metrics
                .records
                .get_or_create(&crate::metrics::SignalLabels {
                    signal: signal.as_str(),
                })
                .inc_by(appended.rows as u64);
            let (limited, window) = (&self.metrics.limited, &self.metrics.out_of_window);
            for (family, outcome, n) in [
                (limited, "rejected_point", appended.rejected as u64),
                (limited, "dropped_attribute", appended.dropped_attrs),
                (limited, "truncated_value", appended.truncated_values),
                (window, "too_old", appended.too_old as u64),
                (window, "too_new", appended.too_new as u64),
            ] {
                if n > 0 {
                    family
                        .get_or_create(&crate::metrics::OutcomeLabels {
                            signal: signal.as_str(),
                            outcome,
                        })
                        .inc_by(n);
                }
            }
        }
    }

    /// Admits, logs and appends one export request (OTLP protobuf); returns
    /// the records accepted (and what the attribute limits did) once the request is acknowledged by the WAL
    /// mode's promise.
    ///
    /// Counts nothing: the receiver that took the request counts its
    /// outcome with [`Pipeline::count`], after what it refused before
    /// submitting (a malformed body, the decoded budget) too.
    pub async fn submit(&self, signal: Signal, tenant: TenantId, payload: Bytes) -> Result<Appended, IngestError> {
        if let Some(why) = self.health.refusal() {
            return Err(IngestError::Unavailable(why));
        }
        let admitted = std::time::Instant::now();
        let cost = payload.len().max(1);
        if cost > self.config.queue_bytes {
            return Err(IngestError::TooLarge {
                bytes: cost,
                limit: self.config.queue_bytes,
            });
        }
        let lanes = &self.signals[signal_index(signal)];
        let n = lanes.lanes.len();
        let start = lanes.next.fetch_add(1, Ordering::Relaxed) % n;
        let cost32 = u32::try_from(cost).unwrap_or(u32::MAX);
        let mut chosen = None;
        for i in 0..n {
            let lane = &lanes.lanes[(start + i) % n];
            if let Ok(p) = lane.room.clone().try_acquire_many_owned(cost32) {
                chosen = Some((lane, p));
                break;
            }
        }
        let (lane, permit) = match chosen {
            Some(c) => c,
            None => {
                let lane = &lanes.lanes[start];
                match tokio::time::timeout(self.config.admit_wait, lane.room.clone().acquire_many_owned(cost32)).await {
                    Ok(Ok(p)) => (lane, p),
                    Ok(Err(_)) => return Err(IngestError::Unavailable("the ingester is stopping".to_owned())),
                    Err(_) => {
                        return Err(IngestError::Overloaded {
                            what: format!("no shard had room for {cost} bytes"),
                            wait_ms: u64::try_from(self.config.admit_wait.as_millis()).unwrap_or(u64::MAX),
                        });
                    }
                }
            }
        };
        self.metrics
            .admission_wait
            .get_or_create(&crate::metrics::SignalLabels {
                signal: signal.as_str(),
            })
            .observe(admitted.elapsed().as_secs_f64());
        let admission = admitted.elapsed();
        let (reply, rx) = oneshot::channel();
        lane.tx
            .send(Work {
                tenant,
                payload,
                permit,
                reply,
                sent: std::time::Instant::now(),
            })
            .await
            .map_err(|_| IngestError::Unavailable("the shard stopped".to_owned()))?;
        let accepted = rx
            .await
            .map_err(|_| IngestError::Unavailable("the shard stopped".to_owned()))??;
        let written = accepted.ack.wait().await?;
        // Accepted: where its time went (the receiver adds slot, body and
        // total).
        let m = &self.metrics;
        m.observe_phase(signal, Phase::Admission, admission);
        m.observe_phase(signal, Phase::ShardQueue, accepted.queued);
        m.observe_phase(signal, Phase::Decode, accepted.decode);
        let (wal_queue, wal_write, reply) = written.map_or(Default::default(), |w| (w.queued, w.write, w.at.elapsed()));
        m.observe_phase(signal, Phase::WalQueue, wal_queue);
        m.observe_phase(signal, Phase::WalWrite, wal_write);
        m.observe_phase(signal, Phase::Reply, reply);
        Ok(accepted.appended)
    }

    /// The rows of `tenant`'s `signal` not yet in published blocks (see
    /// `proto/ingester.proto` for the contract): `(pending block id or None
    /// for open rows, tables)`, and the published version read after the
    /// snapshot. Blocks not overlapping `[min, max]` are left out.
    pub fn recent(
        &self,
        tenant: &TenantId,
        signal: Signal,
        min: u64,
        max: u64,
    ) -> (
        Vec<(Option<mira_core::ids::BlockId>, mira_core::convert::TableSet)>,
        u64,
    ) {
        let lanes = &self.signals[signal_index(signal)].lanes;
        let mut parts: Vec<(Option<mira_core::ids::BlockId>, Vec<Bytes>)> = Vec::new();
        for lane in lanes {
            let view = lock_view(&lane.view);
            if let Some((id, p)) = view.open.get(tenant) {
                parts.push((Some(*id), p.clone()));
            }
            for generation in view.pending.values() {
                for (t, id, p) in generation {
                    if t == tenant {
                        parts.push((Some(*id), p.clone()));
                    }
                }
            }
        }
        // Read after the snapshot: anything published and gone from the
        // views is at or below this version.
        let version = lanes.iter().map(|l| *l.versions.borrow()).max().unwrap_or(0);
        let mut out = Vec::new();
        for (id, payloads) in parts {
            let mut b = AnyBuilder::new(signal);
            for p in &payloads {
                if let Err(e) = b.append(p, &self.config.limits) {
                    tracing::warn!(target: "mira::ingester", error = %e, "an accepted payload no longer decodes");
                }
            }
            if b.rows() == 0 {
                continue;
            }
            match b.finish() {
                Ok(t) if t.max_time >= min && t.min_time <= max => out.push((id, t)),
                Ok(_) => {}
                Err(e) => tracing::warn!(target: "mira::ingester", error = %e, "building recent rows failed"),
            }
        }
        (out, version)
    }

    /// Stops taking work, seals every open generation, and waits (up to
    /// `timeout`) until all are published.
    pub async fn shutdown(self, timeout: Duration) {
        let Pipeline { signals, tasks, .. } = self;
        drop(signals);
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::warn!(target: "mira::ingester", "shutdown: some generations were not published in time; the WAL keeps them");
        }
    }
}
