//! Prometheus metrics of a catalog member (under `mira_catalog_` in the
//! process's registry, served on `/metrics`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

fn command_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// The catalog's metrics; gauges are refreshed from raft and the state at
/// each scrape.
#[derive(Debug)]
pub struct Metrics {
    term: Gauge,
    leader: Gauge,
    is_leader: Gauge,
    applied: Gauge,
    last_log: Gauge,
    log_entries: Gauge,
    snapshot: Gauge,
    blocks: Family<StateLabels, Gauge>,
    commands: Family<CommandLabels, Histogram, fn() -> Histogram>,
}

/// A point-in-time reading the gauges are set from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    pub term: u64,
    pub leader: Option<u64>,
    pub is_leader: bool,
    pub applied: u64,
    pub last_log: u64,
    pub log_entries: u64,
    pub snapshot: u64,
    pub blocks: [(&'static str, u64); 3],
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    registry.register(name, help, g.clone());
    g
}

impl Metrics {
    /// Registers every metric in `registry` (the role's sub-registry,
    /// `mira_catalog_`).
    pub fn new(registry: &mut Registry) -> Metrics {
        let term = gauge(registry, "raft_term", "Current Raft term");
        let leader = gauge(registry, "raft_leader_id", "Leader node id, -1 when none");
        let is_leader = gauge(registry, "raft_is_leader", "1 on the leader");
        let applied = gauge(
            registry,
            "raft_applied_index",
            "Last applied log index (catalog version)",
        );
        let last_log = gauge(registry, "raft_last_log_index", "Last log index");
        let log_entries = gauge(registry, "raft_log_entries", "Entries kept in the log (not yet purged)");
        let snapshot = gauge(registry, "raft_snapshot_index", "Log index of the last snapshot");
        let blocks = Family::<StateLabels, Gauge>::default();
        registry.register("blocks", "Blocks in the catalog by state", blocks.clone());
        let commands = Family::<CommandLabels, Histogram, fn() -> Histogram>::new_with_constructor(command_histogram);
        registry.register(
            "command_duration_seconds",
            "Time from receiving a write to its answer, by command and outcome",
            commands.clone(),
        );
        Metrics {
            term,
            leader,
            is_leader,
            applied,
            last_log,
            log_entries,
            snapshot,
            blocks,
            commands,
        }
    }

    pub fn observe_command(&self, command: &'static str, ok: bool, elapsed: Duration) {
        self.commands
            .get_or_create(&CommandLabels {
                command,
                outcome: if ok { "ok" } else { "error" },
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the gauges from `r` (before each scrape).
    pub fn set(&self, r: &Reading) {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.term.set(i(r.term));
        self.leader.set(r.leader.map_or(-1, i));
        self.is_leader.set(i64::from(r.is_leader));
        self.applied.set(i(r.applied));
        self.last_log.set(i(r.last_log));
        self.log_entries.set(i(r.log_entries));
        self.snapshot.set(i(r.snapshot));
        for (state, n) in r.blocks {
            self.blocks.get_or_create(&StateLabels { state }).set(i(n));
        }
    }
}
