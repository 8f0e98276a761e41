//! The ingester's probes (seed 002): per-export timings for admission
//! wait, decode + append and the WAL group write / fsync, a runtime-lag
//! tick, and counters of what was accepted and published. Served on
//! `/metrics` (the process's one registry, under `mira_ingester_`); the same timings go to debug logs under the
//! `mira::ingester::probe` target.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub signal: &'static str,
    pub phase: &'static str,
}

/// The phases one accepted export request's time splits into, in order
/// (`mira_ingester_phase_seconds{phase}`). Each accepted request is
/// observed once in every phase, so the counts match and the phases add up
/// to `total`, give or take the few steps between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for an in-flight slot (`--max-inflight-requests`).
    Slot,
    /// Receiving the body (gRPC: framing and decompression by tonic; HTTP:
    /// reading, decompressing and, for JSON, converting it).
    Body,
    /// Waiting for room in a shard (`--shard-queue-bytes`).
    Admission,
    /// Queued for the shard task, behind the requests sent to it before.
    ShardQueue,
    /// Wire bytes → the open block's Arrow builders.
    Decode,
    /// From the WAL submit until the writer took the frame into a group:
    /// the group commit wait (the writer busy with the group before).
    WalQueue,
    /// The group's write(2) and, in fsync mode, its fdatasync.
    WalWrite,
    /// From the WAL writer's answer until the request's task ran again.
    Reply,
    /// From the request's arrival until its answer was ready.
    Total,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Slot,
        Phase::Body,
        Phase::Admission,
        Phase::ShardQueue,
        Phase::Decode,
        Phase::WalQueue,
        Phase::WalWrite,
        Phase::Reply,
        Phase::Total,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Slot => "slot",
            Phase::Body => "body",
            Phase::Admission => "admission",
            Phase::ShardQueue => "shard_queue",
            Phase::Decode => "decode",
            Phase::WalQueue => "wal_queue",
            Phase::WalWrite => "wal_write",
            Phase::Reply => "reply",
            Phase::Total => "total",
        }
    }
}

fn phase_seconds() -> Histogram {
    // 20 µs .. ~4 s in steps of 1.5x: fine enough to read a p50 in ms.
    Histogram::new(exponential_buckets(0.000_02, 1.5, 31))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub signal: &'static str,
    pub outcome: &'static str,
}

fn seconds() -> Histogram {
    // 10 µs .. ~20 s
    Histogram::new(exponential_buckets(0.000_01, 2.5, 16))
}

/// Every metric of one ingester (registered under `mira_ingester_`).
#[derive(Debug)]
pub struct Metrics {
    pub admission_wait: Family<SignalLabels, Histogram, fn() -> Histogram>,
    pub append: Family<SignalLabels, Histogram, fn() -> Histogram>,
    /// Where the time of each accepted export went, by `phase` (see
    /// [`Phase`]).
    pub phase: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    pub wal_write: Histogram,
    pub wal_fsync: Histogram,
    pub wal_group_frames: Histogram,
    pub runtime_lag: Histogram,
    pub requests: Family<OutcomeLabels, Counter>,
    pub records: Family<SignalLabels, Counter>,
    /// What the attribute limits did, by `outcome`: rejected_point,
    /// dropped_attribute, truncated_value.
    pub limited: Family<OutcomeLabels, Counter>,
    pub blocks_published: Family<SignalLabels, Counter>,
    pub bytes_uploaded: Counter,
    /// Export requests holding an in-flight slot.
    pub inflight: Gauge,
    /// Publish attempts that failed, by `reason`: unavailable (retried),
    /// rejected (quarantined, retried slowly), fenced (stopped).
    pub publish_failures: Family<ReasonLabels, Counter>,
    /// Generations written to the quarantine directory.
    pub quarantined: Counter,
    /// Quarantine copies in the data directory (found at start or written
    /// since): acknowledged rows not published.
    pub quarantine_held: Gauge,
    /// 1 while writes are refused, by `reason`: wal, lease, fenced,
    /// quarantine.
    pub refusing: Family<ReasonLabels, Gauge>,
    /// Records refused for a timestamp outside the accepted window.
    pub out_of_window: Family<OutcomeLabels, Counter>,
}

