//! The compactor's metrics (`mira_compactor_*`), registered in the
//! process's registry. Labels are bounded: `kind` is a job kind (`merge`,
//! `cold`) or a lane (`purge`, `orphan_sweep`, `takeover`), `outcome` one of
//! `ok`, `conflict`, `lease_lost`, `error`, `aborted`; an offload copy's
//! check has a `stage` (`written`, `existing`, `before_free`) and a
//! `reason` ([`crate::copy::Unproven`]: `missing`, `size`, `content`,
//! `unreadable`).

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub kind: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerifyLabels {
    pub stage: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OriginLabels {
    pub origin: String,
}

fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

#[derive(Debug)]
pub struct Metrics {
    pub jobs: Family<OutcomeLabels, Counter>,
    pub job_duration: Family<KindLabels, Histogram, fn() -> Histogram>,
    pub input_bytes: Family<KindLabels, Counter>,
    pub output_bytes: Family<KindLabels, Counter>,
    pub input_blocks: Family<KindLabels, Counter>,
    pub output_blocks: Family<KindLabels, Counter>,
    pub rows: Family<KindLabels, Counter>,
    pub rewrite_cpu_seconds: Family<KindLabels, Counter<f64, AtomicU64>>,
    pub backlog_partitions: Family<KindLabels, Gauge>,
    pub backlog_bytes: Family<KindLabels, Gauge>,
    pub oldest_pending_seconds: Family<KindLabels, Gauge<f64, AtomicU64>>,
    pub partitions: Gauge,
    pub partition_objects_max: Gauge,
    pub leases_held: Gauge,
    pub lease_conflicts: Counter,
    pub lease_lost: Counter,
    pub tombstoned_pending_blocks: Gauge,
    pub tombstoned_pending_bytes: Gauge,
    pub deleted_objects: Family<KindLabels, Counter>,
    pub orphans_deleted: Family<OriginLabels, Counter>,
    pub quarantined_blocks: Gauge,
    pub memory_reserved_bytes: Gauge<i64, AtomicI64>,
    pub plans: Counter,
    pub retention_dropped_blocks: Counter,
    pub offloaded_blocks: Counter,
    pub offloaded_bytes: Counter,
    pub primaries_freed: Counter,
    pub offload_verify_failures: Family<VerifyLabels, Counter>,
    pub lifecycle_errors: Counter,
}

impl Metrics {
    pub fn new(r: &mut Registry) -> Metrics {
        let m = Metrics {
            jobs: Family::default(),
            job_duration: Family::new_with_constructor(seconds),
            input_bytes: Family::default(),
            output_bytes: Family::default(),
            input_blocks: Family::default(),
            output_blocks: Family::default(),
            rows: Family::default(),
            rewrite_cpu_seconds: Family::default(),
            backlog_partitions: Family::default(),
            backlog_bytes: Family::default(),
            oldest_pending_seconds: Family::default(),
            partitions: Gauge::default(),
            partition_objects_max: Gauge::default(),
            leases_held: Gauge::default(),
            lease_conflicts: Counter::default(),
            lease_lost: Counter::default(),
            tombstoned_pending_blocks: Gauge::default(),
            tombstoned_pending_bytes: Gauge::default(),
            deleted_objects: Family::default(),
            orphans_deleted: Family::default(),
            quarantined_blocks: Gauge::default(),
            memory_reserved_bytes: Gauge::default(),
            plans: Counter::default(),
            retention_dropped_blocks: Counter::default(),
            offloaded_blocks: Counter::default(),
            offloaded_bytes: Counter::default(),
            primaries_freed: Counter::default(),
            offload_verify_failures: Family::default(),
            lifecycle_errors: Counter::default(),
        };
        r.register("jobs", "Jobs finished, by kind and outcome", m.jobs.clone());
        r.register("job_duration_seconds", "Job duration by kind", m.job_duration.clone());
        r.register("input_bytes", "Bytes of input blocks rewritten", m.input_bytes.clone());
        r.register("output_bytes", "Bytes of blocks written", m.output_bytes.clone());
        r.register("input_blocks", "Input blocks replaced", m.input_blocks.clone());
        r.register("output_blocks", "Blocks written and committed", m.output_blocks.clone());
        r.register("rows", "Rows rewritten", m.rows.clone());
        r.register(
            "rewrite_cpu_seconds",
            "Thread CPU time of merging and encoding (MiB/s/core = input bytes / this)",
            m.rewrite_cpu_seconds.clone(),
        );
        r.register(
            "backlog_partitions",
            "Partitions with work waiting, by kind",
            m.backlog_partitions.clone(),
        );
        r.register(
            "backlog_bytes",
            "Input bytes of the work waiting, by kind",
            m.backlog_bytes.clone(),
        );
        r.register(
            "oldest_pending_seconds",
            "How long the oldest waiting work is past its trigger, by kind (the lag)",
            m.oldest_pending_seconds.clone(),
        );
        r.register("partitions", "Partitions holding live blocks", m.partitions.clone());
        r.register(
            "partition_objects_max",
            "Most live objects in one partition",
            m.partition_objects_max.clone(),
        );
        r.register(
            "leases_held",
            "Partition leases this compactor holds",
            m.leases_held.clone(),
        );
        r.register(
            "lease_conflicts",
            "Leases another holder had when this compactor asked",
            m.lease_conflicts.clone(),
        );
        r.register(
            "lease_lost",
            "Jobs stopped because their lease was lost",
            m.lease_lost.clone(),
        );
        r.register(
            "tombstoned_pending_blocks",
            "Replaced blocks waiting for the deletion grace",
            m.tombstoned_pending_blocks.clone(),
        );
        r.register(
            "tombstoned_pending_bytes",
            "Bytes of replaced blocks waiting for the deletion grace",
            m.tombstoned_pending_bytes.clone(),
        );
        r.register(
            "deleted_objects",
            "Objects deleted, by why (purge, takeover, orphan_sweep, abandoned)",
            m.deleted_objects.clone(),
        );
        r.register(
            "orphans_deleted",
            "Unreferenced objects deleted, by origin (takeover, abandoned, sweep); a steady sweep rate means lost publishes",
            m.orphans_deleted.clone(),
        );
        r.register(
            "quarantined_blocks",
            "Live blocks marked do-not-compact (corrupt)",
            m.quarantined_blocks.clone(),
        );
        r.register(
            "memory_reserved_bytes",
            "Memory reserved by running jobs",
            m.memory_reserved_bytes.clone(),
        );
        r.register("plans", "Planning rounds", m.plans.clone());
        r.register(
            "retention_dropped_blocks",
            "Blocks tombstoned whole because every row is past its retention rule",
            m.retention_dropped_blocks.clone(),
        );
        r.register(
            "offloaded_blocks",
            "Blocks copied to an offload target and marked offloaded",
            m.offloaded_blocks.clone(),
        );
        r.register(
            "offloaded_bytes",
            "Bytes of blocks offloaded",
            m.offloaded_bytes.clone(),
        );
        r.register(
            "primaries_freed",
            "Primary objects of offloaded blocks deleted after the grace",
            m.primaries_freed.clone(),
        );
        r.register(
            "offload_verify_failures",
            "Offload copies that failed their content check (length and SHA-256), by stage (written, existing, before_free) and reason (missing, size, content, unreadable); a failure before_free keeps the primary",
            m.offload_verify_failures.clone(),
        );
        r.register(
            "lifecycle_errors",
            "Retention and offload steps that failed (see the policy statuses)",
            m.lifecycle_errors.clone(),
        );
        m
    }

    pub fn kind(kind: &str) -> KindLabels {
        KindLabels { kind: kind.to_owned() }
    }

    /// Counts an offload copy that failed its check at `stage`.
    pub fn verify_failed(&self, stage: &str, reason: crate::copy::Unproven) {
        self.offload_verify_failures
            .get_or_create(&VerifyLabels {
                stage: stage.to_owned(),
                reason: reason.as_str().to_owned(),
            })
            .inc();
    }

    pub fn job_done(&self, kind: &str, outcome: &str) {
        self.jobs
            .get_or_create(&OutcomeLabels {
                kind: kind.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}
