//! The operator's metrics, registered in the process's telemetry under
//! `mira_operator_`: reconciles by result and their duration, errors by a
//! bounded reason, whether each object's policy is ready, how many
//! objects are managed, whether this replica leads and whether the
//! catalog answers.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use mira_common::telemetry::Telemetry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub namespace: String,
    pub name: String,
}

/// The operator's metrics (cheap to clone: every field is shared).
#[derive(Clone, Debug)]
pub struct Metrics {
    pub reconcile: Family<ResultLabel, Counter>,
    pub errors: Family<ReasonLabel, Counter>,
    pub duration: Histogram,
    pub policy_ready: Family<ObjectLabels, Gauge>,
    pub policies: Gauge,
    pub leader: Gauge,
    pub catalog_up: Gauge,
}

impl Metrics {
    /// Registers the metrics in `telemetry` (sub-registry `operator`).
    pub fn register(telemetry: &Telemetry) -> Metrics {
        let m = Metrics {
            reconcile: Family::default(),
            errors: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            policy_ready: Family::default(),
            policies: Gauge::default(),
            leader: Gauge::default(),
            catalog_up: Gauge::default(),
        };
        telemetry.register("operator", |r| {
            r.register("reconcile", "Reconciles by result", m.reconcile.clone());
            r.register("reconcile_errors", "Failed reconciles by reason", m.errors.clone());
            r.register_with_unit(
                "reconcile_duration",
                "Time one reconcile took",
                prometheus_client::registry::Unit::Seconds,
                m.duration.clone(),
            );
            r.register(
                "policy_ready",
                "1 when an object's policy is in the catalog (Ready=True), else 0",
                m.policy_ready.clone(),
            );
            r.register(
                "policies_managed",
                "MiraRetentionPolicy objects this operator manages",
                m.policies.clone(),
            );
            r.register(
                "leader",
                "1 while this replica holds the leader lease",
                m.leader.clone(),
            );
            r.register("catalog_up", "1 while the catalog answers", m.catalog_up.clone());
        });
        m
    }

    /// Counts a failed reconcile.
    pub fn error(&self, reason: &'static str) {
        self.errors.get_or_create(&ReasonLabel { reason }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_family_is_exported_with_its_name() {
        let t = Telemetry::new();
        let m = Metrics::register(&t);
        m.reconcile.get_or_create(&ResultLabel { result: "ok" }).inc();
        m.error("CatalogUnavailable");
        m.duration.observe(0.01);
        m.policy_ready
            .get_or_create(&ObjectLabels {
                namespace: "obs".into(),
                name: "a".into(),
            })
            .set(1);
        m.policies.set(3);
        m.leader.set(1);
        m.catalog_up.set(1);
        let text = t.render().await;
        for line in [
            "mira_operator_reconcile_total{result=\"ok\"} 1",
            "mira_operator_reconcile_errors_total{reason=\"CatalogUnavailable\"} 1",
            "mira_operator_reconcile_duration_seconds_count 1",
            "mira_operator_policy_ready{namespace=\"obs\",name=\"a\"} 1",
            "mira_operator_policies_managed 3",
            "mira_operator_leader 1",
            "mira_operator_catalog_up 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