impl Metrics {
    /// Observes one accepted export's time in `phase`.
    pub fn observe_phase(&self, signal: mira_core::ids::Signal, phase: Phase, took: std::time::Duration) {
        self.phase
            .get_or_create(&PhaseLabels {
                signal: signal.as_str(),
                phase: phase.as_str(),
            })
            .observe(took.as_secs_f64());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

impl Metrics {
    /// Registers every metric in `registry` (the role's sub-registry).
    pub fn new(registry: &mut Registry) -> Metrics {
        let admission_wait = Family::<SignalLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds);
        registry.register(
            "admission_wait_seconds",
            "Time an export waited for room in a shard",
            admission_wait.clone(),
        );
        let append = Family::<SignalLabels, Histogram, fn() -> Histogram>::new_with_constructor(seconds);
        registry.register(
            "decode_append_seconds",
            "Time to decode an export into its shard's open block",
            append.clone(),
        );
        let phase = Family::<PhaseLabels, Histogram, fn() -> Histogram>::new_with_constructor(phase_seconds);
        registry.register(
            "phase_seconds",
            "Time of each accepted export by phase: slot, body, admission, shard_queue, decode, wal_queue, wal_write, reply, total",
            phase.clone(),
        );
        let wal_write = seconds();
        registry.register("wal_write_seconds", "WAL group write(2) time", wal_write.clone());
        let wal_fsync = seconds();
        registry.register(
            "wal_fsync_seconds",
            "WAL group fdatasync time (fsync mode)",
            wal_fsync.clone(),
        );
        let wal_group_frames = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register(
            "wal_group_frames",
            "Frames per WAL group write",
            wal_group_frames.clone(),
        );
        let runtime_lag = seconds();
        registry.register(
            "runtime_lag_seconds",
            "Lateness of a 10 ms tick on the runtime (time workers were busy or parked)",
            runtime_lag.clone(),
        );
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register("requests", "Export requests by outcome", requests.clone());
        let records = Family::<SignalLabels, Counter>::default();
        registry.register("records", "Records accepted", records.clone());
        let limited = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "limited",
            "Data points rejected, attributes dropped and values truncated by the attribute limits",
            limited.clone(),
        );
        let blocks_published = Family::<SignalLabels, Counter>::default();
        registry.register(
            "blocks_published",
            "Blocks published to the catalog",
            blocks_published.clone(),
        );
        let bytes_uploaded = Counter::default();
        registry.register(
            "uploaded_bytes",
            "Block bytes written to the object store",
            bytes_uploaded.clone(),
        );
        let inflight = Gauge::default();
        registry.register(
            "inflight_requests",
            "Export requests holding an in-flight slot (being read, decoded or awaiting their ack)",
            inflight.clone(),
        );
        let publish_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "publish_failures",
            "Failed publish attempts by reason (unavailable: retried; rejected: quarantined and retried; fenced: stopped)",
            publish_failures.clone(),
        );
        let quarantined = Counter::default();
        registry.register(
            "quarantined_generations",
            "Sealed generations (or one tenant's block of one) written to the quarantine directory: the catalog refused the publish, or a block could not be built, encoded or passed the catalog's checks",
            quarantined.clone(),
        );
        let quarantine_held = Gauge::default();
        registry.register(
            "quarantined",
            "Quarantine copies in <data-dir>/quarantine (found at start or written since): acknowledged rows that are not published; /ready names them",
            quarantine_held.clone(),
        );
        let refusing = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "refusing_writes",
            "1 while exports are refused with 503, by reason (wal, lease, fenced, quarantine)",
            refusing.clone(),
        );
        let out_of_window = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "out_of_window",
            "Records refused for a timestamp older than --max-past or newer than --max-future (outcome: too_old, too_new)",
            out_of_window.clone(),
        );
        Metrics {
            publish_failures,
            quarantined,
            quarantine_held,
            refusing,
            out_of_window,
            inflight,
            admission_wait,
            append,
            phase,
            wal_write,
            wal_fsync,
            wal_group_frames,
            runtime_lag,
            requests,
            records,
            limited,
            blocks_published,
            bytes_uploaded,
        }
    }
}
