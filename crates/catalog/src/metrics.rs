//! Prometheus metrics of a catalog member, served on `/metrics`.

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
    registry: Registry,
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
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let term = gauge(&mut registry, "mira_catalog_raft_term", "Current Raft term");
        let leader = gauge(
            &mut registry,
            "mira_catalog_raft_leader_id",
            "Leader node id, -1 when none",
        );
        let is_leader = gauge(&mut registry, "mira_catalog_raft_is_leader", "1 on the leader");
        let applied = gauge(
            &mut registry,
            "mira_catalog_raft_applied_index",
            "Last applied log index (catalog version)",
        );
        let last_log = gauge(&mut registry, "mira_catalog_raft_last_log_index", "Last log index");
        let log_entries = gauge(
            &mut registry,
            "mira_catalog_raft_log_entries",
            "Entries kept in the log (not yet purged)",
        );
        let snapshot = gauge(
            &mut registry,
            "mira_catalog_raft_snapshot_index",
            "Log index of the last snapshot",
        );
        let blocks = Family::<StateLabels, Gauge>::default();
        registry.register("mira_catalog_blocks", "Blocks in the catalog by state", blocks.clone());
        let commands = Family::<CommandLabels, Histogram, fn() -> Histogram>::new_with_constructor(command_histogram);
        registry.register(
            "mira_catalog_command_duration_seconds",
            "Time from receiving a write to its answer, by command and outcome",
            commands.clone(),
        );
        Metrics {
            registry,
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

    /// Sets the gauges from `r` and renders the text exposition format.
    pub fn render(&self, r: &Reading) -> String {
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
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
